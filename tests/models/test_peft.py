"""Tests for t2t/models/peft.py and its hooks in transformer.py: adapters, prompt tuning, LoRA."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import train as train_lib
from t2t.models import peft
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer
from t2t.training import adaptation, checkpoints, inputs, optim
from t2t.training.partitioning import Partitioner
from t2t.training.trainer import Trainer
from tests.training import toy

BATCH = 8


@pytest.fixture(autouse=True)
def _task():
  toy.register()


def _model(**overrides) -> EncoderDecoderModel:
  fields = dict(vocab_size=64, d_model=16, num_heads=2, d_kv=8, d_ff=32, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.0)
  return EncoderDecoderModel(Transformer(T5Config(**{**fields, **overrides})), toy.VOCAB, toy.VOCAB)


def _flat(tree):
  return dict(zip(adaptation.param_paths(tree), jax.tree.leaves(jax.device_get(tree))))


def _train(model, trainable, steps=3, pack=True, learning_rate=0.05):
  """(params before, params after `steps` AdaFactor steps on the toy task, trainer)."""
  converter = model.feature_converter_cls(pack=pack)
  shapes = {k: (BATCH, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  opt = adaptation.adapted(optim.adafactor(learning_rate=learning_rate), trainable=trainable)
  tr = Trainer(model, opt, Partitioner(), shapes)
  state = tr.init_state()
  before = _flat(state.params)
  batches = inputs.train_batches(toy.TASK, toy.LENGTHS, converter, BATCH, seed=0)
  for _ in range(steps):
    state, _ = tr.step(state, next(batches))
  return before, state.params, tr


def _eval_batch(model):
  converter = model.feature_converter_cls(pack=False)
  batch = next(inputs.train_batches(toy.TASK, toy.LENGTHS, converter, 4, seed=1))
  return {k: jnp.asarray(v) for k, v in batch.items()}


def _init(model, batch):
  shapes = {k: v.shape for k, v in batch.items()}
  return nn.unbox(jax.jit(lambda r: model.get_initial_variables(r, shapes))(
      jax.random.PRNGKey(0))['params'])


# ----------------------------------------------------------------------------- adapters
def test_adapters_add_only_their_parameters_and_start_as_identity():
  base, with_adapters = _model(), _model(adapter_dim=4)
  batch = _eval_batch(base)
  p0, p1 = _flat(_init(base, batch)), _flat(_init(with_adapters, batch))
  added = sorted(set(p1) - set(p0))
  assert set(p0) <= set(p1)
  assert added == [f'{s}/layers_{i}/adapter/{w}/kernel' for s in ('decoder', 'encoder')
                   for i in (0, 1) for w in ('wi', 'wo')]
  assert p1['encoder/layers_0/adapter/wi/kernel'].shape == (16, 4)
  for k in p0:  # the base parameters are untouched by the option, value for value
    np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)
  # wo starts at zero: the adapted model computes the base model's function.
  np.testing.assert_array_equal(jax.jit(base.score_batch)(_init(base, batch), batch),
                                jax.jit(with_adapters.score_batch)(_init(with_adapters, batch), batch))


def test_adapter_training_updates_only_adapters_and_layer_norms():
  model = _model(adapter_dim=4)
  trainable = ['/adapter/', r'_norm/scale$']  # gin/adaptation/adapters.gin
  before, params, _ = _train(model, trainable, steps=3)
  after = _flat(params)
  for k, v in before.items():
    changed = not np.array_equal(after[k], v)
    assert changed == ('/adapter/' in k or k.endswith('_norm/scale')), k


# ----------------------------------------------------------------------------- prompt tuning
def test_prompt_tuning_trains_only_the_prompt_and_serves():
  model = _model(num_prompt_tokens=3)
  before, params, _ = _train(model, [r'^prompt/'], steps=3, pack=False)
  after = _flat(params)
  assert after['prompt/embedding'].shape == (3, 16)
  assert [k for k, v in before.items() if not np.array_equal(after[k], v)] == ['prompt/embedding']

  batch = _eval_batch(model)
  score, predict = jax.jit(model.score_batch), jax.jit(model.predict_batch)
  scores = score(params, batch)
  _, metrics = jax.jit(model.loss_fn)(params, batch, None)
  np.testing.assert_allclose(-float(scores.sum()) / float(metrics['num_tokens']),
                             float(metrics['loss']), rtol=1e-5)
  # The prompt is read: another prompt gives other scores.
  other = jax.tree.map(lambda x: x, params)
  other['prompt']['embedding'] = params['prompt']['embedding'] + 1.0
  assert not np.allclose(score(other, batch), scores)
  # The masks account for the prompt: extra encoder padding changes nothing.
  padded = {**batch, 'encoder_input_tokens': jnp.pad(batch['encoder_input_tokens'],
                                                     ((0, 0), (0, 5)))}
  np.testing.assert_allclose(score(params, padded), scores, rtol=1e-5, atol=1e-5)
  predictions = predict(params, batch)
  assert predictions.shape == batch['decoder_target_tokens'].shape
  np.testing.assert_array_equal(predict(params, padded), predictions)


def test_prompt_tuning_refuses_packed_batches():
  model = _model(num_prompt_tokens=2)
  shapes = {k: (2, 8) for k in ('encoder_input_tokens', 'decoder_input_tokens',
                                'encoder_segment_ids', 'decoder_segment_ids')}
  with pytest.raises(ValueError, match='USE_PACKING = False'):
    model.get_initial_variables(jax.random.PRNGKey(0), shapes)


def test_t5_classifier_encoder_prompt_is_the_encode_prompt():
  """T5EncoderStates with num_prompt_tokens computes Transformer.encode's prompt-tuned encoder
  (same parameters by path), minus the prompt positions; without it the option was ignored."""
  from t2t.models.t5_encoder import T5EncoderStates  # pylint: disable=g-import-not-at-top
  config = T5Config(vocab_size=64, d_model=16, num_heads=2, d_kv=8, d_ff=32, num_encoder_layers=2,
                    num_decoder_layers=1, dropout_rate=0.0, num_prompt_tokens=3)
  tokens = jnp.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]], jnp.int32)
  full = nn.unbox(Transformer(config).init(jax.random.PRNGKey(0), tokens, tokens[:, :2],
                                           enable_dropout=False)['params'])
  encoder = T5EncoderStates(config)
  boxed = encoder.init(jax.random.PRNGKey(0), tokens)['params']
  assert set(boxed) == {'token_embedder', 'encoder', 'prompt'}
  assert boxed['prompt']['embedding'].names == ('prompt', 'embed')
  params = {k: full[k] for k in boxed}
  states = encoder.apply({'params': params}, tokens)
  encoded = Transformer(config).apply({'params': full}, tokens, enable_dropout=False,
                                      method=Transformer.encode)
  assert encoded.shape[1] == 3 + 5 and states[-1].shape == (2, 5, 16)
  np.testing.assert_allclose(states[-1], encoded[:, 3:], atol=1e-5)
  other = {**params, 'prompt': {'embedding': params['prompt']['embedding'] + 1.0}}
  assert not np.allclose(encoder.apply({'params': other}, tokens)[-1], states[-1], atol=1e-3)


# ----------------------------------------------------------------------------- LoRA
def test_merge_hand_computed():
  w = jnp.array([[1.0, 2.0], [3.0, 4.0]])
  a = jnp.array([[1.0], [2.0]])       # [in=2, r=1]
  b = jnp.array([[10.0, 20.0]])       # [r=1, out=2]
  merged = peft.merge({'dense': {'kernel': w, 'kernel_lora_a': a, 'kernel_lora_b': b}}, 0.5)
  assert set(merged['dense']) == {'kernel'}
  np.testing.assert_array_equal(merged['dense']['kernel'], [[6.0, 12.0], [13.0, 24.0]])


def test_lora_factors_beside_targets_with_logical_axes():
  lora = peft.LoraModel(_model(), targets=[r'attention/(query|out)/kernel$'], rank=2, alpha=4.0)
  batch = _eval_batch(lora)
  shapes = {k: v.shape for k, v in batch.items()}
  boxed = jax.eval_shape(lambda r: lora.get_initial_variables(r, shapes), jax.random.PRNGKey(0))
  enc = boxed['params']['encoder']['layers_0']['attention']
  # query [embed, heads, kv] projects out of the residual stream: A [embed, r], B [r, heads, kv];
  # out [heads, kv, embed] projects into it: A [heads, kv, r], B [r, embed].
  assert enc['query']['kernel_lora_a'].value.shape == (16, 2)
  assert enc['query']['kernel_lora_a'].names == ('embed', 'lora_rank')
  assert enc['query']['kernel_lora_b'].names == ('lora_rank', 'heads', 'kv')
  assert enc['out']['kernel_lora_a'].value.shape == (2, 8, 2)
  assert enc['out']['kernel_lora_b'].names == ('lora_rank', 'embed')
  with pytest.raises(adaptation.PatternError, match=r"(?s)'attn/q' matches no parameter.*"
                     r"encoder/layers_\{0..1\}/attention/query/kernel"):
    peft.LoraModel(_model(), targets=['attn/q']).get_initial_variables(
        jax.random.PRNGKey(0), shapes)


def test_lora_trains_only_factors_and_merged_base_model_is_equivalent(tmp_path):
  base = _model()
  lora = peft.LoraModel(base, targets=[r'attention/(query|value)/kernel$', r'mlp/wo/kernel$'],
                        rank=2, alpha=4.0)
  batch = _eval_batch(lora)
  before, params, _ = _train(lora, [peft.LORA_A + '$', peft.LORA_B + '$'], steps=3)
  after = _flat(params)
  for k, v in before.items():
    assert (not np.array_equal(after[k], v)) == ('_lora_' in k), k  # B from step 1, A from 2
  merged = lora.merge(params)
  assert set(_flat(merged)) == {k for k in after if '_lora_' not in k}
  np.testing.assert_allclose(jax.jit(base.score_batch)(merged, batch),
                             jax.jit(lora.score_batch)(params, batch), rtol=1e-6)
  np.testing.assert_array_equal(jax.jit(base.predict_batch)(merged, batch),
                                jax.jit(lora.predict_batch)(params, batch))


@pytest.mark.filterwarnings('error::pytest.PytestUnraisableExceptionWarning')  # late_reads.py
def test_lora_run_exports_a_base_checkpoint(tmp_path, capsys):
  base = _model()
  lora = peft.LoraModel(base, targets=[r'mlp/wi/kernel$'], rank=2, alpha=8.0)
  state = train_lib.train(
      model=lora, mixture_or_task_name=toy.TASK, task_feature_lengths=toy.LENGTHS, train_steps=2,
      model_dir=str(tmp_path / 'lora'), batch_size=BATCH, checkpoint_every=2, log_every=2,
      optimizer=adaptation.adapted(optim.adafactor(learning_rate=0.05),
                                   trainable=['_lora_[ab]$']))
  out = peft.merge_checkpoint(str(tmp_path / 'lora'), str(tmp_path / 'merged'), alpha=8.0)
  assert out.endswith('merged/checkpoint_2')
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                          lora.merge(state.params))
  loaded, step = checkpoints.load_params(out, abstract, jax.tree.map(
      lambda _: Partitioner().replicated, abstract))
  assert step == 2
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded),
               jax.device_get(lora.merge(state.params)))
  # The same export from the command line (tools/merge_lora.py).
  from tools import merge_lora  # pylint: disable=g-import-not-at-top
  assert merge_lora.main(['--lora_dir', str(tmp_path / 'lora'), '--output',
                          str(tmp_path / 'cli'), '--alpha', '8']) == 0
  again, _ = checkpoints.load_params(str(tmp_path / 'cli'), abstract, jax.tree.map(
      lambda _: Partitioner().replicated, abstract))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(again), jax.device_get(loaded))
  assert merge_lora.main(['--lora_dir', str(tmp_path / 'nothing'), '--output',
                          str(tmp_path / 'x'), '--alpha', '8']) == 2
  # A truncated array file: one line naming it, no traceback, nothing written.
  data = tmp_path / 'lora' / 'checkpoint_2' / 'params' / 'd'
  for f in data.iterdir():
    f.write_bytes(f.read_bytes()[:16])
  capsys.readouterr()
  assert merge_lora.main(['--lora_dir', str(tmp_path / 'lora'), '--output',
                          str(tmp_path / 'damaged'), '--alpha', '8']) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: Checkpoint {tmp_path}/lora/checkpoint_2 cannot be read '
                        f'({data}/'), err
  assert not (tmp_path / 'damaged').exists()
