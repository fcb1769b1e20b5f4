"""The input-pipeline benchmark reads real packed BBC span-corruption batches and counts tokens."""
import pytest

from benchmarks import input_pipeline


def test_measure_counts_packed_tokens_and_the_cores_it_used():
  r = input_pipeline.measure('bbc_span_corruption', batches=3, warmup=1, batch_size=2)
  assert r['slot_tokens_per_s'] > 0 and 0 < r['tokens_per_s'] <= r['slot_tokens_per_s']
  assert 0.5 < r['fill'] <= 1.0  # packing fills most of each 512/114 row
  assert r['lengths'] == {'inputs': 512, 'targets': 114} and len(r['loadavg']) == 3
  assert r['threads'] == 1 and r['cores_used'] > 0


def test_reference_peer_that_cannot_run_is_named(tmp_path):
  peer, why = input_pipeline.run_peer(str(tmp_path / 'python'), 1, 1, 2)
  assert peer is None and 'does not exist' in why
  import sys
  import importlib.util
  if importlib.util.find_spec('t5') is None:  # t2t's own environment never has the t5 package
    peer, why = input_pipeline.run_peer(sys.executable, 1, 1, 2)
    assert peer is None and 'pip install t5' in why


@pytest.mark.parametrize('args, message', [
    (['--threads', '0'], '--threads must be >= 1'),
    (['--threads', '4096'], 'more than the machine'),
    (['--batches', '0'], '--batches must be >= 1'),
])
def test_bad_arguments_are_refused_before_anything_runs(args, message):
  with pytest.raises(SystemExit, match=message):
    input_pipeline.main(args)
