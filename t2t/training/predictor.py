"""Decoding and scoring a dataset with parameters from one checkpoint (for eval and infer).

Batches are padded to a fixed size so that the jitted functions compile once; the padding
rows are dropped from the results.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import flax.linen as nn
import jax
import numpy as np
import tensorflow as tf

from t2t.training import checkpoints
from t2t.training.partitioning import Partitioner


class Predictor:
  """A model's `predict_batch` and `score_batch`, jitted over a mesh, with loaded parameters."""

  def __init__(self, model: Any, params: Any, partitioner: Partitioner, batch_size: int,
               max_decode_length: int | None = None):
    self.model, self.params, self.partitioner = model, params, partitioner
    self.batch_size = batch_size
    self._predict = jax.jit(
        lambda p, b: model.predict_batch(p, b, max_decode_length=max_decode_length))
    self._score = jax.jit(model.score_batch)

  @classmethod
  def from_checkpoint(cls, model: Any, checkpoint_path: str,
                      input_shapes: Mapping[str, tuple[int, ...]],
                      partitioner: Partitioner | None = None, batch_size: int = 32,
                      max_decode_length: int | None = None) -> "Predictor":
    """Loads parameters from a model directory (latest step) or a checkpoint_<N> directory."""
    partitioner = partitioner or Partitioner()
    partitioner.check_batch_size(batch_size)
    with partitioner.activation_context():
      boxed = jax.eval_shape(
          lambda rng: model.get_initial_variables(rng, dict(input_shapes))["params"],
          jax.random.PRNGKey(0))
    params, step = checkpoints.load_params(checkpoint_path, nn.unbox(boxed),
                                           partitioner.shardings_for(boxed))
    predictor = cls(model, params, partitioner, batch_size, max_decode_length)
    predictor.step = step
    return predictor

  def _batches(self, examples: Iterable[Mapping[str, np.ndarray]]):
    """Yields (n_real, padded batch) of model features."""
    buffer: list[Mapping[str, np.ndarray]] = []
    for ex in examples:
      buffer.append(ex)
      if len(buffer) == self.batch_size:
        yield len(buffer), _stack(buffer)
        buffer = []
    if buffer:
      n = len(buffer)
      pad = {k: np.zeros_like(v) for k, v in buffer[0].items()}
      yield n, _stack(buffer + [pad] * (self.batch_size - n))

  def predict(self, features: Iterable[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """Decoded token ids per example, in order."""
    out: list[np.ndarray] = []
    for n, batch in self._batches(features):
      with self.partitioner.activation_context():
        tokens = jax.device_get(self._predict(self.params, self.partitioner.shard_batch(batch)))
      out.extend(np.asarray(tokens[:n]))
    return out

  def score(self, features: Iterable[Mapping[str, np.ndarray]]) -> list[float]:
    """Log-likelihood of each example's targets, in order."""
    out: list[float] = []
    for n, batch in self._batches(features):
      with self.partitioner.activation_context():
        scores = jax.device_get(self._score(self.params, self.partitioner.shard_batch(batch)))
      out.extend(float(s) for s in np.asarray(scores[:n]))
    return out

  def seqio_predict_fn(self, dataset: tf.data.Dataset) -> list[tuple[int, list[int]]]:
    """seqio.Evaluator's predict_fn: dataset of (index, features) -> [(index, token ids)]."""
    indices, features = _split_indexed(dataset)
    return [(i, _strip(t)) for i, t in zip(indices, self.predict(features))]

  def seqio_score_fn(self, dataset: tf.data.Dataset) -> list[tuple[int, float]]:
    indices, features = _split_indexed(dataset)
    return list(zip(indices, self.score(features)))


def _split_indexed(dataset: tf.data.Dataset) -> tuple[list[int], list[dict[str, np.ndarray]]]:
  indices, features = [], []
  for index, ex in dataset.as_numpy_iterator():
    indices.append(int(index))
    features.append(ex)
  return indices, features


def _stack(examples: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def _strip(tokens: np.ndarray, eos_id: int = 1) -> list[int]:
  """Token ids up to (not including) the first EOS, without padding."""
  ids = [int(t) for t in tokens]
  if eos_id in ids:
    ids = ids[:ids.index(eos_id)]
  return [t for t in ids if t != 0]
