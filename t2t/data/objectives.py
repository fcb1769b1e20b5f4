"""T5's unsupervised objectives as seqio preprocessors (T5 paper §3.3, Tables 3-9).

Every objective here is a `@gin.configurable` seqio preprocessor, usable in any user's `Task`
after `seqio.preprocessors.tokenize` (document tokens in `targets`) and followed by
`seqio.preprocessors.append_eos_after_trim` (this module never adds EOS). Table 3 of the paper,
row by row ("Thank you for inviting me to your party last week ."):

| objective               | preprocessor               | inputs / targets                          |
|-------------------------|----------------------------|-------------------------------------------|
| Prefix LM               | `prefix_lm`                | a random prefix / the rest                |
| BERT-style              | `bert_style`               | 15%: 90% `<M>`, 10% random / original     |
| Deshuffling             | `deshuffling`              | shuffled tokens / original                |
| MASS-style              | `mass_style`               | 15% `<M>` / original                      |
| i.i.d. noise, replace   | `iid_noise_replace_spans`  | sentinel per noise run / spans + final    |
| i.i.d. noise, drop      | `iid_noise_drop_tokens`    | noise dropped / the dropped tokens        |
| Random spans            | `span_corruption`          | sentinel per span / spans + final         |

plus `full_lm` (no inputs), the decoder-only / prefix-LM text formats for supervised tasks
(`decoder_only_text_format`, `prefix_lm_text_format`: "... target: ..."), and the data-size study's
`truncate_corpus` / `repeat_corpus` (Table 9, in `t2t.data.corpus` with the other document
plumbing). The masks and the pure token functions they apply live in `t2t.data.noise`.

Randomness comes from `seqio.map_over_dataset(num_seeds=...)` and stateless ops: a Task's
output is deterministic under seqio's seeds (`get_dataset(..., seed=...)`).
"""
from __future__ import annotations

import functools
from typing import Callable, Mapping, Optional

import gin
import seqio
import tensorflow as tf

from t2t.data import corpus, noise

OutputFeatures = Mapping[str, seqio.Feature]
NoiseMaskFn = Callable[..., tf.Tensor]
TokenFn = Callable[..., tf.Tensor]

# ----------------------------------------------------------------------------------------------
# Length arithmetic
# ----------------------------------------------------------------------------------------------


def _span_corruption_lengths(
    raw_length: int, noise_density: float, mean_noise_span_length: float, extra_in: int,
    extra_tgt: int) -> tuple[int, int]:
  """(inputs_length, targets_length), EOS included, of span corruption over `raw_length` tokens.

  Counts as the mask does (`noise.random_spans_counts_py`, clipping included). Both lengths are
  non-decreasing in `raw_length`, so a shorter (last) segment never outgrows a full one.
  """
  num_noise, num_spans = noise.random_spans_counts_py(
      raw_length, noise_density, mean_noise_span_length)
  inputs_length = raw_length - num_noise + num_spans * extra_in + 1
  targets_length = num_noise + num_spans * extra_tgt + 1
  return inputs_length, targets_length


