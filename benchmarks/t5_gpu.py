"""T5 v1.1 base in bf16 on one GPU, against Hugging Face on the same GPU, with MFU.

  python -m benchmarks.t5_gpu [--batch 64] [--steps 5] [--warmup 2] [--gen-len 64]
                              [--parts train,greedy,beam4] [--no-peer] [--out PATH]
  python -m benchmarks.t5_gpu --platform cpu --tiny [--batch 2 --enc-len 32 --dec-len 8 --gen-len 4]
      (the same code on the CPU with a tiny v1.1-shaped model: what the tests run)

Issue 9's accelerator row, run only where a GPU is lent (benchmarks/gpu_row.sh holds the one
command a `device` session runs; benchmarks/README.md, "t5_gpu"). Each part runs t2t in this
process, then the peer (`hf_t5_peer.py --device cuda --model t5_1_1_base`, a subprocess) at the
same shapes, and reports the peer's median time over t2t's (the speed-up):

- **train**: `Trainer.step` on random tokens [batch, enc_len] -> [batch, dec_len], every target
  weighted, dropout 0.1, AdaFactor set as the peer's (`t5_small_setup.adafactor_like_peer`).
  t2t runs the T5 v1.1 / t5x mixed precision: activations and matmuls in bfloat16
  (`T5Config.dtype`), float32 parameters and optimizer state; the peer runs under
  `torch.autocast('cuda', bfloat16)` with float32 weights.
- **greedy**, **beam4**: `Predictor.predict` of `gen_len` tokens for random inputs [batch, enc_len]
  (EOS masked, so every row decodes the full length) against `generate`.

MFU = model FLOPs (`t5_small_cpu.model_flops`: matmuls only, attention at full size, a train step
3x the forward) / median time / the device's datasheet dense bf16 peak (`PEAK_BF16_TFLOPS`); the
same FLOP/s are also given as a fraction of a measured bf16 matmul roof (jnp.matmul, bf16 operands,
f32 accumulation; 8192^3 on a GPU).

The process imports neither TensorFlow nor seqio (an accelerator image has neither): the model,
trainer and predictor need only JAX, Flax, optax, orbax and gin
(tests/benchmarks/test_t5_gpu.py runs it with those two imports refused).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import jax  # first: JAX reads JAX_PLATFORMS on import, before t5_small_cpu sets it for the CPU
import jax.numpy as jnp

from benchmarks import machine, matmul_roof
from benchmarks.report import _fmt
from benchmarks.t5_small_cpu import (_check_common, bench_decode, bench_train, default_peer_path,
                                     peer_unavailable, run_peer)
from t2t.models.transformer import T5Config

PLATFORMS = ('gpu', 'cpu')
PARTS = ('train', 'greedy', 'beam4')

# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, TFLOP/s, by a name that
# `device_kind` contains: H100 and H200 SXM 989.4 (1,979 with sparsity), A100 312.
PEAK_BF16_TFLOPS = {'H200': 989.4, 'H100 80GB HBM3': 989.4, 'A100': 312.0}


def t5_1_1_base_config(dropout_rate: float, tiny: bool = False) -> T5Config:
  """gin/models/t5_1_1/base.gin's T5Config with bfloat16 activations (its ACTIVATION_DTYPE for
  accelerators); `tiny`: the same shape of model (gated-GELU, untied logits) at 2+2 layers, d_model
  32, for tests (the peer's `tiny_1_1`)."""
  if tiny:
    sizes = dict(vocab_size=128, d_model=32, num_heads=2, d_kv=16, d_ff=64, num_encoder_layers=2,
                 num_decoder_layers=2)
  else:
    sizes = dict(vocab_size=32128, d_model=768, num_heads=12, d_kv=64, d_ff=2048,
                 num_encoder_layers=12, num_decoder_layers=12)
  return T5Config(**sizes, dropout_rate=dropout_rate, feed_forward_proj='gated-gelu',
                  tie_word_embeddings=False, dtype='bfloat16', param_dtype='float32')


def peak_bf16_tflops(device_kind: str) -> float | None:
  """The datasheet's dense bf16 peak of a device named `device_kind` (None: not in the table)."""
  return next((peak for name, peak in PEAK_BF16_TFLOPS.items() if name in device_kind), None)


def select_platform(platform: str) -> dict[str, Any]:
  """Checks that JAX runs on `platform` (call before its first device use) and describes the device.

  'cpu' points JAX at the CPU; 'gpu' takes JAX's own choice, which is a GPU wherever a CUDA (or
  ROCm) jaxlib plugin finds one, and refuses anything else. On a GPU the allocator grows as needed
  instead of taking 75% of the memory at the start, so the peer's process, which runs while this
  one lives, has the rest of the GPU.
  """
  if platform not in PLATFORMS:
    raise ValueError(f'--platform must be one of {sorted(PLATFORMS)}, got {platform!r}.')
  if platform == 'cpu':
    jax.config.update('jax_platforms', 'cpu')
  else:
    os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  backend = jax.default_backend()
  if backend != platform:
    raise ValueError(
        f'--platform {platform}: JAX {jax.__version__} runs on {backend!r} here (jax_platforms '
        f'{jax.config.jax_platforms!r}; a GPU needs a CUDA or ROCm jaxlib plugin and a '
        'visible device). This benchmark times one GPU; on a CPU run benchmarks.t5_small_cpu, or '
        'this one with --platform cpu --tiny to try the code.')
  devices = jax.devices()
  kind = devices[0].device_kind
  return dict(platform=platform, device_kind=kind, device_count=len(devices),
              platform_version=getattr(devices[0].client, 'platform_version', None),
              peak_bf16_tflops=peak_bf16_tflops(kind) if platform == 'gpu' else None)


def bf16_roof(size: int, reps: int) -> dict[str, Any]:
  """Best and median TFLOP/s of jnp.matmul on [size, size] bf16 operands, f32 accumulation."""
  f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
  ka, kb = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(ka, (size, size), jnp.float32).astype(jnp.bfloat16)
  b = jax.random.normal(kb, (size, size), jnp.float32).astype(jnp.bfloat16)
  timing = matmul_roof.bench(lambda: f(a, b).block_until_ready(), 2 * size ** 3, reps)
  return dict(shape=[size] * 3, tflops_best=timing['gflops_best'] / 1e3,
              tflops_median=timing['gflops_median'] / 1e3, median_s=timing['median_s'])


def _fractions(tflops: float, peak: float | None, roof: float | None) -> dict[str, float | None]:
  return dict(mfu=tflops / peak if peak else None,
              fraction_of_roof=tflops / roof if roof else None)


def run_part(part: str, config: T5Config, *, batch: int, enc_len: int, dec_len: int, gen_len: int,
             steps: int, warmup: int, peer_args: Sequence[str] | None, peer: Path | None,
             peak: float | None, roof: float | None) -> dict[str, Any]:
  """One part (train, greedy or beam4): t2t, then the peer (None `peer_args`: not run)."""
  beams = 4 if part == 'beam4' else 1
  with machine.Section(f'{part}/t2t') as t2t_section:
    if part == 'train':
      ours = bench_train(config, batch, enc_len, dec_len, steps, warmup)
    else:
      ours = bench_decode(config, batch, enc_len, gen_len, beams, steps, warmup)
  ours.update(_fractions(ours['model_tflops_median'], peak, roof))
  sections = [t2t_section]
  theirs, why = None, 'disabled with --no-peer'
  if peer_args is not None:
    mode = 'train' if part == 'train' else 'decode'
    with machine.Section(f'{part}/peer') as peer_section:
      theirs, why = run_peer(peer or default_peer_path(), mode, steps, warmup, beams,
                             threads=len(os.sched_getaffinity(0)), flops=ours['flops_per_step'],
                             precision='bf16', gen_len=gen_len,
                             extra_args=[*peer_args, '--batch', str(batch), '--enc-len',
                                         str(enc_len), '--dec-len', str(dec_len)])
    sections.append(peer_section)
    if theirs is not None:
      theirs.update(_fractions(theirs['model_tflops_median'], peak, roof))
  ratio = None if theirs is None else dict(speedup_median=theirs['median_s'] / ours['median_s'],
                                           speedup_best=theirs['min_s'] / ours['min_s'])
  return dict(t2t=ours, peer=theirs, peer_error=None if theirs else why, ratio=ratio,
              sections=[s.as_dict() for s in sections])


def run(platform_info: dict[str, Any], *, parts: Sequence[str] = PARTS, tiny: bool = False,
        batch: int = 64, enc_len: int = 512, dec_len: int = 114, gen_len: int = 64,
        steps: int = 5, warmup: int = 2, roof_size: int = 8192, roof_reps: int = 10,
        no_peer: bool = False, peer: Path | None = None) -> dict[str, Any]:
  """The roof, then each of `parts`; the result dict printed as JSON (without `machine`)."""
  _check_common(steps, warmup, batch=batch, enc_len=enc_len, dec_len=dec_len, gen_len=gen_len,
                roof_size=roof_size, roof_reps=roof_reps)
  unknown = [p for p in parts if p not in PARTS]
  if unknown or not parts:
    raise ValueError(f'--parts takes a comma-separated subset of {",".join(PARTS)}, got '
                     f'{",".join(parts) or "nothing"}.')
  peer_args = None
  if not no_peer:
    device = 'cuda' if platform_info['platform'] == 'gpu' else 'cpu'
    peer_args = ['--model', 'tiny_1_1' if tiny else 't5_1_1_base', '--device', device]
  with machine.Section('matmul_roof') as roof_section:
    roof = bf16_roof(roof_size, roof_reps)
  peak = platform_info['peak_bf16_tflops']
  results = {}
  for part in parts:
    config = t5_1_1_base_config(0.1 if part == 'train' else 0.0, tiny)
    results[part] = run_part(part, config, batch=batch, enc_len=enc_len, dec_len=dec_len,
                             gen_len=gen_len, steps=steps, warmup=warmup, peer_args=peer_args,
                             peer=peer, peak=peak, roof=roof['tflops_best'])
  sections = [roof_section.as_dict()] + [s for r in results.values() for s in r['sections']]
  config = t5_1_1_base_config(0.0, tiny)
  return dict(benchmark='t5_gpu', model='tiny_1_1' if tiny else 't5_1_1_base', precision='bf16',
              config=dict(dataclasses.asdict(config), dtype=str(config.dtype),
                          param_dtype=str(config.param_dtype),
                          matmul_dtype=str(config.matmul_dtype)),
              shapes=dict(batch=batch, enc_len=enc_len, dec_len=dec_len, gen_len=gen_len),
              steps=steps, warmup=warmup, device=platform_info, matmul_roof_bf16=roof,
              results=results, sections=sections, loaded=any(s['loaded'] for s in sections),
              versions=machine.versions(),
              flops_source='benchmarks/t5_small_cpu.py model_flops (matmuls, 3x forward to train)')


def table(result: dict[str, Any]) -> str:
  """A markdown table of a result: each part's medians, tokens/s, MFU and the speed-up."""
  d, m = result['device'], result.get('machine', {})
  lines = [f'T5 v1.1 {"base" if result["model"] == "t5_1_1_base" else result["model"]}, bf16, '
           f'{d["device_kind"]} ({d["platform"]}), batch {result["shapes"]["batch"]}, '
           f'{m.get("date_utc")}; load average at start '
           f'{_fmt((m.get("loadavg_at_start") or [None])[0], ".2f")} on {m.get("cores")} cores'
           + ('; MEASURED ON A LOADED MACHINE: not a result' if result.get('loaded') else ''), '',
           '| part | side | median s | tokens/s | model TFLOP/s | MFU | % of roof | HF/t2t speed-up |',
           '|---|---|---|---|---|---|---|---|']
  for part, r in result['results'].items():
    for side, s in (('t2t', r['t2t']), ('HF', r['peer'])):
      if s is None:
        lines.append(f'| | HF | not run: {r["peer_error"]} | | | | | |')
        continue
      speedup = r['ratio']['speedup_median'] if side == 't2t' and r['ratio'] else None
      lines.append(f'| {part if side == "t2t" else ""} | {side} | {s["median_s"]:.4f} | '
                   f'{s["tokens_per_s_median"]:.0f} | {s["model_tflops_median"]:.3g} | '
                   f'{_fmt(s["mfu"], ".1%")} | {_fmt(s["fraction_of_roof"], ".1%")} | '
                   f'{_fmt(speedup, ".2f")} |')
  roof = result['matmul_roof_bf16']
  lines += ['', f'bf16 matmul roof ({"x".join(map(str, roof["shape"]))}, best): '
            f'{roof["tflops_best"]:.3g} TFLOP/s; datasheet peak: '
            f'{_fmt(d["peak_bf16_tflops"], ".1f")} TFLOP/s']
  if 'train' in result['results']:
    lines.append(f'train compile + first step: '
                 f'{result["results"]["train"]["t2t"]["compile_and_first_s"]:.1f} s')
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--platform', default='gpu', choices=sorted(PLATFORMS))
  ap.add_argument('--tiny', action='store_true', help='a tiny v1.1-shaped model (tests)')
  ap.add_argument('--parts', default=','.join(PARTS), help='comma-separated subset of ' + ','.join(PARTS))
  ap.add_argument('--batch', type=int, default=64)
  ap.add_argument('--enc-len', type=int, default=512)
  ap.add_argument('--dec-len', type=int, default=114)
  ap.add_argument('--gen-len', type=int, default=64, help='decoded tokens per row')
  ap.add_argument('--steps', type=int, default=5, help='timed steps (medians are over these)')
  ap.add_argument('--warmup', type=int, default=2, help='untimed steps (the first compiles)')
  ap.add_argument('--roof-size', type=int, default=None,
                  help='the bf16 roof matmul is N^3 (default 8192; 256 with --tiny)')
  ap.add_argument('--roof-reps', type=int, default=10)
  ap.add_argument('--peer', type=Path, default=None, help=f'default: {default_peer_path()}')
  ap.add_argument('--no-peer', action='store_true')
  ap.add_argument('--allow-loaded', action='store_true',
                  help='run on a loaded machine anyway; the JSON marks the figures as loaded')
  ap.add_argument('--out', type=Path, default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  parts = [p for p in args.parts.split(',') if p]
  try:
    quiet = machine.check_quiet(args.allow_loaded)
    if not args.no_peer:
      why = peer_unavailable(args.peer or default_peer_path())
      if why:
        raise ValueError(f'The Hugging Face peer cannot run: {why}.')
    info = select_platform(args.platform)
    result = run(info, parts=parts, tiny=args.tiny, batch=args.batch, enc_len=args.enc_len,
                 dec_len=args.dec_len, gen_len=args.gen_len, steps=args.steps,
                 warmup=args.warmup, roof_size=args.roof_size or (256 if args.tiny else 8192),
                 roof_reps=args.roof_reps, no_peer=args.no_peer, peer=args.peer)
  except ValueError as e:
    sys.exit(f'benchmarks.t5_gpu: error: {e}')
  result['machine'] = dict(quiet, date_utc=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()))
  result['loaded'] = bool(quiet['loaded_at_start'] or result['loaded'])
  line = json.dumps(result)
  if args.out:
    args.out.write_text(line + '\n')
  print(line, flush=True)
  print(table(result), file=sys.stderr)


if __name__ == '__main__':
  main()
