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

  def seqio_predict_fn(self, dataset: tf.data.Dataset) -> list[tuple[int, np.ndarray]]:
    """seqio.Evaluator's predict_fn: dataset of (index, features) -> [(index, tokens [L])].

    Every prediction of a task is an int32 array of the same length L (the decode length), EOS
    then zeros after the last real token: the form seqio's Evaluator stacks into one array and
    decodes with the task's vocabulary (which stops at EOS), as seqio's own models return it.
    """
    indices, features = _split_indexed(dataset)
    return list(zip(indices, self.predict(features)))

  def seqio_predict_with_aux_fn(
      self, dataset: tf.data.Dataset
  ) -> tuple[list[tuple[int, np.ndarray]], dict[str, np.ndarray]]:
    """seqio's predict_with_aux_fn: predictions as above, and aux {'scores': [n]}: each
    prediction's log-likelihood under the model (what t5x reports with its decodes)."""
    indices, features = _split_indexed(dataset)
    tokens = self.predict(features)
    scores = self.score([_as_targets(f, t) for f, t in zip(features, tokens)])
    return list(zip(indices, tokens)), {"scores": np.asarray(scores, np.float32)}

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


def _as_targets(features: Mapping[str, np.ndarray], tokens: np.ndarray,
                eos_id: int = 1) -> dict[str, np.ndarray]:
  """An encoder-decoder example whose targets are `tokens` (a prediction), to score it.

  `tokens` [L] ends at its first EOS (included); the decoder inputs are the targets shifted
  right behind the start id 0, and the loss weights cover the tokens up to that EOS.
  """
  if "encoder_input_tokens" not in features or "decoder_target_tokens" not in features:
    raise ValueError("Scoring predictions (seqio predict-with-aux metrics) needs an "
                     "encoder-decoder model whose batches carry decoder_target_tokens; this "
                     f"model's features are {sorted(features)}.")
  length = features["decoder_target_tokens"].shape[0]
  targets = np.zeros(length, np.int32)
  tokens = np.asarray(tokens, np.int32)[:length]
  targets[:len(tokens)] = tokens
  eos = np.flatnonzero(targets == eos_id)
  end = int(eos[0]) + 1 if len(eos) else int(np.count_nonzero(targets))
  targets[end:] = 0
  inputs = np.concatenate([[0], targets[:-1]]).astype(np.int32)
  return {**features, "decoder_target_tokens": targets, "decoder_input_tokens": inputs,
          "decoder_loss_weights": (np.arange(length) < end).astype(np.int32)}
