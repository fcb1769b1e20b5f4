"""Multi-host start-up and the rules every process follows: who writes, when to wait.

A t2t run on N hosts is N copies of the same command, one per host (a TPU pod slice, a SLURM job,
`mpirun`, or N shells). `initialize()` joins them through `jax.distributed` before JAX touches a
device; afterwards `jax.devices()` lists every host's devices, one mesh spans them all, and
orbax saves checkpoints collectively. The rules the rest of t2t follows:

* process 0 writes the shared files (config.gin, metrics, TensorBoard, eval/infer outputs):
  `is_writer()`; the others skip those writes;
* every process reads its own share of the data (`t2t.training.inputs`);
* `sync(name)` is a barrier (e.g. process 0 computes metrics, the others wait);
* `broadcast_json` shares process 0's result (e.g. eval metrics) with the others.

With one process (the default) every helper is a no-op and `initialize()` does nothing.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Sequence

import gin
import jax
import numpy as np

# Environment variables that mean "this process is one of several in a cluster job" for the
# clusters jax detects by itself (jax._src.clusters): Open MPI, SLURM, Cloud TPU pods, Kubernetes
# TPU jobs. A count of one (a single-task SLURM job) stays single-process.
_CLUSTER_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")
_TPU_POD_VARS = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS")


class DistributedInitError(RuntimeError):
  """The processes of a multi-host run could not be joined (bad settings or no coordinator)."""


def detected_cluster() -> str | None:
  """The kind of multi-process cluster job this process runs in, or None for a lone process."""
  for var in _CLUSTER_SIZE_VARS:
    try:
      if int(os.environ.get(var, "1")) > 1:
        return "Open MPI" if var.startswith("OMPI") else "SLURM"
    except ValueError:
      pass
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "TPU pod"
  if _on_cloud_tpu_vm():  # jax asks the VM's metadata server for the slice's workers
    return "Cloud TPU"
  return None


def _on_cloud_tpu_vm() -> bool:
  """Whether this is a Cloud TPU VM (jax's own test: libtpu and TPU devices present)."""
  try:
    from jax._src.clusters import cloud_tpu_cluster  # pylint: disable=g-import-not-at-top
  except ImportError:  # a jax without it: rely on the environment variables above
    return False
  return bool(getattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", False))


def _wait_for_coordinator(address: str, timeout: float) -> None:
  """Waits until `address` (host:port) accepts a TCP connection, or raises after `timeout` s.

  jax's own client aborts the whole process (a C++ LOG(FATAL), no Python exception) when the
  coordinator does not answer; probing first turns that into a readable error.
  """
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise DistributedInitError(
        f"coordinator_address '{address}' is not host:port (e.g. 10.0.0.1:1234).")
  host = host.strip("[]")
  deadline = time.monotonic() + timeout
  while True:
    try:
      with socket.create_connection((host, int(port)), timeout=min(5.0, max(timeout, 0.1))):
        return
    except OSError as e:
      if time.monotonic() >= deadline:
        raise DistributedInitError(
            f"The coordinator at {address} did not answer within {timeout:g} s "
            f"(initialization_timeout; last error: {e}). Is process 0 running with the same "
            "coordinator_address, and is the port reachable from this host?") from None
      time.sleep(0.5)


@gin.configurable
def initialize(coordinator_address: str | None = None,
               num_processes: int | None = None,
               process_id: int | None = None,
               local_device_ids: Sequence[int] | None = None,
               initialization_timeout: int = 300,
               auto_detect: bool = True) -> bool:
  """Joins this process to a multi-host run (`jax.distributed.initialize`); True if it did.

  Call once, before any JAX computation (t2t's CLI does, after parsing gin and flags).
  * Explicit (a local or hand-launched run): `coordinator_address` ('host:port' of process 0),
    `num_processes`, `process_id` (0 .. num_processes - 1), optionally `local_device_ids`
    (this process's accelerators, e.g. one GPU each).
  * Automatic (`auto_detect`, when no address is given): in a TPU pod slice, a SLURM job or an
    Open MPI (`mpirun`) job of more than one process, jax finds all four settings itself.
  * Otherwise (one process): nothing to do; returns False.

  A process other than 0 waits at most `initialization_timeout` seconds for the coordinator and
  then raises DistributedInitError naming the address; process 0 waits as long for the others
  (after which jax stops the process with its own message).

  Raises:
    DistributedInitError: inconsistent settings (process_id >= num_processes, a missing one, a
      malformed address) or a coordinator that never answers.
  """
  if jax.distributed.is_initialized():
    return True
  explicit = (coordinator_address, num_processes, process_id)
  if all(v is None for v in explicit):
    cluster = detected_cluster() if auto_detect else None
    if cluster is None:
      return False
    _announce(f"Joining the {cluster} job's processes (jax.distributed, timeout "
              f"{initialization_timeout} s).")
    jax.distributed.initialize(local_device_ids=local_device_ids,
                               initialization_timeout=initialization_timeout)
    return True
  missing = [name for name, v in zip(("coordinator_address", "num_processes", "process_id"),
                                     explicit) if v is None]
  if missing:
    raise DistributedInitError(
        "A multi-process run needs coordinator_address, num_processes and process_id together; "
        f"missing: {', '.join(missing)} (flags --{missing[0]}=... or gin "
        f"initialize.{missing[0]}).")
  num_processes, process_id = int(num_processes), int(process_id)
  if num_processes < 1 or not 0 <= process_id < num_processes:
    raise DistributedInitError(
        f"process_id={process_id} must be in 0 .. num_processes - 1 (num_processes="
        f"{num_processes}).")
  if num_processes == 1:
    return False
  if process_id != 0:
    _wait_for_coordinator(coordinator_address, initialization_timeout)
  else:
    _announce(f"Process 0 of {num_processes}: coordinator at {coordinator_address}, waiting up "
              f"to {initialization_timeout} s for the others.")
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             local_device_ids=list(local_device_ids) if local_device_ids else None,
                             initialization_timeout=initialization_timeout)
  return True


def _announce(message: str) -> None:
  import sys
  print(message, file=sys.stderr, flush=True)


def process_index() -> int:
  return jax.process_index()


def process_count() -> int:
  return jax.process_count()


def is_writer() -> bool:
  """True on the process that writes shared files and prints progress (process 0)."""
  return jax.process_index() == 0


def sync(name: str) -> None:
  """A barrier: returns once every process has reached `sync(name)` (no-op for one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def broadcast_json(value: Any) -> Any:
  """Process 0's `value` (anything JSON can hold) on every process."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils
  data = np.frombuffer(json.dumps(value).encode("utf-8") if is_writer() else b"", np.uint8)
  size = int(multihost_utils.broadcast_one_to_all(np.asarray(len(data), np.int32)))
  buffer = np.zeros(size, np.uint8)
  buffer[:len(data)] = data
  data = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
  return json.loads(bytes(data.astype(np.uint8)).decode("utf-8"))
