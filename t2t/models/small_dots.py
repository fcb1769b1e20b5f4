"""Matmuls with a few rows on x86 CPUs, and fused attention: kernels of t2t's own, called through
XLA's FFI.

One decoding step multiplies 8 rows (batch 8, one token; 32 with 4 beams) by every weight matrix
of the decoder and by the tied embedding, and reads the encoder-decoder attention's cache: for
T5-small ~77 MB of bf16 weights (~166 MB in float32) and ~100 MB of float32 cache a token.
XLA's CPU dot runs these products at ~60 GFLOP/s a core, on one thread, well below what the
memory can feed. The kernels keep each output tile's accumulators in registers for the whole
contraction, prefetch the weights and split the columns among XLA's intra-op threads. Two
libraries, each compiled for the instructions it needs (figures: benchmarks/EXPERIMENTS.md,
"A kernel of our own for the small dots" and "An AVX2 kernel for float32 decoding"):

- `BF16` (`small_dots.cc`, AVX512_BF16): bf16 operands, float32 accumulation (VDPBF16PS), for
  models with `matmul_dtype='bfloat16'`.
- `F32` (`small_dots_f32.cc`, AVX2 + FMA): float32 operands, for float32 models inside
  `weights_reused()` (a decoding step), where each [K, N] weight is read transposed.
- `F32_AVX512` (`small_dots_f32_avx512.cc`, AVX-512F): where the processor has it, the same
  float32 products against weights packed once per decode in panels of 32 columns
  (`pack_panels`), and the encoder-decoder attention, in place of `F32`'s: a tile of 8 rows x 32
  columns keeps its sums in AVX-512's registers and reads its panel as one stream, ~2x the
  bytes a thread that `F32`'s NT tiles read on a Zen 4 VM (benchmarks/EXPERIMENTS.md, "Float32
  decoding on Zen 4: weights in panels, AVX-512"). `T2T_F32_AVX512=0` turns it alone off.
- `F32_PANELS_AVX2` (the same source built with AVX2 + FMA, its targets named `..._avx2`): the
  panels' packing and product where the processor lacks AVX-512F (Zen 3, Intel client cores),
  with tiles of 6 rows x 16 columns over 8 KB blocks of the panel (`panels_f32_avx2.h`), in
  place of `F32`'s NT product (benchmarks/EXPERIMENTS.md, "Float32 decoding without AVX-512: the
  panels and the decoder step for AVX2"). `panels_library()` says which build runs;
  `T2T_F32_PANELS_AVX2=0` turns it off, leaving `F32`'s NT product.

`dot(spec, a, b)` returns the product when a kernel applies and None otherwise, so the caller
(`matmuls`) falls back to XLA's dot. A kernel applies on a single-device CPU backend whose
processor has its instructions, to a plain contraction with at most `MAX_ROWS` rows whose weight
operand is [N, K] (K a multiple of 32 for bf16, of 8 for float32) or [K, N] (bf16: N a
multiple of 32; float32: only inside `weights_reused()`, transposed once). Each library is
compiled from its source with the system's C++ compiler on first use and kept in
`$T2T_CACHE_DIR` (default `$XDG_CACHE_HOME/t2t`, else `~/.cache/t2t`); without a compiler t2t
warns once and uses XLA's dot. `T2T_SMALL_DOTS=0` turns them all off.

`cross_attention(query, key, value, bias)` does the same for a decoding step's encoder-decoder
attention over its bf16 or float32 cache (`MultiHeadAttention`): both products and the softmax
in one call (float32: `F32_AVX512`'s where it runs, else `F32`'s); `attention(...)` for whole-sequence attention without dropout (the encoder at
inference), bf16 (`BF16`) or float32 (`F32`'s `t2t_f32_sequence_attention`, in the model's own
[b, len, heads, kv] layout), with XLA's gradient when differentiated. Inside `weights_reused()`
(a decoding step) a [K, N] weight is given to the kernel transposed, a transpose XLA computes
once before the decoding loop. The float32 GEMM library (`GEMM_F32`), the training attention's
(`ATTENTION_TRAIN_F32` and its AVX-512 build `ATTENTION_TRAIN_F32_AVX512`, and
`ATTENTION_TRAIN_BF16` for bf16 matmul operands), the initialisers' Threefry hash (`THREEFRY`)
and a decoder layer's whole decoding step (`DECODER_STEP_F32`, and its AVX2 build
`DECODER_STEP_F32_AVX2`) are loaded here too, for `gemm.py`, `train_attention.py`, `threefry.py`
and `decoder_step.py`.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import functools
import hashlib
import math
import os
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

from t2t import cpu

Array = jax.Array
DType = Any

MAX_ROWS = 64
NN_CHUNK_COLUMNS = 128   # columns of W [K, N] per work item shared among threads
NT_CHUNK_ROWS = 64       # rows of W [N, K] per work item
PANEL_COLUMNS = 32       # columns of a packed float32 panel (`panels_library()`)
PANEL_CHUNK = 4          # panels per work item
SWITCH = 'T2T_SMALL_DOTS'
_HERE = Path(__file__).parent
_COMMON_FLAGS = ('-O3', '-std=c++17', '-shared', '-fPIC', '-w')


@dataclasses.dataclass(frozen=True)
class Library:
  """One C++ source of FFI handlers: the CPU flags (/proc/cpuinfo) it needs, how it is
  compiled, and the handlers it registers."""
  name: str
  source: Path
  cpu_flags: tuple[str, ...]
  compile_flags: tuple[str, ...]
  targets: tuple[str, ...]
  headers: tuple[Path, ...] = (_HERE / 'small_dots_common.h',)
  switch: str | None = None   # an environment variable that turns this library alone off ('0')


BF16 = Library('bf16', _HERE / 'small_dots.cc', ('avx512f', 'avx512bw', 'avx512_bf16'),
               _COMMON_FLAGS + ('-mavx512f', '-mavx512bw', '-mavx512vl', '-mavx512bf16'),
               ('t2t_bf16_nn', 't2t_bf16_nt', 't2t_bf16_attention'))
_F32_HEADERS = (_HERE / 'small_dots_common.h', _HERE / 'attention_tiles_f32.h', _HERE / 'vec_f32.h')
# Every header a source may include, under any of its builds' flags: each is part of the key.
_PANEL_HEADERS = _F32_HEADERS + (_HERE / 'panels_f32_avx512.h', _HERE / 'panels_f32_avx2.h')
F32 = Library('f32', _HERE / 'small_dots_f32.cc', ('avx2', 'fma'),
              _COMMON_FLAGS + ('-mavx2', '-mfma'),
              ('t2t_f32_nt', 't2t_f32_transpose', 't2t_f32_attention',
               't2t_f32_sequence_attention'), _F32_HEADERS)
F32_AVX512 = Library('f32_avx512', _HERE / 'small_dots_f32_avx512.cc', ('avx512f', 'avx2', 'fma'),
                     _COMMON_FLAGS + ('-mavx512f', '-mavx2', '-mfma'),
                     ('t2t_f32_pack_panels', 't2t_f32_panel_product', 't2t_f32_attention_avx512'),
                     _PANEL_HEADERS, switch='T2T_F32_AVX512')
F32_PANELS_AVX2 = Library(   # the same source built for AVX2: the panels without AVX-512F
    'f32_panels_avx2', _HERE / 'small_dots_f32_avx512.cc', ('avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx2', '-mfma'),
    ('t2t_f32_pack_panels_avx2', 't2t_f32_panel_product_avx2'), _PANEL_HEADERS,
    switch='T2T_F32_PANELS_AVX2')
_STEP_HEADERS = (_HERE / 'attention_tiles_f32.h', _HERE / 'vec_f32.h',
                 _HERE / 'panels_f32_avx512.h', _HERE / 'panels_f32_avx2.h')
DECODER_STEP_F32 = Library(   # t2t/models/decoder_step.py: a decoder layer's step in one call
    'decoder_step_f32', _HERE / 'decoder_step_f32.cc', ('avx512f', 'avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx512f', '-mavx2', '-mfma'), ('t2t_f32_decoder_layer_step',),
    _STEP_HEADERS, switch='T2T_DECODER_STEP')
DECODER_STEP_F32_AVX2 = Library(   # the same step built for AVX2, with F32_PANELS_AVX2's panels
    'decoder_step_f32_avx2', _HERE / 'decoder_step_f32.cc', ('avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx2', '-mfma'), ('t2t_f32_decoder_layer_step_avx2',),
    _STEP_HEADERS, switch='T2T_DECODER_STEP')
GEMM_F32 = Library('gemm_f32', _HERE / 'gemm_f32.cc', ('avx2', 'fma'),
                   _COMMON_FLAGS + ('-mavx2', '-mfma'), ('t2t_f32_gemm',))   # t2t/models/gemm.py
GEMM_F32_AVX512 = Library(   # the same GEMM with AVX-512 tiles (gemm.library() chooses)
    'gemm_f32_avx512', _HERE / 'gemm_f32.cc', ('avx512f', 'avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx512f', '-mavx2', '-mfma', '-DT2T_GEMM_AVX512'),
    ('t2t_f32_gemm_avx512',), switch='T2T_GEMM_AVX512')
_TRAIN_ATTENTION_HEADERS = _F32_HEADERS + (_HERE / 'attention_train_common.h',
                                          _HERE / 'attention_tiles_f32_avx512.h')
ATTENTION_TRAIN_F32 = Library(   # t2t/models/train_attention.py
    'attention_train_f32', _HERE / 'attention_train_f32.cc', ('avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx2', '-mfma'),
    ('t2t_f32_attention_train_fwd', 't2t_f32_attention_train_bwd'), _TRAIN_ATTENTION_HEADERS)
ATTENTION_TRAIN_F32_AVX512 = Library(   # the same source with AVX-512 tiles
    'attention_train_f32_avx512', _HERE / 'attention_train_f32.cc', ('avx512f', 'avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx512f', '-mavx2', '-mfma', '-DT2T_ATTENTION_AVX512'),
    ('t2t_f32_avx512_attention_train_fwd', 't2t_f32_avx512_attention_train_bwd'),
    _TRAIN_ATTENTION_HEADERS, switch='T2T_TRAIN_ATTENTION_AVX512')
ATTENTION_TRAIN_BF16 = Library(   # the same for bf16 matmul operands, by VDPBF16PS
    'attention_train_bf16', _HERE / 'attention_train_bf16.cc',
    ('avx512f', 'avx512bw', 'avx512_bf16', 'avx2', 'fma'),
    _COMMON_FLAGS + ('-mavx512f', '-mavx512bw', '-mavx512vl', '-mavx512bf16', '-mavx2', '-mfma'),
    ('t2t_bf16_attention_train_fwd', 't2t_bf16_attention_train_bwd'), _TRAIN_ATTENTION_HEADERS,
    switch='T2T_TRAIN_ATTENTION_BF16')
THREEFRY = Library('threefry', _HERE / 'threefry.cc', ('avx2',),   # t2t/models/threefry.py
                   _COMMON_FLAGS + ('-mavx2',), ('t2t_threefry2x32',))
LIBRARIES = (BF16, F32, F32_AVX512, F32_PANELS_AVX2, DECODER_STEP_F32, DECODER_STEP_F32_AVX2,
             GEMM_F32, GEMM_F32_AVX512, ATTENTION_TRAIN_F32, ATTENTION_TRAIN_F32_AVX512,
             ATTENTION_TRAIN_BF16, THREEFRY)


def cache_dir() -> Path:
  """Where the compiled library is kept."""
  if os.environ.get('T2T_CACHE_DIR'):
    return Path(os.environ['T2T_CACHE_DIR'])
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return Path(base) / 't2t'


@functools.cache
def _which_compiler(cxx: str | None) -> str | None:
  return cxx or shutil.which('g++') or shutil.which('c++')


def _compiler() -> str | None:
  return _which_compiler(os.environ.get('CXX'))


def build(compiler: str, out_dir: Path, library: Library) -> Path:
  """Compiles `library` into out_dir (once per source, headers, flags and jaxlib); returns the .so.

  Written to a temporary name and renamed, so processes building at once never load half a file.
  Raises RuntimeError with the compiler's message when the build fails.
  """
  include = jax.ffi.include_dir()
  text = b''.join(path.read_bytes() for path in (library.source, *library.headers))
  key = hashlib.sha256(text + ' '.join(library.compile_flags).encode() + include.encode()
                       + jax.__version__.encode()).hexdigest()[:16]
  target = out_dir / f'{library.source.stem}-{key}.so'
  if target.exists():
    return target
  out_dir.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(suffix='.so', dir=out_dir)
  os.close(fd)
  try:
    proc = subprocess.run([compiler, *library.compile_flags, f'-I{include}',
                           f'-I{library.source.parent}', str(library.source), '-o', tmp],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
      raise RuntimeError(f'{compiler} could not build {library.source.name}: '
                         f'{proc.stderr.strip()[-2000:]}')
    os.replace(tmp, target)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return target


_LOAD_LOCK = threading.Lock()   # the trainer traces on two threads; register the targets once


def _load(library: Library) -> ctypes.CDLL | None:
  """Builds, loads and registers `library` once per process; None (after a warning) if it can't."""
  with _LOAD_LOCK:
    return _load_once(library)


