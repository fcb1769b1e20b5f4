"""The input pipeline's position, saved with each checkpoint, so that a resume never replays data.

Every host saves its OWN tf.data iterator state (`tf.train.Checkpoint(iterator=...)`) to
`MODEL_DIR/input_state/checkpoint_<step>/process_<i>` (`.index` + `.data-*` files), a side
directory of the checkpoint (t2t.training.checkpoints): it is written synchronously BEFORE the
(asynchronous) orbax save of the step starts, and a resume reads only the state of a step orbax
lists as finalised, so the state always belongs to its step, whenever the process is killed.
Process 0 removes a state when orbax removes its step. Restoring it puts the rebuilt pipeline
exactly where it was -- shuffle buffer, random preprocessors' seeds, packing state and
prefetched batches included -- in time that does not depend on the step (about the size of the
buffers, a few MB). Runs written before this layout kept the state inside the step directory,
`MODEL_DIR/checkpoint_<step>/input_state/process_<i>`; it is still read from there.

Why iterator checkpointing and not index-based reads: seqio's streams are tf.data pipelines
(shuffle buffers, packing, mixtures sampling among tasks, random objectives) with no cheap map
from a step to the examples it holds; tf.data already knows how to serialise each stage's
position. The cost is that every stage must be checkpointable: a `from_generator` source (a
Python generator) is not, and then no state is saved and a resume falls back to replaying the
stream (`skip`), with a message saying so.

`run_meta` / `check_resumable`: what a checkpoint's stream was built from (mixture or task, batch
size, feature lengths, packing, host count, cached tasks), stored in the checkpoint's `meta`; a
resume with other values is refused, naming each one that changed.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import tensorflow as tf

from t2t.training import checkpoints

STATE_DIR = "input_state"


class ResumeMismatchError(ValueError):
  """The run's input settings differ from those the checkpoint in MODEL_DIR was written with."""


def step_dir(model_dir: str, step: int) -> str:
  """MODEL_DIR/input_state/checkpoint_<step>: every host's state for the checkpoint at `step`."""
  return os.path.join(model_dir, STATE_DIR, f"{checkpoints.STEP_PREFIX}_{step}")


def state_prefix(model_dir: str, step: int, process_index: int | None = None,
                 legacy: bool = False) -> str:
  """MODEL_DIR/input_state/checkpoint_<step>/process_<i>: this host's state files' prefix.

  With `legacy`, the older layout inside the step directory (checkpoint_<step>/input_state/).
  """
  index = jax.process_index() if process_index is None else process_index
  if legacy:
    return os.path.join(model_dir, f"{checkpoints.STEP_PREFIX}_{step}", STATE_DIR,
                        f"process_{index}")
  return os.path.join(step_dir(model_dir, step), f"process_{index}")


def _saved_prefix(model_dir: str, step: int) -> str | None:
  """This host's state prefix for `step` in the current or the older layout, if saved."""
  for legacy in (False, True):
    prefix = state_prefix(model_dir, step, legacy=legacy)
    if tf.io.gfile.exists(prefix + ".index"):
      return prefix
  return None


def exists(model_dir: str, step: int) -> bool:
  """Whether this host's input state was saved with the checkpoint at `step`.

  Only meaningful for a step orbax lists as finalised (a state is written before its step).
  """
  return _saved_prefix(model_dir, step) is not None


class NotCheckpointableError(ValueError):
  """The input pipeline holds a stage tf.data cannot save (e.g. a `from_generator` source)."""


def save(iterator: Any, model_dir: str, step: int) -> str:
  """Saves this host's iterator position for the checkpoint at `step`; returns its prefix.

  Call it BEFORE the orbax save of `step` starts (`Checkpointer.save`'s `before`), after
  exactly `step` batches have been drawn in all. Raises NotCheckpointableError (tf.data's reason, one line)
  when the pipeline cannot be saved; nothing is left behind then, so a resume replays.
  """
  prefix = state_prefix(model_dir, step)
  try:
    return tf.train.Checkpoint(iterator=iterator).write(prefix)
  except (tf.errors.UnimplementedError, tf.errors.FailedPreconditionError,
          tf.errors.InvalidArgumentError) as e:
    for path in tf.io.gfile.glob(prefix + ".*"):  # a partial write must not look restorable
      tf.io.gfile.remove(path)
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise NotCheckpointableError(reason) from e


