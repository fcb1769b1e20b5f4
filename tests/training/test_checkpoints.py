"""Tests for t2t/training/checkpoints.py: save, restore, resume metadata, incompatibility."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import errors
from t2t.training import checkpoints
from t2t.training.partitioning import Partitioner


def _tree(width=4):
  return {"encoder": {"kernel": jnp.arange(3 * width, dtype=jnp.float32).reshape(3, width)},
          "scale": jnp.ones((width,), jnp.float32)}


def _replicated(tree):
  return jax.tree.map(lambda _: Partitioner().replicated, tree)


def test_param_shapes_flattens_paths():
  assert checkpoints.param_shapes(_tree()) == {"encoder/kernel": [3, 4], "scale": [4]}


def test_save_restore_round_trip(tmp_path):
  params, opt = _tree(), {"mu": _tree()}
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(7, params, opt, {"batches_consumed": 7})
  assert ckpt.latest_step() == 7
  assert os.path.isdir(tmp_path / "checkpoint_7")
  p2, o2, meta = ckpt.restore(7, params, _replicated(params), opt, _replicated(opt))
  jax.tree.map(np.testing.assert_array_equal, p2, params)
  jax.tree.map(np.testing.assert_array_equal, o2, opt)
  assert meta["batches_consumed"] == 7 and meta["step"] == 7
  ckpt.close()


def test_keeps_only_the_newest_checkpoints(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _tree(), {}, {})
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_2", "checkpoint_3"]
  ckpt.close()


def test_incompatible_checkpoint_names_parameter_and_both_shapes(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(1, _tree(width=4), {}, {})
  with pytest.raises(checkpoints.CheckpointMismatchError) as err:
    ckpt.check(_tree(width=5))
  assert "encoder/kernel" in str(err.value)
  assert "(3, 4)" in str(err.value) and "(3, 5)" in str(err.value)
  assert str(err.value).endswith("Use a fresh MODEL_DIR or the matching model gin file.")  # resuming
  # Nothing was written or removed by the failed check.
  assert os.listdir(tmp_path) == ["checkpoint_1"]


def test_missing_and_extra_parameters_are_named():
  with pytest.raises(checkpoints.CheckpointMismatchError, match="'b'.*missing"):
    checkpoints.check_compatible({"a": [1]}, {"a": [1], "b": [2]}, "here")
  with pytest.raises(checkpoints.CheckpointMismatchError, match="has parameter 'b'"):
    checkpoints.check_compatible({"a": [1], "b": [2]}, {"a": [1]}, "here")


def test_load_params_from_model_dir_or_step_dir(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(2, _tree(), {"mu": _tree()}, {})
  ckpt.save(5, jax.tree.map(lambda x: x + 1, _tree()), {"mu": _tree()}, {})
  ckpt.close()
  params, step = checkpoints.load_params(str(tmp_path), _tree(), _replicated(_tree()))
  assert step == 5
  np.testing.assert_array_equal(params["scale"], 2 * np.ones(4))
  params, step = checkpoints.load_params(str(tmp_path / "checkpoint_2"), _tree(),
                                         _replicated(_tree()))
  assert step == 2
  np.testing.assert_array_equal(params["scale"], np.ones(4))


def test_load_params_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    checkpoints.load_params(str(tmp_path / "nope"), _tree(), _replicated(_tree()))
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    checkpoints.load_params(str(tmp_path), _tree(), _replicated(_tree()))


def _damage(step_dir, item):
  """Truncates every array file of `params`, or garbles `meta`; returns a damaged file."""
  if item == "meta":
    _garble(os.path.join(step_dir, "meta", "metadata"))
    return os.path.join(step_dir, "meta", "metadata")
  victims = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "params"))
             for f in fs if os.path.basename(r) == "d"]
  for v in victims:
    _garble(v, truncate=True)
  return victims[0]


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("item", ["params", "meta"])
def test_loading_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, item):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(4, _tree(), {}, {})
  ckpt.close()
  _damage(str(tmp_path / "checkpoint_4"), item)
  with pytest.raises(checkpoints.CorruptCheckpointError) as err:
    checkpoints.load_params(str(tmp_path), _tree(), _replicated(_tree()))
  message = str(err.value)
  assert "\n" not in message and len(message) < 700, message  # not tensorstore's JSON spec
  assert f"Checkpoint {tmp_path}/checkpoint_4 cannot be read ({tmp_path}/checkpoint_4/{item}" \
      in message, message
  assert "restore it from a backup" in message
  assert errors.is_user_error(err.value)  # the CLI prints it alone
  assert err.value.__cause__ is not None  # orbax's own error, for T2T_TRACEBACK=1
  assert os.listdir(tmp_path) == ["checkpoint_4"]  # a load never moves anything


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_truncated_large_array_file_names_the_parameter_not_orbaxs_wrapper(tmp_path):
  # A large array lives in the OCDBT data files under params/ocdbt.process_0/d/; orbax wraps
  # its failed read in an Exception whose text is a bound method's repr and the TensorStore spec.
  tree = {"emb": jnp.asarray(np.random.default_rng(0).standard_normal((2048, 32)), jnp.float32),
          "scale": jnp.ones((32,), jnp.float32)}
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(2, tree, {}, {})
  ckpt.close()
  params = tmp_path / "checkpoint_2" / "params"
  largest = max((p for p in params.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
  assert largest.parent.name == "d" and largest.stat().st_size > 100_000
  _garble(largest, truncate=True)
  with pytest.raises(checkpoints.CorruptCheckpointError) as err:
    checkpoints.load_params(str(tmp_path), tree, _replicated(tree))
  message = str(err.value)
  assert f"cannot be read ({params}: ValueError: OUT_OF_RANGE: Error reading \"emb/" in message, message
  assert "bound method" not in message and "Encountered error" not in message, message
  assert "\n" not in message and len(message) < 700, message


def test_reading_lets_mismatches_and_out_of_memory_through(tmp_path):
  with pytest.raises(checkpoints.CheckpointMismatchError):
    with checkpoints.reading("somewhere/checkpoint_1", "params"):
      raise checkpoints.CheckpointMismatchError("other shapes")
  with pytest.raises(ValueError, match="RESOURCE_EXHAUSTED"):
    with checkpoints.reading("somewhere/checkpoint_1", "params"):
      raise ValueError("RESOURCE_EXHAUSTED: out of memory while reading")


def _two_steps(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=None)
  ckpt.save(1, _tree(), {"mu": _tree()}, {"batches_consumed": 1})
  ckpt.save(2, _tree(), {"mu": _tree()}, {"batches_consumed": 2})
  ckpt.close()


def _restore_latest_good(tmp_path, keep=None):
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=keep)
  params, opt = _tree(), {"mu": _tree()}
  return ckpt, ckpt.restore_latest_good(params, _replicated(params), opt, _replicated(opt))


def _garble(path, truncate=False):
  data = open(path, "rb").read()
  with open(path, "wb") as f:
    f.write(data[:len(data) // 2] if truncate else b"\x00garbage" * 8)


def test_an_unfinished_write_is_never_restored(tmp_path):
  _two_steps(tmp_path)
  # What orbax leaves when a write of step 3 is interrupted: its temporary directory.
  tmp = tmp_path / "checkpoint_3.orbax-checkpoint-tmp"
  (tmp / "params").mkdir(parents=True)
  (tmp / "params" / "manifest.ocdbt").write_bytes(b"half")
  ckpt, (step, params, _, meta) = _restore_latest_good(tmp_path)
  assert ckpt.latest_step() == 2 and step == 2 and meta["batches_consumed"] == 2
  jax.tree.map(np.testing.assert_array_equal, params, _tree())
  ckpt.close()


# The step's other reads may finish after orbax closed its event loop (t2t.training.late_reads):
# under load they did, and "Exception ignored ... Event loop is closed" followed the report.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("item", ["params", "meta"])
def test_a_corrupted_latest_checkpoint_falls_back_to_the_previous(tmp_path, capsys, item):
  _two_steps(tmp_path)
  if item == "meta":
    victim = tmp_path / "checkpoint_2" / "meta" / "metadata"
    _garble(victim)
  else:  # truncate every array data file of step 2
    victims = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "checkpoint_2" / "params")
               for f in fs if os.path.basename(r) == "d"]
    assert victims
    for v in victims:
      _garble(v, truncate=True)
  ckpt, (step, params, opt, meta) = _restore_latest_good(tmp_path)
  assert step == 1 and meta["step"] == 1
  jax.tree.map(np.testing.assert_array_equal, params, _tree())
  err = capsys.readouterr().err
  line = next(l for l in err.splitlines() if "Checkpoint 2 is corrupted" in l)
  assert f"checkpoint_2/{item}" in line, line
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1", "checkpoint_2.corrupt"]
  assert ckpt.latest_step() == 1
  ckpt.close()


def test_retention_keeps_the_only_good_checkpoint(tmp_path):
  _two_steps(tmp_path)
  _garble(tmp_path / "checkpoint_2" / "meta" / "metadata")
  ckpt, (step, *_) = _restore_latest_good(tmp_path, keep=1)
  assert step == 1
  # The damaged step no longer counts against keep=1: checkpoint_1 is still there.
  assert "checkpoint_1" in os.listdir(tmp_path)
  ckpt.save(2, _tree(), {"mu": _tree()}, {"batches_consumed": 2})  # training goes on
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_2", "checkpoint_2.corrupt"]
  ckpt.close()
  ckpt, (step, *_) = _restore_latest_good(tmp_path, keep=1)
  assert step == 2
  ckpt.close()


def test_no_readable_checkpoint_is_an_error(tmp_path):
  _two_steps(tmp_path)
  for step in (1, 2):
    _garble(tmp_path / f"checkpoint_{step}" / "meta" / "metadata")
  with pytest.raises(checkpoints.CorruptCheckpointError, match="steps \\[1, 2\\]"):
    _restore_latest_good(tmp_path)


def test_an_empty_directory_has_nothing_to_restore(tmp_path):
  ckpt, restored = _restore_latest_good(tmp_path)
  assert restored is None
  ckpt.close()


def test_a_process_that_closes_before_any_save_exits_without_a_traceback(tmp_path):
  """orbax's clean-up of temporary directories, started with the manager, must be over when
  `close` returns: a run refused before its first save exits with its error alone (without the
  wait, the clean-up thread failed at interpreter shutdown every time, printing a traceback)."""
  script = ("import sys\n"
            "from t2t.training import checkpoints\n"
            f"checkpoints.Checkpointer({str(tmp_path)!r}).close()\n"
            "sys.exit('error: refused before the first save')\n")
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
  assert out.returncode == 1
  assert "error: refused before the first save" in out.stderr
  assert "Traceback" not in out.stderr, out.stderr[-2000:]


# --- Asynchronous saves, side directories, a full disk ------------------------------------------

@pytest.fixture
def slow_meta_write(monkeypatch):
  """Holds orbax's (background) write of `meta` until the returned event is set."""
  import asyncio
  import threading

  from orbax.checkpoint._src.handlers import json_checkpoint_handler as jh
  release = threading.Event()
  original = jh.JsonCheckpointHandler._save_fn

  async def held(self, x, directory):
    await asyncio.to_thread(release.wait, 60)
    return await original(self, x, directory)
  monkeypatch.setattr(jh.JsonCheckpointHandler, "_save_fn", held)
  yield release
  release.set()


