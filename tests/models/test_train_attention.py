"""Tests for t2t.models.train_attention (attention_train_f32.cc, attention_train_bf16.cc):
training attention with dropout on its weights, forward and backward, against the unfused einsums
(float32, and XLA's bf16 path for the bf16 kernel), by hand, and inside a T5's loss with the same
dropout masks as XLA's path."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t import cpu
from t2t.models import small_dots, train_attention
from t2t.models.matmuls import matmul
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from tests.models import helpers

# The kernel needs an x86 CPU with AVX2 and FMA and a C++ compiler; where both exist it must
# build and run (a failed build fails these tests rather than skipping them).
_REASON = train_attention.unavailable_reason()
needs_kernel = pytest.mark.skipif(_REASON is not None and 'T2T_' not in _REASON,
                                  reason=f'float32 training attention kernel unavailable: {_REASON}')
# The float32 kernel's AVX-512 build needs AVX-512F (a Zen 4 or 5, or a Xeon).
_AVX512_REASON = small_dots.unavailable_reason(small_dots.ATTENTION_TRAIN_F32_AVX512)
needs_avx512_kernel = pytest.mark.skipif(
    _AVX512_REASON is not None and 'T2T_' not in _AVX512_REASON,
    reason=f'AVX-512 float32 training attention kernel unavailable: {_AVX512_REASON}')
# The bf16 kernel needs AVX512_BF16 as well (a Zen 4 or a recent Xeon).
_BF16_REASON = small_dots.unavailable_reason(small_dots.ATTENTION_TRAIN_BF16)
needs_bf16_kernel = pytest.mark.skipif(
    _BF16_REASON is not None and 'T2T_' not in _BF16_REASON,
    reason=f'bf16 training attention kernel unavailable: {_BF16_REASON}')


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  monkeypatch.delenv(small_dots.SWITCH, raising=False)
  monkeypatch.delenv(train_attention.SWITCH, raising=False)
  monkeypatch.delenv(small_dots.ATTENTION_TRAIN_BF16.switch, raising=False)
  monkeypatch.delenv(small_dots.ATTENTION_TRAIN_F32_AVX512.switch, raising=False)


def _normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _reference(query, key, value, bias, keep, keep_prob):
  """What MultiHeadAttention computes without the kernel (float32 throughout)."""
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key)
  if bias is not None:
    logits = logits + bias
  weights = jax.nn.softmax(logits, axis=-1)
  weights = jnp.where(keep, weights * (1.0 / keep_prob), 0.0)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, value)


def _xla_bf16_reference(query, key, value, bias, keep, keep_prob):
  """What MultiHeadAttention computes without the kernel for bf16 matmul operands: each product's
  operands rounded to bf16 (the backward's cotangents too), accumulated in float32."""
  logits = matmul('bqhd,bkhd->bhqk', query, key, jnp.float32, jnp.bfloat16)
  if bias is not None:
    logits = logits + bias
  weights = jnp.where(keep, jax.nn.softmax(logits, axis=-1) * (1.0 / keep_prob), 0.0)
  return matmul('bhqk,bkhd->bqhd', weights, value, jnp.float32, jnp.bfloat16)


def _bf16(x):
  return x.astype(jnp.bfloat16).astype(jnp.float32)


@needs_kernel
def test_kernel_builds_and_reports_enabled():
  assert small_dots.status()['attention_train_f32'] == {'enabled': True, 'reason': None}


@needs_kernel
@pytest.mark.parametrize('b, q, length, h, d, bias_shape', [
    (2, 40, 64, 3, 32, (1, 3)),      # relative position bias: one per head, shared by the batch
    (2, 64, 48, 2, 16, (2, 1)),      # padding mask: one per batch row, shared by the heads
    (2, 24, 32, 3, 16, (1, 1)),      # one bias for every row and head, summed over both
    (3, 7, 32, 2, 16, (3, 2)),       # a full bias; fewer queries than one register tile
    (1, 114, 96, 2, 16, None),       # no bias; query rows not a multiple of the 6-row tile
])
def test_forward_and_gradients_match_the_einsums(b, q, length, h, d, bias_shape):
  query, key, value = _normal(0, (b, q, h, d)), _normal(1, (b, length, h, d)), _normal(2, (b, length, h, d))
  bias = None if bias_shape is None else _normal(3, (*bias_shape, q, length))
  keep = jnp.asarray(np.random.default_rng(4).random((b, h, q, length)) > 0.25)
  assert train_attention.applies(query, key, value, bias)
  ct = _normal(5, (b, q, h, d))

  def grads(fn):
    args = (query, key, value) + (() if bias is None else (bias,))
    call = lambda *a: fn(*a[:3], a[3] if len(a) > 3 else None, keep, 0.75)
    out, pullback = jax.vjp(call, *args)
    return out, pullback(ct)

  out, got = jax.jit(lambda: grads(train_attention.dropout_attention))()
  want_out, want = jax.jit(lambda: grads(_reference))()
  np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=0, atol=2e-5)
  for name, g, w in zip(('query', 'key', 'value', 'bias'), got, want):
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0, atol=2e-6 * scale + 1e-9,
                               err_msg=name)


