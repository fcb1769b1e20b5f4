"""The T5-small CPU benchmark at tiny sizes: its JSON has the documented keys and sane numbers."""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import machine, report

from benchmarks import t5_small_cpu as bench
from t2t.models import gemm, train_attention
from t2t.training import host_memory

TOP_KEYS = {'benchmark', 'mode', 'model', 'config', 'shapes', 'steps', 'warmup', 'threads',
            'cpu_count', 'cpus_used', 'loadavg', 'versions', 'flops_source', 't2t', 'peer',
            'peer_error', 'ratio', 'sections', 'loaded', 'host_malloc'}
TIMING_KEYS = {'median_s', 'min_s', 'step_times', 'tokens_per_s_median', 'tokens_per_s_best',
               'model_tflops_median', 'model_tflops_best', 'compile_and_first_s', 'params',
               'flops_per_step'}
SHARED_FLOPS = Path(bench.__file__).resolve().parent / 't5_small_flops.py'


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


def test_train_tiny(monkeypatch):
  # Recorded, not applied: glibc reads its tunables when a process starts.
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.arena_max=3')
  # Dropout 0 halves the compile time of the tiny step (its RNG ops dominate at this size).
  result = bench.run('train', steps=2, warmup=1, batch=2, enc_len=16, dec_len=8, tiny=True,
                     dropout_rate=0.0, no_peer=True)
  ours = _check_common(result, 'train', steps=2)
  assert result['shapes'] == {'batch': 2, 'enc_len': 16, 'dec_len': 8}
  assert result['config']['dropout_rate'] == 0.0
  assert ours['tokens_per_s_median'] == pytest.approx(2 * (16 + 8) / ours['median_s'])
  assert len(ours['losses']) == 3 and all(math.isfinite(x) for x in ours['losses'])
  assert len(ours['page_faults_per_step']) == 3 and min(ours['page_faults_per_step']) >= 0
  assert result['host_malloc']['peer'] == 'system'
  assert result['host_malloc']['t2t_glibc_tunables'] == 'glibc.malloc.arena_max=3'
  assert result['host_malloc']['t2t_xla_cpu_memory_schedule'] is host_memory.memory_schedule()
  assert result['gemm_build'] == getattr(gemm.library(), 'name', None)   # which build ran
  assert result['train_attention_build'] == train_attention.float32_build()
  # Random tokens over a 128-id vocabulary: the first loss is near ln(128) ~ 4.85.
  assert 3.0 < ours['losses'][0] < 8.0
  assert result['peer_error'] == 'disabled with --no-peer'
  assert ours['split_update'] is True  # the Trainer's default: gradient and update programs
  assert ours['init_state_s'] > 0  # the init programs, timed apart from compile + first step
  # The persistent compilation cache: written by the first compile, read back by the second.
  cache = ours['compilation_cache']
  assert cache['cold_s'] > 0 and cache['warm_s'] > 0 and cache['warm_cache_hits'] >= 1
  assert cache['cold_cache_hits'] == 0


def test_decode_tiny_beam_search_decodes_full_length():
  result = bench.run('decode', steps=1, warmup=1, beams=2, batch=2, enc_len=16, gen_len=5,
                     tiny=True)
  ours = _check_common(result, 'decode', steps=1)
  assert ours['gen_new_tokens'] == 5  # EOS is masked, so no row stops early
  assert result['config']['dropout_rate'] == 0.0
  assert 'peer runs only' in result['peer_error'] and '--tiny' in result['peer_error']


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
  spec = importlib.util.spec_from_file_location('shared_t5_small_flops', SHARED_FLOPS)
  shared = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(shared)
  ours = bench.model_flops(bench.t5_small_config(0.0), 8, 512, 114, 64)
  assert ours['forward'] == shared.forward()['total']
  assert ours['train_step'] == 3 * shared.forward()['total']
  assert ours['decode'] == shared.decode_flops()['total']
  beam = bench.model_flops(bench.t5_small_config(0.0), 8, 512, 114, 64, beams=4)
  assert beam['decode'] > ours['decode']