def _side_writer(tmp_path, seen):
  def before(step):  # what train.py does with the input state: written before orbax starts
    seen.append(sorted(os.listdir(tmp_path)))
    d = tmp_path / "input_state" / f"checkpoint_{step}"
    d.mkdir(parents=True)
    (d / "process_0").write_text(str(step))
  return before


def test_an_asynchronous_save_returns_while_the_write_goes_on(tmp_path, slow_meta_write):
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=1, side_dirs=("input_state",))
  params, seen = _tree(), []
  ckpt.save(1, params, {}, {}, before=_side_writer(tmp_path, seen), blocking=False)
  # Back in the training loop while step 1 is still being written: not finalised yet, but
  # its side files are complete (they were written before orbax started).
  assert seen == [[]]
  assert "checkpoint_1" not in os.listdir(tmp_path)
  assert (tmp_path / "input_state" / "checkpoint_1" / "process_0").read_text() == "1"
  params = jax.tree.map(lambda x: x + 1, params)  # training goes on with new arrays
  slow_meta_write.set()
  ckpt.save(2, params, {}, {}, before=_side_writer(tmp_path, seen), blocking=False)
  assert "checkpoint_1" in seen[-1]  # the pending save was finished before the next started
  ckpt.close()  # finishes step 2; keep=1 removes step 1 and, with it, its side directory
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_2", "input_state"]
  assert os.listdir(tmp_path / "input_state") == ["checkpoint_2"]
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  restored, _, meta = ckpt.restore(2, _tree(), _replicated(_tree()), {}, {})
  jax.tree.map(np.testing.assert_array_equal, restored, params)
  assert meta["step"] == 2
  ckpt.close()


