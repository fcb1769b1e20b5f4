"""Tests for t2t/eval.py: every seqio metric type, predictions of different lengths, mixtures,
and the bad-input cases (a task with no metric, a postprocessor that raises, a failing metric).

The end-to-end part trains one tiny T5 through the CLI on a mixture of `bbc_headline` (ROUGE,
16-token targets) and `bbc_topic_phrases` (labels of 1-4 pieces; predict, score and
predict-with-aux metrics), long enough that its greedy decodes stop at different lengths (after
125 steps without dropout, so that no dropout generator decides it: 2 and 3 pieces for the topics,
1 and 3 for the headlines), then evaluates and decodes with `t2t.eval` / `t2t.infer`
and recomputes every metric from the files.
"""
import json
import os

import numpy as np
import pytest
import seqio

from t2t import eval as eval_lib
from t2t import train as train_lib
from t2t.data import metrics, postprocessors, vocabularies
from t2t.training import optim
from tests.support import eval_tasks
from tests.test_end_to_end import t2t
from tests.training import toy

TINY = ["--gin.T5Config.d_model=32", "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2",
        "--gin.T5Config.d_kv=16", "--gin.T5Config.num_encoder_layers=1",
        "--gin.T5Config.num_decoder_layers=1"]
IMPORT = "--gin_bindings=import tests.support.eval_tasks"


def _rows(path):
  return [json.loads(line) for line in open(path)]


def _num_pieces(text):
  return len(vocabularies.bbc_vocabulary().encode(text))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp("eval") / "model")
  t2t("train", "--gin_file=experiments/bbc_demo/finetune.gin", IMPORT,
      f"--gin.MIXTURE_OR_TASK_NAME={eval_tasks.MIXTURE_NAME}",
      "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 16}", f"--gin.MODEL_DIR={model_dir}",
      "--gin.INITIAL_CHECKPOINT_PATH=None", "--gin.TRAIN_STEPS=125", "--gin.CHECKPOINT_EVERY=125",
      "--gin.LEARNING_RATE=0.01", "--gin.BATCH_SIZE=16", "--gin.T5Config.dropout_rate=0.0", *TINY)
  return model_dir


@pytest.fixture(scope="module")
def evaluated(trained, tmp_path_factory):
  out_dir = tmp_path_factory.mktemp("eval_out")
  out = t2t("eval", "--gin_file=experiments/bbc_demo/model.gin", "--gin_file=runs/eval.gin", IMPORT,
            f"--gin.MIXTURE_OR_TASK_NAME={eval_tasks.MIXTURE_NAME}",
            f"--gin.CHECKPOINT_PATH={trained}", f"--gin.EVAL_OUTPUT_DIR={out_dir}",
            "--gin.EVAL_NUM_EXAMPLES=16", "--gin.EVAL_BATCH_SIZE=8", *TINY)
  return out_dir, out


def test_a_mixture_with_different_lengths_and_metric_types_evaluates_in_one_run(evaluated):
  out_dir, out = evaluated
  report = json.load(open(out_dir / "metrics.json"))["metrics"]
  assert set(report) == {"bbc_headline", "bbc_topic_phrases"}
  assert "bbc_headline: rouge1" in out.stdout and "bbc_topic_phrases: accuracy" in out.stdout

  topic = _rows(out_dir / "bbc_topic_phrases.validation.predictions.jsonl")
  headline = _rows(out_dir / "bbc_headline.validation.predictions.jsonl")
  assert len(topic) == len(headline) == 16
  # The defect's trigger: within each task the decodes stop at different lengths.
  assert len({_num_pieces(r["prediction"]) for r in topic}) > 1
  assert len({_num_pieces(r["prediction"]) for r in headline}) > 1
  assert all(r["target"] in eval_tasks.PHRASES.values() for r in topic)

  # Each metric recomputed by hand from the predictions files.
  got = report["bbc_topic_phrases"]
  hits = sum(r["postprocessed"] == r["target"] for r in topic)
  assert got["accuracy"] == pytest.approx(100.0 * hits / 16)
  assert got["mean_target_log_likelihood"] == pytest.approx(np.mean([r["score"] for r in topic]),
                                                            rel=1e-6)
  assert got["mean_prediction_log_likelihood"] == pytest.approx(
      np.mean([r["aux_scores"] for r in topic]), rel=1e-6)
  assert all(r["score"] < 0 and r["aux_scores"] < 0 for r in topic)
  by_hand = metrics.rouge([r["target"] for r in headline], [r["postprocessed"] for r in headline])
  assert report["bbc_headline"] == pytest.approx(by_hand)


