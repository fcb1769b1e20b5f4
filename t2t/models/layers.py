"""Shared Transformer layers (Flax linen) with logical axis annotations.

Every parameter is created through `nn.with_logical_partitioning` so that the trainer can map it onto a
device mesh with gin-configurable rules; every main activation is constrained with
`nn.with_logical_constraint`. Logical axis names used here:

  parameters:  vocab, embed, mlp, heads, kv, relpos_buckets
  activations: batch, length, embed, mlp, heads, kv, vocab

The layers follow the T5 reference (mesh-tensorflow) conventions: no biases anywhere, RMS-style layer
norm, attention logits *not* scaled by 1/sqrt(d_kv) (the scaling lives in the query initialiser).
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import small_dots, train_attention
from t2t.models.dropout import (DROPOUT_BITS, Dropout, _dropout, dropout_keep_mask,  # noqa: F401
                                dropout_keep_prob, with_planned_dropout)  # (re-exported)
from t2t.models.matmuls import einsum2, matmul

Array = jax.Array
DType = Any
Initializer = Callable[..., Array]

# Added to attention logits at masked positions. Large but finite: a query whose keys are all masked
# (a padding position) then gets uniform weights instead of NaNs.
NEG_INF = -1e10


def _canonical_axes(axes: Sequence[int], ndim: int) -> tuple[int, ...]:
  return tuple(a % ndim for a in axes)


def _dense_spec(ndim: int, axis: tuple[int, ...], num_features: int) -> str:
  """The einsum of a DenseGeneral: input dims `axis` contracted with the kernel's leading dims.

  E.g. ndim 4, axis (2, 3), 1 feature: 'abcd,cde->abe'.
  """
  letters = 'abcdefghijklmnopqrstuvwxyz'
  x = letters[:ndim]
  features = letters[ndim:ndim + num_features]
  kernel = ''.join(x[a] for a in axis) + features
  out = ''.join(c for i, c in enumerate(x) if i not in axis) + features
  return f'{x},{kernel}->{out}'


class RMSNorm(nn.Module):
  """T5 layer norm: x * rsqrt(mean(x^2) + eps) * scale. No mean subtraction, no bias.

  Statistics are computed in float32 whatever the activation dtype. [..., embed] -> [..., embed].
  """
  epsilon: float = 1e-6
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = x.shape[-1]
    scale = self.param('scale', nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
                       (features,), self.param_dtype)
    x32 = jnp.asarray(x, jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + self.epsilon)
    return jnp.asarray(y, self.dtype) * jnp.asarray(scale, self.dtype)


class DenseGeneral(nn.Module):
  """Bias-free dense layer contracting `axis` of the input into `features` output dims.

  Example: features=(heads, d_kv), axis=-1 maps [b, l, embed] -> [b, l, heads, d_kv] with a kernel of
  shape [embed, heads, d_kv]; features=embed, axis=(-2, -1) maps [b, l, heads, d_kv] -> [b, l, embed].
  `kernel_axes` names every kernel dimension (contracted dims first, then output dims).
  """
  features: int | tuple[int, ...]
  kernel_axes: tuple[str, ...]
  axis: int | tuple[int, ...] = -1
  kernel_init: Initializer = nn.initializers.lecun_normal()
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  matmul_dtype: DType | None = None   # operands' dtype in the matmul (`matmul`)

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    axis = _canonical_axes(axis, x.ndim)
    kernel_shape = tuple(x.shape[a] for a in axis) + features
    if len(self.kernel_axes) != len(kernel_shape):
      raise ValueError(f'DenseGeneral: kernel_axes {self.kernel_axes} must name all {len(kernel_shape)} '
                       f'kernel dimensions (shape {kernel_shape}).')
    kernel = self.param('kernel', nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
                        kernel_shape, self.param_dtype)
    return matmul(_dense_spec(x.ndim, axis, len(features)), x, kernel, self.dtype, self.matmul_dtype)


class Embed(nn.Module):
  """Token embedding table [vocab, embed]; `attend` reuses it as the (tied) output projection."""
  num_embeddings: int
  features: int
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  matmul_dtype: DType | None = None   # `attend`'s operands (`matmul`)

  def setup(self):
    self.embedding = self.param(
        'embedding', nn.with_logical_partitioning(self.embedding_init, ('vocab', 'embed')),
        (self.num_embeddings, self.features), self.param_dtype)

  def __call__(self, tokens: Array) -> Array:
    """[b, l] int -> [b, l, embed]."""
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f'Embed expects integer token ids, got dtype {tokens.dtype}.')
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, query: Array) -> Array:
    """[b, l, embed] -> [b, l, vocab] logits against the embedding table."""
    x = 'abcdefgh'[:query.ndim]
    return matmul(f'{x},z{x[-1]}->{x[:-1]}z', query, self.embedding, self.dtype, self.matmul_dtype)


def relative_position_bucket(relative_position: np.ndarray, *, bidirectional: bool,
                             num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
  """Maps relative positions (key_pos - query_pos) to bucket ids in [0, num_buckets) (T5 ref. code).

  Bidirectional: half the buckets for keys after the query, half for keys before. Within a direction,
  half of the buckets are exact offsets, the rest log-spaced up to `max_distance`; all farther offsets
  share the last bucket. Causal (`bidirectional=False`): positive offsets (the future) fall in bucket 0.

  Computed on the host with numpy in float32, in the same operation order as mesh-tensorflow and
  Hugging Face, so bucket boundaries agree exactly. Positions are static (lengths are known at trace time).
  """
  rp = np.asarray(relative_position, dtype=np.int64)
  ret = np.zeros_like(rp)
  n = num_buckets
  if bidirectional:
    n //= 2
    ret += (rp > 0).astype(np.int64) * n
    rp = np.abs(rp)
  else:
    rp = -np.minimum(rp, 0)
  max_exact = n // 2
  is_small = rp < max_exact
  with np.errstate(divide='ignore'):
    scaled = (np.log(rp.astype(np.float32) / np.float32(max_exact))
              / np.float32(math.log(max_distance / max_exact)) * np.float32(n - max_exact))
  # Cast only where used: log(0) = -inf on the small branch would overflow int conversion.
  large = max_exact + np.where(is_small, 0, scaled).astype(np.int64)
  large = np.minimum(large, n - 1)
  return (ret + np.where(is_small, rp, large)).astype(np.int32)


class RelativePositionBias(nn.Module):
  """Learned scalar bias per (bucket, head), added to attention logits. One per stack (T5).

  Parameter `rel_embedding`: [heads, relpos_buckets].
  """
  num_buckets: int
  max_distance: int
  num_heads: int
  bidirectional: bool
  embedding_init: Initializer = nn.initializers.normal(stddev=1.0)
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, query_length: int, key_length: int,
               query_offset: Array | None = None) -> Array:
    """Returns the bias [1, heads, query_length, key_length].

    Query i sits at position `query_offset + i` (0 + i when None), key j at position j.
    `query_offset` may be a traced scalar (incremental decoding) or a [b] vector of per-row offsets
    (decoder-only models, whose prompts differ in length; the bias is then [b, heads, q, k]);
    lengths must be static.
    """
    table = self.param(
        'rel_embedding', nn.with_logical_partitioning(self.embedding_init, ('heads', 'relpos_buckets')),
        (self.num_heads, self.num_buckets), self.param_dtype)
    bucket = lambda rp: relative_position_bucket(
        rp, bidirectional=self.bidirectional, num_buckets=self.num_buckets,
        max_distance=self.max_distance)
    if query_offset is None:
      rp = np.arange(key_length)[None, :] - np.arange(query_length)[:, None]
      buckets = jnp.asarray(bucket(rp))
    else:
      # Look up a static table over every offset the traced query position can produce.
      lo = -(key_length + query_length)
      lookup = jnp.asarray(bucket(np.arange(lo, key_length + 1)))
      q_pos = jnp.asarray(query_offset)[..., None] + jnp.arange(query_length)  # [q] or [b, q]
      rp = jnp.arange(key_length) - q_pos[..., None]
      buckets = jnp.take(lookup, jnp.clip(rp - lo, 0, lookup.shape[0] - 1))
    values = jnp.take(jnp.asarray(table, self.dtype), buckets, axis=1)  # [heads, (b,) q, k]
    if values.ndim == 4:  # per-row query offsets
      return jnp.transpose(values, (1, 0, 2, 3))
    return values[None]


class MultiHeadAttention(nn.Module):
  """Multi-head dot-product attention without logit scaling and without biases.

  Kernels: query/key/value [embed, heads, kv], out [heads, kv, embed]; heads * d_kv may differ from
  embed. `bias` carries the relative position bias and the mask (0 / NEG_INF), already combined.

  Incremental decoding (`decode=True`, flax `cache` collection):
  - self-attention: the first call (cache absent) creates key/value caches sized by its inputs,
    filled with their keys/values (prefill), and attends normally; later calls take one token
    [b, 1, embed], write its key/value at the cache index and attend over the whole cache (the
    caller's `bias` masks the unwritten slots). The index is a scalar, or a [b] vector when rows
    sit at different positions (decoder-only prefill).
  - cross-attention (`cross_cache=True`): keys/values of the encoder output are projected once, on
    the first call, and reused, stored as keys [b, heads, kv, k] and values [b, heads, k, kv]
    (`encoder_cache_entry`). The queries may come in [b * beams] rows, `beams` consecutive rows
    per cache row (beam search over `api.split_encoder_side`'s cache): they attend to that row.
  """
  num_heads: int
  d_kv: int
  dropout_rate: float = 0.0
  q_init: Initializer = nn.initializers.normal(stddev=1.0)
  kv_init: Initializer = nn.initializers.normal(stddev=1.0)
  out_init: Initializer = nn.initializers.normal(stddev=1.0)
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  matmul_dtype: DType | None = None   # operands of every matmul here (`matmul`)

  def _proj(self, name: str, init: Initializer) -> DenseGeneral:
    return DenseGeneral(features=(self.num_heads, self.d_kv), kernel_axes=('embed', 'heads', 'kv'),
                        kernel_init=init, dtype=self.dtype, param_dtype=self.param_dtype,
                        matmul_dtype=self.matmul_dtype, name=name)

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array | None, *,
               enable_dropout: bool = True, decode: bool = False, cross_cache: bool = False) -> Array:
    """inputs_q [b, q, embed], inputs_kv [b, k, embed], bias broadcastable to [b, heads, q, k].

    Returns [b, q, embed].
    """
    qkv_axes = ('batch', 'length', 'heads', 'kv')
    query = nn.with_logical_constraint(self._proj('query', self.q_init)(inputs_q), qkv_axes)

    length = query.shape[1]
    from_cache = False  # keys/values read from a self-attention cache
    if decode and cross_cache:
      if self.has_variable('cache', 'cached_key'):
        key = self.get_variable('cache', 'cached_key')
        value = self.get_variable('cache', 'cached_value')
      else:
        key = encoder_cache_entry('cached_key', self._proj('key', self.kv_init)(inputs_kv),
                                  self.matmul_dtype)
        value = encoder_cache_entry('cached_value', self._proj('value', self.kv_init)(inputs_kv),
                                    self.matmul_dtype)
        self.put_variable('cache', 'cached_key', key)
        self.put_variable('cache', 'cached_value', value)
      key = nn.with_logical_constraint(key, ('batch', 'heads', 'kv', 'length'))
      value = nn.with_logical_constraint(value, ('batch', 'heads', 'length', 'kv'))
      # `beams` consecutive query rows may share one cache row (beam search, api.split_encoder_side):
      # they become that row's query positions, [rows, heads, beams * q, kv].
      rows = key.shape[0]
      beams = query.shape[0] // rows
      query = jnp.swapaxes(query.reshape(rows, beams * length, *query.shape[2:]), 1, 2)
      if bias is not None and beams > 1 and jnp.shape(bias)[0] > 1:
        bias = jnp.asarray(bias)
        bias = bias.reshape(rows, beams, *bias.shape[1:]).transpose(0, 2, 1, 3, 4)
        bias = bias.reshape(rows, bias.shape[1], beams * length, bias.shape[-1])
      fused = None
      if self._fusable_operands(enable_dropout) is not None:
        fused = small_dots.cross_attention(query, key, value, bias)  # None: not on this machine
      if fused is not None:
        out = _cross_attention_rows(fused.astype(self.dtype), rows, beams, length)
        return self._output_projection(out, inputs_q)
      query = _query_rows_for_cpu_dot(query)
      logits_spec, out_spec = 'bhqd,bhdk->bhqk', 'bhqk,bhkd->bhqd'
    else:
      key = self._proj('key', self.kv_init)(inputs_kv)
      value = self._proj('value', self.kv_init)(inputs_kv)
      if decode:
        key, value, from_cache = self._update_self_cache(key, value)
      if from_cache:  # the whole cache, [b, heads, length, kv] (`_for_cache`)
        key = nn.with_logical_constraint(key, ('batch', 'heads', 'length', 'kv'))
        value = nn.with_logical_constraint(value, ('batch', 'heads', 'length', 'kv'))
        logits_spec, out_spec = 'bqhd,bhkd->bhqk', 'bhqk,bhkd->bqhd'
      else:
        key = nn.with_logical_constraint(key, qkv_axes)
        value = nn.with_logical_constraint(value, qkv_axes)
        logits_spec, out_spec = 'bqhd,bkhd->bhqk', 'bhqk,bkhd->bqhd'
        operands = self._fusable_operands(enable_dropout)
        if operands is not None:   # a kernel's attention where this CPU has one (else None)
          reference = functools.partial(plain_attention, dtype=self.dtype,
                                        matmul_dtype=self.matmul_dtype)
          fused = small_dots.attention(query, key, value, bias, dtype=self.dtype,
                                       reference=reference, operands=operands)
          if fused is not None:
            return self._output_projection(fused, inputs_q)
        elif self._dropout_kernel(enable_dropout) and train_attention.applies(query, key, value,
                                                                               bias):
          # Training: the softmax, this site's dropout and both products, forward and backward,
          # in one kernel each (t2t/models/train_attention.py); the same keep mask.
          keep, keep_prob = Dropout(rate=self.dropout_rate).keep_mask(
              (query.shape[0], query.shape[2], query.shape[1], key.shape[1]))
          fused = train_attention.dropout_attention(
              _rounded(query, self.matmul_dtype), _rounded(key, self.matmul_dtype),
              _rounded(value, self.matmul_dtype), bias, keep, keep_prob,
              bf16_products=self.matmul_dtype is not None)
          return self._output_projection(fused.astype(self.dtype), inputs_q)

    # A float32 cache of rounded values (`_for_cache` on a CPU): the same products, accumulated in
    # float32 like `matmul`'s, without converting the cache every step.
    rounded_f32 = from_cache and self.matmul_dtype is not None and key.dtype == jnp.float32
    if self.matmul_dtype is None or rounded_f32:
      logits = einsum2(logits_spec, _rounded(query, self.matmul_dtype), key,
                       preferred_element_type=jnp.float32)
    else:
      logits = matmul(logits_spec, query, key, jnp.float32, self.matmul_dtype)
    if bias is not None:
      logits = logits + jnp.asarray(bias, jnp.float32)
    weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    weights = _dropout(weights, self.dropout_rate, enable_dropout)
    if rounded_f32:
      out = einsum2(out_spec, _rounded(weights, self.matmul_dtype), value).astype(self.dtype)
    else:
      out = matmul(out_spec, weights, value, self.dtype, self.matmul_dtype)
    if decode and cross_cache:
      out = _cross_attention_rows(out[:, :, :beams * length], rows, beams, length)
    return self._output_projection(out, inputs_q)

  def _fusable_operands(self, enable_dropout: bool) -> DType | None:
    """The dtype of the attention's operands where `small_dots` may compute it in one call (no
    dropout after the softmax; bf16 matmuls, or float32 throughout), else None."""
    if enable_dropout and self.dropout_rate > 0:
      return None
    if self.matmul_dtype is not None:
      return jnp.bfloat16 if jnp.dtype(self.matmul_dtype) == jnp.bfloat16 else None
    return jnp.float32 if jnp.dtype(self.dtype) == jnp.float32 else None

  def _dropout_kernel(self, enable_dropout: bool) -> bool:
    """Whether this attention is the case `train_attention` has a kernel for (on a CPU with AVX2
    and FMA): dropout on its weights, float32 activations, and float32 or bf16 matmul operands
    (bf16 ones are rounded before the call, and multiplied by bf16 dot products where the CPU
    has AVX512_BF16, else in float32)."""
    return (enable_dropout and self.dropout_rate > 0 and jnp.dtype(self.dtype) == jnp.float32
            and (self.matmul_dtype is None or jnp.dtype(self.matmul_dtype) == jnp.bfloat16))

  def _output_projection(self, out: Array, inputs_q: Array) -> Array:
    """out [b, q, heads, kv] -> [b, q, embed] by the 'out' DenseGeneral."""
    out = nn.with_logical_constraint(out, ('batch', 'length', 'heads', 'kv'))
    out = DenseGeneral(features=inputs_q.shape[-1], axis=(-2, -1), kernel_axes=('heads', 'kv', 'embed'),
                       kernel_init=self.out_init, dtype=self.dtype, param_dtype=self.param_dtype,
                       matmul_dtype=self.matmul_dtype, name='out')(out)
    return nn.with_logical_constraint(out, ('batch', 'length', 'embed'))

  def _for_cache(self, x: Array) -> Array:
    """Self-attention keys/values x [b, length, heads, kv] as the cache stores them:
    [b, heads, length, kv], rounded to `matmul_dtype` (`_cache_dtype`).

    Heads before positions, so a decode step's two matmuls take the cache as a batched operand
    with its batch dimensions first, as stored, and the step writes one [b, heads, 1, kv] slice.
    On a CPU backend a rounded cache is kept in float32: XLA:CPU runs these one-row matmuls in
    float32 whatever their operands, and would otherwise convert (and, in the [b, length, heads,
    kv] layout, transpose) every layer's whole cache every step (benchmarks/EXPERIMENTS.md, "Greedy
    decoding"); the values, and so the results, are those of the rounded cache.
    """
    x = _cache_dtype(jnp.swapaxes(x, 1, 2), self.matmul_dtype)
    if self.matmul_dtype is not None and jax.default_backend() == 'cpu':
      x = x.astype(jnp.float32)
    return x

  def _update_self_cache(self, key: Array, value: Array) -> tuple[Array, Array, bool]:
    """Creates the cache on the first call; afterwards writes one step and returns the full cache.

    key, value [b, 1, heads, kv]. Returns (keys, values, whether they are the cache, laid out
    [b, heads, length, kv]); the first call returns its own keys/values [b, length, heads, kv].
    """
    ready = self.has_variable('cache', 'cached_key')
    # The first call's keys/values fill the cache: a prompt processed in one call (prefill) is then
    # cached; slots the caller has not marked as written are masked by its `bias` anyway.
    cached_key = self.variable('cache', 'cached_key', lambda: self._for_cache(key))
    cached_value = self.variable('cache', 'cached_value', lambda: self._for_cache(value))
    index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
    if not ready:
      return key, value, False
    if key.shape[1] != 1:
      raise ValueError(f'Incremental decoding takes one token per call, got length {key.shape[1]}.')
    key, value = self._for_cache(key), self._for_cache(value)
    if index.value.ndim == 1:
      # Per-row positions [b] (decoder-only prompts of different lengths): write by one-hot select.
      hit = (jnp.arange(cached_key.value.shape[2])[None, :] == index.value[:, None])[:, None, :, None]
      cached_key.value = jnp.where(hit, key, cached_key.value)
      cached_value.value = jnp.where(hit, value, cached_value.value)
      index.value = index.value + 1
      return cached_key.value, cached_value.value, True
    start = (0, 0, index.value, 0)
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, key, start)
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, value, start)
    index.value = index.value + 1
    return cached_key.value, cached_value.value, True


def plain_attention(query: Array, key: Array, value: Array, bias: Array | None, *, dtype: DType,
                    matmul_dtype: DType | None) -> Array:
  """softmax(query key + bias) value, no dropout, as `MultiHeadAttention` computes it unfused.

  query [b, q, h, d], key and value [b, k, h, d], bias broadcastable to [b, h, q, k] or None ->
  [b, q, h, d] in `dtype`: logits in float32 from `matmul_dtype` operands, the softmax in float32,
  the weights cast to `dtype` and rounded to `matmul_dtype` for the second product. The
  reference `small_dots.attention` differentiates.
  """
  logits = matmul('bqhd,bkhd->bhqk', query, key, jnp.float32, matmul_dtype)
  if bias is not None:
    logits = logits + jnp.asarray(bias, jnp.float32)
  weights = jax.nn.softmax(logits, axis=-1).astype(dtype)
  return matmul('bhqk,bkhd->bqhd', weights, value, dtype, matmul_dtype)


def _cache_dtype(x: Array, matmul_dtype: DType | None) -> Array:
  """Keys/values as a cache stores them: in `matmul_dtype` when set, else unchanged.

  Every read of the cache feeds a matmul that rounds its operands to `matmul_dtype` anyway, so
  storing them rounded gives the same results while each decode step reads half the bytes (for
  bfloat16) and converts nothing: at T5-small's 512 encoder positions, the encoder-decoder
  keys/values are the largest thing a greedy step reads besides the weights.
  """
  return x if matmul_dtype is None else x.astype(matmul_dtype)


def _rounded(x: Array, matmul_dtype: DType | None) -> Array:
  """x rounded to `matmul_dtype` and back to float32 (unchanged when None)."""
  return x if matmul_dtype is None else x.astype(matmul_dtype).astype(jnp.float32)


def encoder_cache_entry(name: str, projected: Array, matmul_dtype: DType | None) -> Array:
  """An encoder-decoder attention cache entry from the encoder output projected by the layer.

  `projected` [b, k, heads, kv] (the `key` or `value` DenseGeneral's output). 'cached_key' is
  stored [b, heads, kv, k] and 'cached_value' [b, heads, k, kv]: each decode step's two matmuls
  then read them as the row-major right-hand operand of a batched matmul (contracted dimension
  first), the layout XLA:CPU hands to YNNPACK without a transpose (`_query_rows_for_cpu_dot`).
  """
  if name == 'cached_key':
    return _cache_dtype(jnp.transpose(projected, (0, 2, 3, 1)), matmul_dtype)
  if name == 'cached_value':
    return _cache_dtype(jnp.transpose(projected, (0, 2, 1, 3)), matmul_dtype)
  raise ValueError(f"An encoder-decoder attention cache holds 'cached_key' and 'cached_value', "
                   f"not {name!r}.")


def _cross_attention_rows(out: Array, rows: int, beams: int, length: int) -> Array:
  """The encoder-decoder attention's [rows, heads, beams * q, kv] back to [rows * beams, q, heads, kv]."""
  out = jnp.swapaxes(out, 1, 2)
  return out.reshape(rows * beams, length, *out.shape[2:])


def _query_rows_for_cpu_dot(query: Array) -> Array:
  """query [b, heads, q, kv] as the encoder-decoder attention's matmuls take it: a single query
  row (q = 1: a greedy decode step; beam search has one row per beam) duplicated to
  [b, heads, 2, kv]; the caller drops the copy.

  With one row, both matmuls over the cache are batched matrix-vector products, and XLA:CPU runs
  a dot with a one-row operand in its own kernels, converting bf16 operands to float32 first
  (for T5-small: 96 MB of converted keys/values read per token). With two rows XLA:CPU hands
  the dots to YNNPACK's bf16 kernels, which read the cache as stored (`encoder_cache_entry`'s
  layouts); the extra row costs nothing measurable there (on accelerators it is one more row of
  a small matmul; not measured).
  """
  return jnp.concatenate([query, query], axis=2) if query.shape[2] == 1 else query


class MlpBlock(nn.Module):
  """Position-wise feed-forward: wo(dropout(act(wi x))) or, gated, wo(dropout(act(wi_0 x) * wi_1 x)).

  `activations=('relu',)` is T5 v1.0; `('gelu', 'linear')` is T5 v1.1's gated-GELU (tanh approximation,
  as in the reference code and Hugging Face's `gelu_new`). [b, l, embed] -> [b, l, embed].
  """
  d_ff: int
  activations: tuple[str, ...] = ('relu',)
  dropout_rate: float = 0.0
  wi_init: Initializer = nn.initializers.normal(stddev=1.0)
  wo_init: Initializer = nn.initializers.normal(stddev=1.0)
  dtype: DType = jnp.float32
  param_dtype: DType = jnp.float32
  matmul_dtype: DType | None = None   # operands of wi / wo (`matmul`)

  @nn.compact
  def __call__(self, x: Array, *, enable_dropout: bool = True) -> Array:
    acts = {'relu': jax.nn.relu, 'gelu': lambda h: jax.nn.gelu(h, approximate=True),
            'linear': lambda h: h}
    h = None
    for i, act in enumerate(self.activations):
      if act not in acts:
        raise ValueError(f'MlpBlock: unknown activation {act!r}; expected one of {sorted(acts)}.')
      name = 'wi' if len(self.activations) == 1 else f'wi_{i}'
      y = DenseGeneral(self.d_ff, kernel_axes=('embed', 'mlp'), kernel_init=self.wi_init,
                       dtype=self.dtype, param_dtype=self.param_dtype,
                       matmul_dtype=self.matmul_dtype, name=name)(x)
      y = acts[act](y)
      h = y if h is None else h * y
    h = nn.with_logical_constraint(h, ('batch', 'length', 'mlp'))
    h = _dropout(h, self.dropout_rate, enable_dropout)
    out = DenseGeneral(x.shape[-1], kernel_axes=('mlp', 'embed'), kernel_init=self.wo_init,
                       dtype=self.dtype, param_dtype=self.param_dtype,
                       matmul_dtype=self.matmul_dtype, name='wo')(h)
    return nn.with_logical_constraint(out, ('batch', 'length', 'embed'))


def make_attention_mask(query_valid: Array, key_valid: Array, query_segment_ids: Array | None = None,
                        key_segment_ids: Array | None = None, causal: bool = False) -> Array:
  """Boolean attention mask [b, 1, q, k]: True where query i may attend to key j.

  query_valid [b, q] / key_valid [b, k] mark real (non-padding) positions. With segment ids (packed
  examples) a query only sees keys of its own segment. `causal` adds j <= i (same-length self-attention).
  """
  mask = query_valid[:, :, None] & key_valid[:, None, :]
  if query_segment_ids is not None and key_segment_ids is not None:
    mask &= query_segment_ids[:, :, None] == key_segment_ids[:, None, :]
  if causal:
    q, k = query_valid.shape[1], key_valid.shape[1]
    mask &= jnp.asarray(np.tril(np.ones((q, k), dtype=bool)))[None]
  return mask[:, None]


def mask_to_bias(mask: Array) -> Array:
  """Boolean mask -> additive float32 bias (0 where allowed, NEG_INF where masked)."""
  return jnp.where(mask, 0.0, NEG_INF).astype(jnp.float32)


def add_mask_bias(position_bias: Array, mask: Array) -> Array:
  """position_bias [1, heads, q, k] + mask_to_bias(mask [b, 1, q, k]) -> the logits' bias [b, heads, q, k].

  The same sum as `+`, differentiated so that the position bias's gradient (the sum of the
  logits' gradients over the batch, for every layer's attention) is a product with a vector of
  ones: XLA:CPU reduces a [8, 8, 512, 512] float32 array over its leading axis in ~157 ms, and
  the same sum as a dot in ~3 ms (2-core Zen 3, jitted alone; benchmarks/EXPERIMENTS.md).
  """
  mask_bias = mask_to_bias(mask)
  if jnp.ndim(position_bias) != 4 or mask_bias.ndim != 4 or jnp.shape(position_bias)[0] != 1:
    return position_bias + mask_bias     # per-row positions (decoding): nothing to sum
  return _add_batch_bias(position_bias, mask_bias)


@jax.custom_vjp
def _add_batch_bias(position_bias: Array, mask_bias: Array) -> Array:
  return position_bias + mask_bias


def _add_batch_bias_fwd(position_bias, mask_bias):
  # Zero-size arrays carry the operands' shapes and dtypes to the backward (residuals are arrays).
  return position_bias + mask_bias, (position_bias[:0], mask_bias[:0])


def _add_batch_bias_bwd(residuals, ct):
  position_like, mask_like = residuals   # [0, heads, q, k] and [0, 1 or heads, q, k]
  d_position = ct
  if ct.shape[0] > 1:   # the sum over the batch as ones [1, b] x ct [b, heads * q * k]
    d_position = jax.lax.dot_general(jnp.ones((1, ct.shape[0]), ct.dtype),
                                     ct.reshape(ct.shape[0], -1), (((1,), (0,)), ((), ())),
                                     precision=jax.lax.Precision.HIGHEST)
  d_position = _sum_to(d_position.reshape((1,) + ct.shape[1:]), (1, *position_like.shape[1:]))
  d_mask = _sum_to(ct, (ct.shape[0], *mask_like.shape[1:]))
  return d_position.astype(position_like.dtype), d_mask.astype(mask_like.dtype)


def _sum_to(x: Array, shape: tuple[int, ...]) -> Array:
  """x summed over the axes where `shape` has 1 (keeping them), to `shape`."""
  axes = tuple(i for i, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


_add_batch_bias.defvjp(_add_batch_bias_fwd, _add_batch_bias_bwd)
