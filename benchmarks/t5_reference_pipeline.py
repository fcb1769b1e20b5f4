"""Peer for benchmarks/input_pipeline.py: the `t5` package's span-corruption pipeline on the same data.

Runs under an interpreter that has the `t5` package (it pins seqio-nightly and tfds-nightly, so it
lives in its own virtual environment, never in t2t's):

  python benchmarks/t5_reference_pipeline.py --texts TEXTS.jsonl --vocab bbc_sp8k.model
         [--batches 50] [--warmup 5] [--batch 8] [--threads 1]

The task mirrors t2t's `bbc_span_corruption` step for step, with the reference objective in place
of t2t's: rekey text -> targets, seqio tokenize, `t5.data.preprocessors.span_corruption` (noise
density 0.15, mean span 3), append EOS, `seqio.EncDecFeatureConverter(pack=True)` at 512/114,
batches of 8, shuffled, on `--threads` tf.data threads with the tf.data options t2t's
`inputs.train_batches` sets (a private thread pool of that size, no parallelism within an
element, two batches prefetched): without them tf.data's default pool ran this pipeline on both
cores of a 2-core machine (1.96 cores busy against t2t's 1.32, 2026-11-30). The texts (one JSON
object with a "text" field per line) and the SentencePiece model are given by the caller, so
both sides read the same articles with the same vocabulary. Prints one line `RESULT {json}` with
the figures input_pipeline reports, `cores_used` included (this process's CPU seconds over the
timed loop's wall seconds).
"""
import argparse
import functools
import json
import os
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

LENGTHS = {'inputs': 512, 'targets': 114}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument('--texts', required=True)
  ap.add_argument('--vocab', required=True)
  ap.add_argument('--batches', type=int, default=50)
  ap.add_argument('--warmup', type=int, default=5)
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--threads', type=int, default=1)
  args = ap.parse_args()

  import numpy as np
  import seqio
  import t5.data.preprocessors as t5_preprocessors
  import tensorflow as tf
  import resource
  tf.config.threading.set_inter_op_parallelism_threads(args.threads)
  tf.config.threading.set_intra_op_parallelism_threads(args.threads)

  with open(args.texts) as f:
    texts = [json.loads(line)['text'] for line in f]

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({'text': texts})

  vocab = seqio.SentencePieceVocabulary(args.vocab, extra_ids=100)
  features = {'inputs': seqio.Feature(vocabulary=vocab, add_eos=True, required=False),
              'targets': seqio.Feature(vocabulary=vocab, add_eos=True)}
  name = 'reference_bbc_span_corruption'
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(dataset_fn, splits=['train']),
      preprocessors=[functools.partial(seqio.preprocessors.rekey, key_map={'targets': 'text'}),
                     seqio.preprocessors.tokenize,
                     t5_preprocessors.span_corruption,
                     seqio.preprocessors.append_eos_after_trim],
      output_features=features, metric_fns=[])
  ds = seqio.get_dataset(name, task_feature_lengths=LENGTHS, dataset_split='train', shuffle=True,
                         num_epochs=None, seed=0, batch_size=args.batch,
                         feature_converter=seqio.EncDecFeatureConverter(pack=True))
  options = tf.data.Options()  # as t2t.training.inputs.train_batches
  options.threading.private_threadpool_size = args.threads
  options.threading.max_intra_op_parallelism = 1
  stream = ds.with_options(options).prefetch(2).as_numpy_iterator()

  def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

  def count(batch):
    return sum(int(np.count_nonzero(batch[k]))
               for k in ('encoder_input_tokens', 'decoder_target_tokens'))

  t0 = time.perf_counter()
  for _ in range(args.warmup):
    next(stream)
  first = time.perf_counter() - t0
  times, tokens = [], 0
  slots = args.batch * (LENGTHS['inputs'] + LENGTHS['targets'])
  cpu0, t0 = cpu_s(), time.perf_counter()
  for _ in range(args.batches):
    t = time.perf_counter()
    tokens += count(next(stream))
    times.append(time.perf_counter() - t)
  total, cpu = time.perf_counter() - t0, cpu_s() - cpu0
  import t5
  print('RESULT ' + json.dumps(dict(
      pipeline='t5 package span_corruption', t5=t5.__version__, seqio=seqio.__version__,
      tensorflow=tf.__version__, texts=len(texts), batch=args.batch, batches=args.batches,
      threads=args.threads, cores_used=cpu / total,
      warmup_s=first, median_batch_s=statistics.median(times), tokens_per_s=tokens / total,
      slot_tokens_per_s=args.batches * slots / total, fill=tokens / (args.batches * slots))))


if __name__ == '__main__':
  main()