@functools.cache
def _load_once(library: Library) -> ctypes.CDLL | None:
  try:
    lib = ctypes.CDLL(str(build(_compiler(), cache_dir(), library)))
  except (OSError, RuntimeError, subprocess.TimeoutExpired) as e:
    warnings.warn(f't2t.models.small_dots: the {library.name} kernel is off, XLA\'s own '
                  f'code is used instead ({e}). Set {SWITCH}=0 to silence this.', RuntimeWarning,
                  stacklevel=4)
    return None
  for name in library.targets:
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)), platform='cpu')
  return lib


def loaded(library: Library) -> ctypes.CDLL | None:
  """The loaded kernel, or None where it is switched off or cannot run (read on every trace)."""
  return None if unavailable_reason(library) is not None else _load(library)


def unavailable_reason(library: Library = BF16) -> str | None:
  """Why `library` cannot run in this process (None when it can)."""
  if os.environ.get(SWITCH, '1') == '0':
    return f'{SWITCH}=0'
  if library.switch and os.environ.get(library.switch, '1') == '0':
    return f'{library.switch}=0'
  if not all(flag in cpu.flags() for flag in library.cpu_flags):
    return (f'the CPU lacks one of {", ".join(library.cpu_flags)} '
            '(or is not x86-64 Linux)')
  if _compiler() is None:
    return f'no C++ compiler (g++, c++ or $CXX) to build {library.source.name}'
  return None


