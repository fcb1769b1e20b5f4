"""Looking up seqio tasks and mixtures by name, with a helpful error for a mistyped name."""
from __future__ import annotations

import difflib
from typing import Union

import seqio

TaskOrMixture = Union[seqio.Task, seqio.Mixture]


def registered_names() -> list[str]:
  """All task and mixture names registered with seqio in this process, sorted."""
  return sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))


def get_mixture_or_task(name: str) -> TaskOrMixture:
  """Returns the registered seqio Task or Mixture called `name`.

  Raises:
    ValueError: when nothing is registered under `name`; the message lists the closest registered
      names and says how to get a task module imported.
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
      "registers yours with an 'import my_tasks' line in a gin file)"
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
      raise ValueError(
          f"task {task.name!r} cannot read split {split!r}: {err} t2t downloads nothing: prepare "
          "the data first (for a TFDS task: `tfds build <dataset>`, or point TFDS_DATA_DIR at a "
          "prepared copy).") from err
