"""Host memory settings for XLA:CPU: freed buffers kept mapped, programs scheduled for least memory.

XLA:CPU allocates a step's temporaries (T5-small's train step at batch 8, 512/114: one 2.7 GB buffer
plus many smaller ones) with the C library's `malloc` on every call and frees them at its end. glibc
serves requests above its mmap threshold (at most 32 MB) with a fresh `mmap` and hands them back
with `munmap` on `free`, and the per-thread arenas of XLA's worker threads give their 64 MB heaps
back as well, so every step touches ~3.4 GB of new pages: ~840k page faults, each page zeroed by the
kernel, 2-3.5 s of system CPU time per step on a 2-core machine (benchmarks/EXPERIMENTS.md, "Host
memory"). With every allocation served from one heap that is never trimmed, the same pages are
reused and the faults drop to zero once the heap has found its size: buffers that outlive a step
land, it seems, in the hole the freed temporaries left, so in one of the first steps the 2.7 GB
buffer no longer fits there and the heap grows by about one step's temporaries, after which it holds
(measured in 25 of 26 T5-small benchmark runs: 500-684k faults once within steps 2-7, that step
0.4-3 s slower; then at most 61k a step in two runs of 22 steps).

`retain_freed_memory` sets exactly that through glibc's `mallopt`: one arena (`M_ARENA_MAX = 1`),
no mmap-backed chunks (`M_MMAP_MAX = 0`), no trimming of the heap top (`M_TRIM_THRESHOLD` = max)
and a 256 MB top pad (fewer `brk` calls). The cost: the process keeps its peak heap for its
lifetime, and fragmentation can raise that peak (measured: 4.6-7.7 GB resident against 4.7-5.3 GB
for T5-small's benchmark step), so it is for processes whose job is to run XLA:CPU programs
(`t2t.train`, `t2t.eval`, `t2t.infer`), chosen with `--host_malloc`. On accelerators the step's
buffers live in device memory, so `auto` leaves malloc alone there; on C libraries other than
glibc (macOS, musl) nothing is changed.

The same modes ask XLA:CPU to schedule each program for least memory instead of for concurrency
(`schedule_for_memory`: `--xla_cpu_enable_concurrency_optimized_scheduler=false` in `XLA_FLAGS`,
unless `XLA_FLAGS` names that flag already). The arithmetic is the same, only the order of
independent instructions and so which temporaries are live together: T5-small's bf16 gradient
program needs 2.20 GB of temporaries instead of 2.69 and its update 0.07 GB instead of 0.48, so a
cold first step touches ~0.65 GB fewer fresh pages; on the 2-core benchmark machine the train step
was no slower and beam search ~10% faster (benchmarks/EXPERIMENTS.md, "XLA:CPU's memory-minimising
schedule"). A child process inherits `XLA_FLAGS`, and with it the choice.

The settings must be in place before JAX starts its backend: XLA:CPU's worker threads take a
malloc arena of their own when they start, and an arena made before `M_ARENA_MAX = 1` keeps
serving (and unmapping) them; measured, the faults then stay at ~840k per step. That is why `auto`
decides from the configuration (`JAX_PLATFORMS`, the accelerator plugins installed) instead of
asking JAX for its backend, and why `configure` refuses to run after the backends exist.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import re

MODES = ("auto", "retain", "system")

# mallopt(3) parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8

TOP_PAD_BYTES = 256 << 20

# The same settings for a process started with them in its environment (glibc >= 2.26 tunables),
# e.g. the benchmark's PyTorch peer under `--peer-malloc retain`.
GLIBC_TUNABLES = ("glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:"
                  f"glibc.malloc.trim_threshold={2 ** 64 - 1}:glibc.malloc.top_pad={TOP_PAD_BYTES}")

# XLA:CPU's scheduler choice; `schedule_for_memory` sets it false (XLA's default: true).
SCHEDULER_FLAG = "xla_cpu_enable_concurrency_optimized_scheduler"

_applied = False


def glibc_version() -> str | None:
  """'2.36' when this process runs on glibc, else None."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
  except (ValueError, OSError, AttributeError):
    return None
  return version if name == "glibc" else None