def _vjp_results(fn, query, key, value, bias, keep, ct):
  """(out, d_query, d_key, d_value[, d_bias]) of fn(query, key, value, bias, keep, 0.75)."""
  args = (query, key, value) + (() if bias is None else (bias,))
  call = lambda *a: fn(*a[:3], a[3] if len(a) > 3 else None, keep, 0.75)
  out, pullback = jax.vjp(call, *args)
  return (out, *pullback(ct))


@needs_avx512_kernel
@pytest.mark.parametrize('b, q, length, h, d, bias_shape', [
    (2, 40, 64, 3, 32, (1, 3)),      # relative position bias: one per head, shared by the batch
    (2, 64, 96, 2, 64, (2, 1)),      # padding mask: one per batch row, shared by the heads
    (3, 7, 32, 2, 32, (3, 2)),       # a full bias; fewer queries than one register tile
    (1, 193, 64, 1, 32, None),       # no bias; three blocks of query rows, the last of one row
])
def test_avx512_build_matches_the_einsums_and_the_avx2_build(monkeypatch, b, q, length, h, d,
                                                            bias_shape):
  """The AVX-512 build (6 x 32 tiles) against the unfused einsums and against the AVX2 build:
  the products sum in the same order, the row sums over 16 lanes instead of 8, so the builds
  agree to float32 rounding. With d = 64 the logits' spread is 8 and both builds sit up to 2.3e-6
  of the largest gradient from the einsums (measured on a Zen 5), hence 4e-6 here."""
  query, key = _normal(0, (b, q, h, d)), _normal(1, (b, length, h, d))
  value = _normal(2, (b, length, h, d))
  bias = None if bias_shape is None else _normal(3, (*bias_shape, q, length))
  keep = jnp.asarray(np.random.default_rng(4).random((b, h, q, length)) > 0.25)
  assert train_attention.applies(query, key, value, bias)   # loads both builds
  ct = _normal(5, (b, q, h, d))
  run = lambda fn: jax.jit(lambda: _vjp_results(fn, query, key, value, bias, keep, ct))

  results = {}
  for choice, target in (('1', 't2t_f32_avx512_attention_train'),
                         ('0', 't2t_f32_attention_train_fwd')):
    monkeypatch.setenv(small_dots.ATTENTION_TRAIN_F32_AVX512.switch, choice)
    kernel = run(train_attention.dropout_attention)
    text = kernel.lower().as_text()
    assert target in text and ('avx512' in text) == (choice == '1')
    results[choice] = kernel()
  want = run(_reference)()
  for name, wide, narrow, w in zip(('out', 'query', 'key', 'value', 'bias'), results['1'],
                                   results['0'], want):
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(np.asarray(wide), np.asarray(w), rtol=0,
                               atol=4e-6 * scale + 1e-9, err_msg=name)
    np.testing.assert_allclose(np.asarray(wide), np.asarray(narrow), rtol=0,
                               atol=1e-6 * scale + 1e-9, err_msg=name)


