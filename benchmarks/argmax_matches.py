"""The training accuracy's test, `argmax(logits) == targets`, three ways on the train step's logits.

T5-small's train step asks, for each of its 8 x 114 target tokens, whether the logits' first
maximum over the 32,128-token vocabulary is the target. XLA:CPU runs `jnp.argmax`'s paired
(value, index) reduction as a scalar loop, and a reduction over a comparison
(`decoding.first_argmax`) not much better; `api.argmax_matches` uses plain arithmetic. This times
the three in one process, alternating, medians of `--reps` calls each per round, and checks that
they agree.

  python -m benchmarks.argmax_matches [--rounds 3] [--reps 20] [--shape 8,114,32128] [--out F]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

from benchmarks import machine


def measure(shape: tuple[int, ...], rounds: int, reps: int) -> dict[str, Any]:
  import jax
  import jax.numpy as jnp

  from t2t.models import api, decoding
  logits = jax.random.normal(jax.random.key(0), shape, jnp.float32)
  targets = jnp.argmax(logits, -1).at[..., ::2].add(1)   # half the tokens right
  ways = {
      'jnp.argmax': jax.jit(lambda x, t: jnp.argmax(x, -1) == t),
      'decoding.first_argmax': jax.jit(lambda x, t: decoding.first_argmax(x) == t),
      'api.argmax_matches': jax.jit(api.argmax_matches),
  }
  answers = {name: jax.device_get(f(logits, targets)) for name, f in ways.items()}
  agree = all((a == answers['jnp.argmax']).all() for a in answers.values())
  times: dict[str, list[float]] = {name: [] for name in ways}
  for _ in range(rounds):
    for name, f in ways.items():
      jax.block_until_ready(f(logits, targets))
      calls = []
      for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(logits, targets))
        calls.append(time.perf_counter() - t0)
      times[name].append(statistics.median(calls))
  return dict(benchmark='argmax_matches', shape=list(shape), rounds=rounds, reps=reps,
              agree=bool(agree), median_ms_by_round={k: [t * 1e3 for t in v] for k, v in times.items()},
              median_ms={k: statistics.median(v) * 1e3 for k, v in times.items()})


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--rounds', type=int, default=3)
  ap.add_argument('--reps', type=int, default=20, help='timed calls of each way per round')
  ap.add_argument('--shape', default='8,114,32128', help='the logits [batch, length, vocab]')
  ap.add_argument('--threads', type=int, default=2)
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  try:
    shape = tuple(int(n) for n in args.shape.split(','))
    if args.rounds < 1 or args.reps < 1:
      raise ValueError(f'--rounds and --reps must be >= 1, got {args.rounds} and {args.reps}.')
    machine.pin_threads(args.threads)
    quiet = machine.check_quiet(args.allow_loaded)
  except ValueError as e:
    sys.exit(f'benchmarks.argmax_matches: error: {e}')
  with machine.Section('argmax_matches') as section:
    result = measure(shape, args.rounds, args.reps)
  machine.record(result, quiet, [section], args.out)
  for name, ms in result['median_ms'].items():
    print(f'{name:>22}: {ms:.2f} ms', file=sys.stderr)
  print(f'the three agree: {result["agree"]}', file=sys.stderr)


if __name__ == '__main__':
  main()
