"""BERT: parity with Hugging Face's BertModel (via bert_hf), masks, the MLM loss, predictions, gin.

The HF models are built offline from a `transformers.BertConfig` (nothing is downloaded), their
weights copied onto t2t's parameter tree; dropout off, float32, eager attention.
"""
import json
import math
import os
import pathlib
import subprocess
import sys

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.data import vocabularies
from t2t.models import bert, bert_hf, layers

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

VOCAB = 60
CONFIG = bert.BertConfig(vocab_size=VOCAB, hidden_size=24, num_layers=2, num_heads=3,
                         intermediate_size=40, max_position_embeddings=16, type_vocab_size=2,
                         dropout_rate=0.0, attention_dropout_rate=0.0)
TOKENS = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
                   [20, 21, 22, 0, 0, 0, 0, 0, 0, 0],            # heavy padding
                   [30, 31, 32, 33, 34, 35, 0, 0, 0, 0]], np.int32)
TYPES = np.array([[0, 0, 0, 0, 1, 1, 1, 1, 1, 1],
                  [0, 0, 1, 0, 0, 0, 0, 0, 0, 0],
                  [0, 0, 0, 1, 1, 1, 0, 0, 0, 0]], np.int32)


def _hf_config() -> 'transformers.BertConfig':
  c = CONFIG
  return transformers.BertConfig(
      vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
      max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size,
      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, hidden_act='gelu',
      layer_norm_eps=c.layer_norm_epsilon, pad_token_id=0, attn_implementation='eager')


def _lively(model):
  """HF initialises LayerNorms to (1, 0) and biases to 0; perturb them so that they are tested."""
  torch.manual_seed(1)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if 'LayerNorm' in name or name.endswith('bias'):
        param.add_(0.1 * torch.randn_like(param))
  return model


@pytest.fixture(scope='module')
def hf_bert():
  torch.manual_seed(0)
  return _lively(transformers.BertModel(_hf_config()).eval())


def test_config_from_hugging_face():
  assert bert_hf.bert_config_from_hf(_hf_config(), dropout_rate=0.0,
                                     attention_dropout_rate=0.0) == CONFIG
  with pytest.raises(ValueError, match="model_type 'bert'"):
    bert_hf.bert_config_from_hf(transformers.T5Config())


def test_hidden_states_and_pooler_match_hugging_face(hf_bert):
  params = bert_hf.params_from_hf(hf_bert, CONFIG)
  assert set(params) == {'encoder', 'pooler'}
  ours = bert.BertEncoder(CONFIG).apply({'params': params['encoder']}, TOKENS, TYPES, False)
  with torch.no_grad():
    out = hf_bert(input_ids=torch.tensor(TOKENS, dtype=torch.long),
                  attention_mask=torch.tensor(TOKENS > 0, dtype=torch.long),
                  token_type_ids=torch.tensor(TYPES, dtype=torch.long), output_hidden_states=True)
  theirs = [h.numpy() for h in out.hidden_states]
  assert len(ours) == len(theirs) == CONFIG.num_layers + 1
  for i, (a, b) in enumerate(zip(ours, theirs)):
    np.testing.assert_allclose(np.asarray(a), b, atol=2e-5, rtol=1e-4, err_msg=f'hidden state {i}')
  pooled = bert.BertPooler(CONFIG).apply({'params': params['pooler']}, ours[-1])
  np.testing.assert_allclose(np.asarray(pooled), out.pooler_output.numpy(), atol=2e-5)


def test_mlm_logits_match_hugging_face():
  torch.manual_seed(0)
  hf = _lively(transformers.BertForMaskedLM(_hf_config()).eval())
  # The decoder is tied to the word embeddings (same tensor), as the t2t tree assumes.
  assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
  params = bert_hf.params_from_hf(hf.state_dict(), CONFIG)
  assert set(params) == {'encoder', 'mlm_head'}
  ours = bert.BertMaskedLM(CONFIG).apply({'params': params}, TOKENS, TYPES, False)
  with torch.no_grad():
    theirs = hf(input_ids=torch.tensor(TOKENS, dtype=torch.long),
                attention_mask=torch.tensor(TOKENS > 0, dtype=torch.long),
                token_type_ids=torch.tensor(TYPES, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours), theirs, atol=5e-5, rtol=1e-4)


