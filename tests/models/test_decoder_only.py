"""Tests for t2t.models.decoder_only: LM / prefix-LM masks, targets-only loss on seqio's converted
batches, prefill + cached decoding equal to uncached decoding, and the model API's errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
import tensorflow as tf

from t2t.models import decoder_only as do
from t2t.models import decoding
from tests.models import helpers

VOCAB = seqio.PassThroughVocabulary(48)
EXAMPLES = [{'inputs': [5, 6, 7, 8, 1], 'targets': [9, 10, 1]},
            {'inputs': [11, 1], 'targets': [13, 14, 15, 16, 1]},
            {'inputs': [20, 21, 22, 1], 'targets': [23, 1]}]


def _model(prefix_lm, **overrides):
  return do.DecoderOnlyModel(do.DecoderOnlyTransformer(helpers.tiny_config(**overrides)), VOCAB,
                             VOCAB, prefix_lm=prefix_lm)


def _converted(converter, examples=EXAMPLES, lengths=None):
  ds = tf.data.Dataset.from_generator(
      lambda: iter([{k: np.array(v, np.int32) for k, v in ex.items()} for ex in examples]),
      output_signature={'inputs': tf.TensorSpec([None], tf.int32),
                        'targets': tf.TensorSpec([None], tf.int32)})
  rows = list(converter(ds, lengths or {'inputs': 6, 'targets': 6}).as_numpy_iterator())
  return {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0]}


def _params(model, length=12):
  return nn.unbox(jax.jit(lambda r: model.get_initial_variables(
      r, {'decoder_input_tokens': (3, length)}))(jax.random.PRNGKey(0)))['params']


def test_feature_converters_and_param_tree():
  lm, plm = _model(False), _model(True)
  assert lm.feature_converter_cls is seqio.DecoderFeatureConverter
  assert plm.feature_converter_cls is seqio.PrefixLMFeatureConverter
  abstract = jax.eval_shape(lambda r: lm.get_initial_variables(r, {'decoder_input_tokens': (2, 8)}),
                            jax.random.PRNGKey(0))
  specs = nn.get_partition_spec(abstract)['params']
  assert set(specs) == {'token_embedder', 'decoder'}
  assert set(specs['decoder']['layers_0']) == {'pre_self_attention_layer_norm', 'self_attention',
                                               'pre_mlp_layer_norm', 'mlp'}  # no cross-attention
  assert tuple(specs['decoder']['layers_1']['mlp']['wo']['kernel']) == ('mlp', 'embed')


def test_mask_is_causal_plus_visible_prefix():
  causal = jnp.array([[1, 1, 1, 0, 0]])
  lm = np.asarray(do.decoder_only_mask((1, 5)))[0, 0]
  plm = np.asarray(do.decoder_only_mask((1, 5), causal_attention=causal))[0, 0]
  np.testing.assert_array_equal(lm, np.tril(np.ones((5, 5), bool)))
  expected = np.tril(np.ones((5, 5), bool))
  expected[:3, :3] = True
  np.testing.assert_array_equal(plm, expected)
  seg = jnp.array([[1, 1, 2, 2, 0]])
  packed = np.asarray(do.decoder_only_mask((1, 5), seg, jnp.array([[1, 1, 1, 1, 0]])))[0, 0]
  assert packed[0, 1] and not packed[1, 2] and not packed[2, 1] and packed[2, 3]
  assert not packed[4].any()  # padding sees nothing


@pytest.mark.parametrize('prefix_lm', [False, True])
def test_attention_pattern_through_the_model(prefix_lm):
  """Changing a later prefix token moves earlier prefix logits only in the prefix LM; changing a
  target token never moves earlier positions."""
  model = _model(prefix_lm)
  batch = _converted(seqio.PrefixLMFeatureConverter(pack=False))
  params = _params(model)
  logits = lambda b: model._logits(params, b, None)  # pylint: disable=protected-access
  base = logits(batch)
  # Row 0: inputs "5 6 7 8 1" occupy decoder_input positions 1..5; targets start at 6.
  moved_prefix = dict(batch, decoder_input_tokens=batch['decoder_input_tokens'].at[0, 4].set(30))
  delta = np.abs(np.asarray(logits(moved_prefix) - base))[0].max(-1)
  assert (delta[:4].max() > 1e-4) == prefix_lm
  assert delta[4:].max() > 1e-4
  moved_target = dict(batch, decoder_input_tokens=batch['decoder_input_tokens'].at[0, 7].set(30))
  delta = np.abs(np.asarray(logits(moved_target) - base))[0].max(-1)
  assert delta[:7].max() < 1e-6 and delta[7:].max() > 1e-4


def test_loss_is_on_targets_only_and_packing_agrees():
  model = _model(True)
  params = _params(model)
  unpacked = _converted(seqio.PrefixLMFeatureConverter(pack=False))
  np.testing.assert_array_equal(unpacked['decoder_loss_weights'][0],
                                [0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0])
  loss, metrics = model.loss_fn(params, unpacked, None)
  assert float(metrics['num_tokens']) == 3 + 5 + 2
  logp = jax.nn.log_softmax(model._logits(params, unpacked, None))  # pylint: disable=protected-access
  tgt = np.asarray(unpacked['decoder_target_tokens'])
  w = np.asarray(unpacked['decoder_loss_weights'])
  ce = -np.take_along_axis(np.asarray(logp), tgt[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss, (ce * w).sum() / w.sum(), rtol=1e-5)
  packed = _converted(seqio.PrefixLMFeatureConverter(pack=True), lengths={'inputs': 10, 'targets': 10})
  assert packed['decoder_input_tokens'].shape[0] < 3
  loss_p, _ = model.loss_fn(_params(model, 20), packed, None)
  loss_u, _ = model.loss_fn(_params(model, 20), _converted(
      seqio.PrefixLMFeatureConverter(pack=False), lengths={'inputs': 10, 'targets': 10}), None)
  np.testing.assert_allclose(loss_p, loss_u, rtol=1e-5)
  scores = model.score_batch(params, unpacked)
  np.testing.assert_allclose(-np.asarray(scores).sum() / w.sum(), loss, rtol=1e-5)


def _uncached_continuation(model, params, batch, steps):
  """Reference: re-run the whole sequence each step (no cache), appending the arg-max token."""
  tokens = np.asarray(batch['decoder_input_tokens']).copy()
  causal = np.asarray(batch['decoder_causal_attention'])
  n = causal.sum(1)  # positions 0..n-1 are the prompt; position n-1 predicts the first new token
  length = tokens.shape[1] + steps
  out = np.zeros((tokens.shape[0], steps), np.int32)
  for row in range(tokens.shape[0]):
    seq = np.zeros(length, np.int32)
    seq[:n[row]] = tokens[row, :n[row]]
    ca = (np.arange(length) < n[row]).astype(np.int32)
    for t in range(steps):
      b = {'decoder_input_tokens': seq[None], 'decoder_causal_attention': ca[None]}
      nxt = int(np.argmax(model._logits(params, b, None)[0, n[row] - 1 + t]))  # pylint: disable=protected-access
      out[row, t] = nxt
      if nxt == 1:
        break
      seq[n[row] + t] = nxt
  return out


@pytest.fixture(scope='module', params=[False, True], ids=['lm', 'prefix_lm'])
def memorised(request):
  model = _model(request.param)
  batch = _converted(seqio.PrefixLMFeatureConverter(pack=False))
  params, losses = helpers.trained_params(model, _params(model), batch, steps=60,
                                          learning_rate=3e-2)
  assert losses[-1] < 0.1 * losses[0]
  return model, params, batch


def test_cached_prediction_equals_uncached_and_reproduces_targets(memorised):
  model, params, batch = memorised
  predict = jax.jit(model.predict_batch, static_argnames='max_decode_length')
  # Targets stay in the batch: prediction must not read them (only the prompt).
  cached = np.asarray(predict(params, batch, max_decode_length=6))
  blanked = dict(batch, decoder_input_tokens=jnp.where(batch['decoder_causal_attention'] > 0,
                                                       batch['decoder_input_tokens'], 0))
  np.testing.assert_array_equal(np.asarray(predict(params, blanked, max_decode_length=6)), cached)
  np.testing.assert_array_equal(cached, _uncached_continuation(model, params, batch, 6))
  expected = np.zeros((3, 6), np.int32)
  for i, ex in enumerate(EXAMPLES):
    expected[i, :len(ex['targets'])] = ex['targets']
  np.testing.assert_array_equal(cached, expected)


def test_beam_search_with_per_row_prompts(memorised):
  model, params, batch = memorised
  beam = do.DecoderOnlyModel(model.module, VOCAB, VOCAB, prefix_lm=model.prefix_lm,
                             decode_fn=decoding.beam_search)
  out = jax.jit(beam.predict_batch, static_argnames='max_decode_length')(params, batch,
                                                                          max_decode_length=6)
  greedy = model.predict_batch(params, batch, max_decode_length=6)
  np.testing.assert_array_equal(out, greedy)  # a memorised batch: both find the targets


def test_errors():
  model = _model(True)
  params = _params(model)
  batch = _converted(seqio.PrefixLMFeatureConverter(pack=False))
  capped = do.DecoderOnlyModel(model.module, VOCAB, VOCAB, prefix_lm=True, max_decode_length=4)
  with pytest.raises(ValueError, match='max_decode_length 5 exceeds .* limit of 4'):
    capped.predict_batch(params, batch, max_decode_length=5)
  with pytest.raises(ValueError, match='decoder_causal_attention'):
    model.loss_fn(params, {k: v for k, v in batch.items() if k != 'decoder_causal_attention'}, None)
  with pytest.raises(ValueError, match='packed'):
    model.predict_batch(params, dict(batch, decoder_segment_ids=batch['decoder_input_tokens']))
  with pytest.raises(ValueError, match='DecoderOnlyTransformer'):
    do.DecoderOnlyModel(object(), VOCAB, VOCAB)
  with pytest.raises(ValueError, match='num_prompt_tokens .* no encoder'):
    _params(_model(True, num_prompt_tokens=2))
  with pytest.raises(ValueError, match='NUM_EMBEDDINGS'):
    do.DecoderOnlyModel(model.module, seqio.PassThroughVocabulary(100), VOCAB
                        ).get_initial_variables(jax.random.PRNGKey(0), {'decoder_input_tokens': (1, 4)})
