"""Tests for t2t.models.small_dots: the few-row bf16 matmul kernel against XLA's dot, where it
applies and where it declines, and a bf16 model decoding the same tokens with it as without."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t.models import layers, matmuls, small_dots
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from tests.models import helpers

# The kernel needs an AVX512_BF16 x86 CPU and a C++ compiler; where both exist it must build and
# run (a failed build fails these tests rather than skipping them).
_REASON = small_dots.unavailable_reason()
needs_kernel = pytest.mark.skipif(_REASON is not None and 'T2T_SMALL_DOTS=0' not in _REASON,
                                  reason=f'small-dots kernel unavailable: {_REASON}')


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  monkeypatch.delenv(small_dots.SWITCH, raising=False)


def _operands(seed, a_shape, b_shape):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=a_shape), jnp.bfloat16),
          jnp.asarray(rng.normal(size=b_shape) * 0.1, jnp.bfloat16))


def _uses_kernel(fn, *args) -> bool:
  return 't2t_bf16_n' in jax.jit(fn).lower(*args).as_text()


@needs_kernel
def test_kernel_builds_and_reports_enabled():
  status = small_dots.status()
  assert status['enabled'] is True and status['max_rows'] == small_dots.MAX_ROWS
  assert status['bf16'] == {'enabled': True, 'reason': None}


@needs_kernel
@pytest.mark.parametrize('spec,a_shape,b_shape', [
    ('abc,cd->abd', (8, 1, 512), (512, 2048)),     # FFN input, one token of a batch of 8
    ('abc,cd->abd', (1, 1, 2048), (2048, 64)),     # one row
    ('abc,cd->abd', (3, 3, 6), (6, 96)),           # 9 rows: a tile of 8 and one of 1; K of 6
    ('abc,cde->abde', (8, 1, 64), (64, 2, 32)),    # query projection into heads
    ('abcd,cde->abe', (8, 1, 2, 32), (2, 32, 64)), # attention output over (heads, kv)
    ('ab,bc->ac', (64, 128), (128, 32)),           # MAX_ROWS rows
    ('abc,zc->abz', (8, 1, 512), (4004, 512)),     # tied logits against [vocab, embed]
    ('abc,zc->abz', (2, 3, 64), (12, 64)),         # 6 rows: tiles of 4 and 2
    ('ab,zb->az', (1, 32), (4, 32)),
])
def test_kernel_matches_xla_dot(spec, a_shape, b_shape):
  a, b = _operands(0, a_shape, b_shape)
  fn = lambda a, b: small_dots.dot(spec, a, b)
  assert _uses_kernel(fn, a, b)
  got = jax.jit(fn)(a, b)
  want = jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  assert got.shape == want.shape and got.dtype == jnp.float32
  scale = float(jnp.max(jnp.abs(want)))
  # float32 accumulation in another order: agreement to a few float32 ulps of the largest entry.
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=2e-6 * scale)


@pytest.mark.parametrize('spec,a_shape,b_shape,dtype,why', [
    ('ab,bc->ac', (65, 32), (32, 32), jnp.bfloat16, 'more rows than MAX_ROWS'),
    ('ab,bc->ac', (8, 32), (32, 48), jnp.bfloat16, 'N not a multiple of 32'),
    ('ab,cb->ac', (8, 48), (8, 48), jnp.bfloat16, 'NT with K not a multiple of 32'),
    ('ab,bc->ac', (8, 32), (32, 32), jnp.float32, 'float32 operands'),
    ('bqd,bkd->bqk', (2, 1, 32), (2, 64, 32), jnp.bfloat16, 'a batch index (attention)'),
    ('ab,bc->ca', (8, 32), (32, 32), jnp.bfloat16, 'a transposed output'),
    ('ba,bc->ac', (32, 8), (32, 32), jnp.bfloat16, 'contracted dims not trailing in a'),
    ('abc,bcd->ad', (8, 4, 8), (8, 4, 32), jnp.bfloat16, 'contracted sizes differ (4x8 vs 8x4)'),
])
def test_kernel_declines_what_it_does_not_handle(spec, a_shape, b_shape, dtype, why):
  rng = np.random.default_rng(1)
  a = jnp.asarray(rng.normal(size=a_shape), dtype)
  b = jnp.asarray(rng.normal(size=b_shape), dtype)
  assert small_dots.dot(spec, a, b) is None, why


@needs_kernel
def test_matmul_routes_few_rows_to_the_kernel_and_keeps_xla_gradients(monkeypatch):
  spec = 'abc,cd->abd'
  a, w = _operands(2, (4, 2, 64), (64, 96))
  a = a.astype(jnp.float32)
  mixed = lambda a, w: matmuls.matmul(spec, a, w, jnp.float32, jnp.bfloat16)
  assert _uses_kernel(mixed, a, w)
  assert not _uses_kernel(mixed, jnp.zeros((8, 9, 64), jnp.float32), w)   # 72 rows > MAX_ROWS
  loss = lambda a, w: jnp.sum(jnp.sin(mixed(a, w)))
  with_kernel = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, w)
  monkeypatch.setenv(small_dots.SWITCH, '0')   # read when a function is traced: new functions
  mixed = lambda a, w: matmuls.matmul(spec, a, w, jnp.float32, jnp.bfloat16)
  loss = lambda a, w: jnp.sum(jnp.sin(mixed(a, w)))
  assert not _uses_kernel(mixed, a, w)
  without = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, w)
  for x, y in zip(jax.tree.leaves(with_kernel), jax.tree.leaves(without)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize('spec,b_shape', [('abc,cd->abd', (64, 96)), ('abc,dc->abd', (96, 64))])
def test_bf16_operands_are_differentiated_as_the_plain_product(spec, b_shape):
  """A model with bf16 activations (`dtype=bfloat16`, no `matmul_dtype`) hands `dot` bf16 operands
  directly; its gradients must be the plain product's, in bf16 like the operands (NN and NT)."""
  a, w = _operands(3, (4, 2, 64), b_shape)
  loss = lambda a, w: jnp.sum(jnp.sin(small_dots.dot(spec, a, w)))
  assert _uses_kernel(loss, a, w)
  value, (d_a, d_w) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(a, w)
  want = lambda a, w: jnp.sum(jnp.sin(jnp.einsum(spec, a.astype(jnp.float32), w.astype(jnp.float32))))
  want_value, (want_a, want_w) = jax.value_and_grad(want, argnums=(0, 1))(a, w)
  assert d_a.dtype == d_w.dtype == jnp.bfloat16
  np.testing.assert_allclose(float(value), float(want_value), rtol=1e-5)
  for got, ref in ((d_a, want_a), (d_w, want_w)):   # the float32 gradient rounded to bf16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(ref, np.float32),
                               rtol=2 ** -7, atol=1e-6)


