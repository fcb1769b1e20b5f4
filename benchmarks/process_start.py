"""How long a fresh Python process takes to import a t2t module, with one of t2t's import-time
measures turned off and on.

  python -m benchmarks.process_start [--compare keras_imports|deferred_imports]
      [--module t2t.train] [--runs 5] [--allow-loaded] [--out PATH]

Every `python -m t2t.*` command, and each of the ~140 processes the test suite starts, pays its
imports before any work. This starts `python -c "import MODULE"` `--runs` times in each of two
modes, alternating (off, on, off, on, ...) so a drift of the machine hits both alike:

- `--compare keras_imports` (the default): `keep` sets `T2T_KERAS_OPTIONAL_IMPORTS=keep` (Keras
  imports scikit-learn and matplotlib as it would without t2t), `hidden` is t2t's default
  (t2t/keras_imports.py).
- `--compare deferred_imports`: `eager` sets `T2T_DEFERRED_IMPORTS=off` (seqio's PyGlove import
  runs PyGlove's code), `deferred` is t2t's default (t2t/deferred_imports.py).

Each run records the process's wall seconds as its parent sees them (interpreter start included),
its CPU seconds (user + system, `getrusage` of children) and which of the comparison's packages it
ended up loading.

Prints one JSON line (runs, per-mode medians, the on/off ratio, `machine` with the load and the
processor); a machine whose load average is above its core count is refused unless
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
from t2t import deferred_imports, keras_imports

# Per comparison: the environment variable and the value that turn the measure off, the two
# modes (off, on) and the modules whose presence in `sys.modules` shows what a process loaded.
COMPARISONS = {
    'keras_imports': dict(env=keras_imports.KEEP_ENV, off_value='keep', modes=('keep', 'hidden'),
                          packages=keras_imports.HIDDEN_PACKAGES),
    'deferred_imports': dict(env=deferred_imports.OFF_ENV, off_value='off',
                             modes=('eager', 'deferred'),
                             packages=('pyglove.core',)),  # there once PyGlove's code has run
}
MODES = COMPARISONS['keras_imports']['modes']
_PROBE = ('import sys, json\nimport {module}\n'
          'print(json.dumps(sorted(m for m in {packages!r} if m in sys.modules)))')


def _child_cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_CHILDREN)
  return r.ru_utime + r.ru_stime


def start_once(module: str, mode: str, compare: str = 'keras_imports') -> dict[str, Any]:
  """One fresh `python -c 'import MODULE'` in `mode` of `compare`: {mode, wall_s, cpu_s, loaded}."""
  spec = COMPARISONS[compare]
  if mode not in spec['modes']:
    raise ValueError(f'mode {mode!r}: expected one of {spec["modes"]} for {compare}.')
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3'}
  env.pop(spec['env'], None)
  if mode == spec['modes'][0]:
    env[spec['env']] = spec['off_value']
  code = _PROBE.format(module=module, packages=spec['packages'])
  cpu0, t0 = _child_cpu_s(), time.perf_counter()
  out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                       check=False)
  wall, cpu = time.perf_counter() - t0, _child_cpu_s() - cpu0
  if out.returncode != 0:
    raise RuntimeError(f'`import {module}` failed in a fresh process ({mode}):\n'
                       f'{out.stderr[-3000:]}')
  return dict(mode=mode, wall_s=wall, cpu_s=cpu,
              loaded=json.loads(out.stdout.strip().splitlines()[-1]))


def measure(module: str = 't2t.train', runs: int = 5, compare: str = 'keras_imports'
            ) -> dict[str, Any]:
  """`runs` alternating starts per mode of `compare`; medians per mode and on / off (wall), e.g.
  `hidden_over_keep_wall`."""
  if compare not in COMPARISONS:
    raise ValueError(f'--compare {compare!r}: expected one of {", ".join(COMPARISONS)}.')
  if runs < 1:
    raise ValueError(f'--runs must be >= 1, got {runs}.')
  off, on = COMPARISONS[compare]['modes']
  results = [start_once(module, mode, compare) for _ in range(runs) for mode in (off, on)]
  medians = {mode: {key: statistics.median(r[key] for r in results if r['mode'] == mode)
                    for key in ('wall_s', 'cpu_s')} for mode in (off, on)}
  ratio = medians[on]['wall_s'] / medians[off]['wall_s']
  return {'benchmark': 'process_start', 'compare': compare, 'module': module, 'runs': results,
          'median': medians, f'{on}_over_{off}_wall': ratio}


def main(argv: Sequence[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('--compare', default='keras_imports', choices=sorted(COMPARISONS),
                  help='which import-time measure to turn off and on')
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
    result = measure(args.module, args.runs, args.compare)
  machine.record(result, quiet, [section], args.out)
  off, on = COMPARISONS[args.compare]['modes']
  for mode in (off, on):
    m = result['median'][mode]
    print(f'{mode:>8}: import {args.module} in {m["wall_s"]:.2f} s wall, {m["cpu_s"]:.2f} s CPU '
          f'(median of {args.runs})', file=sys.stderr)
  print(f'{on} / {off}: {result[f"{on}_over_{off}_wall"]:.3f}', file=sys.stderr)


if __name__ == '__main__':
  main()
