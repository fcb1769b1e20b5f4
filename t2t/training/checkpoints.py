"""Orbax checkpoints: parameters, optimizer state and run metadata, one directory per step.

Layout under MODEL_DIR: `checkpoint_<step>/{params,opt_state,meta}`, plus each host's input
iterator in `checkpoint_<step>/input_state/process_<i>` (t2t.training.input_state, written by
train.py). `meta` is JSON: the step, how many batches the input pipeline has consumed (the replay
fallback for checkpoints without input state), what the stream was built from (task, batch size,
feature lengths, packing, host count; a resume with other values is refused), and every
parameter's shape, which lets t2t refuse an incompatible checkpoint with a readable message before anything is
restored or overwritten. Parameters are a separate item so fine-tuning can load them alone.
Arrays are restored with the shardings the caller asks for, so a checkpoint written on one
mesh loads onto another.

MODEL_DIR and checkpoint paths may be URLs (gs://...; orbax writes them through tensorstore):
they are used as given, never made "absolute"; `file://` URLs and relative paths become absolute
local paths (t2t.training.paths). In a multi-host run every process calls `save` (orbax saves
collectively, each host writing its shards; process 0 the metadata) and a checkpoint written by
N processes restores in one.

Starting a run from another run's checkpoint may be partial (t2t.training.warm_start).
`load_params` and `warm_start.restore_params` take the loading run's vocabulary fingerprint
(t2t.data.vocabularies) and refuse a checkpoint trained with another one (`check_vocabulary`;
checkpoints without the record load unchecked).

Atomicity: orbax writes a step into `checkpoint_<N>.orbax-checkpoint-tmp*` and renames it when
complete, and never lists such a directory as a step, so an interrupted write is never restored
(leftover tmp directories are removed when the next Checkpointer opens the directory).
A finished checkpoint damaged later (a truncated or garbled file) is caught by
`Checkpointer.restore_latest_good`: it reports the step and file in one line, moves the directory
aside to `checkpoint_<N>.corrupt` (not a step name, so orbax neither restores it nor counts it
against `keep`) and restores the previous one. Retention then never deletes the only good
checkpoint: orbax removes old steps only after a new one is finalised, and the damaged ones are
no longer counted. The loaders of one given checkpoint (`load_params`, warm starts, probing,
LoRA merges) read it inside `reading`, which reports a failed read as CorruptCheckpointError in
one line naming the file instead of tensorstore's kilobytes of spec.

Asynchronous saves: orbax copies the arrays to host memory in `save` and writes them in a
background thread, so training goes on while the disk works (`save(..., blocking=False)`, as
train.py does). Files that belong to a step but are written outside orbax (each host's input
iterator state, in a *side directory* `MODEL_DIR/<side>/checkpoint_<N>/`) are written by
`save`'s `before` callback synchronously BEFORE the orbax save of step N starts, so they are
complete whenever orbax lists step N as finalised -- a kill at any moment leaves either no step
N (the side files are then an orphan, never read) or a step N with all its files. Process 0
removes the side directories of steps orbax does not list when a Checkpointer opens the
directory and once each save has finished. A pending save is finished (`wait`) before the next
one starts and in `close`; its errors surface there.

Disk full: an ENOSPC while writing step N (in `save` or, for a background write, in `wait`)
raises DiskFullError, one line naming the step and MODEL_DIR; the partial tmp directory and
step N's side files are removed, and the previous checkpoint (orbax deletes old steps only
after a new one is finalised) is intact for a rerun.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

from t2t import errors
from t2t.training import distributed, late_reads, paths, reporting

STEP_PREFIX = "checkpoint"


class CheckpointMismatchError(ValueError):
  """A checkpoint does not fit the configured model (different parameters or shapes)."""


class CorruptCheckpointError(errors.UserError):
  """A checkpoint's files do not read back (truncated or damaged): the one asked for
  (`load_params`, a warm start, probing, a LoRA merge) or, for a resume, every one in the model
  directory."""


class DiskFullError(errors.UserError):
  """The disk (or bucket quota) filled up while a checkpoint was written; the previous one is intact."""


CORRUPT_SUFFIX = ".corrupt"
TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a step directory being written


def param_shapes(params: Any) -> dict[str, list[int]]:
  """{'encoder/layers_0/.../kernel': shape} for every leaf of a parameter tree."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {"/".join(key_name(k) for k in path): list(np.shape(leaf)) for path, leaf in flat}


