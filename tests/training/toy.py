"""A tiny in-memory seqio task and T5 model for fast tests of the training machinery.

`toy_copy`: inputs are random token strings, targets the same strings (a copy task a one-layer
model learns in a few dozen steps). Vocabulary: 64 pass-through ids, eos 1.
"""
import numpy as np
import seqio
import tensorflow as tf

from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer

TASK = "toy_copy"
VOCAB = seqio.PassThroughVocabulary(size=64, eos_id=1)
LENGTHS = {"inputs": 16, "targets": 16}


def _source(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed
  rng = np.random.default_rng(0 if split == "train" else 1)
  texts = [rng.integers(3, 60, size=rng.integers(3, 10)).astype(np.int32) for _ in range(256)]
  return tf.data.Dataset.from_generator(
      lambda: ({"inputs": t, "targets": t} for t in texts),
      output_signature={"inputs": tf.TensorSpec([None], tf.int32),
                        "targets": tf.TensorSpec([None], tf.int32)})


def _accuracy(targets, predictions):
  return {"accuracy": 100.0 * float(np.mean([t == p for t, p in zip(targets, predictions)]))}


def register() -> None:
  if TASK in seqio.TaskRegistry.names():
    return
  features = {k: seqio.Feature(VOCAB, add_eos=True) for k in ("inputs", "targets")}
  seqio.TaskRegistry.add(
      TASK,
      source=seqio.FunctionDataSource(_source, splits=("train", "validation", "test"),
                                      num_input_examples={"train": 256, "validation": 256,
                                                          "test": 256}),
      preprocessors=[seqio.preprocessors.append_eos_after_trim],
      output_features=features,
      metric_fns=[_accuracy])


def model(d_model: int = 32, dropout_rate: float = 0.0) -> EncoderDecoderModel:
  config = T5Config(vocab_size=64, d_model=d_model, num_heads=2, d_kv=16, d_ff=64,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=dropout_rate)
  return EncoderDecoderModel(module=Transformer(config), input_vocabulary=VOCAB,
                             output_vocabulary=VOCAB)
