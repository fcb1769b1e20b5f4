"""Tests for t2t.models.layers: buckets, norm, dense, embedding, attention, masks, MLP (dropout:
test_dropout.py)."""
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import layers


def _boxed_names(variables):
  """{path: axis names} for every LogicallyPartitioned leaf."""
  leaves = jax.tree_util.tree_flatten_with_path(
      variables, is_leaf=lambda x: isinstance(x, flax.core.meta.AxisMetadata))[0]
  return {jax.tree_util.keystr(p): getattr(v, 'names', None) for p, v in leaves}


@pytest.mark.parametrize('offset,bucket', [
    (0, 0), (-1, 1), (-7, 7), (1, 17), (7, 23),       # exact buckets, 8 per direction
    (-8, 8), (-12, 9), (-20, 10), (-50, 13), (-100, 15),  # log-spaced: 8 + int(log(|d|/8)/log(16)*8)
    (-128, 15), (-1000, 15), (1000, 31), (20, 26),    # everything at/after max_distance shares a bucket
])
def test_bidirectional_buckets(offset, bucket):
  got = layers.relative_position_bucket(np.array([offset]), bidirectional=True)
  assert int(got[0]) == bucket


@pytest.mark.parametrize('offset,bucket', [
    (5, 0), (0, 0), (-5, 5), (-15, 15),                # future -> 0; 16 exact buckets
    (-16, 16), (-20, 17), (-40, 23), (-127, 31), (-500, 31),  # 16 + int(log(|d|/16)/log(8)*16)
])
def test_causal_buckets(offset, bucket):
  got = layers.relative_position_bucket(np.array([offset]), bidirectional=False)
  assert int(got[0]) == bucket


def test_buckets_cover_range_monotonically():
  rp = np.arange(-300, 1)
  b = layers.relative_position_bucket(rp, bidirectional=False)
  assert b.min() == 0 and b.max() == 31
  assert np.all(np.diff(b[::-1]) >= 0)  # farther back -> same or larger bucket
  assert len(np.unique(b)) == 32


def test_rms_norm_matches_formula_and_has_no_mean_or_bias():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8)) + 3.0
  norm = layers.RMSNorm(epsilon=1e-6)
  variables = norm.init(jax.random.PRNGKey(1), x)
  assert list(nn.unbox(variables)['params']) == ['scale']
  assert _boxed_names(variables) == {"['params']['scale']": ('embed',)}
  params = {'scale': jnp.arange(8.0)}
  y = norm.apply({'params': params}, x)
  expected = x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + 1e-6) * np.arange(8.0)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_dense_general_shapes_axes_and_values():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 6))
  proj = layers.DenseGeneral(features=(3, 4), kernel_axes=('embed', 'heads', 'kv'))
  variables = proj.init(jax.random.PRNGKey(1), x)
  assert _boxed_names(variables) == {"['params']['kernel']": ('embed', 'heads', 'kv')}
  kernel = nn.unbox(variables)['params']['kernel']
  y = proj.apply(variables, x)
  assert y.shape == (2, 5, 3, 4)
  np.testing.assert_allclose(y, np.einsum('bld,dhk->blhk', x, kernel), rtol=1e-5, atol=1e-5)
  back = layers.DenseGeneral(features=6, axis=(-2, -1), kernel_axes=('heads', 'kv', 'embed'))
  out = back.apply(back.init(jax.random.PRNGKey(2), y), y)
  assert out.shape == (2, 5, 6)
  with pytest.raises(ValueError, match='kernel_axes'):
    layers.DenseGeneral(features=4, kernel_axes=('embed',)).init(jax.random.PRNGKey(0), x)


def test_embed_lookup_and_attend():
  emb = layers.Embed(num_embeddings=10, features=4)
  tokens = jnp.array([[1, 2, 9]])
  variables = emb.init(jax.random.PRNGKey(0), tokens)
  assert _boxed_names(variables) == {"['params']['embedding']": ('vocab', 'embed')}
  table = nn.unbox(variables)['params']['embedding']
  np.testing.assert_array_equal(emb.apply(variables, tokens), table[tokens])
  q = jnp.ones((1, 2, 4))
  logits = emb.apply(variables, q, method=layers.Embed.attend)
  np.testing.assert_allclose(logits, q @ table.T, rtol=1e-6)
  with pytest.raises(ValueError, match='integer'):
    emb.apply(variables, jnp.ones((1, 2)))


