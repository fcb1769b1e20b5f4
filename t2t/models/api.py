"""The model API used by the trainer, the evaluator and inference (mirrors t5x's `EncoderDecoderModel`).

A model bundles a Flax module, its vocabularies and the seqio feature converter its batches come from,
and exposes pure functions of (params, batch): `loss_fn`, `predict_batch`, `score_batch`. Everything
static lives on the model object, so `jax.jit(model.loss_fn)` etc. just work. Params passed to these
functions are plain (unboxed) arrays; `get_initial_variables` returns boxed ones
(`nn.LogicallyPartitioned` leaves) so the trainer can derive partition specs from them.

Batches are dicts keyed by seqio `EncDecFeatureConverter` names:
  encoder_input_tokens [b, l_enc], decoder_input_tokens / decoder_target_tokens /
  decoder_loss_weights [b, l_dec], and, when packed, {encoder,decoder}_{segment_ids,positions}.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import flax
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import decoding, layers, small_dots
from t2t.models import transformer as t5
from t2t.models.transformer import Transformer

if TYPE_CHECKING:
  import seqio

Array = jax.Array
Batch = Mapping[str, Array]

_PACKING_KEYS = ('encoder_segment_ids', 'decoder_segment_ids', 'encoder_positions', 'decoder_positions')


def cross_entropy_with_logits(logits: Array, targets: Array,
                              label_smoothing: float = 0.0) -> tuple[Array, Array]:
  """Token cross-entropy with optional label smoothing. logits [b, l, v], targets [b, l] -> ([b, l], [b, l]).

  Returns (loss, correct). With smoothing the target distribution puts 1 - label_smoothing on the target
  and spreads the rest over the other tokens; its entropy is subtracted so a perfect model scores 0
  (as in the T5 reference code).
  """
  vocab = logits.shape[-1]
  logits = logits.astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  target_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  if label_smoothing:
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low + 1e-20))
    sum_other = jnp.sum(log_probs, axis=-1) - target_log_probs
    loss = -(confidence * target_log_probs + low * sum_other) - entropy
  else:
    loss = -target_log_probs
  return loss, argmax_matches(logits, targets)


def argmax_matches(logits: Array, targets: Array) -> Array:
  """`jnp.argmax(logits, axis=-1) == targets`, the training accuracy's test, by plain arithmetic.

  logits [..., vocab] float32, targets [...] int -> bool [...]. XLA:CPU runs argmax's paired
  (value, index) reduction as a scalar loop, and reductions over comparisons
  (`decoding.first_argmax`) slowly too: over T5-small's train-step logits [8, 114, 32128] on a
  Zen 5, 68 and 95 ms against 12 ms for this (`benchmarks/argmax_matches.py`): a max, then a
  min over `index + vocab * sign(max - logit)`, which is the first maximum's index (the sign is
  0 at a maximum and 1 below it; float32 holds these sums exactly for vocabularies below 2**23).
  Where a row has a NaN or an infinity at its maximum, the sign is NaN, and that call takes
  `decoding.first_argmax`'s exact answer instead (`lax.cond`: computed only then). With XLA:CPU
  flushing denormals, two logits closer than float32's smallest normal (1.2e-38) count as a tie.
  """
  logits = jax.lax.stop_gradient(logits)
  vocab = logits.shape[-1]
  if vocab >= 1 << 23:
    return decoding.first_argmax(logits) == targets
  top = jnp.max(logits, axis=-1, keepdims=True)
  index = jax.lax.broadcasted_iota(jnp.float32, logits.shape, logits.ndim - 1)
  first = jnp.min(index + vocab * jnp.sign(top - logits), axis=-1)
  first = jax.lax.cond(jnp.any(jnp.isnan(first)),
                       lambda: decoding.first_argmax(logits).astype(jnp.float32), lambda: first)
  return first == targets.astype(jnp.float32)


@gin.configurable
class EncoderDecoderModel:
  """T5-style encoder-decoder model: teacher-forced loss, greedy prediction, sequence scoring."""

  @property
  def feature_converter_cls(self) -> type[seqio.FeatureConverter]:
    # Imported here: seqio imports TensorFlow, which the model's own programs never need (an
    # accelerator image without TensorFlow trains and decodes; tests/training/test_gpu_lowering.py).
    import seqio  # pylint: disable=g-import-not-at-top
    return seqio.EncDecFeatureConverter

  def __init__(self, module: Transformer, input_vocabulary: seqio.Vocabulary,
               output_vocabulary: seqio.Vocabulary, label_smoothing: float = 0.0,
               decode_fn: Callable[..., Array] = decoding.greedy_decode,
               max_decode_length: int | None = None):
    """`module` is a `Transformer`; vocabularies are used by the evaluator / infer to (de)tokenize.

    `decode_fn` is the decoding strategy of `predict_batch` (t2t.models.decoding: `greedy_decode`,
    the T5 default; `beam_search`; `temperature_sample`), e.g. in gin
    `EncoderDecoderModel.decode_fn = @beam_search` with `beam_search.alpha = 0.6`.
    `max_decode_length` caps the decoded length `predict_batch` accepts (None = no cap): a longer
    request is refused before anything is traced or computed.
    """
    if max_decode_length is not None and max_decode_length <= 0:
      raise ValueError(f'max_decode_length must be positive or None, got {max_decode_length}.')
    if not isinstance(module, nn.Module):
      raise ValueError(f'EncoderDecoderModel.module must be a Flax module (a Transformer), got '
                       f'{type(module).__name__}.')
    if not 0.0 <= label_smoothing < 1.0:
      raise ValueError(f'label_smoothing must be in [0, 1), got {label_smoothing}.')
    self.module = module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.label_smoothing = float(label_smoothing)
    self.decode_fn = decode_fn
    self.max_decode_length = max_decode_length

  # ---------------------------------------------------------------- initialisation
  def get_initial_variables(self, rng: Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """Initial Flax variables ({'params': ...}, boxed with logical axis names) for the given shapes.

    `input_shapes` is keyed by feature-converter names and needs `encoder_input_tokens` and
    `decoder_input_tokens`; segment ids / positions are used when present. Works under
    `jax.eval_shape` (no data dependence).
    """
    for key in ('encoder_input_tokens', 'decoder_input_tokens'):
      if key not in input_shapes:
        raise ValueError(f'get_initial_variables needs input_shapes[{key!r}]; got keys '
                         f'{sorted(input_shapes)}.')
    self._check_vocabulary_fits()
    input_types = input_types or {}
    dummy = lambda k: jnp.ones(input_shapes[k], input_types.get(k, jnp.int32))
    optional = {k: dummy(k) for k in _PACKING_KEYS if k in input_shapes}
    params_rng, dropout_rng = jax.random.split(rng)
    return self.module.init({'params': params_rng, 'dropout': dropout_rng},
                            dummy('encoder_input_tokens'), dummy('decoder_input_tokens'),
                            enable_dropout=False, **optional)

  def _check_vocabulary_fits(self) -> None:
    num_embeddings = self.module.config.vocab_size
    for name, vocab in (('input', self.input_vocabulary), ('output', self.output_vocabulary)):
      if vocab is not None and vocab.vocab_size > num_embeddings:
        raise ValueError(f'The {name} vocabulary has {vocab.vocab_size} ids but the model only '
                         f'{num_embeddings} embeddings; raise T5Config.vocab_size (NUM_EMBEDDINGS).')

  # ---------------------------------------------------------------- training
  def _logits(self, params: Any, batch: Batch, dropout_rng: Array | None) -> Array:
    packing = {k: batch[k] for k in _PACKING_KEYS if k in batch}
    rngs = {'dropout': dropout_rng} if dropout_rng is not None else None
    logits = self.module.apply({'params': params}, batch['encoder_input_tokens'],
                               batch['decoder_input_tokens'], enable_dropout=dropout_rng is not None,
                               rngs=rngs, **packing)
    return logits.astype(jnp.float32)

  def loss_fn(self, params: Any, batch: Batch,
              dropout_rng: Array | None) -> tuple[Array, dict[str, Array]]:
    """Weighted teacher-forced cross-entropy; `dropout_rng=None` runs without dropout.

    loss = sum(ce * w) / sum(w) with w = decoder_loss_weights (or decoder_target_tokens > 0).
    Metrics: 'loss', 'accuracy' (weighted token accuracy), 'num_tokens' (sum of weights).
    """
    _require(batch, ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens'),
             'loss_fn')
    targets = batch['decoder_target_tokens']
    weights = batch.get('decoder_loss_weights')
    weights = (targets > 0) if weights is None else weights
    weights = weights.astype(jnp.float32)
    logits = self._logits(params, batch, dropout_rng)
    ce, correct = cross_entropy_with_logits(logits, targets, self.label_smoothing)
    num_tokens = jnp.sum(weights)
    denom = jnp.maximum(num_tokens, 1e-8)
    loss = jnp.sum(ce * weights) / denom
    metrics = {'loss': loss, 'accuracy': jnp.sum(correct * weights) / denom, 'num_tokens': num_tokens}
    return loss, metrics

  # ---------------------------------------------------------------- inference
  def predict_batch(self, params: Any, batch: Batch, max_decode_length: int | None = None,
                    rng: Array | None = None) -> Array:
    """Decoding with the KV cache (greedy by default, see `decode_fn`), no dropout. [b, length].

    `max_decode_length` defaults to the length of `decoder_target_tokens` (or `decoder_input_tokens`).
    Rows end at EOS (id 1); later positions are 0. `rng` feeds sampling strategies.
    """
    _require(batch, ('encoder_input_tokens',), 'predict_batch')
    _refuse_packed(batch, 'predict_batch')
    if max_decode_length is None:
      for key in ('decoder_target_tokens', 'decoder_input_tokens'):
        if key in batch:
          max_decode_length = batch[key].shape[1]
          break
      else:
        raise ValueError('predict_batch needs max_decode_length or a decoder_target_tokens feature '
                         'to size the output.')
    check_max_decode_length(max_decode_length, self.max_decode_length, 'EncoderDecoderModel')
    enc_tokens = batch['encoder_input_tokens']
    batch_size = enc_tokens.shape[0]
    module, params = t5.unscanned(self.module, params)  # the KV cache is per layer
    variables = {'params': params}
    encoded = module.apply(variables, enc_tokens, enable_dropout=False, method=Transformer.encode)

    def run_decoder(tokens, cache):
      cache_vars = {} if cache is None else {'cache': cache}
      logits, new_vars = module.apply(
          {**variables, **cache_vars}, encoded, enc_tokens, tokens, enable_dropout=False,
          decode=True, mutable=['cache'], method=Transformer.decode)
      return logits, new_vars['cache']

    cache = self._initial_cache(module, params, encoded, enc_tokens, max_decode_length,
                                lambda tokens: run_decoder(tokens, None)[1])
    encoder_side, cache = split_encoder_side(cache)

    def tokens_to_logits(tokens: Array, cache: Any) -> tuple[Array, Any]:
      with small_dots.weights_reused():   # traced once, run every decoding step
        logits, cache = run_decoder(tokens, _merged(cache, encoder_side))
      return logits[:, -1, :], split_encoder_side(cache)[1]

    return self.decode_fn(tokens_to_logits, cache, batch_size, max_decode_length, rng=rng)

  def _initial_cache(self, module: Transformer, params: Any, encoded: Array, enc_tokens: Array,
                     length: int, full_pass: Callable[[Array], Any]) -> Any:
    """The decoder's KV cache before the first token, without running the decoder.

    Sized by `jax.eval_shape` of a full-length first call (`full_pass`, which is what sizes the
    caches), then filled directly: the encoder-decoder attention keys/values are the encoder output
    projected by that layer's `key` / `value` kernels (the same `DenseGeneral`), `encoder_valid` is
    the encoder's padding mask, and everything else (self-attention caches, the `written` slots, the
    index) starts at zero, which is what the full pass leaves readable: its self-attention entries
    are masked until written. Saves a decoder pass over `length` tokens and its [b, length, vocab]
    logits. A cache with entries this does not know falls back to running `full_pass`.
    """
    zeros = jnp.zeros((enc_tokens.shape[0], length), jnp.int32)
    shapes = flax.traverse_util.flatten_dict(flax.core.unfreeze(jax.eval_shape(full_pass, zeros)))
    c = module.config
    flat = {}
    for path, shape in shapes.items():
      if path[-1] in ('cached_key', 'cached_value') and 'encoder_decoder_attention' in path:
        proj_params = _get_path(params, path[:-1] + (path[-1][len('cached_'):],))
        if set(proj_params) != {'kernel'}:  # e.g. an adapter on the projection: let it run
          return full_pass(zeros)
        kernel = proj_params['kernel']
        proj = layers.DenseGeneral(features=tuple(kernel.shape[1:]),
                                   kernel_axes=('embed', 'heads', 'kv'), dtype=c.dtype,
                                   matmul_dtype=c.matmul_dtype)
        projected = proj.apply({'params': {'kernel': kernel}}, encoded)
        flat[path] = layers.encoder_cache_entry(path[-1], projected, c.matmul_dtype).astype(shape.dtype)
      elif path[-1] == 'encoder_valid':
        flat[path] = (enc_tokens > 0).astype(shape.dtype)
      elif path[-1] in ('cached_key', 'cached_value', 'cache_index', 'written'):
        flat[path] = jnp.zeros(shape.shape, shape.dtype)
      else:  # an entry this method does not know how to fill
        return full_pass(zeros)
      if flat[path].shape != shape.shape:
        return full_pass(zeros)
    return flax.traverse_util.unflatten_dict(flat)

  def score_batch(self, params: Any, batch: Batch) -> Array:
    """Sum of target-token log-probabilities per example, weighted by decoder_loss_weights. [b]."""
    _require(batch, ('encoder_input_tokens', 'decoder_input_tokens', 'decoder_target_tokens'),
             'score_batch')
    _refuse_packed(batch, 'score_batch')
    targets = batch['decoder_target_tokens']
    weights = batch.get('decoder_loss_weights')
    weights = (targets > 0) if weights is None else weights
    log_probs = jax.nn.log_softmax(self._logits(params, batch, None), axis=-1)
    token_scores = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(token_scores * weights.astype(jnp.float32), axis=-1)


def check_max_decode_length(requested: Any, limit: int | None, model_name: str) -> None:
  """Refuses a decode length that is not a positive int or exceeds `limit`, before any tracing."""
  if not isinstance(requested, (int, np.integer)) or isinstance(requested, bool) or requested <= 0:
    raise ValueError(f'max_decode_length must be a positive int (static under jit), got '
                     f'{requested!r}.')
  if limit is not None and requested > limit:
    raise ValueError(f'max_decode_length {requested} exceeds the model\'s limit of {limit} tokens '
                     f'({model_name}.max_decode_length); decode at most {limit} tokens or raise '
                     'the limit.')


def _is_encoder_side(path: tuple[str, ...]) -> bool:
  return path[-1] == 'encoder_valid' or (
      path[-1] in ('cached_key', 'cached_value') and 'encoder_decoder_attention' in path)


def split_encoder_side(cache: Any) -> tuple[dict[tuple[str, ...], Array], Any]:
  """(the cache's encoder side, the rest of the cache) of an encoder-decoder decoding cache.

  The encoder side -- each layer's encoder-decoder keys/values and `encoder_valid` -- is the same
  at every step and for every beam of a row, so `predict_batch` keeps it out of the cache the
  decoding strategy carries: beam search then neither repeats it per beam (T5-small at beam 4
  would hold and read four copies of 48 MB of bf16 keys/values) nor reorders it. The decoder
  attends from [b * beams] rows to its [b] rows (`layers.MultiHeadAttention`). Returned as a flat
  {path: array} and the rest as a nested cache.
  """
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(cache))
  encoder_side = {path: leaf for path, leaf in flat.items() if _is_encoder_side(path)}
  rest = {path: leaf for path, leaf in flat.items() if not _is_encoder_side(path)}
  return encoder_side, flax.traverse_util.unflatten_dict(rest)


def _merged(cache: Any, encoder_side: dict[tuple[str, ...], Array]) -> Any:
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(cache))
  return flax.traverse_util.unflatten_dict({**flat, **encoder_side})


def _get_path(tree: Any, path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree


def require_features(batch: Batch, keys: Sequence[str], where: str, converter: str) -> None:
  """Raises a ValueError naming `where`, the missing features and the `converter` making batches.

  Shared by every model family (api, decoder_only, bert, classifier_api), one message format.
  """
  missing = [k for k in keys if k not in batch]
  if missing:
    raise ValueError(f'{where}: batch lacks {missing}; it has {sorted(batch)}. Batches come from '
                     f'{converter}.')


def refuse_packed(batch: Batch, where: str) -> None:
  """Raises a ValueError when `batch` is packed (has encoder or decoder segment ids)."""
  if 'encoder_segment_ids' in batch or 'decoder_segment_ids' in batch:
    raise ValueError(f'{where} does not support packed batches (one example per row); build the '
                     'batch with a feature converter created with pack=False.')


def _require(batch: Batch, keys: Sequence[str], where: str) -> None:
  require_features(batch, keys, where, 'seqio.EncDecFeatureConverter')


_refuse_packed = refuse_packed
