"""benchmarks/eval_throughput.py on a tiny model: both settings run t2t.eval and agree."""
import json

from benchmarks import eval_throughput


def test_bucketed_and_padded_evaluations_agree(tmp_path):
  result = eval_throughput.measure(rounds=1, num_examples=6, batch_size=4, tiny=True,
                                   work_dir=str(tmp_path))
  result = json.loads(json.dumps(result))
  assert result['examples_per_call'] == 12
  assert set(result['median_s']) == {'bucketed', 'padded'}
  assert all(s > 0 for s in result['median_s'].values())
  assert result['speedup_bucketed'] > 0
  assert result['same_metrics'] is True and result['same_predictions'] is True
  assert set(result['metrics']['bucketed']) == set(eval_throughput.TASKS)
  # Both settings wrote their own metrics file.
  assert (tmp_path / 'eval_bucketed_0' / 'metrics.json').exists()
  assert (tmp_path / 'eval_padded_0' / 'metrics.json').exists()


def test_bad_arguments_are_refused(capsys):
  import pytest
  with pytest.raises(SystemExit, match='--rounds must be >= 1'):
    eval_throughput.main(['--rounds', '0'])
