"""The T5 encoder-decoder Transformer (Flax linen), following the T5 paper and reference code.

Read top to bottom: `T5Config`, then the layers, the two stacks, and `Transformer` with its
`encode` / `decode` / `__call__` methods. Shapes: b = batch, l_enc / l_dec = encoder / decoder length,
d = d_model, h = num_heads, v = vocab_size.

T5 specifics (PAPERS.md section 1): pre-norm residual blocks with an RMS-style norm and a final norm per
stack; no biases; unscaled attention logits; one relative position bias table per stack, shared by all
its layers (bidirectional in the encoder, causal in the decoder, none on cross-attention); dropout on
the stack input/output, residual branches, attention weights and the FFN; tied input/output embeddings
with the decoder output scaled by d ** -0.5 (or an untied `logits_dense`, T5 v1.1).

The parameter tree is (encoder shown; the decoder has `pre_self_attention_layer_norm`, `self_attention`,
`pre_cross_attention_layer_norm`, `encoder_decoder_attention`, `pre_mlp_layer_norm`, `mlp`, `decoder_norm`
and, when untied, `logits_dense`):

  token_embedder/embedding                      [v, d]
  encoder/relpos_bias/rel_embedding             [h, buckets]
  encoder/layers_{i}/pre_attention_layer_norm/scale                  [d]
  encoder/layers_{i}/attention/{query,key,value}/kernel              [d, h, d_kv]
  encoder/layers_{i}/attention/out/kernel                            [h, d_kv, d]
  encoder/layers_{i}/pre_mlp_layer_norm/scale                        [d]
  encoder/layers_{i}/mlp/{wi | wi_0, wi_1}/kernel, mlp/wo/kernel     [d, d_ff], [d_ff, d]
  encoder/encoder_norm/scale                                         [d]
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import layers

Array = jax.Array

_FEED_FORWARD = {'relu': ('relu',), 'gated-gelu': ('gelu', 'linear')}


@gin.configurable
@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyper-parameters of a T5 encoder-decoder. Defaults are T5 v1.0 Small (PAPERS.md table)."""
  vocab_size: int                         # embedding rows, incl. sentinels and padding (e.g. 32128)
  d_model: int = 512                      # width of the residual stream
  num_heads: int = 8                      # attention heads
  d_kv: int = 64                          # per-head key/value width (heads * d_kv may differ from d_model)
  d_ff: int = 2048                        # hidden width of the feed-forward block
  num_encoder_layers: int = 6             # encoder blocks
  num_decoder_layers: int = 6             # decoder blocks
  dropout_rate: float = 0.1               # everywhere dropout is applied (0.0 for T5 v1.1 pre-training)
  relative_attention_num_buckets: int = 32  # relative position buckets per stack
  relative_attention_max_distance: int = 128  # offsets at or beyond this share the last bucket
  layer_norm_epsilon: float = 1e-6        # added to the mean square in RMSNorm
  feed_forward_proj: str = 'relu'         # 'relu' (T5 v1.0) or 'gated-gelu' (T5 v1.1)
  tie_word_embeddings: bool = True        # share input embedding and output projection (v1.0)
  dtype: Any = jnp.float32                # activation / computation dtype (e.g. 'bfloat16')
  param_dtype: Any = jnp.float32          # parameter storage dtype

  def __post_init__(self):
    for name in ('vocab_size', 'd_model', 'num_heads', 'd_kv', 'd_ff', 'relative_attention_num_buckets',
                 'relative_attention_max_distance'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'T5Config.{name} must be a positive integer, got {value!r}.')
    for name in ('num_encoder_layers', 'num_decoder_layers'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f'T5Config.{name} must be a non-negative integer, got {value!r}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}.')
    if self.feed_forward_proj not in _FEED_FORWARD:
      raise ValueError(f'T5Config.feed_forward_proj must be one of {sorted(_FEED_FORWARD)}, '
                       f'got {self.feed_forward_proj!r}.')
    # Accept dtype names from gin ('bfloat16') and store canonical numpy dtypes (hashable, comparable).
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', jnp.dtype(self.param_dtype))

  @property
  def mlp_activations(self) -> tuple[str, ...]:
    return _FEED_FORWARD[self.feed_forward_proj]


