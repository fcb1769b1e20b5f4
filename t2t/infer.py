r"""Decode with one checkpoint: `python -m t2t.infer`.

Either a task split or a text file of inputs (one per line):

  python -m t2t.infer --gin_file=models/t5_1_0/tiny.gin --gin_file=runs/infer.gin \
    --gin.CHECKPOINT_PATH=/tmp/t2t/finetune --gin.INFER_OUTPUT_DIR=/tmp/t2t/infer \
    --gin.INPUT_FILE=my_inputs.txt

writes `INFER_OUTPUT_DIR/<name>.jsonl`, one {"inputs", "prediction"[, "target"]} per line, in order.
INPUT_FILE, CHECKPOINT_PATH and INFER_OUTPUT_DIR may be URLs (gs://...). On several hosts each
decodes its share of every batch, the predictions are gathered, and process 0 writes the file.
"""
from __future__ import annotations

if __name__ == "__main__":
  # `python -m t2t.infer` runs this file as __main__. Run the importable module instead, so that
  # gin registers its configurable once (as t2t.infer.*), not a second time under __main__.
  from t2t import cli
  cli.run_module("t2t.infer")

import json
import os
from typing import Any, Iterator, Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from t2t.data import registry, vocabularies
from t2t.training import arguments, distributed, inputs, paths, reporting
from t2t.training.partitioning import Partitioner
from t2t.training.predictor import Predictor


@gin.configurable
def infer(*,
          model: Any = gin.REQUIRED,
          checkpoint_path: str = gin.REQUIRED,
          output_dir: str = gin.REQUIRED,
          task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
          mixture_or_task_name: str | None = None,
          split: str = "test",
          input_file: str | None = None,
          num_examples: int | None = None,
          batch_size: int = 32,
          partitioner: Partitioner | None = None) -> str:
  """Decodes a task split or `input_file` greedily; returns the JSONL path written.

  Inputs longer than task_feature_lengths['inputs'] are truncated; at most
  task_feature_lengths['targets'] tokens are decoded.
  """
  if (input_file is None) == (mixture_or_task_name is None):
    raise ValueError("Set exactly one of INPUT_FILE (a text file, one input per line) and "
                     "MIXTURE_OR_TASK_NAME (a task split to decode).")
  output_dir = arguments.directory(output_dir, "INFER_OUTPUT_DIR (infer.output_dir)")
  batch_size = arguments.positive_int(batch_size, "INFER_BATCH_SIZE (infer.batch_size)")
  num_examples = arguments.optional_positive_int(
      num_examples, "INFER_NUM_EXAMPLES (infer.num_examples)", "every input")
  task_feature_lengths = arguments.feature_lengths(
      task_feature_lengths, "TASK_FEATURE_LENGTHS (infer.task_feature_lengths)")
  inputs.limit_tf_threads()
  paths.check_writable(output_dir, "INFER_OUTPUT_DIR")  # before decoding, not after it
  vocabularies.check_model_readable(model)  # one clear error for a vocabulary file out of reach
  converter = model.feature_converter_cls(pack=False)
  lengths = dict(task_feature_lengths)
  if input_file is not None:
    source = paths.resolve(input_file)
    if source.is_dir():
      raise FileNotFoundError(f"INPUT_FILE '{input_file}' is a directory, not a text file (one "
                              "input per line).")
    if not source.is_file():
      raise FileNotFoundError(f"INPUT_FILE '{input_file}' does not exist.")
    data = source.read_bytes()
    try:
      text = data.decode("utf-8")
    except UnicodeDecodeError as err:
      line = data.count(b"\n", 0, err.start) + 1
      raise ValueError(f"INPUT_FILE '{input_file}', line {line}: not UTF-8 text ({err.reason} at "
                       f"byte {err.start}); save it as UTF-8, one input per line.") from None
    texts = [line.rstrip("\r") for line in text.split("\n")]
    if texts and texts[-1] == "":
      texts.pop()  # the newline that ends the last line
    if not texts:
      raise ValueError(f"INPUT_FILE '{input_file}' is empty: nothing to decode (one input per "
                       "line).")
    if num_examples is not None:
      texts = texts[:num_examples]
    task_ds = _text_dataset(texts, model.input_vocabulary, lengths["inputs"])
    records = [{"inputs": t} for t in texts]
    name = source.stem
    vocab = model.output_vocabulary
    vocabulary = vocabularies.model_record(model)  # the text is tokenised with the model's
  else:
    task = registry.get_mixture_or_task(mixture_or_task_name)
    registry.check_split_readable(task, split)
    vocabularies.check_task_readable(task)
    task_ds = task.get_dataset(lengths, split=split, shuffle=False, num_epochs=1)
    if num_examples is not None:
      task_ds = task_ds.take(num_examples)
    records = [_record(ex) for ex in task_ds.as_numpy_iterator()]
    if not records:
      raise registry.empty_split_error(mixture_or_task_name, split)
    name = f"{mixture_or_task_name}.{split}"
    vocab = task.output_features["targets"].vocabulary
    vocabulary = vocabularies.task_record(task)
  features = converter(task_ds, lengths).as_numpy_iterator()
  shapes = {k: (batch_size, v) for k, v in converter.get_model_feature_lengths(lengths).items()}
  predictor = Predictor.from_checkpoint(model, checkpoint_path, shapes, partitioner, batch_size,
                                        vocabulary=vocabulary)
  reporting.announce(f"Decoding {len(records)} inputs with {checkpoint_path} "
                     f"(step {predictor.step}).")
  tokens = predictor.predict(features)

  path = paths.resolve(output_dir) / f"{name}.jsonl"
  if distributed.is_writer():
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
      for record, ids in zip(records, tokens):
        record["prediction"] = vocab.decode([int(t) for t in ids])
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
  distributed.sync("t2t.infer: predictions written")
  return os.fspath(path)


def _text_dataset(texts: Sequence[str], vocabulary: seqio.Vocabulary,
                  max_length: int) -> tf.data.Dataset:
  """Tokenised {'inputs', 'targets'} examples for raw text: inputs truncated to
  `max_length` including EOS, targets a lone EOS (unused by decoding)."""
  def gen() -> Iterator[dict[str, np.ndarray]]:
    for text in texts:
      ids = list(vocabulary.encode(text))[:max_length - 1] + [vocabulary.eos_id]
      yield {"inputs": np.asarray(ids, np.int32), "targets": np.asarray([1], np.int32)}
  spec = {"inputs": tf.TensorSpec([None], tf.int32), "targets": tf.TensorSpec([None], tf.int32)}
  return tf.data.Dataset.from_generator(gen, output_signature=spec)


def _record(example: Mapping[str, Any]) -> dict[str, str]:
  out = {}
  for key in ("inputs", "targets"):
    raw = example.get(f"{key}_pretokenized")
    if raw is not None:
      out["target" if key == "targets" else key] = (
          raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
  return out


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import cli
  cli.parse_flags_into_gin()
  print(infer())

