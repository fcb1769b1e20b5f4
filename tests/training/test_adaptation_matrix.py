"""Every adaptation method on every model family (issue 8): one gin recipe per cell.

Each cell builds the model and optimizer from gin files exactly as a user's command line would
(model gin, runs/finetune.gin, one adaptation recipe, bindings), trains 2 steps on a tiny
hand-made batch and asserts the method's contract: which parameters changed, which stayed
bit-identical, and that the optimizer holds state for the trainable parameters only. Cells where a
method does not apply assert the clear error instead. Tiny dimensions; every cell is built and
trained once per module (`_cell` caches plain numpy results).
"""
from __future__ import annotations

import dataclasses
import functools
import re

import flax.linen as nn
import gin
import jax
import numpy as np
import pytest

from t2t import config
from t2t.models import classifier_data
from t2t.training import adaptation, optim
from t2t.training import trainer

B, L_ENC, L_DEC = 4, 8, 4
COMMON = ['MIXTURE_OR_TASK_NAME = "x"', 'TASK_FEATURE_LENGTHS = {}', 'TRAIN_STEPS = 120',
          'MODEL_DIR = "/tmp/unused"', 'INITIAL_CHECKPOINT_PATH = None', 'DROPOUT_RATE = 0.0',
          'LEARNING_RATE = 0.5',  # large steps: deltas far above float32 rounding of the params
          'ADAPTER_DIM = 4', 'LORA_RANK = 2', 'NUM_PROMPT_TOKENS = 3', 'UNFREEZE_EVERY = 1']
T5_TINY = ['T5Config.d_model = 16', 'T5Config.num_heads = 2', 'T5Config.d_kv = 8',
           'T5Config.d_ff = 32', 'T5Config.num_encoder_layers = 2',
           'T5Config.num_decoder_layers = 2']
HEAD_TINY = ["ClassifierModel.labels = ['a', 'b']", 'ClassifierHead.hidden_dim = 16']
FAMILIES = {
    't5': (['models/t5_1_0/tiny.gin'], T5_TINY),
    't5_classifier': (['models/classifiers/t5_tiny.gin'], T5_TINY + HEAD_TINY),
    'bert': (['models/classifiers/bert_tiny.gin'],
             ['BertConfig.hidden_size = 16', 'BertConfig.num_heads = 2',
              'BertConfig.intermediate_size = 32', 'BertConfig.num_layers = 2'] + HEAD_TINY),
    # Sentence pairs, encoded apart: the BiLSTM prompt goes in front of each sentence.
    'bilstm': (['models/bilstm/tiny.gin'],
               ['BiLSTMConfig.embed_dim = 8', 'BiLSTMConfig.hidden_dim = 8',
                'ClassifierHead.projection_dim = 16', "ClassifierModel.encoding = 'separate'"]
               + HEAD_TINY),
}
# The one gin recipe of each cell (the README's "method x family" table).
RECIPES = {
    'full': dict.fromkeys(FAMILIES, 'full_finetune'),
    'frozen_mix': dict.fromkeys(FAMILIES, 'freeze_encoder_mix'),
    'adapters': {'t5': 'adapters', 't5_classifier': 'adapters', 'bert': 'bert_adapters',
                 'bilstm': 'bilstm_adapters'},
    'lora': {'t5': 'lora', 't5_classifier': 'classifier_lora', 'bert': 'classifier_lora',
             'bilstm': 'bilstm_lora'},
    'prompt': dict.fromkeys(FAMILIES, 'prompt_tuning'),
    'gradual': dict.fromkeys(FAMILIES, 'gradual_unfreezing'),
    'dlr': dict.fromkeys(FAMILIES, 'discriminative_lr'),
    'stlr': dict.fromkeys(FAMILIES, 'slanted_triangular'),
    # Where the family's usual recipe does not apply: the fallback, and the refusal.
    'frozen': {'bilstm': 'freeze_encoder'},
    'lora_default': {'bilstm': 'classifier_lora'},
}
# Eager steps retrace the BiLSTM's scan (and its transpose) every call: one compile is cheaper.
JIT_STEP = ('bilstm',)
EMBEDDINGS = re.compile(r'^(token_embedder|embedder|encoder/embeddings)/')


def _flat(tree) -> dict[str, np.ndarray]:
  return dict(zip(adaptation.param_paths(tree), map(np.asarray, jax.tree.leaves(
      jax.device_get(tree)))))


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _batch(family: str, model) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 200, (B, L_ENC)).astype(np.int32)
  tokens[1, 5:] = 0  # a padded row
  if family == 't5':
    targets = rng.integers(3, 200, (B, L_DEC)).astype(np.int32)
    return {'encoder_input_tokens': tokens, 'decoder_target_tokens': targets,
            'decoder_input_tokens': np.pad(targets[:, :-1], [(0, 0), (1, 0)]),
            'decoder_loss_weights': np.ones((B, L_DEC), np.int32)}
  batch = {'encoder_input_tokens': tokens,
           classifier_data.LABEL_FEATURE: np.array([[0], [1], [0], [1]], np.int32)}
  if model.encoding == 'joint':
    tokens[:, 0] = model.cls_id
    batch['encoder_token_types'] = np.zeros_like(tokens)
  if model.encoding == 'separate':
    pair = rng.integers(3, 200, (B, L_ENC - 2)).astype(np.int32)
    pair[2, 3:] = 0
    batch['encoder_pair_tokens'] = pair
  return batch


