"""Tests for t2t.models.transformer: config checks, shapes, axis names, masking, packing, KV cache."""
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.transformer import Transformer
from tests.models import helpers


def _init(config, batch):
  model = Transformer(config)
  return model, helpers.init_variables(model, batch)


def _logits(model, params, enc, dec, **kw):
  return model.apply({'params': params}, jnp.asarray(enc), jnp.asarray(dec), enable_dropout=False, **kw)


@pytest.fixture(scope='module')
def tied():
  batch = helpers.seq2seq_batch()
  model, variables = _init(helpers.tiny_config(), batch)
  return model, nn.unbox(variables)['params'], variables, batch


@pytest.mark.parametrize('field,value', [('vocab_size', 0), ('d_model', -1), ('num_heads', 2.5),
                                         ('feed_forward_proj', 'swiglu'), ('dropout_rate', 1.0),
                                         ('num_decoder_layers', -1)])
def test_config_rejects_bad_values(field, value):
  with pytest.raises(ValueError, match=field):
    helpers.tiny_config(**{field: value})


def test_config_accepts_dtype_names():
  c = helpers.tiny_config(dtype='bfloat16')
  assert c.dtype == jnp.bfloat16 and c.param_dtype == jnp.float32


def test_shapes_and_every_param_has_logical_axes(tied):
  model, params, variables, batch = tied
  c = model.config
  logits = _logits(model, params, batch['encoder_input_tokens'], batch['decoder_input_tokens'])
  assert logits.shape == (3, 5, c.vocab_size)
  encoded = model.apply({'params': params}, jnp.asarray(batch['encoder_input_tokens']),
                        enable_dropout=False, method=Transformer.encode)
  assert encoded.shape == (3, 7, c.d_model)
  leaves = jax.tree_util.tree_leaves(
      variables, is_leaf=lambda x: isinstance(x, flax.core.meta.AxisMetadata))
  assert leaves and all(isinstance(l, nn.LogicallyPartitioned) for l in leaves)
  for leaf in leaves:
    assert len(leaf.names) == leaf.value.ndim
  names = {n for l in leaves for n in l.names}
  assert names == {'vocab', 'embed', 'mlp', 'heads', 'kv', 'relpos_buckets'}
  # One relative-position table per stack, none per layer or on cross-attention; no biases at all.
  flat = ['/'.join(str(k.key) for k in path) for path, _ in
          jax.tree_util.tree_flatten_with_path(params)[0]]
  assert [p for p in flat if 'relpos' in p] == ['decoder/relpos_bias/rel_embedding',
                                                'encoder/relpos_bias/rel_embedding']
  assert not [p for p in flat if p.endswith('bias')]
  assert params['encoder']['layers_0']['attention']['query']['kernel'].shape == (16, 3, 8)
  assert 'logits_dense' not in params['decoder']


def test_tied_logits_use_scaled_embedding(tied):
  """Zeroing the shared embedding zeroes the logits: the output projection is the embedding."""
  model, params, _, batch = tied
  zeroed = jax.tree_util.tree_map(lambda x: x, params)
  zeroed['token_embedder'] = {'embedding': jnp.zeros_like(params['token_embedder']['embedding'])}
  out = _logits(model, zeroed, batch['encoder_input_tokens'], batch['decoder_input_tokens'])
  assert float(jnp.abs(out).max()) == 0.0


def test_untied_has_logits_dense():
  batch = helpers.seq2seq_batch()
  model, variables = _init(helpers.tiny_config(tie_word_embeddings=False,
                                               feed_forward_proj='gated-gelu'), batch)
  params = nn.unbox(variables)['params']
  assert params['decoder']['logits_dense']['kernel'].shape == (16, 48)
  assert sorted(params['encoder']['layers_0']['mlp']) == ['wi_0', 'wi_1', 'wo']
  out = _logits(model, params, batch['encoder_input_tokens'], batch['decoder_input_tokens'])
  assert out.shape == (3, 5, 48) and bool(jnp.all(jnp.isfinite(out)))


