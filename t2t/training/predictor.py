"""Decoding and scoring a dataset with parameters from one checkpoint (for eval and infer).

Batches are padded to a fixed size so that the jitted functions compile once per shape; the
padding rows are dropped from the results. With `bucket_lengths` (the default) the examples are
sorted by encoder length and each batch's `encoder_*` features are cut to a power-of-two bucket that
holds its longest input (at least `MIN_BUCKET`), instead of every batch running at the feature
length: short inputs cost what they need, and there are at most log2(length / MIN_BUCKET) + 1
shapes to compile. Cutting trailing padding changes no result (padding is masked out everywhere);
results come back in the input order.

On several hosts (jax.distributed) every host holds the same examples and forms the same global
batches (so every host runs the same compiled shapes in the same order, as the collective
computation requires); each host places only the rows its own devices hold
(`jax.make_array_from_callback`), so each host's devices decode their share of every batch, and
the outputs are gathered to every host (`process_allgather`) before they are returned. Callers
(eval, infer) then compute metrics and write files on process 0 alone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

import flax.linen as nn
import jax
import numpy as np

from t2t.training import checkpoints
from t2t.training.partitioning import Partitioner

if TYPE_CHECKING:  # seqio's datasets; decoding itself runs without TensorFlow (an accelerator image)
  import tensorflow as tf

MIN_BUCKET = 16


class Predictor:
  """A model's `predict_batch` and `score_batch`, jitted over a mesh, with loaded parameters."""

  def __init__(self, model: Any, params: Any, partitioner: Partitioner, batch_size: int,
               max_decode_length: int | None = None, bucket_lengths: bool = True):
    self.model, self.params, self.partitioner = model, params, partitioner
    self.batch_size = batch_size
    self.bucket_lengths = bucket_lengths
    self._predict = jax.jit(
        lambda p, b: model.predict_batch(p, b, max_decode_length=max_decode_length))
    self._score = jax.jit(model.score_batch)

  @classmethod
  def from_checkpoint(cls, model: Any, checkpoint_path: str,
                      input_shapes: Mapping[str, tuple[int, ...]],
                      partitioner: Partitioner | None = None, batch_size: int = 32,
                      max_decode_length: int | None = None,
                      bucket_lengths: bool = True,
                      vocabulary: Mapping[str, Mapping[str, Any]] | None = None) -> "Predictor":
    """Loads parameters from a model directory (latest step) or a checkpoint_<N> directory.

    `vocabulary` ({feature: t2t.data.vocabularies.fingerprint}) is what the examples will be
    tokenised with; a checkpoint that records another is refused (checkpoints.check_vocabulary).
    """
    partitioner = partitioner or Partitioner()
    partitioner.check_batch_size(batch_size)
    with partitioner.activation_context():
      boxed = jax.eval_shape(
          lambda rng: model.get_initial_variables(rng, dict(input_shapes))["params"],
          jax.random.PRNGKey(0))
    params, step = checkpoints.load_params(checkpoint_path, nn.unbox(boxed),
                                           partitioner.shardings_for(boxed), vocabulary)
    predictor = cls(model, params, partitioner, batch_size, max_decode_length, bucket_lengths)
    predictor.step = step
    return predictor

  def _batches(self, examples: Iterable[Mapping[str, np.ndarray]]):
    """Yields (positions of the real rows in `examples`, padded batch) of model features."""
    examples = list(examples)
    order = list(range(len(examples)))
    if self.bucket_lengths and examples and "encoder_input_tokens" in examples[0]:
      order.sort(key=lambda i: _input_length(examples[i]))
    for start in range(0, len(order), self.batch_size):
      rows = order[start:start + self.batch_size]
      buffer = [examples[i] for i in rows]
      if len(buffer) < self.batch_size:
        pad = {k: np.zeros_like(v) for k, v in buffer[0].items()}
        buffer = buffer + [pad] * (self.batch_size - len(buffer))
      batch = _stack(buffer)
      if self.bucket_lengths and "encoder_input_tokens" in batch:
        batch = _cut_to_bucket(batch, max(_input_length(ex) for ex in buffer))
      yield rows, batch

  def _place(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """A global batch (the same on every host) on the mesh, split along the batch axis."""
    if jax.process_count() == 1:
      return self.partitioner.shard_batch(batch)
    sharding = self.partitioner.data_sharding
    return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
            for k, v in batch.items()}

  @staticmethod
  def _fetch(array: jax.Array) -> np.ndarray:
    """The whole of a (possibly multi-host) output array, as numpy on every host."""
    if jax.process_count() == 1:
      return np.asarray(jax.device_get(array))
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))

  def predict(self, features: Iterable[Mapping[str, np.ndarray]]) -> list[np.ndarray]:
    """Decoded token ids per example, in order."""
    out: dict[int, np.ndarray] = {}
    for rows, batch in self._batches(features):
      with self.partitioner.activation_context():
        tokens = self._fetch(self._predict(self.params, self._place(batch)))
      out.update((i, np.asarray(t)) for i, t in zip(rows, tokens))
    return [out[i] for i in range(len(out))]

  def score(self, features: Iterable[Mapping[str, np.ndarray]]) -> list[float]:
    """Log-likelihood of each example's targets, in order."""
    out: dict[int, float] = {}
    for rows, batch in self._batches(features):
      with self.partitioner.activation_context():
        scores = self._fetch(self._score(self.params, self._place(batch)))
      out.update((i, float(s)) for i, s in zip(rows, np.asarray(scores)))
    return [out[i] for i in range(len(out))]

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


def _input_length(example: Mapping[str, np.ndarray]) -> int:
  """Position after the last non-padding encoder token (0 for an all-padding row)."""
  nonzero = np.flatnonzero(example["encoder_input_tokens"])
  return int(nonzero[-1]) + 1 if len(nonzero) else 0


def _cut_to_bucket(batch: dict[str, np.ndarray], longest: int) -> dict[str, np.ndarray]:
  """`encoder_*` features [b, L] cut to the power-of-two bucket (>= MIN_BUCKET, <= L) >= longest."""
  full = batch["encoder_input_tokens"].shape[1]
  bucket = min(full, max(MIN_BUCKET, 1 << max(longest - 1, 0).bit_length()))
  return {k: (v[:, :bucket] if k.startswith("encoder_") and v.ndim == 2 and v.shape[1] == full
              else v) for k, v in batch.items()}


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
