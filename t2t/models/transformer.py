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

Variants (T5Config flags): `shared_encoder_decoder` drops the decoder layers' self-attention, FFN and
their norms (they reuse encoder/layers_{i}'s); `scan_layers` replaces layers_{i} by one `layers`
subtree whose leaves have a leading [num_layers] axis named 'layers'; `remat_policy` changes no
parameter. Fine-tuning options add parameters only when on (t2t/models/peft.py): `adapter_dim`
adds `{encoder,decoder}/layers_{i}/adapter/{wi,wo}/kernel`, `num_prompt_tokens` adds
`prompt/embedding` [n, d]. The default tree is the one above (Hugging Face conversion and
checkpoints rely on it).
The decoder-only models (LM, prefix LM) live in decoder_only.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import decoder_step
from t2t.models import layers
from t2t.models import peft

Array = jax.Array

_FEED_FORWARD = {'relu': ('relu',), 'gated-gelu': ('gelu', 'linear')}


_REMAT_POLICIES = ('none', 'full', 'dots_saveable')


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
  num_decoder_layers: int = 6             # decoder blocks (the only stack of a decoder-only model)
  dropout_rate: float = 0.1               # everywhere dropout is applied (0.0 for T5 v1.1 pre-training)
  relative_attention_num_buckets: int = 32  # relative position buckets per stack
  relative_attention_max_distance: int = 128  # offsets at or beyond this share the last bucket
  layer_norm_epsilon: float = 1e-6        # added to the mean square in RMSNorm
  feed_forward_proj: str = 'relu'         # 'relu' (T5 v1.0) or 'gated-gelu' (T5 v1.1)
  tie_word_embeddings: bool = True        # share input embedding and output projection (v1.0)
  dtype: Any = jnp.float32                # activation / computation dtype (e.g. 'bfloat16')
  param_dtype: Any = jnp.float32          # parameter storage dtype
  # Operand dtype of every matmul (None: `dtype`). 'bfloat16' rounds the operands to bf16 and
  # accumulates and returns in `dtype` (mixed precision as on a TPU's MXU; on a CPU with
  # AVX512_BF16, XLA's faster dot kernels). Not bit-compatible with an fp32 run.
  matmul_dtype: Any = None
  # Table 2's "encoder-decoder, shared" (P params, cost M): decoder layer i reuses encoder layer i's
  # self-attention, FFN and their layer norms. Encoder-decoder attention (and its norm) has no
  # encoder counterpart and keeps its own weights, as do the two relative position tables (their
  # buckets mean different things: bidirectional vs causal) and the final norms. The paper's P counts
  # one stack; cross-attention adds ~1/3 of a decoder stack on top (T5 §3.2.2 ignores it too).
  shared_encoder_decoder: bool = False
  # Rematerialisation of each layer in the backward pass: 'none' keeps every activation; 'full'
  # recomputes the whole layer; 'dots_saveable' keeps matmul outputs and recomputes the rest.
  remat_policy: str = 'none'
  # `nn.scan` over the layers of each stack: one traced layer instead of N (faster compiles for deep
  # models). Parameters then live under `{encoder,decoder}/layers` with a leading axis named 'layers'
  # (see `stack_layer_params` / `unstack_layer_params`). Decoding uses the unscanned form.
  scan_layers: bool = False
  # Fine-tuning additions (t2t/models/peft.py; 0 = off, the parameter tree is then unchanged).
  # Adapter layers (T5 §3.5.2, Table 10): a dense-ReLU-dense block of this inner width, with a
  # residual, after every FFN; parameters `layers_{i}/adapter/{wi,wo}/kernel`.
  adapter_dim: int = 0
  # Prompt tuning: this many learned vectors (`prompt/embedding` [n, d]) prepended to the embedded
  # encoder input; the encoder output then has l_enc + n positions. Unpacked batches only.
  num_prompt_tokens: int = 0

  def __post_init__(self):
    for name in ('vocab_size', 'd_model', 'num_heads', 'd_kv', 'd_ff', 'relative_attention_num_buckets',
                 'relative_attention_max_distance'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'T5Config.{name} must be a positive integer, got {value!r}.')
    for name in ('num_encoder_layers', 'num_decoder_layers', 'adapter_dim', 'num_prompt_tokens'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f'T5Config.{name} must be a non-negative integer, got {value!r}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}.')
    if self.feed_forward_proj not in _FEED_FORWARD:
      raise ValueError(f'T5Config.feed_forward_proj must be one of {sorted(_FEED_FORWARD)}, '
                       f'got {self.feed_forward_proj!r}.')
    if self.remat_policy not in _REMAT_POLICIES:
      raise ValueError(f'T5Config.remat_policy must be one of {_REMAT_POLICIES}, '
                       f'got {self.remat_policy!r}.')
    if self.shared_encoder_decoder:
      if self.num_encoder_layers != self.num_decoder_layers:
        raise ValueError('T5Config.shared_encoder_decoder needs num_encoder_layers == '
                         f'num_decoder_layers, got {self.num_encoder_layers} and '
                         f'{self.num_decoder_layers}.')
      if self.scan_layers:
        raise ValueError('T5Config.shared_encoder_decoder cannot be combined with scan_layers; '
                         'set one of them to False.')
    # Accept dtype names from gin ('bfloat16') and store canonical numpy dtypes (hashable, comparable).
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', jnp.dtype(self.param_dtype))
    if self.matmul_dtype is not None:
      object.__setattr__(self, 'matmul_dtype', jnp.dtype(self.matmul_dtype))

  @property
  def mlp_activations(self) -> tuple[str, ...]:
    return _FEED_FORWARD[self.feed_forward_proj]


def _normal(stddev: float) -> layers.Initializer:
  return nn.initializers.normal(stddev=stddev)


def _norm(c: T5Config, name: str | None = None) -> layers.RMSNorm:
  return layers.RMSNorm(epsilon=c.layer_norm_epsilon, dtype=c.dtype, param_dtype=c.param_dtype,
                        name=name)


def _attention(c: T5Config, name: str | None = None) -> layers.MultiHeadAttention:
  # Mesh-TF initialisation: the 1/sqrt(d_kv) logit scaling is folded into the query initialiser.
  return layers.MultiHeadAttention(
      num_heads=c.num_heads, d_kv=c.d_kv, dropout_rate=c.dropout_rate,
      q_init=_normal((c.d_model * c.d_kv) ** -0.5), kv_init=_normal(c.d_model ** -0.5),
      out_init=_normal((c.num_heads * c.d_kv) ** -0.5), dtype=c.dtype, param_dtype=c.param_dtype,
      matmul_dtype=c.matmul_dtype, name=name)


def _mlp(c: T5Config, name: str | None = None) -> layers.MlpBlock:
  return layers.MlpBlock(d_ff=c.d_ff, activations=c.mlp_activations, dropout_rate=c.dropout_rate,
                         wi_init=_normal(c.d_model ** -0.5), wo_init=_normal(c.d_ff ** -0.5),
                         dtype=c.dtype, param_dtype=c.param_dtype, matmul_dtype=c.matmul_dtype,
                         name=name)


def _relpos(c: T5Config, bidirectional: bool, name: str | None = None) -> layers.RelativePositionBias:
  return layers.RelativePositionBias(
      num_buckets=c.relative_attention_num_buckets, max_distance=c.relative_attention_max_distance,
      num_heads=c.num_heads, bidirectional=bidirectional, embedding_init=_normal(c.d_model ** -0.5),
      dtype=c.dtype, param_dtype=c.param_dtype, name=name)


def _adapter(c: T5Config) -> peft.Adapter | None:
  if not c.adapter_dim:
    return None
  return peft.Adapter(c.adapter_dim, dtype=c.dtype, param_dtype=c.param_dtype)


def _constrain(x: Array) -> Array:
  return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class EncoderLayer(nn.Module):
  """Self-attention then FFN, each pre-normed with a residual. [b, l_enc, d] -> [b, l_enc, d].

  Defined with `setup` so that a decoder layer can reuse its sub-modules (shared encoder-decoder).
  """
  config: T5Config

  def setup(self):
    c = self.config
    self.pre_attention_layer_norm = _norm(c)
    self.attention = _attention(c)
    self.pre_mlp_layer_norm = _norm(c)
    self.mlp = _mlp(c)
    self.adapter = _adapter(c)
    self.dropout = layers.Dropout(c.dropout_rate)

  def __call__(self, x: Array, bias: Array, enable_dropout: bool = True) -> Array:
    drop = lambda y: self.dropout(y, deterministic=not enable_dropout)
    h = self.pre_attention_layer_norm(x)
    x = x + drop(self.attention(h, h, bias, enable_dropout=enable_dropout))
    h = self.mlp(self.pre_mlp_layer_norm(_constrain(x)), enable_dropout=enable_dropout)
    if self.adapter is not None:
      h = self.adapter(h)
    x = x + drop(h)
    return _constrain(x)


class DecoderLayer(nn.Module):
  """Causal self-attention, encoder-decoder attention, FFN; pre-norm residuals. [b, l_dec, d].

  With `shared` (an EncoderLayer), self-attention, FFN and their norms are that layer's; only the
  encoder-decoder attention and its norm belong to this layer. With `cross_attention=False` (the
  decoder-only models) there is no encoder-decoder attention.
  """
  config: T5Config
  shared: EncoderLayer | None = None
  cross_attention: bool = True

  def setup(self):
    c = self.config
    if self.shared is None:
      self.pre_self_attention_layer_norm = _norm(c)
      self.self_attention = _attention(c)
      self.pre_mlp_layer_norm = _norm(c)
      self.mlp = _mlp(c)
    if self.cross_attention:
      self.pre_cross_attention_layer_norm = _norm(c)
      self.encoder_decoder_attention = _attention(c)
    self.adapter = _adapter(c)  # a decoder layer's own, also when it shares the encoder's FFN
    self.dropout = layers.Dropout(c.dropout_rate)

  def __call__(self, x: Array, encoded: Array | None, self_bias: Array, cross_bias: Array | None,
               enable_dropout: bool = True, decode: bool = False) -> Array:
    if decode:   # a float32 step in one kernel call where the CPU has one (else None)
      stepped = decoder_step.fused_layer_step(self, x, self_bias, cross_bias, enable_dropout)
      if stepped is not None:
        return stepped
    drop = lambda y: self.dropout(y, deterministic=not enable_dropout)
    if self.shared is None:
      self_norm, self_attn = self.pre_self_attention_layer_norm, self.self_attention
      mlp_norm, mlp = self.pre_mlp_layer_norm, self.mlp
    else:
      self_norm, self_attn = self.shared.pre_attention_layer_norm, self.shared.attention
      mlp_norm, mlp = self.shared.pre_mlp_layer_norm, self.shared.mlp
    h = self_norm(x)
    x = x + drop(self_attn(h, h, self_bias, enable_dropout=enable_dropout, decode=decode))
    if self.cross_attention:
      h = self.pre_cross_attention_layer_norm(_constrain(x))
      x = x + drop(self.encoder_decoder_attention(
          h, encoded, cross_bias, enable_dropout=enable_dropout, decode=decode, cross_cache=True))
    h = mlp(mlp_norm(_constrain(x)), enable_dropout=enable_dropout)
    if self.adapter is not None:
      h = self.adapter(h)
    x = x + drop(h)
    return _constrain(x)


# ------------------------------------------------------------------ remat and scan over layers
class _ScannedEncoderLayer(EncoderLayer):
  """EncoderLayer in `nn.scan`'s (carry, ...) -> (carry, out) form."""

  def __call__(self, x: Array, bias: Array, enable_dropout: bool) -> tuple[Array, None]:
    return super().__call__(x, bias, enable_dropout), None


class _ScannedDecoderLayer(DecoderLayer):
  """DecoderLayer in `nn.scan`'s form (teacher forcing only; decoding unstacks the layers)."""

  def __call__(self, x: Array, encoded: Array | None, self_bias: Array, cross_bias: Array | None,
               enable_dropout: bool) -> tuple[Array, None]:
    return super().__call__(x, encoded, self_bias, cross_bias, enable_dropout, False), None


def _remat(layer_cls: type[nn.Module], policy: str, static_argnums: tuple[int, ...],
           prevent_cse: bool = True) -> type[nn.Module]:
  """`layer_cls` wrapped in `nn.remat` per `policy` ('none' returns it unchanged)."""
  if policy == 'none':
    return layer_cls
  jax_policy = jax.checkpoint_policies.dots_saveable if policy == 'dots_saveable' else None
  return nn.remat(layer_cls, policy=jax_policy, static_argnums=static_argnums,
                  prevent_cse=prevent_cse)


def _scanned(layer_cls: type[nn.Module], c: T5Config, num_layers: int, num_broadcast: int,
             **kwargs) -> nn.Module:
  """All `num_layers` layers as one `nn.scan`ned module named 'layers' (params [layers, ...]).

  The body's last broadcast argument is `enable_dropout` (static under remat; self is argument 0).
  """
  body = _remat(layer_cls, c.remat_policy, static_argnums=(num_broadcast + 1,), prevent_cse=False)
  scan = nn.scan(body, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                 in_axes=(nn.broadcast,) * num_broadcast, length=num_layers,
                 metadata_params={nn.PARTITION_NAME: 'layers'})
  return scan(c, name='layers', **kwargs)


def stack_layer_params(stack_params: dict[str, Any], num_layers: int) -> dict[str, Any]:
  """One stack's params with `layers_{i}` subtrees -> a scanned `layers` subtree [num_layers, ...]."""
  out = {k: v for k, v in stack_params.items() if not k.startswith('layers_')}
  per_layer = [stack_params[f'layers_{i}'] for i in range(num_layers)]
  out['layers'] = jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)
  return out


