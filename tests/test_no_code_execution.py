"""No code runs from data: checkpoints, configs and data files are read as data only.

- Static: the package never calls pickle/marshal/shelve loaders, eval/exec, yaml.load, torch.load
  or np.load(allow_pickle=True) (an AST scan of t2t/ and tasks/).
- Checkpoints: a checkpoint carrying pickle payloads (a `.pkl` file, a numpy object array, meta
  JSON replaced by a pickle) restores, or fails with an error, without running the payload.
- Resume: `config.gin` and gin-looking files that a run finds in its MODEL_DIR are never parsed
  (t2t writes config.gin there; it is a record, not an input).

Every payload would create a marker file; the tests assert that the marker does not exist.
"""
import ast
import json
import os
import pathlib
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.training import checkpoints, warm_start
from t2t.training.partitioning import Partitioner

ROOT = pathlib.Path(__file__).resolve().parent.parent
UNSAFE_CALLS = {"eval", "exec", "compile", "__import__"}
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def _calls(path):
  tree = ast.parse(path.read_text(), str(path))
  for node in ast.walk(tree):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom)
                                              and node.module else [])
      for name in names:
        if name.split(".")[0] in UNSAFE_MODULES:
          yield node.lineno, f"import {name}"
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    name = func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else "")
    owner = func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        else ""
    keywords = {k.arg: k.value for k in node.keywords}
    if isinstance(func, ast.Name) and name in UNSAFE_CALLS:
      yield node.lineno, name
    if owner == "yaml" and name in ("load", "load_all", "unsafe_load", "full_load"):
      yield node.lineno, f"yaml.{name}"
    if owner == "torch" and name == "load" and not (
        isinstance(keywords.get("weights_only"), ast.Constant) and keywords["weights_only"].value):
      yield node.lineno, "torch.load without weights_only=True"
    if name == "load" and owner in ("np", "numpy"):
      flag = keywords.get("allow_pickle")
      if isinstance(flag, ast.Constant) and flag.value:
        yield node.lineno, "np.load(allow_pickle=True)"


def test_the_package_never_deserialises_code():
  files = sorted([*(ROOT / "t2t").rglob("*.py"), *(ROOT / "tasks").rglob("*.py")])
  assert len(files) > 20
  found = [f"{f.relative_to(ROOT)}:{line}: {what}" for f in files for line, what in _calls(f)]
  assert not found, "unsafe deserialisation / code execution:\n" + "\n".join(found)


