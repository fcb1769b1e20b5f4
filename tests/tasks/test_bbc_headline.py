"""The worked example task `bbc_headline` on the real BBC articles, and its fine-tuning gin file."""
import importlib
import os
import subprocess
import sys

import gin
import seqio

from t2t import config
from t2t.data import metrics, sources
from tasks.examples import bbc_headline
from tools import inspect_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GIN_FILE = "experiments/bbc_headline.gin"


def _expected(article):
  """(inputs, targets) as the task documents them, computed here from the raw article text."""
  headline, body = article["text"].split("\n", 1)
  return "headline: " + " ".join(body.split()), headline.strip()


def test_examples_have_the_documented_form():
  task = seqio.get_mixture_or_task("bbc_headline")
  vocab = task.output_features["targets"].vocabulary
  ds = task.get_dataset({"inputs": 32, "targets": 24}, split="validation", shuffle=False)
  examples = list(ds.as_numpy_iterator())
  articles = sources.bbc_articles("validation")
  assert len(examples) == len(articles) == 211
  for ex, article in zip(examples, articles):
    inputs, headline = _expected(article)
    assert ex["id"].decode() == article["id"]
    assert ex["inputs_pretokenized"].decode() == inputs
    assert ex["targets_pretokenized"].decode() == headline
    assert headline not in inputs[:len(headline) + 12]  # the body no longer opens with it
    assert len(ex["inputs"]) == 32 and ex["inputs"][-1] == vocab.eos_id  # every body is longer
    assert inputs.startswith(vocab.decode(ex["inputs"].tolist()))
    assert vocab.decode(ex["targets"].tolist()) == headline  # no headline is cut at 24 tokens


def test_postprocessing_and_rouge():
  task = seqio.get_mixture_or_task("bbc_headline")
  assert task.metric_fns == [metrics.rouge]
  assert task.postprocess_fn(" Ad sales boost Time Warner profit \n") == "Ad sales boost Time Warner profit"
  targets = ["Ad sales boost Time Warner profit", "High fuel prices hit BA's profits"]
  assert metrics.rouge(targets, targets)["rouge1"] == 100.0
  partial = metrics.rouge(targets, ["Time Warner profit", "Fuel prices rise"])
  assert 0 < partial["rouge1"] < 100 and partial["rouge2"] < partial["rouge1"]


def test_reimporting_replaces_the_task():
  module = importlib.reload(bbc_headline)  # adding the same name twice would raise
  task = seqio.get_mixture_or_task("bbc_headline")
  assert task.preprocessors[0] is module.headline_from_first_line  # the new registration


def test_gin_feature_lengths_truncate_no_training_headline():
  config.parse_gin([GIN_FILE], ["MODEL_DIR = '/unused'", "INITIAL_CHECKPOINT_PATH = None"])
  lengths = gin.query_parameter("%TASK_FEATURE_LENGTHS")
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "bbc_headline"
  report = inspect_task.inspect("bbc_headline", split="train", n=0, max_examples=2000,
                                inputs_length=lengths["inputs"], targets_length=lengths["targets"])
  assert report["stats"]["targets"]["count"] == sources.bbc_num_examples()["train"]
  assert report["stats"]["targets"]["truncated"] == 0
  assert report["stats"]["inputs"]["median"] > lengths["inputs"]  # inputs: the opening only


def test_finetune_command_writes_a_checkpoint(tmp_path):
  model_dir = tmp_path / "headline"
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run(
      [sys.executable, "-m", "t2t.train", f"--gin_file={GIN_FILE}", f"--gin.MODEL_DIR={model_dir}",
       "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=4", "--gin.INITIAL_CHECKPOINT_PATH=None",
       # One small layer each side: the same task and lengths, compiled in seconds.
       "--gin.T5Config.num_encoder_layers=1", "--gin.T5Config.num_decoder_layers=1",
       "--gin.T5Config.d_model=32", "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2",
       "--gin.T5Config.d_kv=16"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  assert (model_dir / "checkpoint_2").is_dir()
  operative = (model_dir / "config.gin").read_text()
  assert "import tasks.examples.bbc_headline" in operative
  assert "MIXTURE_OR_TASK_NAME = 'bbc_headline'" in operative
