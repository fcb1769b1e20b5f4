"""Tests for the float32 kernels of t2t.models.small_dots (`F32`, small_dots_f32.cc): the NT
product against XLA's dot, the transpose XLA hoists out of a decoding loop, the fused
encoder-decoder attention and the whole-sequence attention against the unfused ones, and a
float32 T5 decoding the same tokens with them as without (greedy and beam search)."""
import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t import cpu
from t2t.models import decoding, layers, matmuls, small_dots, train_attention
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from tests.models import helpers

# The kernels need an x86 CPU with AVX2 and FMA and a C++ compiler; where both exist they must
# build and run (a failed build fails these tests rather than skipping them).
_REASON = small_dots.unavailable_reason(small_dots.F32)
needs_kernel = pytest.mark.skipif(_REASON is not None and 'T2T_SMALL_DOTS=0' not in _REASON,
                                  reason=f'float32 small-dots kernel unavailable: {_REASON}')


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  """The AVX2 NT kernels, also where the panels' libraries (`F32_AVX512`, `F32_PANELS_AVX2`,
  tests/models/test_small_dots_f32_avx512.py) would otherwise take the products and the
  encoder-decoder attention."""
  monkeypatch.delenv(small_dots.SWITCH, raising=False)
  monkeypatch.setenv(small_dots.F32_AVX512.switch, '0')
  monkeypatch.setenv(small_dots.F32_PANELS_AVX2.switch, '0')


def _operands(seed, a_shape, b_shape):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=a_shape), jnp.float32),
          jnp.asarray(rng.normal(size=b_shape) * 0.1, jnp.float32))


def _reused_dot(spec):
  def fn(a, b):
    with small_dots.weights_reused():
      return small_dots.dot(spec, a, b)
  return fn


@needs_kernel
def test_kernel_builds_and_reports_enabled():
  assert small_dots.status()['f32'] == {'enabled': True, 'reason': None}


def test_kernel_needs_avx2_and_fma(monkeypatch):
  monkeypatch.setattr(cpu, 'flags', lambda: frozenset({'avx', 'avx2'}))
  assert 'fma' in small_dots.unavailable_reason(small_dots.F32)
  with small_dots.weights_reused():
    assert small_dots.dot('mk,nk->mn', *_operands(0, (8, 64), (32, 64))) is None


@needs_kernel
@pytest.mark.parametrize('spec,a_shape,b_shape', [
    ('abc,cd->abd', (8, 1, 512), (512, 2048)),     # FFN input, one token of a batch of 8
    ('abc,cd->abd', (8, 1, 2048), (2048, 512)),    # FFN output
    ('abc,cd->abd', (1, 1, 64), (64, 12)),         # one row
    ('abc,cde->abde', (8, 1, 64), (64, 2, 32)),    # query projection into heads
    ('abcd,cde->abe', (8, 1, 2, 32), (2, 32, 64)), # attention output over (heads, kv)
    ('ab,bc->ac', (64, 24), (24, 36)),             # MAX_ROWS rows; K of 24
    ('abc,zc->abz', (8, 1, 512), (4004, 512)),     # tied logits against [vocab, embed]
    ('abc,zc->abz', (4, 8, 64), (12, 64)),         # beam search: 32 rows
    ('ab,zb->az', (7, 8), (8, 8)),                 # 7 rows: a tile of 4 and one of 3
])
def test_kernel_matches_xla_dot(spec, a_shape, b_shape):
  a, b = _operands(0, a_shape, b_shape)
  fn = _reused_dot(spec)
  text = jax.jit(fn).lower(a, b).as_text()
  assert 't2t_f32_nt' in text
  a_spec, b_spec = spec.split('->')[0].split(',')
  weight_leads = b_spec.startswith(''.join(c for c in a_spec if c in b_spec))   # [K, N]
  assert ('t2t_f32_transpose' in text) == weight_leads
  got = jax.jit(fn)(a, b)
  want = jnp.einsum(spec, a, b, precision='highest')
  assert got.shape == want.shape and got.dtype == jnp.float32
  # float32 accumulation in another order: agreement to a few float32 ulps of the largest entry.
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=2e-6 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize('spec,a_shape,b_shape,reused,why', [
    ('ab,bc->ac', (8, 32), (32, 32), False, 'float32 outside weights_reused'),
    ('ab,bc->ac', (65, 32), (32, 32), True, 'more rows than MAX_ROWS'),
    ('ab,bc->ac', (8, 36), (36, 32), True, 'K not a multiple of 8'),
    ('ab,cb->ac', (8, 32), (6, 32), True, 'N not a multiple of 4'),
    ('bqd,bkd->bqk', (2, 1, 32), (2, 64, 32), True, 'a batch index (attention)'),
])
def test_kernel_declines_what_it_does_not_handle(spec, a_shape, b_shape, reused, why):
  a, b = _operands(1, a_shape, b_shape)
  fn = _reused_dot(spec) if reused else functools.partial(small_dots.dot, spec)
  assert fn(a, b) is None, why


