"""Time to the first step after resuming at step 10 and at step 5,000: restored input state vs replay.

  python -m benchmarks.resume [--steps 10 5000] [--batch 2] [--allow-loaded] [--skip-train]
      [--out F]

The stream is the one training reads (`inputs.train_batches`: BBC span corruption, shuffled,
packed to 32/8 tokens; a small batch so 5,000 batches take seconds to produce). For each N:

- `state_produce_s`: drawing N batches from a fresh pipeline and saving its iterator state
  (`input_state.save`), i.e. a real state N batches in, as a run at step N leaves it;
- input side, time to the first batch: `restore_first_batch_s` (build + `input_state.restore` +
  one batch) against `replay_first_batch_s` (the old path: build with `skip_batches=N` + one
  batch), and whether both paths give the same batch;
- with the model (unless --skip-train), `train()`'s time to its first step when resuming a
  MODEL_DIR at step N: from input state, and with that state removed (replay). The step-N
  checkpoint is made cheaply: a tiny T5 trained 10 steps, its parameters and optimizer state saved
  again as step N (`Checkpointer.save`) beside the real N-batch iterator state. Everything in
  train() but the input position is independent of N, so this isolates what N costs.

Prints one JSON object, with `benchmarks.machine` load figures per section.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

from benchmarks import machine  # noqa: E402

TASK = 'bbc_span_corruption'
LENGTHS = {'inputs': 32, 'targets': 8}


def _stream(batch_size: int, skip: int = 0):
  import seqio
  from t2t.training import inputs
  return inputs.train_batches(TASK, LENGTHS, seqio.EncDecFeatureConverter(pack=True), batch_size,
                              seed=0, skip_batches=skip)


def measure_inputs(model_dir: str, n: int, batch_size: int) -> dict:
  """State production and time to the first batch by restore and by replay, at batch N."""
  import numpy as np
  from t2t.training import input_state
  with machine.Section(f'produce_{n}') as produce:
    it = _stream(batch_size)
    for _ in range(n):
      next(it)
    prefix = input_state.save(it, model_dir, n)
  expected = next(it)
  with machine.Section(f'restore_{n}') as restore:
    resumed = _stream(batch_size)
    input_state.restore(resumed, model_dir, n)
    from_state = next(resumed)
  with machine.Section(f'replay_{n}') as replay:
    from_replay = next(_stream(batch_size, skip=n))
  same = all(np.array_equal(from_state[k], expected[k]) and np.array_equal(from_replay[k], expected[k])
             for k in expected)
  state_bytes = sum(os.path.getsize(p) for p in
                    [os.path.join(os.path.dirname(prefix), f) for f in os.listdir(os.path.dirname(prefix))])
  return dict(n=n, state_produce_s=produce.wall_s, restore_first_batch_s=restore.wall_s,
              replay_first_batch_s=replay.wall_s, same_first_batch=same, state_bytes=state_bytes,
              sections=[s.as_dict() for s in (produce, restore, replay)])


def _tiny_model():
  from t2t.data import vocabularies
  from t2t.models.api import EncoderDecoderModel
  from t2t.models.transformer import T5Config, Transformer
  vocab = vocabularies.bbc_vocabulary()
  config = T5Config(vocab_size=8192, d_model=32, num_heads=2, d_kv=16, d_ff=64,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
  return EncoderDecoderModel(module=Transformer(config), input_vocabulary=vocab,
                             output_vocabulary=vocab)


def _train_kwargs(model_dir: str, steps: int, batch_size: int, hooks=()) -> dict:
  import optax
  return dict(model=_tiny_model(), mixture_or_task_name=TASK, task_feature_lengths=LENGTHS,
              train_steps=steps, model_dir=model_dir, batch_size=batch_size,
              optimizer=optax.adam(1e-3), checkpoint_every=10**9, log_every=1,
              keep_checkpoints=None, hooks=list(hooks))


def _first_step_s(model_dir: str, steps: int, batch_size: int) -> tuple[float, machine.Section]:
  from t2t import train as train_lib
  first = []
  with machine.Section(f'train_first_step_{os.path.basename(model_dir)}') as section:
    t0 = time.perf_counter()
    train_lib.train(**_train_kwargs(model_dir, steps, batch_size, hooks=[
        lambda step, state, metrics, batch: first.append(time.perf_counter() - t0)
        if not first else None]))
  return first[0], section


def resume_dirs(root: str, n: int, input_dir: str, params: Any, opt_state: Any,
                meta: dict) -> tuple[str, str]:
  """Two MODEL_DIRs holding the same step-N checkpoint: `run` with the real N-batch input state
  saved in `input_dir` (`input_state.save` at step N), `replay` without it.

  Raises RuntimeError if train() would not take the path each is named for (a resume restores
  from input state only where `input_state.exists`), so a layout change cannot turn the
  "restore" figure into a second replay unnoticed.
  """
  from t2t.training import checkpoints, input_state
  run = os.path.join(root, f'at_{n}')
  ckpt = checkpoints.Checkpointer(run, keep=None)
  ckpt.save(n, params, opt_state, {**meta, 'batches_consumed': n})
  ckpt.close()
  shutil.copytree(input_state.step_dir(input_dir, n), input_state.step_dir(run, n))
  replay = os.path.join(root, f'at_{n}_replay')
  shutil.copytree(run, replay)
  shutil.rmtree(input_state.step_dir(replay, n))
  if not input_state.exists(run, n) or input_state.exists(replay, n):
    raise RuntimeError(f'benchmarks.resume: the step-{n} input state is not where a resume looks '
                       f'for it ({input_state.state_prefix(run, n)}.index); t2t.training.'
                       'input_state changed its layout and this benchmark must follow it.')
  return run, replay


def measure_train(root: str, steps: Sequence[int], batch_size: int,
                  input_dirs: dict[int, str]) -> list[dict]:
  """train()'s time to the first step resuming at each N, from input state and by replay."""
  from t2t import train as train_lib
  from t2t.training import checkpoints, trainer as trainer_lib
  from t2t.training.partitioning import Partitioner
  base = os.path.join(root, 'base')
  train_lib.train(**_train_kwargs(base, 10, batch_size))  # a real checkpoint at step 10
  kwargs = _train_kwargs(base, 10, batch_size)
  model, partitioner = kwargs['model'], Partitioner()
  converter = model.feature_converter_cls(pack=True)
  shapes = {k: (batch_size, v) for k, v in converter.get_model_feature_lengths(LENGTHS).items()}
  tr = trainer_lib.Trainer(model, kwargs['optimizer'], partitioner, shapes, seed=0)
  source = checkpoints.Checkpointer(base)
  params, opt_state, meta = source.restore(10, tr.params_abstract, tr.params_shardings,
                                           tr.opt_state_abstract, tr.opt_state_shardings)
  source.close()
  out = []
  for n in steps:
    run, replay = resume_dirs(root, n, input_dirs[n], params, opt_state, meta)
    restored_s, restored = _first_step_s(run, n + 1, batch_size)
    replayed_s, replayed = _first_step_s(replay, n + 1, batch_size)
    out.append(dict(n=n, restore_first_step_s=restored_s, replay_first_step_s=replayed_s,
                    sections=[restored.as_dict(), replayed.as_dict()]))
  return out


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--steps', type=int, nargs='+', default=[10, 5000])
  ap.add_argument('--batch', type=int, default=2)
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--skip-train', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  try:
    quiet = machine.check_quiet(args.allow_loaded)
  except machine.LoadedMachineError as e:
    sys.exit(f'benchmarks.resume: error: {e}')
  importlib.import_module('tasks.bbc')  # registers the BBC tasks
  from t2t.training import inputs
  inputs.limit_tf_threads()
  root = tempfile.mkdtemp(prefix='t2t_resume_bench_')
  try:
    dirs = {n: os.path.join(root, f'inputs_{n}') for n in args.steps}
    result = dict(task=TASK, lengths=LENGTHS, batch=args.batch, machine=quiet,
                  input_threads=inputs.input_threads(),
                  inputs=[measure_inputs(dirs[n], n, args.batch) for n in args.steps])
    if not args.skip_train:
      result['train'] = measure_train(root, args.steps, args.batch, dirs)
    result['loadavg_at_end'] = os.getloadavg()
    result['machine'] = dict(quiet, date_utc=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))
    sections = [s for part in result['inputs'] + result.get('train', []) for s in part['sections']]
    result['loaded'] = bool(quiet['loaded_at_start'] or any(s['loaded'] for s in sections))
    line = json.dumps(result)
    if args.out:
      with open(args.out, 'w') as f:
        f.write(line + '\n')
    print(line)
  finally:
    shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
  main()
