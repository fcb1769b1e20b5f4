"""BERT's masked-LM data: special ids, corruption (by hand), `bert_mlm`, the feature converter."""
import numpy as np
import pytest
import seqio
import tensorflow as tf

from t2t.data import mlm, vocabularies

CLS, SEP, MASK = 8098, 8097, 8099


@pytest.fixture(scope="module")
def vocab():
  return vocabularies.bbc_vocabulary()


def test_special_ids_are_the_top_three_sentinels(vocab):
  ids = mlm.bert_special_ids(vocab)
  assert ids == mlm.BBC_SPECIAL_IDS == mlm.BertSpecialIds(cls=CLS, sep=SEP, mask=MASK)
  assert [vocab.decode([i]) for i in (MASK, CLS, SEP)] == [
      "<extra_id_0>", "<extra_id_1>", "<extra_id_2>"]
  with pytest.raises(ValueError, match="extra_ids >= 3"):
    mlm.bert_special_ids(vocabularies.bbc_vocabulary(extra_ids=2))


def test_corruption_by_hand():
  # Positions 1, 2, 4 are noise; draws pick random (0.05 < 0.1), keep (0.15 < 0.1 + 0.1), mask.
  tokens = tf.constant([10, 11, 12, 13, 14])
  noise_mask = tf.constant([False, True, True, False, True])
  draws = tf.constant([0.0, 0.05, 0.15, 0.0, 0.9])
  random_tokens = tf.constant([50, 51, 52, 53, 54])
  inputs, targets = mlm.corrupt_tokens(tokens, noise_mask, draws, random_tokens, mask_id=99,
                                       random_token_rate=0.1, keep_token_rate=0.1)
  assert inputs.numpy().tolist() == [10, 51, 12, 13, 99]
  assert targets.numpy().tolist() == [0, 11, 12, 0, 14]  # kept position 2 is still predicted
  # T5's BERT-style shares (no keep): the 0.15 draw now means [MASK].
  inputs, _ = mlm.corrupt_tokens(tokens, noise_mask, draws, random_tokens, 99, 0.1, 0.0)
  assert inputs.numpy().tolist() == [10, 51, 99, 13, 99]


