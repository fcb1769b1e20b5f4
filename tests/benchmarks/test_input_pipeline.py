"""The input-pipeline benchmark reads real packed BBC span-corruption batches and counts tokens."""
from benchmarks import input_pipeline


def test_measure_counts_packed_tokens():
  r = input_pipeline.measure('bbc_span_corruption', batches=3, warmup=1, batch_size=2)
  assert r['slot_tokens_per_s'] > 0 and 0 < r['tokens_per_s'] <= r['slot_tokens_per_s']
  assert 0.5 < r['fill'] <= 1.0  # packing fills most of each 512/114 row
  assert r['lengths'] == {'inputs': 512, 'targets': 114} and len(r['loadavg']) == 3
