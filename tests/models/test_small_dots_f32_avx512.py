"""Tests for the float32 panel kernels of t2t.models.small_dots (small_dots_f32_avx512.cc, built
for AVX-512F as `F32_AVX512` and for AVX2 as `F32_PANELS_AVX2`): the panel packing by hand, the
panel product against XLA's dot, the packing hoisted out of a decoding loop (each test under both
builds where the processor runs them), the encoder-decoder attention against the unfused one, a
float32 T5 decoding the same tokens with either build and with the NT kernels, and which one a
processor without AVX-512F, or a switch, leaves."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import cpu
from t2t.models import layers, small_dots
from tests.models import helpers
from tests.models.test_small_dots_f32 import (_operands, _reference_cross_attention, _reused_dot,
                                              tiny_float32_decode)

# Where the processor has AVX-512F and a C++ compiler exists the library must build and run (a
# failed build fails these tests); elsewhere (e.g. a Zen 3) only the fallback tests run.
_REASON = small_dots.unavailable_reason(small_dots.F32_AVX512)
needs_kernel = pytest.mark.skipif(_REASON is not None and 'T2T_SMALL_DOTS=0' not in _REASON
                                  and 'T2T_F32_AVX512=0' not in _REASON,
                                  reason=f'AVX-512 float32 kernels unavailable: {_REASON}')


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  """These kernels, with a decoder layer's step left to them (t2t/models/decoder_step.py, whose
  one call would otherwise take the products and attentions of these tests' decodes)."""
  monkeypatch.delenv(small_dots.SWITCH, raising=False)
  monkeypatch.delenv(small_dots.F32_AVX512.switch, raising=False)
  monkeypatch.delenv(small_dots.F32_PANELS_AVX2.switch, raising=False)
  monkeypatch.setenv(small_dots.DECODER_STEP_F32.switch, '0')


@pytest.fixture(params=['avx512', 'avx2'])
def build(request, monkeypatch):
  """The panels' build under test: AVX-512F's, or AVX2's (AVX-512F's switched off, as on a
  processor without it); skipped where the processor cannot run it."""
  library = {'avx512': small_dots.F32_AVX512, 'avx2': small_dots.F32_PANELS_AVX2}[request.param]
  helpers.use_float32_build(request.param, monkeypatch, library)
  assert small_dots.panels_library() is library
  return library


@needs_kernel
def test_library_builds_and_reports_enabled():
  assert small_dots.status()['f32_avx512'] == {'enabled': True, 'reason': None}


@pytest.mark.parametrize('nk', [False, True])
def test_pack_panels_by_hand(nk, build):
  """W [K=3, N=40] (entry 100 k + n): panel 0 holds columns 0..31 row by row, panel 1 columns
  32..39 and 24 zeros a row."""
  w = 100 * np.arange(3)[:, None] + np.arange(40)[None, :]
  packed = np.asarray(jax.jit(functools.partial(small_dots.pack_panels, nk=nk))(
      jnp.asarray(w.T if nk else w, jnp.float32)))
  assert packed.shape == (2, 3, 32)
  np.testing.assert_array_equal(packed[0, 2], 200 + np.arange(32))
  np.testing.assert_array_equal(packed[1, 1, :8], 100 + np.arange(32, 40))
  np.testing.assert_array_equal(packed[1, :, 8:], 0)
  np.testing.assert_array_equal(packed[0, 0, 5], 5)