def key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


RESUME_ADVICE = "Use a fresh MODEL_DIR or the matching model gin file."
LOAD_ADVICE = "Give the model gin file(s) and bindings the checkpoint was trained with."


def check_compatible(saved: Mapping[str, list[int]], expected: Mapping[str, list[int]],
                     where: str, advice: str = RESUME_ADVICE) -> None:
  """Raises CheckpointMismatchError naming the first parameter that differs, then `advice`
  (resuming a MODEL_DIR: a fresh one or the matching gin file; loading a checkpoint to
  evaluate, decode, convert or start from: only the matching gin file helps)."""
  for name in sorted(set(saved) | set(expected)):
    if name not in saved:
      raise CheckpointMismatchError(
          f"The checkpoint at {where} does not fit the configured model: parameter '{name}' "
          f"(shape {tuple(expected[name])}) is missing from the checkpoint. Was it written by "
          f"another model configuration? {advice}")
    if name not in expected:
      raise CheckpointMismatchError(
          f"The checkpoint at {where} does not fit the configured model: it has parameter "
          f"'{name}' (shape {tuple(saved[name])}) that the model lacks. {advice}")
    if list(saved[name]) != list(expected[name]):
      raise CheckpointMismatchError(
          f"The checkpoint at {where} does not fit the configured model: parameter '{name}' "
          f"has shape {tuple(saved[name])} in the checkpoint but {tuple(expected[name])} in the "
          f"model. {advice}")