def status() -> dict:
  """For benchmark records: whether each kernel library is used and, if not, why.

  `enabled` is whether any is; `bf16` / `f32` / `gemm_f32` give each one's `enabled` and
  `reason`.
  """
  out: dict[str, Any] = {'max_rows': MAX_ROWS}
  for library in LIBRARIES:
    enabled = loaded(library) is not None
    reason = None if enabled else (unavailable_reason(library) or 'build failed (see the warning)')
    out[library.name] = {'enabled': enabled, 'reason': reason}
  out['enabled'] = any(out[library.name]['enabled'] for library in LIBRARIES)
  return out


def single_cpu_device() -> bool:
  """Whether JAX runs on one CPU device (the kernels' only home: no sharding to respect)."""
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


def in_weights_reused() -> bool:
  """Whether products traced now are inside `weights_reused()` (a decoding step)."""
  return _REUSED.get()


def weight_product_axes(spec: str, a: Array, b: Array) -> tuple[str, str, str, str] | None:
  """(a_free, contracted, b_free, b_spec) when `spec` is a product of a's trailing axes with some
  of b's, no batch axes, the output [*a_free, *b_free] ('bld,dhk->blhk', 'bld,vd->blv'); else
  None. Which of b's axes lead, and whether their sizes agree, is the caller's to check."""
  if '->' not in spec:
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
  return a_free, contracted, b_free, b_spec


