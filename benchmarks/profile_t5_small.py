"""Where the time of a T5-small train step and of one decode goes: an XLA profile, broken down.

  python -m benchmarks.profile_t5_small {train|decode} [--steps 2] [--warmup 1] [--threads 2] [--beams 1]
      [--tiny] [--dropout RATE] [--precision fp32|bf16] [--host-malloc auto|retain|system]
      [--trace-dir DIR] [--hlo-dir DIR] [--allow-loaded]

Runs the same programs as `benchmarks.t5_small_cpu` (`--warmup` calls, the first of which compiles), then
`--steps` calls under `jax.profiler.trace`. Every XLA CPU thunk in the trace is an HLO instruction
of the compiled program; its metadata (the JAX op name, which carries the Flax module path) assigns
it to a category (`CATEGORIES`): dropout rng (random bits), dropout masks (compare + select),
relpos bias, attention, ffn, layer norm, embedding/logits, loss, optimizer (the update and the
gradient norm: train_step's own ops), other XLA. An instruction XLA made without an op name (e.g.
a decoding step's batched self-attention `dot`s) counts as '(dot, no metadata)', other XLA; until
2026-11-29 such thunks were left out of every sum (~0.07 s of a float32 greedy decode).

Prints one JSON line: seconds per call in each category (innermost thunks only, since a `call` or
`while` thunk is timed again by the thunks it runs; summed over the threads that ran them, so it can
exceed the wall time when two thunks overlap), the wall time per call, and the
time the busiest thread spent outside leaf thunks (`outside_xla_s_per_call` = wall - that thread's
thunk time: an upper bound on Python, dispatch, host<->device copies, thunk-executor overhead
between small thunks, and waiting for other threads); and by site (`top_sites`: the op's Flax path
with the layers summed, `in_loop` for a decoding loop's body, whose total is
`loop_thunk_s_per_call`). `--hlo-dir` also writes the optimized HLO text. As every timing
benchmark here it refuses a machine whose load average is above its core count unless
`--allow-loaded`, and the JSON records the load, the processor (`machine`), the share of the CPU
other processes took while it profiled (`sections`) and `loaded`.

The host malloc settings are the benchmark's (`--host-malloc`, default auto: t2t.train's, which
retain freed memory on a CPU backend; t2t/training/host_memory.py) and the JSON's `host_malloc`
says which were in effect: without them every call of a program with large temporaries also
faults its pages in, which made an earlier profile put T5-small's encoder at 160-190 GFLOP/s where
the benchmark's run reaches ~260 (benchmarks/EXPERIMENTS.md, "Greedy
decoding").
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks import machine
from benchmarks import t5_small_setup as setup   # sets the TensorFlow / JAX environment first

import jax  # noqa: E402  (t5_small_setup sets the JAX/TF environment first)

from t2t.training import host_memory  # noqa: E402

# (category, regex on the JAX op name, which carries the Flax module path), first match wins.
CATEGORIES = (
    ('dropout rng', r'random_bits|rng_bit_generator|threefry|random_wrap|random_unwrap|bernoulli|'
                    r'_uniform|dropout_keep_mask'),
    ('dropout masks', r'[Dd]ropout'),
    ('relpos bias', r'relpos_bias'),
    ('attention', r'attention'),
    ('ffn', r'/mlp/'),
    ('layer norm', r'_norm'),
    ('embedding/logits', r'token_embedder|Embed|attend|logits'),
    ('loss', r'jvp\(\)|log_softmax|take_along_axis|cross_entropy'),
    ('optimizer', r'^jit\((?:train|update)_step\)/(?!.*(?:jvp|transpose|Transformer))'),
)
_INSTR = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=(.*)$')
_METADATA = re.compile(r'metadata=\{([^}]*)\}')
_FIELD = re.compile(r'(op_name)="([^"]*)"')
_COMPUTATION = re.compile(r'^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(')
_WHILE_BODY = re.compile(r'\bbody=%?([\w.\-]+)')


def hlo_metadata(hlo_text: str) -> dict[tuple[str, str], str]:
  """(module name, instruction name) -> the JAX op name, for every instruction of the module.

  Keyed by module too: the step's two programs (`Trainer.split_update`) reuse instruction names.
  An instruction XLA created without an op name (e.g. a batched `dot` it split off a fusion) is
  named after its kind, '(dot, no metadata)', with '/while/body/' in front inside a loop's body,
  so its time still counts, in the loop or not (`site`).
  """
  out = {}
  module = re.match(r'\s*HloModule\s+([\w.\-]+)', hlo_text)
  module = module.group(1) if module else ''
  bodies = set(_WHILE_BODY.findall(hlo_text))
  computation = ''
  for line in hlo_text.splitlines():
    header = _COMPUTATION.match(line)
    if header:
      computation = header.group(1)
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    metadata = _METADATA.search(m.group(2))
    op_name = dict(_FIELD.findall(metadata.group(1))).get('op_name', '') if metadata else ''
    if not op_name:
      kind = re.sub(r'\.\d+$', '', m.group(1))
      op_name = ('/while/body/' if computation in bodies else '') + f'({kind}, no metadata)'
    out[module, m.group(1)] = op_name
  return out


def _thunk(event: dict[str, Any]) -> tuple[str, str]:
  return event.get('args', {}).get('hlo_module', ''), event['name']


def categorise(meta: str | None) -> str:
  if meta is None:
    return 'other XLA'
  for name, pattern in CATEGORIES:
    if re.search(pattern, meta):
      return name
  return 'other XLA'


_LAYER_INDEX = re.compile(r'layers_\d+')


def site(meta: str | None) -> tuple[bool, str]:
  """(inside a `while` loop's body, the op's path within it with every `layers_<i>` as
  `layers_N`): the key that sums one site's thunks over the model's layers and a decode's steps,
  e.g. 'jit(f)/while/body/Transformer.decode/decoder/layers_3/mlp/wi/ffi_call' ->
  (True, 'Transformer.decode/decoder/layers_N/mlp/wi/ffi_call')."""
  if not meta:
    return False, '(no metadata)'
  in_loop = '/while/body/' in meta
  path = meta.split('/while/body/', 1)[1] if in_loop else meta.split('/', 1)[-1]
  return in_loop, _LAYER_INDEX.sub('layers_N', path)


def _trace_events(trace_dir: str) -> list[dict[str, Any]]:
  files = glob.glob(os.path.join(trace_dir, '**', 'perfetto_trace.json.gz'), recursive=True)
  if not files:
    raise RuntimeError(f'jax.profiler wrote no perfetto trace under {trace_dir}.')
  with gzip.open(max(files, key=os.path.getmtime)) as f:
    data = json.load(f)
  return data['traceEvents'] if isinstance(data, dict) else data


def _leaf_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The events that contain no other event on their thread: a `call` or `while` thunk is timed
  again by the thunks it runs, so counting both would count its time twice."""
  by_thread: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
  for e in events:
    by_thread[(e.get('pid'), e.get('tid'))].append(e)
  leaves = []
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e['ts'], -e.get('dur', 0.0)))
    for e, nxt in zip(evs, evs[1:] + [None]):
      if nxt is None or nxt['ts'] >= e['ts'] + e.get('dur', 0.0):
        leaves.append(e)
  return leaves


