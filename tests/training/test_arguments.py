"""The checks of gin-given values in t2t/training/arguments.py, on the values an audit passed."""
import numpy as np
import pytest

from t2t.training import arguments


def test_whole_numbers():
  assert arguments.positive_int(3, "TRAIN_STEPS (train.train_steps)") == 3
  assert arguments.positive_int(np.int64(3), "N") == 3 and arguments.integer(-2, "SEED") == -2
  for value in ("abc", "8", 2.0, 0, -5, True, None):
    with pytest.raises(ValueError, match=r"^TRAIN_STEPS \(train.train_steps\) must be a whole "
                                         r"number >= 1, got "):
      arguments.positive_int(value, "TRAIN_STEPS (train.train_steps)")
  with pytest.raises(ValueError, match=r"SEED must be a whole number, got 'abc' \(str\)"):
    arguments.integer("abc", "SEED")
  assert arguments.non_negative_int(0, "CHECKPOINT_EVERY", "only at the end") == 0
  with pytest.raises(ValueError, match=r">= 0 \(0: only at the end\), got -1"):
    arguments.non_negative_int(-1, "CHECKPOINT_EVERY", "only at the end")
  assert arguments.optional_positive_int(None, "EVAL_NUM_EXAMPLES", "the whole split") is None
  for value in (0, -3):  # once: 0 and -3 evaluated the whole split
    with pytest.raises(ValueError, match=r"or None \(the whole split\), got"):
      arguments.optional_positive_int(value, "EVAL_NUM_EXAMPLES", "the whole split")


def test_booleans_are_true_or_false_only():
  assert arguments.boolean(False, "USE_PACKING") is False
  for value in ("no", 0, 1, None):  # the string 'no' once turned packing on
    with pytest.raises(ValueError, match="USE_PACKING must be True or False, got"):
      arguments.boolean(value, "USE_PACKING")


def test_feature_lengths():
  name = "TASK_FEATURE_LENGTHS (train.task_feature_lengths)"
  lengths = {"inputs": np.int32(64), "targets": 14}
  assert arguments.feature_lengths(lengths, name, ["inputs", "targets"]) == {
      "inputs": 64, "targets": 14}
  with pytest.raises(ValueError, match=r"must map each feature to its length.*got \[64, 14\]"):
    arguments.feature_lengths([64, 14], name)
  for bad in ({"inputs": 64.5, "targets": 14}, {"inputs": 32, "targets": 0}):
    with pytest.raises(ValueError, match=r"every length must be a whole number >= 1"):
      arguments.feature_lengths(bad, name)
  with pytest.raises(ValueError, match=r"no length for feature\(s\) \['targets'\] of the task, "
                                       r"whose features are \['inputs', 'targets'\]"):
    arguments.feature_lengths({"inputs": 64}, name, ["inputs", "targets"])


def test_directories():
  assert arguments.directory("/tmp/run", "MODEL_DIR") == "/tmp/run"
  for value in ("", "  ", None, 3):  # '' once trained into the working directory
    with pytest.raises(ValueError, match=r"^MODEL_DIR must be a directory path"):
      arguments.directory(value, "MODEL_DIR")
