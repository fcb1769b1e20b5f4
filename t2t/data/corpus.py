"""Document plumbing for pre-training corpora: chunk, concatenate, split, truncate, repeat.

The seqio preprocessors here prepare tokenized documents (int32 `targets`) for the objectives
in `t2t.data.objectives`, and implement the data-size study of T5 Table 9 (`truncate_corpus`,
`repeat_corpus`).
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

import gin
import seqio
import tensorflow as tf

from t2t.data import noise

OutputFeatures = Mapping[str, seqio.Feature]


def required_length(sequence_length: Optional[Mapping[str, int]], key: str, who: str) -> int:
  """`sequence_length[key]`, or a clear error naming the preprocessor `who` that needs it."""
  if not sequence_length or sequence_length.get(key) is None:
    raise ValueError(
        f"{who} needs sequence_length[{key!r}] (e.g. TASK_FEATURE_LENGTHS = {{'{key}': 512, ...}}), "
        f"got {sequence_length!r}.")
  length = int(sequence_length[key])
  if length < 2:
    raise ValueError(f"{who}: sequence_length[{key!r}] must be >= 2 (a token and EOS), got {length}.")
  return length



@gin.configurable
def select_random_chunk(
    dataset: tf.data.Dataset,
    output_features: Optional[OutputFeatures] = None,
    max_length: int = 65536,
    feature_key: str = "targets",
    passthrough_feature_keys: Optional[Sequence[str]] = None,
) -> tf.data.Dataset:
  """Drops empty documents and keeps one random `max_length`-aligned chunk of each longer one.

  Args:
    dataset: examples with an int32 [n] `feature_key`.
    output_features: unused (seqio injects it); kept for the preprocessor signature.
    max_length: chunk size in tokens.
    feature_key: the token feature to chunk.
    passthrough_feature_keys: other features copied unchanged; all others are dropped.

  Returns:
    examples {feature_key: int32 [<= max_length], *passthrough}.
  """
  del output_features
  if max_length < 1:
    raise ValueError(f"max_length must be >= 1, got {max_length}.")
  dataset = dataset.filter(lambda x: tf.size(x[feature_key]) > 0)

  @seqio.map_over_dataset(num_seeds=1)
  @noise.graph_only
  def chunk(features, seed):
    tokens = features[feature_key]
    num_chunks = (tf.size(tokens) + max_length - 1) // max_length
    start = max_length * tf.random.stateless_uniform(
        [], seed=noise.as_seed(seed), maxval=num_chunks, dtype=tf.int32)
    out = {k: features[k] for k in passthrough_feature_keys or ()}
    out[feature_key] = tokens[start:start + max_length]
    return out

  return chunk(dataset)


@gin.configurable
def reduce_concat_tokens(
    dataset: tf.data.Dataset, feature_key: str = "targets", batch_size: int = 128
) -> tf.data.Dataset:
  """Concatenates the tokens of `batch_size` consecutive examples into one (less padding).

  Returns:
    examples {feature_key: int32 [sum of up to batch_size lengths]}; other features are dropped.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  tokens = dataset.map(lambda x: x[feature_key], num_parallel_calls=tf.data.AUTOTUNE)
  return tokens.ragged_batch(batch_size).map(lambda rt: {feature_key: rt.flat_values})


