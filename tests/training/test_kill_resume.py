"""A `python -m t2t.train` run killed with SIGKILL -- between checkpoints, while a checkpoint is
being written, right after one is finalised -- or stopped by a full disk, then rerun with the
same command, ends with exactly the losses of an uninterrupted run (data order included: the
losses of the tiny T5 differ with any other batch). Asynchronous checkpoints, packing, keep=1.

The faults are injected by tests/support/faulty_train.py (wrapping orbax's rename of the step
directory, its JSON write, and the preemption hook). train.py cuts metrics.jsonl back to the
resumed step, so each step has one row, compared with the uninterrupted run's.
"""
import json
import os
import subprocess
import sys

import pytest

from tests.support import faulty_train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 6
TINY = ["--gin_file=experiments/bbc_demo/pretrain.gin", "--gin.T5Config.d_model=32",
        "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2", "--gin.T5Config.d_kv=16",
        "--gin.T5Config.num_encoder_layers=1", "--gin.T5Config.num_decoder_layers=1",
        "--gin.BATCH_SIZE=4", "--gin.train.log_every=1", "--gin.CHECKPOINT_EVERY=2",
        "--gin.train.keep_checkpoints=1", f"--gin.TRAIN_STEPS={STEPS}"]


def _start(model_dir, fault="", task=None):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu",
         "T2T_TEST_FAULT": fault}
  extra = [f"--gin.MIXTURE_OR_TASK_NAME='{task}'"] if task else []
  return subprocess.Popen(
      [sys.executable, "-m", "tests.support.faulty_train", *TINY, *extra,
       f"--gin.MODEL_DIR={model_dir}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)


def _finish(proc):
  _, err = proc.communicate(timeout=300)
  return subprocess.CompletedProcess(proc.args, proc.returncode, "", err)


def _run(model_dir, fault="", task=None):
  return _finish(_start(model_dir, fault, task))


def _losses(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  steps = [r["step"] for r in rows if r.get("split") == "train"]
  assert len(steps) == len(set(steps)), steps  # one row per step
  return {r["step"]: r["loss"] for r in rows if r.get("split") == "train"}


def _listing(model_dir):
  return sorted(os.listdir(model_dir)), sorted(os.listdir(os.path.join(model_dir, "input_state")))


def _finalised(dirs):
  return [d for d in dirs if d.startswith("checkpoint_") and d.split("_")[1].isdigit()]


def _assert_same_losses(model_dir, reference):
  got, want = _losses(model_dir), _losses(reference)
  assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
  for step in want:
    assert got[step] == pytest.approx(want[step], abs=1e-6), step


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """Uninterrupted runs of the task and of the mixture."""
  root = tmp_path_factory.mktemp("reference")
  procs = [_start(str(root / name), task=task)  # side by side: half the wait on two cores
           for name, task in (("task", None), ("mixture", faulty_train.MIXTURE))]
  for proc in procs:
    out = _finish(proc)
    assert out.returncode == 0, out.stderr[-3000:]
  return root


def test_kills_while_writing_and_after_finalising_and_a_full_disk(reference, tmp_path):
  model_dir = str(tmp_path / "run")
  # 1. Killed while checkpoint 4 is written (all items in the tmp directory, not renamed):
  # its input state was written first and is an orphan; checkpoint 2 is the latest.
  out = _run(model_dir, "before_commit:4")
  assert out.returncode == -9, out.stderr[-3000:]
  dirs, states = _listing(model_dir)
  assert "checkpoint_2" in dirs and "checkpoint_4" not in dirs, dirs
  assert "checkpoint_4.orbax-checkpoint-tmp" in dirs, dirs
  assert "checkpoint_4" in states

  # 2. Resumes from 2 (opening MODEL_DIR removes the tmp directory and the orphan state), is
  # killed right after checkpoint 4 is finalised, before step 2's state is cleaned up.
  out = _run(model_dir, "after_commit:4")
  assert out.returncode == -9, out.stderr[-3000:]
  assert f"Resuming from {model_dir} at step 2." in out.stderr, out.stderr[-3000:]
  dirs, states = _listing(model_dir)
  assert "checkpoint_4" in dirs and not any("tmp" in d for d in dirs), dirs
  assert states == _finalised(dirs)  # (step 2 too: killed before keep=1 removed it)

  # 3. Resumes from 4; the disk is full while checkpoint 6 is written in the background:
  # one line, exit status 1, nothing of step 6 left, checkpoint 4 intact (keep=1 deleted
  # nothing, since step 6 never finalised).
  out = _run(model_dir, "enospc:6")
  assert out.returncode == 1, out.stderr[-3000:]
  assert f"Resuming from {model_dir} at step 4." in out.stderr
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  error = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
  assert len(error) == 1, out.stderr[-3000:]
  assert error[0].startswith(f"error: No space left on the device while writing checkpoint 6 "
                             f"to {model_dir} ("), error[0]
  assert error[0].endswith("the previous checkpoint (step 4) is intact. Free some space (or "
                           "lower train.keep_checkpoints) and rerun the same command to resume.")
  dirs, states = _listing(model_dir)
  assert "checkpoint_4" in dirs and not any(d.startswith("checkpoint_6") for d in dirs), dirs
  assert states == _finalised(dirs)  # step 6's state removed

  # 4. The same command again: resumes from 4 and finishes, with the reference's losses.
  out = _run(model_dir)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"Resuming from {model_dir} at step 4." in out.stderr
  _assert_same_losses(model_dir, str(reference / "task"))
  dirs, states = _listing(model_dir)
  assert [d for d in dirs if d.startswith("checkpoint_")] == ["checkpoint_6"]
  assert states == ["checkpoint_6"]  # older states removed with their steps (keep=1)


def test_a_mixture_killed_between_checkpoints_resumes_exactly(reference, tmp_path):
  model_dir = str(tmp_path / "mix")
  out = _run(model_dir, "after_step:5", task=faulty_train.MIXTURE)
  assert out.returncode == -9, out.stderr[-3000:]
  assert max(_losses(model_dir)) == 5  # step 5 was logged, its checkpoint never written
  out = _run(model_dir, task=faulty_train.MIXTURE)
  assert out.returncode == 0, out.stderr[-3000:]
  # Checkpoint 4 was saved in the background; it is the latest if it finished before the kill.
  assert (f"Resuming from {model_dir} at step 4." in out.stderr
          or f"Resuming from {model_dir} at step 2." in out.stderr), out.stderr[-3000:]
  _assert_same_losses(model_dir, str(reference / "mixture"))