def dot(spec: str, a: Array, b: Array) -> Array | None:
  """einsum(spec, a, b) in float32 by a kernel, or None where no kernel applies.

  a: [*free_a, *contracted] with prod(free_a) = M <= MAX_ROWS rows; b: [*contracted, *free_b] or
  [*free_b, *contracted]; the output [*free_a, *free_b], float32. bf16 operands (rounded by the
  caller) go to `BF16`; float32 ones to `F32`, inside `weights_reused()` only, differentiated as
  the plain product.
  """
  dtypes = {a.dtype, b.dtype}
  f32 = dtypes == {jnp.dtype(jnp.float32)}
  if (dtypes != {jnp.dtype(jnp.bfloat16)} and not (f32 and _REUSED.get())) or '->' not in spec:
    return None
  axes = weight_product_axes(spec, a, b)
  if axes is None:
    return None
  a_free, contracted, b_free, b_spec = axes
  rows = math.prod(a.shape[:len(a_free)])
  depth = math.prod(a.shape[len(a_free):])
  width = math.prod(b.shape[b_spec.index(c)] for c in b_free)
  if rows == 0 or rows > MAX_ROWS or width == 0:
    return None
  a_contracted = tuple(a.shape[len(a_free):])   # mismatched sizes: left to einsum's error
  b_leads = b_spec == contracted + b_free and tuple(b.shape[:len(contracted)]) == a_contracted
  nt_depth = 8 if f32 else 32   # the NT tiles' step along K
  if b_leads and _REUSED.get() and depth % nt_depth == 0 and width % 4 == 0:
    # In a decoding loop's body: W^T, computed once before the loop (`weights_reused`).
    layout, w = 'kn_as_nk', b.reshape(depth, width)
  elif b_leads and not f32 and depth % 2 == 0 and width % 32 == 0:
    layout, w = 'kn', b.reshape(depth, width)
  elif (b_spec == b_free + contracted and depth % nt_depth == 0 and width % 4 == 0
        and tuple(b.shape[len(b_free):]) == a_contracted):
    layout, w = 'nk', b.reshape(width, depth)
  else:
    return None
  if not single_cpu_device() or loaded(F32 if f32 else BF16) is None:
    return None
  a2 = a.reshape(rows, depth)
  if f32:
    result = _f32_product(layout == 'kn_as_nk', a2, w)
  else:
    if layout == 'kn_as_nk':
      w = w.T
    result = _bf16_product(layout == 'kn', a2, w)
  return result.reshape(a.shape[:len(a_free)] + tuple(b.shape[b_spec.index(c)] for c in b_free))