@needs_avx512_kernel
def test_avx512_build_by_hand(monkeypatch):
  """test_by_hand's case with 32 keys, the AVX-512 build's strip width: P = 1/32, keys 0-15
  dropped at keep_prob 0.5, so the output is (2/32) * (16 + ... + 31) = 23.5 and each kept
  value's gradient 2/32."""
  monkeypatch.setenv(small_dots.ATTENTION_TRAIN_F32_AVX512.switch, '1')
  query = jnp.zeros((1, 1, 1, 32), jnp.float32)
  key = _normal(0, (1, 32, 1, 32))
  value = jnp.broadcast_to(jnp.arange(32, dtype=jnp.float32)[None, :, None, None], (1, 32, 1, 32))
  keep = jnp.asarray(np.arange(32) >= 16).reshape(1, 1, 1, 32)
  assert train_attention.float32_kernel(query, key) == 't2t_f32_avx512_attention_train'
  out, pullback = jax.vjp(
      lambda v: train_attention.dropout_attention(query, key, v, None, keep, 0.5), value)
  np.testing.assert_allclose(np.asarray(out), np.full((1, 1, 1, 32), 23.5), rtol=1e-6)
  (d_value,) = pullback(jnp.ones_like(out))
  want = np.where(np.arange(32) >= 16, 2 / 32, 0.0)[None, :, None, None] * np.ones((1, 32, 1, 32))
  np.testing.assert_allclose(np.asarray(d_value), want, rtol=1e-6)


def test_which_float32_build_runs(monkeypatch):
  """T2T_TRAIN_ATTENTION_AVX512 decides; otherwise the AVX-512 build where the cores run 512-bit
  FMAs at full width (Intel; AMD from Zen 5, CPUID family 26, on), and only for d and key
  lengths that are multiples of 32."""
  switch = small_dots.ATTENTION_TRAIN_F32_AVX512.switch
  monkeypatch.setenv(switch, '0')
  assert not train_attention.prefers_avx512()
  monkeypatch.setenv(switch, '1')
  assert train_attention.prefers_avx512()
  monkeypatch.delenv(switch)
  for vendor, family, wanted in (('GenuineIntel', 6, True), ('AuthenticAMD', 25, False),
                                 ('AuthenticAMD', 26, True), ('AuthenticAMD', None, False),
                                 (None, None, False)):
    monkeypatch.setattr(cpu, 'vendor', lambda vendor=vendor: vendor)
    monkeypatch.setattr(cpu, 'family', lambda family=family: family)
    assert train_attention.prefers_avx512() == wanted, (vendor, family)
  monkeypatch.setenv(switch, '1')
  q16, kv16 = _normal(0, (1, 8, 2, 16)), _normal(1, (1, 64, 2, 16))
  assert train_attention.float32_kernel(q16, kv16) == 't2t_f32_attention_train'   # d % 32
  q32 = _normal(0, (1, 8, 2, 32))
  assert train_attention.float32_kernel(q32, _normal(1, (1, 48, 2, 32))) == 't2t_f32_attention_train'
  wide = small_dots.loaded(small_dots.ATTENTION_TRAIN_F32_AVX512) is not None
  assert (train_attention.float32_kernel(q32, _normal(1, (1, 64, 2, 32)))
          == ('t2t_f32_avx512_attention_train' if wide else 't2t_f32_attention_train'))
  monkeypatch.setenv(switch, '0')
  assert train_attention.float32_kernel(q32, _normal(1, (1, 64, 2, 32))) == 't2t_f32_attention_train'


@needs_bf16_kernel
@pytest.mark.parametrize('b, q, length, h, d, bias_shape', [
    (2, 40, 64, 3, 32, (1, 3)),      # relative position bias, summed over the batch
    (2, 64, 96, 2, 64, (2, 1)),      # padding mask, summed over the heads
    (3, 7, 32, 2, 32, (3, 2)),       # a full bias; an odd number of query rows (a zero pair)
    (1, 193, 64, 1, 64, None),       # no bias; three backward blocks, the last odd
])
def test_bf16_kernel_is_xlas_bf16_path(b, q, length, h, d, bias_shape):
  """The bf16 kernel rounds each product's operands where XLA's bf16 path does, so the two agree
  to float32 summation order; both sit at bf16 rounding distance from float32."""
  query, key = _bf16(_normal(0, (b, q, h, d))), _bf16(_normal(1, (b, length, h, d)))
  value = _bf16(_normal(2, (b, length, h, d)))
  bias = None if bias_shape is None else _normal(3, (*bias_shape, q, length))
  keep = jnp.asarray(np.random.default_rng(4).random((b, h, q, length)) > 0.25)
  assert train_attention.applies(query, key, value, bias)
  assert train_attention.runs_bf16_products(query, key)
  ct = _normal(5, (b, q, h, d))

  def results(fn):
    args = (query, key, value) + (() if bias is None else (bias,))
    call = lambda *a: fn(*a[:3], a[3] if len(a) > 3 else None, keep, 0.75)
    out, pullback = jax.vjp(call, *args)
    return (out, *pullback(ct))

  kernel = functools.partial(train_attention.dropout_attention, bf16_products=True)
  text = jax.jit(lambda: results(kernel)).lower().as_text()
  assert 't2t_bf16_attention_train_fwd' in text and 't2t_bf16_attention_train_bwd' in text
  got = jax.jit(lambda: results(kernel))()
  xla = jax.jit(lambda: results(_xla_bf16_reference))()
  f32 = jax.jit(lambda: results(_reference))()
  for name, g, x, w in zip(('out', 'query', 'key', 'value', 'bias'), got, xla, f32):
    scale = float(jnp.max(jnp.abs(w)))
    np.testing.assert_allclose(np.asarray(g), np.asarray(x), rtol=0, atol=1e-5 * scale,
                               err_msg=name)
    error = float(jnp.max(jnp.abs(g - w))) / scale
    assert 1e-4 < error < 2e-2, (name, error)   # bf16's rounding, not float32's, nor a wrong sum


