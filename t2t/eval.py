r"""Evaluate one checkpoint on every task of a task or mixture: `python -m t2t.eval`.

  python -m t2t.eval --gin_file=models/t5_1_0/tiny.gin --gin_file=runs/eval.gin \
    --gin.MIXTURE_OR_TASK_NAME=bbc_topic --gin.CHECKPOINT_PATH=/tmp/t2t/finetune \
    --gin.EVAL_OUTPUT_DIR=/tmp/t2t/eval

Decodes greedily (seqio `Evaluator`), computes each task's metrics, and writes
`EVAL_OUTPUT_DIR/metrics.json` plus `<task>.<split>.predictions.jsonl` (input, target,
prediction per example). EVAL_OUTPUT_DIR and CHECKPOINT_PATH may be URLs (gs://...).

On several hosts (run the same command on each; t2t.training.distributed) every host decodes its
share of each batch, the predictions are gathered, and process 0 alone computes the metrics and
writes the files; the others wait for it and return the same metrics.
"""
from __future__ import annotations

if __name__ == "__main__":
  # `python -m t2t.eval` runs this file as __main__. Run the importable module instead, so that
  # gin registers its configurable once (as t2t.eval.*), not a second time under __main__.
  from t2t import cli
  cli.run_module("t2t.eval")

import contextlib
import json
import os
import traceback
from typing import Any, Callable, Iterator, Mapping, Sequence

import gin
import numpy as np
import seqio

from t2t.data import integrity, postprocessors, registry, vocabularies
from t2t.training import arguments, distributed, inputs, paths, reporting
from t2t.training.partitioning import Partitioner
from t2t.training.predictor import Predictor


class TaskEvaluationError(Exception):
  """Computing a task's metrics failed for a reason other than bad input (the cause is chained).

  Deliberately not a ValueError: the CLI prints a traceback for it, with seqio's cause."""


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
             partitioner: Partitioner | None = None,
             bucket_lengths: bool = True) -> dict[str, dict[str, float]]:
  """Evaluates `checkpoint_path` on `split` of every task; returns {task: {metric: value}}.

  `task_feature_lengths=None` measures the longest example of each task (nothing truncated).
  Every kind of seqio metric is served: predict metrics get the greedy decodes, score metrics
  the targets' log-likelihoods, predict-with-aux metrics the decodes and aux
  {'scores': each decode's log-likelihood}. A prediction that a task's postprocessor cannot
  handle counts as wrong (and is reported); it never stops the run. `bucket_lengths` (default)
  sorts the examples by input length and runs each batch at a power-of-two bucket of its longest
  input (`Predictor`) instead of the mixture's longest.
  """
  output_dir = arguments.directory(output_dir, "EVAL_OUTPUT_DIR (evaluate.output_dir)")
  batch_size = arguments.positive_int(batch_size, "EVAL_BATCH_SIZE (evaluate.batch_size)")
  num_examples = arguments.optional_positive_int(
      num_examples, "EVAL_NUM_EXAMPLES (evaluate.num_examples)", "the whole split")
  if task_feature_lengths is not None:
    task_feature_lengths = arguments.feature_lengths(
        task_feature_lengths, "TASK_FEATURE_LENGTHS (evaluate.task_feature_lengths)")
  inputs.limit_tf_threads()
  paths.check_writable(output_dir, "EVAL_OUTPUT_DIR")  # before the evaluation, not after it
  provider = registry.get_mixture_or_task(mixture_or_task_name)
  registry.check_split_readable(provider, split)
  vocabularies.check_task_readable(provider)  # one clear error for a vocabulary file out of reach
  vocabularies.check_model_readable(model)
  tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
  with postprocessing_guard(tasks) as invalid, integrity.naming_damaged_files(
      mixture_or_task_name, split, training=False):  # a DataLossError names its file
    try:
      evaluator = seqio.Evaluator(
          mixture_or_task_name, model.feature_converter_cls(pack=False), eval_split=split,
          sequence_length=dict(task_feature_lengths) if task_feature_lengths else None,
          num_examples=num_examples, use_memory_cache=True)
      _check_tasks_to_evaluate(mixture_or_task_name, split, tasks, evaluator)
      _check_not_empty(mixture_or_task_name, split, evaluator)
      shapes = {k: (batch_size, *v) for k, v in evaluator.model_feature_shapes.items()}
      predictor = Predictor.from_checkpoint(model, checkpoint_path, shapes, partitioner,
                                            batch_size, bucket_lengths=bucket_lengths,
                                            vocabulary=vocabularies.task_record(provider))
      reporting.announce(f"Evaluating {checkpoint_path} (step {predictor.step}) on "
                         f"{mixture_or_task_name}.")
      future, outputs = evaluator.evaluate(
          compute_metrics=distributed.is_writer(), step=predictor.step,
          predict_fn=predictor.seqio_predict_fn, score_fn=predictor.seqio_score_fn,
          predict_with_aux_fn=predictor.seqio_predict_with_aux_fn)
      task_metrics = _shared_from_process_0(future.result)
    except ValueError as e:
      if isinstance(e.__cause__, BadTargetError):
        raise e.__cause__ from None
      if e.__cause__ is not None and str(e).startswith("Failed to evaluate task"):
        # A metric's own failure. The cause's traceback goes into the message too: gin re-raises
        # errors from configurables without their chain.
        cause = "".join(traceback.format_exception(e.__cause__))
        raise TaskEvaluationError(f"{e}\n\nCaused by:\n{cause}") from e.__cause__
      raise
    for task_name, failed in invalid.items():  # counted while the metrics were computed
      reporting.announce(f"{task_name}: {len(failed)} prediction(s) could not be postprocessed "
                         "and were counted as wrong.")
    if distributed.is_writer():
      out = paths.resolve(output_dir)
      out.mkdir(parents=True, exist_ok=True)
      (out / "metrics.json").write_text(json.dumps(
          {"checkpoint": paths.to_str(checkpoint_path), "step": predictor.step, "split": split,
           "metrics": task_metrics}, indent=2))
      for task in evaluator.eval_tasks:
        _write_predictions(task, evaluator.cached_task_datasets[task.name], outputs[task.name],
                           out / f"{task.name}.{split}.predictions.jsonl")
    distributed.sync("t2t.eval: files written")
  return task_metrics