def retain_freed_memory() -> bool:
  """Sets the mallopt parameters above for the rest of this process; returns whether it could.

  False (and nothing changed) on a C library other than glibc. Raises OSError if glibc refuses a
  parameter (it returns 0 only for an unknown parameter or a value out of range).
  """
  global _applied
  if glibc_version() is None:
    return False
  libc = ctypes.CDLL(None)
  settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1),  # -1: SIZE_MAX
              (M_TOP_PAD, TOP_PAD_BYTES))
  for parameter, value in settings:
    if libc.mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) != 1:
      raise OSError(f"glibc mallopt({parameter}, {value}) was refused; --host_malloc=system "
                    f"runs without these settings.")
  _applied = True
  return True


def _scheduler_setting(xla_flags: str) -> str | None:
  """The value `xla_flags` gives `SCHEDULER_FLAG` (the last one, as XLA reads them), else None."""
  found = re.findall(rf"--{SCHEDULER_FLAG}(?:=(\S*))?(?=\s|$)", xla_flags)
  return (found[-1] or "true") if found else None


def schedule_for_memory() -> bool:
  """Asks XLA:CPU for its memory-minimising schedule (module docstring) through `XLA_FLAGS`,
  which XLA reads when the backend starts; returns whether that schedule is asked for now.

  A `--xla_cpu_enable_concurrency_optimized_scheduler` already in `XLA_FLAGS` is the user's
  choice and stays.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if _scheduler_setting(flags) is None:
    os.environ["XLA_FLAGS"] = f"{flags} --{SCHEDULER_FLAG}=false".strip()
  return memory_schedule()


def memory_schedule() -> bool:
  """Whether `XLA_FLAGS` asks XLA:CPU for the memory-minimising schedule."""
  return (_scheduler_setting(os.environ.get("XLA_FLAGS", "")) or "").lower() in ("false", "0")


def cpu_only() -> bool:
  """Whether JAX will run on the CPU alone, decided without starting a backend.

  `JAX_PLATFORMS` (or `jax.config.jax_platforms`) when set: only 'cpu' in it. Otherwise: no
  accelerator can be found, i.e. no PJRT plugin is installed (the `jax_plugins` namespace package
  or entry points, e.g. jax-cuda12-plugin) and no `libtpu`.
  """
  import jax
  platforms = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
  if platforms:
    return {p.strip().lower() for p in platforms.split(",") if p.strip()} == {"cpu"}
  if importlib.util.find_spec("libtpu") is not None:
    return False
  if importlib.metadata.entry_points(group="jax_plugins"):
    return False
  try:
    import jax_plugins  # pylint: disable=import-outside-toplevel
  except ImportError:
    return True
  return not any(True for _ in pkgutil.iter_modules(jax_plugins.__path__))


def _backends_started() -> bool:
  from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  return xla_bridge.backends_are_initialized()


def configure(mode: str) -> bool:
  """Applies `--host_malloc MODE`; returns whether the malloc settings are now in effect.

  'auto': `retain_freed_memory()` and `schedule_for_memory()` when `cpu_only()`; 'retain':
  always; 'system': neither. Call it before anything starts a JAX backend (t2t's entry points
  do, first thing); afterwards it raises RuntimeError, since the settings would no longer reach
  XLA's threads (module docstring).
  """
  if mode not in MODES:
    raise ValueError(f"--host_malloc must be one of {', '.join(MODES)}, got {mode!r}.")
  if mode == "system" or (mode == "auto" and not cpu_only()):
    return _applied
  if not _applied and _backends_started():
    raise RuntimeError("host_memory.configure must run before JAX starts a backend: XLA:CPU's "
                       "threads already have their malloc arenas (t2t/training/host_memory.py).")
  schedule_for_memory()
  return retain_freed_memory()


def applied() -> bool:
  """Whether this process has set the mallopt parameters."""
  return _applied
