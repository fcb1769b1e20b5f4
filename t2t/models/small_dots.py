"""bf16 matmuls with a few rows on x86 CPUs: a kernel of t2t's own, called through XLA's FFI.

One decoding step multiplies 8 rows (batch 8, one token; 32 with 4 beams) by every weight matrix
of the decoder and by the tied embedding: ~77 MB of bf16 weights for T5-small, read once per token.
XLA's CPU dot runs these products at ~60 GFLOP/s a core, well below what the memory can feed;
`small_dots.cc` keeps each output tile's accumulators in registers for the whole contraction
(VDPBF16PS, float32 accumulation), prefetches the weights and splits the columns among XLA's
intra-op threads. Figures: benchmarks/README.md, "A kernel of our own for the small dots".

`dot(spec, a, b)` returns the product when the kernel applies and None otherwise, so the caller
(`matmuls._mixed_einsum`) falls back to XLA's dot. It applies on a single-device CPU backend whose
processor has AVX512_BF16, to bf16 operands of a plain contraction with at most `MAX_ROWS` rows
whose weight operand is [K, N] (N a multiple of 32) or [N, K] (K a multiple of 32). The library is
compiled from `small_dots.cc` with the system's C++ compiler on first use and kept in
`$T2T_CACHE_DIR` (default `$XDG_CACHE_HOME/t2t`, else `~/.cache/t2t`); without a compiler t2t
warns once and uses XLA's dot. `T2T_SMALL_DOTS=0` turns the kernel off.

`cross_attention(query, key, value, bias)` does the same for a decoding step's encoder-decoder
attention over its bf16 cache (`MultiHeadAttention`): both products and the softmax in one call.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

MAX_ROWS = 64
NN_CHUNK_COLUMNS = 128   # columns of W [K, N] per work item shared among threads
NT_CHUNK_ROWS = 64       # rows of W [N, K] per work item
SWITCH = 'T2T_SMALL_DOTS'
SOURCE = Path(__file__).with_name('small_dots.cc')
_CPU_FLAGS = ('avx512f', 'avx512bw', 'avx512_bf16')
_COMPILE_FLAGS = ('-O3', '-std=c++17', '-shared', '-fPIC', '-w', '-mavx512f', '-mavx512bw',
                  '-mavx512vl', '-mavx512bf16')


def cache_dir() -> Path:
  """Where the compiled library is kept."""
  if os.environ.get('T2T_CACHE_DIR'):
    return Path(os.environ['T2T_CACHE_DIR'])
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return Path(base) / 't2t'


@functools.cache
def _cpu_supports_kernel() -> bool:
  if platform.system() != 'Linux' or platform.machine() not in ('x86_64', 'AMD64'):
    return False
  try:
    with open('/proc/cpuinfo') as f:
      flags = next((line.split(':', 1)[1].split() for line in f if line.startswith('flags')), [])
  except OSError:
    return False
  return all(flag in flags for flag in _CPU_FLAGS)


@functools.cache
def _which_compiler(cxx: str | None) -> str | None:
  return cxx or shutil.which('g++') or shutil.which('c++')


def _compiler() -> str | None:
  return _which_compiler(os.environ.get('CXX'))


def build(compiler: str, out_dir: Path) -> Path:
  """Compiles small_dots.cc into out_dir (once per source, flags and jaxlib); returns the .so.

  Written to a temporary name and renamed, so processes building at once never load half a file.
  Raises RuntimeError with the compiler's message when the build fails.
  """
  include = jax.ffi.include_dir()
  key = hashlib.sha256(SOURCE.read_bytes() + ' '.join(_COMPILE_FLAGS).encode()
                       + include.encode() + jax.__version__.encode()).hexdigest()[:16]
  target = out_dir / f'small_dots-{key}.so'
  if target.exists():
    return target
  out_dir.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix='.so', dir=out_dir)
  os.close(fd)
  try:
    proc = subprocess.run([compiler, *_COMPILE_FLAGS, f'-I{include}', str(SOURCE), '-o', tmp],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
      raise RuntimeError(f'{compiler} could not build {SOURCE.name}: {proc.stderr.strip()[-2000:]}')
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return target


_LOAD_LOCK = threading.Lock()   # the trainer traces on two threads; register the targets once


def _load() -> ctypes.CDLL | None:
  """Builds, loads and registers the kernel once per process; None (after a warning) if it can't."""
  with _LOAD_LOCK:
    return _load_once()


@functools.cache
def _load_once() -> ctypes.CDLL | None:
  try:
    lib = ctypes.CDLL(str(build(_compiler(), cache_dir())))
  except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
    warnings.warn(f't2t.models.small_dots: the small-matmul kernel is off, XLA\'s dot is used '
                  f'instead ({e}). Set {SWITCH}=0 to silence this.', RuntimeWarning, stacklevel=4)
    return None
  for name in ('t2t_bf16_nn', 't2t_bf16_nt', 't2t_bf16_cross_attention'):
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform='cpu')
  return lib


def _library() -> ctypes.CDLL | None:
  """The loaded kernel, or None where it is switched off or cannot run (read on every trace)."""
  return None if unavailable_reason() is not None else _load()


