"""The jiant BiLSTM encoder: a numpy LSTM reference, padding invariance, parameter paths."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from t2t.models import bilstm

CONFIG = bilstm.BiLSTMConfig(vocab_size=20, embed_dim=6, hidden_dim=5, num_layers=2,
                             dropout_rate=0.0)


def _numpy_lstm(x, w_x, w_h, b):
  h = np.zeros(w_h.shape[0])
  c = np.zeros(w_h.shape[0])
  sig = lambda z: 1 / (1 + np.exp(-z))
  out = []
  for x_t in x:
    i, f, g, o = np.split(x_t @ w_x + h @ w_h + b, 4)
    c = sig(f) * c + sig(i) * np.tanh(g)
    h = sig(o) * np.tanh(c)
    out.append(h)
  return np.stack(out)


def test_reverse_valid_keeps_padding_in_place():
  x = np.array([[1, 2, 3, 0], [4, 5, 0, 0]])
  np.testing.assert_array_equal(bilstm.reverse_valid(x, np.array([3, 2])),
                                [[3, 2, 1, 0], [5, 4, 0, 0]])


def test_bilstm_layer_matches_numpy_lstm_in_both_directions():
  layer = bilstm.BiLSTMLayer(hidden_dim=3)
  x = np.random.RandomState(0).randn(1, 5, 4).astype(np.float32)
  valid = np.array([[True, True, True, False, False]])
  params = nn.unbox(layer.init(jax.random.PRNGKey(0), x, valid)['params'])
  out = np.asarray(layer.apply({'params': params}, x, valid))
  p = jax.tree.map(np.asarray, params)
  fwd = _numpy_lstm(x[0, :3], p['forward']['input_kernel'], p['forward']['recurrent_kernel'],
                    p['forward']['bias'])
  # The backward LSTM starts at the last real token (index 2), not at the padding.
  bwd = _numpy_lstm(x[0, 2::-1], p['backward']['input_kernel'], p['backward']['recurrent_kernel'],
                    p['backward']['bias'])[::-1]
  np.testing.assert_allclose(out[0, :3], np.concatenate([fwd, bwd], -1), rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(out[0, 3:], 0.0)
  assert p['forward']['bias'][3:6].tolist() == [1.0, 1.0, 1.0]  # forget-gate bias 1


def test_encoder_outputs_do_not_depend_on_padding():
  encoder = bilstm.BiLSTMEncoder(CONFIG)
  short = np.array([[3, 7, 9, 1], [4, 1, 0, 0]], np.int32)
  padded = np.concatenate([short, np.zeros((2, 3), np.int32)], axis=1)
  params = nn.unbox(encoder.init(jax.random.PRNGKey(0), padded)['params'])
  states_short = encoder.apply({'params': params}, short)
  states_padded = encoder.apply({'params': params}, padded)
  assert [s.shape for s in states_padded] == [(2, 7, 6), (2, 7, 10), (2, 7, 16)]
  for a, b in zip(states_short, states_padded):
    np.testing.assert_allclose(a, b[:, :4], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b[:, 4:], 0.0)
  # Row 1's real tokens see nothing of what follows them.
  np.testing.assert_array_equal(states_short[-1][1, 2:], 0.0)


def test_parameter_paths_and_logical_axes():
  encoder = bilstm.BiLSTMEncoder(CONFIG)
  variables = encoder.init(jax.random.PRNGKey(0), np.ones((1, 3), np.int32))
  specs = nn.get_partition_spec(variables)['params']
  assert sorted(specs) == ['embedder', 'encoder']
  assert sorted(specs['encoder']) == ['layers_0', 'layers_1']
  assert tuple(specs['embedder']['embedding']) == ('vocab', 'embed')
  lstm = specs['encoder']['layers_1']['backward']
  assert tuple(lstm['input_kernel']) == ('embed', 'lstm_gates')
  assert tuple(lstm['recurrent_kernel']) == ('lstm_hidden', 'lstm_gates')
  assert variables['params']['encoder']['layers_1']['forward']['input_kernel'].value.shape == (
      10, 20)


def test_cross_sentence_attention_hand_computed():
  attention = bilstm.CrossSentenceAttention()
  a = np.array([[[1., 0.], [0., 1.]]], np.float32)
  b = np.array([[[2., 0.], [0., 3.], [9., 9.]]], np.float32)
  valid_a = np.array([[True, True]])
  valid_b = np.array([[True, True, False]])
  params = {'kernel': np.eye(2, dtype=np.float32)}
  a_out, b_out = attention.apply({'params': params}, a, valid_a, b, valid_b)
  # a_0 scores b_0: 2, b_1: 0 (b_2 is padding) -> weights softmax(2, 0).
  w = np.exp([2., 0.]) / np.exp([2., 0.]).sum()
  np.testing.assert_allclose(a_out[0, 0], [1., 0., *(w[0] * b[0, 0] + w[1] * b[0, 1])], rtol=1e-5)
  assert b_out.shape == (1, 3, 4)
  np.testing.assert_array_equal(b_out[0, 2], 0.0)


def test_config_rejects_bad_sizes():
  with pytest.raises(ValueError, match='hidden_dim'):
    bilstm.BiLSTMConfig(vocab_size=10, hidden_dim=0)


def test_bilstm_gin_pair_model_with_cross_attention_has_the_documented_paths():
  from t2t import config
  from t2t.models import classifier_api
  from t2t.training import checkpoints
  config.parse_gin(['models/bilstm/tiny.gin', 'models/bilstm/head_small.gin'],
                   ["MIXTURE_OR_TASK_NAME = 'bbc_topic'", "ClassifierModel.labels = ['a', 'b']",
                    "ClassifierModel.encoding = 'separate'",
                    'ClassifierHead.pair_interaction = @CrossSentenceAttention()'])
  model = classifier_api.ClassifierModel()  # gin supplies every argument
  shapes = jax.eval_shape(lambda rng: model.get_initial_variables(
      rng, {'encoder_input_tokens': (2, 8)})['params'], jax.random.PRNGKey(0))
  paths = checkpoints.param_shapes(nn.unbox(shapes))
  width = 2 * 32 + 32  # last BiLSTM layer (2 x 32) + the skipped embeddings (32)
  assert paths['embedder/embedding'] == [8192, 32]
  assert paths['encoder/layers_1/backward/recurrent_kernel'] == [32, 128]
  assert paths['head/pair_interaction/kernel'] == [width, width]
  assert paths['head/pool_projection/kernel'] == [2 * width, 64]
  assert paths['head/mlp/hidden/kernel'] == [4 * 64, 128]  # head_small: hidden 128
  assert paths['head/mlp/output/kernel'] == [128, 2]


# ----------------------------------------------------------------------------- adaptation options
def test_adapters_after_each_layer_start_as_identity():
  import dataclasses
  tokens = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], np.int32)
  base = bilstm.BiLSTMEncoder(CONFIG)
  adapted = bilstm.BiLSTMEncoder(dataclasses.replace(CONFIG, adapter_dim=3))
  params = nn.unbox(base.init(jax.random.PRNGKey(0), tokens)['params'])
  boxed = adapted.init(jax.random.PRNGKey(0), tokens)['params']
  full = nn.unbox(boxed)
  wi = boxed['encoder']['layers_1']['adapter']['wi']['kernel']
  assert wi.names == ('embed', 'adapter') and wi.value.shape == (10, 3)
  for i in range(2):
    assert set(full['encoder'][f'layers_{i}']) == {'forward', 'backward', 'adapter'}
    np.testing.assert_array_equal(full['encoder'][f'layers_{i}']['adapter']['wo']['kernel'], 0.0)
  # Zero up-projection: the adapted encoder computes the base encoder's states exactly.
  merged = jax.tree.map(lambda x: x, full)
  for i in range(2):
    merged['encoder'][f'layers_{i}'].update(params['encoder'][f'layers_{i}'])
  merged['embedder'] = params['embedder']
  for a, b in zip(adapted.apply({'params': merged}, tokens),
                  base.apply({'params': params}, tokens)):
    np.testing.assert_array_equal(a, b)
  # A trained adapter changes the states but keeps padding at zero.
  merged['encoder']['layers_0']['adapter']['wo']['kernel'] = np.ones((3, 10), np.float32)
  moved = adapted.apply({'params': merged}, tokens)
  assert not np.allclose(moved[-1], base.apply({'params': params}, tokens)[-1])
  np.testing.assert_array_equal(moved[1][tokens == 0], 0.0)


def test_prompt_is_read_by_the_forward_lstm_before_the_sentence():
  """Hand check against the numpy LSTM: layer 1's forward half runs over [prompt; sentence], its
  backward half over the sentence alone (it reaches the prompt only after it)."""
  import dataclasses
  config = dataclasses.replace(CONFIG, num_prompt_tokens=2)
  encoder = bilstm.BiLSTMEncoder(config)
  tokens = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], np.int32)
  boxed = encoder.init(jax.random.PRNGKey(0), tokens)['params']
  assert boxed['prompt']['embedding'].names == ('prompt', 'embed')
  params = jax.tree.map(np.asarray, nn.unbox(boxed))
  states = [np.asarray(s) for s in encoder.apply({'params': params}, tokens)]
  assert [s.shape for s in states] == [(2, 4, 6), (2, 4, 10), (2, 4, 16)]  # prompt dropped
  prompt, table = params['prompt']['embedding'], params['embedder']['embedding']
  layer = params['encoder']['layers_0']
  lstm = lambda d, x: _numpy_lstm(x, layer[d]['input_kernel'], layer[d]['recurrent_kernel'],
                                  layer[d]['bias'])
  for row, n in ((0, 3), (1, 2)):
    emb = table[tokens[row, :n]]
    fwd = lstm('forward', np.concatenate([prompt, emb]))[2:]
    bwd = lstm('backward', emb[::-1])[::-1]
    np.testing.assert_allclose(states[1][row, :n], np.concatenate([fwd, bwd], -1), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_array_equal(states[1][row, n:], 0.0)
  np.testing.assert_allclose(states[0][tokens > 0], table[tokens[tokens > 0]], atol=1e-6)
  with pytest.raises(ValueError, match='BiLSTMConfig.num_prompt_tokens must be a non-negative'):
    dataclasses.replace(CONFIG, num_prompt_tokens=-1)
  with pytest.raises(ValueError, match='BiLSTMConfig.adapter_dim must be a non-negative'):
    dataclasses.replace(CONFIG, adapter_dim=1.5)
