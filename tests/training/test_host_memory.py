"""Tests for t2t/training/host_memory.py: with the settings, XLA:CPU's per-call buffers stop costing
page faults in most later calls; without them every call faults its temporaries in again."""
import json
import os
import statistics
import subprocess
import sys

import pytest

from t2t.training import host_memory

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A jitted program with two materialised 64 MB temporaries (sin(x) and cos(x).T, dot operands;
# above glibc's largest mmap threshold, 32 MB) and cheap dots, called 8 + 24 times in a fresh
# process; it prints the minor page faults of each of the 24. With the settings most calls fault
# nothing, but not every one: now and then (quiet, and more often under load) a call faults its
# temporaries in again and the resident size rises by them -- the heap grows, most likely because
# allocations from XLA's threads and the main thread interleave and fragment it -- and then it
# settles, mostly within the first few calls (as the train step's heap does within its first
# seven steps, benchmarks/EXPERIMENTS.md "Host memory"). Hence 8 unmeasured calls and the median (at
# least 13 of 24 calls fault-free), not every call. With 2 + 16 the first six or seven measured
# calls of a quiet run often faulted, and a fresh-clone CI run (2026-11-30, ed85306) saw eight.
PROGRAM = """
import json, resource, sys
from t2t.training import host_memory
applied = host_memory.configure(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda x, w: (jnp.sin(x) @ w).sum() + (jnp.cos(x).T @ w).sum())
x = jnp.ones((4096, 4096), jnp.float32) * 0.5
w = jnp.ones((4096, 64), jnp.float32)
for _ in range(8):
  f(x, w).block_until_ready()
faults = []
for _ in range(24):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  value = float(f(x, w).block_until_ready())
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(dict(applied=applied, faults=faults, value=value)))
"""

glibc_only = pytest.mark.skipif(host_memory.glibc_version() is None, reason="needs glibc's mallopt")


def _calls(mode, env_extra=None):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", **(env_extra or {})}
  env.pop("GLIBC_TUNABLES", None) if not env_extra else None
  out = subprocess.run([sys.executable, "-c", PROGRAM, mode], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_retained_memory_spares_later_calls_their_page_faults():
  system, retain = _calls("system"), _calls("retain")
  assert not system["applied"] and retain["applied"]
  assert system["value"] == retain["value"]  # same program, same result
  # Two 64 MB temporaries = 32768 pages of 4 KB are faulted in again on every call by default ...
  assert min(system["faults"]) > 16384, system
  # ... and reused from the heap with the settings (a few pages of bookkeeping at most).
  assert statistics.median(retain["faults"]) < 1000, retain


@glibc_only
def test_auto_applies_on_the_cpu_backend_and_the_tunables_do_what_mallopt_does():
  assert _calls("auto")["applied"]
  # The peer's form (benchmarks/t5_small_cpu.py --peer-malloc retain): glibc tunables at start.
  tuned = _calls("system", {"GLIBC_TUNABLES": host_memory.GLIBC_TUNABLES})
  assert not tuned["applied"] and statistics.median(tuned["faults"]) < 1000, tuned


def test_an_unknown_mode_is_refused_with_the_flag_name():
  with pytest.raises(ValueError, match=r"--host_malloc must be one of auto, retain, system, got 'x'"):
    host_memory.configure("x")


# Eight independent branches, each with a 1 MB temporary (tanh(x @ w), [256, 1024] float32):
# scheduled for concurrency their temporaries are live together, for memory one after another.
SCHEDULE_PROGRAM = """
import json, os, sys
from t2t.training import host_memory
host_memory.configure(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda x, ws: [jnp.tanh(x @ w) @ w.T for w in ws])
x = jnp.ones((256, 256), jnp.float32)
ws = [jnp.ones((256, 1024), jnp.float32) * i for i in range(8)]
temp = f.lower(x, ws).compile().memory_analysis().temp_size_in_bytes
print(json.dumps(dict(temp=temp, memory_schedule=host_memory.memory_schedule(),
                      xla_flags=os.environ.get("XLA_FLAGS", ""))))
"""


def _temporaries(mode, xla_flags):
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "XLA_FLAGS": xla_flags}
  out = subprocess.run([sys.executable, "-c", SCHEDULE_PROGRAM, mode], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cpu_modes_schedule_programs_for_least_memory_and_keep_a_users_choice():
  flags = os.environ.get("XLA_FLAGS", "")
  system, retain = _temporaries("system", flags), _temporaries("retain", flags)
  assert not system["memory_schedule"] and retain["memory_schedule"]
  assert retain["xla_flags"].startswith(flags)  # added to the flags already there
  assert retain["temp"] <= 2 << 20 < 4 << 20 <= system["temp"], (retain, system)
  own = f"{flags} --{host_memory.SCHEDULER_FLAG}=true"
  kept = _temporaries("retain", own)
  assert kept["xla_flags"] == own and not kept["memory_schedule"]
  assert kept["temp"] == system["temp"]


def test_the_users_scheduler_flag_is_read_as_xla_reads_it(monkeypatch):
  name = host_memory.SCHEDULER_FLAG
  for flags, expected in ((f"--{name}=false", True), (f"--{name}=0", True), (f"--{name}", False),
                          (f"--{name}=false --{name}=true", False), (f"--{name}_x=false", None),
                          ("", None)):
    monkeypatch.setenv("XLA_FLAGS", flags)
    assert host_memory.memory_schedule() is bool(expected)
    assert host_memory.schedule_for_memory() is (True if expected is None else expected)
    assert os.environ["XLA_FLAGS"] == (flags if expected is not None
                                       else f"{flags} --{name}=false".strip())
