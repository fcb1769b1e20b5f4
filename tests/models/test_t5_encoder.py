"""The T5 classifier encoder: same parameter paths and same output as Transformer.encode."""
import dataclasses

import flax.linen as nn
import jax
import numpy as np
import pytest

from t2t.models import t5_encoder
from t2t.models.transformer import Transformer
from t2t.training import checkpoints
from tests.models.helpers import seq2seq_batch, tiny_config


def test_params_are_a_t5_checkpoints_encoder_side_and_output_matches():
  config = tiny_config()
  batch = seq2seq_batch()
  tokens = batch['encoder_input_tokens']
  full = nn.unbox(Transformer(config).init(jax.random.PRNGKey(0), tokens,
                                           batch['decoder_input_tokens'],
                                           enable_dropout=False)['params'])
  encoder = t5_encoder.T5EncoderStates(config)
  mine = nn.unbox(encoder.init(jax.random.PRNGKey(1), tokens)['params'])
  full_paths = checkpoints.param_shapes(full)
  mine_paths = checkpoints.param_shapes(mine)
  assert set(mine_paths) == {p for p in full_paths if not p.startswith('decoder/')}
  assert all(full_paths[p] == shape for p, shape in mine_paths.items())
  assert 'token_embedder/embedding' in mine_paths

  # With the Transformer's own (encoder) parameters, the last state is Transformer.encode's output.
  encoder_params = {k: full[k] for k in ('token_embedder', 'encoder')}
  states = encoder.apply({'params': encoder_params}, tokens)
  assert len(states) == config.num_encoder_layers + 1
  expected = Transformer(config).apply({'params': full}, tokens, enable_dropout=False,
                                       method=Transformer.encode)
  np.testing.assert_allclose(states[-1], expected, rtol=1e-5, atol=1e-6)
  assert all(s.shape == expected.shape for s in states)


def test_scanned_layers_are_refused():
  encoder = t5_encoder.T5EncoderStates(dataclasses.replace(tiny_config(), scan_layers=True))
  with pytest.raises(ValueError, match='scan_layers'):
    encoder.init(jax.random.PRNGKey(0), np.ones((1, 3), np.int32))


def test_classifier_gin_builds_a_t5_encoder_classifier_with_checkpoint_paths():
  from t2t import config
  from t2t.models import classifier_api
  config.parse_gin(['models/classifiers/t5_tiny.gin'],
                   ["MIXTURE_OR_TASK_NAME = 'bbc_topic'", "ClassifierModel.labels = ['a', 'b']",
                    "ClassifierModel.encoding = 'joint'"])
  model = classifier_api.ClassifierModel()  # gin supplies every argument
  assert isinstance(model, classifier_api.ClassifierModel)
  assert isinstance(model.encoder, t5_encoder.T5EncoderStates)
  assert model.encoder.config.d_model == 256 and model.encoding == 'joint'
  shapes = jax.eval_shape(lambda rng: model.get_initial_variables(
      rng, {'encoder_input_tokens': (2, 8)})['params'], jax.random.PRNGKey(0))
  paths = checkpoints.param_shapes(nn.unbox(shapes))
  assert paths['token_embedder/embedding'] == [8192, 256]
  assert 'encoder/layers_3/attention/query/kernel' in paths
  assert paths['head/mlp/output/kernel'] == [256, 2]