@needs_kernel
def test_by_hand():
  """q = 0 and no bias: P = 1/16 for each of 16 keys; keys 0-7 dropped at keep_prob 0.5, so the
  output is (2/16) * sum of the kept values, and each kept value's gradient is (2/16) * d_out."""
  query = jnp.zeros((1, 1, 1, 16), jnp.float32)
  key = _normal(0, (1, 16, 1, 16))
  value = jnp.broadcast_to(jnp.arange(16, dtype=jnp.float32)[None, :, None, None], (1, 16, 1, 16))
  keep = jnp.asarray(np.arange(16) >= 8).reshape(1, 1, 1, 16)
  out, pullback = jax.vjp(
      lambda v: train_attention.dropout_attention(query, key, v, None, keep, 0.5), value)
  np.testing.assert_allclose(np.asarray(out), np.full((1, 1, 1, 16), 2 / 16 * sum(range(8, 16))),
                             rtol=1e-6)
  (d_value,) = pullback(jnp.ones_like(out))
  want = np.where(np.arange(16) >= 8, 2 / 16, 0.0)[None, :, None, None] * np.ones((1, 16, 1, 16))
  np.testing.assert_allclose(np.asarray(d_value), want, rtol=1e-6)


@needs_bf16_kernel
def test_bf16_kernel_by_hand():
  """The same case with bf16 products, 32 keys: P = 1/32, keys 0-15 dropped at keep_prob 0.5, so
  the output is (2/32) * (16 + ... + 31) = 23.5 and each kept value's gradient 2/32 (all exact in
  bf16), and d_q = 0 since d_logits = P * (dP - rowsum(dP * P)) with dP the values' 2 x row."""
  query = jnp.zeros((1, 1, 1, 32), jnp.float32)
  key = _bf16(_normal(0, (1, 32, 1, 32)))
  value = jnp.broadcast_to(jnp.arange(32, dtype=jnp.float32)[None, :, None, None], (1, 32, 1, 32))
  keep = jnp.asarray(np.arange(32) >= 16).reshape(1, 1, 1, 32)
  out, pullback = jax.vjp(
      lambda v: train_attention.dropout_attention(query, key, v, None, keep, 0.5,
                                                  bf16_products=True), value)
  np.testing.assert_array_equal(np.asarray(out), np.full((1, 1, 1, 32), 23.5, np.float32))
  (d_value,) = pullback(jnp.ones_like(out))
  want = np.where(np.arange(32) >= 16, 2 / 32, 0.0)[None, :, None, None] * np.ones((1, 32, 1, 32))
  np.testing.assert_array_equal(np.asarray(d_value), want.astype(np.float32))


@needs_kernel
def test_dropped_keys_contribute_nothing():
  query, key = _normal(0, (1, 6, 2, 16)), _normal(1, (1, 32, 2, 16))
  value = _normal(2, (1, 32, 2, 16))
  keep = jnp.ones((1, 2, 6, 32), bool).at[:, :, :, 5].set(False)
  changed = value.at[:, 5].set(1e6)
  first = train_attention.dropout_attention(query, key, value, None, keep, 0.9)
  second = train_attention.dropout_attention(query, key, changed, None, keep, 0.9)
  np.testing.assert_array_equal(np.asarray(first), np.asarray(second))