@pytest.fixture(scope='module')
def encoder_vars():
  return jax.jit(lambda rng: bert.BertEncoder(CONFIG).init(rng, TOKENS, TYPES, False))(
      jax.random.PRNGKey(0))


def test_padding_is_masked_out_of_attention(encoder_vars):
  encoder = bert.BertEncoder(CONFIG)
  run = jax.jit(lambda tokens, types: encoder.apply(encoder_vars, tokens, types, False)[-1])
  base = np.asarray(run(TOKENS, TYPES))
  # Whatever sits in padded rows' types or beyond each row's end, the real positions do not move.
  garbage_types = np.where(TOKENS > 0, TYPES, 1)
  np.testing.assert_allclose(np.asarray(run(TOKENS, garbage_types))[TOKENS > 0],
                             base[TOKENS > 0], atol=1e-6)
  # Row 1 alone with only its 3 tokens gives the same outputs as inside the padded batch.
  alone = np.asarray(run(TOKENS[1:2, :3], TYPES[1:2, :3]))
  np.testing.assert_allclose(alone[0], base[1, :3], atol=1e-5)
  # Without the mask (padding as id 3) the outputs would change: the test can fail.
  unmasked = np.asarray(run(np.where(TOKENS > 0, TOKENS, 3), TYPES))
  assert not np.allclose(unmasked[1, :3], base[1, :3], atol=1e-3)


def test_packed_segments_do_not_see_each_other(encoder_vars):
  encoder = bert.BertEncoder(CONFIG)
  a, b = TOKENS[1, :3], TOKENS[2, :6]
  packed = np.concatenate([a, b, [0]])[None]
  segments = np.array([[1] * 3 + [2] * 6 + [0]])
  positions = np.array([[0, 1, 2, 0, 1, 2, 3, 4, 5, 0]])
  out = encoder.apply(encoder_vars, packed, None, False, segment_ids=segments,
                      positions=positions)[-1]
  single = encoder.apply(encoder_vars, b[None], None, False)[-1]
  np.testing.assert_allclose(np.asarray(out)[0, 3:9], np.asarray(single)[0], atol=1e-5)


def test_dropout_only_when_enabled(encoder_vars):
  config = bert.BertConfig(**{**CONFIG.__dict__, 'dropout_rate': 0.3,
                              'attention_dropout_rate': 0.3})
  encoder = bert.BertEncoder(config)
  run = lambda enable, seed: encoder.apply(encoder_vars, TOKENS, TYPES, enable,
                                           rngs={'dropout': jax.random.PRNGKey(seed)})[-1]
  np.testing.assert_array_equal(np.asarray(run(False, 0)), np.asarray(run(False, 1)))
  assert not np.allclose(np.asarray(run(True, 0)), np.asarray(run(True, 1)))


def test_config_refuses_bad_values():
  with pytest.raises(ValueError, match='divisible by num_heads'):
    bert.BertConfig(vocab_size=10, hidden_size=10, num_heads=3)
  with pytest.raises(ValueError, match='dropout_rate'):
    bert.BertConfig(vocab_size=10, dropout_rate=1.0)
  with pytest.raises(ValueError, match='max_position_embeddings'):
    bert.BertEncoder(CONFIG).init(jax.random.PRNGKey(0), np.ones((1, 17), np.int32), None, False)


# ------------------------------------------------------------------ the masked-LM model API

