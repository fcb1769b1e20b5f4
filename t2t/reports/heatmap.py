"""Transfer heatmap: the change a row's intermediate task makes on each target, over the same
target without intermediate training (Pruksachatkun et al. 2020, Fig. 2).

  python -m t2t.reports.heatmap --results=<root>/results.jsonl --out=docs/figures/stilts_heatmap

Each entry is mean over seeds (intermediate, target) minus mean over seeds (baseline, target),
the baseline being the row whose intermediate axis is `--baseline` (default 'none': the cell
without an intermediate phase), per target. A pair with no finished seed -- or whose target has
no finished baseline -- is 'n/a' (hatched in the figure).
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

from t2t.reports import common


def compute(rows: Sequence[dict[str, Any]], row_axis: str, col_axis: str, metric: str,
            baseline: str = "none") -> dict[str, Any]:
  """{'rows', 'cols', 'baseline': {col: mean}, 'mean': {(r, c): mean}, 'delta': {(r, c): ...},
  'n': {(r, c): finished seeds}, 'total': {(r, c): seeds}} with values as labels."""
  common.check_axes_covered(rows, [row_axis, col_axis])
  rvals = [common.label(v) for v in common.axis_values(rows, row_axis)]
  cvals = [common.label(v) for v in common.axis_values(rows, col_axis)]
  if baseline not in rvals:
    raise common.ReportError(f"No baseline {row_axis}={baseline!r} in the results; "
                             f"{row_axis} takes {rvals} (--baseline).")
  values: dict[tuple[str, str], list[float]] = {(r, c): [] for r in rvals for c in cvals}
  total = {k: 0 for k in values}
  for row in rows:
    key = (common.label(row["bindings"][row_axis]), common.label(row["bindings"][col_axis]))
    total[key] += 1
    v = common.metric_value(row, metric)
    if v is not None:
      values[key].append(v)
  mean = {k: common.mean_std(v)[0] for k, v in values.items()}
  base = {c: mean[(baseline, c)] for c in cvals}
  delta = {(r, c): (None if mean[(r, c)] is None or base[c] is None else mean[(r, c)] - base[c])
           for r in rvals for c in cvals}
  return {"rows": [r for r in rvals if r != baseline], "cols": cvals, "baseline": base,
          "baseline_label": baseline, "mean": mean, "delta": delta,
          "n": {k: len(v) for k, v in values.items()}, "total": total}


def markdown(h: dict[str, Any], metric: str, row_axis: str, title: str) -> str:
  cols = h["cols"]
  lines = [f"## {title}", "",
           f"Change in {metric} over the target without intermediate training "
           f"({row_axis}={h['baseline_label']}); mean over seeds (finished/total seeds).", "",
           f"| {row_axis} \\ target | " + " | ".join(cols) + " |",
           "|---|" + "---|" * len(cols)]
  b = h["baseline_label"]
  lines.append(f"| {b} (baseline, absolute) | " + " | ".join(
      f"{common.fmt(h['baseline'][c])} ({h['n'][(b, c)]}/{h['total'][(b, c)]})" for c in cols)
               + " |")
  for r in h["rows"]:
    lines.append(f"| {r} | " + " | ".join(
        f"{common.fmt(h['delta'][(r, c)], signed=True)} ({h['n'][(r, c)]}/{h['total'][(r, c)]})"
        for c in cols) + " |")
  return "\n".join(lines) + "\n"


def figure(h: dict[str, Any], metric: str, row_axis: str, col_axis: str, title: str):
  import numpy as np
  plt = common.pyplot()
  rows, cols = h["rows"], h["cols"]
  data = np.array([[np.nan if h["delta"][(r, c)] is None else h["delta"][(r, c)] for c in cols]
                   for r in rows], dtype=float).reshape(len(rows), len(cols))
  limit = float(np.nanmax(np.abs(data))) if np.isfinite(data).any() else 1.0
  fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(cols), 1.2 + 0.8 * max(1, len(rows))))
  image = ax.imshow(np.ma.masked_invalid(data), cmap="RdBu", vmin=-limit or -1,
                    vmax=limit or 1, aspect="auto")
  for i, r in enumerate(rows):
    for j, c in enumerate(cols):
      if np.isnan(data[i, j]):
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                   edgecolor="grey"))
        ax.text(j, i, common.MISSING, ha="center", va="center", color="black")
      else:
        ax.text(j, i, f"{data[i, j]:+.1f}", ha="center", va="center",
                color="white" if abs(data[i, j]) > 0.6 * limit else "black")
  ax.set_xticks(range(len(cols)), cols, rotation=20, ha="right")
  ax.set_yticks(range(len(rows)), rows)
  ax.set_xlabel(f"target ({col_axis})")
  ax.set_ylabel(f"intermediate ({row_axis})")
  ax.set_title(title, fontsize=10)
  fig.colorbar(image, ax=ax, label=f"Δ {metric} vs {h['baseline_label']}")
  return fig


def main(argv: Sequence[str]) -> int:
  p = common.parser(__doc__.split("\n")[0])
  p.add_argument("--row_axis", default="INTERMEDIATE")
  p.add_argument("--col_axis", default="TARGET")
  p.add_argument("--baseline", default="none", help="the row axis value of the baseline cells")
  args = p.parse_args(list(argv))
  rows = common.filter_rows(common.load_results(args.results), args.where)
  h = compute(rows, args.row_axis, args.col_axis, args.metric, args.baseline)
  title = args.title or f"Δ {args.metric}: intermediate x target"
  png, md = common.write_outputs(args.out, figure(h, args.metric, args.row_axis, args.col_axis,
                                                  title),
                                 markdown(h, args.metric, args.row_axis, title))
  print(f"wrote {png} and {md}")
  return 0


if __name__ == "__main__":
  sys.exit(common.cli(main, sys.argv[1:]))
