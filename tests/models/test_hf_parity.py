"""Parity with Hugging Face's PyTorch T5: same config and weights -> same logits and greedy outputs.

Small random HF models are built offline (nothing is downloaded): T5 v1.0 (ReLU, tied embeddings with
output rescaling) and T5 v1.1 (gated-GELU, untied output head). Dropout off, float32.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from t2t.models import hf_interop  # noqa: E402
from t2t.models import layers  # noqa: E402
from t2t.models.api import EncoderDecoderModel  # noqa: E402
from t2t.models.transformer import Transformer  # noqa: E402

import seqio  # noqa: E402

VOCAB = 40
VARIANTS = {
    'v1_0': dict(feed_forward_proj='relu', tie_word_embeddings=True),
    'v1_1': dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False),
}


def _generate(model, enc, length):
  # use_cache=False: this transformers release sizes its decoder cache by the encoder's layer count,
  # which breaks on our deliberately asymmetric 2+3 layers; the uncached HF path is the reference.
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                         use_cache=False, do_sample=False, num_beams=1, max_new_tokens=length,
                         min_length=0, decoder_start_token_id=0, eos_token_id=1, pad_token_id=0)
  return out.numpy()[:, 1:]  # drop the decoder start token


def _hf_model(variant: str, lively: bool = False):
  """A random HF T5; `lively` rescales it so greedy outputs vary and rows end at different steps."""
  torch.manual_seed(0)
  tied = VARIANTS[variant]['tie_word_embeddings']
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=24, d_kv=6, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=3,
      relative_attention_num_buckets=16, relative_attention_max_distance=20, dropout_rate=0.0,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **VARIANTS[variant])
  model = transformers.T5ForConditionalGeneration(config).eval()
  if not tied and model.lm_head.weight is model.shared.weight:
    # Recent transformers tie lm_head on construction whatever the config says; give v1.1 its own.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 24) * 24 ** -0.5)
  if not lively:
    return model
  head = model.shared if tied else model.lm_head
  with torch.no_grad():
    # A livelier random model (at HF's init a tied model repeats one token). Then EOS takes over a
    # token c that the model emits, but never first: rows containing c end there, at various steps.
    # (The batch has no EOS in its inputs, so changing EOS's embedding changes nothing upstream.)
    for name, param in model.named_parameters():
      if 'layer_norm' not in name and param is not head.weight and param is not model.shared.weight:
        param.mul_(4.0)
    head.weight[0] = 0.0
    out = _generate(model, _batch()[0], 10)
    candidates = [t for t in range(2, VOCAB) if t not in out[:, 0] and (out == t).any()]
    common = max(candidates, key=lambda t: ((out == t).any(axis=1).sum(), -t))
    head.weight[1] = head.weight[common] * 1.05
  return model


def _batch():
  enc = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
                   27, 28, 29, 30, 31, 32],                     # longer than max_distance
                  [10, 11, 12, 13] + [0] * 24,                 # heavy padding
                  [3, 4, 5, 6, 7, 8, 9, 10] + [0] * 20], np.int64)
  dec = np.array([[0, 12, 13, 14, 15, 16, 1, 0], [0, 15, 1, 0, 0, 0, 0, 0],
                  [0, 2, 3, 4, 5, 6, 7, 8]], np.int64)
  return enc, dec


@pytest.fixture(scope='module', params=sorted(VARIANTS))
def converted(request):
  hf = _hf_model(request.param)
  config = hf_interop.t5_config_from_hf(hf.config)
  params = hf_interop.params_from_hf(hf, config)
  return request.param, hf, config, params


def test_config_conversion(converted):
  variant, hf, config, _ = converted
  assert config.feed_forward_proj == VARIANTS[variant]['feed_forward_proj']
  assert config.tie_word_embeddings == VARIANTS[variant]['tie_word_embeddings']
  assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 3)
  assert (config.relative_attention_num_buckets, config.relative_attention_max_distance) == (16, 20)
  back = hf_interop.hf_config_from_t5(config)
  assert hf_interop.t5_config_from_hf(back) == config


def test_logits_match(converted):
  _, hf, config, params = converted
  enc, dec = _batch()
  with torch.no_grad():
    expected = hf(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                  decoder_input_ids=torch.tensor(dec)).logits.numpy()
  got = Transformer(config).apply({'params': params}, jnp.asarray(enc, jnp.int32),
                                  jnp.asarray(dec, jnp.int32), enable_dropout=False)
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_greedy_matches_generate(variant):
  hf = _hf_model(variant, lively=True)
  config = hf_interop.t5_config_from_hf(hf.config)
  params = hf_interop.params_from_hf(hf, config)
  enc, _ = _batch()
  length = 10
  hf_out = _generate(hf, enc, length)
  hf_out = np.pad(hf_out, ((0, 0), (0, length - hf_out.shape[1])))  # HF stops when all rows end
  vocab = seqio.PassThroughVocabulary(VOCAB)
  model = EncoderDecoderModel(Transformer(config), vocab, vocab)
  ours = jax.jit(model.predict_batch, static_argnames='max_decode_length')(
      params, {'encoder_input_tokens': jnp.asarray(enc, jnp.int32)}, max_decode_length=length)
  np.testing.assert_array_equal(np.asarray(ours), hf_out)
  ended = (hf_out == 1).any(axis=1)
  assert ended.any() and (hf_out[:, -1] == 0).any()  # EOS reached early, padding after it compared


def test_round_trips_are_exact(converted):
  _, hf, config, params = converted
  state = hf_interop.params_to_hf(params, config)
  hf_state = {k: v.numpy() for k, v in hf.state_dict().items()}
  assert set(state) == set(hf_state)
  for key, value in hf_state.items():
    np.testing.assert_array_equal(state[key], value, err_msg=key)
  again = hf_interop.params_from_hf(state, config)
  flat_a = jax.tree_util.tree_flatten_with_path(params)[0]
  flat_b = jax.tree_util.tree_flatten_with_path(again)[0]
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, a), (_, b) in zip(flat_a, flat_b):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def test_param_tree_matches_module(converted):
  _, _, config, params = converted
  enc, dec = _batch()
  module = Transformer(config)
  abstract = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), jnp.asarray(enc, jnp.int32),
                                                jnp.asarray(dec, jnp.int32), enable_dropout=False))
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  shapes = jax.tree_util.tree_map(lambda x: x.shape, nn.unbox(abstract)['params'])
  assert shapes == jax.tree_util.tree_map(lambda x: x.shape, params)


def test_export_to_hf_model(converted):
  _, hf, config, params = converted
  rebuilt = hf_interop.hf_model_from_t5(params, config)
  enc, dec = _batch()
  with torch.no_grad():
    kwargs = dict(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                  decoder_input_ids=torch.tensor(dec))
    np.testing.assert_array_equal(rebuilt(**kwargs).logits.numpy(), hf(**kwargs).logits.numpy())


@pytest.mark.parametrize('bidirectional', [True, False])
@pytest.mark.parametrize('num_buckets,max_distance', [(32, 128), (16, 20)])
def test_buckets_match_hf(bidirectional, num_buckets, max_distance):
  rp = np.arange(-3000, 3001)
  expected = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
      torch.tensor(rp), bidirectional=bidirectional, num_buckets=num_buckets,
      max_distance=max_distance).numpy()
  got = layers.relative_position_bucket(rp, bidirectional=bidirectional, num_buckets=num_buckets,
                                        max_distance=max_distance)
  np.testing.assert_array_equal(got, expected)


def test_refuses_other_architectures_and_bad_weights():
  with pytest.raises(ValueError, match='model_type'):
    hf_interop.t5_config_from_hf(transformers.BertConfig())
  with pytest.raises(ValueError, match='feed_forward_proj'):
    hf_interop.t5_config_from_hf(transformers.T5Config(feed_forward_proj='gated-silu'))
  hf = _hf_model('v1_0')
  config = hf_interop.t5_config_from_hf(hf.config)
  state = dict(hf.state_dict())
  del state['decoder.block.1.layer.1.EncDecAttention.k.weight']
  with pytest.raises(ValueError, match='EncDecAttention.k.weight'):
    hf_interop.params_from_hf(state, config)
  with pytest.raises(ValueError, match='shape'):
    hf_interop.params_from_hf(hf, hf_interop.t5_config_from_hf(hf.config, d_ff=41))
  untied = dict(hf.state_dict(), **{'lm_head.weight': torch.zeros(VOCAB, 24)})
  with pytest.raises(ValueError, match='tie_word_embeddings=False'):
    hf_interop.params_from_hf(untied, config)
