"""Preemption through the command line: SIGTERM mid-run saves a checkpoint at the step in flight
and exits cleanly without stopped.json; rerunning resumes with the same batches, so the losses
equal those of an uninterrupted run. Plus the signal flag and hook in process."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from t2t.training import preemption
from t2t.training import trainer as trainer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ["--gin_file=experiments/bbc_demo/pretrain.gin", "--gin.T5Config.d_model=32",
        "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2", "--gin.T5Config.d_kv=16",
        "--gin.T5Config.num_encoder_layers=1", "--gin.T5Config.num_decoder_layers=1",
        "--gin.BATCH_SIZE=4", "--gin.train.log_every=1", "--gin.CHECKPOINT_EVERY=1000",
        "--gin.train.keep_checkpoints=None"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}


def _cmd(model_dir, steps):
  return [sys.executable, "-m", "t2t.train", *TINY, f"--gin.MODEL_DIR={model_dir}",
          f"--gin.TRAIN_STEPS={steps}"]


def _losses(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return {r["step"]: r["loss"] for r in map(json.loads, f) if r.get("split") == "train"}


def _steps(model_dir):
  return sorted(int(d.split("_")[1]) for d in os.listdir(model_dir)
                if d.startswith("checkpoint_") and d.split("_")[1].isdigit())


def test_sigterm_saves_exits_cleanly_and_resumes_exactly(tmp_path):
  model_dir = str(tmp_path / "preempted")
  proc = subprocess.Popen(_cmd(model_dir, 100000), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  metrics = os.path.join(model_dir, "metrics.jsonl")
  deadline = time.time() + 300
  while not (os.path.exists(metrics) and max(_losses(model_dir), default=0) >= 2):
    assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  stopped_at = max(_losses(model_dir))
  assert f"Preempted at step {stopped_at}: checkpoint saved; rerun the same command to resume." \
      in err, err[-3000:]
  assert _steps(model_dir) == [stopped_at]
  assert os.listdir(os.path.join(model_dir, "input_state")) == [f"checkpoint_{stopped_at}"]
  assert not os.path.exists(os.path.join(model_dir, "stopped.json"))

  final = stopped_at + 2
  # The resumed run and the uninterrupted one side by side (independent; a core each). Both
  # find the preempted run's executables in the persistent compilation cache.
  straight = str(tmp_path / "straight")
  resumed, uninterrupted = [
      subprocess.Popen(_cmd(d, final), cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True) for d in (model_dir, straight)]
  _, err = resumed.communicate(timeout=300)
  _, straight_err = uninterrupted.communicate(timeout=300)
  assert resumed.returncode == 0, err[-3000:]
  assert f"Resuming from {model_dir} at step {stopped_at}." in err
  assert uninterrupted.returncode == 0, straight_err[-3000:]
  got, want = _losses(model_dir), _losses(straight)
  assert sorted(got) == sorted(want) == list(range(1, final + 1))
  for step in want:
    assert got[step] == pytest.approx(want[step], abs=1e-6), step

  # A corrupted latest checkpoint: train() reports it, resumes from the previous one and
  # retrains the same steps to the same losses.
  with open(os.path.join(model_dir, f"checkpoint_{final}", "meta", "metadata"), "wb") as f:
    f.write(b"\x00garbled")
  os.remove(os.path.join(model_dir, "metrics.jsonl"))
  out = subprocess.run(_cmd(model_dir, final), cwd=ROOT, env=ENV, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"Checkpoint {final} is corrupted ({model_dir}/checkpoint_{final}/meta" in out.stderr
  assert f"Resuming from {model_dir} at step {stopped_at}." in out.stderr
  got = _losses(model_dir)
  assert sorted(got) == list(range(stopped_at + 1, final + 1))
  for step in got:
    assert got[step] == pytest.approx(want[step], abs=1e-6), step
  assert os.path.isdir(os.path.join(model_dir, f"checkpoint_{final}.corrupt"))


def test_the_flag_stops_the_loop_and_handlers_are_restored():
  before = {s: signal.getsignal(s) for s in preemption.SIGNALS}
  p = preemption.Preemption()
  p.install()
  try:
    assert p.hook(1, None, None, None) is None
    os.kill(os.getpid(), signal.SIGTERM)  # handled: the flag is set, the process lives on
    control = p.hook(2, None, None, None)
    assert isinstance(control, trainer_lib.Control) and control.stop == preemption.PREEMPTED
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C interrupts at once
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.1)
  finally:
    p.uninstall()
  assert {s: signal.getsignal(s) for s in preemption.SIGNALS} == before