@gin.configurable
def split_tokens(
    dataset: tf.data.Dataset,
    max_tokens_per_segment: int,
    min_tokens_per_segment: Optional[int] = None,
    feature_key: str = "targets",
    passthrough_feature_keys: Optional[Sequence[str]] = None,
) -> tf.data.Dataset:
  """Splits each example's tokens into consecutive segments of `max_tokens_per_segment` (last shorter).

  With `min_tokens_per_segment`, each document draws one segment length uniformly from
  [min, max] (seeded, so deterministic under seqio's seeds).

  Returns:
    one example per segment, {feature_key: int32 [<= max_tokens_per_segment], *passthrough}.
  """
  if max_tokens_per_segment < 1:
    raise ValueError(f"max_tokens_per_segment must be >= 1, got {max_tokens_per_segment}.")
  if min_tokens_per_segment is not None and not 1 <= min_tokens_per_segment <= max_tokens_per_segment:
    raise ValueError(f"min_tokens_per_segment must be in [1, {max_tokens_per_segment}], "
                     f"got {min_tokens_per_segment}.")

  @seqio.map_over_dataset(num_seeds=1)
  @noise.graph_only
  def to_segments(features, seed):
    tokens = features[feature_key]
    if min_tokens_per_segment is None:
      length = tf.constant(max_tokens_per_segment, tf.int32)
    else:
      length = tf.random.stateless_uniform(
          [], seed=noise.as_seed(seed), minval=min_tokens_per_segment,
          maxval=max_tokens_per_segment + 1, dtype=tf.int32)
    n = tf.size(tokens)
    num_segments = tf.maximum((n + length - 1) // length, 1)
    row_lengths = tf.minimum(length, n - length * tf.range(num_segments))
    out = {feature_key: tf.RaggedTensor.from_row_lengths(tokens, row_lengths)}
    for key in passthrough_feature_keys or ():
      out[key] = tf.repeat(tf.expand_dims(features[key], 0), num_segments, axis=0)
    return out

  return to_segments(dataset).unbatch()


@gin.configurable
def split_tokens_to_inputs_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    feature_key: str = "targets",
    input_feature_key: str = "inputs",
) -> tf.data.Dataset:
  """`split_tokens` into segments that fill `sequence_length[input_feature_key]` (minus EOS)."""
  length = required_length(sequence_length, input_feature_key, "split_tokens_to_inputs_length")
  if output_features[input_feature_key].add_eos:
    length -= 1
  return split_tokens(dataset, max_tokens_per_segment=length, feature_key=feature_key)


def segments(dataset: tf.data.Dataset, segment_length: int, merge: bool) -> tf.data.Dataset:
  """Documents -> one random chunk each -> (concatenated) -> segments of `segment_length`."""
  dataset = select_random_chunk(dataset, feature_key="targets")
  if merge:
    dataset = reduce_concat_tokens(dataset, feature_key="targets")
  return split_tokens(dataset, max_tokens_per_segment=segment_length, feature_key="targets")


@gin.configurable
def truncate_corpus(
    dataset: tf.data.Dataset, max_tokens: int, feature_key: str = "targets"
) -> tf.data.Dataset:
  """Keeps the first `max_tokens` tokens of the corpus, in order (T5 Table 9's data-size study).

  Examples pass whole until the budget is reached; the one that crosses it is cut; iteration stops
  there (so it also bounds an infinite dataset). Put it after tokenization and before the
  objective, on an unshuffled source, so that every epoch sees the same subset.

  Returns:
    examples whose `feature_key` lengths sum to min(max_tokens, corpus size).
  """
  if max_tokens < 1:
    raise ValueError(f"max_tokens must be >= 1, got {max_tokens}.")

  def step(used, example):
    n = tf.cast(tf.size(example[feature_key]), tf.int64)
    keep = tf.minimum(n, tf.maximum(max_tokens - used, 0))
    out = dict(example)
    out[feature_key] = example[feature_key][:keep]
    return used + keep, (used, out)

  dataset = dataset.scan(tf.constant(0, tf.int64), step)
  dataset = dataset.take_while(lambda used, _: used < max_tokens).map(lambda _, ex: ex)
  return dataset.filter(lambda ex: tf.size(ex[feature_key]) > 0)


@gin.configurable
def repeat_corpus(dataset: tf.data.Dataset, num_repeats: int) -> tf.data.Dataset:
  """Repeats the (truncated) corpus `num_repeats` times, in the same order (T5 Table 9)."""
  if num_repeats < 1:
    raise ValueError(f"num_repeats must be >= 1, got {num_repeats}.")
  return dataset.repeat(num_repeats)
