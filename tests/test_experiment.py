"""Tests for t2t/experiment.py.

Most tests replace a cell's subprocess by a small fake (`fake_cell.py` below: it reads the
cell's spec and writes the chain record t2t.phases would, or fails), so that scheduling,
resuming, failure handling and the results table are tested in seconds; one test runs a real
one-cell grid (a t2t.phases chain, tiny T5, 2 steps) as a user would.
"""
import csv
import json
import os
import subprocess
import sys
import time

import pytest

from t2t import experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAKE_CELL = r'''
import json, os, sys, time
cell_dir = sys.argv[1]
spec = json.load(open(os.path.join(cell_dir, "cell_spec.json")))
b, seed = spec["bindings"], spec["seed"]
with open(os.environ["FAKE_CALLS"], "a") as f:
  f.write(json.dumps({"cell": spec["cell"], "start": time.time()}) + "\n")
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
if b["LR"] == "crash" and not os.path.exists(os.environ["FAKE_FIXED"]):
  print("training...\nTraceback (most recent call last):\nValueError: loss is NaN at step 7")
  sys.exit(3)
value = (0 if b["LR"] == "crash" else b["LR"]) * 100 + b["DROPOUT"] * 10 + seed
record = {"target": {"phase": "target", "model_dir": os.path.join(cell_dir, "none"),
                     "eval": {"metrics": {"task": {"accuracy": value}}}}}
if "SEED = %d" % seed not in spec["phase_bindings"]:
  sys.exit(5)
json.dump(record, open(os.path.join(cell_dir, "chain.json"), "w"))
with open(os.environ["FAKE_CALLS"], "a") as f:
  f.write(json.dumps({"cell": spec["cell"], "end": time.time()}) + "\n")
'''

CELL_GIN = "LR = 0.1\nDROPOUT = 0.0\ninclude 'runs/phases.gin'\n"


@pytest.fixture
def fake(tmp_path, monkeypatch):
  script = tmp_path / "fake_cell.py"
  script.write_text(FAKE_CELL)
  gin_file = tmp_path / "cell.gin"
  gin_file.write_text(CELL_GIN)
  calls = tmp_path / "calls.jsonl"
  monkeypatch.setenv("FAKE_CALLS", str(calls))
  monkeypatch.setenv("FAKE_FIXED", str(tmp_path / "fixed"))
  monkeypatch.setattr(experiment, "_cell_command",
                      lambda python, cell_dir: [sys.executable, str(script), cell_dir])

  def grid(axes, seeds=(0,), root=tmp_path / "grid", **kwargs):
    return experiment.run_grid(root=str(root), cell_gin_files=[str(gin_file)], axes=axes,
                               seeds=list(seeds), status_every_s=0.5, **kwargs)

  def invocations():
    return [json.loads(l) for l in calls.read_text().splitlines()] if calls.exists() else []

  return grid, invocations, tmp_path


def test_grid_runs_every_cell_and_writes_one_table(fake):
  grid, invocations, tmp = fake
  rows = grid({"LR": [1, 2], "DROPOUT": [0.0, 0.5]}, seeds=[0, 1], max_parallel=2)
  assert len(rows) == 8 and all(r["status"] == "ok" for r in rows)
  assert [r["cell"] for r in rows[:3]] == ["LR=1,DROPOUT=0.0,seed=0", "LR=1,DROPOUT=0.0,seed=1",
                                           "LR=1,DROPOUT=0.5,seed=0"]
  by_cell = {r["cell"]: r for r in rows}
  cell = by_cell["LR=2,DROPOUT=0.5,seed=1"]
  assert cell["metrics"] == {"task/accuracy": 206.0}  # 2*100 + 0.5*10 + 1
  assert cell["bindings"] == {"LR": 2, "DROPOUT": 0.5} and cell["seed"] == 1
  assert cell["wall_s"] > 0
  jsonl = [json.loads(l) for l in (tmp / "grid" / "results.jsonl").read_text().splitlines()]
  assert jsonl == rows and len({r["grid"] for r in jsonl}) == 1
  with open(tmp / "grid" / "results.csv") as f:
    table = list(csv.DictReader(f))
  assert table[7]["cell"] == "LR=2,DROPOUT=0.5,seed=1" and table[7]["task/accuracy"] == "206.0"
  assert table[7]["LR"] == "2" and table[7]["status"] == "ok"
  spec = json.loads((tmp / "grid" / "cells" / "LR=1,DROPOUT=0.5,seed=1" / "cell_spec.json")
                    .read_text())
  assert "LR = 1" in spec["gin_bindings"] and "DROPOUT = 0.5" in spec["phase_bindings"]
  assert "SEED = 1" in spec["phase_bindings"]


