"""Table 2's variants trained from their gin files through the command line (2 steps on BBC data).

Each run is `python -m t2t.train --gin_file=experiments/variants/<variant>.gin` in a subprocess, as a
user would type it, shrunk further so it compiles in seconds. Each variant is trained once per
module (the `trained` fixture): the prefix LM's run is also the checkpoint that `python -m t2t.eval`
evaluates. The mask / loss semantics of each variant are checked at the Python level in
test_transformer.py and test_decoder_only.py.
"""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = ['--gin.T5Config.d_model=32', '--gin.T5Config.d_ff=64', '--gin.T5Config.num_heads=2',
        '--gin.T5Config.d_kv=16', '--gin.BATCH_SIZE=4', '--gin.TRAIN_STEPS=2',
        '--gin.CHECKPOINT_EVERY=2', '--gin.TASK_FEATURE_LENGTHS={"inputs": 32, "targets": 8}']

# variant -> lines the operative config must show (proof that the variant's bindings took effect)
VARIANTS = {
    'enc_dec_shared': ['T5Config.shared_encoder_decoder = True', 'MODEL = @EncoderDecoderModel()'],
    'enc_dec_6_6': ['T5Config.num_decoder_layers = 1', 'T5Config.num_encoder_layers = 1'],
    'decoder_only_lm': ['MODEL = @DecoderOnlyModel()', 'PREFIX_LM = False'],
    'prefix_lm': ['MODEL = @DecoderOnlyModel()', 'PREFIX_LM = True'],
}


def _train(*args):
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}
  env.pop('T2T_TRACEBACK', None)
  out = subprocess.run([sys.executable, '-m', 't2t.train', *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return out


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """trained(variant) -> the MODEL_DIR of `variant` after its 2 steps, trained once per module."""
  root = tmp_path_factory.mktemp('variants')
  model_dirs = {}

  def get(variant):
    if variant not in model_dirs:
      model_dir = str(root / variant)
      _train(f'--gin_file=experiments/variants/{variant}.gin', f'--gin.MODEL_DIR={model_dir}',
             *TINY)
      model_dirs[variant] = model_dir
    return model_dirs[variant]
  return get


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_variant_trains_from_gin(variant, trained):
  model_dir = trained(variant)
  assert os.path.isdir(os.path.join(model_dir, 'checkpoint_2'))
  operative = open(os.path.join(model_dir, 'config.gin')).read()
  for line in VARIANTS[variant]:
    assert line in operative, (line, operative)
  assert "'bbc_span_corruption'" in operative
  records = [json.loads(l) for l in open(os.path.join(model_dir, 'metrics.jsonl'))]
  assert [r['step'] for r in records] == [2]
  # Loss near ln(8192) = 9.0 at initialisation: a finite cross-entropy over the real vocabulary,
  # on target tokens only (num_tokens counts targets, not the concatenated inputs).
  assert math.isfinite(records[0]['loss']) and 3.0 < records[0]['loss'] < 20.0
  assert 0 < records[0]["num_tokens"] <= 4 * 40  # at most the targets of 4 rows of 32 + 8


def test_prefix_lm_evaluates_through_t2t_eval(trained, tmp_path):
  """A decoder-only model goes through `t2t.eval` too: prompt prefill, greedy decode, metrics.

  The checkpoint is the prefix LM's 2 steps of span corruption (test_variant_trains_from_gin):
  the parameters' shapes do not depend on the task or the feature lengths, and the predictions
  of a model this young are checked only for their number and type.
  """
  model_dir = trained('prefix_lm')
  lengths = '--gin.TASK_FEATURE_LENGTHS={"inputs": 32, "targets": 4}'
  eval_gin = tmp_path / 'eval.gin'
  eval_gin.write_text("include 'models/variants/prefix_lm.gin'\n"
                      "include 'experiments/variants/tiny.gin'\n"
                      "include 'runs/eval.gin'\n"
                      "T5Config.num_decoder_layers = 2\n"  # as experiments/variants/prefix_lm.gin
                      "MIXTURE_OR_TASK_NAME = 'bbc_topic'\n")
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}
  out = subprocess.run(
      [sys.executable, '-m', 't2t.eval', f'--gin_file={eval_gin}', *TINY[:4], lengths,
       f'--gin.CHECKPOINT_PATH={model_dir}', f'--gin.EVAL_OUTPUT_DIR={tmp_path / "eval"}',
       '--gin.EVAL_NUM_EXAMPLES=8', '--gin.EVAL_BATCH_SIZE=4'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  metrics = json.load(open(tmp_path / 'eval' / 'metrics.json'))['metrics']['bbc_topic']
  assert 0.0 <= metrics['accuracy'] <= 100.0
  rows = [json.loads(l) for l in open(tmp_path / 'eval' / 'bbc_topic.validation.predictions.jsonl')]
  assert len(rows) == 8 and all(isinstance(r['prediction'], str) for r in rows)
