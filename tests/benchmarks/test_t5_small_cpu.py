"""The T5-small CPU benchmark at tiny sizes: its JSON has the documented keys and sane numbers."""
import importlib.util
import json
import math
from pathlib import Path

import pytest

from benchmarks import t5_small_cpu as bench

TOP_KEYS = {'benchmark', 'mode', 'model', 'config', 'shapes', 'steps', 'warmup', 'threads',
            'cpu_count', 'cpus_used', 'loadavg', 'versions', 'flops_source', 't2t', 'peer',
            'peer_error', 'ratio'}
TIMING_KEYS = {'median_s', 'min_s', 'step_times', 'tokens_per_s_median', 'tokens_per_s_best',
               'model_tflops_median', 'model_tflops_best', 'compile_and_first_s', 'params',
               'flops_per_step'}
SHARED_FLOPS = Path(bench.__file__).resolve().parents[1].parent / 'shared/bench/t5_small_flops.py'


def _check_common(result, mode, steps):
  result = json.loads(json.dumps(result))  # what is printed must be plain JSON
  assert TOP_KEYS <= set(result)
  assert result['benchmark'] == 't5_small_cpu' and result['mode'] == mode
  ours = result['t2t']
  assert TIMING_KEYS <= set(ours)
  assert len(ours['step_times']) == steps and all(t > 0 for t in ours['step_times'])
  assert 0 < ours['min_s'] <= ours['median_s']
  assert ours['tokens_per_s_best'] >= ours['tokens_per_s_median'] > 0
  assert ours['model_tflops_best'] >= ours['model_tflops_median'] > 0
  assert ours['flops_per_step'] > 0 and ours['params'] > 0
  assert result['peer'] is None and result['ratio'] is None and result['peer_error']
  assert result['cpu_count'] >= 1 and result['versions']['jax']
  return ours


def test_train_tiny():
  # Dropout 0 halves the compile time of the tiny step (its RNG ops dominate at this size).
  result = bench.run('train', steps=2, warmup=1, batch=2, enc_len=16, dec_len=8, tiny=True,
                     dropout_rate=0.0, no_peer=True)
  ours = _check_common(result, 'train', steps=2)
  assert result['shapes'] == {'batch': 2, 'enc_len': 16, 'dec_len': 8}
  assert result['config']['dropout_rate'] == 0.0
  assert ours['tokens_per_s_median'] == pytest.approx(2 * (16 + 8) / ours['median_s'])
  assert len(ours['losses']) == 3 and all(math.isfinite(x) for x in ours['losses'])
  # Random tokens over a 128-id vocabulary: the first loss is near ln(128) ~ 4.85.
  assert 3.0 < ours['losses'][0] < 8.0
  assert result['peer_error'] == 'disabled with --no-peer'


def test_decode_tiny_beam_search_decodes_full_length():
  result = bench.run('decode', steps=1, warmup=1, beams=2, batch=2, enc_len=16, gen_len=5,
                     tiny=True)
  ours = _check_common(result, 'decode', steps=1)
  assert ours['gen_new_tokens'] == 5  # EOS is masked, so no row stops early
  assert result['config']['dropout_rate'] == 0.0
  assert 'peer runs only' in result['peer_error']  # tiny runs are never compared with the peer


def test_missing_peer_is_reported_not_raised(tmp_path):
  peer, why = bench.run_peer(tmp_path / 'absent.py', 'train', 1, 1, 1, 1, flops=1)
  assert peer is None and 'not found' in why


@pytest.mark.parametrize('kwargs, name', [(dict(mode='decode', beams=0), 'beams'),
                                          (dict(mode='train', steps=0), 'steps'),
                                          (dict(mode='train', warmup=0), 'warmup'),
                                          (dict(mode='infer'), 'mode')])
def test_bad_arguments(kwargs, name):
  with pytest.raises(ValueError, match=name):
    bench.run(**kwargs, tiny=True, no_peer=True)


def test_flops_formula_matches_shared_script():
  if not SHARED_FLOPS.is_file():
    pytest.skip(f'{SHARED_FLOPS} not present')
  spec = importlib.util.spec_from_file_location('shared_t5_small_flops', SHARED_FLOPS)
  shared = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(shared)
  ours = bench.model_flops(bench.t5_small_config(0.0), 8, 512, 114, 64)
  assert ours['forward'] == shared.forward()['total']
  assert ours['train_step'] == 3 * shared.forward()['total']
  assert ours['decode'] == shared.decode_flops()['total']
  beam = bench.model_flops(bench.t5_small_config(0.0), 8, 512, 114, 64, beams=4)
  assert beam['decode'] > ours['decode']
