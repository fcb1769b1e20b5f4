"""Tests for t2t/training/validation.py: jiant's plateau rules, and the schedule inside training."""
import json
import os

import jax
import numpy as np
import pytest

from t2t import train as train_lib
from t2t.training import checkpoints, optim, validation
from tests.training import toy


def _decisions(plateau, values):
  return [plateau.update(i + 1, v) for i, v in enumerate(values)]


def test_plateau_decays_and_stops_on_a_hand_made_sequence():
  values = [1, 2, 2, 1, 1, 3, 0, 0, 0, 0, 0, 0]  # checks 1 to 12
  plateau = validation.Plateau(decay_patience=2, stop_patience=5)
  out = _decisions(plateau, values)
  assert [d.improved for d in out] == [True, True, False, False, False, True] + [False] * 6
  # "more than 2 checks without improvement": the 3rd one halves the rate; an improvement
  # (check 6) resets both counts; the decay count restarts after each decay (checks 9, 12).
  assert [d.lr_scale for d in out] == [1, 1, 1, 1, .5, .5, .5, .5, .25, .25, .25, .125]
  assert [d.stop is not None for d in out] == [False] * 11 + [True]
  assert "6 checks" in out[-1].stop and "best 3 at step 6" in out[-1].stop
  assert plateau.best == 3 and plateau.best_step == 6


def test_jiant_defaults_on_a_flat_metric():
  """Wang et al. App. B: x0.5 after more than 4 checks without improvement, stop after more
  than 20: a flat metric decays at checks 6, 11, 16, 21 and stops at check 22."""
  plateau = validation.Plateau()
  out = _decisions(plateau, [50.0] * 22)
  decays = [i + 1 for i in range(1, 22) if out[i].lr_scale < out[i - 1].lr_scale]
  assert decays == [6, 11, 16, 21]
  assert [i + 1 for i, d in enumerate(out) if d.stop] == [22]
  assert out[-1].lr_scale == 1 / 16


def test_learning_rate_floor_stops_the_run():
  plateau = validation.Plateau(decay_patience=0, stop_patience=None, learning_rate=4e-6)
  out = _decisions(plateau, [1.0, 1.0, 1.0, 1.0])
  assert [d.lr_scale for d in out] == [1, .5, .25, .125]
  assert [d.stop is not None for d in out] == [False, False, False, True]  # 1e-6 is not < 1e-6
  assert "5e-07 < 1e-06" in out[-1].stop


def test_lower_is_better():
  plateau = validation.Plateau(higher_is_better=False, decay_patience=None, stop_patience=1)
  out = _decisions(plateau, [3.0, 2.0, 2.5, 2.0])
  assert [d.improved for d in out] == [True, True, False, False]
  assert out[-1].stop and out[-1].lr_scale == 1


def test_select_metric():
  results = {"a": {"accuracy": 80.0, "f1": 70.0}, "b": {"accuracy": 60.0}}
  assert validation.select_metric(results, "a/f1") == 70.0
  assert validation.select_metric(results, "accuracy") == 70.0  # mean over tasks
  assert validation.select_metric(results, None) == 80.0  # first metric of the first task
  with pytest.raises(ValueError, match="'bleu'.*a/accuracy, a/f1, b/accuracy"):
    validation.select_metric(results, "bleu")


# --- inside a training run (toy copy task, one-layer T5) ------------------------------------------


@pytest.fixture(autouse=True)
def _task():
  toy.register()


def _train(model_dir, steps, schedule, **kw):
  return train_lib.train(
      model=toy.model(), mixture_or_task_name=toy.TASK, task_feature_lengths=toy.LENGTHS,
      train_steps=steps, model_dir=str(model_dir), batch_size=8,
      optimizer=optim.adafactor(learning_rate=0.01), checkpoint_every=100, log_every=2,
      validation=schedule, **kw)


