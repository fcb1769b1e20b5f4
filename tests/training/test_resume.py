"""Exact resume through `t2t.train.train`: K steps straight == K/2 steps + restart + K/2 steps.

The smallest T5 (one layer each side, d_model 32) on the BBC data with packing and tiny lengths;
a task with span corruption's random preprocessors, and a mixture. The restart is a new
`train()` call, which rebuilds the model, the optimizer and the input pipeline from MODEL_DIR.
"""
import importlib
import json
import os
import shutil

import numpy as np
import optax
import pytest
import seqio

from t2t import train as train_lib
from t2t.data import vocabularies
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer
from t2t.training import input_state

K = 6
LENGTHS = {"inputs": 32, "targets": 8}
MIXTURE = "resume_test_bbc_mix"


def _model():
  vocab = vocabularies.bbc_vocabulary()
  config = T5Config(vocab_size=8192, d_model=32, num_heads=2, d_kv=16, d_ff=64,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
  return EncoderDecoderModel(module=Transformer(config), input_vocabulary=vocab,
                             output_vocabulary=vocab)


def _register():
  importlib.import_module("tasks.bbc")  # registers the BBC tasks
  if MIXTURE not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add(MIXTURE, [("bbc_span_corruption", 1.0), ("bbc_topic", 1.0)])


def _train(model_dir, steps, name="bbc_span_corruption", batch_size=2, **overrides):
  """Runs train() to `steps`; returns the batches it trained on (copies)."""
  seen = []

  def record(step, state, metrics, batch):
    seen.append({k: np.array(v) for k, v in batch.items()})

  kwargs = dict(model=_model(), mixture_or_task_name=name, task_feature_lengths=LENGTHS,
                train_steps=steps, model_dir=str(model_dir), batch_size=batch_size,
                optimizer=optax.adam(1e-3), checkpoint_every=K // 2, log_every=1,
                keep_checkpoints=None, hooks=[record])
  train_lib.train(**{**kwargs, **overrides})
  return seen


def _losses(model_dir):
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows if r.get("split") == "train"}


def _assert_same_batches(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert set(g) == set(w)
    for k in w:
      np.testing.assert_array_equal(g[k], w[k], err_msg=k)


@pytest.fixture(scope="module", params=["bbc_span_corruption", MIXTURE])
def runs(request, tmp_path_factory):
  """A straight run, a run restarted at K/2 from its input state, and one restarted at K/2 from
  a copy of the checkpoint without input state (as an older t2t wrote), for one task/mixture."""
  _register()
  name = request.param
  root = tmp_path_factory.mktemp("resume")
  straight = _train(root / "straight", K, name)
  first = _train(root / "resumed", K // 2, name)
  shutil.copytree(root / "resumed", root / "replayed")
  shutil.rmtree(input_state.step_dir(str(root / "replayed"), K // 2))
  # The layout before side directories: the state inside the step directory.
  shutil.copytree(root / "resumed", root / "legacy")
  shutil.move(input_state.step_dir(str(root / "legacy"), K // 2),
              os.path.dirname(input_state.state_prefix(str(root / "legacy"), K // 2, legacy=True)))
  return name, root, straight, first


def test_restart_sees_the_same_batches_and_losses(runs, capfd):
  name, root, straight, first = runs
  second = _train(root / "resumed", K, name)
  err = capfd.readouterr().err
  assert f"at step {K // 2}" in err and "replaying" not in err
  _assert_same_batches(first + second, straight)
  want, got = _losses(root / "straight"), _losses(root / "resumed")
  assert sorted(got) == sorted(want) == list(range(1, K + 1))
  np.testing.assert_allclose([got[s] for s in want], [want[s] for s in want], rtol=0, atol=1e-6)
  for step in (K // 2, K):  # every checkpoint holds this host's input state
    assert input_state.exists(str(root / "resumed"), step)


@pytest.mark.parametrize("runs", ["bbc_span_corruption"], indirect=True)  # once is enough
def test_checkpoint_without_input_state_replays_and_says_so(runs, capfd):
  name, root, straight, first = runs
  second = _train(root / "replayed", K, name)
  assert "replaying the input stream to skip 3 batches" in capfd.readouterr().err
  _assert_same_batches(first + second, straight)
  assert input_state.exists(str(root / "replayed"), K)  # saved again from then on
  # That state belongs to a pipeline with a skip(3) stage: resuming from it rebuilds the same
  # pipeline (the checkpoint's `input_skip`), so the next restart neither fails nor replays,
  # and continues like a restart of the straight run (a soak benchmark's finding).
  shutil.copytree(root / "straight", root / "straight_continued")
  want = _train(root / "straight_continued", K + K // 2, name)
  capfd.readouterr()
  third = _train(root / "replayed", K + K // 2, name)
  assert "replaying" not in capfd.readouterr().err
  _assert_same_batches(third, want)


@pytest.mark.parametrize("runs", ["bbc_span_corruption"], indirect=True)
def test_input_state_in_the_older_layout_is_still_read(runs, capfd):
  name, root, straight, first = runs
  model_dir = str(root / "legacy")
  assert not os.path.exists(input_state.step_dir(model_dir, K // 2))
  assert input_state.exists(model_dir, K // 2)
  second = _train(model_dir, K, name)
  assert "replaying" not in capfd.readouterr().err
  _assert_same_batches(first + second, straight)
  assert os.path.exists(input_state.step_dir(model_dir, K))  # new saves use the new layout


@pytest.mark.parametrize("change,fragment", [
    (dict(name=MIXTURE), "MIXTURE_OR_TASK_NAME was 'bbc_span_corruption', now "
                         f"'{MIXTURE}'"),
    (dict(batch_size=4), "BATCH_SIZE was 2, now 4"),
    (dict(task_feature_lengths={"inputs": 64, "targets": 8}), "TASK_FEATURE_LENGTHS was"),
    (dict(use_packing=False), "USE_PACKING was True, now False"),
])
@pytest.mark.parametrize("runs", ["bbc_span_corruption"], indirect=True)  # one model dir will do
def test_a_changed_stream_is_refused_naming_it(runs, change, fragment):
  name, root, _, _ = runs
  model_dir = root / "straight"
  before = sorted(os.listdir(model_dir))
  with pytest.raises(input_state.ResumeMismatchError, match="Cannot resume") as e:
    _train(model_dir, K + 1, **change)
  assert fragment in str(e.value)
  assert sorted(os.listdir(model_dir)) == before  # nothing touched


def test_check_resumable_names_each_change_and_the_host_count():
  saved = input_state.run_meta("a", 8, {"inputs": 4, "targets": 2}, True, False)
  input_state.check_resumable(saved, dict(saved), "dir")  # the same: fine
  input_state.check_resumable({"step": 3}, saved, "dir")  # an older checkpoint: unchecked
  now = {**saved, "num_hosts": 2, "task_feature_lengths": {"inputs": 4, "targets": 3}}
  with pytest.raises(input_state.ResumeMismatchError) as e:
    input_state.check_resumable(saved, now, "dir")
  message = str(e.value)
  assert "host count (jax.process_count()) was 1, now 2" in message
  assert "TASK_FEATURE_LENGTHS was {'inputs': 4, 'targets': 2}, now" in message
  assert "BATCH_SIZE" not in message