def test_decoder_is_causal(tied):
  model, params, _, batch = tied
  dec = batch['decoder_input_tokens'].copy()
  a = _logits(model, params, batch['encoder_input_tokens'], dec)
  dec[:, 3:] = 7
  b = _logits(model, params, batch['encoder_input_tokens'], dec)
  np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)
  assert not np.allclose(a[:, 3:], b[:, 3:])


def test_encoder_padding_is_ignored(tied):
  """Extra padding on the encoder side, or garbage under a segment id of 0, changes nothing."""
  model, params, _, batch = tied
  enc, dec = batch['encoder_input_tokens'], batch['decoder_input_tokens']
  a = _logits(model, params, enc, dec)
  padded = np.pad(enc, ((0, 0), (0, 4)))
  b = _logits(model, params, padded, dec)
  np.testing.assert_allclose(a, b, atol=1e-5)
  seg = (padded > 0).astype(np.int32)
  garbage = np.where(padded > 0, padded, 9)
  c = _logits(model, params, garbage, dec, encoder_segment_ids=jnp.asarray(seg),
              decoder_segment_ids=jnp.ones(dec.shape, jnp.int32))
  np.testing.assert_allclose(a, c, atol=1e-5)


def test_packed_segments_match_separate_runs(tied):
  model, params, _, _ = tied
  ex_a = (np.array([5, 6, 7, 1]), np.array([0, 11, 12]))
  ex_b = (np.array([8, 9, 1]), np.array([0, 13]))
  enc = np.array([[5, 6, 7, 1, 8, 9, 1, 0]])
  enc_seg = np.array([[1, 1, 1, 1, 2, 2, 2, 0]])
  dec = np.array([[0, 11, 12, 0, 13, 0]])
  dec_seg = np.array([[1, 1, 1, 2, 2, 0]])
  packed = _logits(model, params, enc, dec, encoder_segment_ids=jnp.asarray(enc_seg),
                   decoder_segment_ids=jnp.asarray(dec_seg),
                   encoder_positions=jnp.array([[0, 1, 2, 3, 0, 1, 2, 0]]),
                   decoder_positions=jnp.array([[0, 1, 2, 0, 1, 0]]))
  alone_a = _logits(model, params, ex_a[0][None], ex_a[1][None])
  alone_b = _logits(model, params, ex_b[0][None], ex_b[1][None])
  np.testing.assert_allclose(packed[0, :3], alone_a[0], atol=1e-5)
  np.testing.assert_allclose(packed[0, 3:5], alone_b[0], atol=1e-5)
  with pytest.raises(ValueError, match='segment_ids'):
    _logits(model, params, enc, dec, encoder_segment_ids=jnp.asarray(enc_seg))


def test_dropout_rng_and_determinism():
  batch = helpers.seq2seq_batch()
  model, variables = _init(helpers.tiny_config(dropout_rate=0.3), batch)
  params = nn.unbox(variables)['params']
  args = (jnp.asarray(batch['encoder_input_tokens']), jnp.asarray(batch['decoder_input_tokens']))
  off1 = model.apply({'params': params}, *args, enable_dropout=False)
  off2 = model.apply({'params': params}, *args, enable_dropout=False)
  np.testing.assert_array_equal(off1, off2)
  on = model.apply({'params': params}, *args, rngs={'dropout': jax.random.PRNGKey(5)})
  assert not np.allclose(on, off1)
  with pytest.raises(Exception):
    model.apply({'params': params}, *args, enable_dropout=True)  # no 'dropout' rng given


