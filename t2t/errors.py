"""The error types the command line reports as one line (bad input), and the test for them.

Bad input (a gin file, a task name, a checkpoint, a data file) should end a run with one readable
line; a bug or a resource failure (XLA's RuntimeError on out-of-memory, a failed assertion in
JAX) must keep its traceback. `ValueError`, `FileNotFoundError`, `ImportError` and
`FloatingPointError` are t2t's bad-input errors throughout; a `RuntimeError` is bad input only
when it is a `UserError` or one of t2t's own RuntimeError subclasses (`USER_RUNTIME_ERRORS`).
"""
from __future__ import annotations

import difflib
import inspect
import re
from typing import Iterable, Sequence


class UserError(RuntimeError):
  """A run cannot go on because of its input (not a bug); the CLI prints the message alone."""


# t2t's RuntimeError subclasses that report bad input (by name: importing their modules here
# would import JAX and TensorFlow into every entry point's start-up).
USER_RUNTIME_ERRORS = ("StudyError", "PhaseError", "GridError", "DistributedInitError")
USER_INPUT_ERRORS = (ValueError, FileNotFoundError, FloatingPointError, ImportError)


def is_user_error(e: BaseException) -> bool:
  """Whether `e` is bad input (one line) rather than a bug or a resource failure (traceback)."""
  if isinstance(e, (UserError, *USER_INPUT_ERRORS)):
    return True
  return isinstance(e, RuntimeError) and any(
      cls.__name__ in USER_RUNTIME_ERRORS and cls.__module__.startswith("t2t.")
      for cls in type(e).__mro__)


def _closest(name: str, candidates: Iterable[str]) -> str:
  close = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
  return f"Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _parameters(fn) -> list[str]:
  target = fn.__init__ if inspect.isclass(fn) else fn
  try:
    return [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
  except (TypeError, ValueError):
    return []


def gin_suggestion(message: str) -> str:
  """"Did you mean ...?" for gin's unknown-configurable and unknown-parameter errors, else "".

  Suggestions come from gin's registry (difflib): the configurables registered by t2t's imports
  and the parameters of the named configurable.
  """
  import gin  # pylint: disable=g-import-not-at-top
  registry = gin.config._REGISTRY  # pylint: disable=protected-access
  unknown_param = re.search(r"Configurable '([\w.]+)' doesn't have a parameter named '(\w+)'",
                            message)
  if unknown_param:
    configurable = registry.get_match(unknown_param.group(1))
    if configurable is None:
      return ""
    return _closest(unknown_param.group(2), _parameters(configurable.wrapped))
  unknown = re.search(r"No configurable matching '([\w.]+)'", message)
  if unknown:
    names = [n for full, _ in registry.items() for n in (full, full.rsplit(".", 1)[-1])]
    return _closest(unknown.group(1), names)
  return ""


def macro_suggestion(unset: Sequence[str], bindings: Sequence[str]) -> str:
  """" Did you mean ...?" when a binding sets a macro whose name is close to an unset one."""
  bound = [b.split("=", 1)[0].strip() for b in bindings if "=" in b]
  hints = []
  for name in bound:
    if "." not in name and name not in unset:
      close = difflib.get_close_matches(name, list(unset), n=1, cutoff=0.75)
      if close:
        hints.append(f"you set {name!r}: did you mean {close[0]!r}?")
  return (" (" + "; ".join(hints) + ")") if hints else ""
