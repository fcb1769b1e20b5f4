"""Decoder-only Transformers of T5's Table 2: a causal language model and a prefix LM.

Both read one sequence, the concatenation "inputs targets" built by seqio's feature converters
(`DecoderFeatureConverter` / `PrefixLMFeatureConverter`; T5 §3.2.1 writes it as "... target: ..."),
and predict it token by token; the loss is on the targets only (the converters' default
`loss_on_targets_only=True`). They differ only in the self-attention mask:

  LM         causal over the whole sequence;
  prefix LM  fully visible over the prefix (the inputs plus the position that reads their last
             token, where seqio's `decoder_causal_attention` is 1), causal after it.

The stack is the T5 decoder without encoder-decoder attention (`DecoderLayer(cross_attention=False)`),
with one causal relative position table (offsets to later prefix tokens share bucket 0, as in the
reference decoder-only models). Parameter tree (b = batch, l = length, d = d_model, v = vocab):

  token_embedder/embedding                                 [v, d]
  decoder/relpos_bias/rel_embedding                        [h, buckets]
  decoder/layers_{i}/{pre_self_attention_layer_norm, self_attention, pre_mlp_layer_norm, mlp}
  decoder/decoder_norm/scale                               [d]
  decoder/logits_dense/kernel (untied only)                [d, v]

Prediction feeds the prompt (decoder_input_tokens where decoder_causal_attention is 1) through the
stack once, filling the KV cache (prefill), then decodes the continuation one token at a time from
each row's own position: prompts differ in length, so cache indices are per row ([b]).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t2t.models import api, decoding, layers, small_dots
from t2t.models import transformer as t5

if TYPE_CHECKING:
  import seqio

Array = jax.Array
Batch = Mapping[str, Array]


class DecoderOnlyStack(nn.Module):
  """Embedding -> N self-attention layers -> RMSNorm -> logits. [b, l] tokens -> [b, l, v]."""
  config: t5.T5Config
  shared_embedding: nn.Module

  def setup(self):
    c = self.config
    self.relpos_bias = t5._relpos(c, bidirectional=False)  # pylint: disable=protected-access
    if c.scan_layers:
      self.layers = t5._scanned(t5._ScannedDecoderLayer, c, c.num_decoder_layers,  # pylint: disable=protected-access
                                num_broadcast=4, cross_attention=False)
    else:
      layer_cls = t5._remat(t5.DecoderLayer, c.remat_policy, static_argnums=(5, 6))  # pylint: disable=protected-access
      self.layers = [layer_cls(c, cross_attention=False) for _ in range(c.num_decoder_layers)]
    self.decoder_norm = t5._norm(c)  # pylint: disable=protected-access
    self.logits_dense = t5.make_logits_dense(c)
    self.dropout = layers.Dropout(c.dropout_rate)

  def __call__(self, tokens: Array, segment_ids: Array | None = None,
               causal_attention: Array | None = None, enable_dropout: bool = True,
               decode: bool = False) -> Array:
    """tokens [b, l]; causal_attention [b, l] (1 on the prefix) makes the prefix fully visible.

    decode=True: the first call (prefill) sizes the caches to l and caches the whole row; the caller
    then sets the per-row positions (`set_decode_positions`); later calls take [b, 1].
    """
    c = self.config
    drop = lambda y: self.dropout(y, deterministic=not enable_dropout)
    length = tokens.shape[1]
    if decode and c.scan_layers:
      raise ValueError('Incremental decoding runs on unscanned layers: use '
                       't2t.models.transformer.unscanned(module, params) first.')
    if decode and self.has_variable('cache', 'cache_index'):
      index = self.get_variable('cache', 'cache_index')  # [b] after set_decode_positions
      written = self.get_variable('cache', 'written')   # [b, cache_length]
      slots = jnp.arange(written.shape[1])
      written = written | (slots[None, :] == jnp.reshape(index, (-1, 1)))
      bias = self.relpos_bias(length, slots.shape[0], query_offset=index) + layers.mask_to_bias(
          written[:, None, None, :])
      self.put_variable('cache', 'cache_index', index + 1)
      self.put_variable('cache', 'written', written)
    else:
      if decode:
        if c.num_decoder_layers < 1:
          raise ValueError('Incremental decoding needs at least one decoder layer.')
        self.put_variable('cache', 'cache_index', jnp.array(0, jnp.int32))
        self.put_variable('cache', 'written', jnp.zeros(tokens.shape, bool))
      bias = layers.add_mask_bias(self.relpos_bias(length, length),
                                  decoder_only_mask(tokens.shape, segment_ids, causal_attention))
    x = t5._constrain(drop(self.shared_embedding(tokens)))  # pylint: disable=protected-access
    if c.scan_layers:
      if c.num_decoder_layers:
        x, _ = self.layers(x, None, bias, None, enable_dropout)
    else:
      for layer in self.layers:
        x = layer(x, None, bias, None, enable_dropout, decode)
    x = t5._constrain(drop(self.decoder_norm(x)))  # pylint: disable=protected-access
    return t5.output_logits(c, self.shared_embedding, self.logits_dense, x)


def decoder_only_mask(shape: tuple[int, int], segment_ids: Array | None = None,
                      causal_attention: Array | None = None) -> Array:
  """Self-attention mask [b, 1, l, l]: causal, plus full visibility inside the prefix.

  Query i may see key j when j <= i, or when both lie in the prefix (causal_attention 1), and, for
  packed rows, only within its own segment (padding, segment 0, sees nothing real).
  """
  valid = segment_ids > 0 if segment_ids is not None else jnp.ones(shape, bool)
  mask = layers.make_attention_mask(valid, valid, segment_ids, segment_ids, causal=True)
  if causal_attention is not None:
    prefix = causal_attention > 0
    both = prefix[:, None, :, None] & prefix[:, None, None, :]
    if segment_ids is not None:
      both &= (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    mask = mask | both
  return mask


@gin.configurable
class DecoderOnlyTransformer(nn.Module):
  """A decoder-only T5 (no encoder; `num_decoder_layers` layers). See the module docstring."""
  config: t5.T5Config

  def setup(self):
    c = self.config
    if c.shared_encoder_decoder:
      raise ValueError('T5Config.shared_encoder_decoder has no meaning for a decoder-only model.')
    if c.num_prompt_tokens:
      raise ValueError('T5Config.num_prompt_tokens (prompt tuning) prepends vectors to the encoder '
                       'input; a decoder-only model has no encoder. Use adapters or LoRA instead.')
    self.token_embedder = layers.Embed(num_embeddings=c.vocab_size, features=c.d_model,
                                       embedding_init=t5._normal(1.0), dtype=c.dtype,  # pylint: disable=protected-access
                                       param_dtype=c.param_dtype, matmul_dtype=c.matmul_dtype)
    self.decoder = DecoderOnlyStack(c, shared_embedding=self.token_embedder)

  def __call__(self, decoder_input_tokens: Array, decoder_segment_ids: Array | None = None,
               decoder_positions: Array | None = None, decoder_causal_attention: Array | None = None,
               enable_dropout: bool = True, decode: bool = False) -> Array:
    """[b, l] token ids -> logits [b, l, v]. Positions are unused (relative attention)."""
    del decoder_positions
    t5._check_tokens('decoder_input_tokens', decoder_input_tokens)  # pylint: disable=protected-access
    return self.decoder(decoder_input_tokens, decoder_segment_ids, decoder_causal_attention,
                        enable_dropout, decode)


def set_decode_positions(cache: Any, positions: Array, cache_length: int) -> Any:
  """After prefill: every `cache_index` becomes `positions` [b] and slots < positions are written.

  The next call then writes each row's token at its own position.
  """
  def fix(path, leaf):
    name = path[-1].key
    if name == 'cache_index':
      return positions.astype(jnp.int32)
    if name == 'written':
      return jnp.arange(cache_length)[None, :] < positions[:, None]
    return leaf
  return jax.tree_util.tree_map_with_path(fix, cache)


_PACKING_KEYS = ('decoder_segment_ids', 'decoder_positions')


@gin.configurable
class DecoderOnlyModel:
  """Model API (loss_fn / predict_batch / score_batch) for a `DecoderOnlyTransformer`.

  `prefix_lm=False` is T5's "language model" (causal mask everywhere, batches from
  `seqio.DecoderFeatureConverter`); `prefix_lm=True` is the prefix LM (batches from
  `seqio.PrefixLMFeatureConverter`, whose `decoder_causal_attention` marks the visible prefix).
  """

  def __init__(self, module: DecoderOnlyTransformer, input_vocabulary: seqio.Vocabulary,
               output_vocabulary: seqio.Vocabulary, prefix_lm: bool = False,
               label_smoothing: float = 0.0,
               decode_fn: Callable[..., Array] = decoding.greedy_decode,
               max_decode_length: int | None = None):
    """`max_decode_length` caps how many tokens `predict_batch` may decode (None = no cap)."""
    if not isinstance(module, DecoderOnlyTransformer):
      raise ValueError(f'DecoderOnlyModel.module must be a DecoderOnlyTransformer, got '
                       f'{type(module).__name__}.')
    if not 0.0 <= label_smoothing < 1.0:
      raise ValueError(f'label_smoothing must be in [0, 1), got {label_smoothing}.')
    self.module = module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.prefix_lm = bool(prefix_lm)
    self.label_smoothing = float(label_smoothing)
    self.decode_fn = decode_fn
    self.max_decode_length = max_decode_length

  @property
  def feature_converter_cls(self) -> type[seqio.FeatureConverter]:
    import seqio  # pylint: disable=g-import-not-at-top  (seqio imports TensorFlow: see api.py)
    return seqio.PrefixLMFeatureConverter if self.prefix_lm else seqio.DecoderFeatureConverter

  def get_initial_variables(self, rng: Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """Initial (boxed) Flax variables for `input_shapes['decoder_input_tokens']`; eval_shape-safe."""
    if 'decoder_input_tokens' not in input_shapes:
      raise ValueError('get_initial_variables needs input_shapes["decoder_input_tokens"]; got keys '
                       f'{sorted(input_shapes)}.')
    num_embeddings = self.module.config.vocab_size
    for name, vocab in (('input', self.input_vocabulary), ('output', self.output_vocabulary)):
      if vocab is not None and vocab.vocab_size > num_embeddings:
        raise ValueError(f'The {name} vocabulary has {vocab.vocab_size} ids but the model only '
                         f'{num_embeddings} embeddings; raise T5Config.vocab_size (NUM_EMBEDDINGS).')
    tokens = jnp.ones(input_shapes['decoder_input_tokens'], jnp.int32)
    params_rng, dropout_rng = jax.random.split(rng)
    return self.module.init({'params': params_rng, 'dropout': dropout_rng}, tokens,
                            enable_dropout=False)

  def _logits(self, params: Any, batch: Batch, dropout_rng: Array | None) -> Array:
    extra = {k: batch[k] for k in ('decoder_segment_ids',) if k in batch}
    if self.prefix_lm:
      if 'decoder_causal_attention' not in batch:
        raise ValueError('A prefix LM needs batch["decoder_causal_attention"] (from '
                         'seqio.PrefixLMFeatureConverter on a task with inputs and targets).')
      extra['decoder_causal_attention'] = batch['decoder_causal_attention']
    rngs = {'dropout': dropout_rng} if dropout_rng is not None else None
    logits = self.module.apply({'params': params}, batch['decoder_input_tokens'],
                               enable_dropout=dropout_rng is not None, rngs=rngs, **extra)
    return logits.astype(jnp.float32)

  def _weights(self, batch: Batch) -> Array:
    weights = batch.get('decoder_loss_weights')
    return (batch['decoder_target_tokens'] > 0 if weights is None else weights).astype(jnp.float32)

  def loss_fn(self, params: Any, batch: Batch,
              dropout_rng: Array | None) -> tuple[Array, dict[str, Array]]:
    """Weighted next-token cross-entropy (targets only, per decoder_loss_weights)."""
    _require(batch, ('decoder_input_tokens', 'decoder_target_tokens'), 'loss_fn')
    weights = self._weights(batch)
    ce, correct = api.cross_entropy_with_logits(self._logits(params, batch, dropout_rng),
                                                batch['decoder_target_tokens'], self.label_smoothing)
    num_tokens = jnp.sum(weights)
    denom = jnp.maximum(num_tokens, 1e-8)
    loss = jnp.sum(ce * weights) / denom
    return loss, {'loss': loss, 'accuracy': jnp.sum(correct * weights) / denom,
                  'num_tokens': num_tokens}

  def score_batch(self, params: Any, batch: Batch) -> Array:
    """Sum of target-token log-probabilities per example. [b]."""
    _require(batch, ('decoder_input_tokens', 'decoder_target_tokens'), 'score_batch')
    _refuse_packed(batch, 'score_batch')
    log_probs = jax.nn.log_softmax(self._logits(params, batch, None), axis=-1)
    token = jnp.take_along_axis(log_probs, batch['decoder_target_tokens'][..., None], -1)[..., 0]
    return jnp.sum(token * self._weights(batch), axis=-1)

  def predict_batch(self, params: Any, batch: Batch, max_decode_length: int | None = None,
                    rng: Array | None = None) -> Array:
    """Continuations of the prompts, decoded over the KV cache: [b, max_decode_length].

    The prompt of a row is decoder_input_tokens where decoder_causal_attention is 1 ("0 inputs");
    without that feature (a targets-only LM task) the prompt is just the start token 0. Targets in
    the batch are never read. `max_decode_length` defaults to the decoder_input_tokens length.
    """
    _require(batch, ('decoder_input_tokens',), 'predict_batch')
    _refuse_packed(batch, 'predict_batch')
    tokens = batch['decoder_input_tokens']
    batch_size, length = tokens.shape
    if max_decode_length is None:
      max_decode_length = length
    api.check_max_decode_length(max_decode_length, self.max_decode_length, 'DecoderOnlyModel')
    if 'decoder_causal_attention' in batch:
      prefix_len = jnp.sum(batch['decoder_causal_attention'] > 0, axis=1).astype(jnp.int32)
    else:
      prefix_len = jnp.ones((batch_size,), jnp.int32)
    prefix_len = jnp.maximum(prefix_len, 1)  # padding rows: just the start token
    last = prefix_len - 1   # the prompt's last position: it predicts the first new token
    prompt_mask = jnp.arange(length)[None, :] < prefix_len[:, None]
    cache_length = length + max_decode_length
    prompt = jnp.zeros((batch_size, cache_length), jnp.int32).at[:, :length].set(
        jnp.where(prompt_mask, tokens, 0))
    causal = (jnp.arange(cache_length)[None, :] < prefix_len[:, None]).astype(jnp.int32)
    module, params = t5.unscanned(self.module, params)
    variables = {'params': params}
    _, new_vars = module.apply(variables, prompt,
                               decoder_causal_attention=causal if self.prefix_lm else None,
                               enable_dropout=False, decode=True, mutable=['cache'])
    # The step at position `last` recomputes that slot's key/value exactly as the prefill did (it
    # sees the same keys), so decoding starts there, from the prompt's last token.
    cache = set_decode_positions(new_vars['cache'], last, cache_length)
    start = jnp.take_along_axis(tokens, last[:, None], axis=1)[:, 0]

    def tokens_to_logits(step_tokens: Array, cache: Any) -> tuple[Array, Any]:
      with small_dots.weights_reused():   # traced once, run every decoding step
        logits, new = module.apply({**variables, 'cache': cache}, step_tokens,
                                   enable_dropout=False, decode=True, mutable=['cache'])
      return logits[:, -1, :], new['cache']

    return self.decode_fn(tokens_to_logits, cache, batch_size, max_decode_length, rng=rng,
                          start_id=start)


def _require(batch: Batch, keys: tuple[str, ...], where: str) -> None:
  api.require_features(batch, keys, where,
                       'seqio.DecoderFeatureConverter / PrefixLMFeatureConverter')


_refuse_packed = api.refuse_packed
