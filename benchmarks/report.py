"""The T5-small benchmark's targets (from the performance issue) and its human-readable table."""
from __future__ import annotations

from typing import Any

from benchmarks import machine

# (key, description, comparison, threshold): the issue's targets on a quiet machine.
TARGETS = (
    ('train_speedup', 'train step: HF median / t2t median', '>=', 1.5),
    ('train_roof_fraction', 'train step: model FLOP/s / matmul roof (the run precision)', '>=', 0.60),
    ('greedy_speedup', 'greedy decode: HF generate / t2t', '>=', 2.0),
    ('beam4_speedup', 'beam-4 decode: HF generate / t2t', '>=', 1.5),
    ('compile_and_first_s', 'train: compile + first step [s]', '<=', 15.0),
)


# The shapes the issue's targets are set at; `t5_small_cpu.PEER_SHAPES` is this dict.
ISSUE_SHAPES = dict(batch=8, enc_len=512, dec_len=114, gen_len=64)


def run_shapes(result: dict[str, Any]) -> dict[str, int]:
  """The shapes a result ran at: {batch, enc_len, dec_len, gen_len} for `all` (from its train and
  greedy runs), the lengths its mode uses for one mode (train: no gen_len, decode: no dec_len)."""
  if result.get('mode') != 'all':
    given = result.get('shapes') or {}
    return {k: given[k] for k in ISSUE_SHAPES if k in given}
  runs = result.get('results') or {}
  given = {**((runs.get('greedy') or {}).get('shapes') or {}),
           **((runs.get('train') or {}).get('shapes') or {})}
  return {k: given.get(k, v) for k, v in ISSUE_SHAPES.items()}


def shape_text(shapes: dict[str, int]) -> str:
  """'batch 8, 512/114 -> 64': batch, input / target tokens -> decoded tokens (those present)."""
  text = f'batch {shapes.get("batch")}, {shapes.get("enc_len")}'
  if 'dec_len' in shapes:
    text += f'/{shapes["dec_len"]}'
  if 'gen_len' in shapes:
    text += f' -> {shapes["gen_len"]}'
  return text


def cpu_model() -> str | None:
  """The processor's model name (`machine.cpu_identity`), e.g. 'AMD EPYC'."""
  return machine.cpu_identity()['model_name']


def _speedup(result: dict[str, Any] | None) -> float | None:
  if not result or not result.get('ratio'):
    return None
  return result['ratio']['speedup_median']


def targets(out: dict[str, Any]) -> dict[str, Any]:
  """Each target with its measured value and whether it is met (None when not measured)."""
  res = out['results']
  roof = (out.get('matmul_roof') or {}).get('roof_gflops')
  train = res['train']['t2t']
  measured = dict(
      train_speedup=_speedup(res['train']),
      train_roof_fraction=(train['model_tflops_median'] * 1e3 / roof) if roof else None,
      greedy_speedup=_speedup(res['greedy']),
      beam4_speedup=_speedup(res['beam4']),
      compile_and_first_s=train['compile_and_first_s'])
  table = {}
  for key, what, op, threshold in TARGETS:
    value = measured[key]
    met = None if value is None else (value >= threshold if op == '>=' else value <= threshold)
    table[key] = dict(what=what, target=f'{op} {threshold}', measured=value, met=met)
  return table


def _init(train: dict[str, Any]) -> str:
  if 'init_state_s' not in train:  # results written before it was recorded
    return ''
  return (f', after {train["init_state_s"]:.1f} s of Trainer.init_state (its programs compile '
          'and run before the clock starts)')


def _warm(train: dict[str, Any]) -> str:
  cache = train.get('compilation_cache')
  if not cache:
    return ''
  return (f' (with --compilation_cache_dir: {cache["cold_s"]:.1f} s writing the cache, '
          f'{cache["warm_s"]:.1f} s once it holds the programs)')


def _roof_name(result: dict[str, Any]) -> str:
  return {'bfloat16': 'bf16'}.get((result.get('matmul_roof') or {}).get('roof_dtype'), 'fp32')


