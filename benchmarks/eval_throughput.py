"""Evaluation throughput: `t2t.eval` on a BBC mixture, inputs bucketed by length vs padded.

  python -m benchmarks.eval_throughput [--rounds 3] [--num_examples 96] [--batch 16] [--allow-loaded]

Trains a T5 (d_model 256, 2+2 layers, the offline BBC vocabulary) for one step on a mixture of
`bbc_topic` (short targets) and `bbc_headline` (16-token targets) to get a checkpoint, then times
`t2t.eval.evaluate` on that mixture's validation split, nothing truncated (the inputs' feature
length is the mixture's longest article), `--rounds` times each with `bucket_lengths` True and
False, interleaved. Each call is timed whole -- dataset, compiles (one per bucket shape), decoding,
scoring, metrics -- since that is what a user waits for. Prints one JSON line: examples/s per
setting (median over rounds), the ratio, whether both settings gave the same metrics and the same
predictions (the model has trained one step, so its outputs are poor but deterministic), and the
machine's load (the benchmark refuses a loaded machine unless `--allow-loaded`; the JSON says so).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

MIXTURE = 'eval_throughput_bbc'
TASKS = ('bbc_topic', 'bbc_headline')
TRAIN_LENGTHS = {'inputs': 512, 'targets': 16}


def _model(tiny: bool):
  from t2t.data import vocabularies
  from t2t.models.api import EncoderDecoderModel
  from t2t.models.transformer import T5Config, Transformer
  size = (dict(d_model=32, num_heads=2, d_kv=16, d_ff=64, num_encoder_layers=1, num_decoder_layers=1)
          if tiny else
          dict(d_model=256, num_heads=4, d_kv=64, d_ff=1024, num_encoder_layers=2,
               num_decoder_layers=2))
  vocab = vocabularies.bbc_vocabulary()
  return EncoderDecoderModel(Transformer(T5Config(vocab_size=8192, dropout_rate=0.0, **size)),
                             vocab, vocab)


def register_mixture() -> None:
  """`eval_throughput_bbc`: bbc_topic + bbc_headline, equal rates (only their validation is read)."""
  import seqio
  import tasks  # noqa: F401  (registers bbc_topic)
  import tasks.examples.bbc_headline  # noqa: F401
  seqio.MixtureRegistry.remove(MIXTURE)
  seqio.MixtureRegistry.add(MIXTURE, [(name, 1.0) for name in TASKS])


def measure(rounds: int, num_examples: int, batch_size: int, tiny: bool = False,
            work_dir: str | None = None) -> dict[str, Any]:
  """Times `evaluate` with and without length buckets; see the module docstring."""
  from t2t import eval as eval_lib
  from t2t import train as train_lib
  from t2t.training import inputs, optim
  inputs.limit_tf_threads(1)
  register_mixture()
  work = work_dir or tempfile.mkdtemp(prefix='eval_throughput_')
  model = _model(tiny)
  model_dir = os.path.join(work, 'model')
  train_lib.train(model=model, mixture_or_task_name=MIXTURE, task_feature_lengths=TRAIN_LENGTHS,
                  train_steps=1, model_dir=model_dir, batch_size=8,
                  optimizer=optim.adafactor(learning_rate=0.01))
  times: dict[str, list[float]] = {'bucketed': [], 'padded': []}
  metrics: dict[str, Any] = {}
  for r in range(rounds):
    for name in times:
      t0 = time.perf_counter()
      metrics[name] = eval_lib.evaluate(
          model=model, mixture_or_task_name=MIXTURE, checkpoint_path=model_dir,
          output_dir=os.path.join(work, f'eval_{name}_{r}'), num_examples=num_examples,
          batch_size=batch_size, bucket_lengths=name == 'bucketed')
      times[name].append(time.perf_counter() - t0)
  examples = num_examples * len(TASKS)
  medians = {name: statistics.median(ts) for name, ts in times.items()}
  return dict(
      benchmark='eval_throughput', mixture=list(TASKS), examples_per_call=examples,
      batch_size=batch_size, rounds=rounds, model='tiny' if tiny else 'd256_2+2',
      seconds=times, median_s=medians,
      examples_per_s={name: examples / s for name, s in medians.items()},
      speedup_bucketed=medians['padded'] / medians['bucketed'],
      same_metrics=_same(metrics['bucketed'], metrics['padded']), metrics=metrics,
      same_predictions=_predictions(work, 'bucketed', rounds - 1) == _predictions(
          work, 'padded', rounds - 1))


def _predictions(work: str, name: str, round_: int) -> dict[str, list[Any]]:
  """{file: [each example's prediction]} of one evaluation's predictions files."""
  out = {}
  directory = os.path.join(work, f'eval_{name}_{round_}')
  for fname in sorted(os.listdir(directory)):
    if fname.endswith('.predictions.jsonl'):
      with open(os.path.join(directory, fname)) as f:
        out[fname] = [json.loads(line)['prediction'] for line in f]
  return out


def _same(a: dict[str, Any], b: dict[str, Any], rel: float = 1e-5) -> bool:
  """Equal metrics; float scores (log-likelihoods) to `rel`, since padding changes the sums' order."""
  if a.keys() != b.keys():
    return False
  for task in a:
    for key, x in a[task].items():
      y = b[task].get(key)
      if isinstance(x, float) and isinstance(y, float):
        if abs(x - y) > rel * max(1.0, abs(x)):
          return False
      elif x != y:
        return False
  return True


def main(argv: Sequence[str] | None = None) -> None:
  from benchmarks import machine
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--rounds', type=int, default=3)
  ap.add_argument('--num_examples', type=int, default=96, help='per task, from the validation split')
  ap.add_argument('--batch', type=int, default=16)
  ap.add_argument('--tiny', action='store_true', help='a 1+1-layer d_model-32 model (tests)')
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  for name in ('rounds', 'num_examples', 'batch'):
    if getattr(args, name) < 1:
      sys.exit(f'benchmarks.eval_throughput: error: --{name} must be >= 1, got {getattr(args, name)}.')
  try:
    quiet = machine.check_quiet(args.allow_loaded)
  except ValueError as e:
    sys.exit(f'benchmarks.eval_throughput: error: {e}')
  with machine.Section('eval') as section:
    result = measure(args.rounds, args.num_examples, args.batch, args.tiny)
  machine.record(result, quiet, [section], args.out)
  print(f"t2t.eval on {'+'.join(TASKS)} ({result['examples_per_call']} examples, batch "
        f"{args.batch}): bucketed {result['examples_per_s']['bucketed']:.1f} examples/s, padded "
        f"{result['examples_per_s']['padded']:.1f} examples/s, {result['speedup_bucketed']:.2f}x; "
        f"same metrics: {result['same_metrics']}, same predictions: {result['same_predictions']}"
        + ('; MEASURED ON A LOADED MACHINE' if result['loaded'] else ''), file=sys.stderr)


if __name__ == '__main__':
  main()
