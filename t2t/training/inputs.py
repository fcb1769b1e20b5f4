"""Model-ready batches from seqio: a task or mixture through the model's feature converter.

The training stream is deterministic given its seed (seqio seeds every random preprocessor and
the shuffle from it), so resuming at step N is exact: rebuild the same stream and skip the N
batches already consumed.

Several hosts (`per_host_dataset`): by default every host builds the same global stream and keeps
its rows of each global batch, so the global batch -- and the loss -- is the same whatever the
number of hosts (exact, at the cost of every host reading and preprocessing all the data, N times
the input work). `per_host_dataset.shard_source = True` instead gives each host its own shard of
the source (`seqio.ShardInfo`): 1/N of the input work, for data too large to read N times, but
the global batch then depends on the host count.
"""
from __future__ import annotations

from typing import Iterator, Mapping

import gin
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
  ds = per_host_dataset(mixture_or_task_name, task_feature_lengths, feature_converter,
                        batch_size, seed=seed, split=split, shuffle=shuffle)
  if skip_batches:
    ds = ds.skip(skip_batches)
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1
  ds = ds.with_options(options).prefetch(2)
  return ds.as_numpy_iterator()


@gin.configurable(denylist=["mixture_or_task_name", "task_feature_lengths", "feature_converter",
                             "batch_size", "seed", "split", "shuffle"])
def per_host_dataset(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int],
                     feature_converter: seqio.FeatureConverter, batch_size: int, seed: int,
                     split: str = "train", shuffle: bool = True, shard_source: bool = False,
                     process_index: int | None = None,
                     process_count: int | None = None) -> tf.data.Dataset:
  """This host's rows of each global batch of `batch_size`: batches of batch_size / N rows.

  Default: the global stream (the same on every host) sliced to rows [p * B/N, (p + 1) * B/N),
  the rows `Partitioner.shard_batch` (jax.make_array_from_process_local_data) places on host p's
  devices. `shard_source`: host p reads source shard p of N instead. `process_index` and
  `process_count` default to JAX's (given explicitly by tests).
  """
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if batch_size % count:
    raise ValueError(f"BATCH_SIZE={batch_size} must be divisible by the number of hosts "
                     f"({count}).")
  per_host = batch_size // count
  ds = seqio.get_dataset(
      mixture_or_task_name,
      task_feature_lengths=dict(task_feature_lengths),
      feature_converter=feature_converter,
      dataset_split=split,
      shuffle=shuffle,
      num_epochs=None,
      seed=seed,
      shard_info=seqio.ShardInfo(index=index if shard_source else 0,
                                 num_shards=count if shard_source else 1),
      batch_size=per_host if shard_source else batch_size,
      verbose=False)
  if shard_source or count == 1:
    return ds
  lo, hi = index * per_host, (index + 1) * per_host
  return ds.map(lambda batch: {k: v[lo:hi] for k, v in batch.items()})


def count_tokens(batch: Mapping[str, np.ndarray]) -> int:
  """Non-padding tokens a model reads and predicts in a batch (for tokens/s)."""
  total = 0
  for key in ("encoder_input_tokens", "decoder_target_tokens"):
    if key in batch:
      total += int(np.count_nonzero(batch[key]))
  return total
