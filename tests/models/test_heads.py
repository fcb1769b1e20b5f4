"""Heads on hand-computed cases: pooling, the pair combination, the scalar mix, jiant's MLP."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import heads


STATES = np.array([[[1., -2.], [3., 0.], [9., 9.]],      # row 0: 2 real tokens, 1 padding
                   [[-1., -1.], [-3., 5.], [2., -4.]]], np.float32)
VALID = np.array([[True, True, False], [True, True, True]])


def test_pooling_ignores_padding():
  np.testing.assert_allclose(heads.pool(STATES, VALID, 'max'), [[3., 0.], [2., 5.]])
  np.testing.assert_allclose(heads.pool(STATES, VALID, 'mean'), [[2., -1.], [-2 / 3, 0.]],
                             rtol=1e-6)
  np.testing.assert_allclose(heads.pool(STATES, VALID, 'first'), [[1., -2.], [-1., -1.]])
  # An all-padding row pools to zeros rather than -inf.
  np.testing.assert_allclose(heads.pool(STATES, np.zeros_like(VALID), 'max'), np.zeros((2, 2)))
  with pytest.raises(ValueError, match='Unknown pooling'):
    heads.pool(STATES, VALID, 'min')


def test_combine_pair_hand_computed():
  u = np.array([[1., -2.]], np.float32)
  v = np.array([[3., 4.]], np.float32)
  np.testing.assert_allclose(heads.combine_pair(u, v), [[1., -2., 3., 4., 2., 6., 3., -8.]])
  with pytest.raises(ValueError, match='equal shapes'):
    heads.combine_pair(u, np.ones((1, 3)))


def test_scalar_mix_hand_computed():
  layers = [np.full((1, 2, 3), k, np.float32) for k in (1., 2., 4.)]
  mix = heads.ScalarMix(num_layers=3)
  params = nn.unbox(mix.init(jax.random.PRNGKey(0), layers)['params'])
  # Initially an even mix with gamma 1: (1 + 2 + 4) / 3.
  np.testing.assert_allclose(mix.apply({'params': params}, layers), np.full((1, 2, 3), 7 / 3),
                             rtol=1e-6)
  # w = (0, ln 2, ln 5): s = (1/8, 2/8, 5/8); gamma 2 -> 2 * (1/8 + 4/8 + 20/8) = 6.25.
  params = {'weights': jnp.log(jnp.array([1., 2., 5.])), 'gamma': jnp.array(2.)}
  np.testing.assert_allclose(mix.apply({'params': params}, layers), np.full((1, 2, 3), 6.25),
                             rtol=1e-5)
  with pytest.raises(ValueError, match='same shape'):
    mix.apply({'params': params}, layers[:2] + [np.ones((1, 2, 5), np.float32)])


def test_mlp_classifier_is_linear_tanh_layernorm_linear():
  mlp = heads.MLPClassifier(num_outputs=2, hidden_dim=3, dropout_rate=0.5)
  x = np.array([[0.5, -1.0]], np.float32)
  params = nn.unbox(mlp.init(jax.random.PRNGKey(1), x)['params'])
  assert sorted(params) == ['hidden', 'layer_norm', 'output']
  h = np.tanh(x @ np.asarray(params['hidden']['kernel']) + np.asarray(params['hidden']['bias']))
  h = (h - h.mean()) / np.sqrt(h.var() + 1e-6)
  expected = h @ np.asarray(params['output']['kernel'])
  np.testing.assert_allclose(mlp.apply({'params': params}, x), expected, rtol=1e-4, atol=1e-5)
  # Dropout only when enabled.
  dropped = mlp.apply({'params': params}, x, enable_dropout=True,
                      rngs={'dropout': jax.random.PRNGKey(2)})
  assert dropped.shape == (1, 2)


def test_pair_head_and_logical_axes():
  head = heads.ClassifierHead(num_outputs=3, hidden_dim=4, pooling='projected_max',
                              projection_dim=5)
  variables = head.init(jax.random.PRNGKey(0), STATES, VALID, STATES[::-1], VALID[::-1])
  specs = jax.tree.map(tuple, nn.get_partition_spec(variables)['params'])
  assert specs['pool_projection']['kernel'] == ('embed', 'mlp')
  assert specs['mlp']['hidden']['kernel'] == ('embed', 'mlp')
  assert variables['params']['mlp']['hidden']['kernel'].value.shape == (4 * 5, 4)
  assert specs['mlp']['output']['kernel'] == ('mlp', 'classes')
  logits = head.apply(nn.unbox(variables), STATES, VALID, STATES[::-1], VALID[::-1])
  assert logits.shape == (2, 3)


def test_regression_head_returns_one_score_per_example():
  head = heads.ClassifierHead(num_outputs=1, regression=True, hidden_dim=4)
  variables = nn.unbox(head.init(jax.random.PRNGKey(0), STATES, VALID))
  assert head.apply(variables, STATES, VALID).shape == (2,)
  with pytest.raises(ValueError, match='one output'):
    heads.ClassifierHead(num_outputs=2, regression=True).init(jax.random.PRNGKey(0), STATES, VALID)
