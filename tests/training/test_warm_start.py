"""Tests for t2t/training/warm_start.py: partial restore plans, their report, T5 layer changes."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.training import checkpoints, warm_start
from t2t.training.partitioning import Partitioner


def _replicated(tree):
  return jax.tree.map(lambda _: Partitioner().replicated, tree)


def _saved(tmp_path):
  tree = {"encoder": {f"layers_{i}": {"kernel": jnp.full((2, 3), float(i + 1))} for i in range(2)},
          "head": {"kernel": jnp.full((4,), 7.0)}, "old": jnp.ones((2,))}
  ckpt = checkpoints.Checkpointer(str(tmp_path))
  ckpt.save(3, tree, {}, {})
  ckpt.close()
  return str(tmp_path)


def _model_tree():
  """Has one layer more than the checkpoint, the same head, and lacks 'old'."""
  return {"encoder": {f"layers_{i}": {"kernel": jnp.zeros((2, 3))} for i in range(3)},
          "head": {"kernel": jnp.zeros((4,))}}


def _fresh():
  return jax.tree.map(lambda x: x - 1.0, _model_tree())


def test_plan_restore_sorts_parameters_into_loaded_fresh_and_skipped():
  saved = {"a/kernel": [2, 3], "b": [4], "head/w": [5], "gone": [1]}
  expected = {"a/kernel": [2, 3], "b": [5], "head/w": [5], "new": [1]}
  plan = warm_start.plan_restore(saved, expected, reinitialize=["head/.*"])
  assert plan.loaded == ("a/kernel",)
  assert plan.reinitialised == {"b": "shape", "head/w": "head/.*", "new": "new"}
  assert plan.skipped == ("gone",)


def test_abbreviate_folds_whole_scopes_and_layer_indices_and_truncates():
  model = ([f"encoder/layers_{i}/mlp/{w}" for i in range(6) for w in ("wi", "wo")]
           + ["decoder/layers_0/x", "decoder/layers_1/x", "decoder/layers_2/x", "emb"])
  # encoder/ is whole; of the decoder only layers 0 and 2.
  names = [n for n in model if n.startswith("encoder")] + ["decoder/layers_0/x",
                                                           "decoder/layers_2/x", "emb"]
  assert warm_start.abbreviate(names, universe=model) == (
      "decoder/layers_{0,2}/x, emb, encoder/* (12)")
  # Whole layers folded when the stack is not whole: layers 1-3 of six.
  names = [f"encoder/layers_{i}/mlp/{w}" for i in (1, 2, 3) for w in ("wi", "wo")]
  assert warm_start.abbreviate(names, universe=model) == "encoder/layers_{1-3}/* (6)"
  assert warm_start.abbreviate(["a", "b", "c"], limit=2) == "a, b (+1 more)"


def test_partial_restore_loads_matches_initialises_new_and_skips_extra(tmp_path):
  path = _saved(tmp_path)
  model = _model_tree()
  params, step, plan = warm_start.restore_params(path, model, _replicated(model), _fresh,
                                                  partial=True)
  assert step == 3
  np.testing.assert_array_equal(params["encoder"]["layers_0"]["kernel"], np.full((2, 3), 1.0))
  np.testing.assert_array_equal(params["encoder"]["layers_1"]["kernel"], np.full((2, 3), 2.0))
  np.testing.assert_array_equal(params["encoder"]["layers_2"]["kernel"], np.full((2, 3), -1.0))
  np.testing.assert_array_equal(params["head"]["kernel"], np.full((4,), 7.0))
  assert plan.skipped == ("old",)
  report = plan.report(path, step)
  assert "loaded 3 parameters: encoder/layers_{0-1}/kernel, head/kernel" in report
  assert "reinitialised 1:" in report
  assert "1 not in the checkpoint: encoder/layers_2/kernel" in report
  assert "skipped 1 checkpoint parameters the model lacks: old" in report


def test_reinitialize_patterns_give_a_fresh_head(tmp_path):
  path = _saved(tmp_path)
  model = _model_tree()
  params, _, plan = warm_start.restore_params(path, model, _replicated(model), _fresh,
                                               partial=True, reinitialize=["head/.*"])
  np.testing.assert_array_equal(params["head"]["kernel"], np.full((4,), -1.0))
  assert plan.reinitialised["head/kernel"] == "head/.*"
  assert "1 matches 'head/.*': head/kernel" in plan.report(path, 3)


def test_without_partial_restore_a_mismatch_says_how_to_ask_for_it(tmp_path):
  path = _saved(tmp_path)
  model = _model_tree()
  with pytest.raises(checkpoints.CheckpointMismatchError) as err:
    warm_start.restore_params(path, model, _replicated(model), _fresh)
  message = str(err.value)
  assert "encoder/layers_2/kernel" in message  # the first mismatch, by name
  assert "train.partial_restore = True" in message and "--gin.train.partial_restore=True" in message
  assert "Give the model gin file(s)" in message and "MODEL_DIR" not in message  # not resuming


def test_a_damaged_checkpoint_is_one_line_naming_the_file(tmp_path):
  path = _saved(tmp_path)
  data_dir = tmp_path / "checkpoint_3" / "params" / "d"
  for f in os.listdir(data_dir):
    (data_dir / f).write_bytes((data_dir / f).read_bytes()[:10])
  with pytest.raises(checkpoints.CorruptCheckpointError,
                     match=f"Checkpoint {tmp_path}/checkpoint_3 cannot be read "
                           f"\\({tmp_path}/checkpoint_3/params/d/"):
    warm_start.restore_params(path, _model_tree(), _replicated(_model_tree()), _fresh,
                              partial=True)


def test_matching_checkpoint_loads_fully_without_initialising(tmp_path):
  path = _saved(tmp_path)
  like = {"encoder": {f"layers_{i}": {"kernel": jnp.zeros((2, 3))} for i in range(2)},
          "head": {"kernel": jnp.zeros((4,))}, "old": jnp.zeros((2,))}

  def fail():
    raise AssertionError("nothing should be initialised")

  params, _, plan = warm_start.restore_params(path, like, _replicated(like), fail)
  assert not plan.reinitialised and not plan.skipped
  np.testing.assert_array_equal(params["old"], np.ones(2))


def _t5_params(num_encoder_layers):
  """Freshly initialised parameters of the toy one-decoder-layer T5, and a Trainer around it."""
  from t2t.models.api import EncoderDecoderModel
  from t2t.models.transformer import T5Config, Transformer
  from t2t.training import optim
  from t2t.training.trainer import Trainer
  from tests.training import toy
  config = T5Config(vocab_size=64, d_model=32, num_heads=2, d_kv=16, d_ff=64,
                    num_encoder_layers=num_encoder_layers, num_decoder_layers=1)
  model = EncoderDecoderModel(module=Transformer(config), input_vocabulary=toy.VOCAB,
                              output_vocabulary=toy.VOCAB)
  shapes = {k: (2, 8) for k in ("encoder_input_tokens", "decoder_input_tokens",
                                "decoder_target_tokens", "decoder_loss_weights")}
  tr = Trainer(model, optim.adafactor(), Partitioner(), shapes)
  return tr, tr.init_params()


def _through_checkpoint(path, params, target):
  """Saves `params` as step 1 under `path`, then restores them partially into `target`'s tree."""
  ckpt = checkpoints.Checkpointer(str(path))
  ckpt.save(1, params, {}, {})
  ckpt.close()
  return warm_start.restore_params(str(path), target.params_abstract, target.params_shardings,
                                   target.init_params, partial=True)