def test_default_peer_lives_in_the_repository():
  assert bench.default_peer_path().is_file()
  assert bench.default_peer_path().parent == Path(bench.__file__).resolve().parent


def test_peer_not_installed_is_named(monkeypatch):
  real = bench.importlib.util.find_spec
  monkeypatch.setattr(bench.importlib.util, 'find_spec',
                      lambda name: None if name == 'transformers' else real(name))
  why = bench.peer_unavailable(bench.default_peer_path())
  assert 'transformers not installed' in why and 'pip install' in why


def test_too_many_threads_is_refused_with_the_core_count():
  import os
  cores = len(os.sched_getaffinity(0))
  with pytest.raises(ValueError, match=f'more than the {cores} cores'):
    machine.pin_threads(cores + 1)


def test_loaded_machine_is_refused_unless_allowed(monkeypatch, capsys):
  import os
  monkeypatch.setattr(os, 'getloadavg', lambda: (os.cpu_count() + 3.0, 1.0, 1.0))
  with pytest.raises(machine.LoadedMachineError, match='load average'):
    machine.check_quiet(allow_loaded=False)
  assert machine.check_quiet(allow_loaded=True)['loaded_at_start'] is True
  with pytest.raises(SystemExit, match='--allow-loaded'):
    bench.main(['train', '--tiny', '--no-peer', '--threads', '1'])


def test_bf16_against_the_peer_is_refused_where_bf16_is_emulated(monkeypatch):
  from tests.benchmarks.test_machine import ZEN3, ZEN4
  zen3, zen4 = machine.cpu_identity(ZEN3), machine.cpu_identity(ZEN4)
  with pytest.raises(ValueError, match=r'Zen 3.*no bf16 instructions.*--precision fp32'):
    machine.check_bf16_is_native('bf16', zen3, peer_runs=True)
  machine.check_bf16_is_native('bf16', zen3, peer_runs=False)        # t2t alone
  machine.check_bf16_is_native('bf16', zen3, peer_runs=True, allow_emulated=True)
  machine.check_bf16_is_native('bf16', zen4, peer_runs=True)         # native: a fair comparison
  machine.check_bf16_is_native('fp32', zen3, peer_runs=True)
  # The command line refuses it before anything runs (the peer's check comes after).
  monkeypatch.setattr(machine, 'cpu_identity', lambda: zen3)
  with pytest.raises(SystemExit, match='--allow-emulated-bf16'):
    bench.main(['train', '--precision', 'bf16', '--threads', '1', '--allow-loaded',
                '--peer', '/nonexistent/peer.py'])


def test_fused_step_is_refused_outside_train():
  with pytest.raises(SystemExit, match=r"--fused-step times the train step; .* mode 'decode'"):
    bench.main(['decode', '--fused-step', '--tiny', '--no-peer'])


def test_model_parallel_is_refused_outside_decode_and_beyond_the_threads():
  with pytest.raises(SystemExit, match=r"--model-parallel splits decoding only; mode 'train'"):
    bench.main(['train', '--model-parallel', '2', '--tiny', '--no-peer', '--threads', '1'])
  with pytest.raises(SystemExit, match=r'--model-parallel 2 asks for more devices than the 1 thr'):
    bench.main(['decode', '--model-parallel', '2', '--tiny', '--no-peer', '--threads', '1'])
  with pytest.raises(SystemExit, match='--model-parallel must be >= 1'):
    bench.main(['decode', '--model-parallel', '0', '--tiny', '--no-peer', '--threads', '1'])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason='needs 2 cores for 2 devices')
