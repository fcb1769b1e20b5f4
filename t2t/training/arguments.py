"""Checks of the values gin hands to t2t.train, t2t.eval and t2t.infer, before anything runs.

Gin passes whatever a binding says: `--gin.TRAIN_STEPS="'abc'"` reaches `train` as a string,
`--gin.USE_PACKING="'no'"` as a (truthy) string, `--gin.BATCH_SIZE=0` as zero. Unchecked, these
end in a TypeError deep in the training loop, a TensorFlow `InvalidArgumentError` from tf.data,
or, worse, a run that goes on doing something else than was meant (packing on, the whole split
evaluated for `EVAL_NUM_EXAMPLES=0`, "nothing to train" for `TRAIN_STEPS=-5`). Each function
here returns the value when it is of the expected kind and otherwise raises a ValueError that
names the setting the way a user sets it, e.g. "TRAIN_STEPS (train.train_steps)".
"""
from __future__ import annotations

import numbers
import os
from typing import Any, Collection, Mapping


def _describe(value: Any) -> str:
  return f"{value!r} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(value: Any, name: str) -> int:
  """`value` as an int; a bool, float or string is refused."""
  if not _is_int(value):
    raise ValueError(f"{name} must be a whole number, got {_describe(value)}.")
  return int(value)


def positive_int(value: Any, name: str) -> int:
  """`value` as an int >= 1."""
  if not _is_int(value) or value < 1:
    raise ValueError(f"{name} must be a whole number >= 1, got {_describe(value)}.")
  return int(value)


def non_negative_int(value: Any, name: str, zero_means: str = "") -> int:
  """`value` as an int >= 0 (`zero_means`: what 0 does, for the message)."""
  if not _is_int(value) or value < 0:
    meaning = f" (0: {zero_means})" if zero_means else ""
    raise ValueError(f"{name} must be a whole number >= 0{meaning}, got {_describe(value)}.")
  return int(value)


def optional_positive_int(value: Any, name: str, none_means: str) -> int | None:
  """`value` as an int >= 1, or None (`none_means`: what None does, for the message)."""
  if value is None:
    return None
  if not _is_int(value) or value < 1:
    raise ValueError(f"{name} must be a whole number >= 1 or None ({none_means}), got "
                     f"{_describe(value)}.")
  return int(value)


def boolean(value: Any, name: str) -> bool:
  """`value` as a bool: True or False only (the string 'no' would be true)."""
  if not isinstance(value, bool):
    raise ValueError(f"{name} must be True or False, got {_describe(value)}.")
  return value


def feature_lengths(value: Any, name: str,
                    required: Collection[str] = ()) -> dict[str, int]:
  """`value` as {feature: length} with every length a whole number >= 1 and every feature in
  `required` present (a task's output features), e.g. {'inputs': 512, 'targets': 114}."""
  example = "{'inputs': 512, 'targets': 114}"
  if not isinstance(value, Mapping):
    raise ValueError(f"{name} must map each feature to its length, e.g. {example}; got "
                     f"{_describe(value)}.")
  bad = {k: v for k, v in value.items() if not isinstance(k, str) or not _is_int(v) or v < 1}
  if bad:
    raise ValueError(f"{name}: every length must be a whole number >= 1 under a feature name, "
                     f"got {bad!r} in {dict(value)!r}.")
  missing = sorted(set(required) - set(value))
  if missing:
    raise ValueError(f"{name} has no length for feature(s) {missing} of the task, whose "
                     f"features are {sorted(required)}; got {dict(value)!r}.")
  return {k: int(v) for k, v in value.items()}


def directory(value: Any, name: str) -> str:
  """`value` as a non-empty path (text or os.PathLike): '' would mean the working directory."""
  if isinstance(value, os.PathLike):
    value = os.fspath(value)
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"{name} must be a directory path, got {_describe(value)}; an empty one "
                     "would write into the working directory.")
  return value
