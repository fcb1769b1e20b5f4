"""Non-finite steps: caught on the device on the step they happen, never applied, never saved
(t2t/training/trainer.py `train_step`, `Trainer.check_finite`; the save hook of t2t/train.py)."""
import copy
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import train as train_lib
from t2t.training import checkpoints, inputs, optim
from t2t.training import trainer as trainer_lib
from t2t.training.partitioning import Partitioner
from tests.training import toy

BATCH = 8


class NanAt:
  """`model` whose loss (what='loss') or gradient (what='gradient', with a finite loss) is NaN
  on step `step` only (1-based, as the loop counts). The step is recognised from the dropout rng
  train_step passes, fold_in(Trainer.dropout_rng, step - 1), so the data need not change."""

  def __init__(self, model, step: int, what: str, seed: int = 0):
    self._model, self._what = model, what
    key = jax.random.key(seed + 1, impl=trainer_lib.DEFAULT_DROPOUT_PRNG)  # Trainer.dropout_rng
    self._bad = jax.random.key_data(jax.random.fold_in(key, step - 1))

  def __getattr__(self, name):
    return getattr(self._model, name)

  def loss_fn(self, params, batch, rng):
    loss, metrics = self._model.loss_fn(params, batch, rng)
    if rng is None:
      return loss, metrics
    bad = jnp.all(jax.random.key_data(rng) == self._bad)
    if self._what == "loss":
      loss = jnp.where(bad, jnp.nan, loss)
    else:  # value 0 either way; d/dp = 0.5 / sqrt(s) * 0 = inf * 0 = NaN when bad
      leaf = jax.tree.leaves(params)[0]
      s = jnp.where(bad, 0.0, 1.0) + 0.0 * jnp.sum(leaf)
      loss = loss + jnp.sqrt(s) - jnp.sqrt(jnp.where(bad, 0.0, 1.0))
    return loss, {**metrics, "loss": loss}


@pytest.fixture(autouse=True)
def _task():
  toy.register()


