"""Which data file is damaged: the name TensorFlow leaves out of a DataLossError.

A truncated or corrupted TFRecord file (a cache shard cut short by a full disk, a copy that
stopped half-way, a flipped bit) makes tf.data raise `DataLossError: truncated record at 4988`
or `corrupted record at 2912` -- an offset, but neither the file nor the task. In a long run
that error arrives hours in, from one shard of dozens. t2t therefore:

- lists the TFRecord files a task or mixture reads for a split (`record_files`): the shards of
  seqio's cache for cached tasks, the files of a `seqio.TFExampleDataSource` read with
  `tf.data.TFRecordDataset` otherwise (other sources are not TFRecords, or not files t2t can
  list: TFDS, functions);
- reads each file through once, checking every record's length and CRC as tf.data does
  (`check_file`), within a time budget when a run has just failed (`scan`);
- turns the DataLossError of a training run or an evaluation into a DamagedDataError naming the
  task, the damaged file(s) and the way to repair them (`damaged_data_error`; t2t.train reads its
  first examples inside `naming_damaged_files` and its batches through `NamingDamagedFiles`,
  t2t.eval and the validation schedule their examples inside `naming_damaged_files`), a run's
  checkpoints being intact;
- checks every file on request: `python -m t2t.data.integrity MIXTURE_OR_TASK [--split=train]
  [--use_cached] [--cache_dir=DIR] [--module_import=tasks]` (exit status 1 when one is damaged).
"""
from __future__ import annotations

if __name__ == "__main__":  # the command line: quiet before TensorFlow is imported (t2t.logs)
  from t2t import logs
  logs.quiet()

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys
import time
from typing import Callable, Iterator, Sequence

import seqio
import tensorflow as tf

from t2t import errors
from t2t.data import cache, registry


class DamagedDataError(errors.UserError):
  """A data file a run reads is truncated or corrupted."""


@dataclasses.dataclass(frozen=True)
class Damage:
  task: str
  path: str
  message: str  # TensorFlow's first line, e.g. "truncated record at 4988"


@dataclasses.dataclass
class Scan:
  damaged: list[Damage]
  checked: int  # files read through
  total: int    # files listed


def record_files(mixture_or_task_name: str, split: str,
                 use_cached: bool = False) -> list[tuple[str, str]]:
  """(task name, path) of every TFRecord file `mixture_or_task_name` reads for `split`."""
  files = []
  for task in cache.leaf_tasks(mixture_or_task_name):
    if use_cached:
      source = task._get_cached_source(split)  # pylint: disable=protected-access  (seqio's own)
    else:
      source = task.source
      if not (isinstance(source, seqio.TFExampleDataSource)
              and source.reader_cls is tf.data.TFRecordDataset):
        continue
    if split in source.splits:
      files.extend((task.name, path) for path in source.list_shards(split))
  return files


def check_file(path: str) -> str | None:
  """None when every record of the TFRecord file `path` reads back; else TensorFlow's message."""
  try:
    tf.data.TFRecordDataset(path, buffer_size=1 << 20).reduce(
        tf.constant(0, tf.int64), lambda n, _: n + 1).numpy()
  except tf.errors.OpError as e:  # DataLossError mostly; a file gone or unreadable says so too
    return _tf_message(e)
  return None


def scan(files: Sequence[tuple[str, str]], budget_s: float | None = None,
         progress: Callable[[int, int], None] | None = None) -> Scan:
  """Reads `files` ((task, path) pairs) in order until done or `budget_s` seconds have passed;
  `progress(done, total)` is called after each file."""
  start = time.monotonic()
  result = Scan(damaged=[], checked=0, total=len(files))
  for task, path in files:
    if budget_s is not None and time.monotonic() - start > budget_s:
      break
    message = check_file(path)
    if message is not None:
      result.damaged.append(Damage(task, path, message))
    result.checked += 1
    if progress is not None:
      progress(result.checked, result.total)
  return result


