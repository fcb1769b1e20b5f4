"""T5 v1.0 Small on CPU: t2t's train step and decoding, timed against Hugging Face in the same run.

  python -m benchmarks.t5_small_cpu [all|train|decode] [--steps 5] [--warmup 2] [--beams 1]
      [--threads 2] [--peer PATH | --no-peer] [--allow-loaded] [--batch 8] [--enc-len 512]
      [--dec-len 114] [--gen-len 64] [--tiny] [--dropout RATE] [--dropout-prng IMPL] [--out PATH]
      [--host-malloc auto|retain|system] [--peer-malloc system|retain] [--fused-step]
      [--model-parallel N]

`all` (the default) measures the matmul roof, then the train step, greedy decoding and beam-4
decoding, each against the peer, and prints ONE JSON line on stdout (keys in benchmarks/README.md,
checked by tests/benchmarks/) and a table with the ratios and the issue's targets on stderr, where
each timed section also says when it starts and how long it took.
`train` / `decode` run one of them. The model is T5 v1.0 small with random initialisation
(vocab 32128, d_model 512, 6 + 6 layers, 8 heads x 64, d_ff 2048, relu, tied embeddings; dropout 0.1
for training, 0 for decoding) fed random token ids (no vocabulary), so nothing is downloaded.

What is timed, and how it lines up with the peer (`benchmarks/hf_t5_peer.py`, Hugging Face's
PyTorch T5), at the issue's shapes by default or at any `--batch`, `--enc-len`, `--dec-len`,
`--gen-len`, which the peer is given too:
- train: `Trainer.step` (loss and grads, then the AdaFactor update: two jitted programs, the update
  compiled on a second thread, or one with `--fused-step`), synchronised every step (the peer
  calls `loss.item()` every step). Tokens per step = batch * (enc_len + dec_len).
- decode: `Predictor.predict` (jitted `predict_batch` with the KV cache) for `gen_len` new tokens,
  greedy (`--beams 1`) or beam search (alpha 0.6, the peer's length_penalty). EOS can never be chosen:
  its logit is set to -1e9 before every choice, which is what the peer's `min_new_tokens=gen_len`
  does, so both decode exactly `gen_len` tokens per row. Tokens = batch * gen_len.
  `--model-parallel N` (decode only) splits the CPU into N JAX devices (`jax_num_cpu_devices`) and
  decodes with `Partitioner(num_partitions=N)`: heads, FFN and vocabulary split N ways, as
  `XLA_FLAGS=--xla_force_host_platform_device_count=N python -m t2t.infer
  --gin.Partitioner.num_partitions=N` does; each device runs its share on its own thread.
Model TFLOP/s use model (not hardware) FLOPs: matmuls only, 2 per multiply-add, attention at full size,
training = 3 x forward; the formula is `benchmarks/t5_small_flops.py`, re-derived here with the
shapes and sizes as parameters (`model_flops`), equal to it at the default shapes.

Both sides run on the same `--threads` cores: the process pins itself to them (sched_setaffinity,
which sizes XLA's CPU thread pool), TensorFlow gets one thread (it is only imported, by seqio), and the
peer subprocess inherits the affinity and is passed `--threads`. The two run one after the other.
t2t's side runs with the host malloc settings `t2t.train` applies on a CPU backend
(`--host-malloc`, t2t/training/host_memory.py); the peer runs as a user starts it, or with the same
settings as glibc tunables under `--peer-malloc retain`. The JSON's `host_malloc` says which, the
`GLIBC_TUNABLES` t2t's own process was started with (`t2t_glibc_tunables`, None when unset), and
whether XLA:CPU scheduled t2t's programs for least memory (`t2t_xla_cpu_memory_schedule`).
The machine's load is checked before anything runs (refused above the core count unless
`--allow-loaded`) and every timed section records the cores other processes used meanwhile
(`benchmarks/machine.py`); a figure from a loaded section is marked `loaded` in the JSON and table.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('TF_NUM_INTRAOP_THREADS', '1')   # seqio imports TensorFlow; keep it off the cores
os.environ.setdefault('TF_NUM_INTEROP_THREADS', '1')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import machine, report  # noqa: E402
from benchmarks.matmul_roof import ROOF_SHAPE, jax_roof  # noqa: E402
from benchmarks.t5_small_setup import (  # noqa: E402  (the model, inputs and process settings)
    PRECISIONS, _train_setup, check_decoded, decode_setup, prepare_process, t5_small_config)
from t2t.models import gemm, small_dots, train_attention  # noqa: E402
from t2t.models.transformer import T5Config  # noqa: E402
from t2t.training import host_memory  # noqa: E402
from t2t.training.partitioning import Partitioner  # noqa: E402
from t2t.training.predictor import Predictor  # noqa: E402
from t2t.training.trainer import dropout_key_impl  # noqa: E402

# The issue's shapes (`report.ISSUE_SHAPES`), also the peer's defaults (hf_t5_peer.py: B, LE, LD
# and GEN). Any other shape is passed to the peer (`peer_shape_args`): both sides run the same one.
PEER_SHAPES = report.ISSUE_SHAPES


def model_flops(c: T5Config, batch: int, enc_len: int, dec_len: int, gen_len: int,
                beams: int = 1) -> dict[str, int]:
  """Model matmul FLOPs of one train step (3 x forward) and of one decode of `gen_len` tokens.

  Re-derives /work/shared/bench/t5_small_flops.py (`forward`, `decode_flops`) for any sizes; beam search
  runs every decode step on batch * beams rows (encoder and cross-attention K/V once per input row).
  A gated FFN (T5 v1.1's gated-GELU) has one input projection per activation, so two.
  """
  d, inner, f, v = c.d_model, c.num_heads * c.d_kv, c.d_ff, c.vocab_size
  proj = lambda tokens, n_in, n_out: 2 * tokens * n_in * n_out
  ffn = lambda tokens: len(c.mlp_activations) * proj(tokens, d, f) + proj(tokens, f, d)
  te, td = batch * enc_len, batch * dec_len
  enc_layer = 4 * proj(te, d, inner) + 4 * batch * enc_len * enc_len * inner + ffn(te)
  dec_layer = (4 * proj(td, d, inner) + 4 * batch * dec_len * dec_len * inner
               + 2 * proj(td, d, inner) + 2 * proj(te, d, inner)
               + 4 * batch * dec_len * enc_len * inner + ffn(td))
  encoder = c.num_encoder_layers * enc_layer
  forward = encoder + c.num_decoder_layers * dec_layer + proj(td, d, v)
  rows = batch * beams
  cross_kv = c.num_decoder_layers * 2 * proj(te, d, inner)
  step_layer = (4 * proj(rows, d, inner) + 4 * rows * gen_len * inner + 2 * proj(rows, d, inner)
                + 4 * rows * enc_len * inner + ffn(rows))
  per_step = c.num_decoder_layers * step_layer + proj(rows, d, v)
  return dict(forward=forward, train_step=3 * forward,
              decode=encoder + cross_kv + gen_len * per_step)


def _timed(fn: Callable[[], Any], warmup: int, steps: int) -> tuple[float, list[float], list[Any]]:
  """(first call incl. compile [s], timed step times [s], every call's result)."""
  t0 = time.perf_counter()
  results = [fn()]
  first = time.perf_counter() - t0
  for _ in range(max(warmup - 1, 0)):
    results.append(fn())
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    results.append(fn())
    times.append(time.perf_counter() - t0)
  return first, times, results


def _summary(times: Sequence[float], tokens: int, flops: int) -> dict[str, Any]:
  med, best = statistics.median(times), min(times)
  return dict(median_s=med, min_s=best, step_times=list(times),
              tokens_per_s_median=tokens / med, tokens_per_s_best=tokens / best,
              model_tflops_median=flops / med / 1e12, model_tflops_best=flops / best / 1e12)


def bench_train(config: T5Config, batch: int, enc_len: int, dec_len: int, steps: int,
                warmup: int, dropout_prng: str | None = None, split_update: bool = True
                ) -> dict[str, Any]:
  """Times `Trainer.step` on random tokens [batch, enc_len] -> [batch, dec_len] (all weighted).

  `dropout_prng` None keeps the trainer's dropout key; else a key of that `jax.random` impl (A/B).
  `split_update` False runs the step as one program instead of two (`Trainer.split_update`).
  """
  trainer, data = _train_setup(config, batch, enc_len, dec_len, split_update)
  if dropout_prng is not None:
    trainer.dropout_rng = jax.random.key(1, impl=dropout_key_impl(dropout_prng, trainer.partitioner))
  t0 = time.perf_counter()
  state = jax.block_until_ready(trainer.init_state())
  init_state_s = time.perf_counter() - t0
  nparams = sum(int(x.size) for x in jax.tree.leaves(state.params))
  losses, faults = [], []

  def step():
    nonlocal state
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    state, metrics = trainer.step(state, data)
    jax.block_until_ready(state)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    losses.append(float(metrics['loss']))

  first, times, _ = _timed(step, warmup, steps)
  flops = model_flops(config, batch, enc_len, dec_len, 0)['train_step']
  return dict(**_summary(times, batch * (enc_len + dec_len), flops), compile_and_first_s=first,
              init_state_s=init_state_s, params=nparams, losses=losses, flops_per_step=flops,
              page_faults_per_step=faults, split_update=trainer.split_update,
              dropout_prng=str(jax.random.key_impl(trainer.dropout_rng)))


def bench_compilation_cache(config: T5Config, batch: int, enc_len: int, dec_len: int
                            ) -> dict[str, Any]:
  """Compile + first train step with JAX's persistent compilation cache, cold and warm.

  What `--compilation_cache_dir` (t2t/training/compilation_cache.py) buys a run that starts again:
  in a fresh cache directory, a new Trainer's first step compiles and writes the cache (`cold_s`);
  then `jax.clear_caches()` drops every in-memory executable and a second new Trainer's first step
  traces and lowers again but reads XLA's executable from the directory (`warm_s`), as a new
  process would (which also pays its imports, not counted here). The cache settings are restored
  afterwards.
  """
  from jax.experimental.compilation_cache import compilation_cache as jax_cache
  from jax import monitoring
  hits = []
  listener = lambda name, **kw: hits.append(name) if name == '/jax/compilation_cache/cache_hits' else None
  monitoring.register_event_listener(listener)
  out = {}
  previous = (jax.config.jax_compilation_cache_dir,
              jax.config.jax_persistent_cache_min_compile_time_secs)
  with tempfile.TemporaryDirectory(prefix='t2t_bench_cache_') as cache_dir:
    jax_cache.set_cache_dir(cache_dir)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)  # --tiny compiles fast
    jax_cache.reset_cache()
    try:
      for name in ('cold_s', 'warm_s'):
        jax.clear_caches()
        trainer, data = _train_setup(config, batch, enc_len, dec_len)
        state = trainer.init_state()
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        state, _ = trainer.step(state, data)
        jax.block_until_ready(state)
        out[name] = time.perf_counter() - t0
        out[name.replace('_s', '_cache_hits')] = len(hits)
        hits.clear()
    finally:
      jax_cache.set_cache_dir(previous[0])
      jax.config.update('jax_persistent_cache_min_compile_time_secs', previous[1])
      jax_cache.reset_cache()
      monitoring.unregister_event_listener(listener)
  if not out['warm_cache_hits']:
    raise RuntimeError('The persistent compilation cache was not read back: no cache hits.')
  return out


def bench_decode(config: T5Config, batch: int, enc_len: int, gen_len: int, beams: int, steps: int,
                 warmup: int, model_parallel: int = 1) -> dict[str, Any]:
  """Times `Predictor.predict` of `gen_len` tokens for random inputs [batch, enc_len].

  `model_parallel` > 1: the parameters are split over that many devices by the Partitioner's
  rules (the process must have them: `use_cpu_devices`).
  """
  partitioner = Partitioner(num_partitions=model_parallel)
  model, params, inputs = decode_setup(config, batch, enc_len, gen_len, beams, partitioner)
  nparams = sum(int(x.size) for x in jax.tree.leaves(params))
  predictor = Predictor(model, params, partitioner, batch, max_decode_length=gen_len)
  examples = [dict(encoder_input_tokens=row) for row in inputs]
  first, times, outs = _timed(lambda: predictor.predict(examples), warmup, steps)
  out = np.stack(outs[-1])
  check_decoded(out, batch, gen_len)
  flops = model_flops(config, batch, enc_len, 0, gen_len, beams)['decode']
  return dict(**_summary(times, batch * gen_len, flops), compile_and_first_s=first,
              params=nparams, gen_new_tokens=int(out.shape[1]), flops_per_step=flops,
              model_parallel=model_parallel, devices=len(partitioner.mesh.devices.flat))


def use_cpu_devices(model_parallel: int, threads: int, mode: str) -> None:
  """Makes JAX split the CPU into `model_parallel` devices; call before the backend starts."""
  if model_parallel < 1:
    raise ValueError(f'--model-parallel must be >= 1, got {model_parallel}.')
  if model_parallel == 1:
    return
  if mode != 'decode':
    raise ValueError(f'--model-parallel splits decoding only; mode {mode!r} would time another '
                     'layout (use: decode --model-parallel N).')
  if model_parallel > threads:
    raise ValueError(f'--model-parallel {model_parallel} asks for more devices than the '
                     f'{threads} threads (--threads); each device needs a core of its own.')
  jax.config.update('jax_num_cpu_devices', model_parallel)


def default_peer_path() -> Path:
  """benchmarks/hf_t5_peer.py, next to this file."""
  return Path(__file__).resolve().parent / 'hf_t5_peer.py'


def peer_unavailable(peer: Path) -> str | None:
  """Why the peer cannot run (missing script or packages), or None."""
  if not peer.is_file():
    return f'peer script not found at {peer}'
  missing = [m for m in ('torch', 'transformers') if importlib.util.find_spec(m) is None]
  if missing:
    return (f'{" and ".join(missing)} not installed in {sys.executable} (the peer needs '
            '`pip install torch==2.13.0 transformers==5.23.0`; or pass --no-peer)')
  return None


def peer_shape_args(batch: int, enc_len: int, dec_len: int) -> list[str]:
  """The peer script's arguments for this run's batch and lengths (--gen-len is passed apart)."""
  return ['--batch', str(batch), '--enc-len', str(enc_len), '--dec-len', str(dec_len)]


def run_peer(peer: Path, mode: str, steps: int, warmup: int, beams: int, threads: int,
             flops: int, timeout_s: float = 3600.0, precision: str = 'fp32',
             gen_len: int = PEER_SHAPES['gen_len'], peer_malloc: str = 'system',
             extra_args: Sequence[str] = ()) -> tuple[dict[str, Any] | None, str | None]:
  """Runs the peer script; returns (its summary + raw result, None) or (None, why it did not run).

  `precision` 'bf16' runs the peer under torch.autocast('cpu', bfloat16), its mixed precision;
  `gen_len` is the number of tokens it decodes per row (decode mode); `peer_malloc` 'retain'
  starts it with t2t's host malloc settings as glibc tunables (`host_memory.GLIBC_TUNABLES`),
  'system' (default) as a user runs it. `extra_args` go to the script as they are (`t5_gpu`: its
  model, device and shapes).
  """
  why = peer_unavailable(peer)
  if why:
    return None, why
  cmd = [sys.executable, str(peer), mode, '--steps', str(steps), '--warmup', str(warmup),
         '--threads', str(threads), '--beams', str(beams)]
  if mode == 'decode':
    cmd += ['--gen-len', str(gen_len)]
  if precision == 'bf16':
    cmd.append('--bf16-autocast')
  cmd += list(extra_args)
  if peer_malloc not in ('system', 'retain'):
    raise ValueError(f'--peer-malloc must be "system" or "retain", got {peer_malloc!r}.')
  env = dict(os.environ)
  env.pop('GLIBC_TUNABLES', None)
  if peer_malloc == 'retain':
    env['GLIBC_TUNABLES'] = host_memory.GLIBC_TUNABLES
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
  except subprocess.TimeoutExpired:
    return None, f'peer timed out after {timeout_s:.0f} s: {" ".join(cmd)}'
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
  if proc.returncode or not lines:
    return None, f'peer failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}'
  raw = json.loads(lines[-1][len('RESULT '):])
  times = raw.get('step_times') or raw['times']
  if mode == 'train':
    tokens = raw['batch'] * (raw['enc_len'] + raw['dec_len'])
  else:
    tokens = raw['batch'] * raw['gen_new_tokens']
  return dict(**_summary(times, tokens, flops), raw=raw), None


def _check_common(steps: int, warmup: int, **lengths: int) -> None:
  for name, value in dict(steps=steps, **lengths).items():
    if value < 1:
      raise ValueError(f'--{name.replace("_", "-")} must be >= 1, got {value}.')
  if warmup < 1:
    raise ValueError(f'--warmup must be >= 1 (the first call compiles), got {warmup}.')


def run(mode: str, *, steps: int = 5, warmup: int = 2, beams: int = 1, threads: int = 2,
        batch: int = 8, enc_len: int = 512, dec_len: int = 114, gen_len: int = 64,
        tiny: bool = False, dropout_rate: float | None = None, peer: Path | None = None,
        no_peer: bool = False, dropout_prng: str | None = None, precision: str = 'fp32',
        peer_malloc: str = 'system', fused_step: bool = False,
        model_parallel: int = 1) -> dict[str, Any]:
  """Runs one benchmark (t2t, then the peer) and returns the result dict printed as JSON.

  `dropout_rate` None = the peer's (0.1 train, 0 decode); another value never runs the peer.
  """
  if mode not in ('train', 'decode'):
    raise ValueError(f'mode must be "train" or "decode", got {mode!r}.')
  _check_common(steps, warmup, batch=batch, enc_len=enc_len, dec_len=dec_len, gen_len=gen_len)
  peer_dropout = 0.1 if mode == 'train' else 0.0
  config = t5_small_config(peer_dropout if dropout_rate is None else dropout_rate, tiny, precision)
  load_before = os.getloadavg()
  with machine.Section('t2t') as t2t_section:
    if mode == 'train':
      ours = bench_train(config, batch, enc_len, dec_len, steps, warmup, dropout_prng,
                         split_update=not fused_step)
      ours['compilation_cache'] = bench_compilation_cache(config, batch, enc_len, dec_len)
    else:
      ours = bench_decode(config, batch, enc_len, gen_len, beams, steps, warmup, model_parallel)
  load_mid = os.getloadavg()

  # Only the lengths a mode uses: train has no generated tokens, decode no teacher-forced targets.
  shapes = (dict(batch=batch, enc_len=enc_len, dec_len=dec_len) if mode == 'train' else
            dict(batch=batch, enc_len=enc_len, gen_len=gen_len, beams=beams))
  peer_result, peer_error = None, None
  sections = [t2t_section]
  if no_peer:
    peer_error = 'disabled with --no-peer'
  elif tiny:
    peer_error = 'the peer runs only T5-small (at any shape); this run is --tiny'
  elif config.dropout_rate != peer_dropout:
    peer_error = (f'the peer runs T5-small with dropout {peer_dropout} only (at any shape); this '
                  f'run has dropout {config.dropout_rate}')
  else:
    with machine.Section('peer') as peer_section:
      peer_result, peer_error = run_peer(peer or default_peer_path(), mode, steps, warmup, beams,
                                         threads, ours['flops_per_step'], precision=precision,
                                         gen_len=gen_len, peer_malloc=peer_malloc,
                                         extra_args=peer_shape_args(batch, enc_len, dec_len))
    sections.append(peer_section)
    if peer_result is not None:
      ran = {k: peer_result['raw'].get(k) for k in shapes if k in ('batch', 'enc_len', 'dec_len')}
      if any(ran[k] != shapes[k] for k in ran):   # e.g. an older --peer script that ignores them
        peer_result, peer_error = None, (f'the peer ran at {ran}, not at this run\'s shapes '
                                         f'{shapes}; its figures are not compared')

  ratio = None
  if peer_result is not None:
    ratio = dict(time_median_t2t_over_peer=ours['median_s'] / peer_result['median_s'],
                 time_min_t2t_over_peer=ours['min_s'] / peer_result['min_s'],
                 speedup_median=peer_result['median_s'] / ours['median_s'])
  return dict(
      benchmark='t5_small_cpu', mode=mode, model='tiny' if tiny else 't5_1_0_small',
      precision=precision,
      host_malloc=dict(t2t_retains_freed_memory=host_memory.applied(), peer=peer_malloc,
                       t2t_glibc_tunables=os.environ.get('GLIBC_TUNABLES'),
                       t2t_xla_cpu_memory_schedule=host_memory.memory_schedule()),
      small_dots=small_dots.status(),   # t2t's CPU kernels: bf16 / f32 decoding, f32 GEMM
      gemm_build=getattr(gemm.library(), 'name', None),   # which GEMM build ran (AVX2 / AVX-512)
      train_attention_build=train_attention.float32_build(),   # and which attention build
      config=dict(dataclasses.asdict(config), dtype=str(config.dtype),
                  param_dtype=str(config.param_dtype), matmul_dtype=str(config.matmul_dtype)),
      shapes=shapes,
      steps=steps, warmup=warmup, threads=threads, cpu_count=os.cpu_count(),
      cpus_used=sorted(os.sched_getaffinity(0)),
      loadavg=dict(before=load_before, after_t2t=load_mid, after_peer=os.getloadavg()),
      sections=[x.as_dict() for x in sections], loaded=any(x.loaded for x in sections),
      versions=machine.versions(), flops_source='benchmarks/t5_small_flops.py (re-derived in model_flops)',
      t2t=ours, peer=peer_result, peer_error=peer_error, ratio=ratio)


def run_all(*, steps: int = 5, warmup: int = 2, threads: int = 2, peer: Path | None = None,
            no_peer: bool = False, tiny: bool = False, batch: int = 8, enc_len: int = 512,
            dec_len: int = 114, gen_len: int = 64, roof_reps: int = 10, precision: str = 'fp32',
            peer_malloc: str = 'system') -> dict[str, Any]:
  """The issue's suite: matmul roof, train step, greedy and beam-4 decoding, each against the peer.

  The roof is measured for fp32 and bf16 operands; the train step's fraction uses the roof of the
  run's `precision`.
  """
  _check_common(steps, warmup, batch=batch, enc_len=enc_len, dec_len=dec_len, gen_len=gen_len)
  t5_small_config(0.0, tiny, precision)  # an unknown precision is refused before anything runs
  with machine.Section('matmul_roof') as roof_section:
    roof = jax_roof(roof_reps, ('float32', 'bfloat16'))
  roof['roof_dtype'] = 'float32' if precision == 'fp32' else 'bfloat16'
  roof['roof_gflops'] = roof['x'.join(map(str, ROOF_SHAPE)) + '_' + roof['roof_dtype']]['gflops_best']
  kw = dict(steps=steps, warmup=warmup, threads=threads, peer=peer, no_peer=no_peer, tiny=tiny,
            batch=batch, enc_len=enc_len, precision=precision, peer_malloc=peer_malloc)
  results = dict(train=run('train', dec_len=dec_len, **kw),
                 greedy=run('decode', beams=1, gen_len=gen_len, **kw),
                 beam4=run('decode', beams=4, gen_len=gen_len, **kw))
  sections = [roof_section.as_dict()] + [
      dict(sec, name=f'{name}/{sec["name"]}') for name, r in results.items() for sec in r['sections']]
  out = dict(benchmark='t5_small_cpu', mode='all', model='tiny' if tiny else 't5_1_0_small',
             precision=precision, threads=threads, cpu_count=os.cpu_count(), cpus_used=sorted(os.sched_getaffinity(0)),
             versions=machine.versions(), matmul_roof=roof, results=results, sections=sections,
             loaded=any(s['loaded'] for s in sections))
  out['targets'] = report.targets(out)
  return out


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('mode', nargs='?', default='all', choices=['all', 'train', 'decode'],
                  help='all (default): roof, train, greedy and beam-4 decoding')
  ap.add_argument('--steps', type=int, default=5, help='timed steps (medians are over these)')
  ap.add_argument('--warmup', type=int, default=2, help='untimed steps (the first compiles)')
  ap.add_argument('--beams', type=int, default=1, help='decode: 1 = greedy, else beam search')
  ap.add_argument('--threads', type=int, default=2, help='CPUs for both t2t and the peer')
  ap.add_argument('--batch', type=int, default=PEER_SHAPES['batch'])
  ap.add_argument('--enc-len', type=int, default=PEER_SHAPES['enc_len'])
  ap.add_argument('--dec-len', type=int, default=PEER_SHAPES['dec_len'])
  ap.add_argument('--gen-len', type=int, default=PEER_SHAPES['gen_len'], help='decoded tokens')
  ap.add_argument('--tiny', action='store_true', help='a tiny model (tests); implies no peer')
  ap.add_argument('--dropout', type=float, default=None,
                  help="train/decode: default the peer's, 0.1 train / 0 decode; another skips the peer")
  ap.add_argument('--dropout-prng', default=None, choices=['threefry2x32', 'rbg', 'unsafe_rbg', 'philox4x32'],
                  help="train: the dropout key's PRNG (default: the trainer's), for A/B runs")
  ap.add_argument('--fused-step', action='store_true',
                  help='train: the step as one program (Trainer.split_update = False), for A/B')
  ap.add_argument('--precision', default='fp32', choices=sorted(PRECISIONS),
                  help='fp32 (default) or bf16: t2t with T5Config.matmul_dtype=bfloat16 (bf16 '
                       'operands, float32 accumulation) against the peer under torch.autocast bf16')
  ap.add_argument('--host-malloc', default='auto', choices=host_memory.MODES,
                  help="t2t's host memory settings, as t2t.train's --host_malloc (default auto: "
                       "retain freed memory and XLA:CPU's memory-minimising schedule on the CPU "
                       'backend; t2t/training/host_memory.py)')
  ap.add_argument('--python-gc', default='frozen', choices=['frozen', 'default'],
                  help="frozen (default): the imported objects frozen out of Python's cyclic "
                       'collector, as python -m t2t.train does (t2t/training/garbage_collection.py); '
                       "default: Python's collector as it comes, for A/B")
  ap.add_argument('--peer-malloc', default='system', choices=['system', 'retain'],
                  help='system (default): the peer as a user runs it; retain: the peer with the '
                       'same malloc settings, as glibc tunables')
  ap.add_argument('--model-parallel', type=int, default=1,
                  help='decode: split the CPU into N devices and the model N ways (at most '
                       '--threads)')
  ap.add_argument('--peer', type=Path, default=None, help=f'default: {default_peer_path()}')
  ap.add_argument('--no-peer', action='store_true')
  ap.add_argument('--allow-emulated-bf16', action='store_true',
                  help='run --precision bf16 against the peer on a CPU without bf16 '
                       'instructions (both sides then emulate bf16)')
  ap.add_argument('--allow-loaded', action='store_true',
                  help='run on a loaded machine anyway; the JSON marks the figures as loaded')
  ap.add_argument('--out', type=Path, default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  try:
    if args.fused_step and args.mode != 'train':
      raise ValueError(f'--fused-step times the train step; it does nothing in mode {args.mode!r} '
                       '(use: train --fused-step).')
    machine.pin_threads(args.threads)
    use_cpu_devices(args.model_parallel, args.threads, args.mode)
    quiet = machine.check_quiet(args.allow_loaded)
    machine.check_bf16_is_native(args.precision, quiet['cpu_identity'],
                                 peer_runs=not (args.no_peer or args.tiny),
                                 allow_emulated=args.allow_emulated_bf16)
    if not args.no_peer and not args.tiny:
      why = peer_unavailable(args.peer or default_peer_path())
      if why:
        raise ValueError(f'The Hugging Face peer cannot run: {why}.')
  except ValueError as e:
    sys.exit(f'benchmarks.t5_small_cpu: error: {e}')
  prepare_process(args.host_malloc, freeze_gc=args.python_gc == 'frozen')
  common = dict(steps=args.steps, warmup=args.warmup, threads=args.threads, batch=args.batch,
                enc_len=args.enc_len, gen_len=args.gen_len, tiny=args.tiny, peer=args.peer,
                no_peer=args.no_peer, dec_len=args.dec_len, precision=args.precision,
                peer_malloc=args.peer_malloc)
  try:
    if args.mode == 'all':
      result = run_all(**common)
    else:
      result = run(args.mode, beams=args.beams, dropout_rate=args.dropout,
                   dropout_prng=args.dropout_prng, fused_step=args.fused_step,
                   model_parallel=args.model_parallel, **common)
  except ValueError as e:
    sys.exit(f'benchmarks.t5_small_cpu: error: {e}')
  result['machine'] = dict(quiet, loaded=quiet['loaded_at_start'] or result['loaded'],
                           date_utc=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                           cpu=report.cpu_model(), platform=platform.platform())
  result['loaded'] = result['machine']['loaded']
  result['python_gc'] = dict(mode=args.python_gc, frozen_objects=gc.get_freeze_count())
  line = json.dumps(result)
  if args.out:
    args.out.write_text(line + '\n')
  print(line, flush=True)
  print(report.table(result), file=sys.stderr)


if __name__ == '__main__':
  main()
