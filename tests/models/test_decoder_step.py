"""Tests for t2t.models.decoder_step (a float32 T5 decoder layer's decoding step in one kernel
call, decoder_step_f32.cc, built for AVX-512F and for AVX2, each tested where the processor runs
it): the kernel against a plain-JAX reference of the layer's step (ReLU and gated GELU, greedy
rows and beams sharing an encoder row, a cache length not a multiple of 8, the slot index clamped
as dynamic_update_slice clamps it); a float32 T5 whose decoding steps' logits agree with the
unfused layers' over a teacher-forced decode, its caches updated the same; and the cases it
leaves to the unfused layer."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t import cpu
from t2t.models import decoder_step, decoding, layers, small_dots
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from tests.models import helpers

@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  for library in (small_dots.F32_AVX512, small_dots.F32_PANELS_AVX2, small_dots.DECODER_STEP_F32):
    monkeypatch.delenv(library.switch, raising=False)
  monkeypatch.delenv(small_dots.SWITCH, raising=False)


@pytest.fixture(params=['avx512', 'avx2'])
def build(request, monkeypatch):
  """The step's build under test: AVX-512F's, or AVX2's (AVX-512F's panels switched off, as on a
  processor without them). Where the processor has the build's instructions and a C++ compiler
  exists it must build and run (a failed build fails the test); elsewhere it is skipped."""
  panels, step = decoder_step._BUILDS[0 if request.param == 'avx512' else 1]
  helpers.use_float32_build(request.param, monkeypatch, step, panels)
  assert decoder_step.step_library() is step
  return step


def _rms(x, scale, eps):
  return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def _reference_step(x, p, k_cache, v_cache, index, self_bias, cross_k, cross_v, cross_bias, *,
                    eps, gated):
  """The layer's step written out in jnp at 'highest' precision (T5 §2.1's pre-norm blocks)."""
  dot = functools.partial(jnp.einsum, precision='highest')
  rows, heads, length, d_kv = k_cache.shape
  beams = rows // cross_k.shape[0]
  own, cross, mlp = p['self_attention'], p['encoder_decoder_attention'], p['mlp']
  h = _rms(x, p['pre_self_attention_layer_norm']['scale'], eps)
  q, k, v = (dot('md,dhk->mhk', h, own[n]['kernel']) for n in ('query', 'key', 'value'))
  slot = jnp.clip(index, 0, length - 1)
  k_cache = jax.lax.dynamic_update_slice(k_cache, k[:, :, None], (0, 0, slot, 0))
  v_cache = jax.lax.dynamic_update_slice(v_cache, v[:, :, None], (0, 0, slot, 0))
  w = jax.nn.softmax(dot('mhk,mhtk->mht', q, k_cache) + self_bias, axis=-1)
  x = x + dot('mhk,hkd->md', dot('mht,mhtk->mhk', w, v_cache), own['out']['kernel'])
  h = _rms(x, p['pre_cross_attention_layer_norm']['scale'], eps)
  q = dot('md,dhk->mhk', h, cross['query']['kernel'])
  keys, values = jnp.repeat(cross_k, beams, axis=0), jnp.repeat(cross_v, beams, axis=0)
  w = jax.nn.softmax(dot('mhk,mhkl->mhl', q, keys) + cross_bias[:, None], axis=-1)
  x = x + dot('mhk,hkd->md', dot('mhl,mhlk->mhk', w, values), cross['out']['kernel'])
  h = _rms(x, p['pre_mlp_layer_norm']['scale'], eps)
  if gated:
    f = (jax.nn.gelu(dot('md,df->mf', h, mlp['wi_0']['kernel']), approximate=True)
         * dot('md,df->mf', h, mlp['wi_1']['kernel']))
  else:
    f = jax.nn.relu(dot('md,df->mf', h, mlp['wi']['kernel']))
  return x + dot('mf,fd->md', f, mlp['wo']['kernel']), k_cache, v_cache


def _layer_operands(seed, rows, enc_rows, heads, d_kv, d_model, d_ff, length, enc_length, gated):
  rng = np.random.default_rng(seed)
  f32 = lambda *shape, s=1.0: jnp.asarray(rng.normal(size=shape) * s, jnp.float32)
  attention = lambda: {'query': {'kernel': f32(d_model, heads, d_kv, s=0.2)},
                       'key': {'kernel': f32(d_model, heads, d_kv, s=0.2)},
                       'value': {'kernel': f32(d_model, heads, d_kv, s=0.2)},
                       'out': {'kernel': f32(heads, d_kv, d_model, s=0.2)}}
  mlp = {'wo': {'kernel': f32(d_ff, d_model, s=0.2)}}
  mlp.update({'wi_0': {'kernel': f32(d_model, d_ff, s=0.2)},
              'wi_1': {'kernel': f32(d_model, d_ff, s=0.2)}} if gated
             else {'wi': {'kernel': f32(d_model, d_ff, s=0.2)}})
  params = {'self_attention': attention(), 'encoder_decoder_attention': attention(), 'mlp': mlp}
  for name in ('pre_self_attention_layer_norm', 'pre_cross_attention_layer_norm',
               'pre_mlp_layer_norm'):
    params[name] = {'scale': 1.0 + f32(d_model, s=0.1)}
  written = np.arange(length)[None, :] < rng.integers(1, length, size=(rows, 1))
  self_bias = f32(1, heads, 1, length, s=0.5) + layers.mask_to_bias(
      jnp.asarray(written)[:, None, None, :])
  valid = np.ones((rows, 1, 1, enc_length), bool)
  valid[-1, ..., enc_length - 16:] = False
  return dict(x=f32(rows, d_model), params=params, k_cache=f32(rows, heads, length, d_kv),
              v_cache=f32(rows, heads, length, d_kv), self_bias=self_bias,
              cross_k=f32(enc_rows, heads, d_kv, enc_length, s=0.3),
              cross_v=f32(enc_rows, heads, enc_length, d_kv),
              cross_bias=layers.mask_to_bias(jnp.asarray(valid)))


@pytest.mark.parametrize('rows,enc_rows,length,index,gated', [
    (8, 8, 64, 5, False),     # a greedy step at T5's d_kv
    (6, 2, 12, 11, True),     # three beams an encoder row; T not a multiple of 8; gated GELU
    (3, 3, 16, 40, False),    # an index past the cache: the last slot, as dynamic_update_slice
])
def test_kernel_matches_the_reference_step(rows, enc_rows, length, index, gated, build):
  ops = _layer_operands(rows + length, rows, enc_rows, heads=3, d_kv=32, d_model=40, d_ff=72,
                        length=length, enc_length=48, gated=gated)
  index = jnp.int32(index)
  with small_dots.weights_reused():
    fn = jax.jit(functools.partial(decoder_step.layer_step, eps=1e-6, gated=gated))
    got = fn(ops['x'], ops['params'], ops['k_cache'], ops['v_cache'], index, ops['self_bias'],
             ops['cross_k'], ops['cross_v'], ops['cross_bias'])
  want = _reference_step(ops['x'], ops['params'], ops['k_cache'], ops['v_cache'], index,
                         ops['self_bias'][..., 0, :], ops['cross_k'], ops['cross_v'],
                         ops['cross_bias'][:, 0, 0, :], eps=1e-6, gated=gated)
  for g, w in zip(got, want):
    assert g.shape == w.shape and g.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=0,
                               atol=2e-5 * float(np.max(np.abs(np.asarray(w)))))
  # Only the slot changed in the caches.
  slot = min(index, length - 1)
  np.testing.assert_array_equal(np.delete(np.asarray(got[1]), slot, axis=2),
                                np.delete(np.asarray(ops['k_cache']), slot, axis=2))


def _teacher_forced_logits(feed_forward_proj: str):
  """A tiny float32 T5's decoding-step logits [steps, rows, vocab] for fixed tokens, and its final
  caches, traced afresh under the kernels' settings of the moment."""
  config = helpers.tiny_config(d_model=64, num_heads=2, d_kv=32, d_ff=96, vocab_size=80,
                               feed_forward_proj=feed_forward_proj)
  module = Transformer(config)
  batch = helpers.seq2seq_batch(seed=3, batch=4, enc_len=32, dec_len=6, vocab=80)
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  forced = jnp.asarray(np.random.default_rng(1).integers(2, 80, size=(4, 7)), jnp.int32)

  def logits_of(tokens_to_logits, cache, batch_size, max_decode_length, rng=None):
    def step(cache, t):
      logits, cache = tokens_to_logits(jax.lax.dynamic_slice_in_dim(forced, t, 1, axis=1), cache)
      return cache, logits
    cache, logits = jax.lax.scan(step, cache, jnp.arange(max_decode_length))
    return logits, cache

  vocab = seqio.PassThroughVocabulary(80)
  model = EncoderDecoderModel(module, vocab, vocab, decode_fn=logits_of)
  inputs = {'encoder_input_tokens': jnp.asarray(batch['encoder_input_tokens'])}
  predict = jax.jit(lambda p, b: model.predict_batch(p, b, max_decode_length=7))
  return predict.lower(params, inputs).as_text(), predict(params, inputs)