@dataclasses.dataclass
class Cell:
  before: dict[str, np.ndarray]
  steps: list[dict[str, np.ndarray]]   # params after step 1 and after step 2
  mask: dict[str, bool]                # the optimizer's trainable mask
  opt_bytes: int                       # bytes of the optimizer state
  expected_opt_bytes: int              # AdaFactor's state for the trainable parameters alone

  def changed(self, step: int | None = None) -> set[str]:
    """Parameters that differ from their start after `step` (None: after either step; a large
    step can take a parameter back to its start, e.g. a zero bias by +-lr * 1e-3)."""
    steps = self.steps if step is None else [self.steps[step - 1]]
    return {k for k, v in self.before.items() if any(not np.array_equal(s[k], v) for s in steps)}

  def delta(self, step: int = 1) -> dict[str, np.ndarray]:
    return {k: self.steps[step - 1][k] - v for k, v in self.before.items()}


@functools.lru_cache(maxsize=None)
def _cell(family: str, method: str) -> Cell:
  """Parses the family's gin + runs/finetune.gin + the method's recipe, trains 2 steps."""
  gin.clear_config()
  try:
    files, bindings = FAMILIES[family]
    config.parse_gin([*files, 'runs/finetune.gin', f'adaptation/{RECIPES[method][family]}.gin'],
                     [*COMMON, *bindings])
    model = gin.query_parameter('train.model').scoped_configurable_fn()
    opt = gin.query_parameter('train.optimizer').scoped_configurable_fn()
    batch = _batch(family, model)
    # The Trainer's train_step (masked gradients, the optimizer), eager except for JIT_STEP:
    # op-by-op dispatch shares its compiled kernels across the cells instead of compiling ~35
    # tiny models (CPU time ~1/4).
    params = nn.unbox(model.get_initial_variables(
        jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})['params'])
    trainable_mask = adaptation.trainable_mask(opt, params)
    state = trainer.TrainState(step=jax.numpy.zeros([], jax.numpy.int32), params=params,
                               opt_state=opt.init(params))
    mask = _flat(trainable_mask)
    before = _flat(params)
    trainable = {k: v for k, v in before.items() if mask[k]}
    expected = _nbytes(jax.eval_shape(optim.adafactor().init, trainable))
    opt_bytes = _nbytes(state.opt_state)
    step = functools.partial(trainer.train_step, model, opt, trainable_mask)
    if family in JIT_STEP:
      step = jax.jit(step)
    steps = []
    for _ in range(2):
      state, metrics = step(state, batch, jax.random.PRNGKey(1))
      assert np.isfinite(float(metrics['loss']))
      steps.append(_flat(state.params))
    return Cell(before, steps, {k: bool(v) for k, v in mask.items()}, opt_bytes, expected)
  finally:
    gin.clear_config()


@pytest.fixture(scope='module', autouse=True)
def _release_cells():
  """The cells' results and jax's eager kernel caches (~3 GB RSS at the end) go with the module."""
  yield
  _cell.cache_clear()
  jax.clear_caches()


def _assert_trains_exactly(cell: Cell, expected: set[str]):
  """Exactly `expected` changed in 2 steps (the rest bit-identical throughout), and the optimizer's state
  is that of the trainable parameters alone (up to a few step counters)."""
  assert expected, 'a contract with nothing to train'
  assert cell.changed() == expected
  assert {k for k, v in cell.mask.items() if v} == expected
  assert 0 <= cell.opt_bytes - cell.expected_opt_bytes <= 64


def _head(paths) -> set[str]:
  return {k for k in paths if k.startswith('head/')}


# ----------------------------------------------------------------------------- the matrix
@pytest.mark.parametrize('family', FAMILIES)
def test_full_finetuning_trains_everything(family):
  cell = _cell(family, 'full')
  assert cell.changed() == set(cell.before) and all(cell.mask.values())
  assert cell.opt_bytes == cell.expected_opt_bytes


@pytest.mark.parametrize('family', ['t5_classifier', 'bert'])
def test_frozen_encoder_with_scalar_mix_trains_head_and_mix(family):
  cell = _cell(family, 'frozen_mix')
  assert {'scalar_mix/weights', 'scalar_mix/gamma'} <= set(cell.before)
  _assert_trains_exactly(cell, {k for k in cell.before if k.startswith(('head/', 'scalar_mix/'))})


