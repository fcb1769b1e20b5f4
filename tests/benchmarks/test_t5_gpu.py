"""benchmarks/t5_gpu.py: the accelerator benchmark's model is the zoo's T5 v1.1 base and the peer's,
its FLOPs counted by hand for a gated FFN, a real tiny run on the CPU in a process where TensorFlow
and seqio cannot be imported (as on the GPU image), and its refusals."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import gin
import pytest

from benchmarks import t5_gpu, t5_small_cpu, t5_small_setup
from t2t.models import hf_interop
from t2t.models.transformer import T5Config
from tests.support.environment import REFUSE_TENSORFLOW

ROOT = Path(t5_gpu.__file__).resolve().parent.parent

# Runs a module as `python -m` would, with TensorFlow, seqio and their kin refused at import.
RUN_WITHOUT_TENSORFLOW = REFUSE_TENSORFLOW + """
import runpy
sys.argv = [sys.argv[1]] + sys.argv[2:]
runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)
"""


def _peer_module():
  spec = importlib.util.spec_from_file_location('hf_t5_peer', t5_small_cpu.default_peer_path())
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_config_is_the_zoo_t5_1_1_base_in_bfloat16():
  gin.parse_config_files_and_bindings([str(ROOT / 'gin/models/t5_1_1/base.gin')],
                                      ["ACTIVATION_DTYPE = 'bfloat16'", 'DROPOUT_RATE = 0.1'])
  assert t5_gpu.t5_1_1_base_config(0.1) == T5Config()  # every field from the gin file


def test_peer_builds_the_same_models_as_t2t():
  peer = _peer_module()
  fields = ('vocab_size', 'd_model', 'd_kv', 'd_ff', 'num_layers', 'num_decoder_layers',
            'num_heads', 'feed_forward_proj', 'relative_attention_num_buckets',
            'relative_attention_max_distance', 'dropout_rate', 'layer_norm_epsilon')
  for name, ours in (('t5_1_1_base', t5_gpu.t5_1_1_base_config(0.1)),
                     ('tiny_1_1', t5_gpu.t5_1_1_base_config(0.1, tiny=True)),
                     ('t5_small', t5_small_setup.t5_small_config(0.1))):
    theirs, expected = peer.make_config(0.1, name), hf_interop.hf_config_from_t5(ours)
    assert {f: getattr(theirs, f) for f in fields} == {f: getattr(expected, f) for f in fields}
    assert peer.MODELS[name]['tie_word_embeddings'] == ours.tie_word_embeddings
  # Untied means its own output head, which recent transformers would otherwise tie away.
  untied = peer.build_model(0.0, 'tiny_1_1', 'cpu')
  assert untied.lm_head.weight is not untied.shared.weight
  tied = peer.build_model(0.0, 't5_small', 'cpu')
  assert tied.lm_head.weight is tied.shared.weight


def test_model_flops_count_two_input_projections_for_a_gated_ffn():
  # d_model 2, 1 head x d_kv 2, d_ff 3, vocab 5, one layer each; batch 1, 2 encoder and 1 decoder
  # positions. A projection of t tokens from n to m is 2 t n m FLOPs; attention 4 t_q t_k inner.
  # Encoder layer: q,k,v,o 4 x 2*2*2*2 = 64; scores + values 4*2*2*2 = 32; FFN two inputs
  #   2 x 2*2*2*3 = 48 and the output 2*2*3*2 = 24: 168.
  # Decoder layer: self q,k,v,o 4 x 2*1*2*2 = 32; self attention 4*1*1*2 = 8; cross q,o
  #   2 x 8 = 16; cross k,v on the encoder's 2 tokens 2 x 16 = 32; cross attention 4*1*2*2 = 16;
  #   FFN 2 x 2*1*2*3 + 2*1*3*2 = 36: 140. Logits 2*1*2*5 = 20. Forward 168 + 140 + 20 = 328.
  gated = T5Config(vocab_size=5, d_model=2, num_heads=1, d_kv=2, d_ff=3, num_encoder_layers=1,
                   num_decoder_layers=1, feed_forward_proj='gated-gelu', tie_word_embeddings=False)
  flops = t5_small_cpu.model_flops(gated, batch=1, enc_len=2, dec_len=1, gen_len=0)
  assert flops['forward'] == 328 and flops['train_step'] == 3 * 328
  relu = T5Config(vocab_size=5, d_model=2, num_heads=1, d_kv=2, d_ff=3, num_encoder_layers=1,
                  num_decoder_layers=1)
  # One input projection fewer: 2 x 12 encoder and 12 decoder FLOPs.
  assert t5_small_cpu.model_flops(relu, 1, 2, 1, 0)['forward'] == 328 - 24 - 12


def test_peaks_and_bad_parts():
  assert t5_gpu.peak_bf16_tflops('NVIDIA H200') == 989.4
  assert t5_gpu.peak_bf16_tflops('NVIDIA H100 80GB HBM3') == 989.4
  assert t5_gpu.peak_bf16_tflops('cpu') is None
  info = dict(platform='cpu', peak_bf16_tflops=None)
  with pytest.raises(ValueError, match='--parts takes a comma-separated subset of train,greedy'):
    t5_gpu.run(info, parts=['decode'], tiny=True)
  with pytest.raises(ValueError, match='--warmup must be >= 1'):
    t5_gpu.run(info, warmup=0, tiny=True)


def _run(*args):
  return subprocess.run([sys.executable, '-c', RUN_WITHOUT_TENSORFLOW, 'benchmarks.t5_gpu', *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
                        env={**os.environ, 'JAX_PLATFORMS': 'cpu'})


def test_without_a_gpu_the_error_says_so():
  run = _run('--no-peer', '--allow-loaded')
  assert run.returncode != 0
  assert "benchmarks.t5_gpu: error: --platform gpu: JAX" in run.stderr
  assert "runs on 'cpu' here" in run.stderr and 'Traceback' not in run.stderr


def test_tiny_run_on_the_cpu_without_tensorflow_against_the_peer(tmp_path):
  out = tmp_path / 't5_gpu.json'
  run = _run('--platform', 'cpu', '--tiny', '--parts', 'train,greedy', '--batch', '2', '--enc-len',
             '32', '--dec-len', '8', '--gen-len', '4', '--steps', '2', '--warmup', '1',
             '--roof-reps', '2', '--allow-loaded', '--out', str(out))
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result == json.loads(run.stdout.strip().splitlines()[-1])
  assert result['model'] == 'tiny_1_1' and result['device']['platform'] == 'cpu'
  assert result['config']['dtype'] == 'bfloat16' and result['config']['feed_forward_proj'] == 'gated-gelu'
  assert list(result['results']) == ['train', 'greedy']  # beam4 is the same code with beams=4
  roof = result['matmul_roof_bf16']['tflops_best']
  assert roof > 0
  for part, r in result['results'].items():
    ours, theirs = r['t2t'], r['peer']
    assert r['peer_error'] is None and theirs['raw']['model'] == 'tiny_1_1'
    assert theirs['raw']['device'] == 'cpu' and theirs['raw']['precision'] == 'bf16_autocast'
    assert len(ours['step_times']) == 2 and len(theirs['step_times']) == 2
    assert r['ratio']['speedup_median'] == pytest.approx(theirs['median_s'] / ours['median_s'])
    assert ours['mfu'] is None  # no datasheet peak for a CPU
    assert ours['fraction_of_roof'] == pytest.approx(ours['model_tflops_median'] / roof)
    assert theirs['model_tflops_median'] * theirs['median_s'] * 1e12 == pytest.approx(
        ours['flops_per_step'])  # both sides' FLOP/s count the same model FLOPs
  train = result['results']['train']
  # The same parameters on both sides (the peer's v1.1 output head untied), the same shapes.
  assert train['t2t']['params'] == train['peer']['raw']['params'] == 57856
  assert train['peer']['raw']['batch'] == 2 and train['peer']['raw']['dec_len'] == 8
  assert result['results']['greedy']['peer']['raw']['gen_new_tokens'] == 4
  assert '| train | t2t |' in run.stderr and 'bf16 matmul roof (256x256x256, best)' in run.stderr
