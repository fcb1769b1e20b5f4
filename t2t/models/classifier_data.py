"""From text-to-text examples to classifier features, and from label ids back to target tokens.

- Labels: a classifier needs the task's label list. `task_labels` takes it from gin
  (`ClassifierModel.labels = [...]`), else from the task's postprocessor when that is
  `functools.partial(postprocessors.classification, labels=(...))` (every GLUE/SuperGLUE
  classification task in tasks/), else from the distinct target strings of its `train` split,
  sorted (e.g. `bbc_topic`: business, entertainment, politics, sports, tech).
- Sentence pairs: T5's formats write both sentences into one input
  ("mrpc sentence1: A sentence2: B", T5 Appendix D; PAPERS.md §5). `split_pair` cuts it at the
  first pair marker of a priority list (`DEFAULT_PAIR_MARKERS`) that follows another field ("cola sentence: A" is not a pair: nothing
  before 'sentence:' names a field).
- `ClassifierFeatureConverter`: a seqio FeatureConverter emitting 2-D model features:
  encoder_input_tokens [b, l] (the input; sentence A for 'separate'; [CLS] A [SEP] B [SEP] for
  'joint'), encoder_pair_tokens [b, l] ('separate'), encoder_token_types [b, l] ('joint'), and
  classifier_labels int32 [b, 1] (-1: not a label) or regression_targets float32 [b, 1] (NaN: not
  a number). A training stream (it repeats forever) with an unknown target fails with an error
  naming the task and the string; evaluation counts such an example as wrong.
"""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import seqio
import tensorflow as tf

ENCODINGS = ('single', 'separate', 'joint')
# T5 Appendix D pair formats: MRPC/RTE/STS-B/WNLI 'sentence2:', QQP 'question2:', MNLI/CB
# 'premise:', QNLI 'sentence:' (after 'question:').
DEFAULT_PAIR_MARKERS: tuple[str, ...] = ('sentence2:', 'question2:', 'premise:', 'sentence:')
LABEL_FEATURE = 'classifier_labels'
REGRESSION_FEATURE = 'regression_targets'
EOS_ID = 1
ASCII_WHITESPACE = ' \t\n\v\f\r'  # what tf.strings.strip removes


class ClassifierDataError(ValueError):
  """A task whose examples do not fit the classifier's configuration."""


# ------------------------------------------------------------------ labels
def postprocessor_labels(task: seqio.Task) -> tuple[str, ...] | None:
  """The labels bound into the task's postprocessor (`partial(..., labels=(...))`), if any."""
  fn = task.postprocessor  # (`task.postprocess_fn` is the method that applies it)
  while isinstance(fn, functools.partial):
    if 'labels' in fn.keywords:
      return tuple(str(label) for label in fn.keywords['labels'])
    fn = fn.func
  return None


def scan_target_strings(task: seqio.Task, split: str = 'train', limit: int = 200_000,
                        max_labels: int = 1000) -> tuple[str, ...]:
  """The distinct (stripped) target strings of the first `limit` examples of `split`, sorted."""
  if split not in task.splits:
    raise ClassifierDataError(
        f"Cannot derive the labels of task '{task.name}': it has no '{split}' split; bind "
        'ClassifierModel.labels = [...] in gin.')
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False)
  key = 'targets_pretokenized' if 'targets_pretokenized' in ds.element_spec else 'targets'
  vocab = task.output_features['targets'].vocabulary
  found: set[str] = set()
  for value in ds.map(lambda ex: ex[key]).take(limit).as_numpy_iterator():
    text = value.decode('utf-8') if key == 'targets_pretokenized' else vocab.decode(value.tolist())
    found.add(text.strip())
    if len(found) > max_labels:
      raise ClassifierDataError(
          f"Task '{task.name}' has more than {max_labels} distinct targets: not a classification "
          'task. Bind ClassifierModel.labels = [...] or use ClassifierModel.regression = True.')
  return tuple(sorted(found))


