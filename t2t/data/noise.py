"""Noise for the T5 denoising objectives (T5 paper §3.3, Table 3): masks, and how to apply them.

Two kinds of functions, kept apart so that a test can pin an objective's output with a
hand-written mask:

- mask generators `fn(length, noise_density, seeds) -> bool [length]`: True marks a token that
  the objective corrupts. `seeds` is a sequence of stateless seeds (each an int pair, as
  `seqio.map_over_dataset(num_seeds=...)` passes them): the same seeds give the same mask on every
  machine;
- token functions `fn(tokens, noise_mask, vocabulary, seeds) -> int32 [n']`, pure in
  (tokens, noise_mask) except for the documented random draws (BERT's random tokens, deshuffling).

Sentinels are numbered down from the top of the vocabulary, as in T5: the j-th noise span of an
example gets `vocabulary.vocab_size - 1 - j` (`<extra_id_j>` with seqio's extra ids).
"""
from __future__ import annotations

from typing import Optional, Sequence

import seqio
import tensorflow as tf

Seeds = Sequence[tf.Tensor]

# The mask generators and token functions below build their graphs from tf ops, with tf.cond
# where a branch depends on a tensor, so AutoGraph has nothing to rewrite: marked `graph_only`,
# tf.data's map calls them as they are instead of converting their source in every process (most
# of the ~0.8 s this saves a span-corruption pipeline's start-up). A user's own mask or token
# function passed to `objectives.denoise` is still converted as usual.
graph_only = tf.autograph.experimental.do_not_convert


# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def validate_noise_density(noise_density: float) -> None:
  """Raises ValueError unless `noise_density` is in (0, 1)."""
  if not 0 < noise_density < 1:
    raise ValueError(f"noise_density must be in (0, 1), got {noise_density}.")


def validate_mean_noise_span_length(mean_noise_span_length: float) -> None:
  """Raises ValueError unless the mean noise-span length is at least 1 token."""
  if not mean_noise_span_length >= 1:
    raise ValueError(f"mean_noise_span_length must be >= 1, got {mean_noise_span_length}.")


def as_seed(seed) -> tf.Tensor:
  """A stateless seed as an int64 `[2]` tensor (accepts a pair of scalars or a `[2]` tensor)."""
  return tf.cast(tf.convert_to_tensor(seed), tf.int64)


# ----------------------------------------------------------------------------------------------
# Mask generators: fn(length, noise_density, seeds) -> bool [length]
# ----------------------------------------------------------------------------------------------


@graph_only
def random_segmentation(num_items: tf.Tensor, num_segments: tf.Tensor, seed) -> tf.Tensor:
  """Splits `num_items` items into `num_segments` non-empty runs, uniformly over all such splits.

  Picks `num_segments - 1` distinct cut points among the `num_items - 1` gaps (the gaps with the
  largest random keys), so every composition of `num_items` into positive parts is equally likely.

  Args:
    num_items: int32 scalar >= num_segments.
    num_segments: int32 scalar >= 1.
    seed: stateless seed.

  Returns:
    int32 `[num_segments]` of positive run lengths summing to `num_items`.
  """
  num_items = tf.cast(num_items, tf.int32)
  num_segments = tf.cast(num_segments, tf.int32)
  keys = tf.random.stateless_uniform([tf.maximum(num_items - 1, 0)], seed=as_seed(seed))
  cuts = tf.sort(tf.math.top_k(keys, k=num_segments - 1, sorted=False).indices + 1)
  edges = tf.concat([[0], cuts, [num_items]], axis=0)
  return edges[1:] - edges[:-1]


@graph_only
def random_spans_counts(
    length: tf.Tensor, noise_density: float, mean_noise_span_length: float
) -> tuple[tf.Tensor, tf.Tensor]:
  """Returns (num_noise_tokens, num_noise_spans) of a random-spans mask over `length` tokens.

  Rounded as in the paper's length arithmetic (float64, half to even, like Python's `round`);
  for `length >= 2` there is at least one noise and one kept token, and at most as many spans as
  kept tokens (so that spans stay separated).
  """
  length = tf.cast(length, tf.int32)
  num_noise = tf.cast(tf.round(tf.cast(length, tf.float64) * noise_density), tf.int32)
  num_noise = tf.clip_by_value(num_noise, 1, tf.maximum(length - 1, 1))
  num_spans = tf.cast(
      tf.round(tf.cast(num_noise, tf.float64) / mean_noise_span_length), tf.int32)
  num_spans = tf.clip_by_value(num_spans, 1, tf.maximum(length - num_noise, 1))
  return num_noise, num_spans