def test_relative_position_bias_lookup_and_query_offset():
  rpb = layers.RelativePositionBias(num_buckets=32, max_distance=128, num_heads=2, bidirectional=False)
  variables = rpb.init(jax.random.PRNGKey(0), 4, 6)
  assert _boxed_names(variables) == {"['params']['rel_embedding']": ('heads', 'relpos_buckets')}
  table = nn.unbox(variables)['params']['rel_embedding']
  bias = rpb.apply(variables, 4, 6)
  assert bias.shape == (1, 2, 4, 6)
  # query 3, key 1: offset -2 -> bucket 2 (causal); query 0, key 5: future -> bucket 0
  np.testing.assert_allclose(bias[0, :, 3, 1], table[:, 2])
  np.testing.assert_allclose(bias[0, :, 0, 5], table[:, 0])
  # A single query at a traced offset equals the matching row of the full bias.
  full = rpb.apply(variables, 6, 6)
  step = jax.jit(lambda i: rpb.apply(variables, 1, 6, query_offset=i))
  for i in range(6):
    np.testing.assert_allclose(step(jnp.int32(i))[0, :, 0], full[0, :, i])


def test_make_attention_mask_padding_segments_causal():
  valid = jnp.array([[True, True, True, False]])
  seg = jnp.array([[1, 1, 2, 0]])
  mask = layers.make_attention_mask(valid, valid, seg, seg, causal=True)[0, 0]
  expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]], bool)
  np.testing.assert_array_equal(mask, expected)
  bias = layers.mask_to_bias(mask)
  assert bias.dtype == jnp.float32 and float(bias[0, 1]) == layers.NEG_INF and float(bias[0, 0]) == 0


def test_attention_logits_are_not_scaled():
  """With identity-like projections, weights equal softmax(q.k) with no 1/sqrt(d_kv) factor."""
  d, h, dk = 4, 1, 4
  attn = layers.MultiHeadAttention(num_heads=h, d_kv=dk)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 3, d))
  variables = nn.unbox(attn.init(jax.random.PRNGKey(1), x, x, None, enable_dropout=False))
  eye = jnp.eye(d).reshape(d, h, dk)
  params = {'query': {'kernel': eye}, 'key': {'kernel': eye}, 'value': {'kernel': eye},
            'out': {'kernel': jnp.eye(d).reshape(h, dk, d)}}
  del variables
  out = attn.apply({'params': params}, x, x, None, enable_dropout=False)
  w = jax.nn.softmax(np.einsum('qd,kd->qk', x[0], x[0]), axis=-1)
  np.testing.assert_allclose(out[0], w @ x[0], rtol=1e-5, atol=1e-6)


def test_attention_mask_blocks_keys():
  attn = layers.MultiHeadAttention(num_heads=2, d_kv=3)
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 4, 5))
  variables = nn.unbox(attn.init(jax.random.PRNGKey(1), x, x, None, enable_dropout=False))
  key_valid = jnp.array([[True, True, False, False]])
  bias = layers.mask_to_bias(layers.make_attention_mask(jnp.ones((1, 4), bool), key_valid))
  out = attn.apply(variables, x, x, bias, enable_dropout=False)
  x2 = x.at[:, 2:].set(100.0)  # masked keys may hold anything
  out2 = attn.apply(variables, x, x2, bias, enable_dropout=False)
  np.testing.assert_allclose(out, out2, rtol=1e-5, atol=1e-5)



def test_encoder_cache_entry_stores_keys_and_values_transposed_in_the_matmul_dtype():
  x = jnp.arange(2 * 5 * 3 * 4, dtype=jnp.float32).reshape(2, 5, 3, 4) / 7   # [b, k, heads, kv]
  key = layers.encoder_cache_entry('cached_key', x, jnp.bfloat16)
  value = layers.encoder_cache_entry('cached_value', x, None)
  assert key.shape == (2, 3, 4, 5) and key.dtype == jnp.bfloat16
  assert value.shape == (2, 3, 5, 4) and value.dtype == jnp.float32
  np.testing.assert_array_equal(key[1, 2, 3, 4], x[1, 4, 2, 3].astype(jnp.bfloat16))
  np.testing.assert_array_equal(value[1, 2, 4, 3], x[1, 4, 2, 3])
  with pytest.raises(ValueError, match="'cache_index'"):
    layers.encoder_cache_entry('cache_index', x, None)