def task_labels(mixture_or_task_name: str) -> tuple[str, ...]:
  """The label list of a task, or the union (first-seen order) over a mixture's tasks."""
  labels: list[str] = []
  for task in seqio.get_subtasks(seqio.get_mixture_or_task(mixture_or_task_name)):
    for label in postprocessor_labels(task) or scan_target_strings(task):
      if label not in labels:
        labels.append(label)
  if not labels:
    raise ClassifierDataError(f"Task '{mixture_or_task_name}' has no targets to take labels from.")
  return tuple(labels)


def _token_table(strings: Sequence[str], vocabulary: seqio.Vocabulary) -> np.ndarray:
  """Each string's tokens + EOS, zero-padded: [n, max_len + 1] int32."""
  encoded = [list(vocabulary.encode(s)) + [EOS_ID] for s in strings]
  table = np.zeros((len(encoded), max(len(e) for e in encoded)), np.int32)
  for row, ids in zip(table, encoded):
    row[:len(ids)] = ids
  return table


def label_token_table(labels: Sequence[str], vocabulary: seqio.Vocabulary) -> np.ndarray:
  """Target tokens of every label [n_labels, L] (what predict_batch emits for each label).

  Raises ClassifierDataError for a label the vocabulary cannot spell (its tokens decode to another
  string): such a prediction could never match its target.
  """
  for label in labels:
    decoded = vocabulary.decode(list(vocabulary.encode(label)))
    if decoded != label:
      raise ClassifierDataError(
          f'Label {label!r} does not survive the output vocabulary (it decodes as {decoded!r}); '
          'use a vocabulary that covers it or other label strings.')
  return _token_table(labels, vocabulary)


def regression_grid(low: float, high: float, step: float) -> tuple[np.ndarray, list[str]]:
  """The values low, low + step, ..., high and their strings (T5's STS-B: 0.2 steps, "3.2")."""
  if step <= 0 or high < low:
    raise ValueError(f'Regression grid needs step > 0 and high >= low, got {low}, {high}, {step}.')
  values = low + step * np.arange(int(round((high - low) / step)) + 1)
  decimals = max(0, -int(np.floor(np.log10(step) + 1e-9))) if step < 1 else 0
  if not np.isclose(round(step, decimals), step):
    decimals += 1
  return values.astype(np.float32), [f'{v:.{decimals}f}' for v in values]


# ------------------------------------------------------------------ sentence pairs
def split_pair(text: str, markers: Sequence[str] = DEFAULT_PAIR_MARKERS) -> tuple[str, str] | None:
  """(sentence A, sentence B) of a T5-format pair input, or None for a single sentence.

  The first marker (in `markers` order) that occurs after another field's name counts; A is the
  text before it (prefix and first field included), B the text after it.
  """
  for marker in markers:
    parts = text.split(' ' + marker, 1)
    if len(parts) == 2 and ':' in parts[0]:
      # ASCII whitespace only, as tf.strings.strip in `split_pair_tf` (str.strip also took
      # e.g. a no-break space, and the two disagreed).
      return parts[0].strip(ASCII_WHITESPACE), parts[1].strip(ASCII_WHITESPACE)
  return None


def split_pair_tf(text: tf.Tensor, markers: Sequence[str]) -> tuple[tf.Tensor, tf.Tensor,
                                                                     tf.Tensor]:
  """`split_pair` on a scalar tf.string: (A, B, found); without a marker (text, '', False)."""
  a, b, found = text, tf.constant(''), tf.constant(False)
  for marker in reversed(markers):  # earlier markers win: they are applied last
    parts = tf.concat([tf.strings.split(text, ' ' + marker, maxsplit=1), ['']], axis=0)
    hit = tf.logical_and(tf.size(parts) == 3,
                         tf.strings.regex_full_match(parts[0], '(?s).*:.*'))
    a = tf.where(hit, tf.strings.strip(parts[0]), a)
    b = tf.where(hit, tf.strings.strip(parts[1]), b)
    found = tf.logical_or(found, hit)
  return a, b, found


