"""Many `t5_small_cpu all` runs summarised target by target, per processor and precision.

    python -m benchmarks.summary benchmarks/results/2026-11-30_t5_small_cpu_all_fp32_zen3_run*.json
    python -m benchmarks.summary FILES... --json          # the same numbers as JSON
    python -m benchmarks.summary FILES... --plot FIG.png  # and a figure: one dot per run

One run is worth little on a VM whose speed moves by 20-35% over an hour (README, Performance), so
the README states each target as the median of several runs' medians, their range, and in how many
runs it was met. This computes exactly that from the runs' JSON, grouped by processor (the JSON's
`machine.cpu_identity`) and precision, so the summary is regenerated rather than transcribed:
a markdown table with one column per group, or `--json`. `--plot` draws what the table condenses:
one panel per target, each run a dot (filled where it met the target), the groups' medians and the
threshold, so a reader sees how far a "9 of 11" is from the line and how much the VM spreads.

A run measured on a loaded machine (`loaded` in its JSON) is left out and named, unless
`--include-loaded`; a file that is not a `t5_small_cpu` result in `all` mode is refused by name.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Sequence

from benchmarks import report
from t2t.reports import common

# The targets' units in the table: ratios as 'x', the roof fraction as %, the cold start in s.
_FORMATS = {'train_speedup': '{:.2f}x', 'train_roof_fraction': '{:.0%}',
            'greedy_speedup': '{:.2f}x', 'beam4_speedup': '{:.2f}x',
            'compile_and_first_s': '{:.1f} s'}
# Each speed-up's two medians (t2t, the peer), in seconds.
_SIDES = {'train_speedup': 'train', 'greedy_speedup': 'greedy', 'beam4_speedup': 'beam4'}


class SummaryError(ValueError):
  """A file that cannot be summarised; the message names it."""


def load(path: str) -> dict[str, Any]:
  """One `t5_small_cpu all` result; SummaryError naming `path` otherwise."""
  try:
    with open(path) as f:
      result = json.load(f)
  except (OSError, json.JSONDecodeError) as e:
    raise SummaryError(f'{path}: cannot read it as JSON ({e}).') from None
  if result.get('benchmark') != 't5_small_cpu' or result.get('mode') != 'all':
    raise SummaryError(f'{path}: not a `python -m benchmarks.t5_small_cpu all` result '
                       f'(benchmark={result.get("benchmark")!r}, mode={result.get("mode")!r}).')
  if 'targets' not in result:
    raise SummaryError(f'{path}: has no `targets` (written before the benchmark recorded them).')
  return result


def group_key(result: dict[str, Any]) -> str:
  """'Zen 3, fp32': the processor's microarchitecture (or model name) and the run's precision,
  then its shapes where they are not the issue's ('Zen 3, fp32, batch 32, 128/8 -> 8'), so runs
  at different shapes are never summarised together."""
  identity = (result.get('machine') or {}).get('cpu_identity') or {}
  cpu = identity.get('microarchitecture') or identity.get('model_name') or 'unknown CPU'
  key = f'{cpu}, {result.get("precision", "fp32")}'
  shapes = report.run_shapes(result)
  return key if shapes == report.ISSUE_SHAPES else f'{key}, {report.shape_text(shapes)}'


def _spread(values: Sequence[float]) -> dict[str, float]:
  return dict(median=statistics.median(values), min=min(values), max=max(values))


def summarise(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
  """{group: {runs, dates, targets: {key: {median, min, max, met, of}}, seconds: ...}}.

  `results` maps each file's name to its JSON. A target's median is the median of the runs'
  measured values (each itself a median of steps); `met` counts the runs that met it.
  """
  groups: dict[str, list[tuple[str, dict[str, Any]]]] = {}
  for name, result in results.items():
    groups.setdefault(group_key(result), []).append((name, result))
  per_run = points(results)
  out = {}
  for key, runs in sorted(groups.items()):
    dates = sorted((r.get('machine') or {}).get('date_utc') or '' for _, r in runs)
    targets = {}
    for target, per_group in per_run.items():
      if key in per_group:
        values = per_group[key]
        targets[target] = dict(**_spread([v for v, _ in values]),
                               met=sum(met for _, met in values), of=len(values))
    seconds = {}
    for target, mode in _SIDES.items():
      for side in ('t2t', 'peer'):
        values = [r['results'][mode][side]['median_s'] for _, r in runs
                  if (r['results'].get(mode) or {}).get(side)]
        if values:
          seconds[f'{mode}_{side}'] = _spread(values)
    out[key] = dict(runs=[name for name, _ in runs], dates=[dates[0], dates[-1]],
                    targets=targets, seconds=seconds)
  return out


def _cell(target: str, stats: dict[str, Any] | None, seconds: dict[str, Any]) -> str:
  if stats is None:
    return 'not measured'
  fmt = _FORMATS[target]
  verdict = ('**met**' if stats['met'] == stats['of'] else
             '**not met**' if stats['met'] == 0 else f'**{stats["met"]} of {stats["of"]}**')
  text = (f'{verdict}: {fmt.format(stats["median"])} '
          f'[{fmt.format(stats["min"])} - {fmt.format(stats["max"])}]')
  mode = _SIDES.get(target)
  if mode and f'{mode}_t2t' in seconds and f'{mode}_peer' in seconds:
    text += (f' ({seconds[f"{mode}_t2t"]["median"]:.2f} s vs '
             f'{seconds[f"{mode}_peer"]["median"]:.2f} s)')
  return text


def markdown(summary: dict[str, Any]) -> str:
  """One row per target, one column per group: 'met: median [min - max] (t2t s vs peer s)'."""
  keys = list(summary)
  head = [f'{k}: {len(summary[k]["runs"])} run(s), {summary[k]["dates"][0][:16]} - '
          f'{summary[k]["dates"][1][:16]} UTC' for k in keys]
  lines = ['| target | ' + ' | '.join(head) + ' |', '|---|' + '---|' * len(keys)]
  for target, what, op, threshold in report.TARGETS:
    cells = [_cell(target, summary[k]['targets'].get(target), summary[k]['seconds'])
             for k in keys]
    lines.append(f'| {what} {op} {threshold} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def points(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[tuple[float, bool]]]]:
  """{target: {group: [(measured, met), ...]}}: each run's value of each target, runs in the order
  they were measured (`machine.date_utc`), groups sorted as `summarise` sorts them; runs that did
  not measure a target are left out."""
  by_group: dict[str, list[dict[str, Any]]] = {}
  for result in sorted(results.values(),
                       key=lambda r: (r.get('machine') or {}).get('date_utc') or ''):
    by_group.setdefault(group_key(result), []).append(result)
  out: dict[str, dict[str, list[tuple[float, bool]]]] = {}
  for target, *_ in report.TARGETS:
    out[target] = {}
    for key, runs in sorted(by_group.items()):
      values = [(r['targets'][target]['measured'], bool(r['targets'][target]['met']))
                for r in runs if r['targets'].get(target, {}).get('measured') is not None]
      if values:
        out[target][key] = values
  return out


def plot(results: dict[str, dict[str, Any]], path: str):
  """Writes the figure of `points(results)` to `path` (PNG by its extension); returns the Figure.

  Panel per target: x = group (processor, precision), one dot per run spread across its slot in
  the order the runs were measured (filled: met; hollow: missed), a black bar at the group's
  median, the target as a dashed line.
  """
  plt = common.pyplot()
  data = points(results)
  groups = sorted({g for per_group in data.values() for g in per_group})
  fig, axes = plt.subplots(1, len(report.TARGETS), figsize=(3.0 * len(report.TARGETS), 3.6))
  for ax, (target, _, op, threshold) in zip(axes, report.TARGETS):
    scale = 100.0 if target == 'train_roof_fraction' else 1.0
    for i, group in enumerate(groups):
      runs = data[target].get(group, [])
      if not runs:
        continue
      xs = [i + x for x in _spread_offsets(len(runs))]
      ys = [v * scale for v, _ in runs]
      edges = ['tab:green' if met else 'tab:red' for _, met in runs]
      faces = ['tab:green' if met else 'none' for _, met in runs]
      ax.scatter(xs, ys, s=22, facecolors=faces, edgecolors=edges, zorder=3)
      median = statistics.median(ys)
      ax.plot([i - 0.3, i + 0.3], [median, median], color='black', linewidth=2, zorder=2)
    ax.axhline(threshold * scale, color='grey', linestyle='--', linewidth=1, zorder=1,
               label=f'target {op} {threshold * scale:g}')
    ax.set_xticks(range(len(groups)), [g.replace(', ', '\n') for g in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_title(_PANEL_TITLES[target], fontsize=9)
    ax.legend(fontsize=7, loc='best')
    ax.grid(axis='y', alpha=0.3)
  fig.suptitle(f't5_small_cpu all: {sum(len(v) for v in data[report.TARGETS[0][0]].values())} '
               'runs, one dot each, left to right in time (filled: target met), bar: median', fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return fig


# Short panel titles with the unit of the y axis.
_PANEL_TITLES = {'train_speedup': 'train step: HF / t2t (x)',
                 'train_roof_fraction': 'train: % of the matmul roof',
                 'greedy_speedup': 'greedy: HF / t2t (x)',
                 'beam4_speedup': 'beam 4: HF / t2t (x)',
                 'compile_and_first_s': 'compile + first step (s)'}


def _spread_offsets(n: int) -> list[float]:
  """n x-offsets evenly across +-0.25 of a slot (0 for one run): dots side by side, no jitter."""
  return [0.0] if n == 1 else [-0.25 + 0.5 * k / (n - 1) for k in range(n)]


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('files', nargs='+', help='t5_small_cpu `all` result JSON files')
  ap.add_argument('--json', action='store_true', help='print the summary as JSON')
  ap.add_argument('--include-loaded', action='store_true',
                  help='keep runs measured on a loaded machine (left out by default)')
  ap.add_argument('--plot', metavar='PATH', help='also draw the runs target by target (a PNG)')
  args = ap.parse_args(argv)
  try:
    results = {path: load(path) for path in args.files}
  except SummaryError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  loaded = [p for p, r in results.items() if r.get('loaded')]
  if loaded and not args.include_loaded:
    print(f'leaving out {len(loaded)} run(s) measured on a loaded machine: {", ".join(loaded)} '
          '(--include-loaded keeps them)', file=sys.stderr)
    results = {p: r for p, r in results.items() if p not in loaded}
  if not results:
    print('error: no run left to summarise.', file=sys.stderr)
    return 2
  summary = summarise(results)
  print(json.dumps(summary, indent=1) if args.json else markdown(summary))
  if args.plot:
    plot(results, args.plot)
    print(f'wrote {args.plot}', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