def random_spans_helper(
    inputs_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
  """How many raw tokens to corrupt so that the inputs come out exactly `inputs_length` long.

  The paper's length arithmetic (ref. code `random_spans_helper`): the inputs keep the non-noise
  tokens plus one sentinel per span plus EOS; the targets hold the noise tokens plus one sentinel
  per span plus EOS. Returns the largest raw length whose inputs fit, and the targets length at
  that raw length. E.g. 512 at (0.15, 3) -> (568, 114). At noise density 0.5 the targets are
  trimmed to the inputs length (766 -> 512/512), the round number people ask for.

  The counts are the mask's own (`noise.random_spans_counts_py`): at least one noise token and
  one span, at most as many spans as kept tokens. The reference code's unclipped counts let the
  inputs outgrow `inputs_length` at an extreme span length or a short length (e.g. 20 at
  (0.15, 30) gave 21 inputs tokens).

  t2t's span-corruption targets also end with the paper's final sentinel, one token more than
  this count; `span_corruption_feature_lengths` gives the lengths a task really fills.

  Args:
    inputs_length: desired inputs length, EOS included.
    noise_density: fraction of raw tokens corrupted, in (0, 1).
    mean_noise_span_length: mean span length, >= 1.
    extra_tokens_per_span_inputs: tokens per span in the inputs (the sentinel).
    extra_tokens_per_span_targets: tokens per span in the targets (the sentinel).

  Returns:
    (raw_tokens_length, targets_length).
  """
  noise.validate_noise_density(noise_density)
  noise.validate_mean_noise_span_length(mean_noise_span_length)
  if inputs_length < 2:
    raise ValueError(f"inputs_length must be >= 2 (a token and EOS), got {inputs_length}.")

  def lengths(raw: int) -> tuple[int, int]:
    return _span_corruption_lengths(raw, noise_density, mean_noise_span_length,
                                    extra_tokens_per_span_inputs, extra_tokens_per_span_targets)

  # The inputs length is non-decreasing in the raw length and at most raw + 1: raw =
  # inputs_length - 1 fits. Double until a raw length does not fit, then bisect (a plain scan
  # takes ~inputs_length / (1 - noise_density) steps, too many for a density close to 1).
  fits, too_long = inputs_length - 1, 2 * inputs_length
  while lengths(too_long)[0] <= inputs_length:
    fits, too_long = too_long, 2 * too_long
  while too_long - fits > 1:
    middle = (fits + too_long) // 2
    if lengths(middle)[0] <= inputs_length:
      fits = middle
    else:
      too_long = middle
  raw = fits
  _, targets_length = lengths(raw)
  if noise_density == 0.5:
    while raw > 1 and targets_length > inputs_length:
      raw -= 1
      targets_length = lengths(raw)[1]
  return raw, targets_length


@gin.configurable
def span_corruption_feature_lengths(
    inputs_length: int = 512,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    final_sentinel: bool = False,
) -> dict[str, int]:
  """The `TASK_FEATURE_LENGTHS` that `span_corruption` fills exactly (EOS included).

  E.g. 512 at (0.15, 3) -> {"inputs": 512, "targets": 114}, the paper's figures; 115 with
  `final_sentinel=True`.
  """
  _, targets_length = random_spans_helper(inputs_length, noise_density, mean_noise_span_length)
  return {"inputs": inputs_length, "targets": targets_length + int(final_sentinel)}


# ----------------------------------------------------------------------------------------------
# The generic denoiser
# ----------------------------------------------------------------------------------------------


def denoise(
    dataset: tf.data.Dataset,
    output_features: OutputFeatures,
    noise_density: float,
    noise_mask_fn: NoiseMaskFn,
    inputs_fn: TokenFn,
    targets_fn: Optional[TokenFn] = None,
    input_feature_key: str = "inputs",
    target_feature_key: str = "targets",
) -> tf.data.Dataset:
  """Builds (inputs, targets) from the tokens in `target_feature_key` with a noise mask.

  `noise_mask_fn(length, noise_density, seeds=...)` draws the mask; `inputs_fn` and `targets_fn`
  (`fn(tokens, noise_mask, vocabulary, seeds)`, see `t2t.data.noise`) turn tokens and mask into
  the two sequences (`targets_fn=None` keeps the original tokens). Other features pass through.

  Returns:
    examples with `input_feature_key` and `target_feature_key` int32 [variable].
  """
  vocabulary = output_features[target_feature_key].vocabulary
  if input_feature_key in output_features:
    input_vocab = output_features[input_feature_key].vocabulary
    if input_vocab.vocab_size != vocabulary.vocab_size:
      raise ValueError(
          f"denoise needs one vocabulary for {input_feature_key!r} and {target_feature_key!r} "
          f"(sentinels must mean the same); got sizes {input_vocab.vocab_size} and "
          f"{vocabulary.vocab_size}.")

  @seqio.map_over_dataset(num_seeds=3)
  def corrupt(features, seeds):
    tokens = features[target_feature_key]
    mask_seeds = tf.unstack(tf.random.experimental.stateless_split(noise.as_seed(seeds[0]), 2))
    noise_mask = noise_mask_fn(tf.size(tokens), noise_density, seeds=mask_seeds)
    out = dict(features)
    out[input_feature_key] = inputs_fn(tokens, noise_mask, vocabulary, seeds=[seeds[1]])
    if targets_fn is not None:
      out[target_feature_key] = targets_fn(tokens, noise_mask, vocabulary, seeds=[seeds[2]])
    return out

  return corrupt(dataset)


# ----------------------------------------------------------------------------------------------
# The objectives
# ----------------------------------------------------------------------------------------------


@gin.configurable
def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
    final_sentinel: bool = False,
) -> tf.data.Dataset:
  """T5's pre-training objective ("random spans"): corrupt spans; predict them after sentinels.

  Pipeline: one random chunk of each document, documents concatenated
  (`merge_examples_to_reduce_padding`), split into `random_spans_helper` raw lengths (568 raw
  tokens for 512 inputs at (0.15, 3)), masked by `noise.random_spans_noise_mask`. Inputs: kept
  tokens, one sentinel per span. Targets: each span after its sentinel, as the reference code
  does: its masks end with a noise span, so no closing sentinel follows (`final_sentinel=True`
  adds one, as Figure 2 draws it for a text ending in kept tokens). Full segments fill
  `span_corruption_feature_lengths(...)` exactly: 512/114 at (0.15, 3), never truncated.

  Documented edge cases: empty documents are dropped; a one-token segment is left uncorrupted
  (inputs = the token, targets = one sentinel).

  Args:
    dataset: tokenized examples with int32 [n] `targets` (the document).
    sequence_length: feature lengths; `sequence_length[input_feature_key]` is required.
    output_features: must hold `targets` (and `input_feature_key`) with one vocabulary.
    noise_density: fraction of tokens corrupted, in (0, 1).
    mean_noise_span_length: mean span length, >= 1.
    input_feature_key: name of the corrupted-inputs feature.
    merge_examples_to_reduce_padding: concatenate documents before splitting.
    final_sentinel: end the targets with the closing sentinel.

  Returns:
    examples {input_feature_key: int32 [<= inputs_length - 1], "targets": int32 [...]}.
  """
  noise.validate_noise_density(noise_density)
  noise.validate_mean_noise_span_length(mean_noise_span_length)
  inputs_length = corpus.required_length(sequence_length, input_feature_key, "span_corruption")
  raw_length, _ = random_spans_helper(inputs_length, noise_density, mean_noise_span_length)
  sentinels_needed = (noise.random_spans_counts_py(raw_length, noise_density,
                                                   mean_noise_span_length)[1]
                      + int(final_sentinel))
  extra_ids = int(getattr(output_features["targets"].vocabulary, "extra_ids", 0) or 0)
  if sentinels_needed > extra_ids:
    raise ValueError(
        f"span_corruption at inputs_length={inputs_length}, noise_density={noise_density}, "
        f"mean_noise_span_length={mean_noise_span_length} needs {sentinels_needed} sentinels but "
        f"the vocabulary has extra_ids={extra_ids}; shorten the inputs, raise the mean span "
        "length, or use a vocabulary with more extra_ids.")
  dataset = corpus.segments(dataset, raw_length, merge_examples_to_reduce_padding)
  return denoise(
      dataset, output_features, noise_density=noise_density,
      noise_mask_fn=functools.partial(
          noise.random_spans_noise_mask, mean_noise_span_length=mean_noise_span_length),
      inputs_fn=noise.noise_span_to_unique_sentinel,
      targets_fn=functools.partial(noise.noise_spans_to_targets, final_sentinel=final_sentinel),
      input_feature_key=input_feature_key)