def abstract_arrays(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


class _BackgroundWriteErrors(logging.Filter):
  """Drops the error logs of orbax's background threads (and of asyncio's tasks they leave
  behind) about writes under a Checkpointer's directory.

  The error itself is raised again in the main thread by `Checkpointer.wait` -- one line for a
  full disk, with its traceback otherwise -- so these logs would only bury that message
  under several tracebacks of the same failure.
  """

  def __init__(self):
    super().__init__()
    self.model_dirs: set[str] = set()

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR or not self.model_dirs:
      return True
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += " " + str(record.exc_info[1])
    return not any(f"{d}/{STEP_PREFIX}_" in text for d in self.model_dirs)


_BACKGROUND_ERRORS = _BackgroundWriteErrors()
for _name in ("absl", "asyncio"):
  logging.getLogger(_name).addFilter(_BACKGROUND_ERRORS)


class Checkpointer:
  """Saves and restores training state in a model directory."""

  def __init__(self, model_dir: str, keep: int | None = 3, side_dirs: Sequence[str] = ()):
    """`side_dirs`: directories under `model_dir` holding per-step files written outside orbax
    (`<side>/checkpoint_<N>/`), kept and removed with their steps (see the module docstring)."""
    self.model_dir = paths.to_str(model_dir)
    self.side_dirs = tuple(side_dirs)
    self._pending: int | None = None  # the step whose asynchronous save may still be running
    _BACKGROUND_ERRORS.model_dirs.add(self.model_dir.rstrip("/"))
    self._manager = ocp.CheckpointManager(
        self.model_dir,
        item_names=("params", "opt_state", "meta"),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, step_prefix=STEP_PREFIX, create=True,
            cleanup_tmp_directories=True, enable_async_checkpointing=True))
    self._prune_side_dirs()  # orphans of a run killed mid-save, or before its clean-up

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def read_meta(self, step: int) -> dict[str, Any]:
    return dict(self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
                ["meta"])

  def step_dir(self, step: int) -> str:
    return step_dir(self.model_dir, step)

  def check(self, params_abstract: Any, step: int | None = None) -> None:
    """Refuses a checkpoint (default: the latest) whose parameters do not fit `params_abstract`."""
    step = self.latest_step() if step is None else step
    if step is not None:
      check_compatible(self.read_meta(step)["param_shapes"], param_shapes(params_abstract),
                       self.step_dir(step))

  def restore_latest_good(
      self, params: Any, params_shardings: Any, opt_state: Any, opt_state_shardings: Any,
      check_meta: Callable[[int, dict[str, Any]], None] | None = None,
  ) -> tuple[int, Any, Any, dict[str, Any]] | None:
    """(step, params, opt_state, meta) of the newest checkpoint that reads back whole.

    A checkpoint whose meta or arrays fail to read (a truncated or garbled file; any error but
    running out of memory) is reported in one line naming the step and file, moved aside to `checkpoint_<N>.corrupt` (by process 0)
    and the next older one is tried. `check_meta(step, meta)` may refuse a readable checkpoint
    (e.g. another task); that error, and CheckpointMismatchError, propagate. Returns None when
    the directory holds no checkpoint; raises CorruptCheckpointError when none is readable.
    """
    steps = sorted(self._manager.all_steps(), reverse=True)
    last_error = None
    late_reads.ignore_late_read_completions()  # a damaged step's stragglers print nothing
    for step in steps:
      try:
        meta = self.read_meta(step)
      except Exception as e:  # noqa: BLE001  (any read failure means the step is damaged)
        last_error = self._set_aside(step, "meta", e)
        continue
      check_compatible(meta["param_shapes"], param_shapes(params), self.step_dir(step))
      if check_meta is not None:
        check_meta(step, meta)
      try:
        p, o, meta = self.restore(step, params, params_shardings, opt_state,
                                  opt_state_shardings, checked=True)
      except Exception as e:  # noqa: BLE001
        if _is_resource_failure(e):  # out of memory is no sign of damage: keep the traceback
          raise
        last_error = self._set_aside(step, "params", e)
        continue
      return step, p, o, meta
    if steps:
      raise CorruptCheckpointError(
          f"No readable checkpoint in {self.model_dir}: steps {sorted(steps)} are all damaged "
          f"(moved aside as *{CORRUPT_SUFFIX}). Use a fresh MODEL_DIR or restore a "
          "backup.") from last_error
    return None

  def _set_aside(self, step: int, item: str, error: BaseException) -> BaseException:
    """Reports a damaged step in one line and moves it out of orbax's sight."""
    reporting.announce(
        f"Checkpoint {step} is corrupted ({_read_failure(self.step_dir(step), item, error)}); "
        f"moving it aside to {STEP_PREFIX}_{step}{CORRUPT_SUFFIX} and using the previous one.")
    if distributed.is_writer():
      src = paths.resolve(self.step_dir(step))
      dst = src.parent / (src.name + CORRUPT_SUFFIX)
      n = 0
      while dst.exists():
        n += 1
        dst = src.parent / f"{src.name}{CORRUPT_SUFFIX}.{n}"
      src.rename(dst)
    distributed.sync(f"t2t_corrupt_checkpoint_{step}")
    self._manager.reload()
    return error

  def save(self, step: int, params: Any, opt_state: Any, meta: Mapping[str, Any],
           before: Callable[[int], None] | None = None, blocking: bool = True) -> None:
    """Saves step `step`: parameters, optimizer state and `meta` (JSON).

    Finishes a pending save first. `before(step)` then writes the step's side files (every
    host its own) before orbax starts, so a finalised step always has them. With `blocking`
    False the arrays are copied to the host and written in the background: call `wait` (or
    the next `save`, or `close`) to finish. Raises DiskFullError when the disk fills up.
    """
    self.wait()
    meta = {**meta, "step": int(step), "param_shapes": param_shapes(params)}
    items = {"params": ocp.args.StandardSave(params), "meta": ocp.args.JsonSave(meta)}
    if jax.tree.leaves(opt_state):  # a stateless optimizer (SGD) has nothing to save
      items["opt_state"] = ocp.args.StandardSave(opt_state)
    try:
      if before is not None:
        if distributed.is_writer():  # an orphan of an interrupted run must not mix in
          for side in self.side_dirs:
            _remove(self.side_step_dir(side, step))
        distributed.sync(f"t2t_side_dirs_cleared_{step}")
        before(step)
      self._pending = step
      self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    except BaseException as e:
      self._pending = None
      self._failed(step, e)
      raise
    if blocking:
      self.wait()

  def wait(self) -> None:
    """Finishes a pending asynchronous save, then removes the side directories of the steps
    orbax no longer keeps. Raises DiskFullError when the disk filled up during the write."""
    step, self._pending = self._pending, None
    if step is None:
      return
    try:
      self._manager.wait_until_finished()
    except BaseException as e:
      self._failed(step, e)
      raise
    self._prune_side_dirs()

  def side_step_dir(self, side: str, step: int) -> str:
    """MODEL_DIR/<side>/checkpoint_<step>: where files of `step` written outside orbax go."""
    return f"{self.model_dir.rstrip('/')}/{side}/{STEP_PREFIX}_{step}"

  def _prune_side_dirs(self) -> None:
    if not self.side_dirs or not distributed.is_writer():
      return
    keep = {f"{STEP_PREFIX}_{s}" for s in self._manager.all_steps()}
    for side in self.side_dirs:
      root = paths.resolve(f"{self.model_dir.rstrip('/')}/{side}")
      if root.exists():
        for d in root.iterdir():
          if d.name.startswith(STEP_PREFIX + "_") and d.name not in keep:
            _remove(os.fspath(d))

  def _failed(self, step: int, error: BaseException) -> None:
    """Cleans up after a failed save of `step`; raises DiskFullError when the disk is full."""
    if not _is_disk_full(error):
      return  # an unexpected error keeps its traceback
    self._drain_background_writes()
    if distributed.is_writer():  # removing frees space; orbax never lists a tmp dir anyway
      for side in self.side_dirs:
        _remove(self.side_step_dir(side, step))
      # Should a write still run into the tmp directory, remove it until it stays gone; one
      # recreated later is removed when MODEL_DIR is next opened.
      for _ in range(20):
        tmp = list(paths.resolve(self.model_dir).glob(f"{STEP_PREFIX}_{step}{TMP_SUFFIX}*"))
        if not tmp:
          break
        for path in tmp:
          _remove(os.fspath(path))
        time.sleep(0.1)
    self._manager.reload()  # what is on disk now: the failed step is not
    previous = [s for s in self._manager.all_steps() if s != step]
    intact = (f"the previous checkpoint (step {max(previous)}) is intact" if previous else
              "there is no earlier checkpoint")
    raise DiskFullError(
        f"No space left on the device while writing checkpoint {step} to {self.model_dir} "
        f"({_first_line(error)}); {intact}. Free some space (or lower "
        "train.keep_checkpoints) and rerun the same command to resume.") from error

  def _drain_background_writes(self, timeout: float = 120.0) -> None:
    """Waits for the other item writes of a failed asynchronous save to end.

    orbax raises the first failure without waiting for the rest; removing the tmp directory
    under them, or exiting while they run, would print a cascade of their errors. (orbax has
    no public API for this: its commit futures are looked up defensively.)
    """
    async_manager = getattr(getattr(self._manager, "_checkpointer", None), "_async_manager", None)
    for f in getattr(async_manager, "_commit_futures", None) or ():
      try:
        f.result(timeout=timeout)
      except Exception:  # noqa: BLE001  (their errors are the one being reported, or follow it)
        pass

  def restore(self, step: int, params: Any, params_shardings: Any, opt_state: Any,
              opt_state_shardings: Any, checked: bool = False) -> tuple[Any, Any, dict[str, Any]]:
    """Restores (params, opt_state, meta) at `step` onto the given shardings."""
    if not checked:
      self.check(params, step)
    items = {"params": ocp.args.StandardRestore(abstract_arrays(params, params_shardings)),
             "meta": ocp.args.JsonRestore()}
    if jax.tree.leaves(opt_state):
      items["opt_state"] = ocp.args.StandardRestore(abstract_arrays(opt_state, opt_state_shardings))
    out = self._manager.restore(step, args=ocp.args.Composite(**items))
    return out["params"], out.get("opt_state", opt_state), dict(out["meta"])

  def close(self) -> None:
    """Finishes a pending save (raising its error), waits for orbax's clean-up of unfinished
    temporary directories, and releases orbax's threads.

    orbax runs that clean-up on a thread of its own from the manager's creation and waits for it
    only before a save, not in `CheckpointManager.close`: a run that stops before its first save
    (a refused resume, bad input) would leave it running into interpreter shutdown, where it
    fails with a traceback printed after the clean error.
    """
    try:
      self.wait()
    finally:
      try:
        await_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
        if await_cleanup is not None:  # orbax's private method (0.12): absent, nothing to wait for
          await_cleanup()
      finally:
        self._manager.close()


