"""Distribution over restarts: each target's seeds, with and without intermediate training
(Phang et al. 2018, STILTs Fig. 1: a strip of the random restarts per task).

  python -m t2t.reports.distribution --results=<root>/results.jsonl --out=docs/figures/x

One group per target (`--group_axis`), one box and strip of seeds per intermediate task
(`--hue_axis`); degenerate runs (t2t.restarts) are drawn hollow, and seeds whose cell failed are
counted 'missing' and drawn as a grey 'x' under the axis.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

from t2t.reports import common


def compute(rows: Sequence[dict[str, Any]], group_axis: str, hue_axis: str, metric: str
            ) -> dict[str, Any]:
  """{'groups', 'hues', 'runs': {(group, hue): [(seed, value or None, degenerate)]}}."""
  common.check_axes_covered(rows, [group_axis, hue_axis])
  groups = [common.label(v) for v in common.axis_values(rows, group_axis)]
  hues = [common.label(v) for v in common.axis_values(rows, hue_axis)]
  runs: dict[tuple[str, str], list[tuple[int, float | None, bool]]] = {
      (g, h): [] for g in groups for h in hues}
  for row in rows:
    key = (common.label(row["bindings"][group_axis]), common.label(row["bindings"][hue_axis]))
    value = common.metric_value(row, metric)
    runs[key].append((row["seed"], value, bool(row.get("degenerate"))))
  return {"groups": groups, "hues": hues, "runs": runs}


def markdown(d: dict[str, Any], metric: str, group_axis: str, hue_axis: str, title: str) -> str:
  lines = [f"## {title}", "", f"{metric} per seed (* degenerate run, n/a: the cell failed).", "",
           f"| {group_axis} | {hue_axis} | seeds | mean ± std | min | max | missing | "
           "degenerate |", "|---|---|---|---|---|---|---|---|"]
  for g in d["groups"]:
    for h in d["hues"]:
      runs = d["runs"][(g, h)]
      done = [v for _, v, _ in runs if v is not None]
      mean, std = common.mean_std(done)
      per_seed = ", ".join(f"{s}: {common.fmt(v)}{'*' if bad and v is not None else ''}"
                           for s, v, bad in runs) or common.MISSING
      spread = common.MISSING if mean is None else f"{mean:.1f} ± {std:.1f}"
      lines.append(f"| {g} | {h} | {per_seed} | {spread} | "
                   f"{common.fmt(min(done) if done else None)} | "
                   f"{common.fmt(max(done) if done else None)} | "
                   f"{len(runs) - len(done)}/{len(runs)} | "
                   f"{sum(bad for _, v, bad in runs if v is not None)} |")
  return "\n".join(lines) + "\n"


def figure(d: dict[str, Any], metric: str, group_axis: str, hue_axis: str, title: str):
  plt = common.pyplot()
  groups, hues = d["groups"], d["hues"]
  width = 0.8 / len(hues)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  fig, ax = plt.subplots(figsize=(1.5 + 1.8 * len(groups), 3.6))
  any_missing = False
  for i, g in enumerate(groups):
    for j, h in enumerate(hues):
      x = i - 0.4 + width * (j + 0.5)
      runs = d["runs"][(g, h)]
      done = [v for _, v, _ in runs if v is not None]
      color = colors[j % len(colors)]
      if done:
        ax.boxplot([done], positions=[x], widths=width * 0.8, showfliers=False,
                   medianprops={"color": color}, boxprops={"color": color},
                   whiskerprops={"color": color}, capprops={"color": color})
      for k, (_, v, bad) in enumerate(runs):
        jitter = (k - (len(runs) - 1) / 2) * width * 0.15
        if v is None:
          any_missing = True
          ax.plot(x + jitter, 0.02, "x", color="grey", transform=ax.get_xaxis_transform(),
                  clip_on=False)
        else:
          ax.plot(x + jitter, v, "o", markeredgecolor=color,
                  markerfacecolor="none" if bad else color)
      if not runs or not done:
        ax.text(x, 0.5, common.MISSING, ha="center", transform=ax.get_xaxis_transform(),
                rotation=90, color="grey")
  for j, h in enumerate(hues):
    ax.plot([], [], "o", color=colors[j % len(colors)], label=f"{hue_axis}={h}")
  ax.plot([], [], "o", markerfacecolor="none", markeredgecolor="black", label="degenerate")
  if any_missing:
    ax.plot([], [], "x", color="grey", label="missing (failed)")
  ax.set_xticks(range(len(groups)), groups)
  ax.set_xlim(-0.6, len(groups) - 0.4)
  ax.set_xlabel(group_axis)
  ax.set_ylabel(metric)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=8, loc="best")
  return fig


def main(argv: Sequence[str]) -> int:
  p = common.parser(__doc__.split("\n")[0])
  p.add_argument("--group_axis", default="TARGET")
  p.add_argument("--hue_axis", default="INTERMEDIATE")
  args = p.parse_args(list(argv))
  rows = common.filter_rows(common.load_results(args.results), args.where)
  d = compute(rows, args.group_axis, args.hue_axis, args.metric)
  title = args.title or f"{args.metric} over restarts"
  png, md = common.write_outputs(
      args.out, figure(d, args.metric, args.group_axis, args.hue_axis, title),
      markdown(d, args.metric, args.group_axis, args.hue_axis, title))
  print(f"wrote {png} and {md}")
  return 0


if __name__ == "__main__":
  sys.exit(common.cli(main, sys.argv[1:]))
