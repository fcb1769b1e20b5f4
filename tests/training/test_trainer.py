"""Tests for t2t/training/trainer.py and the training run of t2t/train.py on a toy task."""
import json
import os

import gin
import jax
import numpy as np
import pytest

from t2t import train as train_lib
from t2t.training import checkpoints, inputs, optim
from t2t.training.partitioning import Partitioner
from t2t.training.trainer import Trainer, run_loop
from tests.training import toy

BATCH = 8


@pytest.fixture(autouse=True)
def _task():
  toy.register()


def _bound_by_gin(name, model, shapes):
  """The Trainer's `name` under the gin binding `Trainer.<name> = False`."""
  with gin.unlock_config():
    gin.parse_config(f"Trainer.{name} = False")
  try:
    return getattr(Trainer(model, optim.adafactor(), Partitioner(), shapes), name)
  finally:
    gin.clear_config()


def _run(model_dir, steps, model=None, **kw):
  return train_lib.train(
      model=model or toy.model(), mixture_or_task_name=toy.TASK,
      task_feature_lengths=toy.LENGTHS, train_steps=steps, model_dir=str(model_dir),
      batch_size=BATCH, optimizer=optim.adafactor(learning_rate=0.01), checkpoint_every=4,
      log_every=2, **kw)


def test_train_step_learns_the_copy_task():
  model = toy.model()
  converter = model.feature_converter_cls(pack=True)
  shapes = {k: (BATCH, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  tr = Trainer(model, optim.adafactor(learning_rate=0.05), Partitioner(), shapes)
  batches = inputs.train_batches(toy.TASK, toy.LENGTHS, converter, BATCH, seed=0)
  state = tr.init_state()
  losses = []
  run_loop(tr, state, batches, 60, [lambda s, st, m, b: m and losses.append(m["loss"])],
           log_every=10)
  assert len(losses) == 6
  assert losses[-1] < losses[0] - 0.5, losses  # ln(64) = 4.16 is chance


def test_dropout_prng_picks_the_key_and_an_unknown_one_is_refused():
  model = toy.model()
  shapes = {k: (BATCH, v) for k, v in
            model.feature_converter_cls(pack=True).get_model_feature_lengths(toy.LENGTHS).items()}
  make = lambda **kw: Trainer(model, optim.adafactor(learning_rate=0.05), Partitioner(), shapes, **kw)
  default = make().dropout_rng  # JAX's philox4x32 on one device (t2t's twin on larger meshes)
  assert jax.random.key_impl(default) == "philox4x32"
  assert default.dtype == jax.random.key(0, impl="philox4x32").dtype
  assert str(jax.random.key_impl(make(dropout_prng="rbg").dropout_rng)) == "rbg"
  with pytest.raises(ValueError, match=r"Trainer.dropout_prng = 'mt19937': expected one of "
                                       r"'rbg', 'philox4x32', 'threefry2x32'"):
    make(dropout_prng="mt19937")


def test_planned_dropout_masks_train_as_the_sites_own_and_gin_turns_them_off():
  """Dropout 0.2: two steps with the masks planned up front and without, the same losses."""
  model = toy.model(dropout_rate=0.2)
  converter = model.feature_converter_cls(pack=True)
  shapes = {k: (BATCH, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  losses = {}
  for plan in (True, False):
    tr = Trainer(model, optim.adafactor(learning_rate=0.05), Partitioner(), shapes,
                 plan_dropout=plan)
    batches = inputs.train_batches(toy.TASK, toy.LENGTHS, converter, BATCH, seed=0)
    state, losses[plan] = tr.init_state(), []
    for _ in range(2):
      state, metrics = tr.step(state, next(batches))
      losses[plan].append(float(metrics["loss"]))
  assert losses[True] == losses[False], losses
  assert _bound_by_gin("plan_dropout", model, shapes) is False


def test_split_update_steps_as_the_fused_step_and_compiles_each_program_once(caplog):
  model = toy.model()
  converter = model.feature_converter_cls(pack=True)
  shapes = {k: (BATCH, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  states, metrics, compiles = {}, {}, {}
  for split in (True, False):
    tr = Trainer(model, optim.adafactor(learning_rate=0.05), Partitioner(), shapes,
                 split_update=split)
    batches = inputs.train_batches(toy.TASK, toy.LENGTHS, converter, BATCH, seed=0)
    state, metrics[split] = tr.init_state(), []
    caplog.clear()
    previous = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)  # global: the update compiles on another thread
    try:
      with caplog.at_level("WARNING", logger="jax"):
        for _ in range(3):
          state, m = tr.step(state, next(batches))
          metrics[split].append({k: float(v) for k, v in m.items()})
    finally:
      jax.config.update("jax_log_compiles", previous)
    states[split] = jax.device_get(state)
    compiles[split] = sorted(r.getMessage().split(" ")[4] for r in caplog.records
                             if r.getMessage().startswith("Finished XLA compilation of jit(")
                             and "_step)" in r.getMessage())
  # Two programs compiled once each (the update on the second thread), against one.
  assert compiles == {True: ["jit(gradient_step)", "jit(update_step)"],
                      False: ["jit(train_step)"]}, compiles
  # The loss's metrics are the same program's; the gradient norm's sum may run in another order.
  for split_m, fused_m in zip(metrics[True], metrics[False]):
    assert {k: v for k, v in split_m.items() if k != "grad_norm"} == \
        {k: v for k, v in fused_m.items() if k != "grad_norm"}
    np.testing.assert_allclose(split_m["grad_norm"], fused_m["grad_norm"], rtol=1e-6)
  assert set(metrics[True][0]) == {"loss", "accuracy", "num_tokens", "grad_norm",
                                   "nonfinite_steps"}
  jax.tree.map(np.testing.assert_array_equal, states[True], states[False])
  assert int(states[True].step) == 3
  assert _bound_by_gin("split_update", model, shapes) is False


def test_run_writes_checkpoints_config_and_metrics(tmp_path):
  state = _run(tmp_path, 4)
  assert int(state.step) == 4
  assert os.path.isdir(tmp_path / "checkpoint_4")
  assert os.path.isfile(tmp_path / "config.gin")  # its contents: tests/test_end_to_end.py
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [r["step"] for r in records] == [2, 4]
  assert {"loss", "accuracy", "grad_norm", "tokens_per_sec"} <= set(records[0])


def test_resume_is_exact(tmp_path):
  straight = _run(tmp_path / "straight", 8)
  _run(tmp_path / "resumed", 4)
  resumed = _run(tmp_path / "resumed", 8)  # picks up checkpoint_4 and its data position
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               jax.device_get(straight.params), jax.device_get(resumed.params))
  steps = [json.loads(l)["step"] for l in open(tmp_path / "resumed" / "metrics.jsonl")]
  assert steps == [2, 4, 6, 8]


def test_incompatible_model_dir_is_refused_and_left_intact(tmp_path):
  _run(tmp_path, 4)
  before = {name: os.path.getmtime(tmp_path / name) for name in os.listdir(tmp_path)}
  config_text = open(tmp_path / "config.gin").read()
  with pytest.raises(checkpoints.CheckpointMismatchError, match=r"decoder_norm/scale.*\(32,\).*\(48,\)"):
    _run(tmp_path, 8, model=toy.model(d_model=48))
  after = {name: os.path.getmtime(tmp_path / name) for name in os.listdir(tmp_path)}
  assert before == after
  assert open(tmp_path / "config.gin").read() == config_text


def test_initial_checkpoint_path_starts_from_those_parameters(tmp_path):
  pretrained = _run(tmp_path / "pre", 4)
  # Zero steps of fine-tuning would return the loaded parameters themselves; one step moves them
  # only a little, and must start from them (not from a fresh initialisation).
  finetuned = _run(tmp_path / "fine", 1, initial_checkpoint_path=str(tmp_path / "pre"))
  fresh = _run(tmp_path / "fresh", 1)
  dist = lambda a, b: sum(float(np.abs(x - y).sum()) for x, y in zip(
      jax.tree.leaves(jax.device_get(a.params)), jax.tree.leaves(jax.device_get(b.params))))
  assert dist(finetuned, pretrained) < dist(fresh, pretrained)
  assert int(finetuned.step) == 1  # a fresh optimizer and step count