@pytest.fixture(scope='module')
def mlm_model():
  vocab = vocabularies.bbc_vocabulary()
  config = bert.BertConfig(vocab_size=8192, hidden_size=16, num_layers=1, num_heads=2,
                           intermediate_size=32, max_position_embeddings=16, dropout_rate=0.0,
                           attention_dropout_rate=0.0)
  model = bert.BertMaskedLMModel(bert.BertMaskedLM(config), vocab)
  params = jax.jit(lambda rng: model.get_initial_variables(
      rng, {'encoder_input_tokens': (2, 8)})['params'])(jax.random.PRNGKey(0))
  return model, nn.unbox(params)


def _mlm_batch():
  cls, sep, mask = 8098, 8097, 8099
  inputs = np.array([[cls, 100, mask, 102, 777, 104, sep, 0],
                     [cls, 200, 201, mask, sep, 0, 0, 0]], np.int32)
  targets = np.array([[cls, 100, 101, 102, 103, 104, sep, 0],
                      [cls, 200, 201, 202, sep, 0, 0, 0]], np.int32)
  weights = np.array([[0, 0, 1, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0, 0, 0]], np.int32)
  return {'encoder_input_tokens': inputs, 'encoder_target_tokens': targets,
          'encoder_loss_weights': weights}


def test_mlm_loss_is_the_mean_over_the_corrupted_positions(mlm_model):
  model, params = mlm_model
  batch = _mlm_batch()
  loss, metrics = model.loss_fn(params, batch, None)
  logits = model.module.apply({'params': params}, batch['encoder_input_tokens'], None, False)
  log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  # By hand: the three corrupted positions (row 0: 2 and 4, the random swap 777; row 1: 3).
  expected = -np.mean([log_probs[0, 2, 101], log_probs[0, 4, 103], log_probs[1, 3, 202]])
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  assert float(metrics['num_tokens']) == 3
  # Targets at unweighted positions do not count.
  changed = dict(batch, encoder_target_tokens=np.where(batch['encoder_loss_weights'] > 0,
                                                       batch['encoder_target_tokens'], 5))
  np.testing.assert_allclose(float(model.loss_fn(params, changed, None)[0]), float(loss), rtol=1e-6)
  score = np.asarray(model.score_batch(params, batch))
  np.testing.assert_allclose(score, [log_probs[0, 2, 101] + log_probs[0, 4, 103],
                                     log_probs[1, 3, 202]], rtol=1e-5)


def test_mlm_predictions_fill_the_corrupted_positions(mlm_model):
  model, params = mlm_model
  batch = _mlm_batch()
  logits = model.module.apply({'params': params}, batch['encoder_input_tokens'], None, False)
  argmax = np.asarray(jnp.argmax(logits, axis=-1))
  out = np.asarray(model.predict_batch(params, batch))
  assert out.shape == (2, 8) and out.dtype == np.int32
  np.testing.assert_array_equal(
      out[0], [100, argmax[0, 2], 102, argmax[0, 4], 104, 1, 0, 0])
  np.testing.assert_array_equal(out[1], [200, 201, argmax[1, 3], 1, 0, 0, 0, 0])
  # Without loss weights only [MASK] is filled (the random swap 777 is copied); a short output
  # keeps the first tokens and ends with EOS.
  plain = {'encoder_input_tokens': batch['encoder_input_tokens']}
  short = np.asarray(model.predict_batch(params, plain, max_decode_length=3))
  np.testing.assert_array_equal(short, [[100, argmax[0, 2], 1], [200, 201, 1]])
  np.testing.assert_array_equal(np.asarray(model.predict_batch(params, plain))[0, :6],
                                [100, argmax[0, 2], 102, 777, 104, 1])


def test_mlm_model_refuses_mismatched_setups(mlm_model):
  model, params = mlm_model
  with pytest.raises(ValueError, match='lacks'):
    model.loss_fn(params, {'encoder_input_tokens': np.ones((1, 4), np.int32)}, None)
  packed = dict(_mlm_batch(), encoder_segment_ids=np.ones((2, 8), np.int32))
  with pytest.raises(ValueError, match='packed'):
    model.predict_batch(params, packed)
  small = bert.BertMaskedLM(bert.BertConfig(vocab_size=100))
  with pytest.raises(ValueError, match='raise BertConfig.vocab_size'):
    bert.BertMaskedLMModel(small, vocabularies.bbc_vocabulary())