def test_frozen_encoder_on_families_that_cannot_take_it():
  # T5 encoder-decoder: no head or mix to train, the recipe names its pattern.
  with pytest.raises(adaptation.PatternError, match=r"'\^\(head\|scalar_mix\)/' matches no"):
    _cell('t5', 'frozen_mix')
  # BiLSTM: its states differ in width, so no scalar mix; the error names the option and encoder.
  with pytest.raises(ValueError, match=r'ClassifierModel.scalar_mix = True .* BiLSTMEncoder '
                                       r'returns widths \[8, 16, 24\]'):
    _cell('bilstm', 'frozen_mix')


def test_frozen_encoder_without_mix_on_the_bilstm():
  cell = _cell('bilstm', 'frozen')
  _assert_trains_exactly(cell, _head(cell.before))


ADAPTER_TRAINS = {  # besides /adapter/ and the head
    't5': re.compile(r'_norm/scale$'), 't5_classifier': re.compile(r'_norm/scale$'),
    'bert': re.compile(r'_layer_norm/'), 'bilstm': None}


@pytest.mark.parametrize('family', FAMILIES)
def test_adapters_train_adapters_norms_and_head(family):
  cell = _cell(family, 'adapters')
  adapters = {k for k in cell.before if '/adapter/' in k}
  layers = {f'{s}/layers_{i}' for s in ('encoder', 'decoder') for i in (0, 1)
            if any(k.startswith(f'{s}/layers_{i}/') for k in cell.before)}
  # One adapter (wi, wo) per layer of every stack; wo's zero start still lets wi train in step 2.
  assert adapters == {f'{layer}/adapter/{w}/kernel' for layer in layers for w in ('wi', 'wo')}
  norms = ADAPTER_TRAINS[family]
  expected = adapters | _head(cell.before) | (
      set() if norms is None else {k for k in cell.before if norms.search(k)})
  _assert_trains_exactly(cell, expected)


@pytest.mark.parametrize('family', FAMILIES)
def test_lora_trains_factors_and_head(family):
  cell = _cell(family, 'lora')
  factors = {k for k in cell.before if re.search(r'_lora_[ab]$', k)}
  targets = {k[:-len('_lora_a')] for k in factors}
  if family == 'bilstm':  # every LSTM kernel: 2 layers x 2 directions x (input, recurrent)
    assert len(targets) == 8 and all(k.endswith('_kernel') for k in targets)
  else:  # W_q and W_v of every attention
    assert targets and all(re.search(r'attention/(query|value)/kernel$', k) for k in targets)
  _assert_trains_exactly(cell, factors | _head(cell.before))


def test_lora_default_targets_refused_on_the_bilstm():
  with pytest.raises(adaptation.PatternError,
                     match=r"LoraModel.targets: pattern 'attention/\(query\|value\)/kernel\$' "
                           'matches no parameter'):
    _cell('bilstm', 'lora_default')


@pytest.mark.parametrize('family', FAMILIES)
def test_prompt_tuning_trains_the_prompt_and_head(family):
  cell = _cell(family, 'prompt')
  assert cell.before['prompt/embedding'].shape[0] == 3
  _assert_trains_exactly(cell, {'prompt/embedding'} | _head(cell.before))


def _depth_one(path: str) -> bool:
  """The lower of two layers (and T5's relative positions, owned by layer 0)."""
  return '/layers_0/' in path or '/relpos_bias/' in path


@pytest.mark.parametrize('family', FAMILIES)
def test_gradual_unfreezing_top_layer_first(family):
  cell = _cell(family, 'gradual')
  assert all(cell.mask.values())  # nothing frozen for good
  # Step 1: the top layer of every stack (T5: encoder and decoder in parallel; the classifier
  # families have only an encoder), embeddings, norms and head; step 2: everything.
  lower = {k for k in cell.before if _depth_one(k)}
  assert lower and cell.changed(1) == set(cell.before) - lower
  assert cell.changed() == set(cell.before)


@pytest.mark.parametrize('family', FAMILIES)
def test_discriminative_lr_scales_updates_by_depth(family):
  cell, full = _cell(family, 'dlr'), _cell(family, 'full')
  delta, reference = cell.delta(), full.delta()
  for k, v in delta.items():
    factor = 0.4 ** 2 if EMBEDDINGS.search(k) else 0.4 if _depth_one(k) else 1.0
    np.testing.assert_allclose(v, factor * reference[k], rtol=2e-3, atol=1e-7, err_msg=k)


@pytest.mark.parametrize('family', FAMILIES)
def test_slanted_triangular_starts_at_max_over_ratio(family):
  cell, full = _cell(family, 'stlr'), _cell(family, 'full')
  delta, reference = cell.delta(), full.delta()
  for k, v in delta.items():  # step 1 at lr = LEARNING_RATE / 32 (ratio 32), else as full
    np.testing.assert_allclose(v, reference[k] / 32, rtol=2e-3, atol=1e-8, err_msg=k)
