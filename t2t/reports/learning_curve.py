"""Learning curve: a metric against a numeric axis, e.g. the training-set size (TRAIN_EXAMPLES),
mean ± std over seeds, one line per value of an optional `--hue` axis (e.g. with and without
intermediate training; Phang et al. 2018 §4, limited-data settings).

  python -m t2t.reports.learning_curve --results=<root>/results.jsonl --x=TRAIN_EXAMPLES \
    --out=docs/figures/learning_curve

A point with no finished seed is 'n/a' in the table and a grey 'x' under the axis.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

from t2t.reports import common


def compute(rows: Sequence[dict[str, Any]], x_axis: str, hue_axis: str | None, metric: str
            ) -> dict[str, Any]:
  """{'xs': sorted numbers, 'hues', 'points': {(x, hue): (mean, std, finished, total)}}."""
  common.check_axes_covered(rows, [x_axis] + ([hue_axis] if hue_axis else []))
  xs = common.axis_values(rows, x_axis)
  bad = [x for x in xs if not isinstance(x, (int, float)) or isinstance(x, bool)]
  if bad:
    raise common.ReportError(f"Axis {x_axis!r} has non-numeric values {bad}; a curve needs "
                             "numbers on x.")
  xs = sorted(xs)
  hues = [common.label(v) for v in common.axis_values(rows, hue_axis)] if hue_axis else ["all"]
  values: dict[tuple[Any, str], list[float]] = {(x, h): [] for x in xs for h in hues}
  total = {k: 0 for k in values}
  for row in rows:
    key = (row["bindings"][x_axis], common.label(row["bindings"][hue_axis]) if hue_axis else "all")
    total[key] += 1
    v = common.metric_value(row, metric)
    if v is not None:
      values[key].append(v)
  points = {k: (*common.mean_std(v), len(v), total[k]) for k, v in values.items()}
  return {"xs": xs, "hues": hues, "points": points}


def markdown(c: dict[str, Any], metric: str, x_axis: str, hue_axis: str | None,
             title: str) -> str:
  hues = c["hues"]
  head = [f"{hue_axis}={h}" for h in hues] if hue_axis else [metric]
  lines = [f"## {title}", "", f"{metric}: mean ± std over seeds (finished/total seeds).", "",
           f"| {x_axis} | " + " | ".join(head) + " |", "|---|" + "---|" * len(hues)]
  for x in c["xs"]:
    cells = []
    for h in hues:
      mean, std, n, total = c["points"][(x, h)]
      cells.append(common.MISSING + f" (0/{total})" if mean is None
                   else f"{mean:.1f} ± {std:.1f} ({n}/{total})")
    lines.append(f"| {x} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def figure(c: dict[str, Any], metric: str, x_axis: str, hue_axis: str | None, title: str,
           logx: bool = True):
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(5.0, 3.6))
  missing = False
  for h in c["hues"]:
    pts = [(x, *c["points"][(x, h)][:2]) for x in c["xs"]]
    done = [(x, m, s) for x, m, s in pts if m is not None]
    label = f"{hue_axis}={h}" if hue_axis else metric
    if done:
      ax.errorbar([p[0] for p in done], [p[1] for p in done], yerr=[p[2] for p in done],
                  marker="o", capsize=3, label=label)
    for x, m, _ in pts:
      if m is None:
        missing = True
        ax.plot(x, 0.02, "x", color="grey", transform=ax.get_xaxis_transform(), clip_on=False)
  if missing:
    ax.plot([], [], "x", color="grey", label="n/a (no finished seed)")
  if logx and all(x > 0 for x in c["xs"]):
    ax.set_xscale("log")
  ax.set_xticks(c["xs"], [str(x) for x in c["xs"]])
  ax.minorticks_off()
  ax.set_xlabel(x_axis)
  ax.set_ylabel(metric)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8)
  return fig


def run(argv: Sequence[str], default_x: str | None, doc: str, default_title: str) -> int:
  """The command line of a curve report (this module and t2t.reports.mixing)."""
  p = common.parser(doc.split("\n")[0])
  p.add_argument("--x", default=default_x, required=default_x is None, help="the numeric axis")
  p.add_argument("--hue", default=None, help="an axis drawn as one line per value")
  p.add_argument("--linear_x", action="store_true", help="a linear x axis (default: log)")
  args = p.parse_args(list(argv))
  rows = common.filter_rows(common.load_results(args.results), args.where)
  c = compute(rows, args.x, args.hue, args.metric)
  title = args.title or default_title.format(metric=args.metric, x=args.x)
  png, md = common.write_outputs(
      args.out, figure(c, args.metric, args.x, args.hue, title, logx=not args.linear_x),
      markdown(c, args.metric, args.x, args.hue, title))
  print(f"wrote {png} and {md}")
  return 0


def main(argv: Sequence[str]) -> int:
  return run(argv, "TRAIN_EXAMPLES", __doc__, "{metric} vs training-set size ({x})")


if __name__ == "__main__":
  sys.exit(common.cli(main, sys.argv[1:]))
