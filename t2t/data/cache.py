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
that has no cache point or whose cache is not found. Before Beam starts, `check_cache_job_tasks`
refuses a `--tasks` entry that would cache nothing (seqio only logs a warning and exits 0): an
unknown name (with the closest registered ones), a mixture, or tasks without a cache point.
"""
from __future__ import annotations

import difflib
import importlib
import logging
import re
import sys
from typing import Callable, Sequence

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


_REGEX_CHARS = set("*+?[](){}|^$\\")
_IMPORT_HINT = "with --module_import=my.tasks (t2t's own tasks: --module_import=tasks)"


def _no_cache_point(names: Sequence[str]) -> str:
  """Why tasks `names` cannot be cached, and the cacheable tasks with the closest names."""
  cacheable = [n for n in seqio.TaskRegistry.names()
               if seqio.TaskRegistry.get(n).supports_caching]
  close = sorted({c for n in names for c in difflib.get_close_matches(n, cacheable, n=3,
                                                                       cutoff=0.6)})
  hint = f" Tasks with a cache point and close names: {', '.join(close)}." if close else ""
  listed = ", ".join(repr(n) for n in names)
  one = len(names) == 1
  return (f"{'task' if one else 'tasks'} {listed} {'has' if one else 'have'} no cache point (no "
          "seqio.CacheDatasetPlaceholder() among the preprocessors), so seqio's cache job would "
          f"skip {'it' if one else 'them'} and write nothing. Add seqio.CacheDatasetPlaceholder() "
          f"to {'its' if one else 'their'} preprocessors after the deterministic ones, or cache "
          f"another task.{hint}")


def check_cache_job_tasks(patterns: Sequence[str] | None,
                          excluded: Sequence[str] | None = None) -> list[str]:
  """The tasks seqio's cache job will cache for `--tasks` `patterns` and `--excluded_tasks`.

  seqio reads each entry as a regex over the task registry and skips a task without a cache point
  (`seqio.Task.supports_caching`) with an info line; an entry that so selects nothing would end
  the job with exit status 0 and nothing written. Raises ValueError for such an entry instead: an
  unknown name (with the closest registered names), a mixture (seqio caches tasks: its tasks
  are named), a regex that matches no task, an entry whose every task is excluded, or tasks that
  have no cache point. `patterns` None (no --tasks) means every registered task, unchecked.
  """
  names = list(seqio.TaskRegistry.names())
  if patterns is None:
    return [n for n in names if seqio.TaskRegistry.get(n).supports_caching]

  def regex(pattern: str, flag: str) -> re.Pattern:
    try:
      return re.compile(rf"({pattern})\Z")
    except re.error as e:
      raise ValueError(f"{flag}: {pattern!r} is not a valid regular expression ({e}).") from e

  skipped = [regex(p, "--excluded_tasks") for p in excluded or []]
  chosen: list[str] = []
  for pattern in patterns:
    matched = [n for n in names if regex(pattern, "--tasks").match(n)]
    if not matched:
      if _REGEX_CHARS & set(pattern):
        raise ValueError(f"--tasks: the pattern {pattern!r} matches no registered task "
                         f"({len(names)} registered; import the module that registers yours "
                         f"{_IMPORT_HINT}).")
      provider = registry.get_mixture_or_task(pattern, how_to_import=_IMPORT_HINT)
      raise ValueError(f"--tasks: {pattern!r} is a mixture; seqio's cache job caches tasks: "
                       f"pass its tasks, --tasks={','.join(t.name for t in provider.tasks)}.")
    kept = [n for n in matched if not any(r.match(n) for r in skipped)]
    if not kept:
      raise ValueError(f"--tasks: every task {pattern!r} names ({', '.join(matched)}) is "
                       "excluded by --excluded_tasks: nothing to cache.")
    cacheable = [n for n in kept if seqio.TaskRegistry.get(n).supports_caching]
    if not cacheable:
      raise ValueError(f"--tasks={pattern}: {_no_cache_point(kept)}")
    chosen += [n for n in cacheable if n not in chosen]
  return chosen


def _checked(job_main: Callable[[Sequence[str]], None]) -> Callable[[Sequence[str]], None]:
  """seqio's cache job `job_main`, after `check_cache_job_tasks` on its flags."""
  def checked_main(argv: Sequence[str]) -> None:
    from absl import flags
    fv = flags.FLAGS
    for module in fv.module_import:  # what seqio's job imports first: the tasks' registrations
      if module:
        importlib.import_module(module)
    check_cache_job_tasks(fv.tasks, fv.excluded_tasks)
    job_main(argv)
  return checked_main


def main() -> None:
  """`python -m t2t.data.cache --tasks=... --output_cache_dir=... [seqio's cache flags]`.

  Bad input (an unknown task, a task without a cache point, a missing --module_import) ends the
  run with one line `error: ...` and exit status 1 (`t2t.cli.run`), before Beam starts.
  """
  from seqio.scripts import cache_tasks_main
  from t2t import cli
  ensure_crc32c()
  cli.run(_checked(cache_tasks_main.main))


if __name__ == "__main__":
  main()
