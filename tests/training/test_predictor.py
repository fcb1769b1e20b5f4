"""Tests for t2t/training/predictor.py: batched decoding and scoring from a checkpoint."""
import numpy as np
import pytest
import seqio

from t2t import train as train_lib
from t2t.training import optim, predictor
from t2t.training.predictor import Predictor
from tests.training import toy


def test_as_targets_scores_a_prediction_up_to_its_eos():
  features = {"encoder_input_tokens": np.array([7, 8, 1, 0], np.int32),
              "decoder_target_tokens": np.zeros(5, np.int32),
              "decoder_input_tokens": np.zeros(5, np.int32)}
  out = predictor._as_targets(features, np.array([5, 6, 1, 0, 0]))
  np.testing.assert_array_equal(out["decoder_target_tokens"], [5, 6, 1, 0, 0])
  np.testing.assert_array_equal(out["decoder_input_tokens"], [0, 5, 6, 1, 0])
  np.testing.assert_array_equal(out["decoder_loss_weights"], [1, 1, 1, 0, 0])
  # A prediction that never stopped is scored over its whole length.
  out = predictor._as_targets(features, np.array([5, 6, 7, 8, 9]))
  np.testing.assert_array_equal(out["decoder_loss_weights"], [1, 1, 1, 1, 1])
  np.testing.assert_array_equal(out["encoder_input_tokens"], [7, 8, 1, 0])


def test_as_targets_refuses_a_model_without_encoder_decoder_features():
  with pytest.raises(ValueError, match="encoder-decoder"):
    predictor._as_targets({"decoder_target_tokens": np.zeros(3, np.int32)}, np.array([1, 0, 0]))


def test_predict_and_score_pad_the_last_batch_and_keep_order(tmp_path):
  toy.register()
  model = toy.model()
  train_lib.train(model=model, mixture_or_task_name=toy.TASK, task_feature_lengths=toy.LENGTHS,
                  train_steps=1, model_dir=str(tmp_path), batch_size=4,
                  optimizer=optim.adafactor(learning_rate=0.01))
  converter = seqio.EncDecFeatureConverter(pack=False)
  shapes = {k: (4, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  pred = Predictor.from_checkpoint(model, str(tmp_path), shapes, batch_size=4)
  assert pred.step == 1
  task_ds = seqio.get_mixture_or_task(toy.TASK).get_dataset(
      toy.LENGTHS, split="validation", shuffle=False).take(6)
  features = list(converter(task_ds, toy.LENGTHS).as_numpy_iterator())
  tokens = pred.predict(features)  # 6 examples: one full batch and one padded
  scores = pred.score(features)
  assert len(tokens) == 6 and len(scores) == 6
  assert all(t.shape == (16,) for t in tokens) and all(s < 0 for s in scores)
  # Order is kept: scoring examples one by one gives the same numbers.
  single = Predictor(model, pred.params, pred.partitioner, batch_size=4)
  np.testing.assert_allclose([single.score([f])[0] for f in features[4:]], scores[4:], rtol=1e-5)


def test_seqio_predict_fns_return_fixed_length_arrays_in_index_order(tmp_path):
  """seqio stacks each task's predictions with np.array: they must share one length."""
  toy.register()
  model = toy.model()
  train_lib.train(model=model, mixture_or_task_name=toy.TASK, task_feature_lengths=toy.LENGTHS,
                  train_steps=1, model_dir=str(tmp_path), batch_size=4,
                  optimizer=optim.adafactor(learning_rate=0.01))
  converter = seqio.EncDecFeatureConverter(pack=False)
  shapes = {k: (4, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  pred = Predictor.from_checkpoint(model, str(tmp_path), shapes, batch_size=4)
  task_ds = seqio.get_mixture_or_task(toy.TASK).get_dataset(
      toy.LENGTHS, split="validation", shuffle=False).take(5)
  indexed = converter(task_ds, toy.LENGTHS).enumerate()
  out = pred.seqio_predict_fn(indexed)
  assert [i for i, _ in out] == list(range(5))
  stacked = np.array([t for _, t in out])  # what seqio's Evaluator does
  assert stacked.shape == (5, 16) and stacked.dtype == np.int32
  out_aux, aux = pred.seqio_predict_with_aux_fn(indexed)
  np.testing.assert_array_equal(np.array([t for _, t in out_aux]), stacked)
  # The aux score of each prediction is its log-likelihood: rescoring it by hand agrees.
  features = list(converter(task_ds, toy.LENGTHS).as_numpy_iterator())
  by_hand = pred.score([predictor._as_targets(f, t) for f, (_, t) in zip(features, out)])
  np.testing.assert_allclose(aux["scores"], by_hand, rtol=1e-6)
  assert np.all(aux["scores"] <= 0)


def test_cut_to_bucket_hand_cases():
  batch = {"encoder_input_tokens": np.ones((2, 64), np.int32), "decoder_target_tokens":
           np.ones((2, 64), np.int32)}
  assert predictor._cut_to_bucket(batch, 3)["encoder_input_tokens"].shape == (2, 16)
  assert predictor._cut_to_bucket(batch, 17)["encoder_input_tokens"].shape == (2, 32)
  assert predictor._cut_to_bucket(batch, 32)["encoder_input_tokens"].shape == (2, 32)
  assert predictor._cut_to_bucket(batch, 60)["encoder_input_tokens"].shape == (2, 64)
  assert predictor._cut_to_bucket(batch, 3)["decoder_target_tokens"].shape == (2, 64)  # untouched


def test_length_buckets_change_no_result_and_compile_once_per_bucket():
  import flax.linen as nn
  import jax
  model = toy.model()
  shapes = {"encoder_input_tokens": (4, 64), "decoder_input_tokens": (4, 8)}
  params = nn.unbox(model.get_initial_variables(jax.random.PRNGKey(0), shapes)["params"])
  rng = np.random.default_rng(0)
  examples = []
  for n in (5, 60, 12, 30, 7, 3, 40, 20, 9):  # real lengths, then padding to 64
    tokens = np.zeros(64, np.int32)
    tokens[:n] = rng.integers(2, 30, n)
    targets = rng.integers(2, 30, 8).astype(np.int32)
    examples.append({"encoder_input_tokens": tokens, "decoder_target_tokens": targets,
                     "decoder_input_tokens": np.concatenate([[0], targets[:-1]]).astype(np.int32),
                     "decoder_loss_weights": np.ones(8, np.int32)})
  from t2t.training.partitioning import Partitioner
  bucketed = Predictor(model, params, Partitioner(), batch_size=4, max_decode_length=8)
  full = Predictor(model, params, Partitioner(), batch_size=4, max_decode_length=8,
                   bucket_lengths=False)
  for a, b in zip(bucketed.predict(examples), full.predict(examples)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(bucketed.score(examples), full.score(examples), rtol=1e-5, atol=1e-5)
  # Sorted by length: batches of lengths (3,5,7,9) -> 16, (12,20,30,40) -> 64, (60) -> 64.
  assert bucketed._predict._cache_size() == 2 and full._predict._cache_size() == 1
  bucketed.predict(examples[::-1])  # another order, same buckets: nothing new to compile
  assert bucketed._predict._cache_size() == 2
