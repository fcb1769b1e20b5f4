"""Environment for the subprocesses tests start."""
import os


def xla_flags_with(*flags: str) -> str:
  """This session's XLA_FLAGS (tests/conftest.py sets the backend's optimisation level) plus
  `flags`, for a subprocess that needs its own (e.g. a number of simulated host devices)."""
  return " ".join([os.environ.get("XLA_FLAGS", ""), *flags]).strip()


# Python source to put first in a `python -c` script: from then on importing TensorFlow, seqio or
# their kin raises ImportError, as on an accelerator image that has none of them.
REFUSE_TENSORFLOW = """
import importlib.abc, sys
REFUSED = {'tensorflow', 'seqio', 'tensorflow_datasets', 'tensorflow_text', 'clu', 't5'}
class _Refuse(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name.split('.')[0] in REFUSED:
      raise ImportError(f'{name} is refused in this test (the GPU image has no TensorFlow)')
sys.meta_path.insert(0, _Refuse())
"""