@needs_kernel
def test_matmul_routes_a_decoding_steps_products_and_keeps_their_gradients():
  spec = 'abc,cd->abd'
  a, w = _operands(2, (4, 2, 64), (64, 96))
  plain = lambda a, w: matmuls.matmul(spec, a, w, jnp.float32)
  assert 't2t_f32' not in jax.jit(plain).lower(a, w).as_text()   # outside a decoding step

  def reused(a, w):
    with small_dots.weights_reused():
      return plain(a, w)
  assert 't2t_f32_nt' in jax.jit(reused).lower(a, w).as_text()
  loss = lambda f: jax.jit(jax.value_and_grad(lambda a, w: jnp.sum(jnp.sin(f(a, w))), (0, 1)))
  for x, y in zip(jax.tree.leaves(loss(reused)(a, w)), jax.tree.leaves(loss(plain)(a, w))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_weights_are_transposed_once_before_the_loop():
  """XLA does not hoist a transpose alone out of a while loop; the kernel's transpose (a custom
  call) is hoisted, so the loop's body reads W^T as made once before it."""
  w = _operands(4, (1, 1), (64, 96))[1]

  def loop(x, w):
    def body(i, x):
      with small_dots.weights_reused():
        return jnp.tanh(small_dots.dot('mk,kn->mn', x, w))[:, :64]
    return jax.lax.fori_loop(0, 5, body, x)

  x = jnp.asarray(np.random.default_rng(4).normal(size=(8, 64)), jnp.float32)
  compiled = jax.jit(loop).lower(x, w).compile().as_text()
  body_name = re.search(r'body=(%[\w.\-]+)', compiled).group(1)
  body = re.search(re.escape(body_name) + r' .*?\n}', compiled, re.S).group(0)
  assert 't2t_f32_nt' in body
  assert 't2t_f32_transpose' not in body and 'transpose' not in body
  assert 't2t_f32_transpose' in compiled
  want = jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(x @ w)[:, :64], x)
  np.testing.assert_allclose(np.asarray(jax.jit(loop)(x, w)), np.asarray(want), atol=1e-5)


def _reference_cross_attention(query, key, value, bias):
  """The unfused float32 computation of MultiHeadAttention's cached cross-attention."""
  logits = jnp.einsum('bhqd,bhdk->bhqk', query, key, precision='highest')
  if bias is not None:
    logits = logits + bias
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum('bhqk,bhkd->bhqd', weights, value, precision='highest')


@needs_kernel
@pytest.mark.parametrize('b,h,q,d,length,masked', [
    (2, 3, 1, 32, 64, True),     # a greedy step; the second row's last 40 positions are padding
    (2, 2, 4, 64, 96, True),     # beam search: four beams' queries against one cache row
    (1, 1, 3, 32, 32, False),    # a pair of rows and one, no bias
    (1, 2, 70, 32, 64, True),    # more query rows than the kernel's block of 64
])
def test_cross_attention_matches_the_unfused_attention(b, h, q, d, length, masked):
  rng = np.random.default_rng(7)
  query = jnp.asarray(rng.normal(size=(b, h, q, d)), jnp.float32)
  key = jnp.asarray(rng.normal(size=(b, h, d, length)) * 0.3, jnp.float32)
  value = jnp.asarray(rng.normal(size=(b, h, length, d)), jnp.float32)
  bias = None
  if masked:
    valid = np.ones((b, 1, 1, length), bool)
    valid[-1, ..., length - 40:] = False
    bias = layers.mask_to_bias(jnp.asarray(valid))
  # A function of this test's own: JAX caches a trace per function, and the kernel is chosen when
  # tracing, so a trace of `small_dots.cross_attention` made under the other library's setting
  # (the same shapes) would be reused.
  fn = jax.jit(lambda *operands: small_dots.cross_attention(*operands))
  text = fn.lower(query, key, value, bias).as_text()
  assert 't2t_f32_attention' in text and 'avx512' not in text
  got = np.asarray(fn(query, key, value, bias))
  want = np.asarray(_reference_cross_attention(query, key, value, bias))
  assert got.shape == (b, h, q, d)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.max(np.abs(want))))
  if masked:   # padding gets exactly zero weight: masking the padded values changes nothing
    poisoned = value.at[-1, :, length - 40:].set(1e4)
    np.testing.assert_array_equal(np.asarray(fn(query, key, poisoned, bias)), got)