def test_what_the_kernel_declines(monkeypatch):
  q, kv = _normal(0, (1, 8, 2, 16)), _normal(1, (1, 32, 2, 16))
  assert not train_attention.applies(q.astype(jnp.bfloat16), kv.astype(jnp.bfloat16),
                                     kv.astype(jnp.bfloat16), None)            # not float32
  assert not train_attention.applies(_normal(0, (1, 8, 2, 8)), _normal(1, (1, 32, 2, 8)),
                                     _normal(1, (1, 32, 2, 8)), None)          # d % 16
  assert not train_attention.applies(q, _normal(1, (1, 24, 2, 16)), _normal(1, (1, 24, 2, 16)),
                                     None)                                      # keys % 16
  assert not train_attention.applies(q, kv, kv, jnp.zeros((8, 32)))           # bias not 4-D
  q32, kv32 = _normal(0, (1, 8, 2, 32)), _normal(1, (1, 64, 2, 32))
  assert not train_attention.runs_bf16_products(q, kv)                         # d % 32
  assert not train_attention.runs_bf16_products(q32, _normal(1, (1, 48, 2, 32)))  # keys % 32
  monkeypatch.setenv(small_dots.ATTENTION_TRAIN_BF16.switch, '0')
  assert not train_attention.runs_bf16_products(q32, kv32)
  monkeypatch.setenv(train_attention.SWITCH, '0')
  assert train_attention.unavailable_reason() == 'T2T_TRAIN_ATTENTION=0'
  assert not train_attention.applies(q, kv, kv, None)


@needs_kernel
def test_a_keep_mask_of_the_wrong_shape_is_refused():
  q, kv = _normal(0, (1, 8, 2, 16)), _normal(1, (1, 32, 2, 16))
  with pytest.raises(ValueError, match=r'keep must be bool \(1, 2, 8, 32\)'):
    train_attention.dropout_attention(q, kv, kv, None, jnp.ones((1, 8, 2, 32), bool), 0.9)


def _t5_with_and_without_the_kernel(monkeypatch, **config_overrides):
  """A tiny T5's loss and gradients under dropout (rate 0.25, philox4x32 key 7) with the kernel's
  attention and with XLA's (`T2T_TRAIN_ATTENTION=0`), the same masks either way; returns the
  kernels' call count (float32 and bf16 products) in each program and both (loss, grads)."""
  config = helpers.tiny_config(d_model=64, num_heads=2, d_kv=32, d_ff=128, vocab_size=64,
                               dropout_rate=0.25, **config_overrides)
  module = Transformer(config)
  batch = helpers.seq2seq_batch(seed=9, batch=4, enc_len=32, dec_len=32, vocab=64)
  vocab = seqio.PassThroughVocabulary(64)
  model = EncoderDecoderModel(module, vocab, vocab)
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  rng = jax.random.key(7, impl='philox4x32')

  def run():   # a new function each time: jax.jit's trace cache would keep the first trace
    fn = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, rng)[0]))
    text = fn.lower(params).as_text()
    return text.count('_attention_train_fwd'), fn(params)

  calls, with_kernel = run()
  monkeypatch.setenv(train_attention.SWITCH, '0')
  no_calls, without = run()
  return calls, no_calls, with_kernel, without


@needs_kernel
def test_float32_t5_with_dropout_with_and_without_the_kernel(monkeypatch):
  """A float32 T5's loss and gradients under dropout, the kernel's attention against XLA's with
  the same dropout key: the same masks, so equal to float32 summation order."""
  calls, no_calls, (loss, grads), (want_loss, want_grads) = _t5_with_and_without_the_kernel(
      monkeypatch)
  # Encoder self-attention (2 layers) and encoder-decoder attention (2 layers); the decoder's
  # causal self-attention over 32 positions also qualifies (keys a multiple of 16).
  assert calls == 6 and no_calls == 0
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0,
                               atol=1e-5 * float(jnp.max(jnp.abs(w))) + 1e-9)


