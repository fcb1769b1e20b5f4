"""benchmarks/argmax_matches.py on a small vocabulary: three timings, and the three ways agree."""
import json

from benchmarks import argmax_matches


def test_three_ways_timed_and_agreeing(tmp_path, capsys):
  out = tmp_path / 'argmax.json'
  argmax_matches.main(['--shape', '2,5,300', '--rounds', '1', '--reps', '2', '--threads', '1',
                       '--allow-loaded', '--out', str(out)])
  result = json.loads(out.read_text())
  assert result['agree'] is True
  assert set(result['median_ms']) == {'jnp.argmax', 'decoding.first_argmax', 'api.argmax_matches'}
  assert all(ms > 0 for ms in result['median_ms'].values())
  assert 'machine' in result and 'loaded' in result
  assert 'the three agree: True' in capsys.readouterr().err