def _shared_from_process_0(compute: Callable[[], Mapping[str, Any] | None]
                           ) -> dict[str, dict[str, Any]]:
  """Process 0's `compute()` ({task: {metric: value}}, plain numbers) on every process.

  Only process 0 computes (the others' evaluator has no metrics to compute); an error there is
  re-raised on process 0 and becomes a RuntimeError on the others instead of leaving them waiting.
  """
  if distributed.is_writer():
    try:
      results = {task: {k: _scalar(v) for k, v in metrics.items()}
                 for task, metrics in compute().items()}
    except BaseException as e:
      distributed.broadcast_json({"error": f"{type(e).__name__}: {e}"})
      raise
    return distributed.broadcast_json({"results": results})["results"]
  shared = distributed.broadcast_json(None)
  if "error" in shared:
    raise RuntimeError(f"Computing the metrics failed on process 0: {shared['error']}")
  return shared["results"]


def _check_tasks_to_evaluate(name: str, split: str, tasks: Sequence[seqio.Task],
                             evaluator: seqio.Evaluator) -> None:
  """Refuses a run with nothing to evaluate; announces the tasks a mixture leaves out."""
  evaluated = {t.name for t in evaluator.eval_tasks}
  skipped = []
  for task in tasks:
    if task.name in evaluated:
      continue
    reason = (f"has no '{split}' split" if split not in task.splits else
              "has no metric_fns")
    skipped.append(f"'{task.name}' {reason}")
  if not evaluated:
    raise ValueError(f"Nothing to evaluate in '{name}' on split '{split}': "
                     + "; ".join(skipped) + ". Give the task metric_fns or choose another "
                     "EVAL_SPLIT.")
  for line in skipped:
    reporting.announce(f"Not evaluated: task {line}.")


def _check_not_empty(name: str, split: str, evaluator: seqio.Evaluator) -> None:
  """Refuses a task whose split holds no examples: its metrics would be NaN, or the measured
  feature lengths 0. The evaluator has cached the examples in memory already: this is free."""
  for task in evaluator.eval_tasks:
    if not any(True for _ in evaluator.cached_task_datasets[task.name].take(1)):
      raise registry.empty_split_error(task.name, split, name)


