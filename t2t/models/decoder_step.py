"""A float32 T5 decoder layer's decoding step in one kernel call (`decoder_step_f32.cc`).

A greedy or beam-search step of a float32 T5 on a CPU reads every decoder weight, the encoder's
keys and values and the self-attention cache for a handful of rows. `small_dots` already runs
each of the step's products and its encoder-decoder attention in a kernel of its own; what was
left was ~55 kernel calls and ~160 small XLA thunks a token (norms, residual adds, the
self-attention and its softmax, the cache updates), each a fork and join of the threads. On a
Zen 4 VM that cost ~11.3 ms a token where the same step written as one C++ routine took 8.5-9.2
(benchmarks/EXPERIMENTS.md, "A decoder layer's step in one call"). `fused_layer_step` runs a whole
`DecoderLayer` step (three RMS norms, self-attention with the cache update, encoder-decoder
attention, the FFN, the residuals) as one call, whose work items each stage gives to whichever
of the caller and XLA's pool threads takes them first.

It applies to a `DecoderLayer` of a float32 T5 (activations, parameters and products in float32)
stepping one token inside `small_dots.weights_reused()` (a decoding loop's step, where each
weight's packing into panels is hoisted out of the loop), on a single-device CPU backend whose
processor has AVX-512F (library `DECODER_STEP_F32`) or else AVX2 + FMA (the same source built as
`DECODER_STEP_F32_AVX2`, with the AVX2 panels' tiles; `step_library()` says which), with its own
self-attention and FFN (not `shared_encoder_decoder`), encoder-decoder attention, no adapter,
ReLU (T5 v1.0) or gated-GELU (v1.1) feed-forward, a scalar cache index, no dropout, d_kv a
multiple of 16 up to 128, the encoder length a multiple of 16, and rows (batch x beams) a
multiple of the encoder cache's. Everywhere else it returns None and the layer runs as before.
`T2T_DECODER_STEP=0` turns it off (so do `T2T_SMALL_DOTS=0` and both panels' switches,
`T2T_F32_AVX512=0` with `T2T_F32_PANELS_AVX2=0`, whose layout it reads; `T2T_F32_AVX512=0` alone
leaves the AVX2 build). The result agrees with the unfused step to float32 rounding
(tests/models/test_decoder_step.py).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import small_dots

Array = jax.Array

_ACTIVATIONS = {('relu',): False, ('gelu', 'linear'): True}   # -> gated


# (the panels' library, the step's library) by preference: AVX-512F, else AVX2 + FMA.
_BUILDS = ((small_dots.F32_AVX512, small_dots.DECODER_STEP_F32),
           (small_dots.F32_PANELS_AVX2, small_dots.DECODER_STEP_F32_AVX2))


def unavailable_reason() -> str | None:
  """Why the fused step cannot run in this process (None when it can)."""
  reasons = []
  for panels, step in _BUILDS:
    reason = small_dots.unavailable_reason(step) or small_dots.unavailable_reason(panels)
    if reason is None:
      return None
    reasons.append(reason)
  return '; '.join(dict.fromkeys(reasons))


def step_library() -> small_dots.Library | None:
  """The step's library this process uses (`DECODER_STEP_F32` with AVX-512F, else
  `DECODER_STEP_F32_AVX2`), loaded with the panels' library it reads; None where neither runs."""
  for panels, step in _BUILDS:
    if small_dots.loaded(step) is not None and small_dots.loaded(panels) is not None:
      return step
  return None


def _plain_float32(layer: nn.Module) -> bool:
  c = layer.config
  return (jnp.dtype(c.dtype) == jnp.float32 and jnp.dtype(c.param_dtype) == jnp.float32
          and c.matmul_dtype is None)