def unavailable_reason() -> str | None:
  """Why the kernel cannot run in this process (None when it can)."""
  if os.environ.get(SWITCH, '1') == '0':
    return f'{SWITCH}=0'
  if not _cpu_supports_kernel():
    return f'the CPU lacks one of {", ".join(_CPU_FLAGS)} (or is not x86-64 Linux)'
  if _compiler() is None:
    return 'no C++ compiler (g++, c++ or $CXX) to build small_dots.cc'
  return None


def status() -> dict:
  """For benchmark records: whether the kernel is used and, if not, why."""
  if _library() is None:
    return {'enabled': False, 'reason': unavailable_reason() or 'build failed (see the warning)'}
  return {'enabled': True, 'max_rows': MAX_ROWS}


def _single_cpu_device() -> bool:
  return jax.default_backend() == 'cpu' and jax.device_count() == 1


def dot(spec: str, a: Array, b: Array) -> Array | None:
  """einsum(spec, a, b) in float32 by the kernel, or None where the kernel does not apply.

  a: [*free_a, *contracted] bf16 with prod(free_a) = M <= MAX_ROWS rows; b: [*contracted,
  *free_b] or [*free_b, *contracted] bf16; the output [*free_a, *free_b]. Both operands are
  bf16 already (rounded by the caller); the result is float32.
  """
  if a.dtype != jnp.bfloat16 or b.dtype != jnp.bfloat16 or '->' not in spec:
    return None
  inputs, out = spec.split('->')
  a_spec, _, b_spec = inputs.partition(',')
  if (len(a_spec) != a.ndim or len(b_spec) != b.ndim or len(set(a_spec)) != len(a_spec)
      or len(set(b_spec)) != len(b_spec)):
    return None
  contracted = ''.join(c for c in a_spec if c in b_spec)
  a_free = ''.join(c for c in a_spec if c not in b_spec)
  b_free = ''.join(c for c in b_spec if c not in a_spec)
  if (not contracted or any(c in out for c in contracted) or out != a_free + b_free
      or a_spec != a_free + contracted):
    return None
  rows = math.prod(a.shape[:len(a_free)])
  depth = math.prod(a.shape[len(a_free):])
  width = math.prod(b.shape[b_spec.index(c)] for c in b_free)
  if rows == 0 or rows > MAX_ROWS or width == 0:
    return None
  a_contracted = tuple(a.shape[len(a_free):])   # mismatched sizes: left to einsum's error
  if (b_spec == contracted + b_free and depth % 2 == 0 and width % 32 == 0
      and tuple(b.shape[:len(contracted)]) == a_contracted):
    target, w, chunk = 't2t_bf16_nn', b.reshape(depth, width), NN_CHUNK_COLUMNS
  elif (b_spec == b_free + contracted and depth % 32 == 0 and width % 4 == 0
        and tuple(b.shape[len(b_free):]) == a_contracted):
    target, w, chunk = 't2t_bf16_nt', b.reshape(width, depth), NT_CHUNK_ROWS
  else:
    return None
  if not _single_cpu_device() or _library() is None:
    return None
  result = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((rows, width), jnp.float32),
                            vmap_method='sequential')(a.reshape(rows, depth), w,
                                                      chunk=np.int64(chunk))
  return result.reshape(a.shape[:len(a_free)] + tuple(b.shape[b_spec.index(c)] for c in b_free))


def cross_attention(query: Array, key: Array, value: Array, bias: Array | None) -> Array | None:
  """A decoding step's encoder-decoder attention in one kernel call, or None where it can't run.

  query [B, H, Q, D] (rounded to bf16 here), key [B, H, D, L] and value [B, H, L, D] bf16 (the
  encoder cache's layouts, `layers.encoder_cache_entry`), bias broadcastable to [B, 1, Q, L]
  (the padding mask's; None for none). Returns float32 [B, H, Q, D]: softmax(q k + bias) v with
  the logits and the product accumulated in float32 and the weights rounded to bf16, as
  `MultiHeadAttention` computes it unfused. D and L must be multiples of 32, Q <= MAX_ROWS.
  """
  if key.dtype != jnp.bfloat16 or value.dtype != jnp.bfloat16 or query.ndim != 4:
    return None
  b, h, q, d = query.shape
  length = key.shape[-1]
  if (key.shape != (b, h, d, length) or value.shape != (b, h, length, d) or d % 32
      or length % 32 or not 0 < q <= MAX_ROWS):
    return None
  if bias is None:
    bias = jnp.zeros((b, q, length), jnp.float32)
  else:
    bias = jnp.asarray(bias, jnp.float32)
    if bias.ndim != 4 or bias.shape[1] != 1:
      return None
    try:
      bias = jnp.broadcast_to(bias, (b, 1, q, length)).reshape(b, q, length)
    except ValueError:
      return None
  if not _single_cpu_device() or _library() is None:
    return None
  return jax.ffi.ffi_call('t2t_bf16_cross_attention', jax.ShapeDtypeStruct(query.shape, jnp.float32),
                          vmap_method='sequential')(query.astype(jnp.bfloat16), key, value, bias)