def _normal(stddev: float) -> layers.Initializer:
  return nn.initializers.normal(stddev=stddev)


def _norm(c: T5Config, name: str) -> layers.RMSNorm:
  return layers.RMSNorm(epsilon=c.layer_norm_epsilon, dtype=c.dtype, param_dtype=c.param_dtype,
                        name=name)


def _attention(c: T5Config, name: str) -> layers.MultiHeadAttention:
  # Mesh-TF initialisation: the 1/sqrt(d_kv) logit scaling is folded into the query initialiser.
  return layers.MultiHeadAttention(
      num_heads=c.num_heads, d_kv=c.d_kv, dropout_rate=c.dropout_rate,
      q_init=_normal((c.d_model * c.d_kv) ** -0.5), kv_init=_normal(c.d_model ** -0.5),
      out_init=_normal((c.num_heads * c.d_kv) ** -0.5), dtype=c.dtype, param_dtype=c.param_dtype,
      name=name)


def _mlp(c: T5Config) -> layers.MlpBlock:
  return layers.MlpBlock(d_ff=c.d_ff, activations=c.mlp_activations, dropout_rate=c.dropout_rate,
                         wi_init=_normal(c.d_model ** -0.5), wo_init=_normal(c.d_ff ** -0.5),
                         dtype=c.dtype, param_dtype=c.param_dtype, name='mlp')


def _relpos(c: T5Config, bidirectional: bool) -> layers.RelativePositionBias:
  return layers.RelativePositionBias(
      num_buckets=c.relative_attention_num_buckets, max_distance=c.relative_attention_max_distance,
      num_heads=c.num_heads, bidirectional=bidirectional, embedding_init=_normal(c.d_model ** -0.5),
      dtype=c.dtype, param_dtype=c.param_dtype, name='relpos_bias')


