"""benchmarks/cold_start.py at tiny size: every phase of a cold start, in order, measured."""
import pytest

from benchmarks import cold_start


def test_phases_of_a_tiny_cold_start_are_all_measured():
  result = cold_start.measure(calls=2, tiny=True)
  names = [p['name'] for p in result['phases']]
  assert names == ['build_trainer', 'init_state', 'lower_update', 'compile_update',
                   'trace_lower_gradient', 'compile_gradient', 'gradient_call_1',
                   'update_call_1', 'gradient_call_2']
  for phase in result['phases']:
    assert phase['wall_s'] > 0 and phase['cpu_s'] >= 0 and phase['system_s'] >= 0
    assert phase['page_faults'] >= 0
  # Compiling the gradient program is work; a call of the tiny compiled program is far less.
  by_name = {p['name']: p for p in result['phases']}
  assert by_name['compile_gradient']['wall_s'] > by_name['gradient_call_2']['wall_s']
  assert result['temp_bytes'] > 0
  assert result['shapes'] == {'batch': 2, 'enc_len': 16, 'dec_len': 8}


def test_bad_arguments_are_refused_before_anything_runs():
  with pytest.raises(SystemExit, match='--calls must be >= 1'):
    cold_start.main(['--calls', '0', '--tiny'])
  with pytest.raises(SystemExit, match='more than the'):
    cold_start.main(['--threads', '4096', '--tiny'])