def random_spans_counts_py(
    length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
  """`random_spans_counts` in plain Python, with the mask's `length < 2` case: (0, 0) there.

  The length arithmetic (`objectives.random_spans_helper`) and the sentinel budget use this, so
  that they count exactly the tokens the TF mask will corrupt (clipping included: at an extreme
  density or span length the unclipped count is off, and the inputs outgrew their length).
  """
  if length < 2:
    return 0, 0
  num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
  num_spans = min(max(int(round(num_noise / mean_noise_span_length)), 1), length - num_noise)
  return num_noise, num_spans


@graph_only
def random_spans_noise_mask(
    length: tf.Tensor, noise_density: float, seeds: Seeds, mean_noise_span_length: float = 3.0
) -> tf.Tensor:
  """The span-corruption mask: noise in spans of random lengths, with exact rate and mean.

  `round(length * noise_density)` noise tokens are split into `round(num_noise / mean)` spans of
  random positive lengths, the other tokens into as many kept runs, and the two are interleaved
  starting with a kept run (so the first token is always kept).

  Documented edge cases: `length == 0` gives an empty mask; `length == 1` gives `[False]` (one
  token cannot be split into a kept and a corrupted part).

  Args:
    length: int32 scalar, number of tokens.
    noise_density: fraction of tokens to corrupt, in (0, 1).
    seeds: two stateless seeds (noise-span lengths, kept-run lengths).
    mean_noise_span_length: mean span length, >= 1.

  Returns:
    bool `[length]`.
  """
  validate_noise_density(noise_density)
  validate_mean_noise_span_length(mean_noise_span_length)
  length = tf.cast(length, tf.int32)

  def mask_of_at_least_two_tokens():
    num_noise, num_spans = random_spans_counts(length, noise_density, mean_noise_span_length)
    noise_lengths = random_segmentation(num_noise, num_spans, seeds[0])
    kept_lengths = random_segmentation(length - num_noise, num_spans, seeds[1])
    run_lengths = tf.reshape(tf.stack([kept_lengths, noise_lengths], axis=1), [-1])  # [2 * spans]
    return tf.repeat(tf.tile([False, True], [num_spans]), run_lengths)

  return tf.cond(length >= 2, mask_of_at_least_two_tokens, lambda: tf.zeros([length], tf.bool))


@graph_only
def iid_noise_mask(length: tf.Tensor, noise_density: float, seeds: Seeds) -> tf.Tensor:
  """Each token independently corrupted with probability `noise_density` (T5's i.i.d. objectives).

  Args:
    length: int32 scalar.
    noise_density: probability in (0, 1).
    seeds: one stateless seed.

  Returns:
    bool `[length]`.
  """
  validate_noise_density(noise_density)
  draws = tf.random.stateless_uniform([tf.cast(length, tf.int32)], seed=as_seed(seeds[0]))
  return draws < noise_density


@graph_only
def random_prefix_noise_mask(length: tf.Tensor, noise_density: float, seeds: Seeds) -> tf.Tensor:
  """Marks a suffix as noise; the split point is uniform (T5's prefix LM objective).

  The prefix keeps between 1 and `length - 1` tokens (for `length >= 2`), so inputs and targets
  are both non-empty. `noise_density` is unused (the split is uniform, on average half the
  tokens); it is kept for the common signature. `length < 2` gives an all-False mask.

  Returns:
    bool `[length]`, False on the prefix and True on the suffix.
  """
  del noise_density
  length = tf.cast(length, tf.int32)
  split = tf.random.stateless_uniform(
      [], seed=as_seed(seeds[0]), minval=1, maxval=tf.maximum(length, 2), dtype=tf.int32)
  return tf.range(length) >= tf.where(length >= 2, split, length)


@graph_only
def all_noise_mask(length: tf.Tensor, noise_density: float, seeds: Seeds) -> tf.Tensor:
  """Every token is "noise" (deshuffling corrupts the whole sequence): bool `[length]`."""
  del noise_density, seeds
  return tf.ones([tf.cast(length, tf.int32)], tf.bool)


# ----------------------------------------------------------------------------------------------
# Token functions: fn(tokens, noise_mask, vocabulary, seeds) -> int32 [n']
# ----------------------------------------------------------------------------------------------


def _span_starts(noise_mask: tf.Tensor) -> tf.Tensor:
  """bool [n]: True where a run of noise tokens begins."""
  previous = tf.concat([[False], noise_mask[:-1]], axis=0)
  return tf.logical_and(noise_mask, tf.logical_not(previous))


def sentinel_id(span_index, vocabulary: seqio.Vocabulary) -> tf.Tensor:
  """Sentinel of the j-th span: `vocab_size - 1 - j` (`<extra_id_j>`); int32, same shape as j."""
  return tf.cast(vocabulary.vocab_size - 1 - span_index, tf.int32)


def _assert_enough_sentinels(num_needed: tf.Tensor, vocabulary: seqio.Vocabulary) -> tf.Operation:
  extra_ids = int(getattr(vocabulary, "extra_ids", 0) or 0)
  return tf.debugging.assert_less_equal(
      tf.cast(num_needed, tf.int32),
      tf.constant(extra_ids, tf.int32),
      message=(
          f"An example needs more sentinels than the vocabulary's extra_ids={extra_ids}: lower "
          "noise_density, raise mean_noise_span_length, shorten the sequence, or use more "
          "extra_ids."))


@graph_only
def noise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: seqio.Vocabulary, seeds=None
) -> tf.Tensor:
  """Each run of noise tokens becomes one sentinel, in order (inputs of the span objectives).

  "Thank you [for inviting] me to your party [last] week ." -> "Thank you <X> me to your party
  <Y> week ."

  Args:
    tokens: int32 [n].
    noise_mask: bool [n].
    vocabulary: supplies `vocab_size` (sentinels count down from the top) and `extra_ids`.
    seeds: unused; common signature.

  Returns:
    int32 [n - num_noise + num_spans].

  Raises:
    tf.errors.InvalidArgumentError: when there are more spans than `vocabulary.extra_ids`.
  """
  del seeds
  starts = _span_starts(noise_mask)
  span_index = tf.cumsum(tf.cast(starts, tf.int32)) - 1
  check = _assert_enough_sentinels(tf.reduce_sum(tf.cast(starts, tf.int32)), vocabulary)
  with tf.control_dependencies([check]):
    replaced = tf.where(starts, sentinel_id(span_index, vocabulary), tf.cast(tokens, tf.int32))
  keep = tf.logical_or(tf.logical_not(noise_mask), starts)
  return tf.boolean_mask(replaced, keep)


