"""How long a fresh Python process takes to import a t2t module, with and without Keras's
optional scikit-learn / matplotlib imports (t2t/keras_imports.py).

  python -m benchmarks.process_start [--module t2t.train] [--runs 5] [--allow-loaded] [--out PATH]

Every `python -m t2t.*` command, and each of the ~100 such processes the test suite starts, pays
its imports before any work. This starts `python -c "import MODULE"` `--runs` times in each of two
modes, alternating (keep, hidden, keep, hidden, ...) so a drift of the machine hits both alike:
`keep` sets `T2T_KERAS_OPTIONAL_IMPORTS=keep` (Keras imports scikit-learn and matplotlib as it
would without t2t), `hidden` is t2t's default. Each run records the process's wall seconds as its
parent sees them (interpreter start included), its CPU seconds (user + system, `getrusage` of
children) and which of the hidden packages it ended up loading.

Prints one JSON line (runs, per-mode medians, the hidden/keep ratio, `machine` with the load and
the processor); a machine whose load average is above its core count is refused unless
`--allow-loaded`. Test: tests/benchmarks/test_process_start.py.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Sequence

from benchmarks import machine

MODES = ('keep', 'hidden')
_PROBE = ('import sys, json\nimport {module}\n'
          'print(json.dumps(sorted(m for m in {packages!r} if m in sys.modules)))')


def _child_cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


def start_once(module: str, mode: str) -> dict[str, Any]:
  """One fresh `python -c 'import MODULE'` in `mode`: {mode, wall_s, cpu_s, loaded}."""
  from t2t import keras_imports  # pylint: disable=g-import-not-at-top
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'}
  env.pop(keras_imports.KEEP_ENV, None)
  if mode == 'keep':
    env[keras_imports.KEEP_ENV] = 'keep'
  code = _PROBE.format(module=module, packages=keras_imports.HIDDEN_PACKAGES)
  cpu0, t0 = _child_cpu_s(), time.perf_counter()
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       check=False)
  wall, cpu = time.perf_counter() - t0, _child_cpu_s() - cpu0
  if out.returncode != 0:
    raise RuntimeError(f'`import {module}` failed in a fresh process ({mode}):\n'
                       f'{out.stderr[-3000:]}')
  return dict(mode=mode, wall_s=wall, cpu_s=cpu,
              loaded=json.loads(out.stdout.strip().splitlines()[-1]))


def measure(module: str = 't2t.train', runs: int = 5) -> dict[str, Any]:
  """`runs` alternating starts per mode; medians per mode and hidden / keep."""
  if runs < 1:
    raise ValueError(f'--runs must be >= 1, got {runs}.')
  results = [start_once(module, mode) for _ in range(runs) for mode in MODES]
  medians = {mode: {key: statistics.median(r[key] for r in results if r['mode'] == mode)
                    for key in ('wall_s', 'cpu_s')} for mode in MODES}
  return dict(benchmark='process_start', module=module, runs=results, median=medians,
              hidden_over_keep_wall=medians['hidden']['wall_s'] / medians['keep']['wall_s'])


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--module', default='t2t.train', help='the module each process imports')
  ap.add_argument('--runs', type=int, default=5, help='processes per mode, alternating')
  ap.add_argument('--allow-loaded', action='store_true')
  ap.add_argument('--out', default=None, help='also write the JSON to this file')
  args = ap.parse_args(argv)
  try:
    if args.runs < 1:
      raise ValueError(f'--runs must be >= 1, got {args.runs}.')
    quiet = machine.check_quiet(args.allow_loaded)
  except ValueError as e:
    sys.exit(f'benchmarks.process_start: error: {e}')
  with machine.Section('process_start') as section:
    result = measure(args.module, args.runs)
  machine.record(result, quiet, [section], args.out)
  for mode in MODES:
    m = result['median'][mode]
    print(f'{mode:>7}: import {args.module} in {m["wall_s"]:.2f} s wall, {m["cpu_s"]:.2f} s CPU '
          f'(median of {args.runs})', file=sys.stderr)
  print(f'hidden / keep: {result["hidden_over_keep_wall"]:.3f}', file=sys.stderr)


if __name__ == '__main__':
  main()
