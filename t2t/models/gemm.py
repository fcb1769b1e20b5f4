"""The backward pass of whole-sequence float32 weight products, by t2t's own GEMM on x86 CPUs.

Differentiating `x @ w` needs `g @ w^T` and `x^T @ g`. For T5-small's float32 train step on a
2-core Zen 3, XLA:CPU feeds the second to its dot as a transposed copy of the large operand: the
encoder FFN's [8 * 512, 2048] hidden gradient (140-180 ms a layer, written column by column) and
the logits' [8 * 114, 32128] gradient (~380 ms), ~1.2 s of a ~10 s step (benchmarks/EXPERIMENTS.md,
"Float32 on Zen 3"). `gemm_f32.cc` reads either operand transposed where it lies,
so nothing is copied; on plain products it ran at about XLA's speed on Zen 3, and behind it on
Zen 4, where the input's gradient (whose transposed operand is only the small weight) is left to
XLA's dot.

`dot(spec, a, b)` returns the product for a float32 contraction of a's trailing axes against b's
leading or trailing axes with no batch axes (every weight product of the Transformer:
'bld,dhk->blhk', 'blhk,hkd->bld', 'bld,vd->blv', ...) with at least `MIN_ROWS` rows, outside a
decoding step (`small_dots.weights_reused`), on a single-device CPU backend whose processor has
AVX2 and FMA (`small_dots.GEMM_F32`, compiled on first use as the other kernels are); None
otherwise, and the caller (`matmuls.matmul`) uses XLA's einsum. The forward product is XLA's own
dot, so inference and the forward pass compile as before; the weight's gradient runs in the
kernel (a `custom_vjp`), the input's gradient (whose transposed operand is only the small weight)
in XLA's dot. Attention's batched products stay with XLA.

Two builds of the one source (`library()`): AVX2 + FMA (`small_dots.GEMM_F32`) and AVX-512F
(`small_dots.GEMM_F32_AVX512`, 12 x 32 tiles). They agree to the bit. On a 2-core Intel
Emerald Rapids the AVX-512 build runs T5-small's weight gradients at 150-250 GFLOP/s against the
AVX2 build's 100-125 and makes the float32 train step 10-24% faster
(benchmarks/EXPERIMENTS.md, "Intel Emerald Rapids"), on a 2-core Zen 5 14-17% ("Zen 5"); it runs
by default where the cores do 512-bit FMAs at full width (`prefers_avx512`).

`T2T_GEMM=0` turns it off alone; `T2T_SMALL_DOTS=0` turns off every t2t kernel, this one too;
`T2T_GEMM_AVX512=0` or `1` chooses the build.
"""
from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp

from t2t import cpu
from t2t.models import small_dots

Array = jax.Array

MIN_ROWS = 128      # rows of the product (tokens) below which XLA's backward is left alone
SWITCH = 'T2T_GEMM'
# The input's gradient g w^T by the kernel too (False: by XLA's dot, the default). On a 2-core Zen 4
# XLA's dot ran T5-small's input-gradient products 2-20% faster than the kernel (jitted alone),
# and the train step's median 4.85 s against 4.99 s (benchmarks/EXPERIMENTS.md, "The train step on
# Zen 4: the attention backward's transposes, and the input gradients by XLA's dot"); on a 2-core
# Zen 3, 5.88 / 6.36 / 6.69 s against 6.28 / 6.61 / 6.91 s in three alternating pairs ("Float32 on
# Zen 3 again at today's code").
INPUT_GRADIENT_BY_KERNEL = False


def unavailable_reason() -> str | None:
  """Why the GEMM cannot run in this process (None when it can)."""
  if os.environ.get(SWITCH, '1') == '0':
    return f'{SWITCH}=0'
  return small_dots.unavailable_reason(small_dots.GEMM_F32)


def prefers_avx512() -> bool:
  """Whether the AVX-512 build is wanted where it runs: `T2T_GEMM_AVX512=1` or `0` decides;
  otherwise where the cores run 512-bit FMAs at full width (`cpu.full_width_avx512`:
  Intel, Zen 5), twice AVX2's work. AMD's Zen 4 splits each 512-bit operation into two 256-bit
  halves, and the AVX2 build is the one measured there."""
  choice = os.environ.get(small_dots.GEMM_F32_AVX512.switch, 'auto')
  if choice in ('0', '1'):
    return choice == '1'
  return cpu.full_width_avx512()