def _attention_with_caches(matmul_dtype, q_len, k_len):
  """(uncached outputs [b, q_len, d], outputs of decode steps over both caches, one query each)."""
  rng = np.random.default_rng(3)
  b, d = 2, 16
  xq = jnp.asarray(rng.normal(size=(b, q_len, d)), jnp.float32)
  xk = jnp.asarray(rng.normal(size=(b, k_len, d)), jnp.float32)
  attn = layers.MultiHeadAttention(num_heads=2, d_kv=8, matmul_dtype=matmul_dtype)
  params = nn.unbox(attn.init(jax.random.PRNGKey(0), xq, xk, None))['params']
  causal = layers.mask_to_bias(jnp.tril(jnp.ones((q_len, q_len), bool))[None, None])
  full_self = attn.apply({'params': params}, xq, xq, causal, enable_dropout=False)
  full_cross = attn.apply({'params': params}, xq, xk, None, enable_dropout=False)

  # Self-attention: the sizing call writes the cache, then one token per call.
  _, cache = attn.apply({'params': params}, jnp.zeros_like(xq), jnp.zeros_like(xq), None,
                        enable_dropout=False, decode=True, mutable=['cache'])
  cache = jax.tree.map(jnp.zeros_like, cache)
  steps_self, steps_cross = [], []
  for t in range(q_len):
    written = layers.mask_to_bias((jnp.arange(q_len) <= t)[None, None, None, :])
    out, cache = attn.apply({'params': params, **cache}, xq[:, t:t + 1], xq[:, t:t + 1], written,
                            enable_dropout=False, decode=True, mutable=['cache'])
    steps_self.append(out)
  cross = {}
  for t in range(q_len):
    out, cross = attn.apply({'params': params, **cross}, xq[:, t:t + 1], xk, None,
                            enable_dropout=False, decode=True, cross_cache=True, mutable=['cache'])
    steps_cross.append(out)
  assert cross['cache']['cached_key'].shape == (b, 2, 8, k_len)
  assert cross['cache']['cached_value'].shape == (b, 2, k_len, 8)
  return (full_self, jnp.concatenate(steps_self, 1)), (full_cross, jnp.concatenate(steps_cross, 1))


@pytest.mark.parametrize('matmul_dtype', [None, jnp.bfloat16])
def test_decode_steps_over_the_caches_give_the_uncached_attention(matmul_dtype):
  """One query at a time over the self-attention cache and over the transposed encoder cache
  (`encoder_cache_entry`, the duplicated query row of `_query_rows_for_cpu_dot`) equals attention
  over the whole sequence at once."""
  (full_self, steps_self), (full_cross, steps_cross) = _attention_with_caches(matmul_dtype, 5, 9)
  tol = 1e-5 if matmul_dtype is None else 2e-2
  np.testing.assert_allclose(steps_self, full_self, rtol=tol, atol=tol)
  np.testing.assert_allclose(steps_cross, full_cross, rtol=tol, atol=tol)


def test_a_bf16_decode_step_reads_the_encoder_cache_without_converting_it():
  """XLA:CPU converts a bf16 dot's operands to float32 when one of them is a single row; the
  decode step's two rows keep the cached keys/values in bf16 (no float32 array of their size)."""
  b, heads, d_kv, k_len, d = 2, 4, 64, 256, 128
  attn = layers.MultiHeadAttention(num_heads=heads, d_kv=d_kv, matmul_dtype=jnp.bfloat16)
  xq = jnp.ones((b, 1, d), jnp.float32)
  xk = jnp.ones((b, k_len, d), jnp.float32)
  params = nn.unbox(attn.init(jax.random.PRNGKey(0), xq, xk, None))['params']
  _, cache = attn.apply({'params': params}, xq, xk, None, enable_dropout=False, decode=True,
                        cross_cache=True, mutable=['cache'])

  def step(params, cache, xq):
    return attn.apply({'params': params, **cache}, xq, xk, None, enable_dropout=False,
                      decode=True, cross_cache=True)

  hlo = jax.jit(step).lower(params, cache, xq).compile().as_text()
  assert f'bf16[{b},{heads},{d_kv},{k_len}]' in hlo
  for shape in ((b, heads, d_kv, k_len), (b, heads, k_len, d_kv), (b, k_len, heads, d_kv)):
    assert f'f32[{",".join(map(str, shape))}]' not in hlo, shape