def unstack_layer_params(stack_params: dict[str, Any]) -> dict[str, Any]:
  """Inverse of `stack_layer_params`: a `layers` subtree [n, ...] -> `layers_{i}` subtrees."""
  out = {k: v for k, v in stack_params.items() if k != 'layers'}
  num_layers = jax.tree.leaves(stack_params['layers'])[0].shape[0]
  for i in range(num_layers):
    out[f'layers_{i}'] = jax.tree.map(lambda x, i=i: x[i], stack_params['layers'])
  return out


def unscanned(module: nn.Module, params: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
  """(module, params) in the per-layer form: a clone without scan and remat, params unstacked.

  Used for decoding (the KV cache is per layer); a no-op for a module built without `scan_layers`.
  """
  c = module.config
  if not c.scan_layers:
    return module, params
  params = dict(params)
  for stack in ('encoder', 'decoder'):
    if stack in params and 'layers' in params[stack]:
      params[stack] = unstack_layer_params(params[stack])
  config = dataclasses.replace(c, scan_layers=False, remat_policy='none')
  return module.clone(config=config, parent=None), params


def _valid(tokens: Array, segment_ids: Array | None) -> Array:
  """Non-padding positions [b, l]: from segment ids when given (0 = padding), else tokens > 0."""
  return segment_ids > 0 if segment_ids is not None else tokens > 0


class Encoder(nn.Module):
  """Embedding -> dropout -> N EncoderLayers -> RMSNorm -> dropout. [b, l_enc] -> [b, l_enc, d]."""
  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    c = self.config
    self.relpos_bias = _relpos(c, bidirectional=True)
    if c.scan_layers:
      self.layers = _scanned(_ScannedEncoderLayer, c, c.num_encoder_layers, num_broadcast=2)
    else:
      # A list attribute: Flax names its entries layers_0, layers_1, ...
      layer_cls = _remat(EncoderLayer, c.remat_policy, static_argnums=(3,))
      self.layers = [layer_cls(c) for _ in range(c.num_encoder_layers)]
    self.encoder_norm = _norm(c)
    self.dropout = layers.Dropout(c.dropout_rate)

  def __call__(self, tokens: Array, segment_ids: Array | None = None,
               enable_dropout: bool = True, prefix: Array | None = None) -> Array:
    """`prefix` [b, n, d] (prompt tuning) is prepended to the embedded tokens; output [b, n + l_enc, d]."""
    c = self.config
    drop = lambda y: self.dropout(y, deterministic=not enable_dropout)
    x = self.shared_embedding(tokens)
    valid = _valid(tokens, segment_ids)
    if prefix is not None:
      if segment_ids is not None:
        raise ValueError('Prompt tuning (T5Config.num_prompt_tokens > 0) needs unpacked batches: '
                         'set USE_PACKING = False (train.use_packing).')
      x = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
      valid = jnp.concatenate([jnp.ones(prefix.shape[:2], bool), valid], axis=1)
    x = _constrain(drop(x))
    length = x.shape[1]
    # Positions inside each packed segment differ from the row positions by a constant, so relative
    # offsets between tokens of one segment are the row offsets: no per-segment positions needed.
    bias = layers.add_mask_bias(self.relpos_bias(length, length), layers.make_attention_mask(
        valid, valid, segment_ids, segment_ids))
    if c.scan_layers:
      if c.num_encoder_layers:
        x, _ = self.layers(x, bias, enable_dropout)
    else:
      for layer in self.layers:
        x = layer(x, bias, enable_dropout)
    return _constrain(drop(self.encoder_norm(x)))


def output_logits(c: T5Config, shared_embedding: nn.Module, logits_dense: nn.Module | None,
                  x: Array) -> Array:
  """Final hidden states [b, l, d] -> logits [b, l, v]: tied (scaled by d ** -0.5) or untied."""
  if c.tie_word_embeddings:
    logits = shared_embedding.attend(x * (c.d_model ** -0.5))
  else:
    logits = logits_dense(x)
  return nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))