@pytest.mark.parametrize('feed_forward_proj', ['relu', 'gated-gelu'])
def test_model_steps_agree_with_the_unfused_layers(feed_forward_proj, build, monkeypatch):
  hlo_on, (logits_on, cache_on) = _teacher_forced_logits(feed_forward_proj)
  monkeypatch.setenv(small_dots.DECODER_STEP_F32.switch, '0')
  hlo_off, (logits_off, cache_off) = _teacher_forced_logits(feed_forward_proj)
  assert hlo_on.count(f'custom_call @{build.targets[0]}(') == 2   # two decoder layers
  assert 'decoder_layer_step' not in hlo_off
  assert logits_on.shape == (7, 4, 80)
  scale = float(np.max(np.abs(np.asarray(logits_off))))
  np.testing.assert_allclose(np.asarray(logits_on), np.asarray(logits_off), rtol=0,
                             atol=2e-5 * scale)
  for a, b in zip(jax.tree.leaves(cache_on), jax.tree.leaves(cache_off)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-4)


def test_beam_search_decodes_the_same_with_and_without_it(build, monkeypatch):
  from tests.models.test_small_dots_f32 import tiny_float32_decode
  decode = tiny_float32_decode(3, vocab_size=72)
  hlo_on, tokens_on = decode()
  monkeypatch.setenv(small_dots.DECODER_STEP_F32.switch, '0')
  _, tokens_off = decode()
  assert f'custom_call @{build.targets[0]}(' in hlo_on
  np.testing.assert_array_equal(np.asarray(tokens_on), np.asarray(tokens_off))