def test_the_self_attention_cache_is_heads_first_and_a_decode_step_copies_none_of_it():
  """The self-attention cache is [b, heads, length, kv] holding the bf16-rounded keys/values (in
  float32 on a CPU, where XLA:CPU's one-row matmuls take float32 operands anyway), so a compiled
  bf16 decode step writes its one position in place: before, it converted (and transposed) both
  whole caches every step, temporaries of twice a float32 cache."""
  b, heads, d_kv, length, d = 2, 4, 64, 256, 128
  attn = layers.MultiHeadAttention(num_heads=heads, d_kv=d_kv, matmul_dtype=jnp.bfloat16)
  x = jax.random.normal(jax.random.PRNGKey(1), (b, length, d))
  params = nn.unbox(attn.init(jax.random.PRNGKey(0), x, x, None))['params']
  _, cache = attn.apply({'params': params}, x, x, None, enable_dropout=False, decode=True,
                        mutable=['cache'])
  key = cache['cache']['cached_key']
  assert key.shape == (b, heads, length, d_kv)
  assert key.dtype == (jnp.float32 if jax.default_backend() == 'cpu' else jnp.bfloat16)
  kernel = params['key']['kernel'].astype(jnp.bfloat16)   # [d, heads, kv]
  projected = jnp.einsum('bld,dhk->bhlk', x.astype(jnp.bfloat16), kernel,
                         preferred_element_type=jnp.float32)
  stored = np.asarray(key, np.float32)
  np.testing.assert_array_equal(np.asarray(key.astype(jnp.bfloat16), np.float32), stored)  # rounded
  np.testing.assert_allclose(stored, np.asarray(projected, np.float32), rtol=1e-2, atol=1e-2)

  def step(params, cache, xq):
    return attn.apply({'params': params, **cache}, xq, xq, None, enable_dropout=False,
                      decode=True, mutable=['cache'])

  compiled = jax.jit(step, donate_argnums=1).lower(params, cache, x[:, :1]).compile()
  assert compiled.memory_analysis().temp_size_in_bytes < key.size * 4


@pytest.mark.parametrize('activations,names', [(('relu',), ['wi', 'wo']),
                                               (('gelu', 'linear'), ['wi_0', 'wi_1', 'wo'])])
def test_mlp_block(activations, names):
  mlp = layers.MlpBlock(d_ff=8, activations=activations)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 4))
  variables = mlp.init(jax.random.PRNGKey(1), x, enable_dropout=False)
  p = nn.unbox(variables)['params']
  assert sorted(p) == names
  assert _boxed_names(variables)["['params']['wo']['kernel']"] == ('mlp', 'embed')
  y = mlp.apply(variables, x, enable_dropout=False)
  if activations == ('relu',):
    expected = np.maximum(x @ p['wi']['kernel'], 0) @ p['wo']['kernel']
  else:
    h0 = x @ p['wi_0']['kernel']
    gelu_tanh = 0.5 * h0 * (1 + np.tanh(np.sqrt(2 / np.pi) * (h0 + 0.044715 * h0 ** 3)))
    expected = (gelu_tanh * (x @ p['wi_1']['kernel'])) @ p['wo']['kernel']
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match='unknown activation'):
    layers.MlpBlock(d_ff=8, activations=('swish',)).init(jax.random.PRNGKey(0), x)


def test_mlp_dropout_needs_rng_and_changes_output():
  mlp = layers.MlpBlock(d_ff=64, dropout_rate=0.5)
  x = jnp.ones((1, 2, 4))
  variables = mlp.init(jax.random.PRNGKey(1), x, enable_dropout=False)
  a = mlp.apply(variables, x, enable_dropout=True, rngs={'dropout': jax.random.PRNGKey(0)})
  b = mlp.apply(variables, x, enable_dropout=False)
  assert not np.allclose(a, b)