def _infer_in_this_process(*args):
  """`python -m t2t.infer ARGS` without the process start-up: absl parses the argv `t2t.cli.run`
  would give it (`--gin.X=V` rewritten), then `t2t.infer.main` runs; the flags are reset after."""
  from t2t import cli, config
  from t2t import infer as infer_lib
  cli.FLAGS(["t2t.infer", *config.rewrite_gin_args(args)])
  try:
    infer_lib.main([])
  finally:
    cli.FLAGS.unparse_flags()


def test_a_files_task_of_the_same_examples_evaluates_the_same(trained, evaluated, tmp_path):
  """Your own JSON Lines file (t2t/data/files.py, gin/recipes/files_task.gin) holding the 16
  `bbc_topic_phrases` examples evaluated above: the same predictions and accuracy, and each row
  names its file line."""
  from t2t import cli, config
  out_dir, _ = evaluated
  topic = _rows(out_dir / "bbc_topic_phrases.validation.predictions.jsonl")
  assert all(r["inputs"].startswith("topic: ") for r in topic)
  dev = tmp_path / "dev.jsonl"
  dev.write_text("".join(json.dumps({"text": r["inputs"][len("topic: "):], "label": r["target"]})
                         + "\n" for r in topic))
  cli.FLAGS(["t2t.eval", *config.rewrite_gin_args([
      "--gin_file=experiments/bbc_demo/model.gin", "--gin_file=runs/eval.gin",
      "--gin_file=recipes/files_task.gin", "--gin.FILES_TASK='topic_from_files'",
      f"--gin.FILES_SPLITS={{'validation': '{dev}'}}", "--gin.files_task.prefix='topic:'",
      "--gin.files_task.inputs_key='text'", "--gin.files_task.targets_key='label'",
      "--gin.task_vocabulary.vocabulary=@bbc_vocabulary()", f"--gin.CHECKPOINT_PATH={trained}",
      f"--gin.EVAL_OUTPUT_DIR={tmp_path / 'eval'}", "--gin.EVAL_BATCH_SIZE=8", *TINY])])
  try:
    eval_lib.main([])
  finally:
    cli.FLAGS.unparse_flags()
  rows = _rows(tmp_path / "eval" / "topic_from_files.validation.predictions.jsonl")
  assert [r["id"] for r in rows] == [f"dev.jsonl:{n}" for n in range(1, 17)]
  assert [r["inputs"] for r in rows] == [r["inputs"] for r in topic]
  assert [r["prediction"] for r in rows] == [r["prediction"] for r in topic]
  report = json.load(open(tmp_path / "eval" / "metrics.json"))["metrics"]
  assert report["topic_from_files"]["accuracy"] == pytest.approx(
      json.load(open(out_dir / "metrics.json"))["metrics"]["bbc_topic_phrases"]["accuracy"])
  # A registered task's own string ids are written too (bbc_headline keeps the article's).
  headline = _rows(out_dir / "bbc_headline.validation.predictions.jsonl")
  assert all(r["id"].endswith(".txt") and "/" in r["id"] for r in headline)


def test_infer_decodes_the_same_text_as_eval(trained, evaluated, tmp_path):
  out_dir, _ = evaluated
  topic = _rows(out_dir / "bbc_topic_phrases.validation.predictions.jsonl")
  inputs = tmp_path / "articles.txt"
  inputs.write_text("".join(r["inputs"] + "\n" for r in topic))
  common = ["--gin_file=experiments/bbc_demo/model.gin", "--gin_file=runs/infer.gin", IMPORT,
            f"--gin.CHECKPOINT_PATH={trained}", f"--gin.INFER_OUTPUT_DIR={tmp_path}",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 4096, 'targets': 16}",
            "--gin.INFER_BATCH_SIZE=8", *TINY]
  t2t("infer", *common, f"--gin.INPUT_FILE={inputs}")
  decoded = _rows(tmp_path / "articles.jsonl")
  assert [r["inputs"] for r in decoded] == [r["inputs"] for r in topic]
  assert [r["prediction"] for r in decoded] == [r["prediction"] for r in topic]
  # From the task split too: same inputs, same decodes, and the targets alongside. The CLI ran
  # above; this run gives the same flags to its `main` here (a second subprocess would only add
  # its start-up: importing TensorFlow and t2t again).
  _infer_in_this_process(*common, "--gin.MIXTURE_OR_TASK_NAME=bbc_topic_phrases",
                         "--gin.INFER_SPLIT=validation", "--gin.INFER_NUM_EXAMPLES=16")
  split = _rows(tmp_path / "bbc_topic_phrases.validation.jsonl")
  assert [r["prediction"] for r in split] == [r["prediction"] for r in topic]
  assert [r["target"] for r in split] == [r["target"] for r in topic]


