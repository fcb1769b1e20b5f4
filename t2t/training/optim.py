"""Optimizers and learning-rate schedules, as the T5 paper trains (§3.1.2, §3.1.3).

Pre-training: AdaFactor with the inverse-square-root schedule 1/sqrt(max(step, warmup)).
Fine-tuning: AdaFactor at a constant 0.001. The AdaFactor settings follow the reference code:
no momentum (beta1 = 0), update clipping 1.0, decay rate 0.8, epsilon1 1e-30, factored second
moments for dimensions of at least 128, updates scaled by the parameter's RMS (epsilon2 1e-3).
"""
from __future__ import annotations

import gin
import jax.numpy as jnp
import optax


@gin.configurable
def inverse_sqrt_schedule(warmup_steps: int = 10_000, scale: float = 1.0) -> optax.Schedule:
  """scale / sqrt(max(step, warmup_steps)): constant for `warmup_steps`, then decaying."""
  if warmup_steps < 1:
    raise ValueError(f"inverse_sqrt_schedule.warmup_steps must be >= 1, got {warmup_steps}.")

  def schedule(step):
    return scale * jnp.reciprocal(jnp.sqrt(jnp.maximum(step, warmup_steps).astype(jnp.float32)))
  return schedule


@gin.configurable
def constant_schedule(value: float = 1e-3) -> optax.Schedule:
  """The fine-tuning rate of the paper: 0.001 throughout."""
  return optax.constant_schedule(value)


@gin.configurable
def adafactor(learning_rate: optax.ScalarOrSchedule = 1e-3,
              decay_rate: float = 0.8,
              clipping_threshold: float | None = 1.0,
              momentum: float | None = None,
              multiply_by_parameter_scale: bool = True,
              min_dim_size_to_factor: int = 128,
              epsilon1: float = 1e-30,
              weight_decay_rate: float | None = None) -> optax.GradientTransformation:
  """AdaFactor with the T5 reference settings (see module docstring)."""
  return optax.adafactor(
      learning_rate=learning_rate,
      min_dim_size_to_factor=min_dim_size_to_factor,
      decay_rate=decay_rate,
      multiply_by_parameter_scale=multiply_by_parameter_scale,
      clipping_threshold=clipping_threshold,
      momentum=momentum,
      eps=epsilon1,
      factored=True,
      weight_decay_rate=weight_decay_rate)


@gin.configurable
def adamw(learning_rate: optax.ScalarOrSchedule = 1e-4, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8, weight_decay: float = 0.0,
          grad_clip_norm: float | None = None) -> optax.GradientTransformation:
  """AdamW (with optional global-norm clipping), for the BERT-style protocols."""
  tx = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
  if grad_clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx
