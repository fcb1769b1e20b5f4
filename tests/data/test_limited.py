"""Tests for t2t/data/limited.py: a capped train split, drawn per seed, on the BBC topic task."""
import numpy as np
import pytest
import seqio

import tasks.bbc  # noqa: F401  (registers bbc_topic)
from t2t.data import limited


def _ids(name, split="train"):
  task = seqio.get_mixture_or_task(name)
  return [ex["id"].decode() for ex in
          task.source.get_dataset(split, shuffle=False).as_numpy_iterator()]


def test_draw_indices_is_distinct_sorted_and_seeded():
  a = limited.draw_indices(100, 10, seed=1)
  assert len(set(a)) == 10 and list(a) == sorted(a) and a.max() < 100
  np.testing.assert_array_equal(a, limited.draw_indices(100, 10, seed=1))
  assert list(a) != list(limited.draw_indices(100, 10, seed=2))
  np.testing.assert_array_equal(limited.draw_indices(5, 10, seed=1), np.arange(5))  # as-is
  with pytest.raises(ValueError, match="num_examples"):
    limited.draw_indices(5, 0, seed=1)


def test_capped_task_has_n_distinct_training_examples_per_seed():
  name = limited.limited_task("bbc_topic", 20, seed=0)
  assert name == "bbc_topic_n20_seed0"
  assert limited.limited_task("bbc_topic", 20, seed=0) == name  # registered once
  first = _ids(name)
  assert len(first) == 20 == len(set(first))
  everything = set(_ids("bbc_topic"))
  assert set(first) <= everything
  assert first == _ids(limited.limited_task("bbc_topic", 20, seed=0))
  other = _ids(limited.limited_task("bbc_topic", 20, seed=1))
  assert len(other) == 20 and set(other) != set(first)
  task = seqio.get_mixture_or_task(name)
  assert task.num_input_examples("train") == 20
  # Other splits, preprocessing and metrics are the original task's.
  assert _ids(name, "validation") == _ids("bbc_topic", "validation")
  assert [f.__name__ for f in task.metric_fns] == ["bbc_topic_accuracy", "bbc_topic_macro_f1"]
  ds = task.get_dataset({"inputs": 32, "targets": 4}, split="train", shuffle=True, seed=3,
                        num_epochs=1)
  examples = list(ds.as_numpy_iterator())
  assert len(examples) == 20 and all(e["inputs_pretokenized"].startswith(b"bbc topic:")
                                     for e in examples)


def test_a_mixture_cannot_be_capped_as_one_task():
  seqio.MixtureRegistry.remove("limited_test_mix")
  seqio.MixtureRegistry.add("limited_test_mix", [("bbc_topic", 1.0)])
  with pytest.raises(ValueError, match="mixture"):
    limited.limited_task("limited_test_mix", 10)


def test_limited_data_recipe_draws_with_the_seed_macro():
  from t2t import config
  config.parse_gin(["experiments/bbc_demo/finetune.gin", "recipes/limited_data.gin"],
                   ["MODEL_DIR = '/tmp/unused'", "INITIAL_CHECKPOINT_PATH = None",
                    "LIMITED_TASK = 'bbc_topic'", "TRAIN_EXAMPLES = 12", "SEED = 4"])
  import gin
  assert str(gin.query_parameter("train.seed")) == "%SEED"
  assert limited.limited_task() == "bbc_topic_n12_seed4"
  assert len(_ids("bbc_topic_n12_seed4")) == 12