def test_cells_run_in_parallel_up_to_max_parallel(fake, monkeypatch):
  grid, invocations, tmp = fake
  monkeypatch.setenv("FAKE_SLEEP", "1.5")

  def max_overlap():
    events = sorted((e.get("start", e.get("end")), 1 if "start" in e else -1)
                    for e in invocations())
    level = peak = 0
    for _, d in events:
      level += d
      peak = max(peak, level)
    return peak

  grid({"LR": [1, 2, 3], "DROPOUT": [0.0]}, max_parallel=3, root=tmp / "a")
  assert max_overlap() >= 2
  (tmp / "calls.jsonl").unlink()
  grid({"LR": [1, 2, 3], "DROPOUT": [0.0]}, max_parallel=1, root=tmp / "b")
  assert max_overlap() == 1
  assert experiment.default_parallel() >= 1


def test_a_crashed_cell_is_reported_kept_in_the_table_and_rerun(fake, capfd):
  grid, invocations, tmp = fake
  axes = {"LR": [1, "crash"], "DROPOUT": [0.0]}
  with pytest.raises(experiment.GridError, match="1 of 2 cell\\(s\\) failed: "
                     "LR=crash,DROPOUT=0.0,seed=0"):
    grid(axes)
  err = capfd.readouterr().err
  assert "[grid] 2/2 done" not in err and "1 failed" in err and "FAILED" in err
  rows = experiment.read_jsonl(str(tmp / "grid" / "results.jsonl"))
  failed = rows[1]
  assert failed["status"] == "failed" and failed["metrics"] == {}
  assert "ValueError: loss is NaN at step 7" in failed["error"]
  with open(tmp / "grid" / "results.csv") as f:
    table = list(csv.DictReader(f))
  assert table[1]["status"] == "failed" and table[1]["task/accuracy"] == ""
  assert table[1]["error"] == "ValueError: loss is NaN at step 7"
  # The cause fixed, the same grid again: only the failed cell runs.
  (tmp / "fixed").write_text("")
  before = len([e for e in invocations() if "start" in e])
  rows = grid(axes)
  started = [e["cell"] for e in invocations() if "start" in e][before:]
  assert started == ["LR=crash,DROPOUT=0.0,seed=0"]
  assert [r["status"] for r in rows] == ["ok", "ok"] and rows[1]["metrics"]["task/accuracy"] == 0
  # A finished grid run again runs nothing.
  grid(axes)
  assert len([e for e in invocations() if "start" in e]) == before + 1


def test_a_changed_grid_in_the_same_root_is_refused(fake):
  grid, _, tmp = fake
  grid({"LR": [1], "DROPOUT": [0.0]})
  with pytest.raises(experiment.GridMismatch, match=r"axes\['LR'\]: stored \[1\], now \[1, 2\]"):
    grid({"LR": [1, 2], "DROPOUT": [0.0]})
  with pytest.raises(experiment.GridMismatch, match=r"seeds: stored \[0\], now \[0, 1\]"):
    grid({"LR": [1], "DROPOUT": [0.0]}, seeds=[0, 1])


def test_results_of_another_grid_are_refused(fake):
  grid, _, tmp = fake
  grid({"LR": [1], "DROPOUT": [0.0]})
  (tmp / "grid" / "grid.json").unlink()  # e.g. a results file copied into a fresh root
  other = json.loads((tmp / "grid" / "results.jsonl").read_text())["grid"]
  with pytest.raises(experiment.GridMismatch, match=f"holds results of grid {other}, not of "
                     "this grid"):
    grid({"LR": [3], "DROPOUT": [0.0]})


def test_a_typo_in_a_macro_name_suggests_the_closest(fake):
  grid, invocations, _ = fake
  with pytest.raises(ValueError, match="macro 'DROPUOT'.*neither define nor use. Did you mean "
                     "'DROPOUT'"):
    grid({"LR": [1], "DROPUOT": [0.0]})
  assert not invocations()
  # The real cell file: its macros include what its phases' gin files define.
  macros = experiment.known_macros(["experiments/grids/stilts_cell.gin"])
  assert {"INTERMEDIATE", "TARGET", "TRAIN_EXAMPLES", "LEARNING_RATE", "SEED"} <= macros
  with pytest.raises(ValueError, match="Did you mean 'INTERMEDIATE'"):
    experiment.check_axes({"INTERMEDAITE": [None]}, ["experiments/grids/stilts_cell.gin"])
  with pytest.raises(ValueError, match="non-empty list"):
    experiment.check_axes({"TARGET": []}, ["experiments/grids/stilts_cell.gin"])


