"""The registered BBC tasks, read through seqio exactly as the trainer reads them."""
import importlib

import seqio

import tasks  # noqa: F401  (registers the tasks)
from tasks import bbc
from t2t.data import sources


def test_bbc_topic_examples_have_the_documented_form():
  task = seqio.get_mixture_or_task("bbc_topic")
  vocab = task.output_features["targets"].vocabulary
  ds = task.get_dataset({"inputs": 24, "targets": 4}, split="validation", shuffle=False)
  examples = list(ds.as_numpy_iterator())
  articles = sources.bbc_articles("validation")
  assert len(examples) == len(articles) == task.num_input_examples("validation") == 211
  for ex, article in zip(examples, articles):
    assert ex["id"].decode() == article["id"]
    assert len(ex["inputs"]) <= 24 and ex["inputs"][-1] == vocab.eos_id
    inputs = vocab.decode(ex["inputs"].tolist())
    first_words = " ".join(article["text"].split()[:3])
    assert inputs.startswith(f"bbc topic: {first_words}")
    assert vocab.decode(ex["targets"].tolist()) == article["category"]
  assert {vocab.decode(ex["targets"].tolist()) for ex in examples} == set(bbc.BBC_LABELS)


def test_bbc_topic_postprocessing_and_metrics():
  task = seqio.get_mixture_or_task("bbc_topic")
  assert task.postprocess_fn(" sports \n") == "sports"
  targets = ["sports", "tech", "business", "politics"]
  predictions = ["sports", "tech", "not a label", "politics"]
  scores = {}
  for fn in task.metric_fns:
    scores.update(fn(targets, predictions))
  assert scores["accuracy"] == 75.0  # the invalid output counts as wrong
  assert 0 < scores["macro_f1"] < 100


def test_bbc_span_corruption_examples_decode_with_sentinels():
  task = seqio.get_mixture_or_task("bbc_span_corruption")
  assert task.metric_fns == []
  vocab = task.output_features["targets"].vocabulary
  ds = task.get_dataset({"inputs": 64, "targets": 16}, split="validation", shuffle=False, seed=5)
  examples = list(ds.take(8).as_numpy_iterator())
  assert len(examples) == 8
  for ex in examples:
    assert len(ex["inputs"]) == 64 and ex["inputs"][-1] == vocab.eos_id
    assert len(ex["targets"]) <= 16 and ex["targets"][-1] == vocab.eos_id
    inputs, targets = vocab.decode(ex["inputs"].tolist()), vocab.decode(ex["targets"].tolist())
    assert "<extra_id_0>" in inputs and targets.startswith("<extra_id_0>")
  again = list(task.get_dataset({"inputs": 64, "targets": 16}, split="validation", shuffle=False,
                                seed=5).take(8).as_numpy_iterator())
  assert all((a["inputs"] == b["inputs"]).all() for a, b in zip(examples, again))


def test_reimporting_the_module_is_safe():
  importlib.reload(bbc)
  assert {"bbc_topic", "bbc_span_corruption"} <= set(seqio.TaskRegistry.names())