@needs_kernel
def test_weights_reused_in_a_loop_are_transposed_once_before_it():
  """Under `weights_reused` a [K, N] weight goes to the NT kernel as W^T; in a loop's body XLA
  hoists that transpose, so the compiled body reads the weight as the loop carries it."""
  import re
  w = _operands(4, (1, 1), (64, 96))[1]

  def loop(x, w, reused):
    def body(i, x):
      if reused:
        with small_dots.weights_reused():
          y = small_dots.dot('mk,kn->mn', x.astype(jnp.bfloat16), w)
      else:
        y = small_dots.dot('mk,kn->mn', x.astype(jnp.bfloat16), w)
      return jnp.tanh(y)[:, :64]
    return jax.lax.fori_loop(0, 5, body, x)

  x = jnp.asarray(np.random.default_rng(4).normal(size=(8, 64)), jnp.float32)
  compiled = jax.jit(functools.partial(loop, reused=True)).lower(x, w).compile().as_text()
  body_name = re.search(r'body=(%[\w.\-]+)', compiled).group(1)
  body = re.search(re.escape(body_name) + r' .*?\n}', compiled, re.S).group(0)
  assert 't2t_bf16_nt' in body and 't2t_bf16_nn' not in body
  assert 'transpose' not in body and ' copy(' not in body   # W^T made once, outside the body
  assert not small_dots._REUSED.get()                      # the context ends with its block
  # One step against the NN kernel (over five, a float32 ulp can flip the next step's rounding).
  x = x.astype(jnp.bfloat16).astype(jnp.float32)
  with small_dots.weights_reused():
    got = small_dots.dot('mk,kn->mn', x.astype(jnp.bfloat16), w)
  want = small_dots.dot('mk,kn->mn', x.astype(jnp.bfloat16), w)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=2e-6 * float(jnp.max(jnp.abs(want))))
  assert np.all(np.isfinite(np.asarray(jax.jit(functools.partial(loop, reused=True))(x, w))))