def test_cross_attention_declines_mixed_dtypes():
  q = jnp.zeros((2, 2, 1, 32), jnp.float32)
  k = jnp.zeros((2, 2, 32, 64), jnp.float32)
  v = jnp.zeros((2, 2, 64, 32), jnp.float32)
  assert small_dots.cross_attention(q, k, v.astype(jnp.bfloat16), None) is None
  assert small_dots.cross_attention(q.astype(jnp.float16), k, v, None) is None
  assert small_dots.cross_attention(q, k[..., :48], v[:, :, :48], None) is None   # L = 48


def tiny_float32_decode(beams: int, vocab_size: int):
  """A tiny float32 T5 (4 rows of 32 inputs, 8 tokens decoded; greedy or `beams`-beam search):
  a function that traces its `predict_batch` afresh, under the kernels' settings of the moment,
  and returns (the lowered program's text, the tokens)."""
  config = helpers.tiny_config(d_model=64, num_heads=2, d_kv=32, d_ff=128, vocab_size=vocab_size)
  module = Transformer(config)
  batch = helpers.seq2seq_batch(seed=5, batch=4, enc_len=32, dec_len=6, vocab=vocab_size)
  vocab = seqio.PassThroughVocabulary(vocab_size)
  decode_fn = (decoding.greedy_decode if beams == 1
               else functools.partial(decoding.beam_search, beam_size=beams, alpha=0.6))
  model = EncoderDecoderModel(module, vocab, vocab, decode_fn=decode_fn)
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  inputs = {'encoder_input_tokens': jnp.asarray(batch['encoder_input_tokens'])}

  def decode():
    predict = jax.jit(lambda p, b: model.predict_batch(p, b, max_decode_length=8))
    return predict.lower(params, inputs).as_text(), predict(params, inputs)
  return decode


@needs_kernel
@pytest.mark.parametrize('beams', [1, 3])
def test_float32_model_decodes_the_same_tokens_with_and_without_the_kernels(beams, monkeypatch):
  """Greedy decoding and beam search of a float32 T5 whose decoder projections, FFN, tied logits
  and encoder-decoder attention go through the kernels, against the same decode on XLA's dot."""
  decode = tiny_float32_decode(beams, vocab_size=64)
  hlo_on, tokens_on = decode()
  monkeypatch.setenv(small_dots.SWITCH, '0')
  hlo_off, tokens_off = decode()
  assert all(f't2t_f32_{k}' in hlo_on for k in ('nt', 'transpose', 'attention'))
  # The decoder's two cached cross-attentions, and the encoder's two self-attentions.
  assert hlo_on.count('custom_call @t2t_f32_attention') == 2
  assert hlo_on.count('custom_call @t2t_f32_sequence_attention') == 2
  assert 't2t_f32' not in hlo_off
  assert np.asarray(tokens_on).shape == (4, 8)
  np.testing.assert_array_equal(np.asarray(tokens_on), np.asarray(tokens_off))


# --- Whole-sequence attention (t2t_f32_sequence_attention) ------------------------------------