def panels_library() -> Library | None:
  """The float32 panels' library this process uses: `F32_AVX512` where the processor has
  AVX-512F, else `F32_PANELS_AVX2` (the same products and layout with AVX2's tiles); None where
  neither runs (switched off, no compiler, not x86-64 Linux)."""
  for library in (F32_AVX512, F32_PANELS_AVX2):
    if loaded(library) is not None:
      return library
  return None


def _panels_target(name: str) -> str:
  return name if panels_library() is F32_AVX512 else f'{name}_avx2'


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _f32_product(transpose: bool, a: Array, w: Array) -> Array:
  """a [M, K] x w [N, K] -> [M, N] float32 by weights packed in panels (`panels_library()`),
  else by `F32`'s NT kernel; with `transpose`, w is [K, N]. Either way w is first
  rearranged by a custom call (the panels' packing, or `F32`'s transpose to w^T): XLA hoists a
  custom call out of a loop, but not a transpose alone (it deems one not worth hoisting), which
  would then run every decoding step. Differentiated as the plain product."""
  if panels_library() is not None:
    return _panel_product(a, pack_panels(w, nk=not transpose), w.shape[1 if transpose else 0])
  if transpose:
    w = jax.ffi.ffi_call('t2t_f32_transpose', jax.ShapeDtypeStruct(w.shape[::-1], w.dtype),
                         vmap_method='sequential')(w)
  return jax.ffi.ffi_call('t2t_f32_nt', jax.ShapeDtypeStruct((a.shape[0], w.shape[0]), a.dtype),
                          vmap_method='sequential')(a, w, chunk=np.int64(NT_CHUNK_ROWS))