# ------------------------------------------------------------------ gin files and the CLI

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / 'gin'
ROOT = GIN_DIR.parent


@pytest.fixture
def parse_bert_gin():
  gin.clear_config()
  gin.add_config_file_search_path(str(GIN_DIR))

  def _parse(name, bindings=()):
    gin.parse_config_files_and_bindings([str(GIN_DIR / 'models' / 'bert' / f'{name}.gin')],
                                        list(bindings))
  yield _parse
  gin.clear_config()


def test_base_gin_is_bert_base(parse_bert_gin):
  # With BERT's 30,522-piece WordPiece vocabulary, base.gin's masked-LM model has exactly the
  # parameters of Hugging Face's BertForMaskedLM for bert-base-uncased: 109,514,298.
  parse_bert_gin('base', ['NUM_EMBEDDINGS = 30522'])
  module = gin.query_parameter('BertMaskedLMModel.module').scoped_configurable_fn()
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32),
                                              enable_dropout=False))
  assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes))) == 109_514_298


def test_tiny_gin_gives_a_standalone_encoder_and_pooler(parse_bert_gin):
  parse_bert_gin('tiny')
  encoder = gin.query_parameter('%BERT_ENCODER').scoped_configurable_fn()
  pooler = gin.query_parameter('%BERT_POOLER').scoped_configurable_fn()
  assert isinstance(encoder, bert.BertEncoder) and encoder.config.hidden_size == 128
  tokens = jnp.array([[8098, 50, 60, 8097, 70, 8097, 0]])
  types = jnp.array([[0, 0, 0, 0, 1, 1, 0]])
  variables = jax.jit(lambda rng: encoder.init(rng, tokens, types, False))(jax.random.PRNGKey(0))
  hidden = encoder.apply(variables, tokens, types, False)
  assert [h.shape for h in hidden] == [(1, 7, 128)] * 3
  pooled, _ = pooler.init_with_output(jax.random.PRNGKey(1), hidden[-1])
  assert pooled.shape == (1, 128) and float(jnp.max(jnp.abs(pooled))) < 1.0


