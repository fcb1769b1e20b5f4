"""`--compilation_cache_dir`: a second process reads XLA's executables instead of compiling, and a
directory that is unsafe or unusable is refused with one line naming the flag."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from t2t.training import compilation_cache

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Counts the persistent cache's hits and misses for one jitted function big enough to be cached.
_PROBE = """
import json, os, sys
import jax, jax.numpy as jnp
from jax import monitoring
from t2t.training import compilation_cache
events = []
monitoring.register_event_listener(lambda name, **kw: events.append(name))
compilation_cache.enable(sys.argv[1], min_compile_time_s=0)
f = jax.jit(lambda x: jnp.tanh(x @ x.T + 1.0).sum(axis=0))
print(json.dumps(dict(value=float(f(jnp.ones((16, 16)))[3]),
                      hits=events.count('/jax/compilation_cache/cache_hits'),
                      env=os.environ[compilation_cache.ENV_VAR])))
"""


def _env() -> dict:
  env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  return env


def _probe(cache_dir: pathlib.Path) -> dict:
  out = subprocess.run([sys.executable, "-c", _PROBE, str(cache_dir)], env=_env(), cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_the_compiled_program(tmp_path):
  cache_dir = tmp_path / "new" / "cache"  # created, private
  first = _probe(cache_dir)
  assert first["hits"] == 0
  assert first["env"] == str(cache_dir.resolve())  # child processes inherit the cache
  assert (cache_dir.stat().st_mode & 0o777) == 0o700
  entries = [p for p in cache_dir.iterdir() if p.name.startswith("jit_")]
  assert entries, list(cache_dir.iterdir())
  second = _probe(cache_dir)
  assert second["hits"] >= 1
  assert second["value"] == first["value"]


def test_a_directory_others_may_write_is_refused(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o777)
  with pytest.raises(ValueError, match=r"--compilation_cache_dir .*shared is writable by other "
                                       r"users \(mode 777\).*chmod 700"):
    compilation_cache.enable(str(shared))


def test_a_file_or_an_unwritable_path_is_refused(tmp_path):
  a_file = tmp_path / "file"
  a_file.write_text("x")
  with pytest.raises(ValueError, match=r"--compilation_cache_dir .*file: not a directory"):
    compilation_cache.enable(str(a_file))
  with pytest.raises(ValueError, match=r"--compilation_cache_dir .*file/cache: not a directory"):
    compilation_cache.enable(str(a_file / "cache"))
  if os.geteuid() != 0:  # root may write anywhere
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(ValueError, match=r"cannot create it|not writable"):
      compilation_cache.enable(str(locked / "cache"))


def test_the_command_line_reports_an_unsafe_directory_in_one_line(tmp_path):
  shared = tmp_path / "shared"
  shared.mkdir()
  shared.chmod(0o777)
  out = subprocess.run([sys.executable, "-m", "t2t.infer", f"--compilation_cache_dir={shared}"],
                       env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1, out.stderr[-3000:]
  assert "error: --compilation_cache_dir" in out.stderr and "writable by other users" in out.stderr
  assert "Traceback" not in out.stderr
