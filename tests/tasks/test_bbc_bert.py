"""The BBC tasks of the BERT baseline and the STILTs chain: bbc_bert_mlm and bbc_same_topic."""
import collections

import numpy as np
import pytest
import seqio

import tasks  # noqa: F401  (registers the tasks)
from tasks import bbc
from t2t.data import mlm, sources

CLS, SEP, MASK = mlm.BBC_SPECIAL_IDS.cls, mlm.BBC_SPECIAL_IDS.sep, mlm.BBC_SPECIAL_IDS.mask


def test_bbc_bert_mlm_examples_are_bert_inputs_with_exact_targets():
  task = seqio.get_mixture_or_task("bbc_bert_mlm")
  assert task.metric_fns == []
  ds = task.get_dataset({"inputs": 64, "targets": 64}, split="validation", shuffle=False, seed=3)
  examples = list(ds.as_numpy_iterator())
  noise = total = masked = 0
  for ex in examples:
    inputs, targets = ex["inputs"], ex["targets"]
    assert len(inputs) == len(targets) <= 64
    assert targets[0] == targets[-1] == 0
    corrupted = targets > 0
    # No EOS (BERT ends in [SEP]); a random replacement may draw any id, EOS included.
    assert inputs[0] == CLS and inputs[-1] == SEP and 1 not in inputs[~corrupted]
    assert not np.any(np.isin(targets[corrupted], (CLS, SEP, MASK, 1)))
    noise += int(corrupted.sum())
    masked += int(np.sum(inputs[corrupted] == MASK))
    total += len(inputs) - 2
  assert len(examples) > 100 and total > 10_000   # the whole validation text, in full segments
  assert 0.13 < noise / total < 0.17              # BERT (Devlin et al. §3.1): 15% corrupted,
  assert 0.76 < masked / noise < 0.84             # BERT's 80% [MASK], 10% random, 10% kept
  again = list(task.get_dataset({"inputs": 64, "targets": 64}, split="validation", shuffle=False,
                                seed=3).take(3).as_numpy_iterator())
  assert all((a["inputs"] == b["inputs"]).all() for a, b in zip(examples, again))


@pytest.mark.parametrize("split", sources.BBC_SPLITS)
def test_same_topic_pairs_are_balanced_true_and_deterministic(split):
  pairs = bbc.same_topic_pairs(split)
  articles = {a["id"]: a for a in sources.bbc_articles(split)}
  assert len(pairs) == len(articles) == sources.bbc_num_examples()[split]
  labels = collections.Counter(p["label"] for p in pairs)
  assert labels["same"] - labels["different"] in (0, 1) and set(labels) == {"same", "different"}
  for p in pairs:
    a, b = (articles[i] for i in p["id"].split("|"))  # both articles from this split
    assert p["sentence1"] == bbc.headline(a["text"]) and p["sentence2"] == bbc.headline(b["text"])
    assert p["sentence1"] != p["sentence2"]
    assert (a["category"] == b["category"]) == (p["label"] == "same")
  bbc.same_topic_pairs.cache_clear()
  assert bbc.same_topic_pairs(split) == pairs


def test_bbc_same_topic_examples_labels_and_metric():
  task = seqio.get_mixture_or_task("bbc_same_topic")
  vocab = task.output_features["targets"].vocabulary
  ds = task.get_dataset({"inputs": 64, "targets": 4}, split="validation", shuffle=False)
  examples = list(ds.as_numpy_iterator())
  pairs = bbc.same_topic_pairs("validation")
  assert len(examples) == len(pairs) == task.num_input_examples("validation")
  for ex, pair in zip(examples[:20], pairs):
    text = vocab.decode(ex["inputs"].tolist())
    assert text.startswith(f"bbc same topic sentence1: {pair['sentence1']} sentence2: ")
    assert ex["sentence1"].decode() == pair["sentence1"]
    assert ex["sentence2"].decode() == pair["sentence2"]
    assert vocab.decode(ex["targets"].tolist()) == pair["label"]
  # Label lists a classifier can read: the constant, task_labels, and the postprocessor's keyword.
  assert bbc.task_labels("bbc_same_topic") == bbc.BBC_SAME_TOPIC_LABELS == ("different", "same")
  assert task.postprocessor.keywords["labels"] == bbc.BBC_SAME_TOPIC_LABELS
  assert bbc.task_labels("bbc_topic") == bbc.BBC_LABELS
  with pytest.raises(ValueError, match="not a BBC classification task"):
    bbc.task_labels("bbc_bert_mlm")
  assert task.postprocess_fn(" same ") == "same" and task.postprocess_fn("maybe") != "maybe"
  scores = {}
  for fn in task.metric_fns:
    scores.update(fn(["same", "different", "same", "different"],
                     [task.postprocess_fn(p) for p in ("same", "same", "maybe", "different")]))
  assert scores == {"accuracy": 50.0}
