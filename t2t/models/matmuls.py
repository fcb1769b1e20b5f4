"""The models' matmuls, written as two-operand einsums: mixed precision and a direct trace.

`matmul(spec, a, b, dtype, matmul_dtype)` is every matmul of the Transformer layers: with
`matmul_dtype` (e.g. bfloat16) its operands are rounded to that dtype and the product accumulated
in float32, forward and backward (`T5Config.matmul_dtype`). `einsum2` traces a two-operand
contraction straight to the `lax.dot_general` `jnp.einsum` would emit.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from t2t.models import gemm, small_dots

Array = jax.Array
DType = Any


def matmul(spec: str, a: Array, b: Array, dtype: DType, matmul_dtype: DType | None = None) -> Array:
  """`jnp.einsum(spec, a, b)` with its result in `dtype`; `matmul_dtype` sets the operands' dtype.

  `matmul_dtype=None`: both operands cast to `dtype`, a plain einsum. Otherwise (e.g. bfloat16,
  mixed precision as on a TPU's MXU) the operands are rounded to `matmul_dtype` and the product is
  accumulated in float32 and returned in `dtype`, and so are the two matmuls of the backward pass
  (`_mixed_einsum`): without that, JAX transposes a mixed dot into float32 x float32 dots. On a
  CPU with AVX512_BF16 this is XLA's fast dot path (benchmarks/EXPERIMENTS.md). Products with a few
  rows may go to t2t's own kernels (`small_dots.dot`); float32 ones over whole sequences get
  their gradients from t2t's GEMM (`gemm.dot`). `spec` must name every
  index of `a` in `b` or in the output and vice versa (true of every matmul in t2t).
  """
  if matmul_dtype is None:
    a, b = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
    out = small_dots.dot(spec, a, b)   # float32, a decoding step's few rows, on an AVX2 CPU
    if out is None:
      out = gemm.dot(spec, a, b)       # float32, whole sequences: the backward by t2t's GEMM
    return einsum2(spec, a, b) if out is None else out.astype(dtype)   # bf16 activations: bf16
  return _mixed_einsum(spec, jnp.dtype(matmul_dtype), jnp.dtype(dtype), a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _mixed_einsum(spec: str, matmul_dtype: DType, dtype: DType, a: Array, b: Array) -> Array:
  return _mixed_einsum_fwd(spec, matmul_dtype, dtype, a, b)[0]


def _mixed_einsum_fwd(spec, matmul_dtype, dtype, a, b):
  a_low, b_low = jnp.asarray(a, matmul_dtype), jnp.asarray(b, matmul_dtype)
  inputs, out_spec = spec.split('->')
  a_spec, b_spec = inputs.split(',')
  out = small_dots.dot(spec, a_low, b_low)   # a few rows (decoding) on an AVX512_BF16 CPU
  if out is None:
    out = _einsum_f32(a_spec, a_low, b_spec, b_low, out_spec)
  # The residuals keep the operands' dtypes as zero-size arrays (custom_vjp residuals are arrays).
  return out.astype(dtype), (a_low, b_low, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _mixed_einsum_bwd(spec, matmul_dtype, dtype, residuals, ct):
  a_low, b_low, a_like, b_like = residuals
  inputs, out = spec.split('->')
  a_spec, b_spec = inputs.split(',')
  ct_low = jnp.asarray(ct, matmul_dtype)
  da = _einsum_f32(out, ct_low, b_spec, b_low, a_spec)
  db = _einsum_f32(out, ct_low, a_spec, a_low, b_spec)
  return da.astype(a_like.dtype), db.astype(b_like.dtype)


def _einsum_f32(x_spec: str, x: Array, y_spec: str, y: Array, out_spec: str) -> Array:
  """einsum(x, y) accumulated in float32, the operand whose batch indices lead going first.

  XLA's CPU dot for bf16 x bf16 -> f32 refuses some operand layouts at run time ("Unsupported
  element type for DotThunk"), e.g. 'bqhd,bhqk->bkhd', while the swapped 'bhqk,bqhd->bkhd' runs.
  """
  batch = [c for c in x_spec if c in y_spec and c in out_spec]
  if not x_spec.startswith(''.join(batch)) and y_spec.startswith(''.join(batch)):
    x_spec, x, y_spec, y = y_spec, y, x_spec, x
  return einsum2(f'{x_spec},{y_spec}->{out_spec}', x, y, preferred_element_type=jnp.float32)


def einsum2(spec: str, x: Array, y: Array, preferred_element_type: DType | None = None) -> Array:
  """`jnp.einsum(spec, x, y)` for a contraction of two operands, traced straight to its ops.

  The same `lax.dot_general` (operand order, dimension numbers) and output transpose that
  `jnp.einsum` emits for such a spec, so XLA compiles the same program (for T5-small's bf16 train
  step, compared after optimisation: benchmarks/EXPERIMENTS.md), without `jnp.einsum`'s per-call
  contraction-path search and nested jit, ~1 ms of tracing per call and ~0.3 s of that step's
  trace. Specs of one plain contraction only: two operands, no ellipsis, no index repeated in
  an operand, every index in two of x, y and the output, equal dtypes and equal sizes for shared
  indices; anything else is handed to `jnp.einsum`.
  """
  inputs, out = spec.split('->') if '->' in spec else (spec, None)
  x_spec, _, y_spec = inputs.partition(',')
  x = x if isinstance(x, jax.Array) else jnp.asarray(x)
  y = y if isinstance(y, jax.Array) else jnp.asarray(y)
  plain = (out is not None and '.' not in spec and ',' not in y_spec
           and len(set(x_spec)) == len(x_spec) == x.ndim
           and len(set(y_spec)) == len(y_spec) == y.ndim and len(set(out)) == len(out)
           and x.dtype == y.dtype
           and all((c in x_spec) + (c in y_spec) + (c in out) >= 2 for c in x_spec + y_spec + out)
           and all(x.shape[x_spec.index(c)] == y.shape[y_spec.index(c)]
                   for c in x_spec if c in y_spec))
  if not plain:
    return jnp.einsum(spec, x, y, preferred_element_type=preferred_element_type)
  preferred_element_type = preferred_element_type or x.dtype
  batch = [c for c in out if c in x_spec and c in y_spec]
  contracted = sorted(set(x_spec) & set(y_spec) - set(out))
  dims = lambda s, names: tuple(s.index(c) for c in names)
  x_free = ''.join(c for c in x_spec if c not in y_spec)
  y_free = ''.join(c for c in y_spec if c not in x_spec)
  # jnp.einsum's order: y's free dims after x's if that is the output's order, else x's after y's.
  names = ''.join(batch) + x_free + y_free
  if names == out:
    result = jax.lax.dot_general(
        x, y, ((dims(x_spec, contracted), dims(y_spec, contracted)),
               (dims(x_spec, batch), dims(y_spec, batch))),
        preferred_element_type=preferred_element_type)
  else:
    names = ''.join(batch) + y_free + x_free
    result = jax.lax.dot_general(
        y, x, ((dims(y_spec, contracted), dims(x_spec, contracted)),
               (dims(y_spec, batch), dims(x_spec, batch))),
        preferred_element_type=preferred_element_type)
  if names != out:
    result = jax.lax.transpose(result, dims(names, out))
  return result


_mixed_einsum.defvjp(_mixed_einsum_fwd, _mixed_einsum_bwd)
