"""Tests for t2t/phases.py: a two-phase chain on BBC tasks with a very small T5, run as a user
would (`python -m t2t.phases`), stopped after its first phase and resumed; and the worked STILTs
example's commands (dry run)."""
import json
import os
import subprocess
import sys

import pytest

from t2t import phases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"T5Config.d_model": 32, "T5Config.d_ff": 64, "T5Config.num_heads": 2,
        "T5Config.d_kv": 16, "T5Config.num_encoder_layers": 1, "T5Config.num_decoder_layers": 1,
        "BATCH_SIZE": 4}

# Phase 'first': bbc_topic from scratch. Phase 'second': bbc_topic capped at 16 training
# articles (seed 3), on a model with one encoder layer more (partial restore), then evaluated.
CHAIN = f"""
include 'runs/phases.gin'
run_phases.bindings = {TINY!r}
run_phases.phases = [@first/Phase(), @second/Phase()]

first/Phase.name = 'first'
first/Phase.gin_files = ['experiments/bbc_demo/finetune.gin']
first/Phase.bindings = {{'INITIAL_CHECKPOINT_PATH': None, 'TRAIN_STEPS': 2}}

second/Phase.name = 'second'
second/Phase.gin_files = ['experiments/bbc_demo/finetune.gin', 'recipes/limited_data.gin']
second/Phase.bindings = {{'TRAIN_STEPS': 2, 'LIMITED_TASK': 'bbc_topic', 'TRAIN_EXAMPLES': 16,
                         'T5Config.num_encoder_layers': 2}}
second/Phase.partial_restore = True
second/Phase.eval_gin_files = ['experiments/bbc_demo/eval.gin']
second/Phase.eval_bindings = {{'EVAL_NUM_EXAMPLES': 8, 'EVAL_BATCH_SIZE': 4,
                              'T5Config.num_encoder_layers': 2}}
second/Phase.seeds = [3]
second/Phase.metric = 'bbc_topic/accuracy'
"""


def run_phases(*args, check=True):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run([sys.executable, "-m", "t2t.phases", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
  if check:
    assert out.returncode == 0, out.stderr[-5000:]
  return out


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
  """Runs the chain twice: up to 'first' (--stop_after), then to the end."""
  base = tmp_path_factory.mktemp("phases")
  gin_file = base / "chain.gin"
  gin_file.write_text(CHAIN)
  root = base / "root"
  args = [f"--gin_file={gin_file}", f"--gin.PHASES_ROOT={root}"]
  first = run_phases(*args, "--stop_after=first")
  second = run_phases(*args)
  return root, first.stderr + first.stdout, second.stderr + second.stdout


def test_first_invocation_stops_after_the_first_phase(chain):
  root, first, _ = chain
  assert "[first: train]" in first and "[second" not in first
  assert "Stopping after phase 'first'" in first
  record = json.load(open(root / "first" / phases.DONE_FILE))
  assert record["initial_checkpoint"] is None
  assert "-m t2t.train" in record["train_command"]


def test_second_invocation_skips_the_finished_phase_and_chains(chain):
  root, _, second = chain
  assert "[first] done earlier" in second and "[first: train]" not in second
  run_dir = root / "second" / "seed_3"
  record = json.load(open(run_dir / phases.DONE_FILE))
  assert record["initial_checkpoint"] == str(root / "first")
  # The command printed is the one that ran, and carries the phase's own bindings.
  assert f"--gin.INITIAL_CHECKPOINT_PATH={root / 'first'}" in second
  assert "--gin.SEED=3" in record["train_command"]
  assert "--gin.train.partial_restore=True" in record["train_command"]
  assert sorted(d for d in os.listdir(run_dir) if d.startswith("checkpoint_")) == ["checkpoint_2"]
  operative = open(run_dir / "config.gin").read()
  assert "bbc_topic_n16_seed3" in operative or "limited_task.seed = %SEED" in operative


def test_partial_restore_report_in_the_second_phase(chain):
  _, _, second = chain
  assert "Partial restore from" in second
  assert "not in the checkpoint: encoder/layers_1/" in second
  assert "skipped 0 checkpoint parameters" in second


def test_eval_and_restarts_summary(chain):
  root, _, second = chain
  metrics = json.load(open(root / "second" / "seed_3" / "eval" / "metrics.json"))
  assert metrics["step"] == 2 and "bbc_topic" in metrics["metrics"]
  summary = json.load(open(root / "second" / "restarts.json"))
  assert summary["num_runs"] == 1 and summary["best_run"] == "seed_3"
  assert summary["best"] == metrics["metrics"]["bbc_topic"]["accuracy"]
  assert "[second: restarts]" in second


def test_stilts_example_prints_pasteable_commands(tmp_path):
  out = run_phases("--gin_file=experiments/stilts_bbc.gin", f"--gin.PHASES_ROOT={tmp_path}",
                   "--dry_run")
  text = out.stderr
  for phase in ("pretrain: train", "intermediate: train", "target (seed 2): eval"):
    assert f"[{phase}]" in text
  assert f"--gin.INITIAL_CHECKPOINT_PATH={tmp_path}/pretrain \\" in text
  assert "--gin.LIMITED_TASK=bbc_topic" in text
  assert not os.listdir(tmp_path)  # a dry run writes nothing


def test_unknown_gin_file_or_phase_is_a_clear_error(tmp_path):
  gin_file = tmp_path / "bad.gin"
  gin_file.write_text(CHAIN.replace("experiments/bbc_demo/eval.gin", "experiments/nope.gin"))
  out = run_phases(f"--gin_file={gin_file}", f"--gin.PHASES_ROOT={tmp_path}", check=False)
  assert out.returncode == 1 and "Traceback" not in out.stderr
  assert "experiments/nope.gin" in out.stderr
  gin_file.write_text(CHAIN)
  out = run_phases(f"--gin_file={gin_file}", f"--gin.PHASES_ROOT={tmp_path}",
                   "--stop_after=third", check=False)
  assert out.returncode == 1 and "'third' names no phase" in out.stderr


def test_a_half_written_phase_json_is_named_with_what_to_do(tmp_path, monkeypatch):
  phase = phases.Phase(name="first", gin_files=["experiments/bbc_demo/finetune.gin"])
  marker = tmp_path / "first" / phases.DONE_FILE
  marker.parent.mkdir()
  marker.write_text('{"phase": "first", "seed": null, "model_dir": "/tmp/ru')  # a killed write
  runner = phases.Runner(str(tmp_path), [phase])
  monkeypatch.setattr(runner, "_execute", lambda *args: pytest.fail("a phase ran"))
  with pytest.raises(ValueError, match=f"^{marker} is not valid JSON .*: a half-written file\\? "
                                       "Delete it and run the same command again: first runs "
                                       "again, resuming from its latest checkpoint.$"):
    runner.run()
