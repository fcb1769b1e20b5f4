r"""Train a model: `python -m t2t.train --gin_file=... [--gin.X=V ...]`.

Example (pre-train the tiny T5 on BBC span corruption):

  python -m t2t.train --gin_file=models/t5_1_0/tiny.gin --gin_file=runs/pretrain.gin \
    --gin.MIXTURE_OR_TASK_NAME=bbc_span_corruption --gin.TRAIN_STEPS=1000 \
    --gin.MODEL_DIR=/tmp/t2t/pretrain

The run resumes from the latest checkpoint in MODEL_DIR, the input pipeline included: each host
restores its iterator's saved position (t2t.training.input_state), so a resume costs the same at
any step and sees exactly the batches of an uninterrupted run (checkpoints without that state
replay the stream). It refuses a MODEL_DIR written with another mixture/task, batch size, feature
lengths, packing, host count or USE_CACHED_TASKS. With `train.use_cached_tasks = True` the tasks
are read from seqio's cache (t2t.data.cache; `train.cache_dirs`). INITIAL_CHECKPOINT_PATH (fine-tuning)
loads parameters from another run when MODEL_DIR holds none yet -- all of them, or with
`train.partial_restore = True` those whose path and shape match (the rest initialised fresh;
`train.reinitialize = ['head/.*']` forces a fresh start for matching names). With
`train.validation = @Validation()` the run validates every N steps, keeps the best checkpoint
in MODEL_DIR/best, decays the learning rate on a plateau and stops early
(t2t.training.validation; gin/recipes/jiant.gin). A run that stopped early stays stopped.

SIGTERM or SIGINT (a preemptible VM being reclaimed, Ctrl-C) lets the step in flight finish,
saves a checkpoint at that step and exits with status 0 ("Preempted at step N: ..."); every host
stops at the same step (t2t.training.preemption). Unlike an early stop this writes no
stopped.json: rerunning the same command resumes with the same batches. A second SIGINT
interrupts at once. A corrupted latest checkpoint is reported and the previous one is used
(t2t.training.checkpoints).

Checkpoints are written asynchronously (`train.async_checkpoints`, default True): the arrays
are copied to host memory and training goes on while a background thread writes them. Each
host's input state is written before its step's orbax save starts, and a resume uses only steps
orbax finalised, so a run killed at any moment (SIGKILL, a crash, mid-write) and restarted with
the same command continues with exactly the batches and losses of an uninterrupted run. On a
resume, `metrics.jsonl` is cut back to the rows up to the resumed step (a killed run may have
logged steps past its last checkpoint; the rerun logs them again). A full disk while saving ends
the run with one line naming the step and MODEL_DIR (exit status 1); the previous checkpoint is
intact and a rerun resumes from it.
"""
from __future__ import annotations

if __name__ == "__main__":
  # `python -m t2t.train` runs this file as __main__. Run the importable module instead, so that
  # gin registers its configurable once (as t2t.train.*), not a second time under __main__.
  from t2t import cli
  cli.run_module("t2t.train")

import json
import os
from typing import Any, Mapping, Sequence

import gin
import jax
import optax

