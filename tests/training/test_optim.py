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
