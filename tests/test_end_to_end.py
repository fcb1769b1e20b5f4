"""End to end through the command line, on the offline BBC data with a tiny T5:
pre-train -> checkpoint -> resume -> fine-tune -> eval -> infer, and the bad-input errors.

Each step runs `python -m t2t.<entry point>` in a subprocess, as a user would.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The demo's architecture, shrunk further so that each step compiles and runs in seconds.
TINY = ["--gin.T5Config.d_model=32", "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2",
        "--gin.T5Config.d_kv=16", "--gin.T5Config.num_encoder_layers=1",
        "--gin.T5Config.num_decoder_layers=1", "--gin.BATCH_SIZE=4"]


def t2t(entry, *args, check=True):
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run([sys.executable, "-m", f"t2t.{entry}", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  if check:
    assert out.returncode == 0, f"{entry} failed:\n{out.stderr[-4000:]}"
  return out


def steps_in(model_dir):
  return sorted(int(d.split("_")[1]) for d in os.listdir(model_dir) if d.startswith("checkpoint_"))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("e2e") / "pretrain")
  args = ["--gin_file=experiments/bbc_demo/pretrain.gin", f"--gin.MODEL_DIR={model_dir}",
          "--gin.CHECKPOINT_EVERY=2", *TINY]
  t2t("train", *args, "--gin.TRAIN_STEPS=2")
  assert steps_in(model_dir) == [2]
  out = t2t("train", *args, "--gin.TRAIN_STEPS=4")  # resumes from checkpoint_2
  assert "Resuming from" in out.stderr and "at step 2" in out.stderr
  return model_dir


def test_pretrain_writes_and_resumes(pretrained):
  assert steps_in(pretrained) == [2, 4]
  operative = open(os.path.join(pretrained, "config.gin")).read()
  assert "MIXTURE_OR_TASK_NAME = 'bbc_span_corruption'" in operative
  assert "TRAIN_STEPS = 4" in operative and "train.train_steps = %TRAIN_STEPS" in operative
  records = [json.loads(l) for l in open(os.path.join(pretrained, "metrics.jsonl"))]
  assert [r["step"] for r in records] == [2, 4]
  assert all(r["loss"] > 0 and r["tokens_per_sec"] > 0 for r in records)
  assert os.listdir(os.path.join(pretrained, "train"))  # TensorBoard events


@pytest.fixture(scope="module")
def finetuned(pretrained):
  model_dir = os.path.join(os.path.dirname(pretrained), "finetune")
  out = t2t("train", "--gin_file=experiments/bbc_demo/finetune.gin",
            f"--gin.MODEL_DIR={model_dir}", f"--gin.INITIAL_CHECKPOINT_PATH={pretrained}",
            "--gin.TRAIN_STEPS=2", "--gin.CHECKPOINT_EVERY=2", *TINY)
  assert f"Initialised parameters from {pretrained} (step 4)" in out.stderr
  assert steps_in(model_dir) == [2]
  return model_dir


def test_eval_writes_metrics_and_predictions(finetuned, tmp_path):
  out = t2t("eval", "--gin_file=experiments/bbc_demo/eval.gin",
            f"--gin.CHECKPOINT_PATH={finetuned}", f"--gin.EVAL_OUTPUT_DIR={tmp_path}",
            "--gin.EVAL_NUM_EXAMPLES=8", "--gin.EVAL_BATCH_SIZE=4", *TINY[:-1])
  report = json.load(open(tmp_path / "metrics.json"))
  assert report["step"] == 2 and report["split"] == "validation"
  metrics = report["metrics"]["bbc_topic"]
  assert 0 <= metrics["accuracy"] <= 100 and 0 <= metrics["macro_f1"] <= 100
  assert "bbc_topic: accuracy" in out.stdout
  rows = [json.loads(l) for l in open(tmp_path / "bbc_topic.validation.predictions.jsonl")]
  assert len(rows) == 8
  assert all(r["inputs"].startswith("bbc topic: ") for r in rows)
  labels = {"business", "entertainment", "politics", "sports", "tech"}
  assert all(r["target"] in labels for r in rows)
  hits = sum(r["postprocessed"] == r["target"] for r in rows)
  assert metrics["accuracy"] == pytest.approx(100.0 * hits / 8)


def test_infer_decodes_a_text_file_and_a_task_split(finetuned, tmp_path):
  inputs = tmp_path / "inputs.txt"
  inputs.write_text("bbc topic: Shares fell sharply on Monday.\nbbc topic: A new album.\n")
  common = ["--gin_file=experiments/bbc_demo/model.gin", "--gin_file=runs/infer.gin",
            f"--gin.CHECKPOINT_PATH={finetuned}", f"--gin.INFER_OUTPUT_DIR={tmp_path}",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 4}",
            "--gin.INFER_BATCH_SIZE=4", *TINY[:-1]]
  out = t2t("infer", *common, f"--gin.INPUT_FILE={inputs}")
  rows = [json.loads(l) for l in open(tmp_path / "inputs.jsonl")]
  assert [r["inputs"] for r in rows] == ["bbc topic: Shares fell sharply on Monday.",
                                         "bbc topic: A new album."]
  assert all(isinstance(r["prediction"], str) for r in rows)
  assert out.stdout.strip().endswith("inputs.jsonl")
  t2t("infer", *common, "--gin.MIXTURE_OR_TASK_NAME=bbc_topic", "--gin.INFER_NUM_EXAMPLES=5")
  rows = [json.loads(l) for l in open(tmp_path / "bbc_topic.test.jsonl")]
  assert len(rows) == 5 and all("target" in r and "prediction" in r for r in rows)


# --- bad input: one clear message, no traceback ---------------------------------------------------


def _assert_clean_error(out, *fragments):
  assert out.returncode != 0
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  for fragment in fragments:
    assert fragment in out.stderr, out.stderr[-3000:]


def test_unknown_task_lists_the_closest_names(tmp_path):
  out = t2t("train", "--gin_file=experiments/bbc_demo/finetune.gin",
            f"--gin.MODEL_DIR={tmp_path}", "--gin.INITIAL_CHECKPOINT_PATH=None",
            "--gin.MIXTURE_OR_TASK_NAME=bbc_topc", *TINY, check=False)
  _assert_clean_error(out, "Unknown task or mixture 'bbc_topc'", "Did you mean: bbc_topic")


def test_unset_required_macro_names_macro_and_file(tmp_path):
  out = t2t("train", "--gin_file=experiments/bbc_demo/finetune.gin",
            f"--gin.MODEL_DIR={tmp_path}", check=False)
  _assert_clean_error(out, "INITIAL_CHECKPOINT_PATH", os.path.join("runs", "finetune.gin"))
  assert not os.listdir(tmp_path)  # nothing written


def test_incompatible_model_dir_is_refused_and_untouched(pretrained):
  before = {f: os.path.getmtime(os.path.join(pretrained, f)) for f in os.listdir(pretrained)}
  out = t2t("train", "--gin_file=experiments/bbc_demo/pretrain.gin",
            f"--gin.MODEL_DIR={pretrained}", "--gin.TRAIN_STEPS=6",
            *[a.replace("d_model=32", "d_model=48") for a in TINY], check=False)
  _assert_clean_error(out, "does not fit the configured model", "(32,)", "(48,)")
  after = {f: os.path.getmtime(os.path.join(pretrained, f)) for f in os.listdir(pretrained)}
  assert before == after