def _check_cached_steps_match_full_forward(model, params, batch):
  """Feeds the decoder one token at a time through the cache and compares with the full logits;
  returns (encoded, enc, dec, cache) after the last step."""
  enc = jnp.asarray(batch['encoder_input_tokens'])
  dec = jnp.asarray(batch['decoder_input_tokens'])
  full = _logits(model, params, enc, dec)
  encoded = model.apply({'params': params}, enc, enable_dropout=False, method=Transformer.encode)
  _, state = model.apply({'params': params}, encoded, enc, jnp.zeros_like(dec), enable_dropout=False,
                         decode=True, mutable=['cache'], method=Transformer.decode)
  cache = state['cache']
  step = jax.jit(lambda cache, tok: model.apply(
      {'params': params, 'cache': cache}, encoded, enc, tok, enable_dropout=False, decode=True,
      mutable=['cache'], method=Transformer.decode))
  for t in range(dec.shape[1]):
    logits, state = step(cache, dec[:, t:t + 1])
    cache = state['cache']
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5, rtol=1e-5)
  return encoded, enc, dec, cache


def test_kv_cache_steps_match_full_forward(tied):
  """Feeding the decoder one token at a time through the cache reproduces the full logits."""
  model, params, _, batch = tied
  encoded, enc, dec, cache = _check_cached_steps_match_full_forward(model, params, batch)
  with pytest.raises(ValueError, match='one token'):
    model.apply({'params': params, 'cache': cache}, encoded, enc, dec[:, :2], enable_dropout=False,
                decode=True, mutable=['cache'], method=Transformer.decode)


def test_bad_token_inputs_are_rejected(tied):
  model, params, _, batch = tied
  with pytest.raises(ValueError, match='encoder_input_tokens'):
    model.apply({'params': params}, jnp.ones((2, 3, 4), jnp.int32), enable_dropout=False,
                method=Transformer.encode)
  with pytest.raises(ValueError, match='decoder_input_tokens'):
    _logits(model, params, batch['encoder_input_tokens'],
            batch['decoder_input_tokens'].astype(np.float32))


# ----------------------------------------------------------------------------- Table 2 variants
def _count(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def test_shared_encoder_decoder_parameters_and_semantics():
  """The shared variant keeps one set of self-attention/FFN weights per layer pair (P, not 2P):
  the decoder has only its cross-attention; perturbing a shared weight moves both stacks."""
  batch = helpers.seq2seq_batch()
  plain_model, plain = _init(helpers.tiny_config(), batch)
  model, variables = _init(helpers.tiny_config(shared_encoder_decoder=True), batch)
  params = nn.unbox(variables)['params']
  assert set(params['decoder']['layers_0']) == {'pre_cross_attention_layer_norm',
                                                'encoder_decoder_attention'}
  assert set(params['encoder']['layers_0']) == set(nn.unbox(plain)['params']['encoder']['layers_0'])
  dec_layer = nn.unbox(plain)['params']['decoder']['layers_0']
  saved = _count({k: v for k, v in dec_layer.items()
                  if k in ('pre_self_attention_layer_norm', 'self_attention', 'pre_mlp_layer_norm',
                           'mlp')})
  assert _count(nn.unbox(plain)['params']) - _count(params) == 2 * saved
  enc, dec = batch['encoder_input_tokens'], batch['decoder_input_tokens']
  base = _logits(model, params, enc, dec)
  # A decoder that only sees padding-free encoder output still changes when the shared FFN does:
  # feed a fixed `encoded` to isolate the decoder's use of the shared weights.
  encoded = model.apply({'params': params}, jnp.asarray(enc), enable_dropout=False,
                        method=Transformer.encode)
  decode = lambda p: model.apply({'params': p}, encoded, jnp.asarray(enc), jnp.asarray(dec),
                                 enable_dropout=False, method=Transformer.decode)
  bumped = flax.traverse_util.unflatten_dict({
      k: (v * 1.5 if k[:4] == ('encoder', 'layers_1', 'mlp', 'wo') else v)
      for k, v in flax.traverse_util.flatten_dict(params).items()})
  assert not np.allclose(decode(bumped), decode(params))
  assert base.shape == (3, 5, 48)
  with pytest.raises(ValueError, match='num_encoder_layers == num_decoder_layers'):
    helpers.tiny_config(shared_encoder_decoder=True, num_decoder_layers=1)


def test_shared_encoder_decoder_kv_cache_matches_full_forward():
  batch = helpers.seq2seq_batch()
  model, variables = _init(helpers.tiny_config(shared_encoder_decoder=True), batch)
  params = nn.unbox(variables)['params']
  enc, dec = jnp.asarray(batch['encoder_input_tokens']), jnp.asarray(batch['decoder_input_tokens'])
  full = _logits(model, params, enc, dec)
  encoded = model.apply({'params': params}, enc, enable_dropout=False, method=Transformer.encode)
  _, state = model.apply({'params': params}, encoded, enc, jnp.zeros_like(dec), enable_dropout=False,
                         decode=True, mutable=['cache'], method=Transformer.decode)
  cache = state['cache']
  for t in range(dec.shape[1]):
    logits, state = model.apply({'params': params, 'cache': cache}, encoded, enc, dec[:, t:t + 1],
                                enable_dropout=False, decode=True, mutable=['cache'],
                                method=Transformer.decode)
    cache = state['cache']
    np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5, rtol=1e-5)


