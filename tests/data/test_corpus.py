"""Tests for t2t/data/corpus.py: chunking, concatenation, splitting, truncation, repetition."""
import pytest
import seqio
import tensorflow as tf

from t2t.data import corpus


def _token_dataset(docs):
  return tf.data.Dataset.from_tensor_slices(tf.ragged.constant(docs, dtype=tf.int32)).map(
      lambda t: {"targets": t})


def test_plumbing_helpers():
  with seqio.utils.map_seed_manager(2):
    chunks = corpus.select_random_chunk(_token_dataset([list(range(3, 13)), []]), max_length=4)
  (chunk,) = [c["targets"].tolist() for c in chunks.as_numpy_iterator()]
  assert chunk in ([3, 4, 5, 6], [7, 8, 9, 10], [11, 12])
  merged = corpus.reduce_concat_tokens(_token_dataset([[3, 4], [5], [6, 7, 8]]), batch_size=2)
  assert [m["targets"].tolist() for m in merged.as_numpy_iterator()] == [[3, 4, 5], [6, 7, 8]]
  split = corpus.split_tokens(_token_dataset([list(range(3, 10))]), max_tokens_per_segment=3)
  assert [s["targets"].tolist() for s in split.as_numpy_iterator()] == [[3, 4, 5], [6, 7, 8], [9]]
  with pytest.raises(ValueError, match="min_tokens_per_segment"):
    corpus.split_tokens(_token_dataset([[3]]), max_tokens_per_segment=3, min_tokens_per_segment=5)


def test_truncate_and_repeat_corpus():
  docs = _token_dataset([[3, 4, 5], [6, 7], [], [8, 9, 10, 11], [12]])
  truncated = [x["targets"].tolist() for x in corpus.truncate_corpus(docs, 7).as_numpy_iterator()]
  assert truncated == [[3, 4, 5], [6, 7], [8, 9]]
  infinite = corpus.truncate_corpus(docs.repeat(), 12)
  assert sum(len(x["targets"]) for x in infinite.as_numpy_iterator()) == 12
  assert sum(len(x["targets"]) for x in corpus.truncate_corpus(docs, 100).as_numpy_iterator()) == 10
  repeated = corpus.repeat_corpus(corpus.truncate_corpus(docs, 4), 3)
  assert [x["targets"].tolist() for x in repeated.as_numpy_iterator()] == [[3, 4, 5], [6]] * 3
  with pytest.raises(ValueError, match="max_tokens"):
    corpus.truncate_corpus(docs, 0)
  with pytest.raises(ValueError, match="num_repeats"):
    corpus.repeat_corpus(docs, 0)
