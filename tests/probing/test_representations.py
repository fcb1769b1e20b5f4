"""Per-layer states of T5, BERT and BiLSTM checkpoints, pooling by hand, missing-layer errors."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import bert, bilstm, t5_encoder, transformer
from t2t.probing import representations as rep
from t2t.training import checkpoints

VOCAB = 64


def _t5(layers=2):
  return transformer.T5Config(vocab_size=VOCAB, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                              num_encoder_layers=layers, num_decoder_layers=1, dropout_rate=0.0)


def _save(path, params):
  ckpt = checkpoints.Checkpointer(str(path))
  ckpt.save(3, params, {}, {})
  ckpt.close()
  return str(path)


def _tokens():
  return np.array([[5, 6, 7, 0, 0], [9, 10, 11, 12, 13]], np.int32)


def test_pooling_by_hand():
  states = jnp.array([[[1., 2.], [3., -4.], [100., 100.]],
                      [[5., 6.], [0., 0.], [0., 0.]]])
  valid = jnp.array([[True, True, False], [False, False, False]])
  np.testing.assert_allclose(rep.pool(states, valid, "mean"), [[2., -1.], [0., 0.]])
  np.testing.assert_allclose(rep.pool(states, valid, "max"), [[3., 2.], [0., 0.]])
  np.testing.assert_allclose(rep.pool(states, valid, "first"), [[1., 2.], [0., 0.]])
  with pytest.raises(ValueError, match="unknown pooling 'sum'"):
    rep.pool(states, valid, "sum")


def test_layer_names_and_selection():
  assert rep.layer_names(3) == ["embeddings", "layer_1", "layer_2"]
  assert rep.select_layers(["layer_2", 0], 3, "x") == ["layer_2", "embeddings"]
  with pytest.raises(ValueError, match=r"checkpoint c has no layer 'layer_7'; it has 3 states: "
                                       r"embeddings, layer_1, layer_2\."):
    rep.select_layers(["layer_7"], 3, "checkpoint c")


@pytest.mark.parametrize("family", ["t5", "bert", "bilstm"])
def test_states_restored_from_a_checkpoint_equal_the_models(family, tmp_path):
  """A full model's checkpoint (T5 with its decoder, BERT MLM-style scopes, BiLSTM) restores into
  the probed encoder; the pooled features are the pooled states of the original parameters."""
  tokens = _tokens()
  if family == "t5":
    full = transformer.Transformer(_t5())
    params = full.init(jax.random.PRNGKey(1), tokens, tokens[:, :2], enable_dropout=False)["params"]
    encoder = t5_encoder.T5EncoderStates(_t5())
  elif family == "bert":
    config = bert.BertConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2,
                             intermediate_size=32, max_position_embeddings=16)
    encoder = bert.BertEncoderStates(config)
    params = encoder.init(jax.random.PRNGKey(1), tokens, None, False)["params"]
  else:
    config = bilstm.BiLSTMConfig(vocab_size=VOCAB, embed_dim=8, hidden_dim=8, num_layers=2)
    encoder = bilstm.BiLSTMEncoder(config)
    params = encoder.init(jax.random.PRNGKey(1), tokens, None, False)["params"]
  params = nn.unbox(params)
  saved = dict(params, extra_head={"kernel": jnp.ones((3, 3))})  # skipped on restore
  path = _save(tmp_path / family, saved)
  restored, step = rep.load_encoder_params(encoder, path)
  assert step == 3 and "decoder" not in restored and "extra_head" not in restored
  mine = {k: v for k, v in params.items() if k in restored}
  states = encoder.apply({"params": mine}, jnp.asarray(tokens), None, False)
  features = rep.pooled_features(encoder, restored, [tokens[:1], tokens[1:]], None,
                                 ("mean", "first"))
  assert rep.by_layer(features) == rep.layer_names(3)
  valid = jnp.asarray(tokens) > 0
  for i, name in enumerate(rep.layer_names(3)):
    np.testing.assert_allclose(features[(name, "mean")], rep.pool(states[i], valid, "mean"),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(features[(name, "first")], np.asarray(states[i])[:, 0],
                               rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="has no layer 'layer_5'; it has 3 states"):
    rep.pooled_features(encoder, restored, [tokens], ["layer_5"], ("mean",))


def test_a_checkpoint_with_fewer_layers_names_the_layers_it_has(tmp_path):
  tokens = _tokens()
  small = t5_encoder.T5EncoderStates(_t5(layers=2))
  params = nn.unbox(small.init(jax.random.PRNGKey(0), tokens, None, False)["params"])
  path = _save(tmp_path / "two_layers", params)
  with pytest.raises(ValueError, match=r"does not fit the probed encoder \(T5EncoderStates\).*"
                                       r"its encoder has embeddings, layer_1, layer_2\."):
    rep.load_encoder_params(t5_encoder.T5EncoderStates(_t5(layers=4)), path)


def test_pad_tokens_with_a_cls_prefix():
  out = rep.pad_tokens([[4, 5, 6], [7]], 3, prefix=[99])
  np.testing.assert_array_equal(out, [[99, 4, 5], [99, 7, 0]])