@needs_kernel
def test_bf16_matmul_t5_with_dropout_with_and_without_the_kernel(monkeypatch):
  """With bf16 matmul operands the kernel takes q, k and v rounded to bf16 (exact in float32) and
  keeps the softmax's weights in float32, where XLA's path rounds them to bf16 for the product
  with v; the dropout masks are the same. So the kernel's bf16 model is at least as close to the
  float32 model (same parameters, same masks) as XLA's bf16 path is: its loss, and its gradients
  leaf by leaf (RMS error relative to the leaf's largest float32 gradient). (The float32
  kernel's case: with AVX512_BF16 the bf16 kernel would take these shapes, so it is off here.)"""
  monkeypatch.setenv(small_dots.ATTENTION_TRAIN_BF16.switch, '0')
  calls, no_calls, (loss, grads), (xla_loss, xla_grads) = _t5_with_and_without_the_kernel(
      monkeypatch, matmul_dtype='bfloat16')
  assert calls == 6 and no_calls == 0
  monkeypatch.delenv(train_attention.SWITCH)
  _, _, (f32_loss, f32_grads), _ = _t5_with_and_without_the_kernel(monkeypatch)
  assert abs(float(loss) - float(f32_loss)) <= abs(float(xla_loss) - float(f32_loss)) + 1e-5
  np.testing.assert_allclose(float(loss), float(f32_loss), rtol=1e-3)

  def rms_error(g, want):
    g, want = np.asarray(g, np.float64), np.asarray(want, np.float64)
    return np.sqrt(np.mean((g - want) ** 2)) / np.abs(want).max()

  kernel_errors, xla_errors = [], []
  for g, x, w in zip(jax.tree.leaves(grads), jax.tree.leaves(xla_grads),
                     jax.tree.leaves(f32_grads)):
    kernel_errors.append(rms_error(g, w))
    xla_errors.append(rms_error(x, w))
  kernel_errors, xla_errors = np.array(kernel_errors), np.array(xla_errors)
  assert np.all(kernel_errors < 0.03), kernel_errors.max()   # bf16 rounding, not a wrong gradient
  assert np.all(kernel_errors <= 1.6 * xla_errors + 1e-4)
  assert kernel_errors.mean() <= 1.1 * xla_errors.mean()


@needs_bf16_kernel
def test_bf16_matmul_t5_with_the_bf16_kernel_is_xlas_bf16_path(monkeypatch):
  """A bf16-matmul T5 under dropout with the bf16 kernel (its six attentions' shapes are
  multiples of 32) against XLA's bf16 path and the float32 model, the same masks. The kernel
  rounds where XLA's path rounds, so it follows that path, not float32: leaf by leaf its
  gradients' largest deviation from XLA's bf16 path is under a quarter of that path's own
  distance from float32 (measured: <= 0.09 of it; a bf16 rounding that flips in a summation
  order's last bit still moves a few elements by ~1e-3 of the leaf's scale)."""
  calls, no_calls, (loss, grads), (xla_loss, xla_grads) = _t5_with_and_without_the_kernel(
      monkeypatch, matmul_dtype='bfloat16')
  assert calls == 6 and no_calls == 0
  monkeypatch.delenv(train_attention.SWITCH)
  _, _, (f32_loss, f32_grads), _ = _t5_with_and_without_the_kernel(monkeypatch)
  assert abs(float(loss) - float(xla_loss)) < 0.1 * abs(float(xla_loss) - float(f32_loss))
  for g, x, w in zip(jax.tree.leaves(grads), jax.tree.leaves(xla_grads),
                     jax.tree.leaves(f32_grads)):
    scale = float(jnp.max(jnp.abs(x)))
    from_xla = float(jnp.max(jnp.abs(g - x))) / scale
    xla_from_f32 = float(jnp.max(jnp.abs(x - w))) / scale
    assert from_xla < 1e-2 and from_xla < 0.25 * xla_from_f32, (from_xla, xla_from_f32)


def test_float32_build_names_the_library_that_runs(monkeypatch):
  """float32_build: the AVX-512 build's name where it is preferred and loads, else the AVX2
  build's, None with the kernel off."""
  monkeypatch.setenv(small_dots.ATTENTION_TRAIN_F32_AVX512.switch, '0')
  avx2 = small_dots.loaded(small_dots.ATTENTION_TRAIN_F32) is not None
  assert train_attention.float32_build() == ('attention_train_f32' if avx2 else None)
  monkeypatch.setenv(small_dots.ATTENTION_TRAIN_F32_AVX512.switch, '1')
  wide = small_dots.loaded(small_dots.ATTENTION_TRAIN_F32_AVX512) is not None
  assert train_attention.float32_build() == (
      'attention_train_f32_avx512' if wide else 'attention_train_f32' if avx2 else None)
  monkeypatch.setenv(train_attention.SWITCH, '0')
  assert train_attention.float32_build() is None
