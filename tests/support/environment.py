"""Environment for the subprocesses tests start."""
import os


def xla_flags_with(*flags: str) -> str:
  """This session's XLA_FLAGS (tests/conftest.py sets the backend's optimisation level) plus
  `flags`, for a subprocess that needs its own (e.g. a number of simulated host devices)."""
  return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()