from t2t import config
from t2t.data import limited  # noqa: F401  (registers @limited_task for gin files)
from t2t.data import registry
from t2t.data import cache as cache_lib
from t2t.data import integrity, vocabularies
from t2t.training import adaptation, arguments, checkpoints, distributed, input_state, inputs, optim
from t2t.training import paths
from t2t.training import warm_start
from t2t.training import preemption, profiling, reporting
from t2t.training import trainer as trainer_lib
from t2t.training import validation as validation_lib
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
          partial_restore: bool = False,
          reinitialize: Sequence[str] = (),
          validation: validation_lib.Validation | None = None,
          use_packing: bool = True,
          seed: int = 0,
          checkpoint_every: int = 1000,
          keep_checkpoints: int | None = 3,
          async_checkpoints: bool = True,
          log_every: int = 10,
          use_cached_tasks: bool = False,
          cache_dirs: Sequence[str] = (),
          profile: profiling.Profile | None = None,
          hooks: Sequence[trainer_lib.Hook] = ()) -> trainer_lib.TrainState:
  """Trains `model` on a seqio task or mixture until step `train_steps`; returns the state.

  Writes into `model_dir`: checkpoints every `checkpoint_every` steps and at the end,
  `config.gin`, TensorBoard events under `train/`, and `metrics.jsonl`. With `validation`:
  also `best/`, `validation/` events, `validation_state.json`, and `stopped.json` when the
  schedule ends the run early; per checkpoint, each host's input position under
  `input_state/checkpoint_<step>/`. With `async_checkpoints` a save returns once the arrays
  are on the host and the disk is written in the background (finished before the next save,
  a preemption exit, and before this returns). `use_cached_tasks` reads the tasks from seqio's cache,
  looked up in `cache_dirs` (and seqio's global cache dirs). With `profile`: a `jax.profiler`
  trace of the steps it names under `profile/` (t2t/training/profiling.py).
  """
  # Bad values from gin (a string for a number, 0 for a batch) fail here, named, not deep inside.
  train_steps = arguments.positive_int(train_steps, "TRAIN_STEPS (train.train_steps)")
  batch_size = arguments.positive_int(batch_size, "BATCH_SIZE (train.batch_size)")
  seed = arguments.integer(seed, "SEED (train.seed)")
  use_packing = arguments.boolean(use_packing, "USE_PACKING (train.use_packing)")
  checkpoint_every = arguments.non_negative_int(
      checkpoint_every, "CHECKPOINT_EVERY (train.checkpoint_every)", "only at the end")
  log_every = arguments.positive_int(log_every, "train.log_every")
  model_dir = arguments.directory(model_dir, "MODEL_DIR (train.model_dir)")
  provider = registry.get_mixture_or_task(mixture_or_task_name)
  # The features the model's converter reads need a length (a decoder-only LM: 'targets' only).
  needed = getattr(model.feature_converter_cls, "TASK_FEATURES", provider.output_features)
  task_feature_lengths = arguments.feature_lengths(
      task_feature_lengths, "TASK_FEATURE_LENGTHS (train.task_feature_lengths)",
      required=set(needed) & set(provider.output_features))
  inputs.limit_tf_threads()
  model_dir = paths.to_str(model_dir)  # local paths absolute; URLs (gs://...) as given
  paths.check_writable(model_dir, "MODEL_DIR")  # before any compilation; process 0 only
  registry.check_split_readable(provider, "train")
  vocabularies.check_task_readable(provider)  # one clear error for a vocabulary file out of reach
  vocabularies.check_model_readable(model)
  if use_cached_tasks:
    cache_lib.add_cache_dirs(cache_dirs)
    cache_lib.check_cached(mixture_or_task_name, "train")
  # An empty split would hang in repeat() or end the stream at step 0: refuse it before compiling.
  with integrity.naming_damaged_files(mixture_or_task_name, "train", use_cached_tasks):
    registry.check_split_not_empty(provider, "train", task_feature_lengths,
                                   use_cached=use_cached_tasks)
  partitioner = partitioner or Partitioner()
  partitioner.check_batch_size(batch_size)
  converter = model.feature_converter_cls(pack=use_packing)
  model_lengths = converter.get_model_feature_lengths(dict(task_feature_lengths))
  input_shapes = {k: (batch_size, v) for k, v in model_lengths.items()}
  if validation is not None and validation.decays_learning_rate:
    optimizer = optim.with_lr_scale(optimizer)
  tr = trainer_lib.Trainer(model, optimizer, partitioner, input_shapes, seed=seed)

  ckpt = checkpoints.Checkpointer(model_dir, keep=keep_checkpoints,
                                  side_dirs=(input_state.STATE_DIR,))
  stream_meta = input_state.run_meta(mixture_or_task_name, batch_size, task_feature_lengths,
                                     use_packing, use_cached_tasks)
  try:  # the newest checkpoint that reads back whole (a corrupted one is reported, set aside)
    restored = ckpt.restore_latest_good(
        tr.params_abstract, tr.params_shardings, tr.opt_state_abstract, tr.opt_state_shardings,
        check_meta=lambda step, meta: input_state.check_resumable(
            meta, stream_meta, ckpt.step_dir(step)))
  except (input_state.ResumeMismatchError, checkpoints.CheckpointMismatchError,
          checkpoints.CorruptCheckpointError):
    ckpt.close()
    raise
  latest, input_skip = None, 0
  if restored is not None:
    latest, params, opt_state, meta = restored
    state = trainer_lib.TrainState(
        step=jax.device_put(jax.numpy.asarray(latest, jax.numpy.int32),
                            partitioner.replicated),
        params=params, opt_state=opt_state)
    batches_consumed = int(meta.get("batches_consumed", latest))
    input_skip = int(meta.get("input_skip", 0))
    reporting.announce(f"Resuming from {model_dir} at step {latest}.")
  elif initial_checkpoint_path:
    params, from_step, plan = warm_start.restore_params(
        initial_checkpoint_path, tr.params_abstract, tr.params_shardings, tr.init_params,
        partial=partial_restore, reinitialize=reinitialize, added=adaptation.ADDED_PATTERNS,
        vocabulary=stream_meta.get("vocabulary"))
    reporting.announce(
        f"Initialised parameters from {initial_checkpoint_path} (step {from_step}).")
    if plan.reinitialised or plan.skipped:
      reporting.announce(plan.report(initial_checkpoint_path, from_step))
    state, batches_consumed = tr.init_state(params), 0
  else:
    state, batches_consumed = tr.init_state(), 0
  config.write_operative_config(model_dir)

  start = int(jax.device_get(state.step))
  _truncate_metrics(model_dir, start)  # steps a killed run logged past its last checkpoint
  batches, input_skip = _resumed_batches(
      model_dir, latest, batches_consumed, input_skip, mixture_or_task_name,
      task_feature_lengths, converter, batch_size, seed, use_cached_tasks)
  writer = reporting.MetricsWriter(model_dir, "train")
  progress = reporting.Progress(start, train_steps, log_every=log_every)

  def report(step, state, metrics, batch):
    speed = progress.update(step, inputs.count_tokens(batch), metrics)
    if metrics is not None:
      writer.write(step, {**metrics, "steps_per_sec": speed["steps_per_sec"],
                          "tokens_per_sec": speed["tokens_per_sec"]})

  last_saved = None
  input_state_saveable = True

  def save(step, state):
    nonlocal last_saved
    # A sync here is fine (saving syncs anyway): with Trainer.on_nonfinite = 'stop' a state
    # after a non-finite step is never saved (NonFiniteError), so the last checkpoint stays good.
    tr.check_finite(step, state)
    if step != last_saved:  # an early stop saves, perhaps at a step just checkpointed
      # The input state is written first (`before`), then orbax saves in the background.
      ckpt.save(step, state.params, state.opt_state,
                {"batches_consumed": batches_consumed + step - start,
                 "input_skip": input_skip, **stream_meta},
                before=save_input_state, blocking=not async_checkpoints)
      last_saved = step

  def save_input_state(step):
    nonlocal input_state_saveable
    if input_state_saveable:  # `step` batches drawn in all: the hooks run after each step
      try:
        input_state.save(batches, ckpt.model_dir, step)
      except input_state.NotCheckpointableError as e:
        input_state_saveable = False
        reporting.announce(
            f"The input pipeline of {mixture_or_task_name!r} cannot be checkpointed ({e}); "
            "checkpoints hold no input state, so a resume will replay the stream.")

  def stop(step, state, reason):
    save(step, state)
    ckpt.wait()  # the checkpoint is on disk before the run says so and exits
    if reason == preemption.PREEMPTED:  # not an early stop: a rerun resumes from here
      reporting.announce(f"Preempted at step {step}: checkpoint saved; rerun the same command "
                         "to resume.")
      return
    if distributed.is_writer():
      (paths.resolve(model_dir) / STOPPED).write_text(json.dumps({"step": step, "reason": reason}))
    reporting.announce(f"Stopped at step {step}: {reason}.")

  validate = []
  if validation is not None:
    validate = [validation.hook(model=model, mixture_or_task_name=mixture_or_task_name,
                                task_feature_lengths=task_feature_lengths, model_dir=model_dir,
                                partitioner=partitioner, start_step=start, last_step=train_steps)]
  preempted = preemption.Preemption(sync_every=log_every)
  profiler = profile.hook(model_dir, start, train_steps) if profile is not None else None
  all_hooks = [report, *validate, trainer_lib.every(checkpoint_every, save, last=train_steps),
               *hooks, preempted.hook]
  if profiler is not None:   # outermost: no hook of the steps either side is traced
    all_hooks = [profiler.stop_hook, *all_hooks, profiler.start_hook]
  stopped = _stopped_at(model_dir, start)
  finished = False
  try:
    preempted.install()  # SIGTERM/SIGINT: finish the step, save, exit cleanly
    if stopped:
      reporting.announce(f"The run in {model_dir} stopped early at step {start} ({stopped}); "
                         "nothing to train.")
    elif start < train_steps:
      if profiler is not None:   # a trace from the first step of this run on starts here
        profiler.start_hook(start, state, None, None)
      named = integrity.NamingDamagedFiles(batches, mixture_or_task_name, "train",
                                           use_cached_tasks)  # a DataLossError names its file
      try:
        state = trainer_lib.run_loop(tr, state, named, train_steps, all_hooks, log_every,
                                     on_stop=stop)
      except trainer_lib.NonFiniteError as e:
        ckpt.wait()  # a save in flight (of a step before the bad one) is finished, and counted
        raise e.with_checkpoint(ckpt.latest_step()) from None
    else:
      reporting.announce(
          f"MODEL_DIR already holds step {start} >= TRAIN_STEPS={train_steps}; nothing to train.")
    finished = True
  finally:
    if profiler is not None:
      profiler.close()
    preempted.uninstall()
    progress.close()
    writer.close()
    try:
      # Again at the end: gin adds `train`'s own bindings once the call has been made.
      config.write_operative_config(model_dir)
    finally:
      _close(ckpt, raise_errors=finished)  # waits for the save in flight
  return state


