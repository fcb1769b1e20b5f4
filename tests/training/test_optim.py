"""Tests for t2t/training/optim.py."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.training import optim


def test_inverse_sqrt_schedule_is_constant_then_decays():
  schedule = optim.inverse_sqrt_schedule(warmup_steps=100)
  np.testing.assert_allclose(schedule(0), 0.1, rtol=1e-6)
  np.testing.assert_allclose(schedule(100), 0.1, rtol=1e-6)
  np.testing.assert_allclose(schedule(400), 0.05, rtol=1e-6)
  # The paper's pre-training rate: 1/sqrt(max(n, 10^4)).
  np.testing.assert_allclose(optim.inverse_sqrt_schedule()(40_000), 1 / 200, rtol=1e-6)


def test_inverse_sqrt_schedule_rejects_bad_warmup():
  with pytest.raises(ValueError, match="warmup_steps"):
    optim.inverse_sqrt_schedule(warmup_steps=0)


def test_constant_schedule():
  assert float(optim.constant_schedule()(12345)) == pytest.approx(1e-3)


@pytest.mark.parametrize("make", [lambda: optim.adafactor(learning_rate=0.1),
                                  lambda: optim.adamw(learning_rate=0.01, grad_clip_norm=1.0)])
def test_optimizers_minimise_a_least_squares_problem(make):
  rng = np.random.default_rng(0)
  # Fewer equations than unknowns: zero loss is reachable. m (128x128) is factored.
  a = jnp.asarray(rng.normal(size=(64, 128)), jnp.float32)
  target = jnp.asarray(rng.normal(size=(64,)), jnp.float32)
  params = {"w": jnp.zeros((128,)), "m": jnp.full((128, 128), 0.01)}

  def loss(p):
    return jnp.mean((a @ (p["m"] @ p["w"] + p["w"]) - target) ** 2)

  tx = make()
  state = tx.init(params)
  start = loss(params)

  @jax.jit
  def step(p, s):
    updates, s = tx.update(jax.grad(loss)(p), s, p)
    return optax.apply_updates(p, updates), s

  for _ in range(100):
    params, state = step(params, state)
  assert loss(params) < 0.2 * start


def test_amsgrad_keeps_the_largest_second_moment():
  """Two steps on a scalar, by hand (b1 0.9, b2 0.999, lr 1): g = 1 then g = 0.1.

  Step 1: m_hat = 1, v_hat = 1 -> update -1. Step 2: m = 0.1 -> m_hat = 0.1 / 0.19 = 0.526316;
  v = 0.001009 -> v_hat = 0.504752, but the maximum stays 1 -> update -0.526316
  (Adam would take -0.526316 / sqrt(0.504752) = -0.740810).
  """
  tx = optim.amsgrad(learning_rate=1.0, grad_clip_norm=None)
  params = {"w": jnp.zeros(())}
  state = tx.init(params)
  u1, state = tx.update({"w": jnp.asarray(1.0)}, state, params)
  u2, state = tx.update({"w": jnp.asarray(0.1)}, state, params)
  np.testing.assert_allclose(u1["w"], -1.0, rtol=1e-5)
  np.testing.assert_allclose(u2["w"], -0.1 / 0.19, rtol=1e-5)
  adam = optax.adam(1.0)
  s = adam.init(params)
  _, s = adam.update({"w": jnp.asarray(1.0)}, s, params)
  a2, _ = adam.update({"w": jnp.asarray(0.1)}, s, params)
  np.testing.assert_allclose(a2["w"], -0.740810, rtol=1e-5)


def test_lr_scale_multiplies_the_updates_of_any_optimizer():
  base = optax.multi_transform({"train": optax.sgd(0.1), "frozen": optax.set_to_zero()},
                               {"a": "train", "b": "frozen"})
  tx = optim.with_lr_scale(base)
  params = {"a": jnp.ones(3), "b": jnp.ones(3)}
  grads = {"a": jnp.full(3, 2.0), "b": jnp.full(3, 2.0)}
  state = tx.init(params)
  assert optim.get_lr_scale(state) == 1.0
  updates, _ = tx.update(grads, state, params)
  np.testing.assert_allclose(updates["a"], -0.2)
  state = optim.set_lr_scale(state, 0.5)
  assert optim.get_lr_scale(state) == 0.5
  updates, state = tx.update(grads, state, params)
  np.testing.assert_allclose(updates["a"], -0.1)
  np.testing.assert_allclose(updates["b"], 0.0)
  assert optim.get_lr_scale(state) == 0.5  # the update keeps the factor


def test_lr_scale_missing_is_a_clear_error():
  with pytest.raises(ValueError, match="with_lr_scale"):
    optim.get_lr_scale(optax.sgd(0.1).init({"a": jnp.ones(2)}))


def test_linear_warmup_decay_schedule_by_hand():
  # peak 1e-4, 10 warmup steps, 30 in all: 0 -> 1e-4 over steps 0..10, then 1e-4 -> 0 by step 30.
  s = optim.linear_warmup_decay_schedule(total_steps=30, peak=1e-4, warmup_steps=10)
  for step, want in [(0, 0.0), (5, 5e-5), (10, 1e-4), (20, 5e-5), (25, 2.5e-5), (30, 0.0),
                     (40, 0.0)]:
    np.testing.assert_allclose(float(s(step)), want, atol=1e-12, err_msg=str(step))
  with pytest.raises(ValueError, match="warmup_steps=30, total_steps=30"):
    optim.linear_warmup_decay_schedule(total_steps=30, warmup_steps=30)
