"""The train step and the training loop.

`train_step` is a pure function of (state, batch, rng); `Trainer` jits it over the partitioner's
mesh with `NamedSharding`s derived from the model's logical axis names, initialises (or restores)
the sharded state, and runs the loop. Everything else a run does -- checkpoints, metrics files,
the progress bar -- is a hook called between steps.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.training import adaptation
from t2t.training.partitioning import Partitioner


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class Control:
  """What a hook may ask of the loop: a replacement state (e.g. a new learning-rate factor in
  the optimizer state) and/or to stop after this step (early stopping), with a reason."""
  state: TrainState | None = None
  stop: str | None = None


class Hook(Protocol):
  """Called after every step. Returns None (most hooks) or a `Control`."""

  def __call__(self, step: int, state: TrainState, metrics: Mapping[str, float] | None,
               batch: Mapping[str, np.ndarray]) -> Control | None: ...


def train_step(model: Any, optimizer: optax.GradientTransformation, trainable: Any,
               state: TrainState, batch: Mapping[str, jax.Array], dropout_rng: jax.Array
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on one batch; returns the new state and the step's metrics.

  `trainable` (a static bool tree like the params, `adaptation.trainable_mask`) says which
  parameters are differentiated; the others' gradients are zeros, so `grad_norm` covers the
  trainable ones only.
  """
  rng = jax.random.fold_in(dropout_rng, state.step)
  grad_fn = adaptation.value_and_grad_trainable(model.loss_fn, trainable)
  (_, metrics), grads = grad_fn(state.params, batch, rng)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(model: Any, params: Any, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Teacher-forced loss and token accuracy without dropout."""
  _, metrics = model.loss_fn(params, batch, None)
  return metrics


class Trainer:
  """Builds the sharded state and the compiled step for a model, optimizer and mesh."""

  def __init__(self, model: Any, optimizer: optax.GradientTransformation,
               partitioner: Partitioner, input_shapes: Mapping[str, tuple[int, ...]],
               seed: int = 0):
    self.model, self.optimizer, self.partitioner = model, optimizer, partitioner
    self._init_rng = jax.random.PRNGKey(seed)
    self.dropout_rng = jax.random.key(seed + 1, impl='rbg')  # XLA Philox bits (benchmarks/README)

    def init(rng):
      return model.get_initial_variables(rng, dict(input_shapes))["params"]

    self._init_params = init
    with partitioner.activation_context():
      boxed = jax.eval_shape(init, self._init_rng)
    self.params_shardings = partitioner.shardings_for(boxed)
    self.params_abstract = nn.unbox(boxed)
    opt_abstract = jax.eval_shape(optimizer.init, self.params_abstract)
    self.opt_state_shardings = self._opt_state_shardings(opt_abstract)
    self.opt_state_abstract = opt_abstract
    self.state_shardings = TrainState(step=partitioner.replicated, params=self.params_shardings,
                                      opt_state=self.opt_state_shardings)
    data = partitioner.data_sharding
    self._train_step = jax.jit(
        functools.partial(train_step, model, optimizer,
                          adaptation.trainable_mask(optimizer, self.params_abstract)),
        in_shardings=(self.state_shardings, data, partitioner.replicated),
        out_shardings=(self.state_shardings, partitioner.replicated),
        donate_argnums=(0,))
    self._eval_step = jax.jit(functools.partial(eval_step, model),
                              in_shardings=(self.params_shardings, data),
                              out_shardings=partitioner.replicated)

  def _opt_state_shardings(self, opt_abstract: Any) -> Any:
    """Optimizer slots shaped like their parameter share its sharding; others replicate.

    Factored AdaFactor moments (a row or a column of a matrix) are small and replicated.
    """
    by_shape: dict[tuple, Any] = {}
    for leaf, sharding in zip(jax.tree.leaves(self.params_abstract),
                              jax.tree.leaves(self.params_shardings)):
      by_shape.setdefault(tuple(leaf.shape), sharding)
    return jax.tree.map(lambda x: by_shape.get(tuple(x.shape), self.partitioner.replicated),
                        opt_abstract)

  def init_params(self) -> Any:
    """Freshly initialised parameters, created directly in their shards."""
    fn = jax.jit(lambda rng: nn.unbox(self._init_params(rng)), out_shardings=self.params_shardings)
    with self.partitioner.activation_context():
      return fn(self._init_rng)

  def init_state(self, params: Any | None = None, step: int = 0) -> TrainState:
    """A train state around `params` (fresh if None) with a fresh optimizer state."""
    params = self.init_params() if params is None else params
    opt_state = jax.jit(self.optimizer.init, out_shardings=self.opt_state_shardings)(params)
    return TrainState(step=jax.device_put(jnp.asarray(step, jnp.int32),
                                          self.partitioner.replicated),
                      params=params, opt_state=opt_state)

  def step(self, state: TrainState, batch: Mapping[str, np.ndarray]
           ) -> tuple[TrainState, dict[str, jax.Array]]:
    with self.partitioner.activation_context():
      return self._train_step(state, self.partitioner.shard_batch(batch), self.dropout_rng)

  def evaluate_loss(self, params: Any, batches: Iterator[Mapping[str, np.ndarray]],
                    num_batches: int) -> dict[str, float]:
    """Token-weighted mean loss and accuracy over `num_batches` batches."""
    totals: dict[str, float] = {"loss": 0.0, "accuracy": 0.0, "num_tokens": 0.0}
    for _, batch in zip(range(num_batches), batches):
      with self.partitioner.activation_context():
        m = jax.device_get(self._eval_step(params, self.partitioner.shard_batch(batch)))
      n = float(m["num_tokens"])
      totals["loss"] += float(m["loss"]) * n
      totals["accuracy"] += float(m["accuracy"]) * n
      totals["num_tokens"] += n
    n = max(totals["num_tokens"], 1.0)
    return {"loss": totals["loss"] / n, "accuracy": totals["accuracy"] / n,
            "num_tokens": totals["num_tokens"]}


def run_loop(trainer: Trainer, state: TrainState, batches: Iterator[Mapping[str, np.ndarray]],
             num_steps: int, hooks: Sequence[Hook], log_every: int = 10,
             on_stop: Callable[[int, TrainState, str], None] | None = None) -> TrainState:
  """Runs steps until `state.step == num_steps`, calling every hook after each step.

  Metrics are fetched from the device only every `log_every` steps (and at the last), so the
  host does not wait on each step; hooks receive `metrics=None` in between. A hook returning a
  `Control` may replace the state (later hooks see the new one) or stop the loop after this
  step's hooks have run; `on_stop(step, state, reason)` is then called.
  """
  step = int(jax.device_get(state.step))
  stop = None
  while step < num_steps and stop is None:
    try:
      batch = next(batches)
    except StopIteration as e:
      raise RuntimeError(f"The training data ran out at step {step}.") from e
    state, metrics = trainer.step(state, batch)
    step += 1
    fetched = None
    if step % log_every == 0 or step == num_steps:
      fetched = {k: float(v) for k, v in jax.device_get(metrics).items()}
      if not np.isfinite(fetched["loss"]):
        raise FloatingPointError(f"Loss became {fetched['loss']} at step {step}.")
    for hook in hooks:
      control = hook(step, state, fetched, batch)
      if isinstance(control, Control):  # anything else a hook returns is ignored, as before
        state = control.state if control.state is not None else state
        stop = stop or control.stop
  if stop is not None and on_stop is not None:
    on_stop(step, state, stop)
  return state


def every(n: int, fn: Callable[[int, TrainState], None], last: int | None = None) -> Hook:
  """A hook calling fn(step, state) every n steps (and at step `last`)."""
  def hook(step, state, metrics, batch):
    del metrics, batch
    if (n and step % n == 0) or step == last:
      fn(step, state)
  return hook