def test_t5_checkpoint_into_a_t5_with_a_layer_more_and_back(tmp_path):
  small, small_params = _t5_params(1)
  big, _ = _t5_params(2)
  params, _, plan = _through_checkpoint(tmp_path / "small", small_params, big)
  added = {n for n in checkpoints.param_shapes(big.params_abstract) if "layers_1" in n}
  assert set(plan.reinitialised) == added and all(v == "new" for v in plan.reinitialised.values())
  assert not plan.skipped
  kernel = lambda p: np.asarray(p["encoder"]["layers_0"]["attention"]["query"]["kernel"])
  np.testing.assert_array_equal(kernel(params), kernel(small_params))
  np.testing.assert_array_equal(np.asarray(params["token_embedder"]["embedding"]),
                                np.asarray(small_params["token_embedder"]["embedding"]))

  back, _, plan = _through_checkpoint(tmp_path / "big", params, small)
  assert set(plan.skipped) == added and not plan.reinitialised
  np.testing.assert_array_equal(kernel(back), kernel(small_params))
  with pytest.raises(checkpoints.CheckpointMismatchError,
                     match="encoder/layers_1/.*partial_restore"):
    warm_start.restore_params(str(tmp_path / "big"), small.params_abstract,
                               small.params_shardings, small.init_params)


# --- Atomicity and corrupted checkpoints -----------------------------------------------------------