def test_mlm_pretraining_runs_from_the_command_line(tmp_path):
  """`python -m t2t.train` on bbc_bert_mlm (tiny sizes, 12 steps): checkpoint, falling loss."""
  model_dir = tmp_path / 'bert_mlm'
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}
  args = ['--gin_file=experiments/bert_bbc/pretrain.gin', f'--gin.MODEL_DIR={model_dir}',
          '--gin.TRAIN_STEPS=12', '--gin.BATCH_SIZE=8', '--gin.CHECKPOINT_EVERY=12',
          '--gin.TASK_FEATURE_LENGTHS={"inputs": 32, "targets": 32}', '--gin.train.log_every=1',
          '--gin.BertConfig.hidden_size=32', '--gin.BertConfig.intermediate_size=64',
          '--gin.adamw.learning_rate=0.005', '--gin.DROPOUT_RATE=0.0']
  out = subprocess.run([sys.executable, '-m', 't2t.train', *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  assert (model_dir / 'checkpoint_12').is_dir()
  operative = (model_dir / 'config.gin').read_text()
  assert "MIXTURE_OR_TASK_NAME = 'bbc_bert_mlm'" in operative
  assert 'MODEL = @BertMaskedLMModel()' in operative
  assert 'train.optimizer = @adamw()' in operative  # BERT's optimizer, not AdaFactor
  records = [json.loads(line) for line in open(model_dir / 'metrics.jsonl')]
  losses = [r['loss'] for r in records]
  assert len(losses) == 12 and all(math.isfinite(x) for x in losses)
  assert 7.0 < losses[0] < 11.0  # about ln(8192) = 9.0 at initialisation
  assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3
  # Only corrupted positions count: ~15% of 8 rows x 30 text tokens, never the whole rows.
  assert all(10 <= r['num_tokens'] <= 80 for r in records)



def test_masked_lm_parameters_load_into_a_bert_classifier_by_path():
  """A bbc_bert_mlm checkpoint restores into ClassifierModel(BertEncoderStates) (partial restore):
  the whole encoder loads, only the classifier head is new, only the MLM head is skipped."""
  from t2t.models import classifier_api
  from t2t.training import checkpoints, warm_start
  tokens = jnp.ones((2, 8), jnp.int32)
  mlm_shapes = jax.eval_shape(lambda: bert.BertMaskedLM(CONFIG).init(
      jax.random.PRNGKey(0), tokens, enable_dropout=False))['params']
  classifier = classifier_api.ClassifierModel(
      bert.BertEncoderStates(CONFIG), vocabularies.bbc_vocabulary(), labels=['no', 'yes'],
      encoding='joint')
  cls_shapes = jax.eval_shape(lambda: classifier.get_initial_variables(
      jax.random.PRNGKey(0), {'encoder_input_tokens': (2, 8)}))['params']
  plan = warm_start.plan_restore(checkpoints.param_shapes(nn.unbox(mlm_shapes)),
                                  checkpoints.param_shapes(nn.unbox(cls_shapes)))
  assert plan.loaded and all(p.startswith('encoder/') for p in plan.loaded)
  assert 'encoder/layers_1/mlp/wo/kernel' in plan.loaded
  assert plan.reinitialised and all(p.startswith('head/') for p in plan.reinitialised)
  assert plan.skipped and not any(p.startswith('encoder/') for p in plan.skipped)
  assert (classifier.cls_id, classifier.sep_id) == (8098, 8097)  # the masked LM's [CLS], [SEP]


def test_adapters_start_as_identity_and_are_the_only_new_parameters():
  import dataclasses
  from t2t.training import adaptation
  base = bert.BertEncoder(CONFIG)
  with_adapters = bert.BertEncoder(dataclasses.replace(CONFIG, adapter_dim=4))
  params = base.init(jax.random.PRNGKey(0), TOKENS, TYPES, False)['params']
  full = with_adapters.init(jax.random.PRNGKey(0), TOKENS, TYPES, False)['params']
  base_paths = set(adaptation.param_paths(nn.unbox(params)))
  new = set(adaptation.param_paths(nn.unbox(full))) - base_paths
  assert new == {f'layers_{i}/adapter/{w}/kernel' for i in range(2) for w in ('wi', 'wo')}
  merged = jax.tree.map(lambda x: x, nn.unbox(full))
  for i in range(2):  # the pre-trained weights, with the fresh adapters
    merged[f'layers_{i}'] = {**nn.unbox(params)[f'layers_{i}'],
                             'adapter': nn.unbox(full)[f'layers_{i}']['adapter']}
  merged['embeddings'] = nn.unbox(params)['embeddings']
  out_base = base.apply({'params': params}, TOKENS, TYPES, False)
  out_adapted = with_adapters.apply({'params': merged}, TOKENS, TYPES, False)
  np.testing.assert_array_equal(out_adapted[-1], out_base[-1])  # zero up-projection: identity
  with pytest.raises(ValueError, match='adapter_dim'):
    dataclasses.replace(CONFIG, adapter_dim=-1)


# ------------------------------------------------------------------ prompt tuning
PROMPT_CONFIG = bert.BertConfig(**{**CONFIG.__dict__, 'num_prompt_tokens': 3})


@pytest.fixture(scope='module')
def prompt_vars():
  return jax.jit(lambda rng: bert.BertEncoderStates(PROMPT_CONFIG).init(rng, TOKENS, TYPES))(
      jax.random.PRNGKey(0))


def test_prompt_is_the_only_new_parameter(prompt_vars):
  from t2t.training import adaptation
  plain = bert.BertEncoderStates(CONFIG).init(jax.random.PRNGKey(0), TOKENS, TYPES)['params']
  prompt = prompt_vars['params']['prompt']['embedding']
  assert prompt.names == ('prompt', 'embed') and prompt.value.shape == (3, CONFIG.hidden_size)
  ours, theirs = nn.unbox(prompt_vars['params']), nn.unbox(plain)
  assert set(adaptation.param_paths(ours)) - set(adaptation.param_paths(theirs)) == {
      'prompt/embedding'}
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-7),  # jit vs eager
               {"encoder": ours["encoder"]}, theirs)


