"""benchmarks/matmul_roof.py: more threads than cores is a one-line usage error, not a traceback."""
import os
import sys

import pytest

from benchmarks import matmul_roof


def test_too_many_threads_is_a_usage_error_naming_the_cores(monkeypatch, capsys):
  cores = len(os.sched_getaffinity(0))
  monkeypatch.setattr(sys, 'argv', ['matmul_roof', 'jax', '--threads', str(cores + 1)])
  with pytest.raises(SystemExit) as exit_info:
    matmul_roof.main()
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert f'error: --threads {cores + 1} is more than the {cores} cores' in err
  assert 'Traceback' not in err