def library() -> small_dots.Library | None:
  """The GEMM build this process runs: `GEMM_F32_AVX512` where `prefers_avx512()` and the
  processor has AVX-512F, else `GEMM_F32` (AVX2 + FMA); None where neither runs."""
  if os.environ.get(SWITCH, '1') == '0':
    return None
  candidates = ((small_dots.GEMM_F32_AVX512,) if prefers_avx512() else ()) + (small_dots.GEMM_F32,)
  return next((lib for lib in candidates if small_dots.loaded(lib) is not None), None)


def dot(spec: str, a: Array, b: Array) -> Array | None:
  """einsum(spec, a, b), differentiated by the GEMM kernel, or None where it does not apply.

  a: [*free_a, *contracted] with M = prod(free_a) >= MIN_ROWS rows; b: [*contracted, *free_b]
  or [*free_b, *contracted]; the output [*free_a, *free_b]. Both operands float32.
  """
  if a.dtype != jnp.float32 or b.dtype != jnp.float32 or small_dots.in_weights_reused():
    return None
  axes = small_dots.weight_product_axes(spec, a, b)
  if axes is None:
    return None
  a_free, contracted, b_free, b_spec = axes
  a_contracted = tuple(a.shape[len(a_free):])
  if b_spec == contracted + b_free and tuple(b.shape[:len(contracted)]) == a_contracted:
    transpose_b = False
  elif b_spec == b_free + contracted and tuple(b.shape[len(b_free):]) == a_contracted:
    transpose_b = True
  else:
    return None   # mismatched sizes: left to einsum's error
  rows, depth = math.prod(a.shape[:len(a_free)]), math.prod(a_contracted)
  b_free_shape = tuple(b.shape[b_spec.index(c)] for c in b_free)
  width = math.prod(b_free_shape)
  if rows < MIN_ROWS or depth == 0 or width == 0:
    return None
  if not small_dots.single_cpu_device() or library() is None:
    return None
  w = b.reshape((width, depth) if transpose_b else (depth, width))
  return product(a.reshape(rows, depth), w, transpose_b).reshape(
      a.shape[:len(a_free)] + b_free_shape)


def _kernel(a: Array, b: Array, transpose_a: bool, transpose_b: bool) -> Array:
  """op(a) [M, K] x op(b) [K, N] -> [M, N] by the kernel; op transposes where asked."""
  build = library()   # loads it, registering its target, on first use
  if build is None:
    raise RuntimeError(f'The float32 GEMM kernel cannot run here: {unavailable_reason()}.')
  m = a.shape[1] if transpose_a else a.shape[0]
  n = b.shape[0] if transpose_b else b.shape[1]
  return jax.ffi.ffi_call(build.targets[0], jax.ShapeDtypeStruct((m, n), jnp.float32),
                          vmap_method='sequential')(a, b, transpose_a=transpose_a,
                                                    transpose_b=transpose_b)


def _xla_product(a: Array, w: Array, transpose_b: bool) -> Array:
  return jax.lax.dot_general(a, w, (((1,), (1 if transpose_b else 0,)), ((), ())))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def product(a: Array, w: Array, transpose_b: bool) -> Array:
  """a [M, K] x w -> [M, N] float32 by XLA's dot: w is [K, N], or [N, K] with `transpose_b`.

  The weight's gradient is the kernel's: a^T x ct ([K, N]) or ct^T x a ([N, K]), both operands
  read in place (float32 sums in another order than XLA's). The input's, ct [M, N] x op(w)^T, is
  XLA's dot, whose transposed operand is only the weight (`INPUT_GRADIENT_BY_KERNEL`).
  """
  return _xla_product(a, w, transpose_b)


def _product_fwd(a, w, transpose_b):
  return _xla_product(a, w, transpose_b), (a, w)


def _product_bwd(transpose_b, residuals, ct):
  a, w = residuals
  # ct [M, N] x op(w)^T: the transposed operand is the (small) weight.
  if INPUT_GRADIENT_BY_KERNEL:
    da = _kernel(ct, w, False, not transpose_b)
  else:
    da = _xla_product(ct, w, not transpose_b)
  dw = _kernel(ct, a, True, False) if transpose_b else _kernel(a, ct, True, False)
  return da, dw


product.defvjp(_product_fwd, _product_bwd)
