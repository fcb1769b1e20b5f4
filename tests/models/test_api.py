"""Tests for t2t.models.api.EncoderDecoderModel: init, loss, prediction, scoring, errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t.models import api, decoding
from t2t.models.transformer import Transformer
from tests.models import helpers

SHAPES = {'encoder_input_tokens': (3, 7), 'decoder_input_tokens': (3, 5)}


def _model(**overrides):
  vocab = seqio.PassThroughVocabulary(48)
  smoothing = overrides.pop('label_smoothing', 0.0)
  return api.EncoderDecoderModel(Transformer(helpers.tiny_config(**overrides)), vocab, vocab,
                                 label_smoothing=smoothing)


@pytest.fixture(scope='module')
def setup():
  model = _model()
  variables = jax.jit(lambda r: model.get_initial_variables(r, SHAPES))(jax.random.PRNGKey(0))
  batch = {k: jnp.asarray(v) for k, v in helpers.seq2seq_batch().items()}
  return model, nn.unbox(variables)['params'], batch


def test_feature_converter_and_attributes():
  model = _model()
  assert model.feature_converter_cls is seqio.EncDecFeatureConverter
  assert model.output_vocabulary.vocab_size == 48


def test_initial_variables_under_eval_shape_are_boxed():
  model = _model()
  abstract = jax.eval_shape(lambda r: model.get_initial_variables(r, SHAPES), jax.random.PRNGKey(0))
  specs = nn.get_partition_spec(abstract)
  assert tuple(specs['params']['token_embedder']['embedding']) == ('vocab', 'embed')
  assert tuple(specs['params']['decoder']['layers_1']['mlp']['wo']['kernel']) == ('mlp', 'embed')
  leaf = abstract['params']['encoder']['encoder_norm']['scale']
  assert isinstance(leaf, nn.LogicallyPartitioned) and leaf.value.shape == (16,)
  packed = dict(SHAPES, encoder_segment_ids=(3, 7), decoder_segment_ids=(3, 5),
                encoder_positions=(3, 7), decoder_positions=(3, 5))
  abstract_packed = jax.eval_shape(lambda r: model.get_initial_variables(r, packed),
                                   jax.random.PRNGKey(0))
  assert jax.tree_util.tree_structure(abstract_packed) == jax.tree_util.tree_structure(abstract)


def test_initial_variables_errors():
  with pytest.raises(ValueError, match='decoder_input_tokens'):
    _model().get_initial_variables(jax.random.PRNGKey(0), {'encoder_input_tokens': (1, 4)})
  big = seqio.PassThroughVocabulary(100)
  model = api.EncoderDecoderModel(Transformer(helpers.tiny_config()), big, big)
  with pytest.raises(ValueError, match='NUM_EMBEDDINGS'):
    model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)
  with pytest.raises(ValueError, match='label_smoothing'):
    _model(label_smoothing=1.0)
  with pytest.raises(ValueError, match='module'):
    api.EncoderDecoderModel('t5', big, big)


def test_loss_is_weighted_token_cross_entropy(setup):
  model, params, batch = setup
  loss, metrics = jax.jit(model.loss_fn)(params, batch, None)
  logits = model.module.apply({'params': params}, batch['encoder_input_tokens'],
                              batch['decoder_input_tokens'], enable_dropout=False)
  logp = jax.nn.log_softmax(logits)
  tgt = np.asarray(batch['decoder_target_tokens'])
  w = np.asarray(batch['decoder_loss_weights'], np.float32)
  ce = -np.take_along_axis(np.asarray(logp), tgt[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss, (ce * w).sum() / w.sum(), rtol=1e-5)
  assert set(metrics) >= {'loss', 'accuracy', 'num_tokens'}
  assert float(metrics['loss']) == float(loss)
  assert float(metrics['num_tokens']) == w.sum()
  acc = ((np.argmax(logits, -1) == tgt) * w).sum() / w.sum()
  np.testing.assert_allclose(metrics['accuracy'], acc, rtol=1e-6)
  # Weights really weight: zeroing one row's weights removes it from the loss.
  w2 = batch['decoder_loss_weights'].at[0].set(0)
  loss2, _ = model.loss_fn(params, dict(batch, decoder_loss_weights=w2), None)
  np.testing.assert_allclose(loss2, (ce * np.asarray(w2)).sum() / np.asarray(w2).sum(), rtol=1e-5)


def test_loss_decreases_and_model_memorises_batch(setup):
  model, params, batch = setup
  trained, losses = helpers.trained_params(model, params, batch, steps=40, learning_rate=3e-2)
  assert losses[-1] < 0.2 * losses[0]
  tokens = jax.jit(model.predict_batch)(trained, batch)  # length from decoder_target_tokens
  np.testing.assert_array_equal(tokens, batch['decoder_target_tokens'])
  scores = jax.jit(model.score_batch)(trained, batch)
  assert scores.shape == (3,) and bool(jnp.all(scores <= 0)) and float(scores.min()) > -1.0


def test_dropout_rng_controls_dropout():
  model = _model(dropout_rate=0.3)
  init = jax.jit(lambda r: model.get_initial_variables(r, SHAPES))
  params = nn.unbox(init(jax.random.PRNGKey(0)))['params']
  batch = {k: jnp.asarray(v) for k, v in helpers.seq2seq_batch().items()}
  loss_fn = jax.jit(model.loss_fn)
  a, _ = loss_fn(params, batch, None)
  b, _ = loss_fn(params, batch, None)
  c, _ = loss_fn(params, batch, jax.random.PRNGKey(1))
  d, _ = loss_fn(params, batch, jax.random.PRNGKey(2))
  assert float(a) == float(b)
  assert float(c) != float(a) and float(c) != float(d)


def test_score_batch_agrees_with_loss(setup):
  model, params, batch = setup
  scores = model.score_batch(params, batch)
  loss, metrics = model.loss_fn(params, batch, None)
  np.testing.assert_allclose(-scores.sum() / metrics['num_tokens'], loss, rtol=1e-5)


def test_label_smoothing():
  logits = jnp.log(jnp.array([[[0.9, 0.05, 0.05]]]))
  loss, correct = api.cross_entropy_with_logits(logits, jnp.array([[0]]), label_smoothing=0.1)
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)  # prediction equals the smoothed target
  assert bool(correct[0, 0])
  worse, _ = api.cross_entropy_with_logits(jnp.log(jnp.array([[[0.5, 0.25, 0.25]]])), jnp.array([[0]]),
                                           label_smoothing=0.1)
  assert float(worse[0, 0]) > 0.05
  plain, _ = api.cross_entropy_with_logits(logits, jnp.array([[1]]))
  np.testing.assert_allclose(plain, -np.log(0.05), rtol=1e-5)


def test_predict_batch_lengths_and_errors(setup):
  model, params, batch = setup
  out = model.predict_batch(params, {'encoder_input_tokens': batch['encoder_input_tokens']},
                            max_decode_length=4)
  assert out.shape == (3, 4) and out.dtype == jnp.int32
  with pytest.raises(ValueError, match='max_decode_length'):
    model.predict_batch(params, {'encoder_input_tokens': batch['encoder_input_tokens']})
  with pytest.raises(ValueError, match='packed'):
    model.predict_batch(params, dict(batch, encoder_segment_ids=batch['encoder_input_tokens'] > 0))
  capped = api.EncoderDecoderModel(model.module, model.input_vocabulary, model.output_vocabulary,
                                   max_decode_length=6)
  assert capped.predict_batch(params, batch, max_decode_length=6).shape == (3, 6)
  # Refused before anything runs: the parameters are not even looked at.
  with pytest.raises(ValueError, match='max_decode_length 7 exceeds .* limit of 6'):
    capped.predict_batch(None, batch, max_decode_length=7)
  with pytest.raises(ValueError, match='positive int'):
    model.predict_batch(None, batch, max_decode_length=0)
  with pytest.raises(ValueError, match='max_decode_length'):
    api.EncoderDecoderModel(model.module, None, None, max_decode_length=-1)
  with pytest.raises(ValueError, match='decoder_target_tokens'):
    model.loss_fn(params, {'encoder_input_tokens': batch['encoder_input_tokens'],
                           'decoder_input_tokens': batch['decoder_input_tokens']}, None)


def _converted(examples, pack):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  ds = tf.data.Dataset.from_generator(
      lambda: iter(examples), output_signature={'inputs': tf.TensorSpec([None], tf.int32),
                                                'targets': tf.TensorSpec([None], tf.int32)})
  converter = seqio.EncDecFeatureConverter(pack=pack)
  ds = converter(ds, {'inputs': 10, 'targets': 7})
  rows = list(ds.as_numpy_iterator())
  return {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0]}


def test_seqio_packed_batch_gives_same_loss_as_unpacked(setup):
  model, params, _ = setup
  examples = [{'inputs': np.array([5, 6, 7, 1], np.int32), 'targets': np.array([9, 8, 1], np.int32)},
              {'inputs': np.array([11, 12, 1], np.int32), 'targets': np.array([13, 1], np.int32)},
              {'inputs': np.array([20, 21, 22, 23, 1], np.int32),
               'targets': np.array([24, 25, 26, 1], np.int32)}]
  packed = _converted(examples, pack=True)
  unpacked = _converted(examples, pack=False)
  assert 'encoder_segment_ids' in packed and packed['encoder_input_tokens'].shape[0] < 3
  loss_p, m_p = model.loss_fn(params, packed, None)
  loss_u, m_u = model.loss_fn(params, unpacked, None)
  assert float(m_p['num_tokens']) == float(m_u['num_tokens']) == 9.0
  np.testing.assert_allclose(loss_p, loss_u, rtol=1e-5)


def test_predict_batch_passes_rng_to_sampling(setup):
  import functools  # pylint: disable=g-import-not-at-top
  from t2t.models import decoding  # pylint: disable=g-import-not-at-top
  model, params, batch = setup
  sampler = api.EncoderDecoderModel(model.module, model.input_vocabulary, model.output_vocabulary,
                                    decode_fn=functools.partial(decoding.temperature_sample,
                                                                temperature=10.0))
  predict = jax.jit(sampler.predict_batch)
  a = predict(params, batch, rng=jax.random.PRNGKey(0))
  b = predict(params, batch, rng=jax.random.PRNGKey(0))
  c = predict(params, batch, rng=jax.random.PRNGKey(1))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)


@pytest.mark.parametrize('matmul_dtype', [None, 'bfloat16'])
def test_initial_cache_equals_the_full_length_decoder_pass(setup, matmul_dtype):
  """predict_batch's cache, filled without running the decoder, is the full pass's where it is read:
  encoder keys/values, encoder mask, index and written slots (self-attention slots are masked).
  With bf16 matmuls the keys/values are stored rounded to bf16 (what every matmul reading them
  rounds to), and the encoder keys/values are projected with bf16 operands, exactly as the full pass does."""
  _, params, batch = setup
  model = _model(matmul_dtype=matmul_dtype)
  module = model.module
  enc = batch['encoder_input_tokens']
  encoded = module.apply({'params': params}, enc, enable_dropout=False, method=Transformer.encode)

  calls = []

  def full_pass(tokens):
    calls.append(tokens)
    return module.apply({'params': params}, encoded, enc, tokens, enable_dropout=False, decode=True,
                        mutable=['cache'], method=Transformer.decode)[1]['cache']

  ours = model._initial_cache(module, params, encoded, enc, 6, full_pass)
  assert len(calls) == 1 and isinstance(calls[0], jax.core.Tracer)  # shapes only: no decoder pass
  reference = full_pass(jnp.zeros((enc.shape[0], 6), jnp.int32))
  assert jax.tree.structure(ours) == jax.tree.structure(reference)
  for path, leaf in jax.tree_util.tree_leaves_with_path(reference):
    names = jax.tree_util.keystr(path)
    mine = ours
    for p in path:
      mine = mine[p.key]
    assert mine.shape == leaf.shape and mine.dtype == leaf.dtype, names
    if names.endswith(("['cached_key']", "['cached_value']")):
      # bf16 values; a CPU keeps the self-attention's in float32 (layers.MultiHeadAttention._for_cache)
      rounded = jnp.float32 if 'self_attention' in names and jax.default_backend() == 'cpu' else jnp.bfloat16
      assert leaf.dtype == (rounded if matmul_dtype else jnp.float32), names
      if matmul_dtype:
        assert np.array_equal(np.asarray(leaf, jnp.bfloat16).astype(np.float32), np.asarray(leaf, np.float32))
    if 'encoder_decoder_attention' in names or 'self_attention' not in names:
      np.testing.assert_allclose(np.asarray(mine, np.float32), np.asarray(leaf, np.float32), rtol=1e-6,
                                 atol=1e-6, err_msg=names)


@pytest.mark.parametrize('matmul_dtype', [None, 'bfloat16'])
def test_beam_search_shares_the_encoder_side_across_beams(matmul_dtype):
  """predict_batch keeps the encoder keys/values and validity out of the cache the decoding
  strategy carries (`split_encoder_side`), so beam search neither repeats nor reorders them; the
  beams of a row attend to its one copy and decode exactly what they decode with the encoder side
  repeated per beam like every other cache leaf."""
  model = _model(matmul_dtype=matmul_dtype)
  variables = jax.jit(lambda r: model.get_initial_variables(r, SHAPES))(jax.random.PRNGKey(1))
  params = nn.unbox(variables)['params']
  enc = helpers.seq2seq_batch()['encoder_input_tokens']
  length, beams = 5, 3
  seen = {}

  def recording_beam_search(tokens_to_logits, cache, batch_size, max_decode_length, *, rng=None):
    seen['paths'] = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(cache)]
    seqs, seen['scores'] = decoding.beam_search_with_scores(
        tokens_to_logits, cache, batch_size, max_decode_length, beam_size=beams)
    return seqs

  shared = api.EncoderDecoderModel(model.module, model.input_vocabulary, model.output_vocabulary,
                                   decode_fn=recording_beam_search)
  seqs = shared.predict_batch(params, {'encoder_input_tokens': enc}, max_decode_length=length)
  assert seen['paths'] and not [p for p in seen['paths']
                                if 'encoder_valid' in p or 'encoder_decoder_attention' in p]

  # The reference: every cache leaf, the encoder side included, repeated per beam.
  module = model.module
  encoded = module.apply({'params': params}, enc, enable_dropout=False, method=Transformer.encode)

  def run_decoder(tokens, cache):
    logits, new_vars = module.apply({'params': params, **({} if cache is None else {'cache': cache})},
                                    encoded, enc, tokens, enable_dropout=False, decode=True,
                                    mutable=['cache'], method=Transformer.decode)
    return logits, new_vars['cache']

  full = model._initial_cache(module, params, encoded, enc, length,
                              lambda tokens: run_decoder(tokens, None)[1])
  ref_seqs, ref_scores = decoding.beam_search_with_scores(
      lambda tokens, cache: (lambda lc: (lc[0][:, -1, :], lc[1]))(run_decoder(tokens, cache)),
      full, enc.shape[0], length, beam_size=beams)
  np.testing.assert_array_equal(seqs, ref_seqs)
  np.testing.assert_allclose(seen['scores'], ref_scores, rtol=1e-5, atol=1e-5)


def test_argmax_matches_is_jnp_argmax_on_ties_nans_and_infinities():
  """api.argmax_matches (max, then a min over index + vocab * sign(max - logit)) says what
  `jnp.argmax(logits, -1) == targets` says: the first of tied maxima, the first NaN, and index 0
  of a row of -inf (those last rows through decoding.first_argmax)."""
  rows = jnp.array([[1.0, 3.0, 3.0, 2.0],               # tie: the first, 1
                    [0.0, 0.0, 0.0, 0.0],                # all tied: 0
                    [-2.0, -jnp.inf, -1.0, -1.5]])      # finite maximum beside -inf: 2
  for target in range(4):
    targets = jnp.full((3,), target)
    np.testing.assert_array_equal(jax.jit(api.argmax_matches)(rows, targets),
                                  jnp.argmax(rows, -1) == targets)
  odd = jnp.array([[jnp.nan, 5.0, jnp.nan, 9.0], [1.0, 2.0, jnp.nan, 9.0], [-jnp.inf] * 4,
                   [-jnp.inf, -1.0, jnp.inf, jnp.inf]])   # argmax: 0, 2, 0, 2
  for target in range(4):
    targets = jnp.full((4,), target)
    np.testing.assert_array_equal(jax.jit(api.argmax_matches)(odd, targets),
                                  jnp.array([0, 2, 0, 2]) == target)
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 32128))
  logits = logits.at[:, :4, 7].set(logits.max())   # ties with the maximum further on
  targets = jnp.argmax(logits, -1).at[:, ::2].add(1)   # half right, half off by one
  got = jax.jit(api.argmax_matches)(logits, targets)
  np.testing.assert_array_equal(got, jnp.argmax(logits, -1) == targets)
  assert 0 < int(got.sum()) < got.size


def test_the_accuracy_test_traces_under_grad():
  """The loss is differentiated with `correct` beside it: the test traces under jax.grad and
  passes no gradient to the logits (they enter the product below only as x[..., 0])."""
  logits = jax.random.normal(jax.random.PRNGKey(1), (2, 3, 5))
  targets = jnp.argmax(logits, -1).at[0].set(4)

  def f(x):
    return jnp.sum(api.cross_entropy_with_logits(x, targets)[1] * x[..., 0])
  grad = jax.jit(jax.grad(f))(logits)
  np.testing.assert_array_equal(grad[..., 0], jnp.argmax(logits, -1) == targets)
  np.testing.assert_array_equal(grad[..., 1:], 0.0)
