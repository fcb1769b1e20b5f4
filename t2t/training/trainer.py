"""The train step and the training loop.

`train_step` is a pure function of (state, batch, rng): `gradient_step`, then `update_step`.
`Trainer` jits them over the partitioner's mesh with `NamedSharding`s derived from the model's
logical axis names (as two programs, or as one: `Trainer.split_update`), initialises (or restores)
the sharded state, and runs the loop. Everything else a run does -- checkpoints, metrics files,
the progress bar -- is a hook called between steps.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import flax
import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t import errors
from t2t.models import dropout_plan, layers, philox, threefry
from t2t.training import adaptation, partitioning, reporting
from t2t.training.partitioning import Partitioner

# `TrainState.nonfinite_what` codes: which quantity made the first non-finite step non-finite.
NONFINITE_QUANTITIES = {1: "loss", 2: "gradient norm"}
ON_NONFINITE = ("stop", "skip")
# `jax.random` key implementations `Trainer.dropout_prng` accepts (benchmarks/README, "The dropout PRNG").
DROPOUT_PRNGS = ("rbg", "philox4x32", "threefry2x32")
DEFAULT_DROPOUT_PRNG = "philox4x32"
NONFINITE_FIELDS = ("nonfinite_steps", "first_nonfinite_step", "nonfinite_what")


@flax.struct.dataclass
class TrainState:
  """The training state. The three non-finite counters are device scalars (int32, replicated)
  kept by `train_step`: how many steps of this process were non-finite (their update not
  applied), the first such step (-1: none) and its `NONFINITE_QUANTITIES` code. They are not
  checkpointed (checkpoints.py saves params and opt_state): a resumed run starts them afresh,
  which is right since a saved state is always finite. The defaults are numpy int32 scalars,
  not Python ints (no weak types); `Trainer.step` puts them on the device before the first
  step, so the step compiles once."""
  step: jax.Array
  params: Any
  opt_state: Any
  nonfinite_steps: jax.Array = np.int32(0)
  first_nonfinite_step: jax.Array = np.int32(-1)
  nonfinite_what: jax.Array = np.int32(0)


class NonFiniteError(FloatingPointError):
  """The loss or the gradient norm was NaN or infinite (`Trainer.on_nonfinite = 'stop'`).

  `checkpoint` says what the run has to resume from; the trainer does not know its checkpoints,
  so t2t.train re-raises the error with it (`with_checkpoint`).
  """

  def __init__(self, step: int, quantity: str, count: int, seen_at: int,
               checkpoint: str = "so the checkpoints written before it are intact"):
    self.step, self.quantity, self.count, self.seen_at = step, quantity, count, seen_at
    super().__init__(
        f"The {quantity} was not finite (NaN or inf) at step {step} ({count} non-finite "
        f"step(s) seen by step {seen_at}). Their updates were not applied and nothing was saved "
        f"after step {step - 1}, {checkpoint}. Lower the learning rate, check the data, or set "
        "Trainer.on_nonfinite = 'skip' to skip such steps.")

  def with_checkpoint(self, latest: int | None) -> "NonFiniteError":
    """The same error naming the newest checkpoint in MODEL_DIR (`latest`; None: there is none)."""
    checkpoint = (f"so the latest checkpoint, step {latest}, is intact" if latest is not None
                  else "and no checkpoint had been written yet")
    return NonFiniteError(self.step, self.quantity, self.count, self.seen_at, checkpoint)


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


def dropout_key_impl(dropout_prng: str, partitioner: Partitioner) -> Any:
  """The `jax.random` key implementation for `Trainer.dropout_prng` on `partitioner`'s mesh.

  'philox4x32' is JAX's own implementation on a one-device mesh, and t2t's twin of it on a larger
  one (t2t/models/philox.py): the same keys and bits, but JAX's uses `lax.mulhi`, which XLA cannot
  partition across devices, and the twin's 64-bit products compile ~5 s slower in T5-small's
  step. A run resumed on another mesh therefore draws the same masks. Other names are JAX's.
  """
  if dropout_prng == "philox4x32" and partitioner.mesh.size > 1:
    return philox.PHILOX4X32
  return dropout_prng


def gradient_step(model: Any, trainable: Any, params: Any, step: jax.Array,
                  batch: Mapping[str, jax.Array], dropout_rng: jax.Array,
                  dropout_rows: Sequence[jax.Array] = (), num_microbatches: int = 1,
                  plan_dropout: bool = True) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
  """The loss's gradient on one batch: (grads like params, loss [], the loss's metrics).

  `trainable` (a static bool tree like the params, `adaptation.trainable_mask`) says which
  parameters are differentiated; the others' gradients are zeros. The dropout key is
  `dropout_rng` folded with `step`. With `num_microbatches` > 1 the gradient is accumulated over
  that many slices of the batch (`accumulated_gradients`) and equals the whole batch's. With
  `plan_dropout` the loss's dropout masks are made up front, all keys in one kernel and one
  generator per mask shape (`layers.with_planned_dropout`): the same masks as each site would
  draw, compiled faster; `dropout_rows` (`dropout_plan.row_arguments`, passed in so that they
  are runtime values) are the indices at which each site takes its mask, so that XLA compiles
  one kernel for the like sites of all layers.
  """
  rng = jax.random.fold_in(dropout_rng, step)
  loss_fn = (layers.with_planned_dropout(model.loss_fn, dropout_rows) if plan_dropout
             else model.loss_fn)
  if num_microbatches == 1:
    grad_fn = adaptation.value_and_grad_trainable(loss_fn, trainable)
    (loss, metrics), grads = grad_fn(params, batch, rng)
    return grads, loss, metrics
  grads, metrics = accumulated_gradients(loss_fn, trainable, params, batch, rng, num_microbatches)
  return grads, metrics["loss"], metrics


def update_step(optimizer: optax.GradientTransformation, state: TrainState, grads: Any,
                loss: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
  """Applies `optimizer` to `grads` (like `state.params`); returns the new state and the metrics
  `grad_norm` (over the trainable parameters; the others' gradients are zeros) and
  `nonfinite_steps`.

  Checks, on the device, that `loss` and the gradient norm are finite. A step where either is
  not keeps the old params and optimizer state (a per-leaf select, no host sync) while the step
  counter still advances, and is counted in the state's non-finite counters (see `TrainState`).
  What the host does about it is `Trainer.on_nonfinite`'s business (`Trainer.check_finite`).
  """
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  grad_norm = optax.tree.norm(grads)
  loss_ok, grad_ok = jnp.all(jnp.isfinite(loss)), jnp.isfinite(grad_norm)
  finite = loss_ok & grad_ok
  keep = lambda new, old: jnp.where(finite, new, old)
  params = jax.tree.map(keep, params, state.params)
  opt_state = jax.tree.map(keep, opt_state, state.opt_state)
  step = state.step + 1
  first = (state.nonfinite_steps == 0) & ~finite
  count = state.nonfinite_steps + jnp.where(finite, 0, 1).astype(jnp.int32)
  new_state = TrainState(
      step=step, params=params, opt_state=opt_state, nonfinite_steps=count,
      first_nonfinite_step=jnp.where(first, step, state.first_nonfinite_step).astype(jnp.int32),
      nonfinite_what=jnp.where(first, jnp.where(loss_ok, 2, 1),
                               state.nonfinite_what).astype(jnp.int32))
  return new_state, {"grad_norm": grad_norm, "nonfinite_steps": count}


def train_step(model: Any, optimizer: optax.GradientTransformation, trainable: Any,
               state: TrainState, batch: Mapping[str, jax.Array], dropout_rng: jax.Array,
               dropout_rows: Sequence[jax.Array] = (), num_microbatches: int = 1,
               plan_dropout: bool = True) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer step on one batch: `gradient_step`, then `update_step`; returns the new state
  and the step's metrics (the loss's, `grad_norm` and `nonfinite_steps`).

  `Trainer` runs the two parts as two programs (`Trainer.split_update`) or this function as one.
  """
  grads, loss, metrics = gradient_step(model, trainable, state.params, state.step, batch,
                                       dropout_rng, dropout_rows, num_microbatches, plan_dropout)
  new_state, update_metrics = update_step(optimizer, state, grads, loss)
  return new_state, {**metrics, **update_metrics}


def split_microbatches(batch: Mapping[str, jax.Array], num_microbatches: int
                       ) -> dict[str, jax.Array]:
  """[b, ...] -> [num_microbatches, b / num_microbatches, ...], microbatch m = rows m, m + M, ...

  Strided, so that with the batch split over `data` (device k holds a contiguous block of rows)
  every device holds an equal part of every microbatch and the split moves no data.
  """
  def split(x):
    b = x.shape[0]
    x = jnp.swapaxes(x.reshape(b // num_microbatches, num_microbatches, *x.shape[1:]), 0, 1)
    return nn.with_logical_constraint(x, (None, "batch") + (None,) * (x.ndim - 2))
  return {k: split(v) for k, v in batch.items()}


def accumulated_gradients(loss_fn: Callable[..., Any], trainable: Any, params: Any,
                          batch: Mapping[str, jax.Array], rng: jax.Array, num_microbatches: int
                          ) -> tuple[Any, dict[str, jax.Array]]:
  """The gradient and metrics of `loss_fn` on `batch`, computed over microbatches in a scan.

  Every t2t loss is a weighted mean, loss = sum(ce * w) / sum(w), with sum(w) reported as the
  metric `num_tokens` (models/api.py and the other families). So each microbatch contributes
  the gradient of loss_i * n_i (its weighted sum), and the total is divided by N = sum n_i:
  exactly the big batch's gradient, whatever the number of tokens per microbatch. Metrics other
  than `num_tokens` are token-weighted means the same way. Dropout gets a different rng per
  microbatch. Memory: one microbatch's activations plus one gradient accumulator.
  """
  def weighted(p, mb, r):
    loss, metrics = loss_fn(p, mb, r)
    if "num_tokens" not in metrics:
      raise ValueError(f"Trainer.num_microbatches={num_microbatches} needs the loss's weight sum: "
                       f"{loss_fn} returns no 'num_tokens' metric (it has {sorted(metrics)}).")
    return loss * metrics["num_tokens"], metrics
  grad_fn = adaptation.value_and_grad_trainable(weighted, trainable)

  def body(carry, xs):
    grad_sum, metric_sums = carry
    index, mb = xs
    (_, metrics), grads = grad_fn(params, mb, jax.random.fold_in(rng, index))
    n = metrics["num_tokens"]
    grad_sum = jax.tree.map(jnp.add, grad_sum, grads)
    metric_sums = {k: metric_sums[k] + (v if k == "num_tokens" else v * n)
                   for k, v in metrics.items()}
    return (grad_sum, metric_sums), None

  micro = split_microbatches(batch, num_microbatches)
  first = jax.tree.map(lambda x: x[0], micro)
  metric_shapes = jax.eval_shape(lambda: loss_fn(params, first, rng)[1])
  init = (jax.tree.map(jnp.zeros_like, params),
          {k: jnp.zeros(v.shape, jnp.float32) for k, v in metric_shapes.items()})
  (grad_sum, metric_sums), _ = jax.lax.scan(body, init, (jnp.arange(num_microbatches), micro))
  total = metric_sums["num_tokens"]
  denom = jnp.maximum(total, 1e-8)
  grads = jax.tree.map(lambda g: (g / denom).astype(g.dtype), grad_sum)
  metrics = {k: (v if k == "num_tokens" else v / denom) for k, v in metric_sums.items()}
  return grads, metrics


def eval_step(model: Any, params: Any, batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Teacher-forced loss and token accuracy without dropout."""
  _, metrics = model.loss_fn(params, batch, None)
  return metrics


@gin.configurable(allowlist=["num_microbatches", "on_nonfinite", "dropout_prng", "plan_dropout",
                             "split_update"])
class Trainer:
  """Builds the sharded state and the compiled step for a model, optimizer and mesh.

  `num_microbatches` (gin `Trainer.num_microbatches`): gradient accumulation over that many
  slices of each batch, for batches whose activations do not fit at once; 1 = one pass.
  `on_nonfinite` (gin `Trainer.on_nonfinite`): what a step with a NaN/inf loss or gradient norm
  leads to. Its update is never applied (`train_step`); 'stop' (default) then raises
  `NonFiniteError` when the host next looks (a metrics fetch or a checkpoint save), naming the
  first such step; 'skip' goes on and announces how many steps were skipped.
  `dropout_prng` (gin `Trainer.dropout_prng`): the generator of the dropout masks
  (`DROPOUT_PRNGS`, `dropout_key_impl`). 'philox4x32' (default): Philox-4x32-10 (Salmon et al.,
  SC'11) in integer ops, a mask taking all four words of each block
  (`layers.dropout_keep_mask`); its bits are the same on every backend and mesh, and on the 2-core
  CPU a T5-small step is faster than with 'rbg' (~11% already with one word per block;
  benchmarks/README, "The dropout PRNG"). 'rbg':
  XLA's RngBitGenerator (Philox on CPU; its bits depend on the backend and the sharding).
  'threefry2x32' is JAX's default.
  Checkpoints do not hold the key: a resumed run needs the same implementation to draw the same
  masks.
  `plan_dropout` (gin `Trainer.plan_dropout`, default True): make the step's dropout masks up
  front (`train_step`, t2t/models/dropout_plan.py): the same masks, ~4 s less compile for
  T5-small. False lets each site draw its own, for a loss function that cannot be traced twice
  alike.
  `split_update` (gin `Trainer.split_update`, default True): run the step as two programs, the
  gradient (`gradient_step`) and the optimizer update (`update_step`), and compile the update on
  a second thread while the gradient program traces and compiles, before the first step. The
  same arithmetic as the one program of `train_step` (False), ~3 s less compile + first step for
  T5-small on 2 cores; the gradients make one trip through memory between the two programs
  (benchmarks/README, "Compile + first step").
  """

  def __init__(self, model: Any, optimizer: optax.GradientTransformation,
               partitioner: Partitioner, input_shapes: Mapping[str, tuple[int, ...]],
               seed: int = 0, num_microbatches: int = 1, on_nonfinite: str = "stop",
               dropout_prng: str = DEFAULT_DROPOUT_PRNG, plan_dropout: bool = True,
               split_update: bool = True):
    if dropout_prng not in DROPOUT_PRNGS:
      raise ValueError(f"Trainer.dropout_prng = {dropout_prng!r}: expected one of "
                       f"{', '.join(repr(m) for m in DROPOUT_PRNGS)}.")
    if on_nonfinite not in ON_NONFINITE:
      raise ValueError(f"Trainer.on_nonfinite = {on_nonfinite!r}: expected one of "
                       f"{', '.join(repr(m) for m in ON_NONFINITE)}.")
    self.model, self.optimizer, self.partitioner = model, optimizer, partitioner
    self.num_microbatches, self.plan_dropout = num_microbatches, plan_dropout
    self.split_update = split_update
    self._update_compiling: threading.Thread | None = None
    self.on_nonfinite = on_nonfinite
    self._announced_nonfinite = 0
    batch_sizes = {shape[0] for shape in input_shapes.values()}
    for batch_size in batch_sizes:  # before anything is traced or compiled
      partitioner.check_batch_size(batch_size, num_microbatches)
    self._init_rng = jax.random.PRNGKey(seed)
    self.dropout_rng = jax.random.key(seed + 1, impl=dropout_key_impl(dropout_prng, partitioner))
    self.dropout_rows = (dropout_plan.row_arguments(sharding=partitioner.replicated)
                         if plan_dropout else ())

    def init(rng):
      return model.get_initial_variables(rng, dict(input_shapes))["params"]

    self._init_params = init
    with partitioner.activation_context():
      boxed = jax.eval_shape(init, self._init_rng)
    self.params_shardings = partitioner.shardings_for(boxed)
    self.params_abstract = nn.unbox(boxed)
    partitioning.check_divisible(self.params_abstract, self.params_shardings)
    opt_abstract = jax.eval_shape(optimizer.init, self.params_abstract)
    self.opt_state_shardings = self._opt_state_shardings(opt_abstract)
    self.opt_state_abstract = opt_abstract
    rep = partitioner.replicated
    self.state_shardings = TrainState(step=rep, params=self.params_shardings,
                                      opt_state=self.opt_state_shardings, nonfinite_steps=rep,
                                      first_nonfinite_step=rep, nonfinite_what=rep)
    data = partitioner.data_sharding
    trainable = adaptation.trainable_mask(optimizer, self.params_abstract)
    self._train_step = jax.jit(
        functools.partial(train_step, model, optimizer, trainable,
                          num_microbatches=num_microbatches, plan_dropout=plan_dropout),
        in_shardings=(self.state_shardings, data, rep, rep),
        out_shardings=(self.state_shardings, rep),
        donate_argnums=(0,))
    self._gradient_step = jax.jit(
        functools.partial(gradient_step, model, trainable,
                          num_microbatches=num_microbatches, plan_dropout=plan_dropout),
        in_shardings=(self.params_shardings, rep, data, rep, rep),
        out_shardings=(self.params_shardings, rep, rep))
    self._update_step = jax.jit(functools.partial(update_step, optimizer),
                                in_shardings=(self.state_shardings, self.params_shardings, rep),
                                out_shardings=(self.state_shardings, rep),
                                donate_argnums=(0,))
    self._eval_step = jax.jit(functools.partial(eval_step, model),
                              in_shardings=(self.params_shardings, data),
                              out_shardings=partitioner.replicated)

  def _opt_state_shardings(self, opt_abstract: Any) -> Any:
    """Each optimizer slot gets its parameter's sharding, by tree path (see
    `partitioning.opt_state_shardings`); scalars and placeholders replicate."""
    return partitioning.opt_state_shardings(opt_abstract, self.params_abstract,
                                            self.params_shardings, self.partitioner.mesh)

  def init_params(self) -> Any:
    """Freshly initialised parameters, created directly in their shards.

    On a single CPU device the initialisers' Threefry hashes run as one kernel call each
    (`threefry.for_initialisers`): the same bits, several seconds less XLA compile.
    """
    fn = jax.jit(lambda rng: nn.unbox(self._init_params(rng)), out_shardings=self.params_shardings)
    with self.partitioner.activation_context(), threefry.for_initialisers():
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
    if not isinstance(state.nonfinite_steps, jax.Array):
      # A state built with the numpy defaults (init_state, a resume): onto the device, as the
      # step returns them, else jit compiles the step a second time for the other arg types.
      state = state.replace(**{name: jax.device_put(getattr(state, name),
                                                    self.partitioner.replicated)
                               for name in NONFINITE_FIELDS})
    with self.partitioner.activation_context():
      batch = self.partitioner.shard_batch(batch)
      if not self.split_update:
        return self._train_step(state, batch, self.dropout_rng, self.dropout_rows)
      if self._update_compiling is None:
        lowered = self._lower_update()
        self._update_compiling = threading.Thread(target=lowered.compile, daemon=True,
                                                  name="t2t-compile-update")
        self._update_compiling.start()
      grads, loss, metrics = self._gradient_step(state.params, state.step, batch,
                                                 self.dropout_rng, self.dropout_rows)
      self._update_compiling.join()
      state, update_metrics = self._update_step(state, grads, loss)
    return state, {**metrics, **update_metrics}

  def _lower_update(self) -> Any:
    """`update_step` lowered for this Trainer's state, whose shapes do not depend on the batch.

    `step` compiles it on a second thread while the first `gradient_step` traces and compiles;
    the compiled program lands in the jit's cache, so the call that follows finds it. The
    values' shardings and the mesh context are part of that cache's key, hence both here.
    """
    state, rep = self.abstract_state(), self.partitioner.replicated
    return self._update_step.lower(state, state.params,
                                   jax.ShapeDtypeStruct((), jnp.float32, sharding=rep))

  def abstract_state(self) -> TrainState:
    """The train state as `jax.ShapeDtypeStruct`s with this Trainer's shardings (no memory): what
    the step's programs are lowered for ahead of a call (`_lower_update`; for another platform,
    tests/training/test_gpu_lowering.py)."""
    rep = self.partitioner.replicated
    placed = lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
    scalar = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
    return TrainState(step=scalar, params=jax.tree.map(placed, self.params_abstract,
                                                       self.params_shardings),
                      opt_state=jax.tree.map(placed, self.opt_state_abstract,
                                             self.opt_state_shardings),
                      nonfinite_steps=scalar, first_nonfinite_step=scalar, nonfinite_what=scalar)

  def check_finite(self, step: int, state: TrainState,
                   counts: tuple[Any, Any, Any] | None = None) -> None:
    """Acts on the state's non-finite counters (`counts`: them already fetched, else they are
    fetched here, a host sync): with 'stop', raises `NonFiniteError` if any step was non-finite;
    with 'skip', announces newly skipped steps. Called where the host syncs anyway: at a metrics
    fetch (`run_loop`) and before a checkpoint save (t2t/train.py)."""
    if counts is None:
      counts = jax.device_get(nonfinite_counts(state))
    count, first, what = (int(c) for c in counts)
    if count == 0:
      return
    quantity = NONFINITE_QUANTITIES.get(what, "loss or gradient norm")
    if self.on_nonfinite == "stop":
      raise NonFiniteError(first, quantity, count, step)
    if count > self._announced_nonfinite:
      reporting.announce(f"Skipped {count} non-finite step(s) by step {step} (Trainer."
                         f"on_nonfinite = 'skip'); the first, step {first}, had a non-finite "
                         f"{quantity}.")
      self._announced_nonfinite = count

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

  Non-finite steps (see `train_step`) are looked at with the same fetch as the metrics, so
  there is no sync per step: `trainer.check_finite` raises there (on_nonfinite = 'stop'),
  before this step's hooks (a checkpoint save) run, or announces skipped steps ('skip').
  """
  step = int(jax.device_get(state.step))
  stop = None
  while step < num_steps and stop is None:
    try:
      batch = next(batches)
    except StopIteration as e:
      raise errors.UserError(f"The training data ran out at step {step}.") from e
    state, metrics = trainer.step(state, batch)
    step += 1
    fetched = None
    if step % log_every == 0 or step == num_steps:
      fetched, counts = jax.device_get((metrics, nonfinite_counts(state)))
      fetched = {k: float(v) for k, v in fetched.items()}
      trainer.check_finite(step, state, counts)
    for hook in hooks:
      control = hook(step, state, fetched, batch)
      if isinstance(control, Control):  # anything else a hook returns is ignored, as before
        state = control.state if control.state is not None else state
        stop = stop or control.stop
  if stop is not None and on_stop is not None:
    on_stop(step, state, stop)
  return state


def nonfinite_counts(state: TrainState) -> tuple[Any, Any, Any]:
  """The state's (nonfinite_steps, first_nonfinite_step, nonfinite_what) device scalars."""
  return tuple(getattr(state, name) for name in NONFINITE_FIELDS)


def every(n: int, fn: Callable[[int, TrainState], None], last: int | None = None) -> Hook:
  """A hook calling fn(step, state) every n steps (and at step `last`)."""
  def hook(step, state, metrics, batch):
    del metrics, batch
    if (n and step % n == 0) or step == last:
      fn(step, state)
  return hook
