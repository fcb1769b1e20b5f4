"""Limited training data: a task whose train split is N examples drawn with a seed (STILTs §4).

Phang et al. cap each target task's training set at 5k and 1k examples, "selected randomly
without replacement", redrawing the subsample for every random restart; a training set already
smaller than the cap is used as it is. `limited_task('rte', 1000, seed=3)` registers (once) and
returns the name of the derived seqio task `rte_n1000_seed3`:

- its `train` split holds the examples at N distinct positions of the original train split (in
  the source's unshuffled order), chosen by `numpy.random.default_rng(seed)`; the same
  (task, N, seed) always gives the same examples, another seed another draw;
- every other split, the preprocessors, output features, postprocessor and metrics are the
  original task's, so validation scores are comparable across caps and seeds.

In gin (gin/recipes/limited_data.gin), so that one SEED macro drives the draw and the run:

    MIXTURE_OR_TASK_NAME = @limited_task()
    limited_task.task_name = 'bbc_topic'
    limited_task.num_examples = 1000
    limited_task.seed = %SEED

The draw reads the train split's source once to count it when the source does not know its size.
"""
from __future__ import annotations

from typing import Optional, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from t2t.data import registry


def limited_name(task_name: str, num_examples: int, seed: int) -> str:
  return f"{task_name}_n{num_examples}_seed{seed}"


def draw_indices(total: int, num_examples: int, seed: int) -> np.ndarray:
  """Sorted positions of `min(num_examples, total)` distinct examples out of `total`."""
  if num_examples <= 0:
    raise ValueError(f"limited_task.num_examples must be positive, got {num_examples}.")
  if num_examples >= total:
    return np.arange(total)
  return np.sort(np.random.default_rng(seed).choice(total, size=num_examples, replace=False))


class LimitedSource(seqio.DataSource):
  """`source` with its train split reduced to the examples at `indices` (other splits as-is)."""

  def __init__(self, source: seqio.DataSource, indices: np.ndarray, total: int,
               split: str = "train"):
    self._source, self._indices, self._split = source, np.asarray(indices, np.int64), split
    self._keep = np.zeros(total, bool)
    self._keep[self._indices] = True
    counts = {}
    for s in source.splits:
      counts[s] = len(self._indices) if s == split else source.num_input_examples(s)
    super().__init__(splits=source.splits,
                     num_input_examples=counts if None not in counts.values() else None,
                     caching_permitted=False)

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True

  def list_shards(self, split: str) -> Sequence[str]:
    return self._source.list_shards(split) if split != self._split else [self._split]

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, *, sequence_length=None,
                  use_cached: bool = False, num_epochs: Optional[int] = 1) -> tf.data.Dataset:
    del sequence_length, use_cached, num_epochs
    if split != self._split:
      return self._source.get_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info)
    keep = tf.constant(self._keep)
    ds = self._source.get_dataset(split, shuffle=False, seed=None).enumerate()
    ds = ds.filter(lambda i, _: tf.gather(keep, i)).map(lambda _, ex: ex)
    if shard_info is not None and shard_info.num_shards > 1:
      ds = ds.shard(shard_info.num_shards, shard_info.index)
    if shuffle:
      ds = ds.shuffle(len(self._indices), seed=seed)
    return ds


def _count(source: seqio.DataSource, split: str) -> int:
  known = source.num_input_examples(split)
  if known is not None:
    return int(known)
  return int(source.get_dataset(split, shuffle=False).reduce(np.int64(0), lambda n, _: n + 1))


@gin.configurable
def limited_task(task_name: str = gin.REQUIRED, num_examples: int = gin.REQUIRED,
                 seed: int = 0, split: str = "train") -> str:
  """Registers `<task>_n<N>_seed<S>` (if needed) and returns its name; see the module docstring."""
  name = limited_name(task_name, num_examples, seed)
  if name in seqio.TaskRegistry.names():
    return name
  task = registry.get_mixture_or_task(task_name)
  if not isinstance(task, seqio.Task):
    raise ValueError(f"limited_task caps one task's training split; {task_name!r} is a mixture. "
                     "Cap each of its tasks and build the mixture from those.")
  registry.check_split_readable(task, split)
  total = _count(task.source, split)
  if not total:
    raise registry.empty_split_error(task_name, split, detail=" (its source holds none)")
  indices = draw_indices(total, num_examples, seed)
  seqio.TaskRegistry.add(
      name,
      source=LimitedSource(task.source, indices, total, split),
      output_features=task.output_features,
      preprocessors=task.preprocessors,
      postprocess_fn=task.postprocessor,
      metric_fns=list(task.metric_fns),
      metric_objs=list(getattr(task, "_metric_objs_constructor_args", ())),
      shuffle_buffer_size=getattr(task, "_shuffle_buffer_size", 1000))
  return name
