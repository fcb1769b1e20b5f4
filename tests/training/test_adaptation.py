"""Tests for t2t/training/adaptation.py: masks, the `adapted` optimizer, schedules, the train step."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t import train as train_lib
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


def _model(layers: int = 2, **overrides) -> EncoderDecoderModel:
  config = T5Config(vocab_size=64, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                    num_encoder_layers=layers, num_decoder_layers=layers, dropout_rate=0.0,
                    **overrides)
  return EncoderDecoderModel(Transformer(config), toy.VOCAB, toy.VOCAB)


def _shapes(model):
  converter = model.feature_converter_cls(pack=True)
  return {k: (BATCH, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}


def _flat(tree):
  return dict(zip(adaptation.param_paths(tree), jax.tree.leaves(jax.device_get(tree))))


# A hand-made tree in the shared naming: 2 encoder layers, 3 decoder layers.
TREE = {
    'token_embedder': {'embedding': jnp.zeros(2)},
    'encoder': {'relpos_bias': {'rel_embedding': jnp.zeros(2)},
                'layers_0': {'w': jnp.zeros(2)}, 'layers_1': {'w': jnp.zeros(2)},
                'encoder_norm': {'scale': jnp.zeros(2)}},
    'decoder': {'layers_0': {'w': jnp.zeros(2)}, 'layers_1': {'w': jnp.zeros(2)},
                'layers_2': {'w': jnp.zeros(2)}},
}


def _updates(tx, steps):
  """First-coordinate update of every leaf at each of `steps` steps, for gradients of ones."""
  state = tx.init(TREE)
  grads = jax.tree.map(jnp.ones_like, TREE)
  out = []
  for _ in range(steps):
    updates, state = tx.update(grads, state, TREE)
    out.append({k: float(v[0]) for k, v in _flat(updates).items()})
  return out


# ----------------------------------------------------------------------------- patterns
def test_select_trainable_and_frozen():
  mask = _flat(adaptation.select(TREE, trainable=[r'^decoder/', r'/embedding$'],
                                 frozen=[r'layers_0/']))
  assert [k for k, v in mask.items() if v] == [
      'decoder/layers_1/w', 'decoder/layers_2/w', 'token_embedder/embedding']


def test_always_trainable_adds_to_every_recipe_and_must_match():
  mask = _flat(adaptation.select(TREE, trainable=[r'^decoder/layers_2/'],
                                 always_trainable=[r'encoder_norm/'], frozen=[r'layers_2/']))
  assert [k for k, v in mask.items() if v] == ['encoder/encoder_norm/scale']
  tx = adaptation.adapted(optax.sgd(1.0), trainable=['^token_embedder/'],
                          always_trainable=['^decoder/layers_0/'])
  [upd] = _updates(tx, 1)
  assert sorted(k for k, v in upd.items() if v) == ['decoder/layers_0/w',
                                                    'token_embedder/embedding']
  with pytest.raises(adaptation.PatternError, match=r"adapted.always_trainable: pattern '\^head/'"):
    adaptation.select(TREE, always_trainable=['^head/'])


def test_pattern_matching_nothing_names_it_and_lists_the_paths():
  with pytest.raises(adaptation.PatternError) as e:
    adaptation.select(TREE, frozen=['^head/'])
  msg = str(e.value)
  assert "'^head/' matches no parameter" in msg and 'adapted.frozen' in msg
  assert 'encoder/layers_{0..1}/w' in msg and 'decoder/layers_{0..2}/w' in msg
  assert 'token_embedder/embedding' in msg
  with pytest.raises(adaptation.PatternError, match='not a regular expression'):
    adaptation.select(TREE, trainable=['layers_('])
  with pytest.raises(adaptation.PatternError, match='leave no parameter'):
    adaptation.select(TREE, frozen=['.'])


def test_layer_depths():
  depths = dict(zip(adaptation.param_paths(TREE), adaptation.layer_depths(
      adaptation.param_paths(TREE))))
  assert depths == {
      'decoder/layers_0/w': 2, 'decoder/layers_1/w': 1, 'decoder/layers_2/w': 0,
      'encoder/encoder_norm/scale': 0, 'encoder/layers_0/w': 1, 'encoder/layers_1/w': 0,
      'encoder/relpos_bias/rel_embedding': 1, 'token_embedder/embedding': None}


def test_layer_depths_refuse_scanned_stacks():
  with pytest.raises(ValueError, match="'encoder/layers/mlp/wi/kernel' belongs to a scanned"):
    adaptation.layer_depths(['token_embedder/embedding', 'encoder/layers/mlp/wi/kernel'])


# ----------------------------------------------------------------------------- the optimizer
def test_frozen_leaves_get_zero_updates_and_no_state():
  tx = adaptation.adapted(optax.adam(1.0), frozen=['^encoder/'])
  [upd] = _updates(tx, 1)
  assert all(v == 0.0 for k, v in upd.items() if k.startswith('encoder/'))
  assert all(v == pytest.approx(-1.0, abs=1e-5) for k, v in upd.items() if not k.startswith('encoder/'))
  # Adam keeps mu and nu per trainable element: 4 trainable leaves x 2 floats x 2 moments.
  state_elems = sum(x.size for x in jax.tree.leaves(tx.init(TREE)) if x.ndim)
  assert state_elems == 4 * 2 * 2


def test_gradual_unfreezing_from_the_top_embeddings_always():
  tx = adaptation.adapted(optax.sgd(1.0), unfreeze_every=2)
  steps = _updates(tx, 5)
  trained = [sorted(k for k, v in s.items() if v != 0.0) for s in steps]
  first = ['decoder/layers_2/w', 'encoder/encoder_norm/scale', 'encoder/layers_1/w',
           'token_embedder/embedding']
  second = sorted(first + ['decoder/layers_1/w', 'encoder/layers_0/w',
                           'encoder/relpos_bias/rel_embedding'])
  assert trained == [first, first, second, second, sorted(_flat(TREE))]
  assert all(v == -1.0 for s in steps for v in s.values() if v)


def test_discriminative_learning_rates_scale_by_depth():
  [upd] = _updates(adaptation.adapted(optax.sgd(1.0), layer_decay=0.4), 1)
  assert upd == pytest.approx({
      'decoder/layers_2/w': -1.0, 'decoder/layers_1/w': -0.4, 'decoder/layers_0/w': -0.16,
      'encoder/layers_1/w': -1.0, 'encoder/layers_0/w': -0.4, 'encoder/encoder_norm/scale': -1.0,
      'encoder/relpos_bias/rel_embedding': -0.4,
      'token_embedder/embedding': -0.064})  # one below the deepest layer (depth 2)


def test_slanted_triangular_hand_computed():
  # T = 100, cut_frac 0.1 -> cut = 10; eta_max 0.01, ratio 32 -> floor eta_max / 32 = 3.125e-4.
  lr = adaptation.slanted_triangular(100, max_learning_rate=0.01, cut_frac=0.1, ratio=32)
  got = [float(lr(t)) for t in (0, 5, 10, 55, 100, 200)]
  assert got == pytest.approx([3.125e-4, 0.01 * 16.5 / 32, 0.01, 0.01 * 16.5 / 32, 3.125e-4,
                               3.125e-4], rel=1e-6)


# ----------------------------------------------------------------------------- the train step
def test_trainer_keeps_frozen_parameters_bit_identical():
  model = _model()
  opt = adaptation.adapted(optim.adafactor(learning_rate=0.01), frozen=['^encoder/', 'embedder'])
  tr = Trainer(model, opt, Partitioner(), _shapes(model))
  state = tr.init_state()
  before = _flat(state.params)
  # The optimizer state is that of AdaFactor over the decoder alone: nothing for frozen leaves.
  nbytes = lambda t: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(t))
  full = jax.eval_shape(optim.adafactor(learning_rate=0.01).init, tr.params_abstract)
  decoder_only = jax.eval_shape(optim.adafactor(learning_rate=0.01).init,
                                {'decoder': tr.params_abstract['decoder']})
  assert nbytes(state.opt_state) == nbytes(decoder_only) < 0.7 * nbytes(full)
  batches = inputs.train_batches(toy.TASK, toy.LENGTHS, model.feature_converter_cls(pack=True),
                                 BATCH, seed=0)
  batch = next(batches)
  # grad_norm is the norm of the decoder's gradient alone.
  grads = jax.grad(lambda p: model.loss_fn(p, batch, jax.random.fold_in(tr.dropout_rng, 0))[0])(
      state.params)
  expected_norm = float(optax.tree.norm(grads['decoder']))
  state, metrics = tr.step(state, batch)
  assert float(metrics['grad_norm']) == pytest.approx(expected_norm, rel=1e-5)
  for _ in range(2):
    state, _ = tr.step(state, next(batches))
  after = _flat(state.params)
  for k, v in before.items():
    if k.startswith('encoder/') or k.startswith('token_embedder/'):
      np.testing.assert_array_equal(after[k], v, err_msg=k)
    else:
      assert not np.array_equal(after[k], v), k


def test_train_run_with_adapted_optimizer_checkpoints_and_resumes(tmp_path):
  def run(steps):
    opt = adaptation.adapted(optim.adafactor(learning_rate=0.01), trainable=['^decoder/'],
                             unfreeze_every=2)
    return train_lib.train(model=_model(), mixture_or_task_name=toy.TASK,
                           task_feature_lengths=toy.LENGTHS, train_steps=steps,
                           model_dir=str(tmp_path), batch_size=BATCH, optimizer=opt,
                           checkpoint_every=2, log_every=2)
  first = _flat(run(2).params)
  second = _flat(run(4).params)  # resumes from checkpoint_2 with its (masked) optimizer state
  assert np.array_equal(first['encoder/layers_1/mlp/wi/kernel'],
                        second['encoder/layers_1/mlp/wi/kernel'])
  # decoder layers_0 is locked for the first two steps, then trains.
  assert not np.array_equal(first['decoder/layers_0/mlp/wi/kernel'],
                            second['decoder/layers_0/mlp/wi/kernel'])


def test_load_pretrained_keeps_fresh_adapters_and_restores_the_rest(tmp_path):
  pretrained = train_lib.train(model=_model(), mixture_or_task_name=toy.TASK,
                               task_feature_lengths=toy.LENGTHS, train_steps=1,
                               model_dir=str(tmp_path), batch_size=BATCH,
                               optimizer=optim.adafactor(learning_rate=0.01), log_every=1)
  saved = _flat(pretrained.params)
  model = _model(adapter_dim=4)
  tr = Trainer(model, optim.adafactor(), Partitioner(), _shapes(model))
  params, step = adaptation.load_pretrained(str(tmp_path), tr)
  assert step == 1
  loaded, fresh = _flat(params), _flat(tr.init_params())
  assert set(loaded) - set(saved) == {k for k in loaded if '/adapter/' in k} != set()
  for k, v in loaded.items():
    np.testing.assert_array_equal(v, saved[k] if k in saved else fresh[k], err_msg=k)
  # A parameter the checkpoint lacks that no method adds is still refused.
  other = _model(layers=3)
  with pytest.raises(checkpoints.CheckpointMismatchError, match=r"'decoder/layers_2/.*' .* is missing"):
    adaptation.load_pretrained(str(tmp_path), Trainer(other, optim.adafactor(), Partitioner(),
                                                      _shapes(other)))


# ----------------------------------------------------------------------------- gin recipes
def _recipe(*files, bindings=()):
  """(model, optimizer, trainable paths) of tiny T5 fine-tuning + adaptation gin files."""
  import gin  # pylint: disable=g-import-not-at-top
  from t2t import config  # pylint: disable=g-import-not-at-top
  config.parse_gin(['models/t5_1_0/tiny.gin', 'runs/finetune.gin',
                    *[f'adaptation/{f}.gin' for f in files]],
                   ['MIXTURE_OR_TASK_NAME = "x"', 'TASK_FEATURE_LENGTHS = {}', 'TRAIN_STEPS = 120',
                    'MODEL_DIR = "/tmp/x"', 'INITIAL_CHECKPOINT_PATH = None', *bindings])
  model = gin.query_parameter('train.model').scoped_configurable_fn()
  opt = gin.query_parameter('train.optimizer').scoped_configurable_fn()
  shapes = {k: (2, 8) for k in ('encoder_input_tokens', 'decoder_input_tokens')}
  params = nn.unbox(jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0),
                                                                       shapes))['params'])
  mask = _flat(adaptation.trainable_mask(opt, params))
  return model, opt, sorted(k for k, v in mask.items() if v)


def test_gin_recipes_train_what_they_say():
  _, opt, trained = _recipe('full_finetune')
  assert not isinstance(opt, adaptation.AdaptedTransformation) and len(trained) > 50
  _, _, trained = _recipe('adapters', bindings=['ADAPTER_DIM = 32'])
  assert len(trained) == 2 * 4 * 2 + (4 * 2 + 4 * 3 + 2) and all(
      '/adapter/' in k or k.endswith('_norm/scale') for k in trained)
  model, _, trained = _recipe('lora')
  assert trained == sorted(f'{s}/layers_{i}/{a}/{w}/kernel_lora_{f}'
                           for s, a in (('encoder', 'attention'), ('decoder', 'self_attention'),
                                        ('decoder', 'encoder_decoder_attention'))
                           for i in range(4) for w in ('query', 'value') for f in 'ab')
  assert model.rank == 8 and model.scale == 2.0
  _, _, trained = _recipe('prompt_tuning')
  assert trained == ['prompt/embedding']
  with pytest.raises(adaptation.PatternError, match=r"'\^\(head\|scalar_mix\)/' matches no"):
    _recipe('freeze_encoder')  # T5 has no classifier head


def test_gin_schedules_and_layer_recipes():
  import gin  # pylint: disable=g-import-not-at-top
  _, opt, _ = _recipe('gradual_unfreezing', 'discriminative_lr', 'slanted_triangular',
                      bindings=['UNFREEZE_EVERY = 10'])
  value = lambda name: gin.query_parameter(name).scoped_configurable_fn()  # a %MACRO reference
  assert value('adapted.unfreeze_every') == 10 and value('adapted.layer_decay') == 0.4
  assert isinstance(opt, adaptation.AdaptedTransformation)
  lr = gin.query_parameter('adafactor.learning_rate').scoped_configurable_fn()
  assert float(lr(12)) == pytest.approx(0.001)  # the peak: cut = 120 * 0.1