@needs_kernel
def test_kernel_under_vmap():
  a, b = _operands(3, (5, 8, 64), (64, 32))
  got = jax.vmap(lambda x: small_dots.dot('mk,kn->mn', x, b))(a)
  want = jnp.einsum('bmk,kn->bmn', a, b, preferred_element_type=jnp.float32)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=2e-6 * float(jnp.max(jnp.abs(want))))


@needs_kernel
def test_bf16_model_decodes_the_same_tokens_with_and_without_the_kernel(monkeypatch):
  """Greedy decoding of a bf16 T5 whose every decoder projection, FFN, tied logits and
  encoder-decoder attention go through the kernels (dims multiples of 32) against the same decode
  on XLA's dot."""
  config = helpers.tiny_config(d_model=64, num_heads=2, d_kv=32, d_ff=128, vocab_size=64,
                               matmul_dtype='bfloat16')
  module = Transformer(config)
  batch = helpers.seq2seq_batch(seed=5, batch=4, enc_len=32, dec_len=6, vocab=64)
  vocab = seqio.PassThroughVocabulary(64)
  model = EncoderDecoderModel(module, vocab, vocab)
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  inputs = {'encoder_input_tokens': jnp.asarray(batch['encoder_input_tokens'])}

  def decode():
    predict = lambda p, b: model.predict_batch(p, b, max_decode_length=8)
    return jax.jit(predict).lower(params, inputs).as_text(), jax.jit(predict)(params, inputs)

  hlo_on, tokens_on = decode()
  monkeypatch.setenv(small_dots.SWITCH, '0')
  hlo_off, tokens_off = decode()
  assert all(f't2t_bf16_{k}' in hlo_on for k in ('nt', 'attention'))
  # Every [K, N] weight of the decoding step reaches the kernel transposed (`weights_reused`).
  assert 't2t_bf16_nn' not in hlo_on
  # The encoder's two self-attentions and the decoder's two cached cross-attentions.
  assert hlo_on.count('custom_call @t2t_bf16_attention') == 4
  assert 't2t_bf16_n' not in hlo_off
  assert np.asarray(tokens_on).shape == (4, 8)
  np.testing.assert_array_equal(np.asarray(tokens_on), np.asarray(tokens_off))


def _reference_cross_attention(query, key, value, bias):
  """The unfused computation of MultiHeadAttention's cached cross-attention (bf16 matmuls)."""
  logits = jnp.einsum('bhqd,bhdk->bhqk', query.astype(jnp.bfloat16), key,
                      preferred_element_type=jnp.float32)
  if bias is not None:
    logits = logits + bias
  weights = jax.nn.softmax(logits, axis=-1).astype(jnp.bfloat16)
  return jnp.einsum('bhqk,bhkd->bhqd', weights, value, preferred_element_type=jnp.float32)


@needs_kernel
@pytest.mark.parametrize('b,h,q,d,length,masked', [
    (2, 3, 1, 32, 64, True),     # a greedy step; the second row's last 40 positions are padding
    (2, 2, 4, 64, 96, True),     # beam search: four beams' queries against one cache row
    (1, 1, 9, 32, 32, False),    # more query rows than one NN tile, no bias
    (1, 2, 70, 32, 64, True),    # more query rows than the kernel's block of 64
])
def test_cross_attention_matches_the_unfused_attention(b, h, q, d, length, masked):
  rng = np.random.default_rng(7)
  query = jnp.asarray(rng.normal(size=(b, h, q, d)), jnp.float32)
  key = jnp.asarray(rng.normal(size=(b, h, d, length)), jnp.bfloat16)
  value = jnp.asarray(rng.normal(size=(b, h, length, d)), jnp.bfloat16)
  bias = None
  if masked:
    valid = np.ones((b, 1, 1, length), bool)
    valid[-1, ..., length - 40:] = False
    bias = layers.mask_to_bias(jnp.asarray(valid))
  fn = lambda *args: small_dots.cross_attention(*args)
  assert 't2t_bf16_attention' in jax.jit(fn).lower(query, key, value, bias).as_text()
  got = np.asarray(jax.jit(fn)(query, key, value, bias))
  want = np.asarray(_reference_cross_attention(query, key, value, bias))
  assert got.shape == (b, h, q, d)
  # Weights rounded to bf16 on both sides; a float32 ulp of difference before the rounding can
  # move one weight by a bf16 ulp (2**-8 relative), so compare at that scale.
  np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * float(np.max(np.abs(want))))
  if masked:   # padding gets exactly zero weight: masking the padded values changes nothing
    poisoned = value.at[-1, :, length - 40:].set(1e4)
    np.testing.assert_array_equal(np.asarray(jax.jit(fn)(query, key, poisoned, bias)), got)


