"""Practical matmul roof of this CPU: the best GFLOP/s of one large jitted matmul.

`jax_roof()` is what the T5 benchmark divides its model FLOP/s by ("% of the roof"): fp32
2048x2048 @ 2048x2048 under `jax.jit`, best of `reps` after 3 warm-up calls, on the cores the
process is pinned to. The T5-small FFN shape (4096x512 @ 512x2048, B*Le = 4096 tokens) and bf16
inputs (f32 accumulation) are reported for reference.

  python -m benchmarks.matmul_roof {jax|torch} [--reps 20] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

ROOF_SHAPE = (2048, 2048, 2048)
SHAPES = [ROOF_SHAPE, (4096, 512, 2048)]


def bench(fn: Callable[[], Any], flops: int, reps: int) -> dict[str, float]:
  for _ in range(3):
    fn()
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t0)
  return dict(min_s=min(ts), median_s=statistics.median(ts), gflops_best=flops / min(ts) / 1e9,
              gflops_median=flops / statistics.median(ts) / 1e9)


def jax_roof(reps: int = 10, dtypes: tuple[str, ...] = ('float32',)) -> dict[str, Any]:
  """{'<m>x<k>x<n>_<dtype>': bench, ...} for jax.jit(a @ b), plus 'roof_gflops' (fp32, best)."""
  import jax
  import jax.numpy as jnp
  out: dict[str, Any] = {}
  for dtype in dtypes:
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    for m, k, n in SHAPES:
      ka, kb = jax.random.split(jax.random.PRNGKey(0))
      a = jax.random.normal(ka, (m, k), jnp.float32).astype(dtype)
      b = jax.random.normal(kb, (k, n), jnp.float32).astype(dtype)
      out[f'{m}x{k}x{n}_{dtype}'] = bench(lambda: f(a, b).block_until_ready(), 2 * m * k * n, reps)
  m, k, n = ROOF_SHAPE
  out['roof_gflops'] = out[f'{m}x{k}x{n}_float32']['gflops_best'] if 'float32' in dtypes else None
  return out


def torch_roof(reps: int = 10, threads: int = 2) -> dict[str, Any]:
  import torch
  torch.set_num_threads(threads)
  out: dict[str, Any] = dict(threads=torch.get_num_threads())
  for m, k, n in SHAPES:
    a, b, c = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    out[f'{m}x{k}x{n}_float32'] = bench(lambda: torch.matmul(a, b, out=c), 2 * m * k * n, reps)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('lib', choices=['jax', 'torch'])
  ap.add_argument('--reps', type=int, default=20)
  ap.add_argument('--threads', type=int, default=2)
  args = ap.parse_args()
  if args.lib == 'jax':
    from benchmarks.machine import pin_threads
    try:
      pin_threads(args.threads)
    except ValueError as e:
      ap.error(str(e))
    print(json.dumps(jax_roof(args.reps, ('float32', 'bfloat16'))))
  else:
    print(json.dumps(torch_roof(args.reps, args.threads)))


if __name__ == '__main__':
  main()
