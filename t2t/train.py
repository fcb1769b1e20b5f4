r"""Train a model: `python -m t2t.train --gin_file=... [--gin.X=V ...]`.

Example (pre-train the tiny T5 on BBC span corruption):

  python -m t2t.train --gin_file=models/t5_1_0/tiny.gin --gin_file=runs/pretrain.gin \
    --gin.MIXTURE_OR_TASK_NAME=bbc_span_corruption --gin.TRAIN_STEPS=1000 \
    --gin.MODEL_DIR=/tmp/t2t/pretrain

The run resumes from the latest checkpoint in MODEL_DIR; INITIAL_CHECKPOINT_PATH (fine-tuning)
loads parameters from another run when MODEL_DIR holds none yet.
"""
from __future__ import annotations

if __name__ == "__main__":
  # `python -m t2t.train` runs this file as __main__. Run the importable module instead, so that
  # gin registers its configurable once (as t2t.train.*), not a second time under __main__.
  from t2t import cli
  cli.run_module("t2t.train")

import os
from typing import Any, Mapping, Sequence

import gin
import jax
import optax

from t2t import config
from t2t.data import registry
from t2t.training import checkpoints, inputs, reporting, trainer as trainer_lib
from t2t.training.partitioning import Partitioner


@gin.configurable(denylist=["hooks"])
def train(*,
          model: Any = gin.REQUIRED,
          mixture_or_task_name: str = gin.REQUIRED,
          task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
          train_steps: int = gin.REQUIRED,
          model_dir: str = gin.REQUIRED,
          batch_size: int = gin.REQUIRED,
          optimizer: optax.GradientTransformation = gin.REQUIRED,
          partitioner: Partitioner | None = None,
          initial_checkpoint_path: str | None = None,
          use_packing: bool = True,
          seed: int = 0,
          checkpoint_every: int = 1000,
          keep_checkpoints: int | None = 3,
          log_every: int = 10,
          hooks: Sequence[trainer_lib.Hook] = ()) -> trainer_lib.TrainState:
  """Trains `model` on a seqio task or mixture until step `train_steps`; returns the state.

  Writes into `model_dir`: checkpoints every `checkpoint_every` steps and at the end,
  `config.gin`, TensorBoard events under `train/`, and `metrics.jsonl`.
  """
  inputs.limit_tf_threads()
  registry.check_split_readable(registry.get_mixture_or_task(mixture_or_task_name), "train")
  partitioner = partitioner or Partitioner()
  partitioner.check_batch_size(batch_size)
  converter = model.feature_converter_cls(pack=use_packing)
  model_lengths = converter.get_model_feature_lengths(dict(task_feature_lengths))
  input_shapes = {k: (batch_size, v) for k, v in model_lengths.items()}
  tr = trainer_lib.Trainer(model, optimizer, partitioner, input_shapes, seed=seed)

  ckpt = checkpoints.Checkpointer(model_dir, keep=keep_checkpoints)
  ckpt.check(tr.params_abstract)  # before anything in model_dir is touched
  latest = ckpt.latest_step()
  if latest is not None:
    params, opt_state, meta = ckpt.restore(latest, tr.params_abstract, tr.params_shardings,
                                           tr.opt_state_abstract, tr.opt_state_shardings)
    state = trainer_lib.TrainState(
        step=jax.device_put(jax.numpy.asarray(latest, jax.numpy.int32),
                            partitioner.replicated),
        params=params, opt_state=opt_state)
    batches_consumed = int(meta.get("batches_consumed", latest))
    reporting.announce(f"Resuming from {model_dir} at step {latest}.")
  elif initial_checkpoint_path:
    params, from_step = checkpoints.load_params(initial_checkpoint_path, tr.params_abstract,
                                                tr.params_shardings)
    reporting.announce(
        f"Initialised parameters from {initial_checkpoint_path} (step {from_step}).")
    state, batches_consumed = tr.init_state(params), 0
  else:
    state, batches_consumed = tr.init_state(), 0
  config.write_operative_config(model_dir)

  start = int(jax.device_get(state.step))
  batches = inputs.train_batches(mixture_or_task_name, task_feature_lengths, converter,
                                 batch_size, seed=seed, skip_batches=batches_consumed)
  writer = reporting.MetricsWriter(model_dir, "train")
  progress = reporting.Progress(start, train_steps, log_every=log_every)

  def report(step, state, metrics, batch):
    speed = progress.update(step, inputs.count_tokens(batch), metrics)
    if metrics is not None:
      writer.write(step, {**metrics, "steps_per_sec": speed["steps_per_sec"],
                          "tokens_per_sec": speed["tokens_per_sec"]})

  def save(step, state):
    ckpt.save(step, state.params, state.opt_state,
              {"batches_consumed": batches_consumed + step - start,
               "mixture_or_task_name": mixture_or_task_name})

  all_hooks = [report, trainer_lib.every(checkpoint_every, save, last=train_steps), *hooks]
  try:
    if start < train_steps:
      state = trainer_lib.run_loop(tr, state, batches, train_steps, all_hooks, log_every)
    else:
      reporting.announce(
          f"MODEL_DIR already holds step {start} >= TRAIN_STEPS={train_steps}; nothing to train.")
  finally:
    progress.close()
    writer.close()
    ckpt.close()
    # Again at the end: gin adds `train`'s own bindings once the call has been made.
    config.write_operative_config(model_dir)
  return state


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import cli
  cli.parse_flags_into_gin()
  train()