def test_the_scan_catches_what_it_looks_for(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("import pickle\nimport numpy as np\nimport yaml\n"
                 "eval('1')\nnp.load('x', allow_pickle=True)\nyaml.load(s)\n")
  assert [w for _, w in _calls(bad)] == [
      "import pickle", "eval", "np.load(allow_pickle=True)", "yaml.load"]


# --- crafted checkpoints --------------------------------------------------------------------


class Payload:
  """Unpickling this creates `marker` (what an attacker's checkpoint would do)."""

  def __init__(self, marker):
    self.marker = str(marker)

  def __reduce__(self):
    return (os.system, (f"touch {self.marker}",))


def _tree():
  return {"encoder": {"kernel": jnp.arange(12, dtype=jnp.float32).reshape(3, 4)},
          "scale": jnp.ones((4,), jnp.float32)}


def _replicated(tree):
  return jax.tree.map(lambda _: Partitioner().replicated, tree)


@pytest.fixture
def crafted(tmp_path):
  """A real checkpoint with pickle payloads planted beside and inside its items."""
  marker = tmp_path / "PWNED"
  model_dir = tmp_path / "run"
  ckpt = checkpoints.Checkpointer(str(model_dir))
  ckpt.save(3, _tree(), {"mu": _tree()}, {"batches_consumed": 3})
  ckpt.close()
  step_dir = model_dir / "checkpoint_3"
  payload = pickle.dumps(Payload(marker))
  for where in (model_dir, step_dir, step_dir / "params", step_dir / "meta"):
    (where / "params.pkl").write_bytes(payload)
    np.save(where / "arrays.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
  return model_dir, marker


def test_restoring_a_checkpoint_with_payloads_runs_none_of_them(crafted):
  model_dir, marker = crafted
  params = _tree()
  ckpt = checkpoints.Checkpointer(str(model_dir))
  restored, _, meta = ckpt.restore(3, params, _replicated(params), {"mu": params},
                                   _replicated({"mu": params}))
  ckpt.close()
  jax.tree.map(np.testing.assert_array_equal, restored, params)
  assert meta["batches_consumed"] == 3
  loaded, step = checkpoints.load_params(str(model_dir), params, _replicated(params))
  assert step == 3
  loaded, step, _ = warm_start.restore_params(str(model_dir / "checkpoint_3"), params,
                                               _replicated(params), init_params=_tree)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  assert not marker.exists()


def test_meta_replaced_by_a_pickle_is_an_error_not_a_payload(crafted):
  model_dir, marker = crafted
  meta_files = [p for p in (model_dir / "checkpoint_3" / "meta").iterdir()
                if p.is_file() and p.suffix not in (".pkl", ".npy") and p.name != "checkpoint"]
  assert meta_files
  for path in meta_files:
    path.write_bytes(pickle.dumps(Payload(marker)))
  # orbax reads a `checkpoint` file in an item directory as msgpack: a payload there is an error.
  (model_dir / "checkpoint_3" / "params" / "checkpoint").write_bytes(pickle.dumps(Payload(marker)))
  params = _tree()
  with pytest.raises(Exception):  # noqa: B017 (any error will do; the payload must not run)
    checkpoints.load_params(str(model_dir), params, _replicated(params))
  assert not marker.exists()


# --- resume: gin files in MODEL_DIR are records, never inputs ---------------------------------

TINY = ["--gin.T5Config.d_model=16", "--gin.T5Config.d_ff=32", "--gin.T5Config.num_heads=2",
        "--gin.T5Config.d_kv=8", "--gin.T5Config.num_encoder_layers=1",
        "--gin.T5Config.num_decoder_layers=1", "--gin.BATCH_SIZE=2", "--gin.CHECKPOINT_EVERY=1"]


def _train(model_dir, steps, env):
  return subprocess.run(
      [sys.executable, "-m", "t2t.train", "--gin_file=experiments/bbc_demo/pretrain.gin",
       f"--gin.MODEL_DIR={model_dir}", f"--gin.TRAIN_STEPS={steps}", *TINY],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _completed(record):
  return subprocess.CompletedProcess(record["args"], record["returncode"], record["stdout"],
                                     record["stderr"])


def shared_runs(tmp_path_factory):
  """A 1-step quiet run, payload gin files planted in its MODEL_DIR, then a verbose resume to 2.

  Made once per test session and shared with tests/test_logs.py (a t2t.train run costs ~20 s of
  CPU): the first xdist worker to ask makes the runs under a file lock in the directory that all
  workers' temporary directories share, and records their outputs there; the other worker, or a
  later call, reads them back. Nothing is removed at exit (pytest keeps the last three sessions'
  temporary directories), so a worker that finishes early cannot take the runs from the other.
  Returns (first, second, model_dir, marker, env).
  """
  from filelock import FileLock  # in the test extras (tests/conftest.py's compilation cache)
  base = tmp_path_factory.getbasetemp()
  shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "resume_runs"
  marker, plugins, model_dir = shared / "PWNED", shared / "plugins", shared / "run"
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": os.pathsep.join([str(ROOT), str(plugins)])}
  for key in ("T2T_TRACEBACK", "T2T_VERBOSE", "TF_CPP_MIN_LOG_LEVEL"):
    env.pop(key, None)
  record = shared / "runs.json"
  with FileLock(f"{shared}.lock"):
    if not record.exists():
      plugins.mkdir(parents=True, exist_ok=True)
      (plugins / "t2t_payload.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
      first = _train(model_dir, 1, env)
      assert first.returncode == 0, first.stderr[-3000:]
      assert (model_dir / "config.gin").is_file()
      # A gin file that imports the payload, where t2t writes its record and where a user's gin
      # directories would be.
      evil = "import t2t_payload\nTRAIN_STEPS = 1000\n"
      for rel in ("config.gin", "runs/pretrain.gin", "gin/runs/pretrain.gin",
                  "experiments/bbc_demo/pretrain.gin", "operative_config.gin"):
        (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / rel).write_text(evil)
      second = _train(model_dir, 2, {**env, "T2T_VERBOSE": "1"})
      assert second.returncode == 0, second.stderr[-3000:]
      record.write_text(json.dumps([dict(args=r.args, returncode=r.returncode, stdout=r.stdout,
                                         stderr=r.stderr) for r in (first, second)]))
  first, second = (_completed(r) for r in json.loads(record.read_text()))
  return first, second, model_dir, marker, env


@pytest.fixture
def two_runs(tmp_path_factory):
  return shared_runs(tmp_path_factory)


def test_resume_never_reads_gin_files_from_model_dir(two_runs):
  _, second, model_dir, marker, env = two_runs
  assert "Resuming from" in second.stderr
  assert not marker.exists()
  assert sorted(p.name for p in model_dir.glob("checkpoint_*")) == ["checkpoint_1", "checkpoint_2"]
  # The record was rewritten from the run's real configuration.
  record = (model_dir / "config.gin").read_text()
  assert "t2t_payload" not in record and "TRAIN_STEPS = 1000" not in record
  # The payload module does work when imported (so the test could fail).
  subprocess.run([sys.executable, "-c", "import t2t_payload"], env=env, check=True)
  assert marker.exists()
  marker.unlink()