@pytest.mark.parametrize('q_len,k_len', [(7, 7), (5, 9)])
def test_attention_with_bf16_matmuls_runs_forward_and_backward_close_to_float32(q_len, k_len):
  """Every einsum of attention, forward and both backward ones, on XLA's CPU bf16 dot (some operand
  orders are refused at run time there: `_einsum_f32` orders them)."""
  rng = np.random.default_rng(0)
  xq = jnp.asarray(rng.normal(size=(2, q_len, 16)), jnp.float32)
  xk = jnp.asarray(rng.normal(size=(2, k_len, 16)), jnp.float32)
  results = {}
  for md in (None, jnp.bfloat16):
    attn = layers.MultiHeadAttention(num_heads=2, d_kv=8, matmul_dtype=md,
                                     q_init=nn.initializers.normal(0.3),
                                     kv_init=nn.initializers.normal(0.3),
                                     out_init=nn.initializers.normal(0.3))
    params = nn.unbox(attn.init(jax.random.PRNGKey(0), xq, xk, None))['params']
    loss = lambda p, xq, xk: jnp.sum(jnp.sin(attn.apply({'params': p}, xq, xk, None,
                                                        enable_dropout=False)))
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(params, xq, xk)
    results[md] = (value, grads)
  (v32, g32), (v16, g16) = results[None], results[jnp.bfloat16]
  assert jax.tree.all(jax.tree.map(lambda g: g.dtype == jnp.float32, g16))
  np.testing.assert_allclose(v16, v32, rtol=2e-2, atol=2e-2)
  for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g32)):
    assert np.all(np.isfinite(a))
    assert float(jnp.linalg.norm(a - b)) <= 3e-2 * float(jnp.linalg.norm(b)) + 1e-6


def test_dense_and_embed_attend_with_bf16_matmuls_match_rounded_float32():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(2, 3, 4, 5)), jnp.float32)
  dense = layers.DenseGeneral(features=6, axis=(-2, -1), kernel_axes=('heads', 'kv', 'embed'),
                              matmul_dtype=jnp.bfloat16)
  params = nn.unbox(dense.init(jax.random.PRNGKey(0), x))['params']
  rounded = lambda t: jnp.asarray(jnp.asarray(t, jnp.bfloat16), jnp.float32)
  want = jnp.einsum('abcd,cde->abe', rounded(x), rounded(params['kernel']))
  got = dense.apply({'params': params}, x)
  assert got.shape == (2, 3, 6) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  embed = layers.Embed(num_embeddings=11, features=5, matmul_dtype=jnp.bfloat16)
  q = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
  eparams = nn.unbox(embed.init(jax.random.PRNGKey(1), jnp.zeros((1, 1), jnp.int32)))['params']
  np.testing.assert_allclose(embed.apply({'params': eparams}, q, method=layers.Embed.attend),
                             jnp.einsum('abd,vd->abv', rounded(q), rounded(eparams['embedding'])),
                             rtol=1e-6, atol=1e-6)


def test_add_mask_bias_is_the_sum_and_its_gradient_sums_over_the_batch():
  """Forward: position bias + mask_to_bias(mask); backward: the position bias's gradient is the
  logits' gradient summed over the batch (here by hand: ct = 1 everywhere -> b), the same as
  `+`'s to float32 rounding."""
  rng = np.random.default_rng(0)
  position = jnp.asarray(rng.normal(size=(1, 3, 5, 6)), jnp.float32)
  mask = jnp.asarray(rng.random((4, 1, 5, 6)) > 0.3)
  out = layers.add_mask_bias(position, mask)
  np.testing.assert_array_equal(np.asarray(out),
                                np.asarray(position + layers.mask_to_bias(mask)))
  d_ones = jax.grad(lambda p: jnp.sum(layers.add_mask_bias(p, mask)))(position)
  np.testing.assert_array_equal(np.asarray(d_ones), np.full((1, 3, 5, 6), 4.0))
  ct = jnp.asarray(rng.normal(size=(4, 3, 5, 6)), jnp.float32)
  got = jax.grad(lambda p: jnp.sum(layers.add_mask_bias(p, mask) * ct))(position)
  want = jax.grad(lambda p: jnp.sum((p + layers.mask_to_bias(mask)) * ct))(position)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


def test_add_mask_bias_with_per_row_positions_is_a_plain_sum():
  position = jnp.ones((2, 3, 1, 4), jnp.float32)   # per-row query offsets (decoding)
  mask = jnp.ones((2, 1, 1, 4), bool).at[1, 0, 0, 3].set(False)
  out = layers.add_mask_bias(position, mask)
  assert out.shape == (2, 3, 1, 4)
  assert float(out[0, 0, 0, 3]) == 1.0 and float(out[1, 0, 0, 3]) < -1e8