def test_prompt_is_prepended_to_the_first_layers_input(prompt_vars):
  """By the definition (Lester et al. §2.2, BertEncoder's doc): layer 0 reads
  [prompt; LN(word + position + type)] with the tokens at positions 0..l-1, every real key
  visible; the states returned are the tokens' ([b, l, d], [CLS] first)."""
  params = nn.unbox(prompt_vars['params'])
  states = bert.BertEncoderStates(PROMPT_CONFIG).apply({'params': params}, TOKENS, TYPES)
  assert [s.shape for s in states] == [(3, 10, CONFIG.hidden_size)] * 3
  b, l = TOKENS.shape
  embedded = bert.BertEmbeddings(CONFIG).apply(
      {'params': params['encoder']['embeddings']}, TOKENS, TYPES,
      np.broadcast_to(np.arange(l), TOKENS.shape), False)
  np.testing.assert_allclose(states[0], embedded, atol=1e-6)  # the prompt is not an embedding
  x = np.concatenate([np.broadcast_to(params['prompt']['embedding'], (b, 3, CONFIG.hidden_size)),
                      embedded], axis=1)
  keys = np.concatenate([np.ones((b, 3), bool), TOKENS > 0], axis=1)
  bias = layers.mask_to_bias(np.broadcast_to(keys[:, None, None, :], (b, 1, l + 3, l + 3)))
  for i in range(CONFIG.num_layers):
    x = bert.BertLayer(CONFIG).apply({'params': params['encoder'][f'layers_{i}']}, x, bias, False)
    np.testing.assert_allclose(states[i + 1], x[:, 3:], atol=2e-5, err_msg=f'layer {i}')
  # The prompt matters (the test can fail), and padding beyond a row's end does not.
  other = jax.tree.map(lambda v: v, params)
  other['prompt'] = {'embedding': params['prompt']['embedding'] + 1.0}
  moved = bert.BertEncoderStates(PROMPT_CONFIG).apply({'params': other}, TOKENS, TYPES)
  assert not np.allclose(moved[-1], states[-1], atol=1e-3)
  alone = bert.BertEncoderStates(PROMPT_CONFIG).apply({'params': params}, TOKENS[1:2, :3],
                                                      TYPES[1:2, :3])
  np.testing.assert_allclose(alone[-1][0], states[-1][1, :3], atol=1e-5)


def test_prompt_tuning_refusals_name_the_family_and_option(prompt_vars):
  params = nn.unbox(prompt_vars['params'])
  # A bare BertEncoder holds no prompt: it must not silently ignore the option.
  with pytest.raises(ValueError, match=r'BERT prompt tuning \(BertConfig.num_prompt_tokens = 3\)'
                                       ': a bare BertEncoder'):
    bert.BertEncoder(PROMPT_CONFIG).apply({'params': params['encoder']}, TOKENS, TYPES, False)
  # Prompts are per row: packed batches are refused.
  model = bert.BertMaskedLM(PROMPT_CONFIG)
  mlm_vars = model.init(jax.random.PRNGKey(0), TOKENS, TYPES, False)
  assert nn.unbox(mlm_vars['params'])['prompt']['embedding'].shape == (3, CONFIG.hidden_size)
  with pytest.raises(ValueError, match=r'BERT prompt tuning .* needs unpacked batches'):
    model.apply(mlm_vars, TOKENS, TYPES, False, segment_ids=(TOKENS > 0).astype(np.int32))
  with pytest.raises(ValueError, match='BertConfig.num_prompt_tokens must be a non-negative'):
    bert.BertConfig(vocab_size=10, num_prompt_tokens=-1)