def make_logits_dense(c: T5Config) -> layers.DenseGeneral | None:
  """The untied output projection `logits_dense` [d, v] (T5 v1.1); None with tied embeddings."""
  if c.tie_word_embeddings:
    return None
  return layers.DenseGeneral(c.vocab_size, kernel_axes=('embed', 'vocab'),
                             kernel_init=_normal(c.d_model ** -0.5), dtype=c.dtype,
                             param_dtype=c.param_dtype, matmul_dtype=c.matmul_dtype)


class Decoder(nn.Module):
  """Embedding -> N DecoderLayers -> RMSNorm -> logits. [b, l_dec] tokens -> [b, l_dec, v] logits.

  `shared_encoder` (an Encoder) makes every layer reuse that encoder layer's weights.
  """
  config: T5Config
  shared_embedding: nn.Module
  shared_encoder: Encoder | None = None

  def setup(self):
    c = self.config
    self.relpos_bias = _relpos(c, bidirectional=False)
    if c.scan_layers:
      self.layers = _scanned(_ScannedDecoderLayer, c, c.num_decoder_layers, num_broadcast=4)
    else:
      shared = (self.shared_encoder.layers if self.shared_encoder is not None
                else [None] * c.num_decoder_layers)
      layer_cls = _remat(DecoderLayer, c.remat_policy, static_argnums=(5, 6))
      self.layers = [layer_cls(c, shared=s) for s in shared]
    self.decoder_norm = _norm(c)
    self.logits_dense = make_logits_dense(c)
    self.dropout = layers.Dropout(c.dropout_rate)

  def __call__(self, encoded: Array, encoder_valid: Array, tokens: Array,
               encoder_segment_ids: Array | None = None, decoder_segment_ids: Array | None = None,
               enable_dropout: bool = True, decode: bool = False) -> Array:
    c = self.config
    drop = lambda y: self.dropout(y, deterministic=not enable_dropout)
    length = tokens.shape[1]
    stepping = decode and self.has_variable('cache', 'cache_index')
    if decode and c.scan_layers:
      raise ValueError('Incremental decoding runs on unscanned layers: use '
                       't2t.models.transformer.unscanned(module, params) first.')
    if stepping:
      # One new token at position `index`; keys are the cache slots written so far (0..index).
      # Every cache leaf except the scalar indices has a leading batch axis (beam search relies on it).
      index = self.get_variable('cache', 'cache_index')
      written = self.get_variable('cache', 'written')
      slots = jnp.arange(written.shape[1])
      written = written | (slots == index)[None, :]
      self_bias = self.relpos_bias(length, slots.shape[0], query_offset=index) + (
          layers.mask_to_bias(written[:, None, None, :]))
      self.put_variable('cache', 'cache_index', index + 1)
      self.put_variable('cache', 'written', written)
      # The encoder side (keys/values and validity) comes from the cache, so a decoding strategy may
      # expand or reorder the cache's batch (beams) without touching `encoded`. It may also keep
      # one encoder row per `beams` consecutive decoder rows (api.split_encoder_side).
      encoder_valid = self.get_variable('cache', 'encoder_valid')
      beams = tokens.shape[0] // encoder_valid.shape[0]
      cross_mask = layers.make_attention_mask(jnp.ones(tokens.shape, bool),
                                              jnp.repeat(encoder_valid, beams, axis=0))
    else:
      if decode:  # first call in decode mode: the layers size their caches to this length.
        if c.num_decoder_layers < 1:
          raise ValueError('Incremental decoding needs at least one decoder layer.')
        self.put_variable('cache', 'cache_index', jnp.array(0, jnp.int32))
        self.put_variable('cache', 'encoder_valid', encoder_valid)
        # Which self-attention cache slots hold a decoded token: [b, cache_length].
        self.put_variable('cache', 'written', jnp.zeros(tokens.shape, bool))
      # Queries are all "valid": the start token is id 0 (= pad), so tokens > 0 cannot mark validity;
      # the causal mask already keeps real positions from seeing padding that follows them.
      dec_valid = (decoder_segment_ids > 0 if decoder_segment_ids is not None
                   else jnp.ones(tokens.shape, bool))
      self_bias = layers.add_mask_bias(self.relpos_bias(length, length), layers.make_attention_mask(
          dec_valid, dec_valid, decoder_segment_ids, decoder_segment_ids, causal=True))
      cross_mask = layers.make_attention_mask(dec_valid, encoder_valid, decoder_segment_ids,
                                              encoder_segment_ids)
    cross_bias = layers.mask_to_bias(cross_mask)

    x = _constrain(drop(self.shared_embedding(tokens)))
    if c.scan_layers:
      if c.num_decoder_layers:
        x, _ = self.layers(x, encoded, self_bias, cross_bias, enable_dropout)
    else:
      for layer in self.layers:
        x = layer(x, encoded, self_bias, cross_bias, enable_dropout, decode)
    x = _constrain(drop(self.decoder_norm(x)))
    return output_logits(c, self.shared_embedding, self.logits_dense, x)


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
                                       param_dtype=c.param_dtype, matmul_dtype=c.matmul_dtype)
    self.encoder = Encoder(c, shared_embedding=self.token_embedder)
    self.prompt = (peft.PromptEmbedding(c.num_prompt_tokens, c.d_model, dtype=c.dtype,
                                        param_dtype=c.param_dtype)
                   if c.num_prompt_tokens else None)
    self.decoder = Decoder(c, shared_embedding=self.token_embedder,
                           shared_encoder=self.encoder if c.shared_encoder_decoder else None)

  def encode(self, encoder_input_tokens: Array, encoder_segment_ids: Array | None = None,
             enable_dropout: bool = True) -> Array:
    """[b, l_enc] token ids -> [b, n + l_enc, d] encoder output (n = num_prompt_tokens, often 0)."""
    _check_tokens('encoder_input_tokens', encoder_input_tokens)
    prefix = None if self.prompt is None else self.prompt(encoder_input_tokens.shape[0])
    return self.encoder(encoder_input_tokens, encoder_segment_ids, enable_dropout, prefix)

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
    n = self.config.num_prompt_tokens
    b, l_enc = encoder_input_tokens.shape
    if encoded.shape[:2] != (b, n + l_enc):
      raise ValueError(f'encoded {encoded.shape[:2]} and encoder_input_tokens '
                       f'{encoder_input_tokens.shape} (+ {n} prompt positions) disagree on '
                       '[batch, length].')
    encoder_valid = _valid(encoder_input_tokens, encoder_segment_ids)
    if n:  # the prompt positions are always real
      encoder_valid = jnp.concatenate([jnp.ones((b, n), bool), encoder_valid], axis=1)
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