@pytest.fixture
def full_disk(monkeypatch):
  """orbax's write of a `meta` whose step is in the returned set fails with ENOSPC."""
  import errno

  from orbax.checkpoint._src.handlers import json_checkpoint_handler as jh
  steps = set()
  original = jh.JsonCheckpointHandler._save_fn

  async def failing(self, x, directory):
    if x.get("step") in steps:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(directory))
    return await original(self, x, directory)
  monkeypatch.setattr(jh.JsonCheckpointHandler, "_save_fn", failing)
  return steps


@pytest.mark.parametrize("blocking", [True, False])
def test_a_full_disk_names_the_step_and_keeps_the_previous_checkpoint(tmp_path, full_disk,
                                                                       blocking):
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=1, side_dirs=("input_state",))
  opt = {"mu": _tree()}
  ckpt.save(1, _tree(), opt, {"batches_consumed": 1}, before=_side_writer(tmp_path, []))
  full_disk.add(2)
  with pytest.raises(checkpoints.DiskFullError) as e:
    ckpt.save(2, _tree(), opt, {}, before=_side_writer(tmp_path, []), blocking=blocking)
    ckpt.wait()  # a background write fails here
  assert str(e.value).startswith(
      f"No space left on the device while writing checkpoint 2 to {tmp_path} (")
  assert "the previous checkpoint (step 1) is intact" in str(e.value)
  assert "\n" not in str(e.value)
  # The partial tmp directory and step 2's side files are gone; step 1 is whole.
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_1", "input_state"]
  assert os.listdir(tmp_path / "input_state") == ["checkpoint_1"]
  ckpt.close()
  ckpt, (step, params, _, meta) = _restore_latest_good(tmp_path, keep=1)
  assert step == 1 and meta["batches_consumed"] == 1
  ckpt.close()


def test_disk_full_is_recognised_through_wrappers():
  import errno
  assert checkpoints._is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
  try:
    try:
      raise OSError(errno.ENOSPC, "x")
    except OSError as inner:
      raise ValueError("tensorstore failed") from inner
  except ValueError as outer:
    assert checkpoints._is_disk_full(outer)
  assert checkpoints._is_disk_full(ValueError("Error writing local file [os_error_code='28']"))
  assert not checkpoints._is_disk_full(OSError(errno.EACCES, "Permission denied"))
  assert not checkpoints._is_disk_full(ValueError("NOT_FOUND"))