def _close(ckpt: checkpoints.Checkpointer, raise_errors: bool) -> None:
  """Closes `ckpt`, finishing its pending save. On an error path (`raise_errors` False) a
  failure of that save is reported in one line and the error already raised goes on."""
  try:
    ckpt.close()
  except Exception as e:  # noqa: BLE001
    if raise_errors:
      raise
    reporting.announce(f"The checkpoint being written could not be finished either: "
                       f"{type(e).__name__}: {str(e).strip()[:300]}")


def _truncate_metrics(model_dir: str, step: int) -> None:
  """Drops the rows of MODEL_DIR/metrics.jsonl logged after `step` (process 0).

  A run killed after step S logged steps past its last checkpoint C < S; the rerun resumes at
  C and logs C+1.. again, so the file keeps one row per step and split, as an uninterrupted
  run's. (TensorBoard's event files keep both: it plots the later ones over the earlier.)
  """
  path = paths.resolve(model_dir) / "metrics.jsonl"
  if not distributed.is_writer() or not path.exists():
    return
  lines = path.read_text().splitlines(keepends=True)
  kept = [line for line in lines if _row_step(line) <= step]
  if len(kept) == len(lines):
    return
  if paths.is_url(model_dir):
    path.write_text("".join(kept))
  else:  # written aside and renamed: a kill now leaves the old file or the new one
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text("".join(kept))
    os.replace(tmp, path)