def test_axes_seeds_and_max_parallel_of_the_wrong_kind_are_named(fake):
  grid, invocations, _ = fake
  # Before: AttributeError ('list' object has no attribute 'items').
  with pytest.raises(ValueError, match=r"^run_grid.axes must be a dict \{MACRO: \[values\]\}, "
                     r"e.g. .*, got the list \['LR', 'DROPOUT'\]\."):
    grid(["LR", "DROPOUT"])
  # Before: TypeError ('int' object is not iterable).
  with pytest.raises(ValueError, match=r"^run_grid.seeds must be a list of integer seeds, e.g. "
                     r"\[0, 1, 2\] .*, got 3\."):
    experiment.run_grid(root="/tmp/unused", cell_gin_files=["x.gin"], axes={"LR": [1]}, seeds=3)
  with pytest.raises(ValueError, match=r"run_grid.seeds must be a list of integer seeds.*'0'"):
    grid({"LR": [1]}, seeds=["0"])
  # Before: 0 ran the cells one at a time.
  with pytest.raises(ValueError, match=r"run_grid.max_parallel \(--max_parallel\) must be an "
                     "integer >= 1 .*, got 0"):
    grid({"LR": [1], "DROPOUT": [0.0]}, max_parallel=0)
  assert not invocations()
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl.testing import flagsaver  # pylint: disable=g-import-not-at-top
  with flagsaver.flagsaver():
    flags.FLAGS(["t2t.experiment", "--max_parallel=0"])
    with pytest.raises(ValueError, match=r"^--max_parallel must be at least 1 \(cells run at "
                       r"once\), got 0\.$"):
      experiment.main([])


def test_chain_metrics_take_the_last_evaluated_phase_and_average_restarts():
  chain = {"inter": {"eval": {"metrics": {"a": {"accuracy": 50.0}}}, "model_dir": "/nonexistent"},
           "skipped": {"phase": "skipped", "disabled": True},
           "target": {"runs": [{"eval": {"metrics": {"b": {"accuracy": 60.0}}}, "model_dir": "/n"},
                               {"eval": {"metrics": {"b": {"accuracy": 70.0}}}, "model_dir": "/n"}],
                      "restarts": {}}}
  out = experiment.chain_metrics(chain)
  assert out["result_phase"] == "target" and out["metrics"] == {"b/accuracy": 65.0}
  assert out["phase_metrics"]["inter"] == {"a/accuracy": 50.0}


TINY = ["T5Config.d_model = 32", "T5Config.d_ff = 64", "T5Config.num_heads = 2",
        "T5Config.d_kv = 16", "T5Config.num_encoder_layers = 1", "T5Config.num_decoder_layers = 1",
        "BATCH_SIZE = 4", "EVAL_NUM_EXAMPLES = 8", "EVAL_BATCH_SIZE = 4",
        "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 4}"]


def test_a_disabled_phase_is_skipped_and_the_next_starts_from_the_one_before(tmp_path, capfd):
  from t2t import phases
  chain = [phases.Phase(name="first", gin_files=["experiments/bbc_demo/finetune.gin"]),
           phases.Phase(name="inter", gin_files=["experiments/bbc_demo/finetune.gin"],
                        enabled=None),
           phases.Phase(name="target", gin_files=["experiments/bbc_demo/finetune.gin"])]
  records = phases.Runner(str(tmp_path), chain, dry_run=True).run()
  assert records["inter"] == {"phase": "inter", "disabled": True}
  err = capfd.readouterr().err
  assert "[inter] disabled (Phase.enabled=None); skipping." in err
  assert "[inter: train]" not in err
  target_cmd = err[err.index("[target: train]"):]
  assert f"--gin.INITIAL_CHECKPOINT_PATH={tmp_path / 'first'}" in target_cmd


def test_real_grid_cell_from_the_command_line(tmp_path):
  """One real cell of experiments/grids/stilts_cell.gin (INTERMEDIATE None: the baseline, whose
  intermediate phase is skipped), run as a user would; a second invocation runs nothing."""
  grid_gin = tmp_path / "grid.gin"
  grid_gin.write_text(
      "import t2t.experiment\n"
      "run_grid.cell_gin_files = ['experiments/grids/stilts_cell.gin']\n"
      "run_grid.axes = {'INTERMEDIATE': [None]}\n"
      "run_grid.seeds = [0]\n"
      "run_grid.bindings = ['TARGET_STEPS = 2', 'TRAIN_EXAMPLES = 8']\n"
      f"run_grid.phase_bindings = {TINY!r}\n")
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  cmd = [sys.executable, "-m", "t2t.experiment", f"--gin_file={grid_gin}",
         f"--gin.run_grid.root={tmp_path / 'root'}"]
  start = time.time()
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "[grid] 1/1 done, 0 running, 0 failed" in out.stderr
  row, = experiment.read_jsonl(str(tmp_path / "root" / "results.jsonl"))
  cell = tmp_path / "root" / "cells" / "INTERMEDIATE=none,seed=0"
  assert row["cell"] == cell.name and row["status"] == "ok"
  metrics = json.loads((cell / "phases" / "target" / "eval" / "metrics.json").read_text())
  assert row["metrics"]["bbc_topic/accuracy"] == pytest.approx(
      metrics["metrics"]["bbc_topic"]["accuracy"])
  assert set(row["metrics"]) == {"bbc_topic/accuracy", "bbc_topic/macro_f1"}
  assert 0 < row["wall_s"] < time.time() - start
  assert not (cell / "phases" / "intermediate").exists()
  assert "disabled (Phase.enabled=None)" in (cell / "log.txt").read_text()
  assert "--gin.LIMITED_TASK=bbc_topic" in (cell / "log.txt").read_text()
  again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0 and "1 done earlier, 0 to run" in again.stderr
