"""Training from seqio's cache: tasks preprocessed once, at scale, by seqio's Apache Beam job.

seqio's cache job (`python -m seqio.scripts.cache_tasks_main`) runs every deterministic
preprocessor of a task up to its cache point (`seqio.CacheDatasetPlaceholder()` in its
preprocessor list) as a Beam pipeline -- the DirectRunner on one machine, Dataflow, Flink or
Spark at scale -- and writes TFRecord shards plus `info.<split>.json`, `stats.<split>.json`
and `COMPLETED` under `<cache dir>/<task name>/`. Training then reads those shards
(`seqio.get_dataset(..., use_cached=True)`) and applies only the preprocessors after the cache
point (random objectives such as span corruption stay online, so each epoch differs). Each
host reads its own subset of the shard files (`seqio.ShardInfo`), the same subset on every
run, as long as there are at least as many shards as hosts (`--min_shards`).

`python -m t2t.data.cache` runs that job, flags unchanged, after one fix-up: Beam's TFRecord
writer needs a CRC-32C function from python-snappy, google-crc32c or crcmod (the
`apache-beam[tfrecord]` extra); when none is installed (as in t2t's venv) it falls back to
TensorBoard's pure-Python CRC-32C, with a warning -- correct but slow, fine for small tasks on the
DirectRunner. Remote workers (Dataflow, Flink, Spark) need one of those packages in their image.
`cache_command` builds the command line; `check_cached` refuses, with the command to run, a task
that has no cache point or whose cache is not found.
"""
from __future__ import annotations

import logging
import sys
from typing import Sequence

import seqio

from t2t.data import registry


def add_cache_dirs(cache_dirs: Sequence[str]) -> None:
  """Adds directories where seqio looks for cached tasks (`seqio.add_global_cache_dirs`)."""
  if isinstance(cache_dirs, str):
    cache_dirs = [cache_dirs]
  seqio.add_global_cache_dirs(list(cache_dirs))


def leaf_tasks(mixture_or_task_name: str) -> list[seqio.Task]:
  """The tasks a task or mixture reads (a mixture's sub-mixtures flattened)."""
  provider = registry.get_mixture_or_task(mixture_or_task_name)
  if isinstance(provider, seqio.Mixture):
    return list(provider.tasks)
  return [provider]


def ensure_crc32c() -> str:
  """Makes Beam's TFRecord writer work without its optional CRC-32C packages; returns which
  implementation it will use ('native' or 'pure-python')."""
  from apache_beam.io import tfrecordio
  try:
    tfrecordio._default_crc32c_fn(b"")  # pylint: disable=protected-access
    return "native"
  except RuntimeError:
    from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
    logging.warning("No python-snappy, google-crc32c or crcmod: TFRecord checksums use a slow "
                    "pure-Python CRC-32C (install apache-beam[tfrecord] for speed).")
    tfrecordio._default_crc32c_fn.fn = pywrap_tensorflow.crc32c  # pylint: disable=protected-access
    return "pure-python"


def cache_command(task_names: Sequence[str], output_cache_dir: str,
                  module_imports: Sequence[str] = ("tasks",), runner: str = "DirectRunner",
                  pipeline_options: Sequence[str] = (), min_shards: int = 64,
                  python: str | None = None) -> list[str]:
  """argv of seqio's Beam cache job for `task_names` (exact names; seqio reads regexes).

  `pipeline_options` are Beam's own flags (e.g. `--project=...` for Dataflow); they join
  `--runner` in seqio's comma-separated `--pipeline_options`.
  """
  options = ",".join([f"--runner={runner}", *pipeline_options])
  return [python or sys.executable, "-m", "t2t.data.cache",
          f"--tasks={','.join(task_names)}", f"--output_cache_dir={output_cache_dir}",
          *[f"--module_import={m}" for m in module_imports],
          f"--min_shards={min_shards}", f"--pipeline_options={options}"]


def check_cached(mixture_or_task_name: str, split: str = "train") -> None:
  """Raises ValueError naming the first task of `mixture_or_task_name` that cannot be read
  from the cache: it has no cache point, or no cache with `split` is found in seqio's cache
  dirs. seqio itself would silently preprocess the first kind online."""
  for task in leaf_tasks(mixture_or_task_name):
    if not task.supports_caching:
      raise ValueError(
          f"USE_CACHED_TASKS is set but task {task.name!r} (in {mixture_or_task_name!r}) has no "
          "cache point: add seqio.CacheDatasetPlaceholder() to its preprocessors after the "
          "deterministic ones, or set USE_CACHED_TASKS = False.")
    if not task.cache_dir:
      dirs = seqio.utils.get_global_cache_dirs()
      raise ValueError(
          f"USE_CACHED_TASKS is set but task {task.name!r} is not cached in any of {dirs} "
          "(`train.cache_dirs`). Cache it with: "
          + " ".join(cache_command([task.name], dirs[0] if dirs else "CACHE_DIR")))
    if split not in task.splits:
      raise ValueError(f"The cache of task {task.name!r} at {task.cache_dir} has no split "
                       f"{split!r} (it has {list(task.splits)}).")


def main() -> None:
  """`python -m t2t.data.cache --tasks=... --output_cache_dir=... [seqio's cache flags]`."""
  from absl import app
  from seqio.scripts import cache_tasks_main
  ensure_crc32c()
  app.run(cache_tasks_main.main)


if __name__ == "__main__":
  main()
