"""Looking up seqio tasks, mixtures and objectives by name, with a helpful error for a mistyped name."""
from __future__ import annotations

import difflib
from typing import Mapping, Union

import gin
import seqio

TaskOrMixture = Union[seqio.Task, seqio.Mixture]


def registered_names() -> list[str]:
  """All task and mixture names registered with seqio in this process, sorted."""
  return sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))


def get_mixture_or_task(name: str,
                        how_to_import: str = "with an 'import my_tasks' line in a gin file"
                        ) -> TaskOrMixture:
  """Returns the registered seqio Task or Mixture called `name`.

  Raises:
    ValueError: when nothing is registered under `name`; the message lists the closest registered
      names and says how to get a task module imported (`how_to_import`: the caller's way).
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"A task or mixture name must be a non-empty string, got {name!r}.")
  names = registered_names()
  if name in names:
    return seqio.get_mixture_or_task(name)
  close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
  hint = f" Did you mean: {', '.join(close)}?" if close else ""
  raise ValueError(
      f"Unknown task or mixture {name!r}.{hint} ({len(names)} registered; import the module that "
      f"registers yours {how_to_import})"
  )


def check_split_readable(obj: seqio.Task | seqio.Mixture, split: str) -> None:
  """Raises a clear ValueError for a missing split or unprepared data (before anything downloads)."""
  if split not in obj.splits:
    raise ValueError(f"{obj.name!r} has no split {split!r}; its splits are {list(obj.splits)}.")
  for task in (list(obj.tasks) if isinstance(obj, seqio.Mixture) else [obj]):
    if split not in task.splits:
      continue  # a mixture skips a task without the split
    try:
      task.num_input_examples(split)
    except (KeyError, ValueError, FileNotFoundError) as err:
      # Only a TFDS source could have fetched its data; the others' errors say what to fix.
      hint = (" t2t downloads nothing: prepare the data first (`tfds build <dataset>`, or point "
              "TFDS_DATA_DIR at a prepared copy)." if isinstance(task.source, seqio.TfdsDataSource)
              else "")
      raise ValueError(f"task {task.name!r} cannot read split {split!r}: {err}{hint}") from err


class EmptySplitError(ValueError):
  """A task's split yields no examples (an empty file, a filter that drops everything)."""


def empty_split_error(task_name: str, split: str, mixture_name: str | None = None,
                      detail: str = "") -> EmptySplitError:
  """The error for task `task_name` whose `split` holds no examples (`detail`: what was tried)."""
  within = f" (in mixture {mixture_name!r})" if mixture_name and mixture_name != task_name else ""
  return EmptySplitError(
      f"Task {task_name!r}{within} yields no examples on split {split!r}{detail}. Check its data "
      "files (an empty file?) and its preprocessors (a filter that drops everything?), or "
      "choose another split.")


def check_split_not_empty(obj: seqio.Task | seqio.Mixture, split: str,
                          sequence_length: Mapping[str, int] | None,
                          use_cached: bool = False) -> None:
  """Raises EmptySplitError when a task of `obj` (one a mixture samples) yields no examples.

  Without this, training on an empty split either stops at once ("the training data ran out at
  step 0", after compiling) or hangs: `repeat()` over a source whose every example a filter
  drops spins forever, and so does a mixture sampling such a task. The check builds each task's
  pipeline for one epoch, unshuffled, with the run's `sequence_length`, and asks for its first
  example: the cost is that of one example for a normal corpus (whatever its size); only an
  empty or all-filtered split is read to its end -- once, and that is the error case.
  """
  mixture = obj.name if isinstance(obj, seqio.Mixture) else None
  for task in (list(obj.tasks) if isinstance(obj, seqio.Mixture) else [obj]):
    if split not in task.splits or (mixture and not obj.get_rate(task)):
      continue  # a mixture skips a task without the split, and never samples a rate of 0
    if not use_cached and task.source.num_input_examples(split) == 0:
      raise empty_split_error(task.name, split, mixture, " (its source holds none)")
    ds = task.get_dataset(dict(sequence_length) if sequence_length else None, split=split,
                          shuffle=False, num_epochs=1, use_cached=use_cached)
    if not any(True for _ in ds.take(1)):
      raise empty_split_error(task.name, split, mixture, " after its preprocessors")


# The unsupervised objectives of T5 Table 3, by the names t2t.data.objectives gives them.
OBJECTIVE_NAMES: tuple[str, ...] = (
    "span_corruption", "iid_noise_replace_spans", "iid_noise_drop_tokens", "bert_style",
    "mass_style", "deshuffling", "prefix_lm", "full_lm",
)


def get_objective(name: str):
  """The seqio preprocessor of the objective called `name` (one of OBJECTIVE_NAMES).

  Raises:
    ValueError: for an unknown name, listing the valid ones and the closest match.
  """
  from t2t.data import objectives
  if name in OBJECTIVE_NAMES:
    return getattr(objectives, name)
  close = difflib.get_close_matches(str(name), OBJECTIVE_NAMES, n=1, cutoff=0.5)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise ValueError(f"Unknown objective {name!r}.{hint} Objectives: {', '.join(OBJECTIVE_NAMES)}.")


@gin.configurable
def pretraining_objective(dataset, sequence_length, output_features,
                          name: str = "span_corruption"):
  """A seqio preprocessor applying the objective chosen by name, so that one gin line
  (`pretraining_objective.name = 'prefix_lm'`) switches the objective of a task built on it
  (e.g. `bbc_pretraining`). Each objective's own knobs stay bindable (`span_corruption.*`)."""
  return get_objective(name)(dataset, sequence_length, output_features)