@graph_only
def noise_spans_to_targets(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    vocabulary: seqio.Vocabulary,
    seeds=None,
    final_sentinel: bool = True,
) -> tf.Tensor:
  """Each noise span introduced by its sentinel, then a final sentinel (targets of span objectives).

  "Thank you [for inviting] me to your party [last] week ." -> "<X> for inviting <Y> last <Z>"
  (T5 paper §3.1.4: "plus a final sentinel token to mark the end of the output sequence").

  Args:
    tokens: int32 [n].
    noise_mask: bool [n].
    vocabulary: as for `noise_span_to_unique_sentinel`.
    seeds: unused; common signature.
    final_sentinel: append the closing sentinel (False gives the ref. code's format).

  Returns:
    int32 [num_noise + num_spans + final_sentinel].
  """
  del seeds
  starts = _span_starts(noise_mask)
  num_spans = tf.reduce_sum(tf.cast(starts, tf.int32))
  check = _assert_enough_sentinels(num_spans + int(final_sentinel), vocabulary)
  span_index = tf.cumsum(tf.cast(starts, tf.int32)) - 1
  # Each position contributes [its sentinel if a span starts here, its token if it is noise].
  pairs = tf.stack([sentinel_id(span_index, vocabulary), tf.cast(tokens, tf.int32)], axis=1)
  valid = tf.stack([starts, noise_mask], axis=1)
  with tf.control_dependencies([check]):
    targets = tf.boolean_mask(tf.reshape(pairs, [-1]), tf.reshape(valid, [-1]))
  if final_sentinel:
    targets = tf.concat([targets, [sentinel_id(num_spans, vocabulary)]], axis=0)
  return targets


@graph_only
def drop_noise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary=None, seeds=None) -> tf.Tensor:
  """Keeps the kept tokens: int32 [n - num_noise] (inputs of "drop tokens" and prefix LM)."""
  del vocabulary, seeds
  return tf.boolean_mask(tf.cast(tokens, tf.int32), tf.logical_not(noise_mask))


@graph_only
def drop_nonnoise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary=None, seeds=None) -> tf.Tensor:
  """Keeps the noise tokens: int32 [num_noise] (targets of "drop tokens" and prefix LM)."""
  del vocabulary, seeds
  return tf.boolean_mask(tf.cast(tokens, tf.int32), noise_mask)


@graph_only
def keep_all_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary=None, seeds=None) -> tf.Tensor:
  """The original text: int32 [n] (targets of the BERT-style, MASS-style and deshuffling objectives)."""
  del noise_mask, vocabulary, seeds
  return tf.cast(tokens, tf.int32)


def default_mask_id(vocabulary: seqio.Vocabulary) -> int:
  """The `<M>` token of the BERT- and MASS-style objectives: the top sentinel, `<extra_id_0>`.

  SentencePiece vocabularies in the T5 idiom have no dedicated mask piece; the top sentinel
  (which these objectives do not otherwise use) plays that role.
  """
  if not getattr(vocabulary, "extra_ids", 0):
    raise ValueError(
        "The BERT/MASS-style objectives need a mask token: give the vocabulary extra_ids >= 1 "
        "or pass mask_token_id explicitly.")
  return vocabulary.vocab_size - 1


@graph_only
def mask_noise_tokens(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    mask_id: int,
    random_token_mask: Optional[tf.Tensor] = None,
    random_tokens: Optional[tf.Tensor] = None,
) -> tf.Tensor:
  """Replaces each noise token by `mask_id`, or by `random_tokens` where `random_token_mask`.

  MASS-style: no random tokens. BERT-style: `random_token_mask` marks ~10% of the noise tokens.
  "Thank you [for inviting] me to your party [last] week ." with "last" random ->
  "Thank you <M> <M> me to your party apple week ."

  Args:
    tokens: int32 [n].
    noise_mask: bool [n].
    mask_id: the `<M>` id.
    random_token_mask: bool [n] or None; only its positions inside `noise_mask` matter.
    random_tokens: int32 [n] replacement ids used where `random_token_mask`.

  Returns:
    int32 [n].
  """
  tokens = tf.cast(tokens, tf.int32)
  replacement = tf.fill(tf.shape(tokens), tf.constant(mask_id, tf.int32))
  if random_token_mask is not None:
    if random_tokens is None:
      raise ValueError("mask_noise_tokens: random_token_mask needs random_tokens.")
    replacement = tf.where(random_token_mask, tf.cast(random_tokens, tf.int32), replacement)
  return tf.where(noise_mask, replacement, tokens)


def random_token_range(vocabulary: seqio.Vocabulary) -> tuple[int, int]:
  """[low, high) of ordinary token ids: above pad/eos/unk, below the sentinels."""
  specials = [i for i in (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) if i is not None]
  low = max(specials) + 1 if specials else 0
  high = vocabulary.vocab_size - int(getattr(vocabulary, "extra_ids", 0) or 0)
  if high <= low:
    raise ValueError(f"The vocabulary has no ordinary tokens to draw from (ids [{low}, {high})).")
  return low, high


@graph_only
def bert_style_inputs(
    tokens: tf.Tensor,
    noise_mask: tf.Tensor,
    vocabulary: seqio.Vocabulary,
    seeds: Seeds,
    random_token_rate: float = 0.1,
    mask_token_id: Optional[int] = None,
) -> tf.Tensor:
  """BERT-style corruption: each noise token becomes `<M>` (90%) or a random token (10%).

  The random tokens are drawn uniformly from `random_token_range(vocabulary)`.

  Args:
    tokens: int32 [n].
    noise_mask: bool [n].
    vocabulary: supplies the mask token (`default_mask_id`) and the random-token range.
    seeds: one stateless seed.
    random_token_rate: share of noise tokens replaced by a random token instead of `<M>`.
    mask_token_id: the `<M>` id; None means `default_mask_id(vocabulary)`.

  Returns:
    int32 [n].
  """
  if not 0 <= random_token_rate <= 1:
    raise ValueError(f"random_token_rate must be in [0, 1], got {random_token_rate}.")
  mask_id = default_mask_id(vocabulary) if mask_token_id is None else mask_token_id
  low, high = random_token_range(vocabulary)
  choice_seed, token_seed = tf.unstack(tf.random.experimental.stateless_split(as_seed(seeds[0]), 2))
  n = tf.size(tokens)
  random_token_mask = tf.random.stateless_uniform([n], seed=choice_seed) < random_token_rate
  random_tokens = tf.random.stateless_uniform(
      [n], seed=token_seed, minval=low, maxval=high, dtype=tf.int32)
  return mask_noise_tokens(tokens, noise_mask, mask_id, random_token_mask, random_tokens)


@graph_only
def permute_tokens(tokens: tf.Tensor, permutation: tf.Tensor) -> tf.Tensor:
  """`tokens[permutation]`: int32 [n] (deshuffling's inputs, given the permutation)."""
  return tf.gather(tf.cast(tokens, tf.int32), permutation)


@graph_only
def shuffle_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary=None, seeds=None) -> tf.Tensor:
  """Deshuffling's inputs: the tokens in a uniformly random order (seeded); mask and vocab unused."""
  del noise_mask, vocabulary
  keys = tf.random.stateless_uniform([tf.size(tokens)], seed=as_seed(seeds[0]))
  return permute_tokens(tokens, tf.argsort(keys))
