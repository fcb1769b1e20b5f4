"""Training attention with dropout on its weights, forward and backward by a float32 CPU kernel.

T5 applies dropout "on the attention weights" when training (Raffel et al. 2020, section 2.1; rate
0.1, section 3.1.1), and its logits are not scaled by 1/sqrt(d) (the reference code): out = (P *
keep / keep_prob) v with P = softmax(q k^T + bias). XLA:CPU runs a T5-small encoder layer's version of
that, forward and backward, as ~10 fusions each passing over [8, 8, 512, 512] float32 tensors,
~55-67 GFLOP/s on a 2-core Zen 3 (benchmarks/EXPERIMENTS.md). `dropout_attention` hands it to
`attention_train_f32.cc` (library `small_dots.ATTENTION_TRAIN_F32`, AVX2 + FMA): the forward
keeps P for the backward, which computes

  dW = d_out v^T,  dP = dW * keep / keep_prob,  d_logits = P * (dP - rowsum(dP * P)),
  d_v = (P * keep / keep_prob)^T d_out,  d_q = d_logits k,  d_k = d_logits^T q,

the bias's gradient being d_logits summed over the axes the bias broadcasts. The keep mask is the
one the model's `Dropout` site draws (`layers.Dropout.keep_mask`), so the kernel and XLA's path
drop the same weights; their results differ only in float32 summation order.

A model with bf16 matmul operands (`T5Config.matmul_dtype`) passes q, k and v rounded to bf16
(`layers.MultiHeadAttention`) with `bf16_products=True`. Where the CPU has AVX512_BF16 and d and
the key length are multiples of 32 (`runs_bf16_products`), `attention_train_bf16.cc` (library
`small_dots.ATTENTION_TRAIN_BF16`; `T2T_TRAIN_ATTENTION_BF16=0` turns it off) computes the six
products with bf16 dot products, rounding each product's operands to bf16 where XLA's bf16 path
(`matmuls._mixed_einsum`) rounds them: the dropped weights before the product with v, d_out, and
d_logits before d_q and d_k; so it is XLA's bf16 attention up to float32 summation order.
Elsewhere the float32 kernel takes the rounded q, k and v: bf16 values multiplied in float32,
the softmax's weights not rounded (slightly closer to the float32 model). Figures:
benchmarks/EXPERIMENTS.md, "bf16 on Zen 4 again" and "The training attention's products in bf16".

The float32 kernel has two builds of one source: AVX2 + FMA, 6 x 16 tiles, and AVX-512F, 6 x 32
tiles of zmm sums (`small_dots.ATTENTION_TRAIN_F32_AVX512`, for d and key lengths that are
multiples of 32), which runs by default where the cores do 512-bit FMAs at full width
(`prefers_avx512`; `T2T_TRAIN_ATTENTION_AVX512=0` or `1` chooses): on a 2-core Zen 5 it took
another 1.5-8% off the float32 train step after the GEMM's AVX-512 build (benchmarks/EXPERIMENTS.md,
"Zen 5"); on Intel it runs by the same rule, not yet timed there. Their products sum in the same
order; the softmax's and the backward's row sums run over 8 or 16 lanes, so the two agree to
float32 rounding, not to the bit.
"""
from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from t2t import cpu
from t2t.models import small_dots

Array = jax.Array

SWITCH = 'T2T_TRAIN_ATTENTION'
_FLOAT32 = 't2t_f32_attention_train'   # the handlers' names, without _fwd / _bwd
_FLOAT32_AVX512 = 't2t_f32_avx512_attention_train'
_BF16 = 't2t_bf16_attention_train'


def unavailable_reason() -> str | None:
  """Why the kernel cannot run in this process (None when it can)."""
  if os.environ.get(SWITCH, '1') == '0':
    return f'{SWITCH}=0'
  return small_dots.unavailable_reason(small_dots.ATTENTION_TRAIN_F32)


def applies(query: Array, key: Array, value: Array, bias: Array | None) -> bool:
  """Whether `dropout_attention` takes these operands: float32 query [b, q, h, d], key and value
  [b, k, h, d] with d and k multiples of 16, a bias broadcastable to [b, h, q, k] (4-D, first two
  dimensions full or 1) or None, one CPU device, and the kernel built for this CPU."""
  if query.ndim != 4 or key.ndim != 4:
    return False
  b, q, h, d = query.shape
  length = key.shape[1]
  if (not query.dtype == key.dtype == value.dtype == jnp.float32
      or key.shape != (b, length, h, d) or value.shape != key.shape
      or d % 16 or length % 16 or q == 0 or not small_dots.bias_fits(bias, b, h, q, length)):
    return False
  if not small_dots.single_cpu_device() or unavailable_reason() is not None:
    return False
  return small_dots.loaded(small_dots.ATTENTION_TRAIN_F32) is not None


def prefers_avx512() -> bool:
  """Whether the float32 kernel's AVX-512 build (`small_dots.ATTENTION_TRAIN_F32_AVX512`) is
  wanted where it runs: `T2T_TRAIN_ATTENTION_AVX512=1` or `0` decides; otherwise where the cores
  run 512-bit FMAs at full width (`cpu.full_width_avx512`: Intel, Zen 5)."""
  choice = os.environ.get(small_dots.ATTENTION_TRAIN_F32_AVX512.switch, 'auto')
  if choice in ('0', '1'):
    return choice == '1'
  return cpu.full_width_avx512()


def float32_kernel(query: Array, key: Array) -> str:
  """The float32 handlers' name for these operands: the AVX-512 build's where `prefers_avx512()`,
  it is built for this CPU, and d and the key length are multiples of 32 (its strips' width);
  else the AVX2 build's."""
  if (query.shape[-1] % 32 == 0 and key.shape[1] % 32 == 0 and prefers_avx512()
      and small_dots.loaded(small_dots.ATTENTION_TRAIN_F32_AVX512) is not None):
    return _FLOAT32_AVX512
  return _FLOAT32


