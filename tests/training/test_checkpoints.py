"""Tests for t2t/training/checkpoints.py: save, restore, resume metadata, incompatibility."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.training import checkpoints
from t2t.training.partitioning import Partitioner


def _tree(width=4):
  return {"encoder": {"kernel": jnp.arange(3 * width, dtype=jnp.float32).reshape(3, width)},
          "scale": jnp.ones((width,), jnp.float32)}


def _replicated(tree):
  return jax.tree.map(lambda _: Partitioner().replicated, tree)


def test_param_shapes_flattens_paths():
  assert checkpoints.param_shapes(_tree()) == {"encoder/kernel": [3, 4], "scale": [4]}


def test_save_restore_round_trip(tmp_path):
  params, opt = _tree(), {"mu": _tree()}
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(7, params, opt, {"batches_consumed": 7})
  assert ckpt.latest_step() == 7
  assert os.path.isdir(tmp_path / "checkpoint_7")
  p2, o2, meta = ckpt.restore(7, params, _replicated(params), opt, _replicated(opt))
  jax.tree.map(np.testing.assert_array_equal, p2, params)
  jax.tree.map(np.testing.assert_array_equal, o2, opt)
  assert meta["batches_consumed"] == 7 and meta["step"] == 7
  ckpt.close()


def test_keeps_only_the_newest_checkpoints(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path), keep=2)
  for step in (1, 2, 3):
    ckpt.save(step, _tree(), {}, {})
  assert sorted(os.listdir(tmp_path)) == ["checkpoint_2", "checkpoint_3"]
  ckpt.close()


def test_incompatible_checkpoint_names_parameter_and_both_shapes(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(1, _tree(width=4), {}, {})
  with pytest.raises(checkpoints.CheckpointMismatchError) as err:
    ckpt.check(_tree(width=5))
  assert "encoder/kernel" in str(err.value)
  assert "(3, 4)" in str(err.value) and "(3, 5)" in str(err.value)
  # Nothing was written or removed by the failed check.
  assert os.listdir(tmp_path) == ["checkpoint_1"]


def test_missing_and_extra_parameters_are_named():
  with pytest.raises(checkpoints.CheckpointMismatchError, match="'b'.*missing"):
    checkpoints.check_compatible({"a": [1]}, {"a": [1], "b": [2]}, "here")
  with pytest.raises(checkpoints.CheckpointMismatchError, match="has parameter 'b'"):
    checkpoints.check_compatible({"a": [1], "b": [2]}, {"a": [1]}, "here")


def test_load_params_from_model_dir_or_step_dir(tmp_path):
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(2, _tree(), {"mu": _tree()}, {})
  ckpt.save(5, jax.tree.map(lambda x: x + 1, _tree()), {"mu": _tree()}, {})
  ckpt.close()
  params, step = checkpoints.load_params(str(tmp_path), _tree(), _replicated(_tree()))
  assert step == 5
  np.testing.assert_array_equal(params["scale"], 2 * np.ones(4))
  params, step = checkpoints.load_params(str(tmp_path / "checkpoint_2"), _tree(),
                                         _replicated(_tree()))
  assert step == 2
  np.testing.assert_array_equal(params["scale"], np.ones(4))


def test_load_params_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    checkpoints.load_params(str(tmp_path / "nope"), _tree(), _replicated(_tree()))
  with pytest.raises(FileNotFoundError, match="No checkpoint"):
    checkpoints.load_params(str(tmp_path), _tree(), _replicated(_tree()))