def test_decode_with_the_model_split_over_two_cpu_devices():
  # A process of its own: the device count is fixed when JAX's backend starts.
  out = subprocess.run(
      [sys.executable, '-m', 'benchmarks.t5_small_cpu', 'decode', '--tiny', '--no-peer',
       '--model-parallel', '2', '--threads', '2', '--steps', '1', '--warmup', '1', '--batch', '2',
       '--enc-len', '16', '--gen-len', '4', '--allow-loaded'],
      cwd=Path(bench.__file__).resolve().parent.parent, capture_output=True, text=True,
      timeout=300, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  ours = _check_common(result, 'decode', steps=1)
  assert ours['model_parallel'] == 2 and ours['devices'] == 2
  assert ours['gen_new_tokens'] == 4
  assert 'decode beams=1, t2t model-parallel 2' in out.stderr
  # As python -m t2t.* runs: the imported objects frozen out of Python's collector.
  assert result['python_gc']['mode'] == 'frozen' and result['python_gc']['frozen_objects'] > 100_000


def test_section_counts_other_processes_cores():
  # Burn >= 50 ms of this process's CPU time, read the way the Section reads it: a fixed amount of
  # work could fit between two of os.times()'s 10 ms ticks on a busy machine and count as 0.
  with machine.Section('x') as s:
    start = machine._own_seconds()
    while machine._own_seconds() - start < 0.05:
      sum(i * i for i in range(10_000))
  assert s.wall_s > 0 and s.own_cores is not None and s.own_cores * s.wall_s >= 0.05
  assert s.foreign_cores is None or s.foreign_cores >= 0
  assert set(s.as_dict()) >= {'foreign_cores', 'loadavg_before', 'loaded'}


def test_targets_and_table_from_a_result():
  r = lambda t2t_s, peer_s: dict(
      t2t=dict(median_s=t2t_s, min_s=t2t_s, tokens_per_s_median=1.0, model_tflops_median=0.1,
               compile_and_first_s=12.0),
      peer=dict(median_s=peer_s, min_s=peer_s, tokens_per_s_median=1.0, model_tflops_median=0.1),
      ratio=dict(speedup_median=peer_s / t2t_s), sections=[])
  out = dict(mode='all', threads=2, results=dict(train=r(4.0, 8.0), greedy=r(2.0, 3.0),
                                                 beam4=r(1.0, 2.0)),
             matmul_roof=dict(roof_gflops=200.0), loaded=True)
  t = report.targets(out)
  assert t['train_speedup']['met'] is True and t['greedy_speedup']['met'] is False
  assert t['train_roof_fraction']['measured'] == pytest.approx(0.5)
  assert t['compile_and_first_s']['met'] is True
  out['targets'] = t
  text = report.table(out)
  assert 'LOADED MACHINE' in text and '| greedy | t2t |' in text and 'NO' in text
  assert 'Trainer.init_state' not in text  # a result written before init_state_s was recorded
  out['results']['train']['t2t']['init_state_s'] = 6.5
  assert 'compile + first step 12.0 s, after 6.5 s of Trainer.init_state' in report.table(out)
  # The shapes head the table; a run at other shapes than the says so under its targets.
  assert text.startswith('T5 v1.0 small, batch 8, 512/114 -> 64, CPU') and 'sets its' not in text
  out['results']['train']['shapes'] = dict(batch=32, enc_len=128, dec_len=8)
  out['results']['greedy']['shapes'] = dict(batch=32, enc_len=128, gen_len=8, beams=1)
  text = report.table(out)
  assert text.startswith('T5 v1.0 small, batch 32, 128/8 -> 8, CPU')
  assert ('The issue sets its targets at batch 8, 512/114 -> 64; this run is at batch 32, '
          '128/8 -> 8.') in text
  one = dict(r(0.6, 1.4), mode='decode', threads=2, shapes=dict(batch=1, enc_len=512, gen_len=64,
                                                               beams=1))
  assert report.table(one).startswith('T5 v1.0 small, batch 1, 512 -> 64, CPU')  # no target length


def test_bf16_precision_sets_the_matmul_dtype_and_asks_the_peer_for_autocast(tmp_path, monkeypatch):
  result = bench.run('train', steps=1, warmup=1, batch=2, enc_len=16, dec_len=8, tiny=True,
                     dropout_rate=0.0, no_peer=True, precision='bf16')
  ours = _check_common(result, 'train', steps=1)
  assert result['precision'] == 'bf16' and result['config']['matmul_dtype'] == 'bfloat16'
  assert all(math.isfinite(x) for x in ours['losses'])
  with pytest.raises(ValueError, match='precision'):
    bench.run('train', tiny=True, no_peer=True, precision='fp8')
  # The peer gets --bf16-autocast (a stand-in script prints what it was given).
  peer = tmp_path / 'peer.py'
  peer.write_text('import json, sys\nprint("RESULT " + json.dumps(dict(step_times=[1.0], batch=1, '
                  'enc_len=1, dec_len=1, gen_new_tokens=1, argv=sys.argv[1:], '
                  'tunables=__import__("os").environ.get("GLIBC_TUNABLES"))))\n')
  monkeypatch.setattr(bench, 'peer_unavailable', lambda p: None)
  got, why = bench.run_peer(peer, 'train', 1, 1, 1, 1, flops=1, precision='bf16')
  assert why is None and '--bf16-autocast' in got['raw']['argv']
  got, _ = bench.run_peer(peer, 'train', 1, 1, 1, 1, flops=1)
  assert '--bf16-autocast' not in got['raw']['argv'] and '--gen-len' not in got['raw']['argv']
  # The peer runs as a user starts it, or with t2t's malloc settings under --peer-malloc retain.
  monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.arena_max=4')  # not passed on either way
  got, _ = bench.run_peer(peer, 'train', 1, 1, 1, 1, flops=1)
  assert got['raw']['tunables'] is None
  got, _ = bench.run_peer(peer, 'train', 1, 1, 1, 1, flops=1, peer_malloc='retain')
  assert got['raw']['tunables'] == host_memory.GLIBC_TUNABLES
  with pytest.raises(ValueError, match='--peer-malloc'):
    bench.run_peer(peer, 'train', 1, 1, 1, 1, flops=1, peer_malloc='jemalloc')
  # Decoding passes the generated length on, so the encoder-only split (1 token) has a peer too.
  got, _ = bench.run_peer(peer, 'decode', 1, 1, 1, 1, flops=1, gen_len=1)
  argv = got['raw']['argv']
  assert argv[argv.index('--gen-len') + 1] == '1'


def test_the_peer_runs_at_the_runs_own_shapes(tmp_path, monkeypatch):
  """Any batch and lengths are compared: the peer is given them (a stand-in script echoes them)."""
  peer = tmp_path / 'peer.py'
  peer.write_text('import json, sys\na = sys.argv[1:]\nv = lambda k: int(a[a.index(k) + 1])\n'
                  'print("RESULT " + json.dumps(dict(step_times=[2.0], batch=v("--batch"), '
                  'enc_len=v("--enc-len"), dec_len=v("--dec-len"), argv=a)))\n')
  monkeypatch.setattr(bench, 'peer_unavailable', lambda p: None)
  ours = dict(median_s=1.0, min_s=1.0, flops_per_step=10)
  monkeypatch.setattr(bench, 'bench_train', lambda *a, **k: dict(ours))
  monkeypatch.setattr(bench, 'bench_compilation_cache', lambda *a, **k: {})
  result = bench.run('train', steps=1, warmup=1, batch=32, enc_len=128, dec_len=16, peer=peer)
  assert result['peer_error'] is None and result['shapes'] == dict(batch=32, enc_len=128,
                                                                  dec_len=16)
  raw = result['peer']['raw']
  assert (raw['batch'], raw['enc_len'], raw['dec_len']) == (32, 128, 16)
  assert result['peer']['tokens_per_s_median'] == 32 * (128 + 16) / 2.0
  assert result['ratio']['speedup_median'] == 2.0
  # A peer that ran at other shapes than it was given (one that ignores them) is not compared.
  fixed = tmp_path / 'fixed_peer.py'
  fixed.write_text('import json\nprint("RESULT " + json.dumps(dict(step_times=[2.0], batch=8, '
                   'enc_len=512, dec_len=114)))\n')
  result = bench.run('train', steps=1, warmup=1, batch=32, enc_len=128, dec_len=16, peer=fixed)
  assert result['peer'] is None and result['ratio'] is None
  assert "the peer ran at {'batch': 8, 'enc_len': 512, 'dec_len': 114}" in result['peer_error']
  # A run the peer cannot match (another dropout) is still not compared, and says why.
  result = bench.run('train', steps=1, warmup=1, dropout_rate=0.0, peer=peer)
  assert result['peer'] is None and 'dropout 0.1' in result['peer_error']
