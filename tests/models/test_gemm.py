"""Tests for t2t.models.gemm (gemm_f32.cc): the kernel's products with and without transposed
operands against XLA's and by hand, which products get their gradients from it and which do not,
and a float32 T5's loss gradients with the kernel against XLA's."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t import cpu
from t2t.models import gemm, matmuls, small_dots
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from tests.models import helpers

# The kernel needs an x86 CPU with AVX2 and FMA and a C++ compiler; where both exist it must
# build and run (a failed build fails these tests rather than skipping them).
_REASON = gemm.unavailable_reason()
needs_kernel = pytest.mark.skipif(_REASON is not None and 'T2T_' not in _REASON,
                                  reason=f'float32 GEMM kernel unavailable: {_REASON}')


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  monkeypatch.delenv(small_dots.SWITCH, raising=False)
  monkeypatch.delenv(gemm.SWITCH, raising=False)


def _normal(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


@needs_kernel
def test_kernel_builds_and_reports_enabled():
  assert small_dots.status()['gemm_f32'] == {'enabled': True, 'reason': None}


@needs_kernel
@pytest.mark.parametrize('transpose_a', [False, True])
@pytest.mark.parametrize('transpose_b', [False, True])
def test_kernel_by_hand(transpose_a, transpose_b):
  a = np.array([[1., 2.], [3., 4.], [5., 6.]], np.float32)     # [3, 2]
  b = np.array([[7., 8., 9., 10.], [11., 12., 13., 14.]], np.float32)   # [2, 4]
  want = [[29., 32., 35., 38.], [65., 72., 79., 86.], [101., 112., 123., 134.]]
  got = jax.jit(gemm._kernel, static_argnums=(2, 3))(
      jnp.asarray(a.T if transpose_a else a), jnp.asarray(b.T if transpose_b else b),
      transpose_a, transpose_b)
  np.testing.assert_array_equal(np.asarray(got), np.array(want, np.float32))


@needs_kernel
@pytest.mark.parametrize('m,k,n', [
    (13, 37, 29),        # ragged everywhere: edge tiles in rows and columns, K not a multiple
    (200, 530, 2100),    # three blocks of depth (256) and two of columns (2048)
    (1, 8, 1),
])
@pytest.mark.parametrize('transpose_a,transpose_b', [(False, False), (False, True),
                                                     (True, False), (True, True)])
def test_kernel_matches_xla(m, k, n, transpose_a, transpose_b):
  a = _normal(0, (k, m) if transpose_a else (m, k))
  b = _normal(1, (n, k) if transpose_b else (k, n))
  got = jax.jit(gemm._kernel, static_argnums=(2, 3))(a, b, transpose_a, transpose_b)
  want = jnp.matmul(a.T if transpose_a else a, b.T if transpose_b else b, precision='highest')
  assert got.shape == (m, n) and got.dtype == jnp.float32
  # float32 sums in another order: a few ulps of the terms' magnitude (sqrt(k) here).
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=2e-6 * np.sqrt(k) * 8)


_AVX512 = small_dots.unavailable_reason(small_dots.GEMM_F32_AVX512)


@needs_kernel
@pytest.mark.skipif(_AVX512 is not None and 'T2T_' not in _AVX512,
                    reason=f'AVX-512 GEMM unavailable: {_AVX512}')
@pytest.mark.parametrize('m,k,n', [(13, 37, 29), (200, 530, 2100), (97, 300, 65)])
@pytest.mark.parametrize('transpose_a,transpose_b', [(False, False), (True, True), (True, False)])
def test_the_avx512_build_agrees_with_the_avx2_build_to_the_bit(m, k, n, transpose_a, transpose_b,
                                                                monkeypatch):
  """Both builds sum each element of C over k in the same order (per depth block, then the blocks
  in turn), only their tiles differ; so they agree exactly, ragged edges included."""
  a = _normal(10, (k, m) if transpose_a else (m, k))
  b = _normal(11, (n, k) if transpose_b else (k, n))
  got = {}
  for choice in ('1', '0'):
    monkeypatch.setenv(small_dots.GEMM_F32_AVX512.switch, choice)
    build = gemm.library()
    assert build is (small_dots.GEMM_F32_AVX512 if choice == '1' else small_dots.GEMM_F32)
    fn = jax.jit(lambda a, b: gemm._kernel(a, b, transpose_a, transpose_b))
    assert build.targets[0] in fn.lower(a, b).as_text()
    got[choice] = np.asarray(fn(a, b))
  np.testing.assert_array_equal(got['1'], got['0'])


def test_which_build_runs(monkeypatch):
  """T2T_GEMM_AVX512 decides; otherwise the AVX-512 build where the cores run 512-bit FMAs at
  full width: Intel, and AMD from Zen 5 (CPUID family 26) on, not Zen 3 or 4 (family 25)."""
  monkeypatch.setenv(small_dots.GEMM_F32_AVX512.switch, '0')
  assert not gemm.prefers_avx512()
  monkeypatch.setenv(small_dots.GEMM_F32_AVX512.switch, '1')
  assert gemm.prefers_avx512()
  monkeypatch.delenv(small_dots.GEMM_F32_AVX512.switch)
  for vendor, family, wanted in (('GenuineIntel', 6, True), ('AuthenticAMD', 25, False),
                                 ('AuthenticAMD', 26, True), ('AuthenticAMD', None, False),
                                 (None, None, False)):
    monkeypatch.setattr(cpu, 'vendor', lambda vendor=vendor: vendor)
    monkeypatch.setattr(cpu, 'family', lambda family=family: family)
    assert gemm.prefers_avx512() == wanted, (vendor, family)
  monkeypatch.setenv(gemm.SWITCH, '0')
  assert gemm.library() is None


def _loss(spec):
  return lambda a, b: jnp.sum(jnp.sin(matmuls.matmul(spec, a, b, jnp.float32)))


@needs_kernel
@pytest.mark.parametrize('spec,a_shape,b_shape', [
    ('bld,dhk->blhk', (2, 100, 48), (48, 3, 16)),    # a projection into heads
    ('blhk,hkd->bld', (2, 100, 3, 16), (3, 16, 48)),  # the output projection
    ('bld,zd->blz', (2, 70, 32), (1000, 32)),         # tied logits against [vocab, embed]
    ('bld,df->blf', (4, 32, 64), (64, 128)),          # an FFN layer, MIN_ROWS rows exactly
])
@pytest.mark.parametrize('input_gradient_by_kernel', [False, True])
def test_weight_products_get_their_gradients_from_the_kernel(spec, a_shape, b_shape,
                                                             input_gradient_by_kernel,
                                                             monkeypatch):
  monkeypatch.setattr(gemm, 'INPUT_GRADIENT_BY_KERNEL', input_gradient_by_kernel)
  a, b = _normal(2, a_shape), _normal(3, b_shape)
  grad = jax.jit(jax.grad(_loss(spec), argnums=(0, 1)))
  # The weight's gradient is the kernel's; the input's is XLA's dot unless the flag says otherwise.
  assert grad.lower(a, b).as_text().count('t2t_f32_gemm') == (2 if input_gradient_by_kernel else 1)
  input_only = jax.jit(jax.grad(_loss(spec), argnums=0)).lower(a, b).as_text()
  assert ('t2t_f32_gemm' in input_only) == input_gradient_by_kernel
  # The forward product is XLA's own: inference compiles as before.
  assert 't2t_f32_gemm' not in jax.jit(_loss(spec)).lower(a, b).as_text()
  want = jax.grad(lambda a, b: jnp.sum(jnp.sin(jnp.einsum(spec, a, b, precision='highest'))),
                  argnums=(0, 1))(a, b)
  for g, w in zip(grad(a, b), want):
    assert g.shape == w.shape
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0,
                               atol=1e-5 * float(jnp.max(jnp.abs(w))))


@pytest.mark.parametrize('spec,a_shape,b_shape,why', [
    ('bld,df->blf', (2, 63, 64), (64, 128), 'fewer rows than MIN_ROWS'),
    ('bqhd,bkhd->bhqk', (2, 128, 2, 16), (2, 128, 2, 16), "attention's batched product"),
    ('bld,df->blf', (2, 64, 64), (64, 128), 'inside a decoding step'),
])
def test_what_the_kernel_leaves_to_xla(spec, a_shape, b_shape, why):
  a, b = _normal(4, a_shape), _normal(5, b_shape)
  if why == 'inside a decoding step':
    with small_dots.weights_reused():
      assert gemm.dot(spec, a, b) is None
  else:
    assert gemm.dot(spec, a, b) is None
  assert gemm.dot('bld,df->blf', _normal(6, (2, 64, 64)).astype(jnp.bfloat16),
                  _normal(7, (64, 128)).astype(jnp.bfloat16)) is None   # not float32


def test_switch_turns_the_kernel_off(monkeypatch):
  monkeypatch.setenv(gemm.SWITCH, '0')
  assert gemm.unavailable_reason() == 'T2T_GEMM=0'
  assert gemm.dot('bld,df->blf', _normal(8, (2, 64, 64)), _normal(9, (64, 128))) is None


@needs_kernel
def test_float32_t5_gradients_with_and_without_the_kernel(monkeypatch):
  """A float32 T5's loss and gradients (every weight: projections, FFN, tied embedding) with the
  kernel's backward against XLA's, to float32 summation order."""
  config = helpers.tiny_config(d_model=64, num_heads=2, d_kv=32, d_ff=128, vocab_size=64)
  module = Transformer(config)
  batch = helpers.seq2seq_batch(seed=9, batch=4, enc_len=32, dec_len=32, vocab=64)
  vocab = seqio.PassThroughVocabulary(64)
  model = EncoderDecoderModel(module, vocab, vocab)
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  batch = {k: jnp.asarray(v) for k, v in batch.items()}

  def run():   # a new function each time: jax.jit's trace cache would keep the first trace
    fn = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, None)[0]))
    return 't2t_f32_gemm' in fn.lower(params).as_text(), fn(params)

  used, (loss, grads) = run()
  monkeypatch.setenv(gemm.SWITCH, '0')
  unused, (want_loss, want_grads) = run()
  assert used and not unused
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
  for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0,
                               atol=1e-5 * float(jnp.max(jnp.abs(w))) + 1e-9)
