r"""Evaluate one checkpoint on every task of a task or mixture: `python -m t2t.eval`.

  python -m t2t.eval --gin_file=models/t5_1_0/tiny.gin --gin_file=runs/eval.gin \
    --gin.MIXTURE_OR_TASK_NAME=bbc_topic --gin.CHECKPOINT_PATH=/tmp/t2t/finetune \
    --gin.EVAL_OUTPUT_DIR=/tmp/t2t/eval

Decodes greedily (seqio `Evaluator`), computes each task's metrics, and writes
`EVAL_OUTPUT_DIR/metrics.json` plus `<task>.<split>.predictions.jsonl` (input, target,
prediction per example).
"""
from __future__ import annotations

if __name__ == "__main__":
  # `python -m t2t.eval` runs this file as __main__. Run the importable module instead, so that
  # gin registers its configurable once (as t2t.eval.*), not a second time under __main__.
  from t2t import cli
  cli.run_module("t2t.eval")

import json
import os
from typing import Any, Mapping, Sequence

import gin
import numpy as np
import seqio

from t2t.data import registry
from t2t.training import inputs, reporting
from t2t.training.partitioning import Partitioner
from t2t.training.predictor import Predictor


@gin.configurable
def evaluate(*,
             model: Any = gin.REQUIRED,
             mixture_or_task_name: str = gin.REQUIRED,
             checkpoint_path: str = gin.REQUIRED,
             output_dir: str = gin.REQUIRED,
             split: str = "validation",
             task_feature_lengths: Mapping[str, int] | None = None,
             batch_size: int = 32,
             num_examples: int | None = None,
             partitioner: Partitioner | None = None) -> dict[str, dict[str, float]]:
  """Evaluates `checkpoint_path` on `split` of every task; returns {task: {metric: value}}.

  `task_feature_lengths=None` measures the longest example of each task (nothing truncated).
  """
  inputs.limit_tf_threads()
  registry.check_split_readable(registry.get_mixture_or_task(mixture_or_task_name), split)
  evaluator = seqio.Evaluator(
      mixture_or_task_name, model.feature_converter_cls(pack=False), eval_split=split,
      sequence_length=dict(task_feature_lengths) if task_feature_lengths else None,
      num_examples=num_examples, use_memory_cache=True)
  if not evaluator.eval_tasks:
    raise ValueError(f"'{mixture_or_task_name}' has no task with metrics and a '{split}' split "
                     "to evaluate.")
  shapes = {k: (batch_size, *v) for k, v in evaluator.model_feature_shapes.items()}
  predictor = Predictor.from_checkpoint(model, checkpoint_path, shapes, partitioner, batch_size)
  reporting.announce(f"Evaluating {checkpoint_path} (step {predictor.step}) on "
                     f"{mixture_or_task_name}.")
  future, outputs = evaluator.evaluate(compute_metrics=True, step=predictor.step,
                                       predict_fn=predictor.seqio_predict_fn,
                                       score_fn=predictor.seqio_score_fn)
  results = {task: {k: _scalar(v) for k, v in metrics.items()}
             for task, metrics in future.result().items()}

  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "metrics.json"), "w") as f:
    json.dump({"checkpoint": os.path.abspath(checkpoint_path), "step": predictor.step,
               "split": split, "metrics": results}, f, indent=2)
  for task in evaluator.eval_tasks:
    tokens = outputs[task.name].get(seqio.metrics.ModelOutputType.PREDICTION)
    if tokens is not None:
      _write_predictions(task, evaluator.cached_task_datasets[task.name], tokens,
                         os.path.join(output_dir, f"{task.name}.{split}.predictions.jsonl"))
  return results


def _scalar(value: Any) -> Any:
  if hasattr(value, "value"):  # seqio.metrics.Scalar
    value = value.value
  if isinstance(value, (np.floating, np.integer)):
    return value.item()
  return value


def _text(example: Mapping[str, Any], feature: str, task: seqio.Task) -> str:
  raw = example.get(f"{feature}_pretokenized")
  if raw is not None:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
  return task.output_features[feature].vocabulary.decode([int(t) for t in example[feature]])


def _write_predictions(task: seqio.Task, dataset, tokens: Sequence[Sequence[int]],
                       path: str) -> None:
  vocab = task.output_features["targets"].vocabulary
  with open(path, "w") as f:
    for example, ids in zip(dataset.as_numpy_iterator(), tokens):
      prediction = vocab.decode([int(t) for t in ids])
      record = {"inputs": _text(example, "inputs", task) if "inputs" in example else None,
                "target": _text(example, "targets", task),
                "prediction": prediction,
                "postprocessed": _jsonable(task.postprocess_fn(prediction, example=example,
                                                               is_target=False))}
      f.write(json.dumps(record, ensure_ascii=False) + "\n")


def _jsonable(value: Any) -> Any:
  if isinstance(value, (np.generic,)):
    return value.item()
  if isinstance(value, bytes):
    return value.decode("utf-8", "replace")
  return value if isinstance(value, (str, int, float, bool, type(None), list, dict)) else str(value)


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import cli
  cli.parse_flags_into_gin()
  results = evaluate()
  for task, metrics in results.items():
    print(task + ": " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in metrics.items()))

