"""Greedy decoding split into the time before the first token and the time per token.

  python -m benchmarks.greedy_floor [--lengths 2,33,64] [--rounds 7] [--precision fp32]
                                    [--threads 2] [--allow-loaded] [--out PATH]

`t5_small_cpu`'s greedy figure is one number for a whole decode (T5-small, batch 8, 512 input
tokens, 64 generated). Whether it can still shrink depends on what it is made of: the encoder and
the cross-attention's keys and values run once, at a matmul rate the processor caps; every token
after that streams the decoder's weights, the tied embedding and the caches through memory. This
builds one `Predictor` per decode length over the same parameters and inputs (EOS masked, so every
row decodes the full length), times them in interleaved rounds (2, 33, 64, 2, 33, 64, ...) so a
drift of the machine hits every length alike, and fits time = before_first + per_token x (tokens - 1)
to the per-length medians by least squares.

`bytes_per_token` is what one token has to read at least: the decoder's parameters with the tied
embedding (the logits) but the cross-attention's key and value projections (used once, to fill its
cache), the cross-attention cache (layers x 2 x batch x enc_len x heads x d_kv) and the
self-attention cache at the longest length, in the run's parameter dtype; divided by
`per_token_s` it gives the rate the loop streams them at, to set against the machine's memory
bandwidth. With `before_first_s` at the matmul roof and that rate at the bandwidth, the decode is at
its floor (benchmarks/EXPERIMENTS.md, "Float32 greedy on Zen 4: where the floor is").

Prints one JSON line (per-length times and medians, the fit, `machine` with the load and the
processor); refuses a loaded machine unless `--allow-loaded`.
Test: tests/benchmarks/test_greedy_floor.py.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Sequence

from benchmarks import machine
from benchmarks import t5_small_setup as setup   # sets the TensorFlow / JAX environment first

import jax  # noqa: E402
import numpy as np  # noqa: E402

from t2t.training.partitioning import Partitioner  # noqa: E402
from t2t.training.predictor import Predictor  # noqa: E402


def fit_line(lengths: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
  """Least squares of seconds = before_first + per_token * (length - 1); returns both [s]."""
  if len(set(lengths)) < 2:
    raise ValueError(f'--lengths needs at least two different lengths, got {list(lengths)}.')
  x = np.asarray(lengths, np.float64) - 1.0
  y = np.asarray(seconds, np.float64)
  per_token, before_first = np.polyfit(x, y, 1)
  return float(before_first), float(per_token)


def bytes_per_token(params: Any, config: Any, batch: int, enc_len: int, max_len: int) -> int:
  """Bytes one decoding step reads at least: the decoder's and the embedding's parameters but the
  cross-attention's key and value projections (which make the cache once, before the first token),
  the cross-attention cache and the self-attention cache at `max_len`."""
  itemsize = np.dtype(config.param_dtype).itemsize
  leaves = jax.tree_util.tree_leaves_with_path(
      {'decoder': params['decoder'], 'token_embedder': params['token_embedder']})
  names = lambda path: [getattr(k, 'key', str(k)) for k in path]
  once = lambda path: ('encoder_decoder_attention' in names(path)
                       and names(path)[-2] in ('key', 'value'))
  weights = sum(int(x.size) * x.dtype.itemsize for path, x in leaves if not once(path))
  inner = config.num_heads * config.d_kv
  cross_cache = config.num_decoder_layers * 2 * batch * enc_len * inner * itemsize
  self_cache = config.num_decoder_layers * 2 * batch * max_len * inner * itemsize
  return weights + cross_cache + self_cache


def measure(lengths: Sequence[int] = (2, 33, 64), rounds: int = 7, batch: int = 8,
            enc_len: int = 512, precision: str = 'fp32', tiny: bool = False) -> dict[str, Any]:
  """Interleaved greedy decodes of each length; per-length times, medians and the fit."""
  lengths = sorted(set(int(n) for n in lengths))
  if not lengths or lengths[0] < 1:
    raise ValueError(f'--lengths must be positive token counts, got {lengths}.')
  if rounds < 1:
    raise ValueError(f'--rounds must be >= 1, got {rounds}.')
  config = setup.t5_small_config(0.0, tiny, precision)
  partitioner = Partitioner(num_partitions=1)
  model, params, inputs = setup.decode_setup(config, batch, enc_len, lengths[-1], 1, partitioner)
  examples = [dict(encoder_input_tokens=row) for row in inputs]
  predictors = {n: Predictor(model, params, partitioner, batch, max_decode_length=n)
                for n in lengths}
  for n, predictor in predictors.items():   # compile, then one call that settles the heap
    for _ in range(2):
      out = np.stack(predictor.predict(examples))
    setup.check_decoded(out, batch, n)
  times: dict[int, list[float]] = {n: [] for n in lengths}
  for _ in range(rounds):
    for n in lengths:
      t0 = time.perf_counter()
      predictors[n].predict(examples)
      times[n].append(time.perf_counter() - t0)
  medians = {n: statistics.median(t) for n, t in times.items()}
  before_first, per_token = fit_line(list(medians), list(medians.values()))
  read = bytes_per_token(params, config, batch, enc_len, lengths[-1])
  return dict(benchmark='greedy_floor', model='tiny' if tiny else 't5_1_0_small',
              precision=precision, shapes=dict(batch=batch, enc_len=enc_len), rounds=rounds,
              times={str(n): t for n, t in times.items()},
              median_s={str(n): m for n, m in medians.items()},
              before_first_s=before_first, per_token_s=per_token, bytes_per_token=read,
              loop_gb_per_s=read / per_token / 1e9 if per_token > 0 else None)


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--lengths', default='2,33,64', help='decode lengths, comma-separated')
  ap.add_argument('--rounds', type=int, default=7, help='interleaved rounds over the lengths')
  ap.add_argument('--precision', choices=sorted(setup.PRECISIONS), default='fp32')
  ap.add_argument('--threads', type=int, default=2)
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--enc-len', type=int, default=512)
  ap.add_argument('--tiny', action='store_true', help='a tiny model (tests)')
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  try:
    try:
      lengths = [int(n) for n in args.lengths.split(',') if n.strip()]
    except ValueError:
      raise ValueError(f'--lengths must be comma-separated token counts, got {args.lengths!r}.'
                       ) from None
    if len(set(lengths)) < 2 or min(lengths) < 1:
      raise ValueError(f'--lengths needs at least two different positive lengths, got {lengths}.')
    if args.rounds < 1:
      raise ValueError(f'--rounds must be >= 1, got {args.rounds}.')
    machine.pin_threads(args.threads)
    quiet = machine.check_quiet(args.allow_loaded)
  except ValueError as e:
    sys.exit(f'benchmarks.greedy_floor: error: {e}')
  setup.prepare_process('auto')   # as t2t.infer and the benchmark do, before XLA runs
  with machine.Section('greedy_floor') as section:
    try:
      result = measure(lengths, args.rounds, args.batch, args.enc_len, args.precision, args.tiny)
    except ValueError as e:
      sys.exit(f'benchmarks.greedy_floor: error: {e}')
  machine.record(result, quiet, [section], args.out)
  for n, m in result['median_s'].items():
    print(f'{n:>4} tokens: {m:.3f} s (median of {args.rounds})', file=sys.stderr)
  rate = result['loop_gb_per_s']
  print(f'before the first token {result["before_first_s"]:.3f} s, then '
        f'{result["per_token_s"] * 1e3:.2f} ms a token'
        + (f' ({result["bytes_per_token"] / 1e6:.0f} MB at {rate:.1f} GB/s)' if rate else ''),
        file=sys.stderr)


if __name__ == '__main__':
  main()