def fused_layer_step(layer: nn.Module, x: Array, self_bias: Array, cross_bias: Array | None,
                     enable_dropout: bool) -> Array | None:
  """`layer`'s (a bound `transformer.DecoderLayer`) decoding step for x [rows, 1, d_model] in
  one kernel call, its caches updated as `MultiHeadAttention` updates them; None where the
  kernel does not apply (see the module docstring), and the caller runs the layer unfused.

  self_bias: broadcastable to [rows, heads, 1, T] (relative positions and unwritten slots);
  cross_bias: broadcastable to [rows, 1, 1, L] (encoder padding) or None.
  """
  c = layer.config
  if (layer.shared is not None or not layer.cross_attention or layer.adapter is not None
      or not _plain_float32(layer) or x.ndim != 3 or x.shape[1] != 1
      or x.dtype != jnp.float32 or (enable_dropout and c.dropout_rate > 0)
      or c.mlp_activations not in _ACTIVATIONS or not small_dots.in_weights_reused()):
    return None
  cache = layer.variables.get('cache', {})
  own = cache.get('self_attention', {})
  cross = cache.get('encoder_decoder_attention', {})
  if not all(k in own for k in ('cached_key', 'cached_value', 'cache_index')) or not all(
      k in cross for k in ('cached_key', 'cached_value')):
    return None   # the first (prefill) call creates the caches the unfused way
  k_cache, v_cache, index = own['cached_key'], own['cached_value'], own['cache_index']
  cross_k, cross_v = cross['cached_key'], cross['cached_value']
  rows, heads, length, d_kv = k_cache.shape
  enc_rows, enc_length = cross_k.shape[0], cross_k.shape[-1]
  if (jnp.ndim(index) != 0 or k_cache.dtype != jnp.float32 or cross_k.dtype != jnp.float32
      or rows != x.shape[0] or enc_rows == 0 or rows % enc_rows or d_kv % 16 or d_kv > 128
      or enc_length % 16
      or cross_k.shape != (enc_rows, heads, d_kv, enc_length)
      or heads != c.num_heads or d_kv != c.d_kv):
    return None
  if not small_dots.single_cpu_device() or step_library() is None:
    return None
  params = nn.unbox(layer.variables['params'])
  new_x, k_cache, v_cache = layer_step(
      x[:, 0], params, k_cache, v_cache, index, self_bias, cross_k, cross_v, cross_bias,
      eps=c.layer_norm_epsilon, gated=_ACTIVATIONS[c.mlp_activations])
  layer.self_attention.put_variable('cache', 'cached_key', k_cache)
  layer.self_attention.put_variable('cache', 'cached_value', v_cache)
  layer.self_attention.put_variable('cache', 'cache_index', index + 1)
  return new_x[:, None, :].astype(x.dtype)


def layer_step(x: Array, params: dict[str, Any], k_cache: Array, v_cache: Array, index: Array,
               self_bias: Array, cross_k: Array, cross_v: Array, cross_bias: Array | None, *,
               eps: float, gated: bool) -> tuple[Array, Array, Array]:
  """The kernel call. x [M, D]; `params` a `DecoderLayer`'s (`self_attention`,
  `encoder_decoder_attention`, `mlp`, the three layer norms); caches [M, H, T, d_kv]; index an
  int32 scalar; cross_k [R, H, d_kv, L], cross_v [R, H, L, d_kv]. Returns (x, k_cache, v_cache)
  after the step, the caches aliased to the operands (updated in place where XLA can)."""
  library = step_library()   # loads (and so registers) the step's and the panels' targets
  if library is None:
    raise RuntimeError('decoder_step.layer_step needs the decoder step kernels, which cannot '
                       f'run here: {unavailable_reason() or "the build failed"}.')
  rows, d_model = x.shape
  _, heads, length, d_kv = k_cache.shape
  enc_length = cross_k.shape[-1]

  def panels(kernel: Array, contracted: int) -> Array:   # [*K, *N] -> panels [P, K, 32]
    k = int(np.prod(kernel.shape[:contracted]))
    return small_dots.pack_panels(kernel.reshape(k, -1).astype(jnp.float32), nk=False)

  own, cross, mlp = (params['self_attention'], params['encoder_decoder_attention'],
                     params['mlp'])
  wi = mlp['wi_0' if gated else 'wi']['kernel']
  wi1 = mlp['wi_1']['kernel'] if gated else wi
  self_bias = jnp.broadcast_to(jnp.asarray(self_bias, jnp.float32),
                               (rows, heads, 1, length)).reshape(rows, heads, length)
  if cross_bias is None:
    cross_bias = jnp.zeros((rows, enc_length), jnp.float32)
  else:
    cross_bias = jnp.broadcast_to(jnp.asarray(cross_bias, jnp.float32),
                                  (rows, 1, 1, enc_length)).reshape(rows, enc_length)
  scale = lambda name: params[name]['scale'].astype(jnp.float32)
  operands = (
      x.astype(jnp.float32), scale('pre_self_attention_layer_norm'),
      panels(own['query']['kernel'], 1), panels(own['key']['kernel'], 1),
      panels(own['value']['kernel'], 1), panels(own['out']['kernel'], 2),
      scale('pre_cross_attention_layer_norm'), panels(cross['query']['kernel'], 1),
      panels(cross['out']['kernel'], 2), scale('pre_mlp_layer_norm'), panels(wi, 1),
      panels(wi1, 1), panels(mlp['wo']['kernel'], 1), k_cache, v_cache,
      jnp.asarray(index, jnp.int32), self_bias, cross_k, cross_v, cross_bias)
  cache_shape = jax.ShapeDtypeStruct(k_cache.shape, jnp.float32)
  return jax.ffi.ffi_call(
      library.targets[0],
      (jax.ShapeDtypeStruct((rows, d_model), jnp.float32), cache_shape, cache_shape),
      input_output_aliases={13: 1, 14: 2}, vmap_method='sequential')(
          *operands, eps=np.float32(eps), gated=np.int64(gated))