@pytest.mark.parametrize('change', ['bf16', 'shared', 'switch', 'panels_off', 'adapter'])
def test_other_layers_run_unfused(change, monkeypatch):
  """bf16 products, layers shared with the encoder, an adapter and the switches (the step's, or
  both panels' builds, whose layout it reads) keep the unfused layer."""
  overrides = {'bf16': dict(matmul_dtype='bfloat16'), 'adapter': dict(adapter_dim=8),
               'shared': dict(shared_encoder_decoder=True)}.get(change, {})
  config = helpers.tiny_config(d_model=64, num_heads=2, d_kv=32, d_ff=96, vocab_size=80,
                               **overrides)
  if change == 'switch':
    monkeypatch.setenv(small_dots.DECODER_STEP_F32.switch, '0')
  if change == 'panels_off':
    monkeypatch.setenv(small_dots.F32_AVX512.switch, '0')
    monkeypatch.setenv(small_dots.F32_PANELS_AVX2.switch, '0')
  module = Transformer(config)
  batch = helpers.seq2seq_batch(seed=3, batch=2, enc_len=32, dec_len=4, vocab=80)
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  vocab = seqio.PassThroughVocabulary(80)
  model = EncoderDecoderModel(module, vocab, vocab, decode_fn=decoding.greedy_decode)
  inputs = {'encoder_input_tokens': jnp.asarray(batch['encoder_input_tokens'])}
  text = jax.jit(lambda p, b: model.predict_batch(p, b, max_decode_length=4)).lower(
      params, inputs).as_text()
  assert 'decoder_layer_step' not in text


def test_avx2_build_without_avx512_and_none_without_avx2(monkeypatch):
  monkeypatch.setattr(cpu, 'flags', lambda: frozenset({'avx2', 'fma'}))
  if small_dots.unavailable_reason(small_dots.DECODER_STEP_F32_AVX2) is not None:
    pytest.skip('no C++ compiler for the kernels')
  assert decoder_step.unavailable_reason() is None
  assert decoder_step.step_library() is small_dots.DECODER_STEP_F32_AVX2
  monkeypatch.setattr(cpu, 'flags', lambda: frozenset({'sse4_2'}))
  assert 'avx512f' in decoder_step.unavailable_reason()
  assert 'avx2' in decoder_step.unavailable_reason()
  assert decoder_step.step_library() is None


def test_library_builds_and_reports_enabled(build):
  assert small_dots.status()[build.name] == {'enabled': True, 'reason': None}
