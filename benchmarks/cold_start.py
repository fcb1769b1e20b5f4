"""Where a cold start of T5-small's train step goes, phase by phase, in one fresh process.

  python -m benchmarks.cold_start [--precision fp32|bf16] [--threads 2] [--calls 3] [--tiny]
      [--host-malloc auto|retain|system] [--allow-loaded] [--out PATH]

`benchmarks.t5_small_cpu` times compile + first step as a user sees it: `Trainer.step` compiles
the optimizer update on a second thread while the gradient program traces and compiles, so its
phases overlap and only their sum is seen. This runs the same phases one after another on the
main thread, the same programs as the benchmark's train run (T5 v1.0 small, batch 8, 512/114,
dropout 0.1, AdaFactor): build the `Trainer`; `init_state` (the initialisers' and optimizer
state's programs, compiled and run); lower and compile the update; trace and lower, then compile,
the gradient program; then `--calls` calls of the gradient program (the first one after the
first of the update's). Each phase records its wall seconds, this process's CPU seconds (user +
system), system seconds and minor page faults (`getrusage`), so a first call that spends more on
fresh memory than on arithmetic shows as such; the gradient program's temporaries
(`temp_bytes`, XLA's buffer assignment) say how much memory its first call touches.

Prints one JSON line (`phases` in order, `machine` with the load and `cpu_identity`); a machine
whose load average is above its core count is refused unless `--allow-loaded`. Test (tiny model):
tests/benchmarks/test_cold_start.py.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from typing import Any, Callable, Sequence

from benchmarks import machine
from benchmarks import t5_small_setup as setup   # sets the TensorFlow / JAX environment first

import jax  # noqa: E402  (t5_small_setup sets the JAX/TF environment first)

from t2t.training import host_memory  # noqa: E402
from t2t.training.trainer import NONFINITE_FIELDS  # noqa: E402


def _usage() -> tuple[float, float, int]:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime, r.ru_stime, r.ru_minflt


def timed_phase(phases: list[dict[str, Any]], name: str, fn: Callable[[], Any]) -> Any:
  """Runs `fn`; appends {name, wall_s, cpu_s, system_s, page_faults} to `phases`; returns fn()."""
  cpu0, sys0, faults0 = _usage()
  t0 = time.perf_counter()
  value = fn()
  wall = time.perf_counter() - t0
  cpu1, sys1, faults1 = _usage()
  phases.append(dict(name=name, wall_s=wall, cpu_s=cpu1 - cpu0, system_s=sys1 - sys0,
                     page_faults=faults1 - faults0))
  return value


def measure(precision: str = 'fp32', calls: int = 3, tiny: bool = False) -> dict[str, Any]:
  """The phases of one Trainer's cold start (see the module docstring); no program is cached."""
  if calls < 1:
    raise ValueError(f'--calls must be >= 1, got {calls}.')
  config = setup.t5_small_config(0.1, tiny, precision)
  batch, enc_len, dec_len = (2, 16, 8) if tiny else (8, 512, 114)
  phases: list[dict[str, Any]] = []
  trainer, data = timed_phase(phases, 'build_trainer',
                              lambda: setup._train_setup(config, batch, enc_len, dec_len))
  state = timed_phase(phases, 'init_state', lambda: jax.block_until_ready(trainer.init_state()))
  rep = trainer.partitioner.replicated
  state = state.replace(**{n: jax.device_put(getattr(state, n), rep) for n in NONFINITE_FIELDS})
  update = timed_phase(phases, 'lower_update', trainer._lower_update)
  update = timed_phase(phases, 'compile_update', update.compile)
  with trainer.partitioner.activation_context():
    sharded = trainer.partitioner.shard_batch(data)
    inputs = lambda: (state.params, state.step, sharded, trainer.dropout_rng, trainer.dropout_rows)
    gradient = timed_phase(phases, 'trace_lower_gradient',
                           lambda: trainer._gradient_step.lower(*inputs()))
    gradient = timed_phase(phases, 'compile_gradient', gradient.compile)
    for i in range(calls):
      grads, loss, _ = timed_phase(phases, f'gradient_call_{i + 1}',
                                   lambda: jax.block_until_ready(gradient(*inputs())))
      if i == 0:  # once, after the gradient's first call; it donates the old state
        state, _ = timed_phase(phases, 'update_call_1',
                               lambda: jax.block_until_ready(update(state, grads, loss)))
  memory = gradient.memory_analysis()
  return dict(benchmark='cold_start', model='tiny' if tiny else 't5_1_0_small',
              precision=precision, shapes=dict(batch=batch, enc_len=enc_len, dec_len=dec_len),
              phases=phases,
              temp_bytes=getattr(memory, 'temp_size_in_bytes', None) if memory else None,
              host_malloc=dict(retains_freed_memory=host_memory.applied(),
                               xla_cpu_memory_schedule=host_memory.memory_schedule()),
              versions=machine.versions())


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--precision', default='fp32', choices=sorted(setup.PRECISIONS))
  ap.add_argument('--threads', type=int, default=2)
  ap.add_argument('--calls', type=int, default=3, help='calls of the gradient program timed')
  ap.add_argument('--tiny', action='store_true', help='a 1+1-layer d_model-32 model (tests)')
  ap.add_argument('--host-malloc', default='auto', choices=host_memory.MODES,
                  help="as the benchmark's --host-malloc (default auto, as t2t.train)")
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  try:
    if args.calls < 1:
      raise ValueError(f'--calls must be >= 1, got {args.calls}.')
    machine.pin_threads(args.threads)
    quiet = machine.check_quiet(args.allow_loaded)
  except ValueError as e:
    sys.exit(f'benchmarks.cold_start: error: {e}')
  setup.prepare_process(args.host_malloc)  # before the first XLA program, as t2t.train
  with machine.Section('cold_start') as section:
    result = measure(args.precision, args.calls, args.tiny)
  result['threads'] = args.threads
  machine.record(result, quiet, [section], args.out)
  for p in result['phases']:
    print(f'{p["name"]:>22}: {p["wall_s"]:7.2f} s wall, {p["cpu_s"]:7.2f} s CPU '
          f'({p["system_s"]:.2f} system), {p["page_faults"]:>8} page faults', file=sys.stderr)


if __name__ == '__main__':
  main()