def _documents(vocab, n=40):
  """Tokenized pseudo-documents with ids in the ordinary range (no sentinels, no 0/1)."""
  rng = np.random.RandomState(0)
  docs = [rng.randint(3, 8000, size=rng.randint(20, 90)).astype(np.int32) for _ in range(n)]
  ds = tf.data.Dataset.from_generator(lambda: ({"targets": d} for d in docs),
                                      output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  return docs, ds


def test_bert_mlm_marks_exactly_the_corrupted_positions(vocab):
  docs, ds = _documents(vocab)
  features = mlm.mlm_output_features(vocab)
  with seqio.utils.map_seed_manager(7):
    # The defaults: BERT's 15% corrupted, 80% [MASK] / 10% random / 10% kept.
    examples = list(mlm.bert_mlm(ds, {"inputs": 34, "targets": 34}, features).as_numpy_iterator())
  original = np.concatenate(docs)
  position, counts = 0, {"mask": 0, "random": 0, "keep": 0, "noise": 0, "all": 0}
  for ex in examples:
    inputs, targets = ex["inputs"], ex["targets"]
    assert inputs[0] == CLS and inputs[-1] == SEP and targets[0] == targets[-1] == 0
    n = len(inputs) - 2
    assert n <= 32 and len(targets) == len(inputs)
    text = original[position:position + n]
    position += n
    body_in, body_tg = inputs[1:-1], targets[1:-1]
    corrupted = body_tg > 0
    np.testing.assert_array_equal(body_tg[corrupted], text[corrupted])
    np.testing.assert_array_equal(body_in[~corrupted], text[~corrupted])  # the rest is untouched
    counts["mask"] += int(np.sum(body_in[corrupted] == MASK))
    counts["keep"] += int(np.sum(body_in[corrupted] == text[corrupted]))
    counts["random"] += int(np.sum((body_in[corrupted] != MASK)
                                   & (body_in[corrupted] != text[corrupted])))
    counts["noise"] += int(np.sum(corrupted))
    counts["all"] += n
  assert position == len(original)  # merged documents, every token used once
  assert 0.12 < counts["noise"] / counts["all"] < 0.18
  assert 0.72 < counts["mask"] / counts["noise"] < 0.88
  assert 0.05 < counts["keep"] / counts["noise"] < 0.16
  assert 0.05 < counts["random"] / counts["noise"] < 0.16


def test_random_tokens_come_from_the_whole_vocabulary_but_padding(vocab):
  # As the reference create_pretraining_data.py: any id may replace a token, sentinels and
  # special ids included; only 0 (t2t's padding) is never drawn.
  assert mlm.bert_random_token_range(vocab) == (1, vocab.vocab_size) == (1, 8100)
  docs, ds = _documents(vocab)
  with seqio.utils.map_seed_manager(3):
    examples = list(mlm.bert_mlm(ds, {"inputs": 34, "targets": 34}, mlm.mlm_output_features(vocab),
                                 noise_density=0.9, random_token_rate=1.0,
                                 keep_token_rate=0.0).as_numpy_iterator())
  drawn = np.concatenate([ex["inputs"][1:-1][ex["targets"][1:-1] > 0] for ex in examples])
  assert len(drawn) > 1500 and drawn.min() >= 1 and drawn.max() < 8100
  # ~1,900 uniform draws over 8,099 ids: some land among the 100 sentinels and below id 100
  # (the ordinary-piece range [3, 8000) would give none of the former).
  assert np.sum(drawn >= 8000) > 5 and np.sum(drawn < 100) > 5


def test_bert_mlm_refuses_bad_settings(vocab):
  _, ds = _documents(vocab, n=2)
  features = mlm.mlm_output_features(vocab)
  with pytest.raises(ValueError, match="sum to at most 1"):
    mlm.bert_mlm(ds, {"inputs": 16}, features, random_token_rate=0.6, keep_token_rate=0.6)
  with pytest.raises(ValueError, match="must be >= 3"):
    mlm.bert_mlm(ds, {"inputs": 2}, features)
  with pytest.raises(ValueError, match="needs sequence_length"):
    mlm.bert_mlm(ds, {"targets": 16}, features)


def _task_like(rows):
  return tf.data.Dataset.from_generator(
      lambda: iter(rows), output_signature={"inputs": tf.TensorSpec([None], tf.int32),
                                            "targets": tf.TensorSpec([None], tf.int32)})


def test_converter_restores_the_text_and_weights_the_corrupted_positions():
  rows = [{"inputs": np.array([CLS, 5, MASK, 7, 44, SEP], np.int32),
           "targets": np.array([0, 0, 6, 0, 8, 0], np.int32)},
          {"inputs": np.array([CLS, MASK, SEP], np.int32),
           "targets": np.array([0, 9, 0], np.int32)}]
  converter = mlm.BertMlmFeatureConverter(pack=False)
  out = list(converter(_task_like(rows), {"inputs": 8, "targets": 8}).as_numpy_iterator())
  assert out[0]["encoder_input_tokens"].tolist() == [CLS, 5, MASK, 7, 44, SEP, 0, 0]
  assert out[0]["encoder_target_tokens"].tolist() == [CLS, 5, 6, 7, 8, SEP, 0, 0]
  assert out[0]["encoder_loss_weights"].tolist() == [0, 0, 1, 0, 1, 0, 0, 0]
  assert out[1]["encoder_target_tokens"].tolist() == [CLS, 9, SEP, 0, 0, 0, 0, 0]
  packed = list(mlm.BertMlmFeatureConverter(pack=True)(
      _task_like(rows), {"inputs": 10, "targets": 10}).as_numpy_iterator())
  assert len(packed) == 1
  assert packed[0]["encoder_segment_ids"].tolist() == [1] * 6 + [2] * 3 + [0]
  assert packed[0]["encoder_positions"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 0]
  assert packed[0]["encoder_loss_weights"].tolist() == [0, 0, 1, 0, 1, 0, 0, 1, 0, 0]
  with pytest.raises(ValueError, match="must equal"):
    converter.get_model_feature_lengths({"inputs": 8, "targets": 6})