def damaged_data_error(error: BaseException, mixture_or_task_name: str, split: str,
                       use_cached: bool = False, budget_s: float = 120.0,
                       training: bool = True) -> DamagedDataError:
  """The DamagedDataError to raise for `error` (a DataLossError from `mixture_or_task_name`'s
  stream), naming the damaged files found within `budget_s` seconds of reading. `training`: the
  error stopped a training run (whose checkpoints a rerun resumes from), else an evaluation."""
  after = ("the checkpoints written so far are intact, so rerunning the same command then "
           "resumes from the last one" if training else "then rerun the same command")
  what = f"{'the cache of ' if use_cached else ''}{mixture_or_task_name!r} (split {split!r})"
  check = (f"python -m t2t.data.integrity {mixture_or_task_name} --split={split}"
           f"{' --use_cached' if use_cached else ''}")
  try:
    files = record_files(mixture_or_task_name, split, use_cached)
  except Exception:  # noqa: BLE001  (a diagnosis of the error being raised must not replace it)
    files = []
  found = scan(files, budget_s=budget_s)
  said = _tf_message(error)
  if found.damaged:
    first = found.damaged[0]
    more = f" and {len(found.damaged) - 1} more" if len(found.damaged) > 1 else ""
    unchecked = (f"; {found.total - found.checked} of its {found.total} files were not checked "
                 f"in {budget_s:.0f} s (`{check}` checks them all)"
                 if found.checked < found.total else "")
    if use_cached:
      cache_dir = os.path.dirname(seqio.get_mixture_or_task(first.task).cache_dir.rstrip("/"))
      command = cache.cache_command([first.task], cache_dir) + ["--overwrite"]
      repair = (f"Rebuild that task's cache ({' '.join(command)}), or read the task without "
                "it (USE_CACHED_TASKS = False)")
    else:
      repair = "Copy or regenerate the file"
    return DamagedDataError(
        f"Damaged data in {what}: {first.path} of task {first.task!r}: {first.message}"
        f"{more}{unchecked}. {repair}; {after}.")
  if found.total == 0:
    where = "its sources are not TFRecord files t2t can list (TFDS, a function, an unlisted cache)"
  elif found.checked < found.total:
    where = (f"{found.checked} of its {found.total} TFRecord files read back whole in "
             f"{budget_s:.0f} s; `{check}` checks them all")
  else:
    where = f"all {found.total} of its TFRecord files read back whole now"
  intact = " The checkpoints written so far are intact." if training else ""
  return DamagedDataError(
      f"TensorFlow reported damaged data ({said}) while reading {what}, and {where}.{intact}")


@contextlib.contextmanager
def naming_damaged_files(mixture_or_task_name: str, split: str, use_cached: bool = False,
                         training: bool = True) -> Iterator[None]:
  """Turns a DataLossError raised inside into the DamagedDataError of `damaged_data_error`."""
  try:
    yield
  except tf.errors.DataLossError as e:
    raise damaged_data_error(e, mixture_or_task_name, split, use_cached,
                             training=training) from e


class NamingDamagedFiles:
  """Wraps a batch iterator so that a DataLossError from it becomes a DamagedDataError
  (`damaged_data_error`) naming the file; everything else passes through unchanged."""

  def __init__(self, batches: Iterator, mixture_or_task_name: str, split: str,
               use_cached: bool = False):
    self._batches = batches
    self._name, self._split, self._use_cached = mixture_or_task_name, split, use_cached

  def __iter__(self) -> "NamingDamagedFiles":
    return self

  def __next__(self):  # once per training step: a plain try, no context manager to build
    try:
      return next(self._batches)
    except tf.errors.DataLossError as e:
      raise damaged_data_error(e, self._name, self._split, self._use_cached) from e


def _tf_message(e: BaseException) -> str:
  """TensorFlow's error without its "{{function_node ...}}" prefix and "[Op:...]" suffix."""
  text = getattr(e, "message", None) or str(e)
  text = text.strip().splitlines()[0] if text.strip() else type(e).__name__
  if text.startswith("{{function_node"):
    text = text.split("}}", 1)[-1].strip()
  return text.split(" [Op:", 1)[0].strip()


def main(argv: Sequence[str] | None = None) -> int:
  """Checks every TFRecord file of a task or mixture; prints the damaged ones."""
  parser = argparse.ArgumentParser(
      prog="python -m t2t.data.integrity",
      description="Read every TFRecord file a task or mixture reads, and name the damaged ones.")
  parser.add_argument("mixture_or_task_name")
  parser.add_argument("--split", default="train")
  parser.add_argument("--use_cached", action="store_true", help="check seqio's cache of it")
  parser.add_argument("--cache_dir", action="append", default=[],
                      help="a directory of seqio's cache (repeatable)")
  parser.add_argument("--module_import", action="append", default=None,
                      help="a module registering the task (default: tasks)")
  args = parser.parse_args(argv)
  try:
    for module in args.module_import or ["tasks"]:
      importlib.import_module(module)
    if args.cache_dir:
      cache.add_cache_dirs(args.cache_dir)
    registry.check_split_readable(registry.get_mixture_or_task(args.mixture_or_task_name),
                                  args.split)
    files = record_files(args.mixture_or_task_name, args.split, args.use_cached)
  except (ValueError, FileNotFoundError, ImportError, AssertionError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not files:
    print(f"{args.mixture_or_task_name!r} reads no TFRecord files t2t can list for split "
          f"{args.split!r}: nothing to check.")
    return 0
  from tqdm import tqdm  # pylint: disable=g-import-not-at-top
  with tqdm(total=len(files), unit="file", desc="checking", file=sys.stderr,
            disable=not sys.stderr.isatty()) as bar:
    found = scan(files, progress=lambda done, _: bar.update(done - bar.n))
  for d in found.damaged:
    print(f"damaged: {d.path} (task {d.task!r}): {d.message}")
  print(f"{found.checked} files checked, {len(found.damaged)} damaged.")
  return 1 if found.damaged else 0


if __name__ == "__main__":
  sys.exit(main())