@pytest.mark.parametrize('spec,a_shape,b_shape', [
    ('abc,cd->abd', (8, 1, 512), (512, 2048)),     # FFN input, one token of a batch of 8
    ('abc,cd->abd', (8, 1, 2048), (2048, 512)),    # FFN output
    ('abc,cd->abd', (1, 1, 64), (64, 12)),         # one row; 12 of a panel's 32 columns
    ('abc,cde->abde', (8, 1, 64), (64, 2, 32)),    # query projection into heads
    ('abcd,cde->abe', (8, 1, 2, 32), (2, 32, 64)), # attention output over (heads, kv)
    ('ab,bc->ac', (64, 24), (24, 36)),             # MAX_ROWS rows (8 tiles of 8); N = 32 + 4
    ('abc,zc->abz', (8, 1, 512), (4004, 512)),     # tied logits against [vocab, embed]
    ('abc,zc->abz', (4, 8, 64), (12, 64)),         # beam search: 32 rows
    ('ab,zb->az', (13, 8), (100, 8)),              # 13 rows: a tile of 8 and one of 5
])
def test_panel_product_matches_xla_dot(spec, a_shape, b_shape, build):
  a, b = _operands(0, a_shape, b_shape)
  fn = _reused_dot(spec)
  text = jax.jit(fn).lower(a, b).as_text()
  assert 't2t_f32_panel_product' in text and 't2t_f32_pack_panels' in text
  assert ('t2t_f32_panel_product_avx2' in text) == (build is small_dots.F32_PANELS_AVX2)
  assert 't2t_f32_nt' not in text and 't2t_f32_transpose' not in text
  got = jax.jit(fn)(a, b)
  want = jnp.einsum(spec, a, b, precision='highest')
  assert got.shape == want.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0,
                             atol=2e-6 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize('spec,b_shape', [('abc,cd->abd', (64, 96)), ('abc,zc->abz', (40, 64))])
def test_panel_product_is_differentiated_as_the_plain_product(spec, b_shape, build):
  a, w = _operands(2, (4, 2, 64), b_shape)
  plain = lambda a, w: jnp.einsum(spec, a, w, precision='highest')
  loss = lambda f: jax.jit(jax.value_and_grad(lambda a, w: jnp.sum(jnp.sin(f(a, w))), (0, 1)))
  assert 't2t_f32_panel_product' in jax.jit(_reused_dot(spec)).lower(a, w).as_text()
  for x, y in zip(jax.tree.leaves(loss(_reused_dot(spec))(a, w)), jax.tree.leaves(loss(plain)(a, w))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('spec', ['mk,kn->mn', 'mk,nk->mn'])
def test_weights_are_packed_once_before_the_loop(spec, build):
  """The packing (a custom call on the weight alone) leaves the loop; its body only multiplies."""
  w = _operands(4, (1, 1), (64, 96) if spec == 'mk,kn->mn' else (96, 64))[1]

  def loop(x, w):
    def body(i, x):
      with small_dots.weights_reused():
        return jnp.tanh(small_dots.dot(spec, x, w))[:, :64]
    return jax.lax.fori_loop(0, 5, body, x)

  x = jnp.asarray(np.random.default_rng(4).normal(size=(8, 64)), jnp.float32)
  compiled = jax.jit(loop).lower(x, w).compile().as_text()
  body_name = re.search(r'body=(%[\w.\-]+)', compiled).group(1)
  body = re.search(re.escape(body_name) + r' .*?\n}', compiled, re.S).group(0)
  assert 't2t_f32_panel_product' in body and 't2t_f32_pack_panels' not in body
  assert 't2t_f32_pack_panels' in compiled
  w_kn = w if spec == 'mk,kn->mn' else w.T
  want = jax.lax.fori_loop(0, 5, lambda i, x: jnp.tanh(jnp.dot(x, w_kn, precision='highest'))[:, :64], x)
  np.testing.assert_allclose(np.asarray(jax.jit(loop)(x, w)), np.asarray(want), atol=1e-5)


@needs_kernel
@pytest.mark.parametrize('b,h,q,d,length,masked', [
    (2, 3, 1, 64, 512, True),    # a greedy step at T5's sizes; tiles of 1 row x 128 columns
    (2, 2, 4, 64, 96, True),     # four beams' queries: 4 rows x 64, then 32 columns
    (1, 1, 3, 32, 32, False),    # three rows, 32 columns, no bias
    (1, 2, 70, 32, 48 + 16, True),   # more query rows than a work item's 64; rows 4 + 2
])
def test_cross_attention_matches_the_unfused_attention(b, h, q, d, length, masked):
  rng = np.random.default_rng(7)
  query = jnp.asarray(rng.normal(size=(b, h, q, d)), jnp.float32)
  key = jnp.asarray(rng.normal(size=(b, h, d, length)) * 0.3, jnp.float32)
  value = jnp.asarray(rng.normal(size=(b, h, length, d)), jnp.float32)
  bias = None
  if masked:
    valid = np.ones((b, 1, 1, length), bool)
    valid[-1, ..., length - 32:] = False
    bias = layers.mask_to_bias(jnp.asarray(valid))
  # A function of this test's own: JAX caches a trace per function, and the kernel is chosen when
  # tracing, so a trace of `small_dots.cross_attention` made under the other library's setting
  # (the same shapes) would be reused.
  fn = jax.jit(lambda *operands: small_dots.cross_attention(*operands))
  assert 't2t_f32_attention_avx512' in fn.lower(query, key, value, bias).as_text()
  got = np.asarray(fn(query, key, value, bias))
  want = np.asarray(_reference_cross_attention(query, key, value, bias))
  assert got.shape == (b, h, q, d)
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.max(np.abs(want))))
  if masked:   # padding gets exactly zero weight
    poisoned = value.at[-1, :, length - 32:].set(1e4)
    np.testing.assert_array_equal(np.asarray(fn(query, key, poisoned, bias)), got)