def pack_panels(w: Array, *, nk: bool) -> Array:
  """The float32 panels' layout of a weight (`panels_library()`, which must run here): w [K, N]
  (or [N, K] with `nk`) as panels [ceil(N / 32), K, 32], panel p holding columns 32p..32p+31
  row after row, zero past N.

  A custom call that depends on nothing a loop carries: XLA hoists it out of a decoding loop,
  so each weight is packed once per decode."""
  k, n = (w.shape[1], w.shape[0]) if nk else w.shape
  panels = -(-n // PANEL_COLUMNS)
  return jax.ffi.ffi_call(_panels_target('t2t_f32_pack_panels'),
                          jax.ShapeDtypeStruct((panels, k, PANEL_COLUMNS), jnp.float32),
                          vmap_method='sequential')(w, nk=np.int64(nk))


def _panel_product(a: Array, panels: Array, width: int) -> Array:
  """a [M, K] x packed panels [P, K, 32] -> [M, width] float32 (`width`: the weight's N)."""
  return jax.ffi.ffi_call(_panels_target('t2t_f32_panel_product'),
                          jax.ShapeDtypeStruct((a.shape[0], width), jnp.float32),
                          vmap_method='sequential')(a, panels, chunk=np.int64(PANEL_CHUNK))


def _f32_product_fwd(transpose, a, w):
  return _f32_product(transpose, a, w), (a, w)


def _f32_product_bwd(transpose, residuals, ct):
  a, w = residuals
  if transpose:   # w [K, N]
    return ct @ w.T, a.T @ ct
  return ct @ w, ct.T @ a


_f32_product.defvjp(_f32_product_fwd, _f32_product_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _bf16_product(w_leads: bool, a: Array, w: Array) -> Array:
  """bf16 a [M, K] x w -> float32 [M, N] by `BF16`'s kernel: w [K, N] with `w_leads`, else
  [N, K]. Differentiated as the plain product (a model with bf16 activations trains through it),
  the operands' gradients in bf16 like theirs."""
  target, chunk = ('t2t_bf16_nn', NN_CHUNK_COLUMNS) if w_leads else ('t2t_bf16_nt', NT_CHUNK_ROWS)
  width = w.shape[1] if w_leads else w.shape[0]
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((a.shape[0], width), jnp.float32),
                          vmap_method='sequential')(a, w, chunk=np.int64(chunk))


def _bf16_product_fwd(w_leads, a, w):
  return _bf16_product(w_leads, a, w), (a, w)


def _bf16_product_bwd(w_leads, residuals, ct):
  a, w = residuals
  w32 = w.astype(jnp.float32) if w_leads else w.astype(jnp.float32).T   # [K, N]
  d_a = ct @ w32.T
  d_w = a.astype(jnp.float32).T @ ct                                     # [K, N]
  return d_a.astype(a.dtype), (d_w if w_leads else d_w.T).astype(w.dtype)


_bf16_product.defvjp(_bf16_product_fwd, _bf16_product_bwd)


def _attention_call(query: Array, key: Array, value: Array, bias: Array | None) -> Array:
  """A kernel's softmax(q k + bias) v: query [B, H, Q, D], key [B, H, D, L], value [B, H, L, D]
  (bf16 key and value: `BF16`'s kernel, query rounded to bf16; float32: `F32`'s), bias float32
  broadcastable to [B, H, Q, L] (None: none) -> float32 [B, H, Q, D]."""
  b, h, q, _ = query.shape
  length = key.shape[-1]
  if bias is None:
    bias = jnp.zeros((1, 1, q, length), jnp.float32)
  else:
    bias = jnp.asarray(bias, jnp.float32)
    bias = jnp.broadcast_to(bias, (bias.shape[0], bias.shape[1], q, length))
  if key.dtype == jnp.float32:
    target = 't2t_f32_attention_avx512' if loaded(F32_AVX512) is not None else 't2t_f32_attention'
  else:
    target, query = 't2t_bf16_attention', query.astype(jnp.bfloat16)
  return jax.ffi.ffi_call(target, jax.ShapeDtypeStruct(query.shape, jnp.float32),
                          vmap_method='sequential')(query, key, value, bias)


def bias_fits(bias: Array | None, b: int, h: int, q: int, length: int) -> bool:
  """Whether `bias` is None or a 4-D array broadcastable to [b, h, q, length] whose first two
  dimensions are full or 1 (the kernel strides over those two and takes [q, length] rows)."""
  if bias is None:
    return True
  shape = jnp.shape(bias)
  return (len(shape) == 4 and shape[0] in (1, b) and shape[1] in (1, h)
          and shape[2] in (1, q) and shape[3] in (1, length))


def cross_attention(query: Array, key: Array, value: Array, bias: Array | None) -> Array | None:
  """A decoding step's encoder-decoder attention in one kernel call, or None where it can't run.

  query [B, H, Q, D], key [B, H, D, L] and value [B, H, L, D] (the encoder cache's layouts,
  `layers.encoder_cache_entry`), bias broadcastable to [B, 1, Q, L] (the padding mask's; None for
  none). A bf16 cache goes to `BF16` (query rounded to bf16, the logits and the product
  accumulated in float32, the weights rounded to bf16, as `MultiHeadAttention` computes it
  unfused); a float32 query and cache to `F32`. Returns float32 [B, H, Q, D]: softmax(q k +
  bias) v. D and L must be multiples of 32.
  """
  if key.dtype != value.dtype or query.ndim != 4:
    return None
  if key.dtype == jnp.bfloat16:
    library = BF16
  elif key.dtype == jnp.float32 and query.dtype == jnp.float32:
    library = F32
  else:
    return None
  b, h, q, d = query.shape
  length = key.shape[-1]
  if (key.shape != (b, h, d, length) or value.shape != (b, h, length, d) or d % 32
      or length % 32 or q == 0 or not bias_fits(bias, b, h, q, length)):
    return None
  if not single_cpu_device() or loaded(library) is None:
    return None
  return _attention_call(query, key, value, bias)


def attention(query: Array, key: Array, value: Array, bias: Array | None, *, dtype: DType,
              reference: Callable[[Array, Array, Array, Array | None], Array],
              operands: DType = jnp.bfloat16) -> Array | None:
  """Whole-sequence attention without dropout by a kernel, or None where none can run.

  query [b, q, h, d], key and value [b, k, h, d], bias broadcastable to [b, h, q, k] with 4
  dimensions (the relative position bias and the mask) or None. `operands` is the products'
  precision the model asks for: bfloat16 goes to `BF16`'s kernel (any float inputs, rounded to
  bf16 and transposed to its layout; d and k multiples of 32); float32 (float32 inputs only) to
  `F32`'s `t2t_f32_sequence_attention`, which reads this layout as it is (d and k multiples of
  16). Returns softmax(q k + bias) v, [b, q, h, d] in `dtype`, computed as `reference` (the
  unfused einsums: float32 logits and softmax; for bf16, bf16 operands and weights) computes it,
  up to float32 rounding. Under differentiation the forward and backward are `reference`'s (a
  `custom_vjp`): the kernels have no backward, so training with dropout 0 is exactly XLA's.
  The encoder at inference is the case it is for (benchmarks/EXPERIMENTS.md, "The encoder's
  attention" and "Float32 on Zen 3").
  """
  if query.ndim != 4 or key.ndim != 4:
    return None
  b, q, h, d = query.shape
  length = key.shape[1]
  f32 = jnp.dtype(operands) == jnp.float32
  if jnp.dtype(operands) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)) or (
      f32 and not query.dtype == key.dtype == value.dtype == jnp.float32):
    return None
  multiple = 16 if f32 else 32
  if (key.shape != (b, length, h, d) or value.shape != key.shape or d % multiple
      or length % multiple or q == 0 or not bias_fits(bias, b, h, q, length)):
    return None
  if not single_cpu_device() or loaded(F32 if f32 else BF16) is None:
    return None
  return _kernel_forward(reference, jnp.dtype(dtype), f32, query, key, value, bias)


