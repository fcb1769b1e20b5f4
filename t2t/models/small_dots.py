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
attention over its bf16 cache (`MultiHeadAttention`): both products and the softmax in one call;
`attention(...)` for whole-sequence attention without dropout (the encoder at inference), with
XLA's gradient when differentiated. Inside `weights_reused()` (a decoding step) a [K, N] weight is
given to the kernel transposed, a transpose XLA computes once before the decoding loop.
"""
from __future__ import annotations

import contextlib
import contextvars
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
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
DType = Any

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
  for name in ('t2t_bf16_nn', 't2t_bf16_nt', 't2t_bf16_attention'):
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


_REUSED = contextvars.ContextVar('t2t_small_dots_weights_reused', default=False)


@contextlib.contextmanager
def weights_reused():
  """Products traced inside are repeated over unchanged weights: a decoding loop's step.

  There a weight W [K, N] is handed to the kernel transposed, as W^T [N, K]: the transpose does
  not depend on the loop's state, so XLA computes it once, before the loop (its loop-invariant
  code motion), and every step reads whole rows of W^T instead of [K, N] tiles whose rows lie
  N elements apart. Outside a loop the transpose would cost more than the product saves.
  """
  token = _REUSED.set(True)
  try:
    yield
  finally:
    _REUSED.reset(token)


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
  b_leads = b_spec == contracted + b_free and tuple(b.shape[:len(contracted)]) == a_contracted
  if b_leads and _REUSED.get() and depth % 32 == 0 and width % 4 == 0:
    # In a decoding loop's body: W^T, computed once before the loop (`weights_reused`).
    target, w, chunk = 't2t_bf16_nt', b.reshape(depth, width).T, NT_CHUNK_ROWS
  elif b_leads and depth % 2 == 0 and width % 32 == 0:
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


def _attention_call(query: Array, key: Array, value: Array, bias: Array | None) -> Array:
  """The kernel's softmax(q k + bias) v: query [B, H, Q, D], key [B, H, D, L], value [B, H, L, D]
  bf16, bias float32 broadcastable to [B, H, Q, L] (None: none) -> float32 [B, H, Q, D]."""
  b, h, q, _ = query.shape
  length = key.shape[-1]
  if bias is None:
    bias = jnp.zeros((1, 1, q, length), jnp.float32)
  else:
    bias = jnp.asarray(bias, jnp.float32)
    bias = jnp.broadcast_to(bias, (bias.shape[0], bias.shape[1], q, length))
  return jax.ffi.ffi_call('t2t_bf16_attention', jax.ShapeDtypeStruct(query.shape, jnp.float32),
                          vmap_method='sequential')(query.astype(jnp.bfloat16), key, value, bias)


def _bias_fits(bias: Array | None, b: int, h: int, q: int, length: int) -> bool:
  """Whether `bias` is None or a 4-D array broadcastable to [b, h, q, length] whose first two
  dimensions are full or 1 (the kernel strides over those two and takes [q, length] rows)."""
  if bias is None:
    return True
  shape = jnp.shape(bias)
  return (len(shape) == 4 and shape[0] in (1, b) and shape[1] in (1, h)
          and shape[2] in (1, q) and shape[3] in (1, length))


def cross_attention(query: Array, key: Array, value: Array, bias: Array | None) -> Array | None:
  """A decoding step's encoder-decoder attention in one kernel call, or None where it can't run.

  query [B, H, Q, D] (rounded to bf16 here), key [B, H, D, L] and value [B, H, L, D] bf16 (the
  encoder cache's layouts, `layers.encoder_cache_entry`), bias broadcastable to [B, 1, Q, L]
  (the padding mask's; None for none). Returns float32 [B, H, Q, D]: softmax(q k + bias) v with
  the logits and the product accumulated in float32 and the weights rounded to bf16, as
  `MultiHeadAttention` computes it unfused. D and L must be multiples of 32.
  """
  if key.dtype != jnp.bfloat16 or value.dtype != jnp.bfloat16 or query.ndim != 4:
    return None
  b, h, q, d = query.shape
  length = key.shape[-1]
  if (key.shape != (b, h, d, length) or value.shape != (b, h, length, d) or d % 32
      or length % 32 or q == 0 or not _bias_fits(bias, b, h, q, length)):
    return None
  if not _single_cpu_device() or _library() is None:
    return None
  return _attention_call(query, key, value, bias)


def attention(query: Array, key: Array, value: Array, bias: Array | None, *, dtype: DType,
              reference: Callable[[Array, Array, Array, Array | None], Array]) -> Array | None:
  """Whole-sequence attention without dropout by the kernel, or None where it can't run.

  query [b, q, h, d], key and value [b, k, h, d] (any float dtype; rounded to bf16 here), bias
  broadcastable to [b, h, q, k] with 4 dimensions (the relative position bias and the mask) or
  None. Returns softmax(q k + bias) v, [b, q, h, d] in `dtype`, computed as `reference` (the
  unfused einsums with bf16 operands, float32 logits and softmax, bf16 weights) computes it,
  up to float32 rounding. Under differentiation the forward and backward are `reference`'s (a
  `custom_vjp`): the kernel has no backward, so training with dropout 0 is exactly XLA's.
  The encoder at inference is the case it is for (benchmarks/README.md, "The encoder's
  attention").
  """
  if query.ndim != 4 or key.ndim != 4:
    return None
  b, q, h, d = query.shape
  length = key.shape[1]
  if (key.shape != (b, length, h, d) or value.shape != key.shape or d % 32 or length % 32
      or q == 0 or not _bias_fits(bias, b, h, q, length)):
    return None
  if not _single_cpu_device() or _library() is None:
    return None
  return _kernel_forward(reference, jnp.dtype(dtype), query, key, value, bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _kernel_forward(reference, dtype, query, key, value, bias):
  out = _attention_call(jnp.swapaxes(query, 1, 2).astype(jnp.bfloat16),
                        jnp.transpose(key, (0, 2, 3, 1)).astype(jnp.bfloat16),
                        jnp.swapaxes(value, 1, 2).astype(jnp.bfloat16), bias)
  return jnp.swapaxes(out, 1, 2).astype(dtype)


def _kernel_forward_fwd(reference, dtype, query, key, value, bias):
  out, pullback = jax.vjp(reference, query, key, value, bias)
  return out.astype(dtype), pullback


def _kernel_forward_bwd(reference, dtype, pullback, ct):
  return pullback(ct)


_kernel_forward.defvjp(_kernel_forward_fwd, _kernel_forward_bwd)
