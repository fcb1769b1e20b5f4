"""The model gin files parse, build the documented models, and have the documented sizes."""
import pathlib

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / 'gin'
vocabularies = pytest.importorskip('t2t.data.vocabularies')


@pytest.fixture
def parse():
  gin.clear_config()
  gin.add_config_file_search_path(str(GIN_DIR))

  def _parse(name, bindings=()):
    gin.parse_config_files_and_bindings([str(GIN_DIR / 'models' / 't5_1_0' / f'{name}.gin')],
                                        list(bindings))
  yield _parse
  gin.clear_config()


def _num_params(config: T5Config) -> int:
  module = Transformer(config)
  tokens = jnp.ones((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), tokens, tokens,
                                              enable_dropout=False))
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(nn.unbox(shapes)))


def test_base_gin_is_t5_base(parse):
  parse('base')
  module = gin.query_parameter('EncoderDecoderModel.module').scoped_configurable_fn()
  assert isinstance(module, Transformer)
  config = module.config
  assert (config.d_model, config.d_ff, config.num_heads, config.num_encoder_layers) == (768, 3072, 12, 12)
  assert config.vocab_size == 32128 and config.tie_word_embeddings and config.dropout_rate == 0.1
  assert 220e6 < _num_params(config) < 225e6  # "~220M" (T5 paper, Base)
  # The public vocabulary is referenced, not constructed (that would need gs://).
  assert gin.query_parameter('seqio.SentencePieceVocabulary.extra_ids') == 100


@pytest.mark.parametrize('name,width,layers,expected_params', [
    ('small', 512, 6, 48.2e6),   # T5-Small (60.5M) with 8,192 instead of 32,128 embeddings
    ('tiny', 256, 4, 9.44e6),    # the arithmetic in tiny.gin's header
])
def test_sized_gin_files_build_models_with_local_vocab(parse, name, width, layers, expected_params):
  parse(name, ['DROPOUT_RATE = 0.0'])
  model = gin.query_parameter('%MODEL').scoped_configurable_fn()
  assert isinstance(model, EncoderDecoderModel)
  config = model.module.config
  assert (config.d_model, config.num_encoder_layers, config.num_decoder_layers) == (width, layers, layers)
  assert config.vocab_size == 8192 and config.dropout_rate == 0.0
  assert model.output_vocabulary.vocab_size == 8100 <= config.vocab_size
  assert abs(_num_params(config) - expected_params) / expected_params < 0.01
  ids = model.input_vocabulary.encode('The BBC reported on the economy.')
  assert 0 < max(ids) < 8000


def test_decoding_strategy_is_configurable(parse):
  from t2t.models import decoding  # pylint: disable=g-import-not-at-top
  parse('tiny', ['EncoderDecoderModel.decode_fn = @beam_search', 'beam_search.beam_size = 3',
                 'beam_search.alpha = 0.6'])
  model = gin.query_parameter('%MODEL').scoped_configurable_fn()
  assert model.decode_fn is decoding.beam_search
  with gin.config_scope(None):
    assert gin.query_parameter('beam_search.beam_size') == 3


def test_matmul_dtype_macro_reaches_the_model(parse):
  parse('tiny')
  assert gin.query_parameter('%MODEL').scoped_configurable_fn().module.config.matmul_dtype is None
  gin.clear_config()
  parse('tiny', ["MATMUL_DTYPE = 'bfloat16'"])
  config = gin.query_parameter('%MODEL').scoped_configurable_fn().module.config
  assert config.matmul_dtype == jnp.bfloat16 and config.dtype == jnp.float32
