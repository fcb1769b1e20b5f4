"""BERT's masked-LM data: special token ids, the `bert_mlm` preprocessor and its feature converter.

Special tokens. SentencePiece vocabularies in the T5 idiom have no [CLS]/[SEP]/[MASK] pieces, so
BERT's take the top three sentinels (which the BERT-style objectives do not otherwise use):

  [MASK] = vocab_size - 1  (`<extra_id_0>`, also the `<M>` of t2t's `bert_style` objective)
  [CLS]  = vocab_size - 2  (`<extra_id_1>`)
  [SEP]  = vocab_size - 3  (`<extra_id_2>`)

With the BBC vocabulary (8,000 pieces + 100 extra ids) these are 8099, 8098 and 8097
(`BBC_SPECIAL_IDS`). A sentence pair is encoded jointly as `[CLS] A [SEP] B [SEP]` with token
types 0 up to and including the first [SEP], 1 after it (Devlin et al., §3).

The objective (`bert_mlm`): BERT's masked LM as the reference `create_pretraining_data.py` draws
it (Devlin et al., §3.1 and Appendix A.1): 15% of the text tokens are corrupted, 80% of those
become [MASK], 10% a random token drawn uniformly from the WHOLE vocabulary (`bert_random_token_range`:
every id but 0, special ids and sentinels included, as the reference draws from all of
`vocab_words`), and 10% stay unchanged but are still predicted. T5's "BERT-style" row of Table 3
(90% [MASK], 10% random, nothing kept) is `keep_token_rate=0.0`. Unlike t2t's text-to-text
`bert_style`, which returns the whole original text as targets, `bert_mlm` returns *aligned sparse*
targets: the original token at each corrupted position and 0 elsewhere (BERT's masked_lm_labels).
So the loss weights are exactly the corrupted positions (`targets > 0`), including random-swapped
and kept ones that no comparison of inputs with targets could find, and the original text is
`where(targets > 0, targets, inputs)`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

import gin
import seqio
import tensorflow as tf

from t2t.data import corpus, noise

OutputFeatures = Mapping[str, seqio.Feature]


@dataclasses.dataclass(frozen=True)
class BertSpecialIds:
  """[CLS], [SEP] and [MASK] ids of one vocabulary."""
  cls: int
  sep: int
  mask: int


def bert_special_ids(vocabulary: seqio.Vocabulary) -> BertSpecialIds:
  """The top three sentinels as [MASK], [CLS], [SEP] (see the module docstring)."""
  extra_ids = int(getattr(vocabulary, "extra_ids", 0) or 0)
  if extra_ids < 3:
    raise ValueError(
        f"BERT needs 3 sentinel ids ([MASK], [CLS], [SEP]) but the vocabulary has "
        f"extra_ids={extra_ids}; use a vocabulary with extra_ids >= 3 (e.g. bbc_vocabulary()).")
  top = vocabulary.vocab_size - 1
  return BertSpecialIds(cls=top - 1, sep=top - 2, mask=top)


# The BBC SentencePiece vocabulary (t2t.data.vocabularies.bbc_vocabulary: 8,000 + 100 extra ids).
BBC_SPECIAL_IDS = BertSpecialIds(cls=8098, sep=8097, mask=8099)


def bert_random_token_range(vocabulary: seqio.Vocabulary) -> tuple[int, int]:
  """[low, high) of BERT's random replacement ids: the whole vocabulary but id 0.

  The reference BERT draws `vocab_words[randint(0, len(vocab_words) - 1)]`, i.e. any id, [PAD],
  [CLS], [SEP], [MASK] and [unused] ones included. Here every id from 1 (EOS/UNK, the sentinels
  and thus [CLS]/[SEP]/[MASK] included) to `vocab_size - 1` may be drawn; only 0 is left out,
  because in t2t 0 *is* padding (the encoder masks it out of attention and seqio's packing cuts
  at it), whereas BERT keeps a separate input mask. That changes a draw's probability by 1/V.
  (`t2t.data.noise.random_token_range`, used by the text-to-text `bert_style` objective, keeps
  to ordinary pieces instead.)
  """
  if vocabulary.vocab_size < 2:
    raise ValueError(f"the vocabulary has {vocabulary.vocab_size} ids; BERT needs ids besides 0.")
  return 1, vocabulary.vocab_size


def corrupt_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, draws: tf.Tensor,
                   random_tokens: tf.Tensor, mask_id: int, random_token_rate: float,
                   keep_token_rate: float) -> tuple[tf.Tensor, tf.Tensor]:
  """BERT's corruption given its random draws (a pure function, so it can be checked by hand).

  At a noise position with draw u: u < random_token_rate -> `random_tokens`; else
  u < random_token_rate + keep_token_rate -> unchanged; else [MASK].

  Args:
    tokens: int32 [n] original tokens.
    noise_mask: bool [n], the positions to corrupt (and predict).
    draws: float [n] uniform draws in [0, 1).
    random_tokens: int32 [n] replacement ids.
    mask_id: the [MASK] id.
    random_token_rate: share of noise positions given a random token.
    keep_token_rate: share of noise positions left unchanged.

  Returns:
    (inputs int32 [n], targets int32 [n]: the original token at noise positions, else 0).
  """
  tokens = tf.cast(tokens, tf.int32)
  replacement = tf.where(draws < random_token_rate, tf.cast(random_tokens, tf.int32),
                         tf.where(draws < random_token_rate + keep_token_rate, tokens,
                                  tf.fill(tf.shape(tokens), tf.constant(mask_id, tf.int32))))
  inputs = tf.where(noise_mask, replacement, tokens)
  targets = tf.where(noise_mask, tokens, tf.zeros_like(tokens))
  return inputs, targets


@gin.configurable
def bert_mlm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.15,
    random_token_rate: float = 0.1,
    keep_token_rate: float = 0.1,
    merge_examples_to_reduce_padding: bool = True,
) -> tf.data.Dataset:
  """BERT's masked-LM examples from documents in `targets` (after `seqio.preprocessors.tokenize`).

  Documents are cut (and, with `merge_examples_to_reduce_padding`, concatenated) into segments of
  `sequence_length['inputs'] - 2` tokens; each token is corrupted independently with probability
  `noise_density` (as `t2t.data.noise.iid_noise_mask`); then [CLS] and [SEP] are added.
  Defaults are BERT's: 15% corrupted, 80% [MASK] / 10% random (`bert_random_token_range`) /
  10% kept; `keep_token_rate=0.0` gives T5's BERT-style 90/10.
  Do not append EOS afterwards (give the features `add_eos=False`).

  Returns:
    examples {inputs: int32 [<= L] `[CLS] corrupted [SEP]`, targets: int32 [<= L] aligned, the
    original token at corrupted positions and 0 elsewhere (also at [CLS] and [SEP])}.
  """
  noise.validate_noise_density(noise_density)
  if not (0 <= random_token_rate and 0 <= keep_token_rate
          and random_token_rate + keep_token_rate <= 1):
    raise ValueError(f"bert_mlm: random_token_rate ({random_token_rate}) and keep_token_rate "
                     f"({keep_token_rate}) must be >= 0 and sum to at most 1.")
  length = corpus.required_length(sequence_length, "inputs", "bert_mlm")
  if length < 3:
    raise ValueError(f"bert_mlm: sequence_length['inputs'] must be >= 3 ([CLS], a token, [SEP]), "
                     f"got {length}.")
  vocabulary = output_features["targets"].vocabulary
  ids = bert_special_ids(vocabulary)
  low, high = bert_random_token_range(vocabulary)
  dataset = corpus.segments(dataset, length - 2, merge_examples_to_reduce_padding)

  @seqio.map_over_dataset(num_seeds=3)
  @noise.graph_only
  def corrupt(features, seeds):
    tokens = tf.cast(features["targets"], tf.int32)
    n = tf.size(tokens)
    noise_mask = noise.iid_noise_mask(n, noise_density, seeds=[seeds[0]])
    draws = tf.random.stateless_uniform([n], seed=noise.as_seed(seeds[1]))
    random_tokens = tf.random.stateless_uniform([n], seed=noise.as_seed(seeds[2]), minval=low,
                                                maxval=high, dtype=tf.int32)
    inputs, targets = corrupt_tokens(tokens, noise_mask, draws, random_tokens, ids.mask,
                                     random_token_rate, keep_token_rate)
    out = dict(features)
    out["inputs"] = tf.concat([[ids.cls], inputs, [ids.sep]], axis=0)
    out["targets"] = tf.concat([[0], targets, [0]], axis=0)
    return out

  return corrupt(dataset)


class BertMlmFeatureConverter(seqio.FeatureConverter):
  """Aligned `inputs` / sparse `targets` (from `bert_mlm`) -> encoder-only model features.

  Model features, all [l] with l = task_feature_lengths['inputs'] (= ['targets']):
    encoder_input_tokens   the corrupted sequence
    encoder_target_tokens  the original sequence, where(targets > 0, targets, inputs)
    encoder_loss_weights   1 exactly at the corrupted positions (targets > 0)
  and, packed, encoder_segment_ids / encoder_positions (each packed segment keeps its own [CLS]).
  """

  TASK_FEATURES = {
      "inputs": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
      "targets": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
  }
  MODEL_FEATURES = {
      "encoder_input_tokens": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
      "encoder_target_tokens": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
      "encoder_loss_weights": seqio.FeatureConverter.FeatureSpec(dtype=tf.int32),
  }
  PACKING_FEATURE_DTYPES = {
      "encoder_segment_ids": tf.int32,
      "encoder_positions": tf.int32,
  }

  def _convert_features(self, ds: tf.data.Dataset,
                        task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
    length = self.get_model_feature_lengths(task_feature_lengths)["encoder_input_tokens"]

    # seqio's packing treats zeros inside a feature as padding, so the sparse targets and 0/1
    # weights are packed in a zero-free form: the dense original text and weights + 1.
    @seqio.map_over_dataset
    def densify(features):
      inputs, targets = features["inputs"], features["targets"]
      return {"inputs": inputs, "targets": tf.where(targets > 0, targets, inputs),
              "weights_plus_one": tf.cast(targets > 0, tf.int32) + 1}

    @seqio.map_over_dataset
    def convert(features):
      out = {
          "encoder_input_tokens": features["inputs"],
          "encoder_target_tokens": features["targets"],
          "encoder_loss_weights": tf.maximum(features["weights_plus_one"] - 1, 0),
      }
      if self.pack:
        out["encoder_segment_ids"] = features["inputs_segment_ids"]
        out["encoder_positions"] = features["inputs_positions"]
      return out

    lengths = {"inputs": length, "targets": length, "weights_plus_one": length}
    return convert(self._pack_or_pad(densify(ds), lengths))

  def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
    length = task_feature_lengths["inputs"]
    if task_feature_lengths.get("targets") != length:
      raise ValueError(
          f"BertMlmFeatureConverter needs aligned features: TASK_FEATURE_LENGTHS['targets'] must "
          f"equal ['inputs'], got {dict(task_feature_lengths)}.")
    lengths = {k: length for k in self.MODEL_FEATURES}
    if self.pack:
      lengths.update({k: length for k in self.PACKING_FEATURE_DTYPES})
    return lengths


def mlm_output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
  """Output features of a `bert_mlm` task: `inputs` and `targets`, no EOS (BERT ends with [SEP])."""
  return {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=False),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=False),
  }


def mlm_preprocessors(text_key: str = "text", **bert_mlm_kwargs: float) -> list:
  """The preprocessors of an MLM task over raw text in `text_key` (rekey, tokenize, `bert_mlm`)."""
  return [
      functools.partial(seqio.preprocessors.rekey, key_map={"targets": text_key}),
      seqio.preprocessors.tokenize,
      functools.partial(bert_mlm, **bert_mlm_kwargs) if bert_mlm_kwargs else bert_mlm,
  ]
