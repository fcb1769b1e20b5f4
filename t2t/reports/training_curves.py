"""Training curves: a scalar (default the training loss) against the step, one line per run,
read from the `metrics.jsonl` files t2t.train writes (t2t.training.reporting.MetricsWriter).

  python -m t2t.reports.training_curves --metrics_jsonl=<model dir>/metrics.jsonl ... \
    --out=docs/figures/training_curves
  python -m t2t.reports.training_curves --grid_root=<root> --out=...   (every run of a grid)

A run whose file is missing, empty or without the scalar is listed 'n/a' (and named in the
figure's legend), never dropped; a scalar that no run logs for the split (a typo, or another
split's) is an error that lists the scalars the files hold.
"""
from __future__ import annotations

import argparse
import difflib
import glob
import json
import os
import sys
from typing import Any, Sequence

from t2t.reports import common


def read_curve(path: str, scalar: str, split: str) -> list[tuple[int, float]]:
  """(step, value) of `scalar` in the `split` rows of one metrics.jsonl, in step order."""
  if not os.path.exists(path):
    return []
  points = {}
  with open(path) as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise common.ReportError(f"{path}:{n} is not JSON ({e}).") from e
      if row.get("split", split) == split and scalar in row:
        points[int(row["step"])] = float(row[scalar])  # a resumed run rewrites a step: keep last
  return sorted(points.items())


def logged_scalars(paths: Sequence[str]) -> dict[str | None, set[str]]:
  """{split: the scalars its rows hold} over the metrics.jsonl files `paths` (a missing file holds
  none; rows without a split, which every split reads, under None)."""
  found: dict[str | None, set[str]] = {}
  for path in paths:
    if not os.path.exists(path):
      continue
    with open(path) as f:
      for line in f:
        try:
          row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
          continue  # read_curve has named a bad line already
        if isinstance(row, dict):
          split = row.get("split")
          found.setdefault(None if split is None else str(split), set()).update(
              k for k in row if k not in ("step", "split"))
  return found


def check_scalar_logged(paths: Sequence[str], scalar: str, split: str) -> None:
  """Refuses a `scalar` that no `split` row of `paths` holds, listing the scalars they hold.

  Without this a misspelt --scalar gave a figure and a table of nothing but n/a. Files that are
  all missing or empty hold nothing to compare against: their runs stay n/a.
  """
  found = logged_scalars(paths)
  if not found or scalar in found.get(split, set()) | found.get(None, set()):
    return
  where = paths[0] if len(paths) == 1 else f"the {len(paths)} metrics.jsonl files"
  elsewhere = sorted(s for s, names in found.items() if s is not None and scalar in names)
  if elsewhere:
    raise common.ReportError(f"--scalar={scalar} is logged in {where} for split(s) "
                             f"{', '.join(elsewhere)}, not for --split={split}.")
  present = "; ".join(f"{s or '(rows without a split)'}: {', '.join(sorted(names)) or '(none)'}"
                      for s, names in sorted(found.items(), key=lambda kv: kv[0] or ""))
  close = difflib.get_close_matches(scalar, sorted(set().union(*found.values())), n=1)
  hint = f" Did you mean {close[0]!r}?" if close else ""
  raise common.ReportError(f"--scalar={scalar} is in no row of {where}.{hint} The scalars "
                           f"logged, per split: {present}.")


def grid_runs(root: str) -> list[str]:
  """Every metrics.jsonl under a grid root's cells (each phase, each restart)."""
  found = sorted(glob.glob(os.path.join(root, "cells", "*", "phases", "**", "metrics.jsonl"),
                           recursive=True))
  found = [p for p in found if os.sep + "eval" + os.sep not in p]
  if not found:
    raise common.ReportError(f"No metrics.jsonl under {os.path.join(root, 'cells')}: is "
                             f"{root} a t2t.experiment grid root?")
  return found


def _label(path: str, base: str | None) -> str:
  run = os.path.dirname(path)
  return os.path.relpath(run, base) if base else run


def markdown(curves: dict[str, list[tuple[int, float]]], scalar: str, title: str) -> str:
  lines = [f"## {title}", "", f"`{scalar}` per run (first / last logged step).", "",
           "| run | steps | first | last | min |", "|---|---|---|---|---|"]
  for name, pts in curves.items():
    if not pts:
      lines.append(f"| {name} | {common.MISSING} | {common.MISSING} | {common.MISSING} | "
                   f"{common.MISSING} |")
      continue
    lines.append(f"| {name} | {pts[0][0]}–{pts[-1][0]} | {pts[0][1]:.4f} | {pts[-1][1]:.4f} | "
                 f"{min(v for _, v in pts):.4f} |")
  return "\n".join(lines) + "\n"


def figure(curves: dict[str, list[tuple[int, float]]], scalar: str, title: str, logy: bool):
  plt = common.pyplot()
  fig, ax = plt.subplots(figsize=(6.0, 3.8))
  for name, pts in curves.items():
    if pts:
      ax.plot([s for s, _ in pts], [v for _, v in pts], label=name)
    else:
      ax.plot([], [], linestyle="none", marker="x", color="grey", label=f"{name}: n/a")
  if logy and all(v > 0 for pts in curves.values() for _, v in pts):
    ax.set_yscale("log")
  ax.set_xlabel("step")
  ax.set_ylabel(scalar)
  ax.set_title(title, fontsize=10)
  ax.legend(fontsize=6, loc="best")
  return fig


def main(argv: Sequence[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--metrics_jsonl", action="append", default=[], help="a run's metrics.jsonl")
  p.add_argument("--grid_root", default=None, help="every run of a t2t.experiment grid")
  p.add_argument("--scalar", default="loss")
  p.add_argument("--split", default="train")
  p.add_argument("--out", required=True, help="output path without extension")
  p.add_argument("--title", default=None)
  p.add_argument("--logy", action="store_true")
  args = p.parse_args(list(argv))
  paths = list(args.metrics_jsonl) + (grid_runs(args.grid_root) if args.grid_root else [])
  if not paths:
    raise common.ReportError("Give --metrics_jsonl=<run>/metrics.jsonl (repeatable) or "
                             "--grid_root=<grid root>.")
  base = os.path.join(args.grid_root, "cells") if args.grid_root else None
  curves: dict[str, Any] = {}
  for path in paths:
    curves[_label(path, base if path not in args.metrics_jsonl else None)] = read_curve(
        path, args.scalar, args.split)
  if not any(curves.values()):
    check_scalar_logged(paths, args.scalar, args.split)
  title = args.title or f"{args.split} {args.scalar}"
  png, md = common.write_outputs(args.out, figure(curves, args.scalar, title, args.logy),
                                 markdown(curves, args.scalar, title))
  print(f"wrote {png} and {md}")
  return 0


if __name__ == "__main__":
  sys.exit(common.cli(main, sys.argv[1:]))
