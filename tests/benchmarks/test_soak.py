"""The soak benchmark's judgement on real tiny checkpoints: a run restarted from its checkpoint
matches an unbroken one exactly, while a run with another seed is reported as a mismatch; plus
how it reads metrics.jsonl, tells where a SIGKILL landed, and refuses bad flags."""
import importlib
import json
import os
import shutil

import numpy as np
import optax
import pytest

from benchmarks import run_comparison, soak
from t2t import train as train_lib
from tests.support.tiny_model import tiny_t5

STEPS = 3


def _train(model_dir, steps, seed=0):
  train_lib.train(model=tiny_t5(), mixture_or_task_name="bbc_span_corruption",
                  task_feature_lengths={"inputs": 32, "targets": 8}, train_steps=steps,
                  model_dir=str(model_dir), batch_size=2, optimizer=optax.adam(1e-3),
                  checkpoint_every=2, log_every=1, keep_checkpoints=None, seed=seed)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Runs to step 3: straight (seed 0), the same restarted at step 2, straight with seed 1."""
  importlib.import_module("tasks.bbc")  # registers the BBC tasks
  root = tmp_path_factory.mktemp("soak")
  _train(root / "restarted", STEPS)
  shutil.copytree(root / "restarted", root / "straight")
  shutil.rmtree(root / "restarted" / "checkpoint_3")  # as a SIGKILL during step 3's save leaves
  run_comparison.set_aside_metrics(str(root / "restarted"))  # as the soak does before each restart
  _train(root / "restarted", STEPS)  # resumes at step 2 and recomputes step 3
  _train(root / "other_seed", STEPS, seed=1)
  return {name: str(root / name) for name in ("straight", "restarted", "other_seed")}


def test_a_restarted_run_matches_the_straight_one(runs):
  c = run_comparison.compare_runs(runs["restarted"], runs["straight"], STEPS)
  assert run_comparison.comparison_failures(c) == []
  assert c["params"]["leaves"] == 26 and c["params"]["unequal_leaves"] == 0
  assert c["opt_state"]["leaves"] > 26 and c["opt_state"]["max_abs_diff"] == 0.0
  losses = c["losses"]
  assert losses["steps_compared"] == STEPS and losses["missing_steps"] == [0, 0]
  assert losses["recomputed_steps"] == 1 and losses["max_abs_diff_last"] == 0.0
  assert c["batches_consumed"] == [STEPS, STEPS]


def test_a_run_with_another_seed_is_a_mismatch(runs):
  c = run_comparison.compare_runs(runs["other_seed"], runs["straight"], STEPS)
  failures = run_comparison.comparison_failures(c)
  assert c["params"]["unequal_leaves"] == c["params"]["leaves"] == 26
  assert c["params"]["max_abs_diff"] > 1e-3
  assert any(f.startswith("params differ: max |diff|") for f in failures), failures
  assert any(f.startswith("opt_state differ") for f in failures), failures
  assert any(f.startswith("losses differ: max_abs_diff_last") for f in failures), failures


def test_a_recomputed_step_with_another_loss_is_a_mismatch(runs, tmp_path):
  # The last value of step 3 is right, but an earlier one (logged before the "kill") is not.
  copy = tmp_path / "restarted"
  shutil.copytree(runs["restarted"], copy)
  with open(copy / "metrics.jsonl") as f:
    lines = f.readlines()
  lines.insert(-1, json.dumps({"step": 3, "split": "train", "loss": 123.0}) + "\n")
  with open(copy / "metrics.jsonl", "w") as f:
    f.writelines(lines)
  c = run_comparison.compare_runs(str(copy), runs["straight"], STEPS)
  assert c["losses"]["max_abs_diff_last"] == 0.0 and c["losses"]["max_abs_diff_all"] > 100
  assert run_comparison.comparison_failures(c) == [
      "losses differ: max_abs_diff_all %.3g (worst step 3)" % c["losses"]["max_abs_diff_all"]]


def test_read_losses_keeps_the_last_value_and_counts_torn_lines(tmp_path):
  lines = [{"step": 1, "split": "train", "loss": 2.0}, {"step": 2, "split": "train", "loss": 3.0},
           {"step": 2, "split": "validation", "loss": 9.0},
           {"step": 2, "split": "train", "loss": 4.0}]
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 3, "spl\n')
  last, every, torn = run_comparison.read_losses(str(tmp_path))
  assert last == {1: 2.0, 2: 4.0} and every[2] == [3.0, 4.0] and torn == 1


def test_interruption_moment_from_what_a_kill_leaves(tmp_path):
  d = str(tmp_path)
  assert soak.interruption_moment(d, 7) == ("between_checkpoints", [])
  os.makedirs(tmp_path / "checkpoint_25" / "input_state")
  assert soak.interruption_moment(d, 25)[0] == "during_input_state_write"
  (tmp_path / "checkpoint_25" / "input_state" / "process_0.index").write_bytes(b"")
  assert soak.interruption_moment(d, 25) == ("on_checkpoint", ["checkpoint_25"])
  assert soak.interruption_moment(d, 31)[0] == "between_checkpoints"
  os.makedirs(tmp_path / "checkpoint_50.orbax-checkpoint-tmp-1234")
  assert soak.interruption_moment(d, 50) == ("during_checkpoint_write",
                                             ["checkpoint_50.orbax-checkpoint-tmp-1234"])


def test_compare_trees_names_structure_and_value_differences():
  a = {"w": np.zeros((2, 3), np.float32), "b": np.ones(3, np.float32)}
  b = {"w": np.zeros((3, 2), np.float32), "b": np.array([1, 1, 1.5], np.float32),
       "extra": np.zeros(1)}
  t = run_comparison.compare_trees(a, b)
  assert t["structure_problems"] == ["extra: only in the second", "w: float32[2, 3] vs float32[3, 2]"]
  assert t["max_abs_diff"] == 0.5 and t["worst_leaf"] == "b" and t["unequal_leaves"] == 1


@pytest.mark.parametrize("flag,message", [("--minutes=0", "--minutes=0.0 must be positive"),
                                          ("--mean_interval=-1", "--mean_interval=-1.0 must be"),
                                          ("--keep=-2", "--keep=-2 must be positive or 0"),
                                          ("--out=/nonexistent/x.json", "does not exist")])
def test_bad_flags_are_refused_with_the_flag_named(flag, message, capsys):
  with pytest.raises(SystemExit) as e:
    soak.main([flag])
  assert e.value.code == 2 and message in capsys.readouterr().err


def test_error_line_and_the_input_state_hint():
  log = ("Resuming from /m at step 50.\nerror: The input state /m/checkpoint_50/input_state/process_0 "
         "does not fit the rebuilt input pipeline (...). Did the task's preprocessing or data change "
         "since step 50? To resume anyway by replaying the stream, delete "
         "/m/checkpoint_50/input_state.\n  In call to configurable 'train'\n")
  assert soak.error_line(log).startswith("error: The input state /m/checkpoint_50/input_state/")
  assert soak._STATE_HINT.search(log).group(1) == "/m/checkpoint_50/input_state"
  assert soak.error_line("a\nlast line\n") == "last line"
