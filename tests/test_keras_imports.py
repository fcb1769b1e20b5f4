"""Tests for t2t/keras_imports.py: Keras's import-time scikit-learn and matplotlib imports are
answered 'not installed'; every other import of them loads the real packages."""
import os
import subprocess
import sys

import matplotlib  # noqa: F401  (loaded, so only MISSING itself is looked up below)
import pytest

from t2t import keras_imports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MISSING = "matplotlib.t2t_no_such_module"  # looked up on sys.meta_path whatever is imported


def run_as(module_name: str, source: str) -> None:
  exec(compile(source, f"<{module_name}>", "exec"), {"__name__": module_name})


def test_keras_module_level_import_is_told_the_package_is_not_installed():
  with pytest.raises(ModuleNotFoundError, match="t2t keeps Keras's optional") as raised:
    run_as("keras.src.wrappers.t2t_test", f"import {MISSING}")
  assert raised.value.name == MISSING
  with pytest.raises(ModuleNotFoundError, match="t2t keeps"):
    run_as("keras", "import sklearn.t2t_no_such_module")


@pytest.mark.parametrize("module_name, source", [
    ("t2t.reports.t2t_test", f"import {MISSING}"),  # not Keras
    ("kerasish.t2t_test", f"import {MISSING}"),  # only the keras package itself
    ("keras.src.t2t_test", f"def f():\n  import {MISSING}\nf()"),  # Keras at run time
    ("keras.src.t2t_test", "import t2t_no_such_package"),  # another package
])
def test_other_imports_reach_the_normal_finders(module_name, source):
  with pytest.raises(ModuleNotFoundError) as raised:
    run_as(module_name, source)
  assert "t2t keeps" not in str(raised.value)


def test_installing_twice_keeps_one_finder():
  keras_imports.hide_optional_imports_from_keras()
  keras_imports.hide_optional_imports_from_keras()
  assert sum(isinstance(f, keras_imports._HideFromKerasImport) for f in sys.meta_path) == 1


def test_t2t_process_starts_without_them_and_loads_them_when_t2t_asks():
  script = """
import sys
import t2t.train
print(sorted(m for m in ("sklearn", "matplotlib", "scipy.stats") if m in sys.modules))
import keras.src.wrappers.fixes, keras.src.visualization.plot_image_gallery as gallery
print(keras.src.wrappers.fixes.sklearn, gallery.plt)
import sklearn.linear_model, matplotlib.pyplot
print(sklearn.linear_model.LogisticRegression.__module__, matplotlib.pyplot.__name__)
"""
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.splitlines() == [
      "[]", "None None", "sklearn.linear_model._logistic matplotlib.pyplot"]


def test_keep_in_the_environment_installs_nothing(monkeypatch):
  ours = [f for f in sys.meta_path if isinstance(f, keras_imports._HideFromKerasImport)]
  monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f not in ours])
  monkeypatch.setenv(keras_imports.KEEP_ENV, "keep")
  keras_imports.hide_optional_imports_from_keras()
  assert not any(isinstance(f, keras_imports._HideFromKerasImport) for f in sys.meta_path)
  monkeypatch.delenv(keras_imports.KEEP_ENV)
  keras_imports.hide_optional_imports_from_keras()
  assert isinstance(sys.meta_path[0], keras_imports._HideFromKerasImport)