def test_six_plus_six_is_half_the_layers():
  from t2t.models import transformer  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match='remat_policy'):
    transformer.T5Config(vocab_size=8, remat_policy='some')
  batch = helpers.seq2seq_batch()
  _, full = _init(helpers.tiny_config(num_encoder_layers=2, num_decoder_layers=2), batch)
  _, half = _init(helpers.tiny_config(num_encoder_layers=1, num_decoder_layers=1), batch)
  assert sorted(nn.unbox(half)['params']['decoder']) == ['decoder_norm', 'layers_0', 'relpos_bias']
  layer_params = _count(nn.unbox(full)['params']) - _count(nn.unbox(half)['params'])
  assert layer_params == _count(nn.unbox(half)['params']['encoder']['layers_0']) + _count(
      nn.unbox(half)['params']['decoder']['layers_0'])


def test_bf16_matmuls_keep_the_parameters_and_stay_close_to_float32(tied):
  """T5Config.matmul_dtype='bfloat16': same parameter tree, logits and gradients near float32's."""
  model, params, _, batch = tied
  mixed = Transformer(helpers.tiny_config(matmul_dtype='bfloat16'))
  assert mixed.config.matmul_dtype == jnp.bfloat16
  enc, dec = jnp.asarray(batch['encoder_input_tokens']), jnp.asarray(batch['decoder_input_tokens'])

  def loss(m, p):
    logits = m.apply({'params': p}, enc, dec, enable_dropout=False)
    return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[..., 0])

  l32, g32 = jax.jit(jax.value_and_grad(lambda p: loss(model, p)))(params)
  l16, g16 = jax.jit(jax.value_and_grad(lambda p: loss(mixed, p)))(params)  # float32 params, unchanged
  np.testing.assert_allclose(l16, l32, rtol=1e-2)
  assert jax.tree.structure(g16) == jax.tree.structure(g32)
  # bf16 keeps ~3 significant digits (and flips a few ReLUs): the whole gradient within 5% of
  # float32's in norm, each leaf pointing the same way (cosine >= 0.99).
  flat16 = jnp.concatenate([a.ravel() for a in jax.tree.leaves(g16)])
  flat32 = jnp.concatenate([b.ravel() for b in jax.tree.leaves(g32)])
  assert float(jnp.linalg.norm(flat16 - flat32)) <= 5e-2 * float(jnp.linalg.norm(flat32))
  for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g32)):
    assert a.dtype == jnp.float32
    cosine = jnp.vdot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b) + 1e-30)
    assert float(cosine) >= 0.99


def test_bf16_matmuls_decode_through_the_kv_cache(tied):
  """With bf16 matmuls the cached one-token steps still reproduce the full forward pass."""
  _, params, _, batch = tied
  _check_cached_steps_match_full_forward(
      Transformer(helpers.tiny_config(matmul_dtype='bfloat16')), params, batch)
