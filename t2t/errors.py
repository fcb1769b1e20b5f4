"""The error types the command line reports as one line (bad input), and the test for them.

Bad input (a gin file, a task name, a checkpoint, a data file) should end a run with one readable
line; a bug or a resource failure (XLA's RuntimeError on out-of-memory, a failed assertion in
JAX) must keep its traceback. `ValueError`, `FileNotFoundError`, `ImportError` and
`FloatingPointError` are t2t's bad-input errors throughout; a `RuntimeError` is bad input only
when it is a `UserError` or one of t2t's own RuntimeError subclasses (`USER_RUNTIME_ERRORS`).
"""
from __future__ import annotations


class UserError(RuntimeError):
  """A run cannot go on because of its input (not a bug); the CLI prints the message alone."""


# t2t's RuntimeError subclasses that report bad input (by name: importing their modules here
# would import JAX and TensorFlow into every entry point's start-up).
USER_RUNTIME_ERRORS = ("StudyError", "PhaseError")
USER_INPUT_ERRORS = (ValueError, FileNotFoundError, FloatingPointError, ImportError)


def is_user_error(e: BaseException) -> bool:
  """Whether `e` is bad input (one line) rather than a bug or a resource failure (traceback)."""
  if isinstance(e, (UserError, *USER_INPUT_ERRORS)):
    return True
  return isinstance(e, RuntimeError) and any(
      cls.__name__ in USER_RUNTIME_ERRORS and cls.__module__.startswith("t2t.")
      for cls in type(e).__mro__)