def test_cross_attention_declines_what_it_does_not_handle():
  q = jnp.zeros((2, 2, 1, 32), jnp.float32)
  k = jnp.zeros((2, 2, 32, 64), jnp.bfloat16)
  v = jnp.zeros((2, 2, 64, 32), jnp.bfloat16)
  assert small_dots.cross_attention(q, k.astype(jnp.float32), v, None) is None   # float32 cache
  assert small_dots.cross_attention(q, k[..., :48], v[:, :, :48], None) is None  # L = 48
  assert small_dots.cross_attention(q, k, v, jnp.zeros((2, 1, 64))) is None      # 3-D bias
  assert small_dots.cross_attention(q, k, v, jnp.zeros((2, 3, 1, 64))) is None   # 3 heads of bias


def _attention_operands(seed, b, q, length, h, d, masked):
  """query [b, q, h, d], key/value [b, length, h, d] float32, and T5's combined bias: a
  per-head [1, h, q, length] part (the relative positions') plus, if masked, the padding mask's
  [b, 1, q, length] with the last row's final third of the keys masked."""
  rng = np.random.default_rng(seed)
  query, key, value = (jnp.asarray(rng.normal(size=shape), jnp.float32)
                       for shape in ((b, q, h, d), (b, length, h, d), (b, length, h, d)))
  bias = jnp.asarray(rng.normal(size=(1, h, q, length)), jnp.float32)
  if masked:
    valid = np.ones((b, 1, q, length), bool)
    valid[-1, ..., 2 * length // 3:] = False
    bias = bias + layers.mask_to_bias(jnp.asarray(valid))
  return query, key, value, bias


def _kernel_attention(dtype=jnp.float32):
  reference = functools.partial(layers.plain_attention, dtype=dtype, matmul_dtype=jnp.bfloat16)
  return (lambda q, k, v, bias: small_dots.attention(q, k, v, bias, dtype=dtype,
                                                     reference=reference)), reference


@needs_kernel
@pytest.mark.parametrize('b,q,length,h,d,masked', [
    (2, 64, 96, 2, 32, True),    # cross-attention without a cache: q != length
    (1, 130, 128, 3, 64, True),  # two blocks of 64 query rows and a remainder of 2
    (2, 32, 32, 1, 32, False),
])
def test_attention_matches_the_unfused_attention(b, q, length, h, d, masked):
  query, key, value, bias = _attention_operands(11, b, q, length, h, d, masked)
  fused, reference = _kernel_attention()
  assert 't2t_bf16_attention' in jax.jit(fused).lower(query, key, value, bias).as_text()
  got = np.asarray(jax.jit(fused)(query, key, value, bias))
  want = np.asarray(jax.jit(reference)(query, key, value, bias))
  assert got.shape == (b, q, h, d) and got.dtype == np.float32
  # As for the cross-attention: a bf16 ulp of one weight is the scale of a difference.
  np.testing.assert_allclose(got, want, rtol=0, atol=4e-3 * float(np.max(np.abs(want))))
  if masked:   # the masked keys get exactly zero weight
    poisoned = value.at[-1, 2 * length // 3:].set(1e4)
    np.testing.assert_array_equal(np.asarray(jax.jit(fused)(query, key, poisoned, bias)), got)


@needs_kernel
def test_attention_is_differentiated_as_the_reference(monkeypatch):
  """The kernel has no backward: under jax.grad the forward and backward are the reference's, so
  a bf16 attention trained with dropout 0 gets XLA's gradients exactly (the bias's too: T5's
  relative position embedding learns through it)."""
  module = layers.MultiHeadAttention(num_heads=2, d_kv=32, matmul_dtype=jnp.bfloat16)
  _, _, _, bias = _attention_operands(12, 2, 32, 32, 2, 32, True)
  x = jnp.asarray(np.random.default_rng(12).normal(size=(2, 32, 48)), jnp.float32)
  params = module.init(jax.random.PRNGKey(0), x, x, bias, enable_dropout=False)

  def loss_and_grads():
    loss = lambda p, x, bias: jnp.sum(jnp.sin(module.apply(p, x, x, bias, enable_dropout=True)))
    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    return 't2t_bf16_attention' in jax.jit(loss).lower(params, x, bias).as_text(), fn(params, x, bias)

  fused, got = loss_and_grads()
  monkeypatch.setenv(small_dots.SWITCH, '0')
  unfused, want = loss_and_grads()
  assert fused and not unfused   # the loss alone (no gradient) runs the kernel
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_attention_declines_what_it_does_not_handle():
  fused, _ = _kernel_attention()
  query, key, value, bias = _attention_operands(13, 2, 8, 64, 2, 32, True)
  assert fused(query, key[:, :48], value[:, :48], bias[..., :48]) is None    # length 48
  assert fused(query[..., :16], key[..., :16], value[..., :16], bias) is None  # d_kv 16
  assert fused(query, key, value, bias[0]) is None                             # 3-D bias
  assert fused(query, key, value[:, :32], bias) is None                        # keys != values


@needs_kernel
@pytest.mark.parametrize('dropout_rate,enable_dropout,fused', [
    (0.1, False, True),   # inference: no dropout
    (0.0, True, True),    # training with dropout 0
    (0.1, True, False),   # dropout on the weights: the training attention's kernel instead
])
def test_multi_head_attention_uses_the_kernel_without_dropout(dropout_rate, enable_dropout,
                                                             fused, monkeypatch):
  module = layers.MultiHeadAttention(num_heads=2, d_kv=32, dropout_rate=dropout_rate,
                                     matmul_dtype=jnp.bfloat16)
  rng = np.random.default_rng(14)
  x = jnp.asarray(rng.normal(size=(2, 32, 48)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(1, 2, 32, 32)), jnp.float32)
  params = module.init(jax.random.PRNGKey(0), x, x, bias, enable_dropout=False)
  apply = lambda p, x: module.apply(p, x, x, bias, enable_dropout=enable_dropout,
                                    rngs={'dropout': jax.random.PRNGKey(1)})
  assert ('@t2t_bf16_attention(' in jax.jit(apply).lower(params, x).as_text()) == fused
  got = jax.jit(apply)(params, x)
  monkeypatch.setenv(small_dots.SWITCH, '0')
  apply = lambda p, x: module.apply(p, x, x, bias, enable_dropout=enable_dropout,
                                    rngs={'dropout': jax.random.PRNGKey(1)})
  want = jax.jit(apply)(params, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=4e-3 * float(jnp.max(jnp.abs(want))))


def test_build_reports_the_compiler_error(tmp_path):
  broken = dataclasses.replace(small_dots.BF16, source=tmp_path / 'broken.cc')
  (tmp_path / 'broken.cc').write_text('this is not C++\n')
  if small_dots._compiler() is None:
    pytest.skip('no C++ compiler')
  with pytest.raises(RuntimeError, match='could not build broken.cc'):
    small_dots.build(small_dots._compiler(), tmp_path / 'out', broken)
  assert not list((tmp_path / 'out').glob('*.so'))   # no half-written library left behind


def test_switch_turns_the_kernel_off(monkeypatch):
  monkeypatch.setenv(small_dots.SWITCH, '0')
  for library in small_dots.LIBRARIES:
    assert small_dots.unavailable_reason(library) == 'T2T_SMALL_DOTS=0'
  status = small_dots.status()
  assert status['enabled'] is False
  assert status['f32'] == {'enabled': False, 'reason': 'T2T_SMALL_DOTS=0'}
  a, b = _operands(4, (8, 64), (64, 32))
  assert small_dots.dot('mk,kn->mn', a, b) is None


def test_every_header_a_kernel_includes_is_in_its_build_key():
  """A library's compiled file is named by a hash of its source and `headers`: a header that the
  source includes (directly or through another header) but that is not listed would leave an
  old build in use after that header changed."""
  import re
  from pathlib import Path
  here = Path(small_dots.__file__).parent

  def includes(path):
    return set(re.findall(r'^#include "([\w.]+\.h)"', path.read_text(), re.M))

  for library in small_dots.LIBRARIES:
    found, todo = set(), [library.source]
    while todo:
      for name in includes(todo.pop()) - found:
        found.add(name)
        todo.append(here / name)
    assert found <= {path.name for path in library.headers}, (library.name, found)