def _is_resource_failure(e: BaseException) -> bool:
  return isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in str(e)


_DISK_FULL_TEXT = (os.strerror(errno.ENOSPC), "os_error_code='28'", "No space left on device")


def _is_disk_full(e: BaseException | None) -> bool:
  """Whether `e` (or an exception it was raised from) says the disk is full (ENOSPC).

  orbax may re-raise the OSError of a background write, or tensorstore and TensorFlow may
  report it as their own error with the OS's text; both are recognised.
  """
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
      return True
    if any(text in str(e) for text in _DISK_FULL_TEXT):
      return True
    e = e.__cause__ or e.__context__
  return False


def _causes(error: BaseException) -> list[BaseException]:
  """`error` and the exceptions it was raised from (or while handling), outermost first."""
  chain: list[BaseException] = []
  while error is not None and all(error is not seen for seen in chain):
    chain.append(error)
    error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
  return chain


def _read_failure(step_dir: str, item: str, error: BaseException) -> str:
  """"<file>: <ErrorType>: <first line of its message>" for a failed read of a checkpoint item.

  The file is the deepest under `step_dir` that the error or its causes name (else the item's
  directory); the message is the innermost cause's, tensorstore's own report: orbax wraps a
  failed array read in an `Exception` whose text is a bound method's repr and kilobytes of
  JSON spec, raised from tensorstore's `OUT_OF_RANGE: Error reading "<parameter>" ...`.
  """
  chain = _causes(error)
  named = [f for f in (_culprit_file(str(e), step_dir) for e in chain) if f]
  where = max(named, key=lambda f: f.count("/")) if named else f"{step_dir.rstrip('/')}/{item}"
  innermost = chain[-1]
  return f"{where.rstrip('/')}: {type(innermost).__name__}: {_first_line(innermost)}"


