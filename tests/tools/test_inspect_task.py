"""tools.inspect_task on the offline BBC tasks: examples, untruncated lengths, errors, the CLI."""
import os
import subprocess
import sys

import numpy as np
import pytest
import seqio

import tasks  # noqa: F401  (registers the BBC tasks)
from t2t.data import sources, vocabularies
from tools import inspect_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def topic_lengths():
  """Token counts (EOS included) of bbc_topic's validation inputs, computed here independently."""
  vocab = vocabularies.bbc_vocabulary()
  articles = sources.bbc_articles("validation")
  texts = ["bbc topic: " + " ".join(a["text"].split()) for a in articles]
  return articles, [len(vocab.encode(t)) + 1 for t in texts]


def test_bbc_topic_examples_and_untruncated_lengths(topic_lengths):
  articles, lengths = topic_lengths
  report = inspect_task.inspect("bbc_topic", split="validation", n=3, inputs_length=128,
                                targets_length=4)
  assert report["kind"] == "Task" and report["num_input_examples"] == len(articles) == 211
  assert all(v is None for v in report["pipeline_lengths"].values())  # nothing was trimmed
  assert len(report["examples"]) == 3
  for shown, article, length in zip(report["examples"], articles, lengths):
    assert shown["id"] == article["id"]
    assert shown["inputs"]["text"] == "bbc topic: " + " ".join(article["text"].split())
    assert shown["inputs"]["num_tokens"] == length
    assert shown["targets"] == {"text": article["category"], "num_tokens": 2}  # label + EOS
  inputs = report["stats"]["inputs"]
  assert inputs["count"] == 211 and inputs["limit"] == 128
  assert (inputs["min"], inputs["max"]) == (min(lengths), max(lengths))
  assert inputs["median"] == float(np.median(lengths))
  assert inputs["min"] <= inputs["p90"] <= inputs["p99"] <= inputs["max"]
  assert inputs["truncated"] == sum(l > 128 for l in lengths) > 0
  assert report["stats"]["targets"]["truncated"] == 0


def test_max_examples_and_no_limit():
  report = inspect_task.inspect("bbc_topic", split="validation", n=0, max_examples=7)
  assert report["examples"] == []
  assert report["stats"]["inputs"]["count"] == 7
  assert report["stats"]["inputs"]["truncated"] is None
  assert "(give a length)" in inspect_task.format_report(report)


def test_span_corruption_is_built_with_only_the_length_it_needs():
  with pytest.raises(ValueError, match="--inputs_length"):
    inspect_task.inspect("bbc_span_corruption", split="validation", max_examples=5)
  report = inspect_task.inspect("bbc_span_corruption", split="validation", n=2, inputs_length=64,
                                targets_length=8, max_examples=40)
  assert report["pipeline_lengths"] == {"inputs": 64, "targets": None}
  shown = report["examples"][0]
  assert "<extra_id_0>" in shown["inputs"]["text"]  # no text kept: the decoded tokens are shown
  assert shown["targets"]["text"].startswith("<extra_id_0>")
  targets = report["stats"]["targets"]
  assert report["stats"]["inputs"]["max"] <= 64
  assert targets["max"] > 8  # targets were not trimmed to the given length ...
  assert targets["truncated"] > 0  # ... so truncation at 8 is counted


def test_a_mixture_is_sampled_and_decoded():
  name = "test_inspect_bbc_mixture"
  seqio.MixtureRegistry.remove(name)
  seqio.MixtureRegistry.add(name, [("bbc_topic", 1.0), ("bbc_span_corruption", 1.0)])
  try:
    report = inspect_task.inspect(name, split="validation", n=4, inputs_length=32,
                                  targets_length=16, max_examples=30)
  finally:
    seqio.MixtureRegistry.remove(name)
  assert report["kind"] == "Mixture" and report["stats"]["targets"]["count"] == 30
  texts = [e["inputs"]["text"] for e in report["examples"]]
  assert all(t.startswith("bbc topic:") or "<extra_id_" in t for t in texts)


@pytest.mark.parametrize("kwargs, message", [
    ({"task_name": "bbc_topc"}, "Did you mean: bbc_topic"),
    ({"task_name": "bbc_topic", "split": "dev"}, "has no split 'dev'"),
    ({"task_name": "bbc_topic", "n": -1}, "n .* must be >= 0"),
    ({"task_name": "bbc_topic", "inputs_length": 1}, "inputs_length must be >= 2"),
    ({"task_name": "bbc_topic", "modules": ["no_such_task_module"]}, "could not be imported"),
])
def test_bad_input_is_a_clear_error(kwargs, message):
  with pytest.raises((ValueError, ImportError), match=message):
    inspect_task.inspect(**kwargs)


def test_main_exits_2_without_a_traceback_on_an_unknown_task(capsys):
  assert inspect_task.main(["inspect_task", "bbc_topc"]) == 2
  err = capsys.readouterr().err
  assert "Unknown task or mixture 'bbc_topc'" in err and "Traceback" not in err
  assert "registers yours with --module my_tasks" in err  # this tool's way, not a gin line


def test_main_applies_gin_bindings(capsys):
  def targets_median(*flags):
    assert inspect_task.main(["inspect_task", "bbc_span_corruption", "--split", "validation",
                              "-n", "0", "--inputs_length", "64", "--max_examples", "20",
                              *flags]) == 0
    row = [l for l in capsys.readouterr().out.splitlines() if l.startswith("targets ")][0]
    return float(row.split()[3])

  default = targets_median()
  denser = targets_median("--gin.span_corruption.noise_density=0.5")
  assert denser > default  # more noise -> longer targets


def test_command_line_on_bbc_topic():
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  out = subprocess.run(
      [sys.executable, "-m", "tools.inspect_task", "bbc_topic", "--split", "validation", "-n", "2",
       "--inputs_length", "128", "--targets_length", "4", "--max_examples", "50"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "bbc_topic (Task), split 'validation': 211 input examples" in out.stdout
  assert out.stdout.count("--- example") == 2
  assert "inputs (" in out.stdout and "bbc topic: " in out.stdout
  assert "Token lengths over 50 examples" in out.stdout
  assert "at 128" in out.stdout and "0 (0.0%) at 4" in out.stdout
  # Nothing else on stderr: the libraries' start-up lines (CUDA stubs, absl's InitializeLog
  # notice) are filtered as in t2t's entry points (t2t.logs).
  assert out.stderr.strip() == "", out.stderr[-3000:]
