"""Rematerialisation, scan over layers and bf16 activations leave the maths unchanged.

remat: loss and gradients equal with and without it; scan: the same weights (stacked per layer)
give the same loss, gradients and greedy predictions; bf16 activations with fp32 parameters stay
close to fp32 and give a finite loss.
"""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t.models import api, decoder_only
from t2t.models import transformer as t5
from tests.models import helpers

VOCAB = seqio.PassThroughVocabulary(48)
BATCH = {k: jnp.asarray(v) for k, v in helpers.seq2seq_batch().items()}
SHAPES = {'encoder_input_tokens': (3, 7), 'decoder_input_tokens': (3, 5)}


def _model(**overrides):
  return api.EncoderDecoderModel(t5.Transformer(helpers.tiny_config(**overrides)), VOCAB, VOCAB)


def _params(model):
  return nn.unbox(jax.jit(lambda r: model.get_initial_variables(r, SHAPES))(jax.random.PRNGKey(0)))[
      'params']


def _loss_and_grads(model, params):
  (loss, _), grads = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(params, BATCH, None)
  return loss, grads


@pytest.fixture(scope='module')
def reference():
  model = _model()
  params = _params(model)
  return params, _loss_and_grads(model, params)


def _assert_trees_close(a, b, **tol):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **tol), a, b)


@pytest.mark.parametrize('policy', ['full', 'dots_saveable'])
def test_remat_gives_same_loss_and_gradients(reference, policy):
  params, (loss, grads) = reference
  model = _model(remat_policy=policy)
  assert jax.tree.structure(_params(model)) == jax.tree.structure(params)  # same checkpoint layout
  loss_r, grads_r = _loss_and_grads(model, params)
  np.testing.assert_allclose(loss_r, loss, rtol=1e-6)
  _assert_trees_close(grads_r, grads, rtol=1e-5, atol=1e-7)


def _stack(params, config):
  return dict(params, encoder=t5.stack_layer_params(params['encoder'], config.num_encoder_layers),
              decoder=t5.stack_layer_params(params['decoder'], config.num_decoder_layers))


@pytest.mark.parametrize('policy', ['none', 'full'])
def test_scan_gives_same_loss_gradients_and_predictions(reference, policy):
  params, (loss, grads) = reference
  model = _model(scan_layers=True, remat_policy=policy)
  abstract = jax.eval_shape(lambda r: model.get_initial_variables(r, SHAPES), jax.random.PRNGKey(0))
  kernel = abstract['params']['encoder']['layers']['mlp']['wo']['kernel']
  assert kernel.value.shape == (2, 32, 16) and tuple(kernel.names) == ('layers', 'mlp', 'embed')
  stacked = _stack(params, model.module.config)
  assert jax.tree.structure(stacked) == jax.tree.structure(nn.unbox(abstract)['params'])
  loss_s, grads_s = _loss_and_grads(model, stacked)
  np.testing.assert_allclose(loss_s, loss, rtol=1e-6)
  _assert_trees_close(grads_s, _stack(grads, model.module.config), rtol=1e-5, atol=1e-7)
  _assert_trees_close(t5.unstack_layer_params(stacked['decoder']), params['decoder'])
  enc = {'encoder_input_tokens': BATCH['encoder_input_tokens']}
  np.testing.assert_array_equal(model.predict_batch(stacked, enc, max_decode_length=4),
                                _model().predict_batch(params, enc, max_decode_length=4))


def test_scan_in_the_decoder_only_model():
  config = helpers.tiny_config()
  plain = decoder_only.DecoderOnlyModel(decoder_only.DecoderOnlyTransformer(config), VOCAB, VOCAB,
                                        prefix_lm=True)
  scanned = decoder_only.DecoderOnlyModel(
      decoder_only.DecoderOnlyTransformer(dataclasses.replace(config, scan_layers=True,
                                                              remat_policy='dots_saveable')),
      VOCAB, VOCAB, prefix_lm=True)
  shapes = {'decoder_input_tokens': (3, 5)}
  params = nn.unbox(plain.get_initial_variables(jax.random.PRNGKey(0), shapes))['params']
  stacked = dict(params, decoder=t5.stack_layer_params(params['decoder'], 2))
  batch = dict(BATCH, decoder_causal_attention=jnp.array([[1, 1, 0, 0, 0]] * 3))
  np.testing.assert_allclose(scanned.loss_fn(stacked, batch, None)[0],
                             plain.loss_fn(params, batch, None)[0], rtol=1e-6)
  np.testing.assert_array_equal(scanned.predict_batch(stacked, batch, max_decode_length=3),
                                plain.predict_batch(params, batch, max_decode_length=3))


def test_bf16_activations_with_fp32_params(reference):
  params, (loss, _) = reference
  model = _model(dtype='bfloat16')
  abstract = jax.eval_shape(lambda r: model.get_initial_variables(r, SHAPES), jax.random.PRNGKey(0))
  assert {x.dtype for x in jax.tree.leaves(nn.unbox(abstract))} == {jnp.dtype(jnp.float32)}
  logits16 = model.module.apply({'params': params}, BATCH['encoder_input_tokens'],
                                BATCH['decoder_input_tokens'], enable_dropout=False)
  logits32 = _model().module.apply({'params': params}, BATCH['encoder_input_tokens'],
                                   BATCH['decoder_input_tokens'], enable_dropout=False)
  assert logits16.dtype == jnp.bfloat16
  scale = float(jnp.abs(logits32).max())
  assert float(jnp.abs(logits16.astype(jnp.float32) - logits32).max()) < 0.05 * scale
  loss16, grads16 = _loss_and_grads(model, params)
  assert np.isfinite(float(loss16)) and abs(float(loss16) - float(loss)) < 0.02 * float(loss)
  assert all(g.dtype == jnp.float32 and np.all(np.isfinite(g)) for g in jax.tree.leaves(grads16))
