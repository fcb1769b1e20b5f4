"""Tests for t2t/training/predictor.py: batched decoding and scoring from a checkpoint."""
import numpy as np
import seqio

from t2t import train as train_lib
from t2t.training import optim, predictor
from t2t.training.predictor import Predictor
from tests.training import toy


def test_strip_cuts_at_eos_and_drops_padding():
  assert predictor._strip(np.array([5, 6, 1, 7, 0])) == [5, 6]
  assert predictor._strip(np.array([5, 0, 0])) == [5]


def test_predict_and_score_pad_the_last_batch_and_keep_order(tmp_path):
  toy.register()
  model = toy.model()
  train_lib.train(model=model, mixture_or_task_name=toy.TASK, task_feature_lengths=toy.LENGTHS,
                  train_steps=1, model_dir=str(tmp_path), batch_size=4,
                  optimizer=optim.adafactor(learning_rate=0.01))
  converter = seqio.EncDecFeatureConverter(pack=False)
  shapes = {k: (4, v) for k, v in converter.get_model_feature_lengths(toy.LENGTHS).items()}
  pred = Predictor.from_checkpoint(model, str(tmp_path), shapes, batch_size=4)
  assert pred.step == 1
  task_ds = seqio.get_mixture_or_task(toy.TASK).get_dataset(
      toy.LENGTHS, split="validation", shuffle=False).take(6)
  features = list(converter(task_ds, toy.LENGTHS).as_numpy_iterator())
  tokens = pred.predict(features)  # 6 examples: one full batch and one padded
  scores = pred.score(features)
  assert len(tokens) == 6 and len(scores) == 6
  assert all(t.shape == (16,) for t in tokens) and all(s < 0 for s in scores)
  # Order is kept: scoring examples one by one gives the same numbers.
  single = Predictor(model, pred.params, pred.partitioner, batch_size=4)
  np.testing.assert_allclose([single.score([f])[0] for f in features[4:]], scores[4:], rtol=1e-5)
