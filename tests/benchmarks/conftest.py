"""The benchmarks pin their process to `--threads` CPUs (`benchmarks.machine.pin_threads`). A test
that calls a benchmark's `main` in the test process must not leave that pin behind: the xdist
worker, and every subprocess it starts later, would run on one core for the rest of the session."""
import os

import pytest


@pytest.fixture(autouse=True)
def _restore_cpu_affinity():
  cpus = os.sched_getaffinity(0)
  yield
  if os.sched_getaffinity(0) != cpus:
    os.sched_setaffinity(0, cpus)
