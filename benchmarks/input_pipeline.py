"""Input pipeline throughput: BBC span corruption, tokenised and packed to 512/114 batches of 8.

  python -m benchmarks.input_pipeline [--batches 50] [--warmup 5] [--batch 8] [--task bbc_span_corruption]
         [--threads 1] [--peer-python /path/to/venv-with-t5/bin/python] [--allow-loaded]
         [--out PATH]

Reads batches from `t2t.training.inputs.train_batches` (the stream training uses: seqio,
`--threads` tf.data threads (t2t.train's default: one), shuffled, packed by
`seqio.EncDecFeatureConverter(pack=True)`) and prints one JSON line: tokens/s counted as
`inputs.count_tokens` does (non-padding encoder inputs + decoder targets) and as slots (batch x
(512 + 114), what the train step consumes), `cores_used` (the process's CPU seconds over the
timed loop's wall seconds: the tf.data threads plus the main thread's conversion to NumPy), and
the machine (load, processor). Compare `slot_tokens_per_s` with the train step's tokens/s from
`benchmarks.t5_small_cpu train`: the pipeline must be far faster, since it runs beside the step.
A machine whose load average is above its core count is refused unless `--allow-loaded`.

`--peer-python` also runs the `t5` package's reference pipeline (benchmarks/t5_reference_pipeline.py)
under that interpreter, on the same training articles and vocabulary, after t2t's: the JSON then
holds both and their ratio. The `t5` package pins seqio-nightly and tfds-nightly, so it needs its
own virtual environment (`python3.11 -m venv /tmp/t5venv && /tmp/t5venv/bin/pip install t5==0.9.4
torch==2.13.0`). The reference runs with the same `--threads` and the same tf.data options as
t2t's stream, so both sides have the same threads; each side's `cores_used` shows it.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

LENGTHS = {'inputs': 512, 'targets': 114}


def _cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def measure(task: str, batches: int, warmup: int, batch_size: int, seed: int = 0,
            threads: int = 1) -> dict:
  """t2t's training stream of `task` on `threads` tf.data threads: tokens/s and cores used."""
  import seqio
  import tasks  # noqa: F401  (registers bbc_span_corruption)
  from t2t.training import inputs
  inputs.limit_tf_threads(threads)
  stream = inputs.train_batches(task, LENGTHS, seqio.EncDecFeatureConverter(pack=True),
                                batch_size, seed, num_threads=threads)
  t0 = time.perf_counter()
  for _ in range(warmup):
    next(stream)
  first = time.perf_counter() - t0
  times, tokens = [], 0
  slots = batch_size * (LENGTHS['inputs'] + LENGTHS['targets'])
  cpu0, t0 = _cpu_s(), time.perf_counter()
  for _ in range(batches):
    t = time.perf_counter()
    tokens += inputs.count_tokens(next(stream))
    times.append(time.perf_counter() - t)
  total, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
  return dict(task=task, lengths=LENGTHS, batch=batch_size, batches=batches, threads=threads,
              cores_used=cpu / total, warmup_s=first, median_batch_s=statistics.median(times),
              tokens_per_s=tokens / total, slot_tokens_per_s=batches * slots / total,
              fill=tokens / (batches * slots), loadavg=os.getloadavg(), cpu_count=os.cpu_count())


PEER_SCRIPT = pathlib.Path(__file__).resolve().parent / 't5_reference_pipeline.py'


def run_peer(python: str, batches: int, warmup: int, batch_size: int,
             threads: int = 1) -> tuple[dict | None, str | None]:
  """(the reference pipeline's RESULT, None) or (None, why it did not run)."""
  if not pathlib.Path(python).is_file():
    return None, f'--peer-python {python} does not exist'
  check = subprocess.run([python, '-c', 'import t5'], capture_output=True, text=True)
  if check.returncode:
    return None, f'the t5 package is not importable by {python}: pip install t5==0.9.4 there'
  from t2t.data import sources, vocabularies
  with tempfile.NamedTemporaryFile('w', suffix='.jsonl', delete=False) as f:
    for article in sources.bbc_articles('train'):
      f.write(json.dumps({'text': article['text']}) + '\n')
  try:
    proc = subprocess.run([python, str(PEER_SCRIPT), '--texts', f.name,
                           '--vocab', str(vocabularies.BBC_VOCAB_PATH), '--batches', str(batches),
                           '--warmup', str(warmup), '--batch', str(batch_size),
                           '--threads', str(threads)],
                          capture_output=True, text=True)
  finally:
    os.unlink(f.name)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
  if proc.returncode or not lines:
    return None, f'the reference pipeline failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}'
  return json.loads(lines[-1][len('RESULT '):]), None


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--task', default='bbc_span_corruption')
  ap.add_argument('--batches', type=int, default=50)
  ap.add_argument('--warmup', type=int, default=5)
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--threads', type=int, default=1, help='tf.data threads, both sides')
  ap.add_argument('--peer-python', default=None,
                  help="an interpreter with the t5 package: also time t5's reference pipeline")
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  from benchmarks import machine
  try:
    minimums = {'batches': 1, 'warmup': 0, 'batch': 1, 'threads': 1}
    for name, least in minimums.items():
      if getattr(args, name) < least:
        raise ValueError(f'--{name} must be >= {least}, got {getattr(args, name)}.')
    if args.threads > (os.cpu_count() or 1):
      raise ValueError(f'--threads {args.threads} is more than the machine\'s '
                       f'{os.cpu_count()} cores.')
    quiet = machine.check_quiet(args.allow_loaded)
  except ValueError as e:
    sys.exit(f'benchmarks.input_pipeline: error: {e}')
  sections = []
  with machine.Section('t2t') as section:
    result = measure(args.task, args.batches, args.warmup, args.batch, threads=args.threads)
  sections.append(section)
  if args.peer_python:
    with machine.Section('peer') as section:
      peer, why = run_peer(args.peer_python, args.batches, args.warmup, args.batch, args.threads)
    sections.append(section)
    result.update(peer=peer, peer_error=why,
                  t2t_over_peer_tokens_per_s=(result['tokens_per_s'] / peer['tokens_per_s']
                                              if peer else None),
                  loadavg_after_peer=os.getloadavg())
    if why:
      print(f'benchmarks.input_pipeline: the peer did not run: {why}', file=sys.stderr)
  machine.record(result, quiet, sections, args.out)


if __name__ == '__main__':
  main()