@contextlib.contextmanager
def reading(step_dir: str, item: str) -> Iterator[None]:
  """Turns a failed read of one item of a checkpoint (`params`, `meta`) into a
  CorruptCheckpointError in one line naming the file, chained to orbax's error (whose full text
  `T2T_TRACEBACK=1` shows). Out of memory is no sign of damage and propagates unchanged, as do
  t2t's own errors. For the loaders of a single checkpoint; a resume falls back instead
  (`Checkpointer.restore_latest_good`).
  """
  late_reads.ignore_late_read_completions()  # a failed read's stragglers print nothing
  try:
    yield
  except Exception as e:  # noqa: BLE001  (any read failure means the file is damaged)
    if _is_resource_failure(e) or isinstance(e, (CheckpointMismatchError, errors.UserError)):
      raise
    raise CorruptCheckpointError(
        f"Checkpoint {step_dir} cannot be read ({_read_failure(step_dir, item, e)}). If the file "
        "is truncated or damaged, restore it from a backup or point to another checkpoint "
        "(e.g. an earlier checkpoint_<N> directory of the same run).") from e


def _first_line(e: BaseException) -> str:
  text = str(e).strip()
  return (text.splitlines()[0][:200] if text else type(e).__name__)


def _remove(path: str) -> None:
  """Removes a file or directory tree if it is there (local path or URL)."""
  p = paths.resolve(path)
  if paths.is_url(path):
    if p.is_dir():
      p.rmtree()
    elif p.exists():
      p.unlink()
  elif os.path.isdir(p):
    shutil.rmtree(p, ignore_errors=True)
  elif os.path.lexists(p):
    os.remove(p)


def _culprit_file(message: str, step_dir: str) -> str | None:
  """The deepest path under `step_dir` that an orbax/tensorstore error message mentions (its
  messages name the item's database directory first, the damaged data file later)."""
  for prefix in (step_dir.rstrip("/"), os.path.basename(step_dir.rstrip("/"))):
    found = [m.rstrip(".,:;)]") for m in re.findall(re.escape(prefix) + r"/[^\s'\"]+", message)]
    if found:
      return max(found, key=lambda f: f.count("/"))
  return None


def step_dir(model_dir: str, step: int) -> str:
  """`model_dir/checkpoint_<step>`, for local paths and URLs alike."""
  return f"{model_dir.rstrip('/')}/{STEP_PREFIX}_{step}"