def _row_step(line: str) -> float:
  """A metrics row's step; infinity for a line that does not parse (a killed run's torn last
  line, dropped), 0 for a row without one (kept)."""
  try:
    row = json.loads(line)
    return float(row.get("step", 0)) if isinstance(row, dict) else float("inf")
  except ValueError:
    return float("inf")


STOPPED = "stopped.json"


def _resumed_batches(model_dir: str, latest: int | None, batches_consumed: int, input_skip: int,
                     mixture_or_task_name: str, task_feature_lengths: Mapping[str, int],
                     converter: Any, batch_size: int, seed: int, use_cached: bool
                     ) -> tuple[Any, int]:
  """(iterator, skip): this host's training iterator, positioned after `batches_consumed` batches.

  From the input state saved with checkpoint `latest` when there is one; else by replaying the
  stream (older checkpoints, or pipelines tf.data cannot save), which says so. A replayed
  stream is a different pipeline (it holds a `skip(n)` stage), and the input states saved from
  it only fit a pipeline built the same way: so `skip` (the n the iterator was built with) goes
  into every later checkpoint's meta as `input_skip`, and a resume rebuilds with the
  `input_skip` of its checkpoint before restoring (absent in older checkpoints: 0).
  """
  model_dir = paths.to_str(model_dir)
  restorable = latest is not None and input_state.exists(model_dir, latest)
  if batches_consumed and not restorable:
    reporting.announce(
        f"Checkpoint {latest} in {model_dir} holds no input state for host "
        f"{jax.process_index()}; replaying the input stream to skip {batches_consumed} batches "
        "(this takes time in proportion to the step).")
  skip = input_skip if restorable else batches_consumed
  batches = inputs.train_batches(mixture_or_task_name, task_feature_lengths, converter,
                                 batch_size, seed=seed, use_cached=use_cached,
                                 skip_batches=skip,
                                 check_not_empty=False)  # train() checked before compiling
  if restorable:
    input_state.restore(batches, model_dir, latest)
  return batches, skip


def _stopped_at(model_dir: str, step: int) -> str | None:
  """The reason the run in `model_dir` stopped early at `step`, if it did."""
  path = paths.resolve(model_dir) / STOPPED
  if not path.exists():
    return None
  record = json.loads(path.read_text())
  return record["reason"] if record.get("step") == step else None


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import cli
  cli.parse_flags_into_gin()
  train()