def _sequence_attention_call(query: Array, key: Array, value: Array, bias: Array | None) -> Array:
  """`F32`'s softmax(q k^T + bias) v in the model's layout: query [b, q, h, d], key and value
  [b, k, h, d], float32 -> float32 [b, q, h, d]."""
  b, q, h, _ = query.shape
  length = key.shape[1]
  if bias is None:
    bias = jnp.zeros((1, 1, q, length), jnp.float32)
  else:
    bias = jnp.asarray(bias, jnp.float32)
    bias = jnp.broadcast_to(bias, (bias.shape[0], bias.shape[1], q, length))
  return jax.ffi.ffi_call('t2t_f32_sequence_attention',
                          jax.ShapeDtypeStruct(query.shape, jnp.float32),
                          vmap_method='sequential')(query, key, value, bias)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _kernel_forward(reference, dtype, f32, query, key, value, bias):
  if f32:
    return _sequence_attention_call(query, key, value, bias).astype(dtype)
  out = _attention_call(jnp.swapaxes(query, 1, 2).astype(jnp.bfloat16),
                        jnp.transpose(key, (0, 2, 3, 1)).astype(jnp.bfloat16),
                        jnp.swapaxes(value, 1, 2).astype(jnp.bfloat16), bias)
  return jnp.swapaxes(out, 1, 2).astype(dtype)


def _kernel_forward_fwd(reference, dtype, f32, query, key, value, bias):
  out, pullback = jax.vjp(reference, query, key, value, bias)
  return out.astype(dtype), pullback


def _kernel_forward_bwd(reference, dtype, f32, pullback, ct):
  return pullback(ct)


_kernel_forward.defvjp(_kernel_forward_fwd, _kernel_forward_bwd)