# --- in-process: the toy copy task and bad input ---------------------------------------------------


@pytest.fixture(scope="module")
def toy_checkpoint(tmp_path_factory):
  toy.register()
  model_dir = str(tmp_path_factory.mktemp("toy"))
  train_lib.train(model=toy.model(), mixture_or_task_name=toy.TASK,
                  task_feature_lengths=toy.LENGTHS, train_steps=1, model_dir=model_dir,
                  batch_size=4, optimizer=optim.adafactor(learning_rate=0.01))
  return model_dir


def _register_toy_variant(name, **kwargs):
  base = seqio.get_mixture_or_task(toy.TASK)
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(name, source=base.source, preprocessors=base.preprocessors,
                         output_features=base.output_features, **kwargs)


def _evaluate(task, checkpoint, out_dir):
  return eval_lib.evaluate(model=toy.model(), mixture_or_task_name=task, checkpoint_path=checkpoint,
                           output_dir=str(out_dir), num_examples=8, batch_size=4,
                           task_feature_lengths=toy.LENGTHS)


def test_a_task_without_metrics_is_named(toy_checkpoint, tmp_path):
  _register_toy_variant("toy_no_metrics")
  with pytest.raises(ValueError, match="'toy_no_metrics' has no metric_fns"):
    _evaluate("toy_no_metrics", toy_checkpoint, tmp_path)
  assert not os.listdir(tmp_path)


def test_predictions_a_postprocessor_rejects_count_as_wrong(toy_checkpoint, tmp_path, capsys):
  def only_short(output, example=None, is_target=False):
    del example
    if not is_target and len(output) > 3:
      raise ValueError(f"cannot parse {output!r}")
    return output

  _register_toy_variant("toy_strict", postprocess_fn=only_short, metric_fns=[toy._accuracy])
  results = _evaluate("toy_strict", toy_checkpoint, tmp_path)
  rows = _rows(tmp_path / "toy_strict.validation.predictions.jsonl")
  rejected = [r for r in rows if r["postprocessed"] == postprocessors.INVALID_LABEL]
  assert rejected  # the 1-step model's decodes are long: the postprocessor raises on them
  hits = sum(r["postprocessed"] == r["target"] for r in rows)
  assert results["toy_strict"]["accuracy"] == pytest.approx(100.0 * hits / len(rows))
  assert f"toy_strict: {len(rejected)} prediction(s) could not be postprocessed" in (
      capsys.readouterr().err)


def test_a_postprocessor_failing_on_a_target_names_the_task(toy_checkpoint, tmp_path):
  def broken(output, example=None, is_target=False):
    raise KeyError("no such label")

  _register_toy_variant("toy_bad_targets", postprocess_fn=broken, metric_fns=[toy._accuracy])
  with pytest.raises(eval_lib.BadTargetError, match="Task 'toy_bad_targets'"):
    _evaluate("toy_bad_targets", toy_checkpoint, tmp_path)


def test_a_failing_metric_keeps_its_cause(toy_checkpoint, tmp_path):
  def buggy_metric(targets, predictions):
    raise ZeroDivisionError("a bug in the metric")

  _register_toy_variant("toy_buggy_metric", metric_fns=[buggy_metric])
  with pytest.raises(eval_lib.TaskEvaluationError, match="toy_buggy_metric") as info:
    _evaluate("toy_buggy_metric", toy_checkpoint, tmp_path)
  # The cause and where it happened are shown (gin re-raises without the exception chain).
  assert "ZeroDivisionError: a bug in the metric" in str(info.value)
  assert "in buggy_metric" in str(info.value)
  # Not a bad-input error: the CLI shows its traceback instead of one line.
  assert not isinstance(info.value, (ValueError, FileNotFoundError, RuntimeError, ImportError))


def test_invalid_values_never_equal_their_target():
  for target in ("business", 3, 2.5, True, False, np.int64(1), np.float32(0.5)):
    assert eval_lib._invalid_like(target) != target
