"""benchmarks/profile_t5_small.py: the breakdown of a real (tiny) decode, under the benchmark's
host malloc settings, in a fresh process (the settings must precede the first XLA program)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import profile_t5_small as prof
from t2t.training import host_memory

REPO = Path(__file__).resolve().parents[2]


def test_categorise_by_the_flax_module_path():
  assert prof.categorise('jit(f)/Transformer.encode/encoder/layers_0/attention/query/dot') == \
      'attention'
  assert prof.categorise('jit(f)/Transformer.encode/encoder/layers_0/mlp/wi/dot') == 'ffn'
  assert prof.categorise('jit(f)/Transformer.encode/encoder/layers_0/pre_mlp_layer_norm/mul') \
      == 'layer norm'
  assert prof.categorise(None) == 'other XLA'


def test_site_sums_layers_and_tells_the_decoding_loop_apart():
  assert prof.site('jit(f)/while/body/Transformer.decode/decoder/layers_3/mlp/wi/ffi_call') == \
      (True, 'Transformer.decode/decoder/layers_N/mlp/wi/ffi_call')
  assert prof.site('jit(f)/Transformer.encode/encoder/layers_11/attention/key/dot_general') == \
      (False, 'Transformer.encode/encoder/layers_N/attention/key/dot_general')
  assert prof.site(None) == (False, '(no metadata)')


# The shape of XLA:CPU's optimized HLO text: a loop body computation, the entry, and a `dot` that
# XLA split off a fusion with no op name of its own.
_HLO = """HloModule jit_f, entry_computation_layout={(f32[8,64]{1,0})->f32[8,64]{1,0}}

%body.1 (arg_tuple.1: (s32[], f32[8,64])) -> (s32[], f32[8,64]) {
  %arg_tuple.1 = (s32[], f32[8,64]{1,0}) parameter(0)
  %gte.1 = f32[8,64]{1,0} get-tuple-element(%arg_tuple.1), index=1
  %dot.120 = f32[8,64]{1,0} dot(%gte.1, %gte.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %add_fusion.3 = f32[8,64]{1,0} fusion(%dot.120), kind=kLoop, calls=%fused_computation.3, metadata={op_name="jit(f)/while/body/Transformer.decode/decoder/layers_2/add" stack_frame_id=5}
  ROOT %tuple.2 = (s32[], f32[8,64]{1,0}) tuple(%gte.0, %add_fusion.3)
}

ENTRY %main.9 (x.1: f32[8,64]) -> f32[8,64] {
  %x.1 = f32[8,64]{1,0} parameter(0)
  %while.31 = (s32[], f32[8,64]{1,0}) while(%tuple.1), condition=%cond.1, body=%body.1, metadata={op_name="jit(f)/while" stack_frame_id=2}
  %wrapped_copy.4 = f32[8,64]{1,0} fusion(%x.1), kind=kLoop, calls=%wrapped_copy_computation.4
  ROOT %ffi_call.7 = f32[8,64]{1,0} custom-call(%x.1), custom_call_target="t2t_f32_panel_product", metadata={op_name="jit(f)/Transformer.encode/encoder/layers_0/mlp/wi/ffi_call" stack_frame_id=9}
}
"""


def test_hlo_metadata_names_every_instruction_and_knows_the_loop_body():
  meta = prof.hlo_metadata(_HLO)
  assert meta['jit_f', 'add_fusion.3'] == 'jit(f)/while/body/Transformer.decode/decoder/layers_2/add'
  assert meta['jit_f', 'ffi_call.7'] == 'jit(f)/Transformer.encode/encoder/layers_0/mlp/wi/ffi_call'
  # No op name: named after its kind, in the loop where its computation is a `while`'s body.
  assert meta['jit_f', 'dot.120'] == '/while/body/(dot, no metadata)'
  assert prof.site(meta['jit_f', 'dot.120']) == (True, '(dot, no metadata)')
  assert meta['jit_f', 'wrapped_copy.4'] == '(wrapped_copy, no metadata)'
  assert prof.site(meta['jit_f', 'wrapped_copy.4']) == (False, '(wrapped_copy, no metadata)')
  assert prof.categorise(meta['jit_f', 'dot.120']) == 'other XLA'


@pytest.mark.skipif(host_memory.glibc_version() is None, reason='host malloc settings need glibc')
def test_decode_profile_runs_under_the_benchmarks_malloc_settings(tmp_path):
  hlo_dir = tmp_path / 'hlo'
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run(
      [sys.executable, '-m', 'benchmarks.profile_t5_small', 'decode', '--tiny', '--steps', '1',
       '--batch', '2', '--enc-len', '16', '--gen-len', '4', '--threads', '1', '--warmup', '2',
       '--hlo-dir', str(hlo_dir), '--allow-loaded'],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result['host_malloc'] == dict(mode='auto', retains_freed_memory=True,
                                       xla_cpu_memory_schedule=True)
  assert result['precision'] == 'fp32' and result['mode'] == 'decode' and result['warmup'] == 2
  # The machine it ran on, and the CPU other processes took meanwhile, as every benchmark records.
  assert result['machine']['cores'] == os.cpu_count() and 'cpu_identity' in result['machine']
  assert [s['name'] for s in result['sections']] == ['profile']
  assert result['loaded'] == (result['machine']['loaded_at_start']
                              or result['sections'][0]['loaded'])
  # The thunks were found in the trace and attributed to the model's parts.
  assert result['xla_thunk_s_per_call'] > 0
  assert {'attention', 'ffn'} <= set(result['categories_s'])
  assert abs(sum(result['categories_share'].values()) - 1.0) < 1e-6
  # The decoding loop's thunks, by site: its steps and layers summed into one entry each.
  assert 0 < result['loop_thunk_s_per_call'] <= result['xla_thunk_s_per_call'] + 1e-9
  loop_sites = [s['site'] for s in result['top_sites'] if s['in_loop']]
  assert loop_sites and all('layers_0' not in s and 'layers_1' not in s for s in loop_sites)
  assert 'while' in (hlo_dir / 'decode_0.hlo.txt').read_text()


def test_too_many_threads_is_a_usage_error_naming_the_cores(capsys):
  cores = len(os.sched_getaffinity(0))
  with pytest.raises(SystemExit) as exit_info:
    prof.main(['decode', '--tiny', '--threads', str(cores + 1)])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert f'error: --threads {cores + 1} is more than the {cores} cores' in err


def test_no_warmup_is_a_usage_error(capsys):
  with pytest.raises(SystemExit) as exit_info:
    prof.main(['train', '--tiny', '--warmup', '0'])
  assert exit_info.value.code == 2
  assert '--warmup must be >= 1 (the first call compiles)' in capsys.readouterr().err


def test_a_loaded_machine_is_refused_with_the_way_round(monkeypatch):
  monkeypatch.setattr(os, 'getloadavg', lambda: (os.cpu_count() + 3.0, 1.0, 1.0))
  with pytest.raises(SystemExit) as exit_info:
    prof.main(['decode', '--tiny', '--threads', '1'])
  message = str(exit_info.value.code)
  assert message.startswith('benchmarks.profile_t5_small: error: The machine is loaded')
  assert '--allow-loaded' in message
