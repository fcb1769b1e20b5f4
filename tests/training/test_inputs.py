"""Tests for t2t/training/inputs.py: the deterministic, resumable training stream."""
import importlib

import numpy as np
import pytest
import seqio

from t2t.training import input_state, inputs
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


# --- Resume without replay: the iterator's position saved and restored (input_state) ---------

BBC_LENGTHS = {"inputs": 32, "targets": 8}
MIXTURE = "resume_test_bbc_mix"


def _bbc_stream(name, pack=True, seed=0):
  importlib.import_module("tasks.bbc")  # registers the BBC tasks
  if name == MIXTURE and MIXTURE not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add(MIXTURE, [("bbc_span_corruption", 1.0), ("bbc_topic", 1.0)])
  return inputs.train_batches(name, BBC_LENGTHS, seqio.EncDecFeatureConverter(pack=pack),
                              batch_size=2, seed=seed)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_same_batches(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for k in w:
      np.testing.assert_array_equal(g[k], w[k], err_msg=k)


@pytest.mark.parametrize("name", ["bbc_span_corruption", MIXTURE])
def test_restored_iterator_continues_exactly(tmp_path, name):
  """Packing, a mixture and span corruption's random preprocessors, through the prefetch
  buffer and `as_numpy_iterator`: after restoring the position saved at batch 7 a fresh
  pipeline yields exactly batches 8-11 of the uninterrupted one."""
  (tmp_path / "checkpoint_7").mkdir()
  it = _bbc_stream(name)
  _take(it, 7)  # by now the prefetch buffer holds batches 8 and 9
  prefix = input_state.save(it, str(tmp_path), 7)
  assert prefix == str(tmp_path / "input_state" / "checkpoint_7" / "process_0")
  assert input_state.exists(str(tmp_path), 7) and not input_state.exists(str(tmp_path), 8)
  want = _take(it, 4)
  resumed = _bbc_stream(name)
  input_state.restore(resumed, str(tmp_path), 7)
  _assert_same_batches(_take(resumed, 4), want)
  # And the replay fallback agrees with both.
  _assert_same_batches(_take(inputs.train_batches(
      name, BBC_LENGTHS, seqio.EncDecFeatureConverter(pack=True), 2, seed=0, skip_batches=7), 4),
      want)


def test_state_of_another_pipeline_is_a_clear_error(tmp_path):
  (tmp_path / "checkpoint_3").mkdir()
  it = _bbc_stream("bbc_span_corruption")
  _take(it, 3)
  input_state.save(it, str(tmp_path), 3)
  other = _bbc_stream("bbc_span_corruption", pack=False)  # another pipeline structure
  with pytest.raises(ValueError, match="does not fit the rebuilt input pipeline.*delete"):
    input_state.restore(other, str(tmp_path), 3)


def test_a_live_python_generator_cannot_be_saved_and_leaves_nothing(tmp_path):
  import tensorflow as tf
  (tmp_path / "checkpoint_1").mkdir()
  ds = tf.data.Dataset.from_generator(lambda: iter(range(10**6)),
                                      output_signature=tf.TensorSpec([], tf.int64))
  it = ds.prefetch(2).as_numpy_iterator()
  next(it)
  with pytest.raises(input_state.NotCheckpointableError, match="stateful"):
    input_state.save(it, str(tmp_path), 1)
  assert not input_state.exists(str(tmp_path), 1)


# --- Input threads from gin --------------------------------------------------------------------

def test_input_threads_auto_and_explicit(monkeypatch):
  monkeypatch.setattr(inputs.os, "sched_getaffinity", lambda pid: set(range(16)))
  monkeypatch.setattr(inputs.jax, "default_backend", lambda: "cpu")
  assert inputs.input_threads("auto") == 4  # a quarter of the cores beside a CPU step
  monkeypatch.setattr(inputs.jax, "default_backend", lambda: "gpu")
  assert inputs.input_threads("auto") == 14  # all but 2 beside an accelerator
  monkeypatch.setattr(inputs.os, "sched_getaffinity", lambda pid: {0, 1})
  assert inputs.input_threads("auto") == 1
  monkeypatch.setattr(inputs.jax, "default_backend", lambda: "cpu")
  assert inputs.input_threads("auto") == 1  # this 2-core machine
  assert inputs.input_threads(3) == 3
  for bad in (0, "many", 1.5):
    with pytest.raises(ValueError, match="input_threads.threads must be 'auto' or a positive"):
      inputs.input_threads(bad)


def test_train_batches_reads_the_gin_thread_count():
  import gin
  with gin.unlock_config():
    gin.bind_parameter("input_threads.threads", 3)
  try:
    it = _stream()
    assert it._dataset.options().threading.private_threadpool_size == 3
  finally:
    gin.clear_config()
  assert _stream()._dataset.options().threading.private_threadpool_size == inputs.input_threads()


# --- Several hosts: each keeps its rows of the global batch ------------------------------------

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
