"""The input-pipeline benchmark reads real packed BBC span-corruption batches and counts tokens."""
from benchmarks import input_pipeline


def test_measure_counts_packed_tokens():
  r = input_pipeline.measure('bbc_span_corruption', batches=3, warmup=1, batch_size=2)
  assert r['slot_tokens_per_s'] > 0 and 0 < r['tokens_per_s'] <= r['slot_tokens_per_s']
  assert 0.5 < r['fill'] <= 1.0  # packing fills most of each 512/114 row
  assert r['lengths'] == {'inputs': 512, 'targets': 114} and len(r['loadavg']) == 3


def test_reference_peer_that_cannot_run_is_named(tmp_path):
  peer, why = input_pipeline.run_peer(str(tmp_path / 'python'), 1, 1, 2)
  assert peer is None and 'does not exist' in why
  import sys
  import importlib.util
  if importlib.util.find_spec('t5') is None:  # t2t's own environment never has the t5 package
    peer, why = input_pipeline.run_peer(sys.executable, 1, 1, 2)
    assert peer is None and 'pip install t5' in why