def _trainer(model, on_nonfinite="stop"):
  converter = model.feature_converter_cls(pack=True)
  shapes = {k: (BATCH, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  return trainer_lib.Trainer(model, optim.adafactor(learning_rate=0.01), Partitioner(), shapes,
                             on_nonfinite=on_nonfinite)


@pytest.fixture(scope="module")
def trainers():
  """One Trainer (one compilation) per injected quantity, NaN on step 3, built on first use."""
  cache = {}
  def get(what, on_nonfinite="stop"):
    if what not in cache:
      cache[what] = _trainer(NanAt(toy.model(), step=3, what=what))
    tr = copy.copy(cache[what])  # the mode and the announcements are host-side only
    tr.on_nonfinite, tr._announced_nonfinite = on_nonfinite, 0
    return tr, _trainer_batches()
  return get


def _trainer_batches():
  converter = toy.model().feature_converter_cls(pack=True)
  return inputs.train_batches(toy.TASK, toy.LENGTHS, converter, BATCH, seed=0)


def _host(tree):
  return jax.tree.map(np.array, jax.device_get(tree))


@pytest.mark.parametrize("what,quantity", [("loss", "loss"), ("gradient", "gradient norm")])
def test_a_nonfinite_step_is_not_applied_and_stop_names_it(trainers, what, quantity):
  tr, batches = trainers(what)
  state = tr.init_state()
  for _ in range(2):
    state, metrics = tr.step(state, next(batches))
  before = _host((state.params, state.opt_state))
  tr.check_finite(2, state)  # finite so far: no error
  state, metrics = tr.step(state, next(batches))  # step 3: NaN
  after = _host((state.params, state.opt_state))
  jax.tree.map(np.testing.assert_array_equal, before, after)  # bit-identical: not applied
  assert int(state.step) == 3
  m = jax.device_get(metrics)
  assert int(m["nonfinite_steps"]) == 1
  if what == "gradient":
    assert np.isfinite(m["loss"]) and not np.isfinite(m["grad_norm"])
  state, _ = tr.step(state, next(batches))  # step 4 is finite again and applied
  assert not all(np.array_equal(a, b) for a, b in zip(
      jax.tree.leaves(after[0]), jax.tree.leaves(_host(state.params))))
  with pytest.raises(trainer_lib.NonFiniteError,
                     match=rf"The {quantity} was not finite .* at step 3 .*nothing was saved "
                           r"after step 2, so the checkpoints written before it are intact\.") as e:
    tr.check_finite(4, state)
  assert (e.value.step, e.value.quantity) == (3, quantity)
  assert isinstance(e.value, FloatingPointError)


def test_skip_goes_on_counts_and_reports_once_per_interval(trainers, monkeypatch):
  tr, batches = trainers("loss", on_nonfinite="skip")
  gets, said, logged = [], [], []
  real_get = jax.device_get
  monkeypatch.setattr(jax, "device_get", lambda x: gets.append(1) or real_get(x))
  monkeypatch.setattr(trainer_lib.reporting, "announce", said.append)
  state = trainer_lib.run_loop(tr, tr.init_state(), batches, 8,
                               [lambda s, st, m, b: m and logged.append((s, m))], log_every=4)
  # No sync per step: one for the start step, one per log interval (steps 4 and 8).
  assert len(gets) == 3
  assert [(s, m["nonfinite_steps"]) for s, m in logged] == [(4, 1.0), (8, 1.0)]
  assert len(said) == 1 and "Skipped 1 non-finite step(s) by step 4" in said[0]
  assert "step 3, had a non-finite loss" in said[0]
  assert int(state.step) == 8 and int(state.nonfinite_steps) == 1
  # One compilation: a fresh state (numpy-int32 counters) is called like a stepped one.
  assert tr._gradient_step._cache_size() == tr._update_step._cache_size() == 1
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(_host(state.params)))


def test_stop_at_a_log_step_raises_before_the_hooks(trainers):
  tr, batches = trainers("gradient")
  seen = []
  with pytest.raises(trainer_lib.NonFiniteError, match="gradient norm .* at step 3 "):
    trainer_lib.run_loop(tr, tr.init_state(), batches, 8,
                         [lambda s, st, m, b: seen.append(s)], log_every=4)
  assert seen == [1, 2, 3]  # the hooks of step 4 (the fetch that found it) did not run


def test_unknown_mode_is_refused():
  with pytest.raises(ValueError, match=r"Trainer.on_nonfinite = 'ignore'"):
    _trainer(toy.model(), on_nonfinite="ignore")


def test_train_never_checkpoints_a_nonfinite_state(tmp_path):
  model = NanAt(toy.model(), step=3, what="loss")
  with pytest.raises(trainer_lib.NonFiniteError,
                     match="loss .* at step 3 .* so the latest checkpoint, step 2, is intact"):
    train_lib.train(model=model, mixture_or_task_name=toy.TASK,
                    task_feature_lengths=toy.LENGTHS, train_steps=5, model_dir=str(tmp_path),
                    batch_size=BATCH, optimizer=optim.adafactor(learning_rate=0.01),
                    checkpoint_every=1, log_every=100)
  assert sorted(d for d in os.listdir(tmp_path) if d.startswith("checkpoint_")) == [
      "checkpoint_1", "checkpoint_2"]
  tr = _trainer(toy.model())
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  try:
    params, opt_state, _ = ckpt.restore(2, tr.params_abstract, tr.params_shardings,
                                        tr.opt_state_abstract, tr.opt_state_shardings)
  finally:
    ckpt.close()
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(_host((params, opt_state))))


def test_a_run_without_a_checkpoint_yet_says_so(tmp_path):
  model = NanAt(toy.model(), step=3, what="loss")
  with pytest.raises(trainer_lib.NonFiniteError,
                     match=r"nothing was saved after step 2, and no checkpoint had been written yet\."):
    train_lib.train(model=model, mixture_or_task_name=toy.TASK,
                    task_feature_lengths=toy.LENGTHS, train_steps=5, model_dir=str(tmp_path),
                    batch_size=BATCH, optimizer=optim.adafactor(learning_rate=0.01),
                    checkpoint_every=10, log_every=1)
  assert not [d for d in os.listdir(tmp_path) if d.startswith("checkpoint_")]
