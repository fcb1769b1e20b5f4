"""Optimizers and learning-rate schedules, as the T5 paper trains (§3.1.2, §3.1.3).

Pre-training: AdaFactor with the inverse-square-root schedule 1/sqrt(max(step, warmup)).
Fine-tuning: AdaFactor at a constant 0.001. The AdaFactor settings follow the reference code:
no momentum (beta1 = 0), update clipping 1.0, decay rate 0.8, epsilon1 1e-30, factored second
moments for dimensions of at least 128, updates scaled by the parameter's RMS (epsilon2 1e-3).

jiant's protocol (Wang et al., App. B): AMSGrad, and a learning rate halved on a validation
plateau -- a runtime factor in the optimizer state (`with_lr_scale`) that
t2t.training.validation changes between steps.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import gin
import jax
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
def linear_warmup_decay_schedule(total_steps: int = gin.REQUIRED, peak: float = 1e-4,
                                 warmup_steps: int = 10_000) -> optax.Schedule:
  """BERT's rate (Devlin et al., 2019, App. A.2): linear from 0 to `peak` over `warmup_steps`,
  then linear down to 0 at `total_steps`."""
  if not 0 <= warmup_steps < total_steps:
    raise ValueError("linear_warmup_decay_schedule needs 0 <= warmup_steps < total_steps, got "
                     f"warmup_steps={warmup_steps}, total_steps={total_steps}.")
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup_steps),
       optax.linear_schedule(peak, 0.0, total_steps - warmup_steps)], [warmup_steps])


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


@gin.configurable
def amsgrad(learning_rate: optax.ScalarOrSchedule = 1e-4, b1: float = 0.9, b2: float = 0.999,
            eps: float = 1e-8, grad_clip_norm: float | None = 5.0) -> optax.GradientTransformation:
  """AMSGrad (Reddi et al., 2018), jiant's optimizer for non-BERT models (Wang et al. App. B).

  Adam whose step divides by the running maximum of the (bias-corrected) second moment, so the
  effective step size never grows. Rates in the paper: 1e-4 for classification pre-training,
  1e-3 for generation, 3e-4 for target tasks. jiant clips gradients at global norm 5.
  """
  tx = optax.amsgrad(learning_rate, b1=b1, b2=b2, eps=eps)
  if grad_clip_norm is not None:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx


class LrScaleState(NamedTuple):
  """The runtime learning-rate factor: a float32 scalar the training loop may change."""
  lr_scale: jax.Array


def scale_by_lr_factor() -> optax.GradientTransformation:
  """Multiplies every update by the factor kept in its state (1.0 at init)."""

  def init(params):
    del params
    return LrScaleState(lr_scale=jnp.ones([], jnp.float32))

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u: u * state.lr_scale.astype(u.dtype), updates), state

  return optax.GradientTransformation(init, update)


def with_lr_scale(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
  """`optimizer` followed by a runtime learning-rate factor (for decay on a plateau).

  The factor scales the final updates, so it composes with any optimizer, schedule or
  wrapper (masks, per-group rates): for an optimizer whose update is -lr * d, the result is
  -(lr * factor) * d. Read and change it with `get_lr_scale` / `set_lr_scale`.
  """
  return optax.chain(optimizer, scale_by_lr_factor())


def _is_scale(x: Any) -> bool:
  return isinstance(x, LrScaleState)


def get_lr_scale(opt_state: Any) -> float:
  """The runtime factor of an optimizer state built by `with_lr_scale`."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_scale) if _is_scale(s)]
  if len(found) != 1:
    raise ValueError(f"Expected one learning-rate factor in the optimizer state, found "
                     f"{len(found)}; wrap the optimizer with t2t.training.optim.with_lr_scale.")
  return float(jax.device_get(found[0].lr_scale))


def set_lr_scale(opt_state: Any, value: float) -> Any:
  """A copy of `opt_state` whose runtime factor is `value` (same sharding as before)."""
  get_lr_scale(opt_state)  # exactly one factor

  def replace(s):
    if not _is_scale(s):
      return s
    old = s.lr_scale
    new = jnp.asarray(value, jnp.float32)
    sharding = getattr(old, "sharding", None)
    return LrScaleState(lr_scale=jax.device_put(new, sharding) if sharding is not None else new)

  return jax.tree.map(replace, opt_state, is_leaf=_is_scale)