def _inputs_sized_objective(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], output_features: OutputFeatures,
    who: str, noise_density: float, noise_mask_fn: NoiseMaskFn, inputs_fn: TokenFn,
    targets_fn: Optional[TokenFn], input_feature_key: str, merge: bool) -> tf.data.Dataset:
  """Segments of `inputs_length - 1` raw tokens (the inputs never grow), then `denoise`."""
  inputs_length = corpus.required_length(sequence_length, input_feature_key, who)
  dataset = corpus.segments(dataset, inputs_length - 1, merge)
  return denoise(dataset, output_features, noise_density, noise_mask_fn, inputs_fn, targets_fn,
                 input_feature_key=input_feature_key)


@gin.configurable
def iid_noise_replace_spans(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """The "i.i.d. noise, replace spans" objective: tokens noised independently with p =
  `noise_density`; each run of noise becomes one sentinel; targets = the runs after their
  sentinels, plus a final sentinel.

  Segments are `inputs_length - 1` raw tokens; targets come out ~ 2 * noise_density as long
  (every isolated noise token costs a sentinel), so set `sequence_length["targets"]` to match.
  """
  noise.validate_noise_density(noise_density)
  return _inputs_sized_objective(
      dataset, sequence_length, output_features, "iid_noise_replace_spans", noise_density,
      noise.iid_noise_mask, noise.noise_span_to_unique_sentinel, noise.noise_spans_to_targets,
      input_feature_key, merge_examples_to_reduce_padding)


@gin.configurable
def iid_noise_drop_tokens(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """The "i.i.d. noise, drop tokens" objective: noise tokens leave the inputs and become the targets."""
  noise.validate_noise_density(noise_density)
  return _inputs_sized_objective(
      dataset, sequence_length, output_features, "iid_noise_drop_tokens", noise_density,
      noise.iid_noise_mask, noise.drop_noise_tokens, noise.drop_nonnoise_tokens,
      input_feature_key, merge_examples_to_reduce_padding)


@gin.configurable
def bert_style(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    random_token_rate: float = 0.1,
    mask_token_id: Optional[int] = None,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """BERT-style: 15% of tokens corrupted, 90% to `<M>` and 10% to a random token; target = original.

  `<M>` is `mask_token_id`, by default the top sentinel (`noise.default_mask_id`). Targets are as
  long as the inputs.
  """
  noise.validate_noise_density(noise_density)
  if mask_token_id is None:  # fail now, not inside tf.data, when there is no sentinel to use
    noise.default_mask_id(output_features["targets"].vocabulary)
  return _inputs_sized_objective(
      dataset, sequence_length, output_features, "bert_style", noise_density,
      noise.iid_noise_mask,
      functools.partial(noise.bert_style_inputs, random_token_rate=random_token_rate,
                        mask_token_id=mask_token_id),
      noise.keep_all_tokens, input_feature_key, merge_examples_to_reduce_padding)


@gin.configurable
def mass_style(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    mask_token_id: Optional[int] = None,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """MASS-style (as the T5 paper runs it): 15% of tokens become `<M>`, no random tokens; target =
  the original text."""
  return bert_style(
      dataset, sequence_length, output_features, noise_density=noise_density,
      random_token_rate=0.0, mask_token_id=mask_token_id, input_feature_key=input_feature_key,
      merge_examples_to_reduce_padding=merge_examples_to_reduce_padding)


@gin.configurable
def deshuffling(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """Deshuffling: inputs = the segment's tokens in a random order; target = the original order."""
  return _inputs_sized_objective(
      dataset, sequence_length, output_features, "deshuffling", 0.5, noise.all_noise_mask,
      noise.shuffle_tokens, noise.keep_all_tokens, input_feature_key,
      merge_examples_to_reduce_padding)


@gin.configurable
def prefix_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """Prefix LM objective: a segment split at a uniform random point; inputs = prefix, targets = rest.

  Segments have `min(inputs_length, targets_length) - 1` tokens (targets_length defaults to
  inputs_length), so neither side is ever trimmed.
  """
  inputs_length = corpus.required_length(sequence_length, input_feature_key, "prefix_lm")
  targets_length = int(sequence_length.get("targets") or inputs_length)
  segment = min(inputs_length, targets_length) - 1
  if segment < 2:
    raise ValueError(f"prefix_lm needs feature lengths >= 3 to split a segment, got {sequence_length}.")
  dataset = corpus.segments(dataset, segment, merge_examples_to_reduce_padding)
  return denoise(dataset, output_features, 0.5, noise.random_prefix_noise_mask,
                 noise.drop_noise_tokens, noise.drop_nonnoise_tokens,
                 input_feature_key=input_feature_key)


@gin.configurable
def full_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """Language modelling: segments of `targets_length - 1` tokens as targets; empty inputs.

  The empty `input_feature_key` (present when the task declares it) lets encoder-decoder feature
  converters run; decoder-only converters read `targets` only.
  """
  targets_length = corpus.required_length(sequence_length, "targets", "full_lm")
  dataset = corpus.segments(dataset, targets_length - 1, merge_examples_to_reduce_padding)
  with_inputs = input_feature_key in output_features

  def to_lm(example):
    out = {"targets": example["targets"]}
    if with_inputs:
      out[input_feature_key] = tf.zeros([0], example["targets"].dtype)
    return out

  return dataset.map(to_lm, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------------------------
# Text formats for decoder-only and prefix-LM models on supervised (string) tasks
# ----------------------------------------------------------------------------------------------


@gin.configurable
def prefix_lm_text_format(
    dataset: tf.data.Dataset, separator: str = "target:", input_feature_key: str = "inputs"
) -> tf.data.Dataset:
  """Appends `separator` to the string inputs: "<inputs> target:" is the fully visible prefix.

  Use before tokenization with a prefix-LM feature converter (inputs + targets in one sequence,
  attention fully visible up to and including "target:"); at inference the model is fed the
  prefix. {"inputs": "translate English to German: That is good.", "targets": "Das ist gut."}
  -> inputs "translate English to German: That is good. target:".
  """

  def fmt(example):
    out = dict(example)
    out[input_feature_key] = tf.strings.join([example[input_feature_key], separator], " ")
    return out

  return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)


@gin.configurable
def decoder_only_text_format(
    dataset: tf.data.Dataset, separator: str = "target:", input_feature_key: str = "inputs"
) -> tf.data.Dataset:
  """Joins a supervised example into one string target for a decoder-only LM (T5 §3.2.1).

  {"inputs": "translate English to German: That is good.", "targets": "Das ist gut."} ->
  {"targets": "translate English to German: That is good. target: Das ist gut."}; the inputs
  feature is removed. At inference feed the prefix (`prefix_lm_text_format`'s inputs).
  """

  def fmt(example):
    out = {k: v for k, v in example.items() if k != input_feature_key}
    out["targets"] = tf.strings.join(
        [example[input_feature_key], separator, example["targets"]], " ")
    return out

  return dataset.map(fmt, num_parallel_calls=tf.data.AUTOTUNE)