def _fmt(x: Any, spec: str = '.2f') -> str:
  return '-' if x is None else format(x, spec)


def _rows(name: str, r: dict[str, Any], roof: float | None) -> list[str]:
  ours, peer = r['t2t'], r.get('peer')
  foreign = {s['name']: s for s in r.get('sections', [])}
  loaded = lambda side: ' LOADED' if foreign.get(side, {}).get('loaded') else ''
  fc = lambda side: _fmt(foreign.get(side, {}).get('foreign_cores'))
  pct = _fmt(ours['model_tflops_median'] * 1e5 / roof, '.0f') + '%' if roof else '-'
  rows = [f'| {name} | t2t | {ours["median_s"]:.3f} | {ours["min_s"]:.3f} | '
          f'{ours["tokens_per_s_median"]:.1f} | {ours["model_tflops_median"] * 1e3:.1f} | {pct} | '
          f'{_fmt(_speedup(r))} | {fc("t2t")}{loaded("t2t")} |']
  if peer:
    rows.append(f'| | HF | {peer["median_s"]:.3f} | {peer["min_s"]:.3f} | '
                f'{peer["tokens_per_s_median"]:.1f} | {peer["model_tflops_median"] * 1e3:.1f} | | | '
                f'{fc("peer")}{loaded("peer")} |')
  else:
    rows.append(f'| | HF | not run: {r.get("peer_error")} | | | | | | |')
  return rows


def table(result: dict[str, Any]) -> str:
  """A markdown table of one benchmark result (`all` or a single mode)."""
  m = result.get('machine', {})
  malloc = result.get('host_malloc') or next(
      (r.get('host_malloc') for r in result.get('results', {}).values()), None)
  cpu = machine.describe_cpu(m['cpu_identity']) if 'cpu_identity' in m else m.get('cpu')
  shapes = run_shapes(result)
  lines = [f'T5 v1.0 small, {shape_text(shapes)}, CPU, {result.get("threads")} threads, {cpu}, '
           f'{m.get("date_utc")}; '
           f'load average at start {_fmt((m.get("loadavg_at_start") or [None])[0])} on '
           f'{m.get("cores")} cores' + (
               f'; host malloc: t2t {"retain" if malloc["t2t_retains_freed_memory"] else "system"}'
               f', peer {malloc["peer"]}' if malloc else '')
           + ('; MEASURED ON A LOADED MACHINE: not a result' if result.get('loaded') else ''),
           '',
           f'| run | side | median s | min s | tokens/s | model GFLOP/s | % {_roof_name(result)} roof '
           '| HF/t2t speed-up'
           ' | other processes\' cores |',
           '|---|---|---|---|---|---|---|---|---|']
  if result['mode'] == 'all':
    roof = result['matmul_roof']['roof_gflops']
    for name, r in result['results'].items():
      lines += _rows(name, r, roof)
    lines += ['', f'{_roof_name(result)} matmul roof (jax, 2048^3, best): {roof:.1f} GFLOP/s; '
              f'precision {result.get("precision", "fp32")}; train compile + first '
              f'step {result["results"]["train"]["t2t"]["compile_and_first_s"]:.1f} s'
              + _init(result["results"]["train"]["t2t"]) + _warm(result["results"]["train"]["t2t"]),
              '',
              '| target | goal | measured | met |', '|---|---|---|---|']
    for t in result['targets'].values():
      met = {True: 'yes', False: 'NO', None: '-'}[t['met']]
      lines.append(f'| {t["what"]} | {t["target"]} | {_fmt(t["measured"])} | {met} |')
    if shapes != ISSUE_SHAPES:   # an `all` run has all four
      lines += ['', f'(The issue sets its targets at {shape_text(ISSUE_SHAPES)}; this run is at '
                f'{shape_text(shapes)}.)']
  else:
    name = result['mode'] + (f' beams={result["shapes"].get("beams")}' if result['mode'] == 'decode'
                             else '')
    if result['t2t'].get('model_parallel', 1) > 1:
      name += f', t2t model-parallel {result["t2t"]["model_parallel"]}'
    lines += _rows(name, result, None)
  return '\n'.join(lines)
