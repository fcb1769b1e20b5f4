"""Two local processes joined by jax.distributed, against one process with as many devices.

Process p runs `python -m t2t.train --coordinator_address=127.0.0.1:PORT --num_processes=2
--process_id=p` with 4 simulated CPU devices (8 in all); the reference run is one process with
8 devices and the same config. A tiny T5 trains 3 steps on bbc_topic, then `t2t.eval` runs on the
two processes and on one. Checked: the loss of every step equals the one-process run's (the
global batch does not depend on the host count), metrics.jsonl / config.gin / TensorBoard are
written once, the two-process checkpoint restores in a single process and holds the same
parameters, the two-process eval gives the one-process eval's metrics and predictions, and each
process of the two traces its own profile of step 2 (gin/recipes/profile.gin).
"""
import glob
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from tests.support.environment import xla_flags_with

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = ["--gin.T5Config.d_model=32", "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2",
         "--gin.T5Config.d_kv=16", "--gin.T5Config.num_encoder_layers=1",
         "--gin.T5Config.num_decoder_layers=1",
         "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 4}"]
# 16 rows: divisible by the 8 data-parallel devices times the 2 hosts (Partitioner's check).
TRAIN = ["--gin_file=experiments/bbc_demo/finetune.gin", "--gin.INITIAL_CHECKPOINT_PATH=None",
         "--gin.TRAIN_STEPS=3", "--gin.CHECKPOINT_EVERY=3", "--gin.BATCH_SIZE=16",
         "--gin.train.log_every=1", *MODEL,
         # Both runs profile step 2; each process of the two-process run traces its own devices.
         "--gin_file=recipes/profile.gin", "--gin.PROFILE_FIRST_STEP=2",
         "--gin.PROFILE_NUM_STEPS=1"]
EVAL = ["--gin_file=experiments/bbc_demo/eval.gin", "--gin.EVAL_NUM_EXAMPLES=24",
        "--gin.EVAL_BATCH_SIZE=16", *MODEL]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start(entry, args, num_processes, devices_per_process, log_dir):
  """Starts `python -m t2t.<entry>` as `num_processes` joined processes; `finish` waits."""
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu",
         "PYTHONPATH": ROOT,
         "XLA_FLAGS": xla_flags_with(f"--xla_force_host_platform_device_count={devices_per_process}")}
  env.pop("T2T_TRACEBACK", None)
  port = free_port()
  procs, logs = [], []
  for p in range(num_processes):
    extra = ([f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={num_processes}",
              f"--process_id={p}"] if num_processes > 1 else [])
    log = open(os.path.join(log_dir, f"{entry}.{num_processes}.{p}.log"), "w+")
    logs.append(log)
    procs.append(subprocess.Popen([sys.executable, "-m", f"t2t.{entry}", *args, *extra],
                                  cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  text=True))
  return entry, procs, logs