class BadTargetError(ValueError):
  """A task's postprocessor failed on one of its own targets: the task is at fault."""


_INVALID_BY_TYPE = ((bool, None), (str, postprocessors.INVALID_LABEL),
                    ((int, np.integer), -1), ((float, np.floating), postprocessors.INVALID_SCORE))


def _invalid_like(target: Any) -> Any:
  """The value a failed prediction becomes: never equal to `target` for a classifier.

  Labels map to INVALID_LABEL, class ids to -1 and scores to INVALID_SCORE, as the task's own
  postprocessors do with an invalid output; a boolean target gets its negation.
  """
  for types, value in _INVALID_BY_TYPE:
    if isinstance(target, types):
      return (not target) if value is None else value
  return postprocessors.INVALID_LABEL


@contextlib.contextmanager
def postprocessing_guard(tasks: Sequence[seqio.Task]) -> Iterator[dict[str, set]]:
  """Within the block, a prediction that makes a task's postprocessor raise counts as wrong.

  Yields {task name: the set of (input, prediction) pairs that failed}. A postprocessor that
  raises on a *target* is the task's own fault: a BadTargetError names the task and the target.
  """
  invalid: dict[str, set[tuple[str, str]]] = {}
  originals = {task.name: task._postprocess_fn for task in tasks}  # pylint: disable=protected-access

  def guarded(task_name, fn):
    def postprocess(output, example=None, is_target=False, **kwargs):
      try:
        return fn(output, example=example, is_target=is_target, **kwargs)
      except Exception as e:  # pylint: disable=broad-except
        if is_target:
          raise BadTargetError(f"Task '{task_name}': its postprocessor fails on the target "
                               f"{output!r}: {type(e).__name__}: {e}") from e
      example = example if example is not None else {}
      # seqio postprocesses once per metric: count each (input, prediction) once.
      source = example.get("inputs_pretokenized", example.get("inputs"))
      invalid.setdefault(task_name, set()).add((repr(np.asarray(source).tolist()), repr(output)))
      target = example.get("targets_pretokenized")
      try:
        target = fn(target, example=example, is_target=True, **kwargs)
      except Exception:  # pylint: disable=broad-except
        target = None
      return _invalid_like(target)
    return postprocess

  # seqio keeps the postprocessor in `Task._postprocess_fn` and copies it into the cached
  # `Task.metric_objs`; both are swapped for the block and restored after it.
  def install(task, fn):
    task._postprocess_fn = fn  # pylint: disable=protected-access
    task.__dict__.pop("metric_objs", None)

  try:
    for task in tasks:
      if originals[task.name] is not None:
        install(task, guarded(task.name, originals[task.name]))
    yield invalid
  finally:
    for task in tasks:
      install(task, originals[task.name])


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


def _write_predictions(task: seqio.Task, dataset, outputs: Mapping[Any, Any],
                       path: str | os.PathLike) -> None:
  """One JSON line per example: its id when the task keeps a string `id` feature, inputs, target,
  and what the model produced for each metric type the task uses (decoded prediction and its
  postprocessed value, target score, aux)."""
  types = seqio.metrics.ModelOutputType
  tokens, aux = outputs.get(types.PREDICTION), {}
  if types.PREDICTION_WITH_AUX in outputs:
    tokens, aux = outputs[types.PREDICTION_WITH_AUX]
  scores = outputs.get(types.SCORE)
  vocab = task.output_features["targets"].vocabulary
  with paths.resolve(path).open("w") as f:
    for i, example in enumerate(dataset.as_numpy_iterator()):
      record = {"inputs": _text(example, "inputs", task) if "inputs" in example else None,
                "target": _text(example, "targets", task)}
      if isinstance(example.get("id"), bytes):  # a task's own example id (files_task: file:line)
        record = {"id": example["id"].decode("utf-8", "replace"), **record}
      if tokens is not None:
        prediction = vocab.decode([int(t) for t in tokens[i]])
        record["prediction"] = prediction
        record["postprocessed"] = _jsonable(task.postprocess_fn(prediction, example=example,
                                                                is_target=False))
      if scores is not None:
        record["score"] = float(scores[i])
      for key, values in aux.items():
        record[f"aux_{key}"] = _jsonable(np.asarray(values[i]).tolist())
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