def _sequence_operands(seed, b, q, length, h, d, bias_shape, masked):
  rng = np.random.default_rng(seed)
  query, key, value = (jnp.asarray(rng.normal(size=shape), jnp.float32)
                       for shape in ((b, q, h, d), (b, length, h, d), (b, length, h, d)))
  bias = None if bias_shape is None else jnp.asarray(rng.normal(size=bias_shape), jnp.float32)
  if masked:   # the last row's last third of the keys is padding
    valid = np.ones((b, 1, 1, length), bool)
    valid[-1, ..., 2 * length // 3:] = False
    bias = bias + layers.mask_to_bias(jnp.asarray(valid))
  return query, key, value, bias


def _float32_attention():
  reference = functools.partial(layers.plain_attention, dtype=jnp.float32, matmul_dtype=None)
  return (lambda q, k, v, bias: small_dots.attention(q, k, v, bias, dtype=jnp.float32,
                                                     reference=reference,
                                                     operands=jnp.float32)), reference


@needs_kernel
@pytest.mark.parametrize('b,q,length,h,d,bias_shape,masked', [
    (2, 64, 96, 2, 32, (1, 2, 64, 96), True),   # queries and keys of different lengths
    (1, 100, 128, 3, 64, (1, 3, 100, 128), True),   # a block of 96 rows and 4 (tiles 6, then 4)
    (2, 13, 32, 2, 16, (2, 2, 13, 32), False),   # a bias per batch row and head; 13 rows
    (2, 16, 16, 1, 16, None, False),             # no bias at all
    (3, 7, 48, 2, 32, (3, 1, 7, 48), True),      # a bias shared by the heads
])
def test_sequence_attention_matches_the_unfused_attention(b, q, length, h, d, bias_shape,
                                                          masked):
  query, key, value, bias = _sequence_operands(21, b, q, length, h, d, bias_shape, masked)
  fused, reference = _float32_attention()
  assert 't2t_f32_sequence_attention' in jax.jit(fused).lower(query, key, value, bias).as_text()
  got = np.asarray(jax.jit(fused)(query, key, value, bias))
  want = np.asarray(jax.jit(reference)(query, key, value, bias))
  assert got.shape == (b, q, h, d) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * float(np.max(np.abs(want))))
  if masked:   # the masked keys get exactly zero weight
    poisoned = value.at[-1, 2 * length // 3:].set(1e4)
    np.testing.assert_array_equal(np.asarray(jax.jit(fused)(query, key, poisoned, bias)), got)


@needs_kernel
def test_sequence_attention_by_hand():
  """Zero queries give every key the same logit, so each output row is the mean of the values
  over the keys the bias leaves unmasked: here keys 0-15 for the first head, 0-7 for the second."""
  value = jnp.arange(32 * 2 * 16, dtype=jnp.float32).reshape(1, 32, 2, 16)
  query = jnp.zeros((1, 3, 2, 16), jnp.float32)
  key = jnp.ones((1, 32, 2, 16), jnp.float32)
  valid = np.zeros((1, 2, 3, 32), bool)
  valid[0, 0, :, :16] = True
  valid[0, 1, :, :8] = True
  bias = layers.mask_to_bias(jnp.asarray(valid))
  fused, _ = _float32_attention()
  got = np.asarray(jax.jit(fused)(query, key, value, bias))
  first = np.asarray(value)[0, :16, 0].mean(axis=0)    # [16]
  second = np.asarray(value)[0, :8, 1].mean(axis=0)
  np.testing.assert_allclose(got[0, :, 0], np.broadcast_to(first, (3, 16)), rtol=1e-6)
  np.testing.assert_allclose(got[0, :, 1], np.broadcast_to(second, (3, 16)), rtol=1e-6)


def test_sequence_attention_declines_what_it_does_not_handle():
  fused, _ = _float32_attention()
  query, key, value, bias = _sequence_operands(22, 2, 8, 64, 2, 32, (1, 2, 8, 64), False)
  assert fused(query, key[:, :40], value[:, :40], bias[..., :40]) is None    # length 40
  assert fused(query[..., :8], key[..., :8], value[..., :8], bias) is None   # d_kv 8
  assert fused(query, key, value, bias[0]) is None                           # 3-D bias
  assert fused(query, key, value.astype(jnp.float16), bias) is None          # mixed dtypes
  assert small_dots.attention(query, key, value, bias, dtype=jnp.float32, reference=None,
                              operands=jnp.float16) is None                  # no float16 kernel


@needs_kernel
@pytest.mark.parametrize('dropout_rate,enable_dropout,fused', [
    (0.1, False, True),   # inference: no dropout
    (0.0, True, True),    # training with dropout 0
    (0.1, True, False),   # dropout on the weights: XLA's unfused attention
])
def test_float32_multi_head_attention_uses_the_kernel_without_dropout(dropout_rate,
                                                                     enable_dropout, fused,
                                                                     monkeypatch):
  """The module's output with the kernel is XLA's to float32 rounding, and under jax.grad the
  forward and backward are XLA's exactly (the kernel has no backward; the bias's gradient is
  how T5's relative position embedding learns). Training dropout's own kernel is switched off
  here (tests/models/test_train_attention.py covers it)."""
  monkeypatch.setenv(train_attention.SWITCH, '0')
  module = layers.MultiHeadAttention(num_heads=2, d_kv=32, dropout_rate=dropout_rate)
  rng = np.random.default_rng(23)
  x = jnp.asarray(rng.normal(size=(2, 32, 48)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(1, 2, 32, 32)), jnp.float32)
  params = module.init(jax.random.PRNGKey(0), x, x, bias, enable_dropout=False)

  def run():   # new functions each time: jax.jit's trace cache would keep the first trace
    apply = lambda p, x, bias: module.apply(p, x, x, bias, enable_dropout=enable_dropout,
                                            rngs={'dropout': jax.random.PRNGKey(1)})
    loss = lambda p, x, bias: jnp.sum(jnp.sin(apply(p, x, bias)))
    lowered = jax.jit(apply).lower(params, x, bias).as_text()
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(params, x, bias)
    return 't2t_f32_sequence_attention' in lowered, jax.jit(apply)(params, x, bias), grads

  used, got, got_grads = run()
  monkeypatch.setenv(small_dots.SWITCH, '0')
  unused, want, want_grads = run()
  assert used == fused and not unused
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=2e-5 * float(jnp.max(jnp.abs(want))))
  for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