def task_is_pair(task: seqio.Task, markers: Sequence[str], num_examples: int = 16) -> bool:
  """Whether a task's inputs are sentence pairs, from its first examples (all or none must be)."""
  split = 'validation' if 'validation' in task.splits else list(task.splits)[0]
  ds = task.get_dataset(sequence_length=None, split=split, shuffle=False).take(num_examples)
  vocab = task.output_features['inputs'].vocabulary
  kinds = set()
  for ex in ds.as_numpy_iterator():
    text = (ex['inputs_pretokenized'].decode('utf-8') if 'inputs_pretokenized' in ex
            else vocab.decode(ex['inputs'].tolist()))
    kinds.add(split_pair(text, markers) is not None)
  if len(kinds) > 1:
    raise ClassifierDataError(
        f"Task '{task.name}': some inputs have a pair marker {list(markers)} and some do not; "
        'set ClassifierModel.pair_markers to the marker of its second sentence.')
  return kinds == {True}


# ------------------------------------------------------------------ the feature converter
def _fit(tokens: tf.Tensor, length: int) -> tf.Tensor:
  """Trims or zero-pads a 1-D sequence to `length`, with that static shape (the Evaluator reads it)."""
  tokens = tokens[:length]
  return tf.ensure_shape(tf.pad(tokens, [[0, length - tf.shape(tokens)[0]]]), [length])