def restore(iterator: Any, model_dir: str, step: int) -> None:
  """Puts a freshly built `iterator` at the position saved with the checkpoint at `step`.

  Raises ValueError naming the state file when it does not match the pipeline (the task's
  preprocessing or the data changed since it was saved).
  """
  prefix = _saved_prefix(model_dir, step) or state_prefix(model_dir, step)
  try:
    tf.train.Checkpoint(iterator=iterator).read(prefix).assert_consumed()
  except (tf.errors.OpError, AssertionError, ValueError) as e:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise ValueError(
        f"The input state {prefix} does not fit the rebuilt input pipeline ({first}). Did the "
        f"task's preprocessing or data change since step {step}? To resume anyway by replaying "
        f"the stream, delete {os.path.dirname(prefix)}.") from e


def run_meta(mixture_or_task_name: str, batch_size: int, task_feature_lengths: Mapping[str, int],
             use_packing: bool, use_cached_tasks: bool,
             vocabulary: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
  """What the training stream is built from, for the checkpoint's `meta` (JSON).

  `vocabulary` ({feature: t2t.data.vocabularies.fingerprint}) defaults to the registered task's
  or mixture's output-feature vocabularies (class, size, extra ids, a SentencePiece model hash);
  a name seqio does not know gets no record. `checkpoints.load_params` / `restore_params` compare
  it with the vocabulary of a run that loads the checkpoint's parameters.
  """
  from t2t.data import registry, vocabularies  # pylint: disable=g-import-not-at-top
  meta = {"mixture_or_task_name": mixture_or_task_name, "batch_size": int(batch_size),
          "task_feature_lengths": {k: int(v) for k, v in sorted(task_feature_lengths.items())},
          "use_packing": bool(use_packing), "num_hosts": jax.process_count(),
          "use_cached_tasks": bool(use_cached_tasks)}
  if vocabulary is None and mixture_or_task_name in registry.registered_names():
    vocabulary = vocabularies.task_record(registry.get_mixture_or_task(mixture_or_task_name))
  if vocabulary is not None:
    meta["vocabulary"] = {k: dict(v) for k, v in sorted(vocabulary.items())}
  return meta


_LABELS = {"mixture_or_task_name": "MIXTURE_OR_TASK_NAME", "batch_size": "BATCH_SIZE",
           "task_feature_lengths": "TASK_FEATURE_LENGTHS", "use_packing": "USE_PACKING",
           "num_hosts": "host count (jax.process_count())",
           "use_cached_tasks": "USE_CACHED_TASKS", "vocabulary": "the vocabulary"}


def check_resumable(saved: Mapping[str, Any], current: Mapping[str, Any], where: str) -> None:
  """Raises ResumeMismatchError naming every setting in `current` that differs from `saved`.

  Settings the checkpoint does not record (written by an older t2t) are not checked. A changed
  vocabulary is named feature by feature (class, size, extra ids, SentencePiece model hash).
  """
  from t2t.data import vocabularies  # pylint: disable=g-import-not-at-top
  changed = []
  for k, v in current.items():
    if k not in saved or _normalise(saved[k]) == _normalise(v):
      continue
    if k == "vocabulary":  # the features both hold (another task is named by its own setting)
      diffs = vocabularies.differences(saved[k], v)
      if diffs:
        changed.append(f"{_LABELS[k]} changed ({'; '.join(diffs)})")
    else:
      changed.append(f"{_LABELS.get(k, k)} was {saved[k]!r}, now {v!r}")
  if changed:
    raise ResumeMismatchError(
        f"Cannot resume the run in {where}: its input stream was built with other settings: "
        + "; ".join(changed) + ". Resume with the original settings, or use a fresh MODEL_DIR "
        "(to start from these weights, set INITIAL_CHECKPOINT_PATH instead).")


def _normalise(value: Any) -> Any:
  if isinstance(value, Mapping):
    return {str(k): _normalise(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_normalise(v) for v in value]
  return value
