"""Input pipeline throughput: BBC span corruption, tokenised and packed to 512/114 batches of 8.

  python -m benchmarks.input_pipeline [--batches 50] [--warmup 5] [--batch 8] [--task bbc_span_corruption]

Reads batches from `t2t.training.inputs.train_batches` (the stream training uses: seqio, one tf.data
thread, shuffled, packed by `seqio.EncDecFeatureConverter(pack=True)`) and prints one JSON line:
tokens/s counted as `inputs.count_tokens` does (non-padding encoder inputs + decoder targets) and
as slots (batch x (512 + 114), what the train step consumes), with the load average. Compare
`slot_tokens_per_s` with the train step's tokens/s from `benchmarks.t5_small_cpu train`: the
pipeline must be far faster, since it runs on one thread beside the step.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

LENGTHS = {'inputs': 512, 'targets': 114}


def measure(task: str, batches: int, warmup: int, batch_size: int, seed: int = 0) -> dict:
  import seqio
  import tasks  # noqa: F401  (registers bbc_span_corruption)
  from t2t.training import inputs
  inputs.limit_tf_threads(1)
  stream = inputs.train_batches(task, LENGTHS, seqio.EncDecFeatureConverter(pack=True),
                                batch_size, seed)
  t0 = time.perf_counter()
  for _ in range(warmup):
    next(stream)
  first = time.perf_counter() - t0
  times, tokens = [], 0
  slots = batch_size * (LENGTHS['inputs'] + LENGTHS['targets'])
  t0 = time.perf_counter()
  for _ in range(batches):
    t = time.perf_counter()
    tokens += inputs.count_tokens(next(stream))
    times.append(time.perf_counter() - t)
  total = time.perf_counter() - t0
  return dict(task=task, lengths=LENGTHS, batch=batch_size, batches=batches,
              warmup_s=first, median_batch_s=statistics.median(times),
              tokens_per_s=tokens / total, slot_tokens_per_s=batches * slots / total,
              fill=tokens / (batches * slots), loadavg=os.getloadavg(), cpu_count=os.cpu_count())


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--task', default='bbc_span_corruption')
  ap.add_argument('--batches', type=int, default=50)
  ap.add_argument('--warmup', type=int, default=5)
  ap.add_argument('--batch', type=int, default=8)
  args = ap.parse_args(argv)
  print(json.dumps(measure(args.task, args.batches, args.warmup, args.batch)))


if __name__ == '__main__':
  main()