@needs_kernel
@pytest.mark.parametrize('beams', [1, 3])
def test_float32_model_decodes_the_same_tokens_with_either_build_and_the_nt_kernels(
    beams, monkeypatch):
  decode = tiny_float32_decode(beams, vocab_size=72)   # tied logits: 2 panels + 8 columns
  hlo_512, tokens_512 = decode()
  monkeypatch.setenv(small_dots.F32_AVX512.switch, '0')
  hlo_avx2, tokens_avx2 = decode()
  monkeypatch.setenv(small_dots.F32_PANELS_AVX2.switch, '0')
  hlo_nt, tokens_nt = decode()
  # The decoder's two cached cross-attentions; its products and the tied logits (72 = 2 panels
  # + 8 columns) by panels.
  assert hlo_512.count('custom_call @t2t_f32_attention_avx512') == 2
  assert 't2t_f32_panel_product' in hlo_512 and 't2t_f32_nt' not in hlo_512
  assert 't2t_f32_panel_product_avx2' not in hlo_512
  assert 't2t_f32_panel_product_avx2' in hlo_avx2 and 'avx512' not in hlo_avx2
  assert 't2t_f32_nt' not in hlo_avx2
  assert 't2t_f32_nt' in hlo_nt and 'avx512' not in hlo_nt and 'panel' not in hlo_nt
  assert np.asarray(tokens_512).shape == (4, 8)
  np.testing.assert_array_equal(np.asarray(tokens_512), np.asarray(tokens_avx2))
  np.testing.assert_array_equal(np.asarray(tokens_512), np.asarray(tokens_nt))


def test_a_processor_without_avx512_uses_the_avx2_panels(monkeypatch):
  monkeypatch.setattr(cpu, 'flags', lambda: frozenset({'avx2', 'fma'}))
  assert 'avx512f' in small_dots.unavailable_reason(small_dots.F32_AVX512)
  if small_dots.unavailable_reason(small_dots.F32) is not None:
    pytest.skip('no C++ compiler for the AVX2 kernels either')
  a, w = _operands(1, (8, 64), (64, 96))
  text = jax.jit(_reused_dot('mk,kn->mn')).lower(a, w).as_text()
  assert 't2t_f32_panel_product_avx2' in text and 't2t_f32_nt' not in text
  monkeypatch.setenv(small_dots.F32_PANELS_AVX2.switch, '0')   # then the NT kernels
  text = jax.jit(_reused_dot('mk,kn->mn')).lower(a, w).as_text()
  assert 't2t_f32_nt' in text and 'panel' not in text


def test_switch_turns_the_library_off_alone(monkeypatch):
  monkeypatch.setenv(small_dots.F32_AVX512.switch, '0')
  assert small_dots.unavailable_reason(small_dots.F32_AVX512) == 'T2T_F32_AVX512=0'
  assert small_dots.status()['f32_avx512'] == {'enabled': False, 'reason': 'T2T_F32_AVX512=0'}
  assert small_dots.unavailable_reason(small_dots.F32) != 'T2T_F32_AVX512=0'
