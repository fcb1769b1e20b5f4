"""Classifier baselines behind the model API (jiant-style; PAPERS.md §6-7), on text-to-text tasks.

`ClassifierModel` = an encoder (any module following the encoder protocol: `encoder(tokens [b, l],
token_types [b, l] | None, enable_dropout) -> [embeddings, layer 1, ..., layer n]`, each [b, l, d])
+ an optional ELMo scalar mix over those states + a `heads.ClassifierHead`. It implements the same
API as `EncoderDecoderModel` (t2t/models/api.py), so `t2t.train`, `t2t.eval` and gin runs work
unchanged on the same seqio tasks: its feature converter (classifier_data.py) maps target strings
to label ids, and `predict_batch` maps label ids back to the label's target tokens, which seqio's
Evaluator decodes so the task's postprocessor and metrics run as for T5.

Parameters: the encoder's own top-level scopes (T5: `token_embedder`, `encoder`; BiLSTM:
`embedder`, `encoder`), `head/...` and, with `scalar_mix=True`, `scalar_mix/{weights, gamma}`.
Sentence pairs ('separate') run the same encoder on both sentences (a siamese encoder, as jiant).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio

from t2t.data import mlm, registry
from t2t.models import api
from t2t.models import classifier_data as data
from t2t.models import heads

Array = jax.Array
Batch = Mapping[str, Array]
_OWN_SCOPES = ('head', 'scalar_mix')


@gin.configurable
class ClassifierModel:
  """A classifier or regressor over a text encoder, with the t5x-style model API."""

  def __init__(self, encoder: nn.Module, input_vocabulary: seqio.Vocabulary,
               output_vocabulary: seqio.Vocabulary | None = None,
               labels: Sequence[str] | None = None, mixture_or_task_name: str | None = None,
               encoding: str = 'single',
               pair_markers: Sequence[str] = data.DEFAULT_PAIR_MARKERS,
               head: Callable[..., nn.Module] = heads.ClassifierHead,
               scalar_mix: bool = False, regression: bool = False,
               regression_range: tuple[float, float] = (0.0, 5.0), regression_step: float = 0.2,
               cls_id: int | None = None, sep_id: int | None = None):
    """Args:
      encoder: an encoder-protocol Flax module (`@BiLSTMEncoder()`, `@T5EncoderStates()`, BERT).
      input_vocabulary / output_vocabulary: the task's (output defaults to input); labels are
        emitted as output-vocabulary tokens.
      labels: the label strings; None takes them from `mixture_or_task_name` (see
        classifier_data.task_labels). Their order is the head's output order.
      mixture_or_task_name: the task (gin: `%MIXTURE_OR_TASK_NAME`), for labels, for checking
        single vs pair inputs, and to name it in errors.
      encoding: 'single' (one sentence), 'separate' (each sentence of a pair encoded alone, pooled
        u, v combined as [u; v; |u-v|; u*v]) or 'joint' ([CLS] A [SEP] B [SEP], token types 0/1;
        also [CLS] A [SEP] for single sentences).
      pair_markers: where a pair input is cut (classifier_data.split_pair).
      head: a factory called as head(num_outputs=n, regression=...) (gin: `@ClassifierHead`).
      scalar_mix: feed the head an ELMo scalar mix of all states instead of the last one.
      regression: a float target (STS-B style): MSE loss, predictions rounded to the grid
        regression_range by regression_step and emitted as that number's tokens ("3.2").
      cls_id / sep_id: 'joint' special ids; default BERT's (t2t.data.mlm.bert_special_ids: the
        sentinels <extra_id_1> and <extra_id_2>), so a masked-LM checkpoint's [CLS] and [SEP]
        keep their meaning in fine-tuning.
    """
    if encoding not in data.ENCODINGS:
      raise ValueError(f'ClassifierModel.encoding must be one of {data.ENCODINGS}, got '
                       f'{encoding!r}.')
    if not isinstance(encoder, nn.Module):
      raise ValueError(f'ClassifierModel.encoder must be a Flax module, got {type(encoder)}.')
    self.encoder = encoder
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary or input_vocabulary
    self.mixture_or_task_name = mixture_or_task_name
    self.encoding, self.pair_markers = encoding, tuple(pair_markers)
    self.head_factory, self.scalar_mix, self.regression = head, scalar_mix, regression
    self.regression_range = (float(regression_range[0]), float(regression_range[1]))
    self.regression_step = float(regression_step)
    self._labels = tuple(labels) if labels else None
    if regression and labels:
      raise ValueError('ClassifierModel: regression=True takes no labels.')
    if regression:
      self.grid, grid_strings = data.regression_grid(*self.regression_range, self.regression_step)
      self.output_table = data.label_token_table(grid_strings, self.output_vocabulary)
    if encoding == 'joint' and (cls_id is None or sep_id is None):
      cls_id, sep_id = _default_special_ids(input_vocabulary, cls_id, sep_id)
    self.cls_id, self.sep_id = cls_id, sep_id
    self._checked_inputs = False

  # ---------------------------------------------------------------- labels and features
  @property
  def labels(self) -> tuple[str, ...]:
    if self.regression:
      return ()
    if self._labels is None:
      if not self.mixture_or_task_name:
        raise ValueError('ClassifierModel needs its labels: bind ClassifierModel.labels = [...] '
                         'or ClassifierModel.mixture_or_task_name = %MIXTURE_OR_TASK_NAME.')
      self._labels = data.task_labels(self.mixture_or_task_name)
    return self._labels

  @property
  def num_outputs(self) -> int:
    return 1 if self.regression else len(self.labels)

  @functools.cached_property
  def output_table(self) -> np.ndarray:
    """Target tokens (+ EOS, zero-padded) of every label, [num_labels, L]."""
    return data.label_token_table(self.labels, self.output_vocabulary)

  def check_task_inputs(self) -> None:
    """Refuses a pair task for encoding='single' and a single-sentence task for 'separate'."""
    if self._checked_inputs or not self.mixture_or_task_name or self.encoding == 'joint':
      return
    registry.get_mixture_or_task(self.mixture_or_task_name)  # a clear error for a bad name
    for task in seqio.get_subtasks(seqio.get_mixture_or_task(self.mixture_or_task_name)):
      is_pair = data.task_is_pair(task, self.pair_markers)
      if is_pair and self.encoding == 'single':
        raise data.ClassifierDataError(
            f"Task '{task.name}' has sentence-pair inputs but ClassifierModel.encoding is "
            "'single'; use 'separate' or 'joint'.")
      if not is_pair and self.encoding == 'separate':
        raise data.ClassifierDataError(
            f"Task '{task.name}' has single-sentence inputs (no pair marker from "
            f"{list(self.pair_markers)}) but ClassifierModel.encoding is 'separate'; use 'single' "
            "or 'joint', or set ClassifierModel.pair_markers.")
    self._checked_inputs = True

  def feature_converter_cls(self, pack: bool = False, **kwargs) -> data.ClassifierFeatureConverter:
    """The model's feature converter (called like a class, as train.py and eval.py do)."""
    self.check_task_inputs()
    return data.ClassifierFeatureConverter(
        pack, input_vocabulary=self.input_vocabulary, output_vocabulary=self.output_vocabulary,
        labels=self.labels, regression=self.regression, encoding=self.encoding,
        pair_markers=self.pair_markers, cls_id=self.cls_id, sep_id=self.sep_id,
        task_name=self.mixture_or_task_name or 'the task', **kwargs)

  # ---------------------------------------------------------------- the network
  @property
  def head(self) -> nn.Module:
    return self.head_factory(num_outputs=self.num_outputs, regression=self.regression)

  def _mix(self, num_states: int) -> heads.ScalarMix:
    return heads.ScalarMix(num_layers=num_states)

  def _representation(self, params, tokens, types, enable_dropout, rng, mix_params=None):
    """Encoder states -> the head's input [b, l, d] (last state, or the scalar mix)."""
    rngs = {'dropout': rng} if enable_dropout else None
    states = self.encoder.apply({'params': params}, tokens, types, enable_dropout, rngs=rngs)
    if not self.scalar_mix:
      return states[-1], states
    return self._mix(len(states)).apply({'params': mix_params}, states), states

  def _forward(self, params: Any, batch: Batch, dropout_rng: Array | None) -> Array:
    """Logits [b, num_labels] (or scores [b] for regression)."""
    _require(batch, ('encoder_input_tokens',), 'ClassifierModel')
    enable = dropout_rng is not None
    rngs = jax.random.split(dropout_rng, 3) if enable else [None] * 3
    encoder_params = {k: v for k, v in params.items() if k not in _OWN_SCOPES}
    mix_params = params.get('scalar_mix')
    tokens_a = batch['encoder_input_tokens']
    rep_a, _ = self._representation(encoder_params, tokens_a, batch.get('encoder_token_types'),
                                    enable, rngs[0], mix_params)
    rep_b = valid_b = None
    if self.encoding == 'separate':
      _require(batch, ('encoder_pair_tokens',), 'ClassifierModel (encoding separate)')
      tokens_b = batch['encoder_pair_tokens']
      rep_b, _ = self._representation(encoder_params, tokens_b, None, enable, rngs[1], mix_params)
      valid_b = tokens_b > 0
    return self.head.apply({'params': params['head']}, rep_a, tokens_a > 0, rep_b, valid_b,
                           enable, rngs={'dropout': rngs[2]} if enable else None)

  def get_initial_variables(self, rng: Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """{'params': encoder scopes + head (+ scalar_mix)}, boxed with logical axis names."""
    del input_types
    if 'encoder_input_tokens' not in input_shapes:
      raise ValueError('get_initial_variables needs input_shapes["encoder_input_tokens"]; got '
                       f'{sorted(input_shapes)}.')
    shape = tuple(input_shapes['encoder_input_tokens'])
    tokens = jnp.ones(shape, jnp.int32)
    types = jnp.zeros(shape, jnp.int32) if self.encoding == 'joint' else None
    enc_rng, mix_rng, head_rng = jax.random.split(rng, 3)
    encoder_vars = self.encoder.init(enc_rng, tokens, types, False)
    states = self.encoder.apply(encoder_vars, tokens, types, False)
    params = dict(encoder_vars['params'])
    clash = [k for k in _OWN_SCOPES if k in params]
    if clash:
      raise ValueError(f'The encoder has top-level parameter scopes {clash}, reserved for the '
                       'classifier head and scalar mix; rename them in the encoder.')
    rep = states[-1]
    if self.scalar_mix:
      widths = [int(x.shape[-1]) for x in states]
      if len(set(widths)) > 1:
        raise ValueError(
            f'ClassifierModel.scalar_mix = True needs encoder states of one width, but '
            f'{type(self.encoder).__name__} returns widths {widths} (embeddings, layer 1, ...); '
            'mix a T5 or BERT encoder, or set scalar_mix = False (adaptation/freeze_encoder.gin '
            'without _mix).')
      mix = self._mix(len(states))
      params['scalar_mix'] = mix.init(mix_rng, states)['params']
      rep = mix.apply({'params': nn.unbox(params['scalar_mix'])}, states)
    valid = tokens > 0
    pair = (rep, valid) if self.encoding == 'separate' else (None, None)
    params['head'] = self.head.init(head_rng, rep, valid, *pair, False)['params']
    return {'params': params}

  # ---------------------------------------------------------------- loss, predictions, scores
  def _targets(self, batch: Batch) -> tuple[Array, Array]:
    """(targets [b], weights [b]): label ids (or floats) and 1 where the target is usable."""
    if self.regression:
      _require(batch, (data.REGRESSION_FEATURE,), 'ClassifierModel (regression)')
      values = batch[data.REGRESSION_FEATURE][:, 0].astype(jnp.float32)
      ok = jnp.isfinite(values)
      return jnp.where(ok, values, 0.0), ok.astype(jnp.float32)
    _require(batch, (data.LABEL_FEATURE,), 'ClassifierModel')
    labels = batch[data.LABEL_FEATURE][:, 0]
    return jnp.maximum(labels, 0), (labels >= 0).astype(jnp.float32)

  def _grid_index(self, values: Array) -> Array:
    low, high = self.regression_range
    n = len(self.grid) - 1
    return jnp.clip(jnp.round((values - low) / self.regression_step), 0, n).astype(jnp.int32)

  def loss_fn(self, params: Any, batch: Batch,
              dropout_rng: Array | None) -> tuple[Array, dict[str, Array]]:
    """Cross-entropy over labels (or MSE for regression), averaged over usable examples.

    Metrics: 'loss'; 'accuracy' (label accuracy; regression: the rounded prediction equals the
    rounded target); 'num_tokens' (examples counted).
    """
    outputs = self._forward(params, batch, dropout_rng).astype(jnp.float32)
    targets, weights = self._targets(batch)
    if self.regression:
      per_example = jnp.square(outputs - targets)
      correct = self._grid_index(outputs) == self._grid_index(targets)
    else:
      log_probs = jax.nn.log_softmax(outputs, axis=-1)
      per_example = -jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
      correct = jnp.argmax(outputs, axis=-1) == targets
    count = jnp.sum(weights)
    denom = jnp.maximum(count, 1e-8)
    loss = jnp.sum(per_example * weights) / denom
    return loss, {'loss': loss, 'accuracy': jnp.sum(correct * weights) / denom,
                  'num_tokens': count}

  def predict_batch(self, params: Any, batch: Batch, max_decode_length: int | None = None,
                    rng: Array | None = None) -> Array:
    """The predicted label's target tokens + EOS, zero-padded: int32 [b, L].

    L is the longest label's token count + 1, or `max_decode_length` when given (>= that).
    Regression emits the prediction rounded to the grid, as that number's tokens.
    """
    del rng
    outputs = self._forward(params, batch, None)
    index = self._grid_index(outputs) if self.regression else jnp.argmax(outputs, axis=-1)
    table = self.output_table
    if max_decode_length is not None:
      if max_decode_length < table.shape[1]:
        raise ValueError(f'max_decode_length {max_decode_length} is shorter than the longest '
                         f'label ({table.shape[1]} tokens with EOS).')
      table = np.pad(table, [(0, 0), (0, max_decode_length - table.shape[1])])
    return jnp.asarray(table, jnp.int32)[index]

  def score_batch(self, params: Any, batch: Batch) -> Array:
    """Log-probability of each example's label [b] (-inf for a target that is no label);
    regression: -(prediction - target)^2, a Gaussian log-likelihood up to a constant."""
    outputs = self._forward(params, batch, None).astype(jnp.float32)
    targets, weights = self._targets(batch)
    if self.regression:
      scores = -jnp.square(outputs - targets)
    else:
      log_probs = jax.nn.log_softmax(outputs, axis=-1)
      scores = jnp.take_along_axis(log_probs, targets[:, None], axis=-1)[:, 0]
    return jnp.where(weights > 0, scores, -jnp.inf)


def _default_special_ids(vocab: seqio.Vocabulary, cls_id: int | None,
                         sep_id: int | None) -> tuple[int, int]:
  try:
    ids = mlm.bert_special_ids(vocab)
  except ValueError as e:
    raise ValueError(f"ClassifierModel.encoding='joint' needs [CLS]/[SEP] ids: {e} Or bind "
                     'ClassifierModel.cls_id and .sep_id.') from None
  return (ids.cls if cls_id is None else cls_id), (ids.sep if sep_id is None else sep_id)


def _require(batch: Batch, keys: tuple[str, ...], where: str) -> None:
  api.require_features(batch, keys, where, 'ClassifierModel.feature_converter_cls')
