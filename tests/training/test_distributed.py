"""Tests for t2t/training/distributed.py: start-up settings, clear errors, single-process no-ops.

The joined two-process runs are in test_multiprocess.py; here jax.distributed.initialize is
replaced by a recorder where a test needs to see what t2t would pass to it.
"""
import os
import socket
import subprocess
import sys
import time

import jax
import pytest

from t2t.training import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_VARS = ("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
                "TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


@pytest.fixture
def calls(monkeypatch):
  """Records jax.distributed.initialize's arguments instead of joining anything."""
  for var in CLUSTER_VARS:
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setattr(distributed, "_on_cloud_tpu_vm", lambda: False)
  recorded = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: recorded.append(kw))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  return recorded


def _closed_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]  # nothing listens once the socket is closed


def test_a_single_process_is_a_no_op(calls):
  assert distributed.initialize() is False
  assert distributed.initialize(coordinator_address="127.0.0.1:1", num_processes=1,
                                process_id=0) is False
  assert calls == []
  assert distributed.is_writer() and distributed.process_count() == 1
  distributed.sync("nothing to wait for")
  assert distributed.broadcast_json({"a": [1, 2.5]}) == {"a": [1, 2.5]}


@pytest.mark.parametrize("env,kind", [
    ({"SLURM_NTASKS": "4"}, "SLURM"), ({"OMPI_COMM_WORLD_SIZE": "2"}, "Open MPI"),
    ({"TPU_WORKER_HOSTNAMES": "t1,t2"}, "TPU pod"), ({"SLURM_NTASKS": "1"}, None),
    ({"TPU_WORKER_HOSTNAMES": "localhost"}, None), ({}, None)])
def test_cluster_jobs_are_detected_and_left_to_jax(calls, monkeypatch, env, kind):
  for var, value in env.items():
    monkeypatch.setenv(var, value)
  assert distributed.detected_cluster() == kind
  assert distributed.initialize(initialization_timeout=7) is (kind is not None)
  assert calls == ([{"local_device_ids": None, "initialization_timeout": 7}] if kind else [])
  if kind:  # auto_detect off: a lone process after all
    calls.clear()
    assert distributed.initialize(auto_detect=False) is False and calls == []


def test_a_cloud_tpu_vm_is_left_to_jax(calls, monkeypatch):
  monkeypatch.setattr(distributed, "_on_cloud_tpu_vm", lambda: True)
  assert distributed.detected_cluster() == "Cloud TPU"
  assert distributed.initialize() and calls == [{"local_device_ids": None,
                                                 "initialization_timeout": 300}]


def test_explicit_settings_reach_jax_on_process_0(calls):
  assert distributed.initialize(coordinator_address="127.0.0.1:1234", num_processes=2,
                                process_id=0, local_device_ids=[1], initialization_timeout=9)
  assert calls == [{"coordinator_address": "127.0.0.1:1234", "num_processes": 2,
                    "process_id": 0, "local_device_ids": [1], "initialization_timeout": 9}]


def test_process_id_out_of_range_is_refused(calls):
  with pytest.raises(distributed.DistributedInitError,
                     match=r"process_id=2 must be in 0 \.\. num_processes - 1 \(num_processes=2\)"):
    distributed.initialize(coordinator_address="127.0.0.1:1234", num_processes=2, process_id=2)
  with pytest.raises(distributed.DistributedInitError, match="missing: process_id"):
    distributed.initialize(coordinator_address="127.0.0.1:1234", num_processes=2)
  with pytest.raises(distributed.DistributedInitError, match="'nohost' is not host:port"):
    distributed.initialize(coordinator_address="nohost", num_processes=2, process_id=1)
  assert calls == []


def test_a_coordinator_that_never_answers_times_out_naming_the_address(calls):
  address = f"127.0.0.1:{_closed_port()}"
  start = time.monotonic()
  with pytest.raises(distributed.DistributedInitError,
                     match=f"coordinator at {address} did not answer within 1 s"):
    distributed.initialize(coordinator_address=address, num_processes=2, process_id=1,
                           initialization_timeout=1)
  assert 1 <= time.monotonic() - start < 10 and calls == []


def test_the_cli_reports_an_absent_coordinator_in_one_line(tmp_path):
  """Flags and the gin timeout reach initialize() before anything is built or compiled."""
  address = f"127.0.0.1:{_closed_port()}"
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run(
      [sys.executable, "-m", "t2t.train", "--gin_file=experiments/bbc_demo/finetune.gin",
       f"--gin.MODEL_DIR={tmp_path / 'model'}", "--gin.INITIAL_CHECKPOINT_PATH=None",
       "--gin.initialize.initialization_timeout=2", f"--coordinator_address={address}",
       "--num_processes=2", "--process_id=1"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1, out.stderr[-3000:]
  assert f"error: The coordinator at {address} did not answer within 2 s" in out.stderr
  assert "Traceback" not in out.stderr
  assert not os.path.exists(tmp_path / "model")  # nothing written before the processes joined
