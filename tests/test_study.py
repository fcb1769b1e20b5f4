"""Tests for t2t/study.py: two rows sharing a pre-training phase, run as a user would
(`python -m t2t.study`) with a very small T5, then resumed; the table and study.json."""
import json
import os
import subprocess
import sys

import pytest

from t2t import study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["T5Config.d_model = 32", "T5Config.d_ff = 64", "T5Config.num_heads = 2",
        "T5Config.d_kv = 16", "T5Config.num_encoder_layers = 1", "T5Config.num_decoder_layers = 1",
        "BATCH_SIZE = 4", "TRAIN_STEPS = 2", "EVAL_NUM_EXAMPLES = 8", "EVAL_BATCH_SIZE = 4",
        "TRAIN_EXAMPLES = 16"]

# Row A is phase 'shared' (bbc_topic from scratch, evaluated); row B chains it into a frozen
# T5-encoder classifier with a scalar mix, restored partially (the decoder skipped, the head new).
STUDY = """
import t2t.study
run_study.title = 'tiny study'
run_study.rows = {'A: from scratch': [@shared/Phase()],
                  'B: frozen + mix': [@shared/Phase(), @b/Phase()]}
shared/Phase.name = 'shared'
shared/Phase.gin_files = ['experiments/bbc_demo/finetune.gin']
shared/Phase.bindings = {'INITIAL_CHECKPOINT_PATH': None}
shared/Phase.eval_gin_files = ['experiments/bbc_demo/eval.gin']
shared/Phase.seeds = [0]
b/Phase.name = 'b'
b/Phase.gin_files = ['experiments/transfer_study/t5_classifier.gin',
                     'adaptation/freeze_encoder.gin']
b/Phase.bindings = {'ClassifierModel.scalar_mix': True}
b/Phase.partial_restore = True
b/Phase.eval_gin_files = ['experiments/bbc_demo/eval.gin', 'models/classifiers/t5_encoder.gin',
                          'experiments/transfer_study/labels.gin']
b/Phase.eval_bindings = {'ClassifierModel.scalar_mix': True}
b/Phase.seeds = [0, 1]
b/Phase.metric = 'bbc_topic/accuracy'
"""


def run_study(*args):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run([sys.executable, "-m", "t2t.study", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-5000:]
  return out.stdout + out.stderr


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
  base = tmp_path_factory.mktemp("study")
  (base / "study.gin").write_text(STUDY)
  root, report = base / "root", base / "report.md"
  args = [f"--gin_file={base / 'study.gin'}", f"--gin.run_study.root='{root}'",
          f"--gin.run_study.report_path='{report}'",
          *[f"--phase_bindings={b}" for b in TINY]]
  first = run_study(*args)
  second = run_study(*args)
  return root, report, first, second


def test_rows_share_the_pretraining_phase_and_report_restarts(ran):
  root, report, first, _ = ran
  assert first.count("[shared (seed 0): train]") == 1  # run once, reused by row B
  assert "done earlier" in first
  assert "Initialised parameters from" in first and "decoder" in first  # B's partial restore
  record = json.loads((root / study.STUDY_FILE).read_text())
  assert record["title"] == "tiny study"
  rows = record["rows"]
  assert list(rows) == ["A: from scratch", "B: frozen + mix"]
  assert rows["B: frozen + mix"]["chain"] == ["shared", "b"]
  b = rows["B: frozen + mix"]["restarts"]
  assert b["metric"] == "bbc_topic/accuracy" and b["num_runs"] == 2
  for run in b["runs"]:  # each seed's value is its own eval's accuracy
    metrics = json.loads((root / "b" / run["run"] / "eval" / "metrics.json").read_text())
    assert run["value"] == pytest.approx(metrics["metrics"]["bbc_topic"]["accuracy"])
  table = report.read_text()
  assert table == (root / study.TABLE_FILE).read_text()
  line = next(l for l in table.splitlines() if l.startswith("| B: frozen + mix"))
  assert f"{b['mean']:.1f} ± {b['std']:.1f}" in line and "shared → b" in line
  assert f"/{b['num_runs']} |" in line


def test_second_invocation_skips_everything_and_keeps_wall_times(ran):
  root, _, first, second = ran
  assert "-m t2t.train" not in second and "-m t2t.eval" not in second
  assert second.count("skipping") == 4  # A: shared; B: shared, b/seed_0, b/seed_1
  rows = json.loads((root / study.STUDY_FILE).read_text())["rows"]
  assert all(r["wall_s"] > 0 for r in rows.values())


def test_a_row_without_restarts_is_refused():
  from t2t import phases
  with pytest.raises(ValueError, match="row 'x'.*seeds"):
    study.run_study(root="/tmp/unused", rows={"x": [phases.Phase(name="p")]})


def test_a_failing_row_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
  from t2t import phases
  monkeypatch.chdir(ROOT)
  bad = phases.Phase(name="bad", gin_files=["experiments/bbc_demo/finetune.gin"],
                     bindings={"MIXTURE_OR_TASK_NAME": "no_such_task",
                               "INITIAL_CHECKPOINT_PATH": None},
                     eval_gin_files=["experiments/bbc_demo/eval.gin"], seeds=[0])
  with pytest.raises(study.StudyError, match="1 row\\(s\\) failed: broken"):
    study.run_study(root=str(tmp_path), rows={"broken": [bad]}, title="t")
  record = json.loads((tmp_path / study.STUDY_FILE).read_text())["rows"]["broken"]
  assert "bad (seed 0): train failed" in record["error"] and "restarts" not in record
  assert "| broken | bad | failed (see study.json) |" in (tmp_path / study.TABLE_FILE).read_text()


def test_the_published_study_leaves_its_committed_table_alone_by_default():
  # A smoke or one-row run of the README's command once replaced docs/studies/bbc_topic_200.md.
  import gin  # pylint: disable=g-import-not-at-top
  from t2t import config  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    config.parse_gin(["experiments/transfer_study/bbc_topic_200.gin"], ["STUDY_ROOT = '/tmp/s'"])
    assert len(gin.query_parameter("run_study.rows")) >= 8  # the file did parse
    with pytest.raises(ValueError):
      gin.query_parameter("run_study.report_path")
  finally:
    gin.clear_config()


def test_a_half_written_study_json_is_named_with_what_to_do(tmp_path):
  from t2t import phases
  path = tmp_path / study.STUDY_FILE
  path.write_text('{"command": "python -m t2t.study", "rows": {"A": {"chain": ["sh')
  row = [phases.Phase(name="p", seeds=[0], eval_gin_files=["experiments/bbc_demo/eval.gin"])]
  with pytest.raises(ValueError, match=f"^{path} is not valid JSON .*: a half-written file\\? "
                                       "Delete it and run the study's command again"):
    study.run_study(root=str(tmp_path), rows={"A": row})
  assert path.read_text().endswith('["sh')  # left as it was
