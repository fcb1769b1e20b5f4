"""JAX's persistent compilation cache for t2t's entry points (`--compilation_cache_dir`).

Compiling T5-small's train step takes ~12 s of a cold start on a 2-core CPU
(benchmarks/EXPERIMENTS.md); a run that restarts, resumes, or evaluates the same model again
compiles the same programs again.
With a cache directory, XLA's executables are written there on the first compile and read back by
every later process whose program is the same (same model, shapes, mesh, JAX/XLA version, flags):
the second start skips XLA's compile and pays only tracing, lowering and a file read.

The cache holds machine code that JAX loads and runs, so it is trusted like a program: a directory
that other users can write to would let them run code in your training jobs. `enable` therefore
refuses a local directory writable by group or others (remote paths, e.g. gs://, are the user's
to protect). One directory may serve many runs and hosts; JAX keys every entry by the program and
the platform. It is off unless asked for: pass `--compilation_cache_dir DIR` to `t2t.train`,
`t2t.eval`, `t2t.infer` (and to `t2t.experiment`, `t2t.phases`, `t2t.study`, whose child runs
inherit it), or set JAX's own `JAX_COMPILATION_CACHE_DIR`.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import jax

ENV_VAR = "JAX_COMPILATION_CACHE_DIR"   # JAX reads it at import; children of this process inherit it


def enable(directory: str, min_compile_time_s: float = 1.0) -> str:
  """Sends every later XLA compile of this process (and its child processes) through `directory`.

  Programs that compile faster than `min_compile_time_s` are not written (JAX's default, 1 s:
  small helper computations would cost more to store than to rebuild). A local `directory` is
  created (mode 0700) if missing. Returns the directory as given to JAX.

  Raises ValueError for a path that is a file, cannot be created or written, or is writable by
  group or others (see the module docstring); call before the first compile, since JAX opens the
  cache once per process.
  """
  if "://" not in directory:
    path = Path(directory).expanduser().resolve()
    try:
      path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as e:
      raise ValueError(f"--compilation_cache_dir {directory}: not a directory ({e}).") from None
    except OSError as e:
      raise ValueError(f"--compilation_cache_dir {directory}: cannot create it ({e.strerror}).") \
          from None
    if not os.access(path, os.W_OK | os.X_OK):
      raise ValueError(f"--compilation_cache_dir {directory}: not writable by this user.")
    mode = path.stat().st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
      raise ValueError(
          f"--compilation_cache_dir {directory} is writable by other users (mode "
          f"{stat.S_IMODE(mode):o}); the cache holds machine code this run would execute. Use a "
          f"private directory (chmod 700 {path}) or another path.")
    directory = str(path)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
  os.environ[ENV_VAR] = directory
  return directory