def test_schedule_keeps_the_best_halves_the_rate_and_stops(tmp_path, monkeypatch):
  fake = {2: 10.0, 4: 30.0, 6: 20.0, 8: 20.0, 10: 20.0}
  seen = {}

  def metrics_fn(params, step):
    seen[step] = jax.device_get(params)
    return {"toy": {"accuracy": fake[step]}}

  monkeypatch.setattr(validation, "_seqio_metrics_fn", lambda *args: metrics_fn)
  schedule = validation.Validation(every_steps=2, metric="accuracy", decay_patience=1,
                                   stop_patience=2)
  state = _train(tmp_path, 20, schedule)
  # Step 6: no improvement; step 8: the second -> rate x0.5; step 10: the third -> stop.
  assert int(state.step) == 10 and sorted(seen) == [2, 4, 6, 8, 10]
  assert optim.get_lr_scale(state.opt_state) == 0.5
  assert json.load(open(tmp_path / "stopped.json"))["step"] == 10
  assert os.path.isdir(tmp_path / "checkpoint_10")
  best_dir = tmp_path / validation.BEST_DIR
  assert os.listdir(best_dir) == ["checkpoint_4"]
  best, step = checkpoints.load_params(str(best_dir), state.params,
                                       jax.tree.map(lambda x: x.sharding, state.params))
  assert step == 4
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(best), seen[4])
  history = json.load(open(tmp_path / validation.STATE_FILE))["history"]
  assert [(h["step"], h["lr_scale"]) for h in history] == [
      (2, 1), (4, 1), (6, 1), (8, .5), (10, .5)]
  records = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert [r["value"] for r in records if r["split"] == "validation"] == [10, 30, 20, 20, 20]

  # A stopped run stays stopped when launched again.
  again = _train(tmp_path, 20, schedule)
  assert int(again.step) == 10 and sorted(seen) == [2, 4, 6, 8, 10]


def test_schedule_decodes_the_validation_split(tmp_path):
  schedule = validation.Validation(every_steps=2, num_examples=8, batch_size=8)
  _train(tmp_path, 3, schedule)  # validates at 2 and at the last step, 3
  state = json.load(open(tmp_path / validation.STATE_FILE))
  assert [h["step"] for h in state["history"]] == [2, 3]
  assert all(0 <= h["metrics"]["toy_copy/accuracy"] <= 100 for h in state["history"])
  assert os.listdir(tmp_path / validation.BEST_DIR) == [f"checkpoint_{state['best_step']}"]


def test_a_resumed_run_replays_its_checks_up_to_the_checkpoint(tmp_path):
  """Checks at 2, 4, 6 ran, the run resumed from step 4: the counters continue from step 4."""
  import jax.numpy as jnp
  import optax
  from t2t.training.trainer import TrainState
  tx = optim.with_lr_scale(optax.sgd(0.1))
  params = {"w": jnp.ones(2)}
  state = TrainState(step=jnp.asarray(0), params=params, opt_state=tx.init(params))
  schedule = validation.Validation(every_steps=2, decay_patience=1, stop_patience=None)
  metrics_fn = lambda params, step: {"t": {"accuracy": {2: 5.0, 4: 5.0, 6: 5.0}[step]}}
  hook = validation.ValidationHook(schedule, metrics_fn, str(tmp_path), 0, 100)
  for step in (2, 4, 6):
    control = hook(step, state, None, None)
  assert optim.get_lr_scale(control.state.opt_state) == 0.5  # at 6: 2 checks > 1 without gain
  resumed = validation.ValidationHook(schedule, metrics_fn, str(tmp_path), 4, 100)
  assert [h["step"] for h in resumed.history] == [2, 4]
  assert (resumed.plateau.best_step, resumed.plateau.bad_checks) == (2, 1)
  control = resumed(6, state, None, None)
  assert optim.get_lr_scale(control.state.opt_state) == 0.5
  saved = json.load(open(tmp_path / validation.STATE_FILE))["history"]
  assert [h["step"] for h in saved] == [2, 4, 6]


def test_jiant_recipe_binds_the_papers_schedule():
  from t2t import config
  config.parse_gin(["experiments/bbc_demo/finetune.gin", "recipes/jiant.gin"],
                   ["MODEL_DIR = '/tmp/unused'", "INITIAL_CHECKPOINT_PATH = None"])
  schedule = validation.Validation()
  assert (schedule.every_steps, schedule.decay_patience, schedule.decay_factor,
          schedule.stop_patience, schedule.min_learning_rate) == (1000, 4, 0.5, 20, 1e-6)
  assert schedule.learning_rate == 3e-4
  import gin
  assert str(gin.query_parameter("train.optimizer")) == "@amsgrad()"
  assert str(gin.query_parameter("amsgrad.learning_rate")) == "%LEARNING_RATE"
  assert gin.query_parameter("%LEARNING_RATE") == 3e-4


def test_predictions_are_padded_to_one_length_with_eos():
  out = validation._fixed_length([(0, [5, 6, 7]), (1, []), (2, [9])])
  assert out == [(0, [5, 6, 7, 1]), (1, [1, 0, 0, 0]), (2, [9, 1, 0, 0])]
  assert toy.VOCAB.decode(out[2][1]) == [9, 1]  # decoding stops at the first EOS