def resolve_checkpoint(path: str) -> tuple[str, int]:
  """(model_dir, step) for a model directory (its latest step) or a `checkpoint_<N>` dir.

  `path` may be a URL; the model_dir returned is a string (a URL stays a URL).
  """
  resolved = paths.resolve(path)
  base = resolved.name
  if base.startswith(STEP_PREFIX + "_") and base[len(STEP_PREFIX) + 1:].isdigit():
    return os.fspath(resolved.parent), int(base[len(STEP_PREFIX) + 1:])
  path = os.fspath(resolved)
  if not resolved.is_dir():
    if resolved.exists():
      raise FileNotFoundError(
          f"Checkpoint path '{path}' is a file, not a checkpoint: give a model directory "
          f"(holding {STEP_PREFIX}_<step> directories) or one {STEP_PREFIX}_<step> directory.")
    raise FileNotFoundError(f"Checkpoint path '{path}' does not exist.")
  prefix = STEP_PREFIX + "_"
  steps = sorted(int(d.name[len(prefix):]) for d in resolved.iterdir()
                 if d.name.startswith(prefix) and d.name[len(prefix):].isdigit())
  if not steps:
    raise FileNotFoundError(
        f"No checkpoint in '{path}': expected a model directory holding {STEP_PREFIX}_<step> "
        f"directories, or one {STEP_PREFIX}_<step> directory.")
  return path, steps[-1]


def load_params(path: str, params_abstract: Any, params_shardings: Any,
                vocabulary: Mapping[str, Mapping[str, Any]] | None = None) -> tuple[Any, int]:
  """Loads parameters alone (no optimizer state) from a checkpoint, e.g. to fine-tune.

  Returns (params, step). Raises CheckpointMismatchError when the shapes differ, and
  VocabularyMismatchError when `vocabulary` ({feature: t2t.data.vocabularies.fingerprint}, the
  vocabulary the caller will feed the parameters) differs from the one the checkpoint records
  (see `check_vocabulary`; checkpoints without a record, and `vocabulary=None`, are not checked).
  """
  model_dir, step = resolve_checkpoint(path)
  where = step_dir(model_dir, step)
  manager = ocp.CheckpointManager(
      model_dir, item_names=("params", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix=STEP_PREFIX, read_only=True))
  try:
    with reading(where, "meta"):
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    check_vocabulary(meta, vocabulary, where)  # first: another vocabulary explains a shape
    check_compatible(meta["param_shapes"], param_shapes(params_abstract), where, LOAD_ADVICE)
    with reading(where, "params"):
      params = manager.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore(abstract_arrays(params_abstract, params_shardings))))["params"]
  finally:
    manager.close()
  return params, step


class VocabularyMismatchError(CheckpointMismatchError):
  """A checkpoint was trained with another vocabulary than the one its parameters would be fed."""


def check_vocabulary(meta: Mapping[str, Any], vocabulary: Mapping[str, Mapping[str, Any]] | None,
                     where: str) -> None:
  """Raises VocabularyMismatchError when `vocabulary` differs from the checkpoint's record.

  The record (`meta['vocabulary']`, written by `t2t.train` from
  `t2t.training.input_state.run_meta`) holds each feature's vocabulary class, size, extra ids
  and a hash of its SentencePiece model. Checkpoints written before t2t recorded it (or by tools
  such as convert_checkpoint) carry none and load unchecked; so does a call with
  `vocabulary=None`. Only the features both name are compared.

  Equal shapes do not make a vocabulary fit: another SentencePiece model of the same size
  passes every shape check and silently gives each token another token's embedding.
  """
  from t2t.data import vocabularies  # pylint: disable=g-import-not-at-top
  saved = meta.get("vocabulary")
  if not saved or not vocabulary:
    return
  diffs = vocabularies.differences(saved, vocabulary)
  if diffs:
    raise VocabularyMismatchError(
        f"The checkpoint at {where} was trained with another vocabulary: {'; '.join(diffs)}. "
        "Its embeddings would be read with other token ids: use the vocabulary it was trained "
        "with (the task's output features and the model's input/output vocabulary), or a "
        "checkpoint trained with this one.")