def float32_build() -> str | None:
  """The float32 kernel's build that runs here for d and key lengths that are multiples of 32
  (T5's): the library's name (`attention_train_f32_avx512` or `attention_train_f32`), None where
  neither runs. For benchmark records."""
  if unavailable_reason() is not None:
    return None
  for library in ((small_dots.ATTENTION_TRAIN_F32_AVX512,) if prefers_avx512() else ()) + (
      small_dots.ATTENTION_TRAIN_F32,):
    if small_dots.loaded(library) is not None:
      return library.name
  return None


def runs_bf16_products(query: Array, key: Array) -> bool:
  """Whether `dropout_attention(..., bf16_products=True)` runs on bf16 dot products here: the
  AVX512_BF16 kernel is built and on, and d and the key length are multiples of 32."""
  return (query.shape[-1] % 32 == 0 and key.shape[1] % 32 == 0
          and small_dots.loaded(small_dots.ATTENTION_TRAIN_BF16) is not None)


def dropout_attention(query: Array, key: Array, value: Array, bias: Array | None, keep: Array,
                      keep_prob: float, *, bf16_products: bool = False) -> Array:
  """(softmax(q k^T + bias) * keep / keep_prob) v by the kernel, differentiable.

  query [b, q, h, d], key and value [b, k, h, d] (float32; `applies` must hold), bias
  broadcastable to [b, h, q, k] or None, keep bool [b, h, q, k]. Returns [b, q, h, d] float32.
  `bf16_products`: a bf16-matmul model's attention (q, k and v already rounded to bf16), computed
  with bf16 products where `runs_bf16_products(query, key)`, else in float32.
  """
  b, q, h, _ = query.shape
  length = key.shape[1]
  if keep.shape != (b, h, q, length) or keep.dtype != jnp.bool_:
    raise ValueError(f'dropout_attention: keep must be bool {(b, h, q, length)}, got '
                     f'{keep.dtype} {keep.shape}.')
  if bias is None:
    bias = jnp.zeros((1, 1, q, length), jnp.float32)
  bias = jnp.asarray(bias, jnp.float32)
  bias = jnp.broadcast_to(bias, (bias.shape[0], bias.shape[1], q, length))
  summed = tuple(axis for axis in (0, 1) if bias.shape[axis] == 1 and (b, h)[axis] > 1)
  if bf16_products and runs_bf16_products(query, key):
    kernel = _BF16
  else:
    kernel = float32_kernel(query, key)
  return _attention(query, key, value, bias, keep, float(1.0 / keep_prob), summed, kernel)


def _forward_call(query, key, value, bias, keep, scale, kernel):
  b, q, h, _ = query.shape
  shapes = (jax.ShapeDtypeStruct(query.shape, jnp.float32),
            jax.ShapeDtypeStruct((b, h, q, key.shape[1]), jnp.float32))
  return jax.ffi.ffi_call(f'{kernel}_fwd', shapes, vmap_method='sequential')(
      query, key, value, bias, keep, scale=np.float32(scale))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attention(query, key, value, bias, keep, scale, summed, kernel):
  """`summed`: the axes (of 0 and 1) the bias broadcasts, over which its gradient is summed;
  `kernel`: the handlers' name (`_FLOAT32`, `_FLOAT32_AVX512` or `_BF16`)."""
  return _forward_call(query, key, value, bias, keep, scale, kernel)[0]


def _attention_fwd(query, key, value, bias, keep, scale, summed, kernel):
  out, probs = _forward_call(query, key, value, bias, keep, scale, kernel)
  return out, (query, key, value, probs, keep)


def _attention_bwd(scale, summed, kernel, residuals, d_out):
  query, key, value, probs, keep = residuals
  shapes = (jax.ShapeDtypeStruct(query.shape, jnp.float32),
            jax.ShapeDtypeStruct(key.shape, jnp.float32),
            jax.ShapeDtypeStruct(value.shape, jnp.float32),
            jax.ShapeDtypeStruct(probs.shape, jnp.float32))
  d_query, d_key, d_value, d_logits = jax.ffi.ffi_call(
      f'{kernel}_bwd', shapes, vmap_method='sequential')(
          query, key, value, probs, keep, d_out.astype(jnp.float32), scale=np.float32(scale))
  return d_query, d_key, d_value, _sum_leading(d_logits, summed), None


def _sum_leading(d_logits: Array, summed: tuple[int, ...]) -> Array:
  """d_logits [b, h, q, k] summed over `summed` (of axes 0 and 1), keeping them. A sum over the
  batch is a product with a vector of ones, as `layers.add_mask_bias` sums the model's position
  bias: XLA:CPU reduces an [8, 8, 512, 512] float32 array over its leading axis in ~93 ms on a
  Zen 4 VM, over both leading axes in ~64 ms, and the products take ~2 ms; over the heads alone
  its reduction (~14 ms) is the faster of the two (benchmarks/EXPERIMENTS.md, "The bias's batch
  sum as a dot")."""
  if 0 not in summed:
    return jnp.sum(d_logits, axis=summed, keepdims=True) if summed else d_logits
  b, h, q, k = d_logits.shape
  rows = b * h if 1 in summed else b
  total = jax.lax.dot(jnp.ones((rows,), jnp.float32), d_logits.reshape(rows, -1),
                      precision=jax.lax.Precision.HIGHEST)
  return total.reshape((1, 1 if 1 in summed else h, q, k))


_attention.defvjp(_attention_fwd, _attention_bwd)