def finish(started):
  """Waits for the processes `start` began; returns their outputs (asserting success)."""
  entry, procs, logs = started
  outputs = []
  try:
    for proc, log in zip(procs, logs):
      proc.wait(timeout=900)
      log.seek(0)
      outputs.append(log.read())
      assert proc.returncode == 0, f"t2t.{entry} failed:\n{outputs[-1][-4000:]}"
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
    for log in logs:
      log.close()
  return outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  base = tmp_path_factory.mktemp("multiprocess")
  dirs = {n: str(base / f"model_{n}") for n in (1, 2)}
  # The one- and two-process runs are independent: they run side by side (start-up overlaps).
  started = {f"train_{n}": start("train", [*TRAIN, f"--gin.MODEL_DIR={dirs[n]}"], n, 8 // n, base)
             for n in (2, 1)}
  out = {name: finish(s) for name, s in started.items()}
  # Both evals read the two-process checkpoint: the one-process eval is also its restore test.
  started = {f"eval_{n}": start("eval", [*EVAL, f"--gin.CHECKPOINT_PATH={dirs[2]}",
                                         f"--gin.EVAL_OUTPUT_DIR={base}/eval_{n}"], n, 8 // n, base)
             for n in (2, 1)}
  out.update((name, finish(s)) for name, s in started.items())
  return base, dirs, out


def _rows(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_two_processes_train_with_the_one_process_losses(runs):
  _, dirs, _ = runs
  two, one = _rows(os.path.join(dirs[2], "metrics.jsonl")), _rows(
      os.path.join(dirs[1], "metrics.jsonl"))
  assert [r["step"] for r in two] == [1, 2, 3]  # written once, by process 0
  assert [r["step"] for r in one] == [1, 2, 3]
  np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-5)
  assert two[0]["loss"] != two[2]["loss"]  # it trained


def test_shared_files_are_written_once(runs):
  _, dirs, out = runs
  configs = [open(os.path.join(dirs[n], "config.gin")).read() for n in (2, 1)]
  # gin records initialize()'s defaults, not the flags the CLI passed: those lines differ.
  same = [[line for line in c.replace(dirs[n], "MODEL_DIR").splitlines()
           if not line.startswith("initialize.")] for c, n in zip(configs, (2, 1))]
  assert same[0] == same[1]
  assert configs[0].count("train.train_steps = ") == 1
  events = os.listdir(os.path.join(dirs[2], "train"))
  assert len(events) == 1, events  # one TensorBoard writer
  process_0, process_1 = out["train_2"]
  assert "step 3/3" in process_0 and "step 3/3" not in process_1  # progress on process 0 only
  # XLA's Gloo collectives print "[Gloo] Rank 0 is connected to ..." on stdout: filtered once a
  # run has joined other processes (a single process of 8 devices still prints them: not yet).
  assert not [o for name in ("train_2", "eval_2") for o in out[name] if "[Gloo]" in o]


def test_each_process_traces_its_own_profile_and_process_0_summarises(runs):
  _, dirs, out = runs
  profile = os.path.join(dirs[2], "profile")
  for p in (0, 1):
    traces = glob.glob(os.path.join(profile, f"process_{p}", "plugins", "profile", "*",
                                    "*.xplane.pb"))
    assert len(traces) == 1, (p, traces)
  summary = json.load(open(os.path.join(profile, "summary.json")))
  assert (summary["first_step"], summary["last_step"], summary["process_count"]) == (2, 2, 2)
  assert summary["trace_dir"] == os.path.join(profile, "process_0")
  process_0, process_1 = out["train_2"]
  assert "Profile: steps 2-2 traced in" in process_0 and "Profile:" not in process_1
  one = json.load(open(os.path.join(dirs[1], "profile", "summary.json")))   # no process_<i>
  assert one["trace_dir"] == os.path.join(dirs[1], "profile") and one["process_count"] == 1


def test_the_two_process_checkpoint_restores_in_one_process(runs):
  import jax
  import orbax.checkpoint as ocp
  _, dirs, _ = runs
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # this (pytest) process's one
  restored = []
  for n in (2, 1):
    path = os.path.join(dirs[n], "checkpoint_3", "params")
    saved = ocp.StandardCheckpointer().metadata(path).item_metadata
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), saved)
    restored.append(ocp.StandardCheckpointer().restore(path, target))
  flat = [dict(ocp.tree.to_flat_dict(r)) for r in restored]
  assert flat[0].keys() == flat[1].keys() and flat[0]
  for key in flat[0]:
    np.testing.assert_allclose(np.asarray(flat[0][key]), np.asarray(flat[1][key]), rtol=1e-5,
                               atol=1e-6, err_msg=str(key))


def test_eval_on_two_processes_equals_one_process(runs):
  base, _, out = runs
  metrics = [json.load(open(os.path.join(base, f"eval_{n}", "metrics.json"))) for n in (2, 1)]
  assert metrics[0]["metrics"] == metrics[1]["metrics"]
  assert set(metrics[0]["metrics"]["bbc_topic"]) >= {"accuracy"}
  predictions = [_rows(os.path.join(base, f"eval_{n}", "bbc_topic.validation.predictions.jsonl"))
                 for n in (2, 1)]
  assert len(predictions[0]) == 24 and predictions[0] == predictions[1]
  printed = [[line for line in o.splitlines() if line.startswith("bbc_topic: accuracy")]
             for o in (*out["eval_2"], *out["eval_1"])]
  assert len(printed[0]) == 1 and printed[0] == printed[1] == printed[2]  # the same everywhere
