"""Model-ready batches from seqio: a task or mixture through the model's feature converter.

The training stream is deterministic given its seed (seqio seeds every random preprocessor and
the shuffle from it), so resuming at step N is exact: rebuild the same stream and skip the N
batches already consumed. Each host reads its own shard of the data (`seqio.ShardInfo`).
"""
from __future__ import annotations

from typing import Iterator, Mapping

import jax
import numpy as np
import seqio
import tensorflow as tf

from t2t.data import registry


def limit_tf_threads(num_threads: int = 1) -> None:
  """Keeps tf.data off the cores that JAX needs (both run in one process)."""
  try:
    tf.config.threading.set_inter_op_parallelism_threads(num_threads)
    tf.config.threading.set_intra_op_parallelism_threads(num_threads)
  except RuntimeError:
    pass  # TensorFlow already initialised its thread pools; the earlier setting stands.
  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:
    pass


def train_batches(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int],
                  feature_converter: seqio.FeatureConverter, batch_size: int, seed: int,
                  split: str = "train", skip_batches: int = 0,
                  shuffle: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """An endless iterator of this host's share of each global batch, as numpy arrays."""
  # Clear errors for an unknown name, a missing split, or data that would have to be downloaded.
  registry.check_split_readable(registry.get_mixture_or_task(mixture_or_task_name), split)
  num_hosts = jax.process_count()
  ds = seqio.get_dataset(
      mixture_or_task_name,
      task_feature_lengths=dict(task_feature_lengths),
      feature_converter=feature_converter,
      dataset_split=split,
      shuffle=shuffle,
      num_epochs=None,
      seed=seed,
      shard_info=seqio.ShardInfo(index=jax.process_index(), num_shards=num_hosts),
      batch_size=batch_size // num_hosts,
      verbose=False)
  if skip_batches:
    ds = ds.skip(skip_batches)
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1
  ds = ds.with_options(options).prefetch(2)
  return ds.as_numpy_iterator()


def count_tokens(batch: Mapping[str, np.ndarray]) -> int:
  """Non-padding tokens a model reads and predicts in a batch (for tokens/s)."""
  total = 0
  for key in ("encoder_input_tokens", "decoder_target_tokens"):
    if key in batch:
      total += int(np.count_nonzero(batch[key]))
  return total