def breakdown(fn: Callable[[], Any], hlo_texts: Sequence[str], steps: int,
              trace_dir: str) -> dict[str, Any]:
  """Profiles `steps` calls of `fn` (already compiled) and sums thunk time by category."""
  meta: dict[tuple[str, str], str] = {}
  for text in hlo_texts:
    meta.update(hlo_metadata(text))
  t0 = time.perf_counter()
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    for _ in range(steps):
      fn()
  wall = (time.perf_counter() - t0) / steps
  by_cat: dict[str, float] = collections.defaultdict(float)
  by_op: dict[str, float] = collections.defaultdict(float)
  by_thread: dict[Any, float] = collections.defaultdict(float)
  by_site: dict[tuple[bool, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
  for e in _leaf_events([e for e in _trace_events(trace_dir)
                         if e.get('ph') == 'X' and _thunk(e) in meta]):
    dur = e.get('dur', 0.0) / 1e6 / steps
    by_cat[categorise(meta[_thunk(e)])] += dur
    by_op[_thunk(e)] += dur
    by_thread[e.get('tid')] += dur
    entry = by_site[site(meta[_thunk(e)])]
    entry[0] += dur
    entry[1] += 1 / steps
  xla = sum(by_cat.values())
  busiest = max(by_thread.values(), default=0.0)
  top = sorted(by_op.items(), key=lambda kv: -kv[1])[:15]
  sites = sorted(by_site.items(), key=lambda kv: -kv[1][0])
  return dict(
      wall_s_per_call=wall, xla_thunk_s_per_call=xla,
      loop_thunk_s_per_call=sum(v[0] for (in_loop, _), v in sites if in_loop),
      outside_xla_s_per_call=max(0.0, wall - busiest),
      categories_s={k: by_cat[k] for k in sorted(by_cat, key=lambda k: -by_cat[k])},
      categories_share={k: by_cat[k] / xla for k in sorted(by_cat, key=lambda k: -by_cat[k])} if xla else {},
      top_ops=[dict(name=f'{module}/{n}', s=s, category=categorise(meta.get((module, n))),
                    meta=meta.get((module, n), '')[:160])
               for (module, n), s in top],
      # Thunk seconds a call by site (layers summed), in a decode's loop or not: `thunks` is how
      # many thunks a call ran there (a decode's loop: steps x layers, plus any hoisted ones).
      top_sites=[dict(site=name, in_loop=in_loop, s=v[0], thunks=round(v[1]))
                 for (in_loop, name), v in sites[:25]])


def _train_program(config, batch: int, enc_len: int, dec_len: int):
  import numpy as np
  from t2t.training.partitioning import Partitioner
  from t2t.training.trainer import Trainer
  model = setup._model(config)
  rng = np.random.default_rng(0)
  targets = setup._tokens(rng, (batch, dec_len), config.vocab_size)
  data = dict(encoder_input_tokens=setup._tokens(rng, (batch, enc_len), config.vocab_size),
              decoder_target_tokens=targets,
              decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),
              decoder_loss_weights=np.ones((batch, dec_len), np.float32))
  trainer = Trainer(model, setup.adafactor_like_peer(), Partitioner(),
                    {k: v.shape for k, v in data.items()})
  state = [trainer.init_state()]

  def step():
    state[0], metrics = trainer.step(state[0], data)
    jax.block_until_ready(state[0])

  step()  # compile
  with trainer.partitioner.activation_context():
    batch = trainer.partitioner.shard_batch(data)
    if not trainer.split_update:
      return step, [trainer._train_step.lower(state[0], batch, trainer.dropout_rng,
                                              trainer.dropout_rows).compile().as_text()]
    # The step's two programs (Trainer.split_update): the gradient, then the optimizer update.
    grads = trainer._gradient_step.lower(state[0].params, state[0].step, batch,
                                         trainer.dropout_rng, trainer.dropout_rows)
    loss = jax.ShapeDtypeStruct((), jax.numpy.float32)
    update = trainer._update_step.lower(state[0], trainer.params_abstract, loss)
  return step, [grads.compile().as_text(), update.compile().as_text()]


def _decode_program(config, batch: int, enc_len: int, gen_len: int, beams: int):
  from t2t.training.partitioning import Partitioner
  from t2t.training.predictor import Predictor
  model, params, inputs = setup.decode_setup(config, batch, enc_len, gen_len, beams)
  predictor = Predictor(model, params, Partitioner(), batch, max_decode_length=gen_len)
  examples = [dict(encoder_input_tokens=row) for row in inputs]
  step = lambda: predictor.predict(examples)
  step()  # compile
  text = predictor._predict.lower(params, dict(encoder_input_tokens=inputs)).compile().as_text()
  return step, [text]


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('mode', choices=['train', 'decode'])
  ap.add_argument('--steps', type=int, default=2)
  ap.add_argument('--warmup', type=int, default=1,
                  help='untimed calls first (the first compiles); train: 6 or more keeps the '
                       "step in which the retained heap grows (t2t/training/host_memory.py) "
                       'out of the profile')
  ap.add_argument('--threads', type=int, default=2)
  ap.add_argument('--beams', type=int, default=1)
  ap.add_argument('--batch', type=int, default=8)
  ap.add_argument('--enc-len', type=int, default=512)
  ap.add_argument('--dec-len', type=int, default=114)
  ap.add_argument('--gen-len', type=int, default=64)
  ap.add_argument('--tiny', action='store_true')
  ap.add_argument('--dropout', type=float, default=None, help='default 0.1 train, 0 decode')
  ap.add_argument('--precision', default='fp32', choices=sorted(setup.PRECISIONS),
                  help='bf16: T5Config.matmul_dtype=bfloat16 (bf16 operands, float32 accumulation)')
  ap.add_argument('--host-malloc', default='auto', choices=host_memory.MODES,
                  help="as the benchmark's --host-malloc (default auto: retain freed memory on "
                       'the CPU backend)')
  ap.add_argument('--trace-dir', default=None, help='keep the jax.profiler trace here')
  ap.add_argument('--hlo-dir', type=Path, default=None, help='write the optimized HLO here')
  ap.add_argument('--allow-loaded', action='store_true',
                  help='profile a machine whose load is above its core count (marked loaded)')
  args = ap.parse_args(argv)
  if args.warmup < 1:
    ap.error(f'--warmup must be >= 1 (the first call compiles), got {args.warmup}.')
  try:
    machine.pin_threads(args.threads)
  except ValueError as e:
    ap.error(str(e))
  try:
    quiet = machine.check_quiet(args.allow_loaded)
  except machine.LoadedMachineError as e:
    sys.exit(f'benchmarks.profile_t5_small: error: {e}')
  host_memory.configure(args.host_malloc)  # before the first XLA program, as the benchmark
  dropout = args.dropout if args.dropout is not None else (0.1 if args.mode == 'train' else 0.0)
  config = setup.t5_small_config(dropout, args.tiny, args.precision)
  if args.mode == 'train':
    fn, texts = _train_program(config, args.batch, args.enc_len, args.dec_len)
  else:
    fn, texts = _decode_program(config, args.batch, args.enc_len, args.gen_len, args.beams)
  for _ in range(args.warmup - 1):  # the programs' compiling call was the first
    fn()
  if args.hlo_dir:
    args.hlo_dir.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
      (args.hlo_dir / f'{args.mode}_{i}.hlo.txt').write_text(text)
  with tempfile.TemporaryDirectory() as tmp, machine.Section('profile') as section:
    result = breakdown(fn, texts, args.steps, args.trace_dir or tmp)
  result.update(mode=args.mode, warmup=args.warmup, beams=args.beams, dropout=dropout,
                tiny=args.tiny,
                loadavg=os.getloadavg(), threads=args.threads, precision=args.precision,
                host_malloc=dict(mode=args.host_malloc,
                                 retains_freed_memory=host_memory.applied(),
                                 xla_cpu_memory_schedule=host_memory.memory_schedule()),
                shapes=dict(batch=args.batch, enc_len=args.enc_len, dec_len=args.dec_len,
                            gen_len=args.gen_len))
  machine.record(result, quiet, [section], out=None)


if __name__ == '__main__':
  main()
