"""benchmarks/process_start.py: fresh processes in both modes, alternating, and what each loaded.

A stand-in `keras` package on PYTHONPATH (module-level `import matplotlib`, with the fallback
Keras has) keeps the processes cheap; the real Keras is tests/test_keras_imports.py's."""
import os

import pytest

from benchmarks import process_start


@pytest.fixture
def fake_keras(tmp_path, monkeypatch):
  (tmp_path / "keras").mkdir()
  (tmp_path / "keras" / "__init__.py").write_text(
      "try:\n  import matplotlib\nexcept ImportError:\n  matplotlib = None\n")
  (tmp_path / "t2t_then_keras.py").write_text("import t2t\nimport keras\n")
  path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  monkeypatch.setenv("PYTHONPATH", path)
  monkeypatch.delenv("T2T_KERAS_OPTIONAL_IMPORTS", raising=False)
  return "t2t_then_keras"


def test_modes_alternate_and_only_keep_lets_keras_import_matplotlib(fake_keras):
  result = process_start.measure(fake_keras, runs=2)
  assert [r["mode"] for r in result["runs"]] == ["keep", "hidden", "keep", "hidden"]
  assert [r["loaded"] for r in result["runs"]] == [["matplotlib"], [], ["matplotlib"], []]
  for run in result["runs"]:
    assert run["wall_s"] > 0 and run["cpu_s"] > 0
  for mode in process_start.MODES:
    walls = sorted(r["wall_s"] for r in result["runs"] if r["mode"] == mode)
    assert result["median"][mode]["wall_s"] == pytest.approx(sum(walls) / 2)
  assert result["hidden_over_keep_wall"] == pytest.approx(
      result["median"]["hidden"]["wall_s"] / result["median"]["keep"]["wall_s"])


def test_a_module_that_fails_to_import_and_bad_runs_are_reported():
  with pytest.raises(RuntimeError, match="import t2t_no_such_module` failed .*keep"):
    process_start.start_once("t2t_no_such_module", "keep")
  with pytest.raises(SystemExit, match="--runs must be >= 1"):
    process_start.main(["--runs", "0"])


def test_deferred_imports_modes_alternate_and_only_eager_runs_pyglove(tmp_path, monkeypatch,
                                                                     capsys):
  (tmp_path / "pyglove").mkdir()
  (tmp_path / "pyglove" / "__init__.py").write_text("from pyglove import core\n")
  (tmp_path / "pyglove" / "core.py").write_text("")
  (tmp_path / "t2t_then_pyglove.py").write_text("import t2t\nimport pyglove\n")
  path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
  monkeypatch.setenv("PYTHONPATH", path)
  result = process_start.measure("t2t_then_pyglove", runs=1, compare="deferred_imports")
  assert [(r["mode"], r["loaded"]) for r in result["runs"]] == [
      ("eager", ["pyglove.core"]), ("deferred", [])]
  assert result["compare"] == "deferred_imports"
  assert result["deferred_over_eager_wall"] == pytest.approx(
      result["median"]["deferred"]["wall_s"] / result["median"]["eager"]["wall_s"])
  with pytest.raises(SystemExit):
    process_start.main(["--compare", "nothing"])
  assert "argument --compare: invalid choice: 'nothing'" in capsys.readouterr().err
