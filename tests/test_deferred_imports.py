"""t2t/deferred_imports.py: PyGlove, imported by seqio at its top level, runs only on first use."""
import os
import subprocess
import sys

import pytest

from t2t import deferred_imports

_PROBE = """
import sys
import t2t, pyglove
before = 'pyglove.core' in sys.modules
hyper = pyglove.hyper.HyperPrimitive
print(before, 'pyglove.core' in sys.modules, isinstance(hyper, type), type(pyglove).__name__)
"""


def _run(env_value):
  env = {k: v for k, v in os.environ.items() if k != deferred_imports.OFF_ENV}
  if env_value is not None:
    env[deferred_imports.OFF_ENV] = env_value
  out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                       check=True)
  return out.stdout.split()


def test_pyglove_runs_on_first_attribute_access_and_is_then_the_whole_package():
  before, after, is_class, module_type = _run(None)
  assert (before, after, is_class) == ("False", "True", "True")
  assert module_type == "module"  # after the load, an ordinary module again


def test_turned_off_pyglove_imports_eagerly():
  before, after, is_class, _ = _run("off")
  assert (before, after, is_class) == ("True", "True", "True")


def test_seqio_and_its_pyglove_mixture_use_the_same_module():
  import seqio  # pylint: disable=import-outside-toplevel
  import pyglove as pg  # pylint: disable=import-outside-toplevel
  assert seqio.dataset_providers.pg is sys.modules["pyglove"] is pg
  seqio.TaskRegistry.add("t2t_deferred_imports_probe", source=seqio.FunctionDataSource(
      lambda split, shuffle_files: None, splits=["train"]), output_features={})
  try:
    mixture = seqio.PyGloveTunableMixture(
        "t2t_deferred_imports_probe_mix",
        [("t2t_deferred_imports_probe", pg.oneof([1.0, 2.0]))])
    assert [t.name for t in mixture.tasks] == ["t2t_deferred_imports_probe"]
  finally:
    seqio.MixtureRegistry.remove("t2t_deferred_imports_probe_mix")
    seqio.TaskRegistry.remove("t2t_deferred_imports_probe")


def test_a_deferred_package_that_is_not_installed_fails_to_import_as_usual(monkeypatch):
  monkeypatch.setattr(deferred_imports, "DEFERRED_PACKAGES", ("t2t_no_such_package",))
  with pytest.raises(ModuleNotFoundError, match="t2t_no_such_package"):
    import t2t_no_such_package  # noqa: F401  # pylint: disable=import-outside-toplevel


def test_installing_twice_adds_one_finder():
  deferred_imports.defer_unused_imports()
  deferred_imports.defer_unused_imports()
  finder_type = deferred_imports._DeferOnFirstUse  # pylint: disable=protected-access
  assert len([f for f in sys.meta_path if isinstance(f, finder_type)]) == 1
