"""Model-ready batches from seqio: a task or mixture through the model's feature converter.

The training stream is deterministic given its seed (seqio seeds every random preprocessor and
the shuffle from it). A resume restores the iterator's saved position
(`t2t.training.input_state`), so it never replays the stream; `skip_batches` (rebuild and skip
the N batches already consumed) is the fallback for checkpoints without that state. With
`use_cached` the tasks are read from seqio's cache (written by its Beam job, `t2t.data.cache`).

Several hosts (`per_host_dataset`): by default every host builds the same global stream and keeps
its rows of each global batch, so the global batch -- and the loss -- is the same whatever the
number of hosts (exact, at the cost of every host reading and preprocessing all the data, N times
the input work). `per_host_dataset.shard_source = True` instead gives each host its own shard of
the source (`seqio.ShardInfo`; with the Beam cache, its own cache files): 1/N of the input work,
for data too large to read N times, but the global batch then depends on the host count.

tf.data's threads come from gin: `input_threads.threads = 'auto'` (the default) or a number; see
`input_threads`.
"""
from __future__ import annotations

import os
from typing import Iterator, Mapping

import gin
import jax
import numpy as np
import seqio
import tensorflow as tf

from t2t.data import registry


@gin.configurable
def input_threads(threads: int | str = "auto") -> int:
  """How many threads tf.data may use (its private pool and TensorFlow's op pools).

  'auto' is what the host can spare beside the training step, which runs in the same process:
  with JAX on CPU the step wants every core, so the input pipeline gets a quarter of them
  (at least 1: on a 2-core machine, 1); with an accelerator the host's cores mostly idle
  while the step runs, so the input pipeline gets all but 2 (one dispatches steps, one is
  left for the runtime and checkpointing). Cores are those this process may run on
  (`os.sched_getaffinity`, which respects taskset and container CPU sets).
  """
  if threads == "auto":
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpus = cpus or 1
    if jax.default_backend() == "cpu":
      return max(1, cpus // 4)
    return max(1, cpus - 2)
  if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
    raise ValueError(f"input_threads.threads must be 'auto' or a positive integer, not "
                     f"{threads!r} (gin binding `input_threads.threads`).")
  return threads


def limit_tf_threads(num_threads: int | None = None) -> None:
  """Keeps tf.data off the cores that JAX needs (both run in one process).

  `num_threads` defaults to `input_threads()` (gin).
  """
  num_threads = input_threads() if num_threads is None else num_threads
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
                  shuffle: bool = True, use_cached: bool = False,
                  num_threads: int | None = None,
                  check_not_empty: bool = True) -> Iterator[dict[str, np.ndarray]]:
  """An endless iterator of this host's share of each global batch, as numpy arrays.

  Each batch maps the feature converter's keys to [batch_size / hosts, length] arrays. The
  iterator is tf.data's `as_numpy_iterator()`, which is trackable: `input_state.save` /
  `restore` checkpoint its position (including the prefetch and shuffle buffers). With
  `skip_batches` the stream instead starts after that many batches, by producing and
  dropping them (the replay fallback; its cost grows with the number). `use_cached` reads
  every task from seqio's cache (`t2t.data.cache`). `num_threads` defaults to
  `input_threads()` (gin). `check_not_empty=False` skips the empty-split check (for a caller
  that made it already, before the slow part of its start-up).
  """
  # Clear errors for an unknown name, a missing split, or data that would have to be downloaded.
  provider = registry.get_mixture_or_task(mixture_or_task_name)
  registry.check_split_readable(provider, split)
  # An empty split would hang (repeat() of an all-filtered source) or end the stream at step 0.
  if check_not_empty:
    registry.check_split_not_empty(provider, split, task_feature_lengths, use_cached=use_cached)
  ds = per_host_dataset(mixture_or_task_name, task_feature_lengths, feature_converter,
                        batch_size, seed=seed, split=split, shuffle=shuffle, use_cached=use_cached)
  if skip_batches:
    ds = ds.skip(skip_batches)
  num_threads = input_threads() if num_threads is None else num_threads
  options = tf.data.Options()
  options.threading.private_threadpool_size = num_threads
  options.threading.max_intra_op_parallelism = 1  # parallelism across elements, not within one
  ds = ds.with_options(options).prefetch(2)
  return ds.as_numpy_iterator()


@gin.configurable(denylist=["mixture_or_task_name", "task_feature_lengths", "feature_converter",
                             "batch_size", "seed", "split", "shuffle"])
def per_host_dataset(mixture_or_task_name: str, task_feature_lengths: Mapping[str, int],
                     feature_converter: seqio.FeatureConverter, batch_size: int, seed: int,
                     split: str = "train", shuffle: bool = True, shard_source: bool = False,
                     use_cached: bool = False, process_index: int | None = None,
                     process_count: int | None = None) -> tf.data.Dataset:
  """This host's rows of each global batch of `batch_size`: batches of batch_size / N rows.

  Default: the global stream (the same on every host) sliced to rows [p * B/N, (p + 1) * B/N),
  the rows `Partitioner.shard_batch` (jax.make_array_from_process_local_data) places on host p's
  devices. `shard_source`: host p reads source shard p of N instead. `process_index` and
  `process_count` default to JAX's (given explicitly by tests). `use_cached` reads seqio's cache.
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
      use_cached=use_cached,
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
