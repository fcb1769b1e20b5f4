"""Tests for t2t/training/inputs.py: the deterministic, resumable training stream."""
import numpy as np
import pytest
import seqio

from t2t.training import inputs
from tests.training import toy


@pytest.fixture(autouse=True)
def _task():
  toy.register()


def _stream(skip=0, seed=0):
  return inputs.train_batches(toy.TASK, toy.LENGTHS, seqio.EncDecFeatureConverter(pack=True),
                              batch_size=4, seed=seed, skip_batches=skip)


def test_batches_are_packed_model_features():
  batch = next(_stream())
  assert batch["encoder_input_tokens"].shape == (4, 16)
  assert {"encoder_segment_ids", "decoder_positions", "decoder_loss_weights"} <= set(batch)
  assert batch["encoder_segment_ids"].max() >= 2  # several examples packed into a row


def test_stream_is_deterministic_and_skipping_resumes_it_exactly():
  first = [next(it) for it in [_stream()] for _ in range(5)]
  again = _stream()
  for expected in first:
    np.testing.assert_array_equal(next(again)["encoder_input_tokens"],
                                  expected["encoder_input_tokens"])
  resumed = next(_stream(skip=3))
  np.testing.assert_array_equal(resumed["decoder_target_tokens"], first[3]["decoder_target_tokens"])
  other_seed = next(_stream(seed=1))
  assert not np.array_equal(other_seed["encoder_input_tokens"], first[0]["encoder_input_tokens"])


def test_unknown_task_is_reported_before_reading():
  with pytest.raises(ValueError, match="Unknown task or mixture 'toy_cpy'"):
    inputs.train_batches("toy_cpy", toy.LENGTHS, seqio.EncDecFeatureConverter(), 4, seed=0)


def test_count_tokens_counts_non_padding_inputs_and_targets():
  batch = {"encoder_input_tokens": np.array([[5, 6, 1, 0]]),
           "decoder_target_tokens": np.array([[7, 1, 0, 0]]),
           "decoder_input_tokens": np.array([[0, 7, 1, 0]])}
  assert inputs.count_tokens(batch) == 5
