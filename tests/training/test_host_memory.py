"""Tests for t2t/training/host_memory.py: with the settings, XLA:CPU's per-call buffers stop costing
page faults from the second call on; without them every call faults its temporaries in again."""
import json
import os
import subprocess
import sys

import pytest

from t2t.training import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A jitted program whose operands of the dot are materialised 64 MB temporaries (above glibc's
# largest mmap threshold, 32 MB): the fewest minor page faults of calls 3-6, in a fresh process (the
# heap may still grow on an early call when the threads' timing orders the allocations differently).
PROGRAM = """
import json, resource, sys
from t2t.training import host_memory
applied = host_memory.configure(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda x: jnp.dot(jnp.sin(x), jnp.cos(x).T).sum())
x = jnp.ones((4096, 4096), jnp.float32) * 0.5
for _ in range(2):
  f(x).block_until_ready()
faults = []
for _ in range(4):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  value = float(f(x).block_until_ready())
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(dict(applied=applied, faults=min(faults), value=value)))
"""

glibc_only = pytest.mark.skipif(host_memory.glibc_version() is None, reason="needs glibc's mallopt")


def _third_call(mode, env_extra=None):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", **(env_extra or {})}
  env.pop("GLIBC_TUNABLES", None) if not env_extra else None
  out = subprocess.run([sys.executable, "-c", PROGRAM, mode], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_retained_memory_spares_later_calls_their_page_faults():
  system, retain = _third_call("system"), _third_call("retain")
  assert not system["applied"] and retain["applied"]
  assert system["value"] == retain["value"]  # same program, same result
  # Two 64 MB temporaries = 32768 pages of 4 KB are faulted in again on every call by default ...
  assert system["faults"] > 16384, system
  # ... and reused from the heap with the settings (a few pages of bookkeeping at most).
  assert retain["faults"] < 1000, retain


@glibc_only
def test_auto_applies_on_the_cpu_backend_and_the_tunables_do_what_mallopt_does():
  assert _third_call("auto")["applied"]
  # The peer's form (benchmarks/t5_small_cpu.py --peer-malloc retain): glibc tunables at start.
  tuned = _third_call("system", {"GLIBC_TUNABLES": host_memory.GLIBC_TUNABLES})
  assert not tuned["applied"] and tuned["faults"] < 1000, tuned


def test_an_unknown_mode_is_refused_with_the_flag_name():
  with pytest.raises(ValueError, match=r"--host_malloc must be one of auto, retain, system, got 'x'"):
    host_memory.configure("x")
