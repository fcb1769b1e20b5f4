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


def _hosts(count, batch_size=8, **kwargs):
  converter = seqio.EncDecFeatureConverter(pack=True)
  return [inputs.per_host_dataset(toy.TASK, toy.LENGTHS, converter, batch_size, seed=0,
                                  process_index=p, process_count=count, **kwargs
                                  ).as_numpy_iterator() for p in range(count)]


def _rows(batch):
  return {tuple(row) for row in batch["encoder_input_tokens"]}


def test_hosts_keep_disjoint_rows_of_the_global_batch_whatever_their_number():
  (one,), two = _hosts(1), _hosts(2)
  for _ in range(2):
    whole, first, second = next(one), next(two[0]), next(two[1])
    assert first["encoder_input_tokens"].shape == (4, 16)
    assert not _rows(first) & _rows(second)
    for key in whole:  # host 0 holds rows 0-3, host 1 rows 4-7: the one-host batch
      np.testing.assert_array_equal(np.concatenate([first[key], second[key]]), whole[key])


def test_source_sharding_gives_each_host_its_own_shard():
  (one,), two = _hosts(1), _hosts(2, shard_source=True)
  whole, first, second = next(one), next(two[0]), next(two[1])
  assert first["encoder_input_tokens"].shape == (4, 16)
  assert not _rows(first) & _rows(second)
  assert _rows(first) | _rows(second) != _rows(whole)  # the global batch depends on the hosts


def test_batch_size_must_split_over_the_hosts():
  with pytest.raises(ValueError, match="BATCH_SIZE=6 must be divisible by the number of hosts"):
    _hosts(4, batch_size=6)