def _constrain(x: Array) -> Array:
  return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class EncoderLayer(nn.Module):
  """Self-attention then FFN, each pre-normed with a residual. [b, l_enc, d] -> [b, l_enc, d]."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, bias: Array, enable_dropout: bool = True) -> Array:
    c = self.config
    drop = lambda y: nn.Dropout(c.dropout_rate)(y, deterministic=not enable_dropout)
    h = _norm(c, 'pre_attention_layer_norm')(x)
    x = x + drop(_attention(c, 'attention')(h, h, bias, enable_dropout=enable_dropout))
    h = _norm(c, 'pre_mlp_layer_norm')(_constrain(x))
    x = x + drop(_mlp(c)(h, enable_dropout=enable_dropout))
    return _constrain(x)


class DecoderLayer(nn.Module):
  """Causal self-attention, encoder-decoder attention, FFN; pre-norm residuals. [b, l_dec, d]."""
  config: T5Config

  @nn.compact
  def __call__(self, x: Array, encoded: Array, self_bias: Array, cross_bias: Array,
               enable_dropout: bool = True, decode: bool = False) -> Array:
    c = self.config
    drop = lambda y: nn.Dropout(c.dropout_rate)(y, deterministic=not enable_dropout)
    h = _norm(c, 'pre_self_attention_layer_norm')(x)
    x = x + drop(_attention(c, 'self_attention')(h, h, self_bias, enable_dropout=enable_dropout,
                                                 decode=decode))
    h = _norm(c, 'pre_cross_attention_layer_norm')(_constrain(x))
    x = x + drop(_attention(c, 'encoder_decoder_attention')(
        h, encoded, cross_bias, enable_dropout=enable_dropout, decode=decode, cross_cache=True))
    h = _norm(c, 'pre_mlp_layer_norm')(_constrain(x))
    x = x + drop(_mlp(c)(h, enable_dropout=enable_dropout))
    return _constrain(x)


def _valid(tokens: Array, segment_ids: Array | None) -> Array:
  """Non-padding positions [b, l]: from segment ids when given (0 = padding), else tokens > 0."""
  return segment_ids > 0 if segment_ids is not None else tokens > 0


class Encoder(nn.Module):
  """Embedding -> dropout -> N EncoderLayers -> RMSNorm -> dropout. [b, l_enc] -> [b, l_enc, d]."""
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, tokens: Array, segment_ids: Array | None = None,
               enable_dropout: bool = True) -> Array:
    c = self.config
    drop = lambda y: nn.Dropout(c.dropout_rate)(y, deterministic=not enable_dropout)
    x = _constrain(drop(self.shared_embedding(tokens)))
    valid = _valid(tokens, segment_ids)
    length = tokens.shape[1]
    # Positions inside each packed segment differ from the row positions by a constant, so relative
    # offsets between tokens of one segment are the row offsets: no per-segment positions needed.
    bias = _relpos(c, bidirectional=True)(length, length) + layers.mask_to_bias(
        layers.make_attention_mask(valid, valid, segment_ids, segment_ids))
    for i in range(c.num_encoder_layers):
      x = EncoderLayer(c, name=f'layers_{i}')(x, bias, enable_dropout)
    return _constrain(drop(_norm(c, 'encoder_norm')(x)))


class Decoder(nn.Module):
  """Embedding -> N DecoderLayers -> RMSNorm -> logits. [b, l_dec] tokens -> [b, l_dec, v] logits."""
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self, encoded: Array, encoder_valid: Array, tokens: Array,
               encoder_segment_ids: Array | None = None, decoder_segment_ids: Array | None = None,
               enable_dropout: bool = True, decode: bool = False) -> Array:
    c = self.config
    drop = lambda y: nn.Dropout(c.dropout_rate)(y, deterministic=not enable_dropout)
    relpos = _relpos(c, bidirectional=False)
    length = tokens.shape[1]
    stepping = decode and self.has_variable('cache', 'cache_index')
    if stepping:
      # One new token at position `index`; keys are the cache slots written so far (0..index).
      # Every cache leaf except the scalar indices has a leading batch axis (beam search relies on it).
      index = self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
      cache_length = self.variables['cache']['layers_0']['self_attention']['cached_key'].shape[1]
      slots = jnp.arange(cache_length)
      self_bias = relpos(length, cache_length, query_offset=index.value) + layers.mask_to_bias(
          (slots <= index.value)[None, None, None, :])
      index.value = index.value + 1
      # The encoder side (keys/values and validity) comes from the cache, so a decoding strategy may
      # expand or reorder the cache's batch (beams) without touching `encoded`.
      cross_mask = layers.make_attention_mask(jnp.ones(tokens.shape, bool),
                                              self.get_variable('cache', 'encoder_valid'))
    else:
      if decode:  # first call in decode mode: the layers size their caches to this length.
        if c.num_decoder_layers < 1:
          raise ValueError('Incremental decoding needs at least one decoder layer.')
        self.variable('cache', 'cache_index', lambda: jnp.array(0, jnp.int32))
        self.variable('cache', 'encoder_valid', lambda: encoder_valid)
      # Queries are all "valid": the start token is id 0 (= pad), so tokens > 0 cannot mark validity;
      # the causal mask already keeps real positions from seeing padding that follows them.
      dec_valid = (decoder_segment_ids > 0 if decoder_segment_ids is not None
                   else jnp.ones(tokens.shape, bool))
      self_bias = relpos(length, length) + layers.mask_to_bias(layers.make_attention_mask(
          dec_valid, dec_valid, decoder_segment_ids, decoder_segment_ids, causal=True))
      cross_mask = layers.make_attention_mask(dec_valid, encoder_valid, decoder_segment_ids,
                                              encoder_segment_ids)
    cross_bias = layers.mask_to_bias(cross_mask)

    x = _constrain(drop(self.shared_embedding(tokens)))
    for i in range(c.num_decoder_layers):
      x = DecoderLayer(c, name=f'layers_{i}')(x, encoded, self_bias, cross_bias, enable_dropout,
                                              decode)
    x = _constrain(drop(_norm(c, 'decoder_norm')(x)))
    if c.tie_word_embeddings:
      logits = self.shared_embedding.attend(x * (c.d_model ** -0.5))
    else:
      logits = layers.DenseGeneral(c.vocab_size, kernel_axes=('embed', 'vocab'),
                                   kernel_init=_normal(c.d_model ** -0.5), dtype=c.dtype,
                                   param_dtype=c.param_dtype, name='logits_dense')(x)
    return nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))


def _check_tokens(name: str, tokens: Array) -> None:
  if tokens.ndim != 2:
    raise ValueError(f'{name} must be [batch, length] token ids, got shape {tokens.shape}.')
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f'{name} must be integer token ids, got dtype {tokens.dtype}.')


@gin.configurable
class Transformer(nn.Module):
  """T5 encoder-decoder. Dropout needs the `'dropout'` rng; `decode=True` uses the `'cache'` collection."""
  config: T5Config

  def setup(self):
    c = self.config
    self.token_embedder = layers.Embed(num_embeddings=c.vocab_size, features=c.d_model,
                                       embedding_init=_normal(1.0), dtype=c.dtype,
                                       param_dtype=c.param_dtype)
    self.encoder = Encoder(c, shared_embedding=self.token_embedder)
    self.decoder = Decoder(c, shared_embedding=self.token_embedder)

  def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Array | None = None,
             enable_dropout: bool = True) -> Array:
    """[b, l_enc] token ids -> [b, l_enc, d] encoder output."""
    _check_tokens('encoder_input_tokens', encoder_input_tokens)
    return self.encoder(encoder_input_tokens, encoder_segment_ids, enable_dropout)

  def decode(self, encoded: Array, encoder_input_tokens: Array, decoder_input_tokens: Array,
             encoder_segment_ids: Array | None = None, decoder_segment_ids: Array | None = None,
             decoder_positions: Array | None = None, enable_dropout: bool = True,
             decode: bool = False) -> Array:
    """Decoder logits [b, l_dec, v] given the encoder output [b, l_enc, d].

    `encoder_input_tokens` (or `encoder_segment_ids`) marks which encoder positions are real.
    `decoder_positions` is accepted for the feature-converter interface; relative attention only needs
    offsets within a segment, which equal row offsets. With `decode=True` the first call sizes the
    KV cache to `decoder_input_tokens.shape[1]` and stores the encoder keys/values and mask in it;
    later calls take one token [b', 1] each and read the encoder side from the cache only (b' may
    differ from b when a decoding strategy has expanded the cache, e.g. per beam).
    """
    del decoder_positions
    _check_tokens('decoder_input_tokens', decoder_input_tokens)
    if encoded.shape[:2] != encoder_input_tokens.shape:
      raise ValueError(f'encoded {encoded.shape[:2]} and encoder_input_tokens '
                       f'{encoder_input_tokens.shape} disagree on [batch, length].')
    encoder_valid = _valid(encoder_input_tokens, encoder_segment_ids)
    return self.decoder(encoded, encoder_valid, decoder_input_tokens, encoder_segment_ids,
                        decoder_segment_ids, enable_dropout, decode)

  def __call__(self, encoder_input_tokens: Array, decoder_input_tokens: Array,
               encoder_segment_ids: Array | None = None, decoder_segment_ids: Array | None = None,
               encoder_positions: Array | None = None, decoder_positions: Array | None = None,
               enable_dropout: bool = True) -> Array:
    """Teacher-forced forward pass: [b, l_enc], [b, l_dec] token ids -> logits [b, l_dec, v]."""
    del encoder_positions
    if (encoder_segment_ids is None) != (decoder_segment_ids is None):
      raise ValueError('Packed batches need both encoder_segment_ids and decoder_segment_ids '
                       '(or neither).')
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout)
    return self.decode(encoded, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids,
                       decoder_segment_ids, decoder_positions, enable_dropout)

