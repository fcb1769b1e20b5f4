"""jiant's validation schedule inside training (Wang et al. 2019, App. B; PAPERS.md §6).

Every `every_steps` steps (and at the last step) the run decodes the validation split of its
task(s) with the in-memory parameters (a seqio `Evaluator` and t2t's `Predictor`, as t2t.eval
does) and computes the tasks' metrics. Then, on the chosen metric:

- the best parameters so far are kept in `MODEL_DIR/best/` (one checkpoint, parameters only);
- "learning rate decay: multiply the learning rate by 0.5 whenever validation performance fails
  to improve for more than 4 validation checks" -- a runtime factor in the optimizer state
  (t2t.training.optim.with_lr_scale), so any optimizer and schedule composes with it;
- "stop training if the learning rate falls below 1e-6" and "if we see no improvement after
  more than 20 validation checks" (early stopping).

"More than N checks" is read as PyTorch's ReduceLROnPlateau (which jiant uses) reads its
patience: the (N+1)-th check in a row without improvement acts; the decay count restarts after
each decay, the stopping count only at an improvement. Improvement is strict.

Each check is appended to `MODEL_DIR/metrics.jsonl` (split 'validation') and TensorBoard
(`validation/`), and the history to `MODEL_DIR/validation_state.json`, which a resumed run
replays up to its checkpoint's step so that the counters continue where they were.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Mapping

import gin
import numpy as np
import seqio

from t2t.data import integrity
from t2t.training import checkpoints, distributed, optim, paths, reporting
from t2t.training.partitioning import Partitioner
from t2t.training.trainer import Control, TrainState

STATE_FILE = "validation_state.json"
BEST_DIR = "best"

MetricsFn = Callable[[Any, int], Mapping[str, Mapping[str, float]]]


@dataclasses.dataclass(frozen=True)
class Decision:
  """The outcome of one validation check."""
  improved: bool
  lr_scale: float
  stop: str | None = None


@dataclasses.dataclass
class Plateau:
  """The plateau rules on a sequence of validation values (pure; see the module docstring).

  `decay_patience=None` (or `decay_factor=1`) disables the decay, `stop_patience=None` the
  early stop; `learning_rate` (the base rate) enables the `min_learning_rate` floor.
  """
  higher_is_better: bool = True
  decay_patience: int | None = 4
  decay_factor: float = 0.5
  stop_patience: int | None = 20
  learning_rate: float | None = None
  min_learning_rate: float = 1e-6
  best: float | None = None
  best_step: int | None = None
  bad_checks: int = 0        # checks since the best one
  bad_since_decay: int = 0   # checks since the best one or the last decay
  lr_scale: float = 1.0

  def _better(self, value: float) -> bool:
    if self.best is None:
      return True
    return value > self.best if self.higher_is_better else value < self.best

  def update(self, step: int, value: float) -> Decision:
    value = float(value)
    if np.isnan(value):
      raise FloatingPointError(f"The validation metric is NaN at step {step}.")
    if self._better(value):
      self.best, self.best_step = value, step
      self.bad_checks = self.bad_since_decay = 0
      return Decision(improved=True, lr_scale=self.lr_scale)
    self.bad_checks += 1
    self.bad_since_decay += 1
    if (self.decay_patience is not None and self.decay_factor != 1.0
        and self.bad_since_decay > self.decay_patience):
      self.lr_scale *= self.decay_factor
      self.bad_since_decay = 0
    stop = None
    if self.stop_patience is not None and self.bad_checks > self.stop_patience:
      stop = (f"no improvement of the validation metric in {self.bad_checks} checks "
              f"(best {self.best:g} at step {self.best_step})")
    elif (self.learning_rate is not None
          and self.learning_rate * self.lr_scale < self.min_learning_rate):
      stop = (f"the learning rate fell to {self.learning_rate * self.lr_scale:.3g} "
              f"< {self.min_learning_rate:g}")
    return Decision(improved=False, lr_scale=self.lr_scale, stop=stop)


def select_metric(results: Mapping[str, Mapping[str, float]], metric: str | None) -> float:
  """One number from {task: {metric: value}}.

  `metric` is 'task/metric', or a metric name averaged over the tasks that report it (jiant
  averages its tasks' validation metrics in multitask training), or None: the first metric of
  the first task (in sorted order).
  """
  available = [f"{t}/{m}" for t in sorted(results) for m in sorted(results[t])]
  if not available:
    raise ValueError("Validation produced no metrics: does the task have metric functions?")
  if metric is None:
    metric = available[0]
  if "/" in metric and metric in available:
    task, name = metric.split("/", 1)
    return float(results[task][name])
  values = [float(m[metric]) for m in results.values() if metric in m]
  if not values:
    raise ValueError(f"Validation metric {metric!r} is not among the metrics the tasks report: "
                     f"{', '.join(available)}. Set Validation.metric to one of them.")
  return float(np.mean(values))


@gin.configurable
@dataclasses.dataclass
class Validation:
  """The schedule's settings (gin: `train.validation = @Validation()`; gin/recipes/jiant.gin).

  `metric`: see `select_metric`. `mixture_or_task_name`: what to validate on (None: the
  training task or mixture). `num_examples`: cap per task (None: the whole split).
  """
  every_steps: int = 1000
  metric: str | None = None
  higher_is_better: bool = True
  decay_patience: int | None = 4
  decay_factor: float = 0.5
  stop_patience: int | None = 20
  learning_rate: float | None = None
  min_learning_rate: float = 1e-6
  split: str = "validation"
  mixture_or_task_name: str | None = None
  num_examples: int | None = None
  batch_size: int = 32
  keep_best: bool = True

  def __post_init__(self):
    if self.every_steps < 1:
      raise ValueError(f"Validation.every_steps must be >= 1, got {self.every_steps}.")
    if not 0 < self.decay_factor <= 1:
      raise ValueError(f"Validation.decay_factor must be in (0, 1], got {self.decay_factor}.")

  @property
  def decays_learning_rate(self) -> bool:
    return self.decay_patience is not None and self.decay_factor != 1.0

  def plateau(self) -> Plateau:
    return Plateau(higher_is_better=self.higher_is_better, decay_patience=self.decay_patience,
                   decay_factor=self.decay_factor, stop_patience=self.stop_patience,
                   learning_rate=self.learning_rate, min_learning_rate=self.min_learning_rate)

  def hook(self, *, model: Any, mixture_or_task_name: str,
           task_feature_lengths: Mapping[str, int] | None, model_dir: str,
           partitioner: Partitioner, start_step: int, last_step: int,
           metrics_fn: MetricsFn | None = None) -> "ValidationHook":
    """The training hook; `metrics_fn(params, step)` defaults to decoding the split."""
    if metrics_fn is None:
      metrics_fn = _seqio_metrics_fn(model, self.mixture_or_task_name or mixture_or_task_name,
                                     self.split, task_feature_lengths, self.num_examples,
                                     self.batch_size, partitioner)
    return ValidationHook(self, metrics_fn, model_dir, start_step, last_step)


class ValidationHook:
  """Validates, keeps the best parameters, and asks the loop for a new LR factor or a stop."""

  def __init__(self, config: Validation, metrics_fn: MetricsFn, model_dir: str,
               start_step: int, last_step: int):
    self.config, self.metrics_fn, self.model_dir = config, metrics_fn, model_dir
    self.last_step = last_step
    self.plateau = config.plateau()
    self.history: list[dict[str, Any]] = []
    for record in _read_history(model_dir):  # a resumed run replays its earlier checks
      if record["step"] <= start_step:
        self.plateau.update(record["step"], record["value"])
        self.history.append(record)
    self._writer: reporting.MetricsWriter | None = None

  def __call__(self, step: int, state: TrainState, metrics, batch) -> Control | None:
    del metrics, batch
    if step % self.config.every_steps and step != self.last_step:
      return None
    results = self.metrics_fn(state.params, step)
    value = select_metric(results, self.config.metric)
    decision = self.plateau.update(step, value)
    flat = {f"{t}/{m}": v for t, ms in results.items() for m, v in ms.items()
            if isinstance(v, (int, float, np.number))}
    record = {"step": step, "value": value, "lr_scale": decision.lr_scale,
              "improved": decision.improved, "metrics": flat}
    self.history.append(record)
    self._write(record)
    if decision.improved and self.config.keep_best:
      _save_best(os.path.join(self.model_dir, BEST_DIR), step, state.params,
                 {"metric": self.config.metric, "value": value})
    reporting.announce(
        f"Validation at step {step}: {self.config.metric or 'metric'} {value:.4g} "
        f"(best {self.plateau.best:.4g} at step {self.plateau.best_step}"
        + (f", learning-rate factor {decision.lr_scale:g}" if decision.lr_scale != 1 else "")
        + ")")
    new_state = None
    if self.config.decays_learning_rate and decision.lr_scale != optim.get_lr_scale(
        state.opt_state):
      new_state = state.replace(opt_state=optim.set_lr_scale(state.opt_state,
                                                             decision.lr_scale))
    if new_state is None and decision.stop is None:
      return None
    return Control(state=new_state, stop=decision.stop)

  def _write(self, record: Mapping[str, Any]) -> None:
    if self._writer is None:
      self._writer = reporting.MetricsWriter(self.model_dir, "validation")
    self._writer.write(record["step"], {**record["metrics"], "value": record["value"],
                                        "lr_scale": record["lr_scale"]})
    if not distributed.is_writer():
      return
    path = paths.resolve(self.model_dir) / STATE_FILE
    tmp = path.parent / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(
        {"metric": self.config.metric, "higher_is_better": self.config.higher_is_better,
         "best_step": self.plateau.best_step, "best": self.plateau.best,
         "history": self.history}, indent=1))
    tmp.replace(path)


def _read_history(model_dir: str) -> list[dict[str, Any]]:
  path = paths.resolve(model_dir) / STATE_FILE
  if not path.exists():
    return []
  return list(json.loads(path.read_text())["history"])


def _save_best(best_dir: str, step: int, params: Any, meta: Mapping[str, Any]) -> None:
  """Replaces the checkpoint in `best_dir` by `params` at `step` (written aside, then swapped).

  Every process takes part in the (collective) orbax save; process 0 alone clears and swaps the
  directories, with barriers around, so no host reads a half-swapped `best/`.
  """
  best, tmp = paths.resolve(best_dir), paths.resolve(best_dir + ".tmp")
  if distributed.is_writer() and tmp.exists():
    tmp.rmtree()
  distributed.sync("best_checkpoint_cleared")
  ckpt = checkpoints.Checkpointer(os.fspath(tmp), keep=1)
  ckpt.save(step, params, {}, dict(meta))
  ckpt.close()
  if distributed.is_writer():
    if best.exists():
      best.rmtree()
    tmp.rename(best)
  distributed.sync("best_checkpoint_swapped")


def _seqio_metrics_fn(model: Any, mixture_or_task_name: str, split: str,
                      task_feature_lengths: Mapping[str, int] | None, num_examples: int | None,
                      batch_size: int, partitioner: Partitioner) -> MetricsFn:
  """Decodes `split` with the given parameters and computes each task's metrics."""
  from t2t.training.predictor import Predictor  # predictor imports checkpoints; no cycle here
  with integrity.naming_damaged_files(mixture_or_task_name, split):  # read here, kept in memory
    evaluator = seqio.Evaluator(
        mixture_or_task_name, model.feature_converter_cls(pack=False), eval_split=split,
        sequence_length=dict(task_feature_lengths) if task_feature_lengths else None,
        num_examples=num_examples, use_memory_cache=True)
  if not evaluator.eval_tasks:
    raise ValueError(f"'{mixture_or_task_name}' has no task with metrics and a '{split}' split "
                     "to validate on; set Validation.mixture_or_task_name or remove "
                     "train.validation.")
  partitioner.check_batch_size(batch_size)
  predictor = Predictor(model, None, partitioner, batch_size)

  def predict_fn(dataset):
    return _fixed_length(predictor.seqio_predict_fn(dataset))

  def metrics_fn(params: Any, step: int) -> dict[str, dict[str, float]]:
    predictor.params = params
    future, _ = evaluator.evaluate(compute_metrics=True, step=step, predict_fn=predict_fn,
                                   score_fn=predictor.seqio_score_fn)
    return {task: {k: _scalar(v) for k, v in ms.items()} for task, ms in future.result().items()}

  return metrics_fn


def _fixed_length(predictions: list[tuple[int, Any]], eos_id: int = 1
                  ) -> list[tuple[int, list[int]]]:
  """Pads decoded ids to one length, EOS then zeros (the model API's convention).

  seqio's Evaluator stacks the predictions into one array, which fails on lists of different
  lengths; its vocabularies decode up to the first EOS, so the padding decodes to nothing.
  """
  width = max((len(ids) for _, ids in predictions), default=0) + 1
  return [(i, [int(t) for t in ids] + [eos_id] + [0] * (width - len(ids) - 1))
          for i, ids in predictions]


def _scalar(value: Any) -> Any:
  value = getattr(value, "value", value)  # seqio.metrics.Scalar
  return value.item() if isinstance(value, np.generic) else value