class ClassifierFeatureConverter(seqio.FeatureConverter):
  """Text-to-text task features {inputs, targets} -> classifier features (module docstring).

  Never packs (one example per row); `pack` is accepted for the model API and ignored.
  """
  TASK_FEATURES = {'inputs': seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
                   'targets': seqio.FeatureConverter.FeatureSpec(dtype=tf.int32)}
  MODEL_FEATURES = {}  # per instance, see __init__
  PACKING_FEATURE_DTYPES = {}

  def __init__(self, pack: bool = False, *, input_vocabulary: seqio.Vocabulary,
               output_vocabulary: seqio.Vocabulary, labels: Sequence[str] | None = None,
               regression: bool = False, encoding: str = 'single',
               pair_markers: Sequence[str] = DEFAULT_PAIR_MARKERS,
               cls_id: int | None = None, sep_id: int | None = None,
               task_name: str = 'the task', strict: bool | None = None, **kwargs):
    del pack
    if encoding not in ENCODINGS:
      raise ValueError(f'Unknown pair encoding {encoding!r}; choose one of {ENCODINGS}.')
    if not regression and not labels:
      raise ValueError('ClassifierFeatureConverter needs labels (or regression=True).')
    if encoding == 'joint' and (cls_id is None or sep_id is None):
      raise ValueError("The 'joint' encoding needs cls_id and sep_id.")
    self.input_vocabulary, self.output_vocabulary = input_vocabulary, output_vocabulary
    self.labels, self.regression, self.encoding = tuple(labels or ()), regression, encoding
    self.pair_markers, self.cls_id, self.sep_id = tuple(pair_markers), cls_id, sep_id
    self.task_name, self.strict = task_name, strict
    spec = seqio.FeatureConverter.FeatureSpec
    self.MODEL_FEATURES = {'encoder_input_tokens': spec(dtype=tf.int32)}
    if encoding == 'separate':
      self.MODEL_FEATURES['encoder_pair_tokens'] = spec(dtype=tf.int32)
    if encoding == 'joint':
      self.MODEL_FEATURES['encoder_token_types'] = spec(dtype=tf.int32)
    self.MODEL_FEATURES[self.target_feature] = spec(dtype=tf.float32 if regression else tf.int32)
    super().__init__(pack=False, **kwargs)

  @property
  def target_feature(self) -> str:
    return REGRESSION_FEATURE if self.regression else LABEL_FEATURE

  def get_model_feature_lengths(self, task_feature_lengths):
    length = task_feature_lengths['inputs']
    return {k: (1 if k == self.target_feature else length) for k in self.MODEL_FEATURES}

  def _convert_features(self, ds: tf.data.Dataset, task_feature_lengths) -> tf.data.Dataset:
    length = task_feature_lengths['inputs']
    strict = self.strict
    if strict is None:  # a training stream repeats forever; evaluation reads one epoch
      strict = int(ds.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    spec = ds.element_spec
    table = None
    if not self.regression:
      table = tf.lookup.StaticHashTable(
          tf.lookup.KeyValueTensorInitializer(tf.constant(self.labels),
                                              tf.range(len(self.labels), dtype=tf.int32)), -1)

    def text(ex, feature, vocab):
      if f'{feature}_pretokenized' in spec:
        return ex[f'{feature}_pretokenized']
      return vocab.decode_tf(ex[feature])

    def convert(ex):
      out = {}
      if self.encoding == 'single':
        out['encoder_input_tokens'] = _fit(ex['inputs'], length)
      else:
        a, b, _ = split_pair_tf(text(ex, 'inputs', self.input_vocabulary), self.pair_markers)
        tokens_a = tf.cast(self.input_vocabulary.encode_tf(a), tf.int32)
        tokens_b = tf.cast(self.input_vocabulary.encode_tf(b), tf.int32)
        if self.encoding == 'separate':
          eos = tf.constant([EOS_ID], tf.int32)
          out['encoder_input_tokens'] = _fit(tf.concat([tokens_a, eos], 0), length)
          out['encoder_pair_tokens'] = _fit(tf.concat([tokens_b, eos], 0), length)
        else:
          out['encoder_input_tokens'], out['encoder_token_types'] = self._joint(
              tokens_a, tokens_b, length)
      target = tf.strings.strip(text(ex, 'targets', self.output_vocabulary))
      if self.regression:
        is_number = tf.strings.regex_full_match(target, r'[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?')
        value = tf.where(is_number, tf.strings.to_number(tf.where(is_number, target, '0')),
                         float('nan'))
        ok, out[REGRESSION_FEATURE] = is_number, tf.reshape(value, [1])
        what = 'is not a number'
      else:
        label = table.lookup(target)
        ok, out[LABEL_FEATURE] = label >= 0, tf.reshape(label, [1])
        what = f'is not one of the labels {list(self.labels)}'
      if strict:
        check = tf.debugging.Assert(ok, [
            f"ClassifierModel: a training target of '{self.task_name}'", target,
            what + '. Fix the data or ClassifierModel.labels.'])
        with tf.control_dependencies([check]):
          out = {k: tf.identity(v) for k, v in out.items()}
      return out

    return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

  def _joint(self, tokens_a: tf.Tensor, tokens_b: tf.Tensor,
             length: int) -> tuple[tf.Tensor, tf.Tensor]:
    """[CLS] A [SEP] B [SEP] with token types 0 (CLS, A, first SEP) and 1 (B, last SEP); without a
    B, [CLS] A [SEP]. The longer sentence is truncated first to fit `length`."""
    has_b = tf.size(tokens_b) > 0
    budget = length - 2 - tf.cast(has_b, tf.int32)
    len_a, len_b = tf.size(tokens_a), tf.size(tokens_b)
    keep_a = tf.minimum(len_a, tf.maximum(budget - len_b, budget // 2))
    keep_b = tf.minimum(len_b, budget - keep_a)
    cls, sep = tf.constant([self.cls_id], tf.int32), tf.constant([self.sep_id], tf.int32)
    part_b = tf.cond(has_b, lambda: tf.concat([tokens_b[:keep_b], sep], 0),
                     lambda: tf.zeros([0], tf.int32))
    first = tf.concat([cls, tokens_a[:keep_a], sep], 0)
    tokens = tf.concat([first, part_b], 0)
    types = tf.concat([tf.zeros_like(first), tf.ones_like(part_b)], 0)
    return _fit(tokens, length), _fit(types, length)
