"""Shared plumbing of the reports: reading results.jsonl files, picking a metric, output files."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable, Iterable, Sequence

MISSING = "n/a"


class ReportError(ValueError):
  """Bad input to a report (a file, an axis, a metric); the message names the culprit."""


def load_results(paths: Sequence[str]) -> list[dict[str, Any]]:
  """The rows of one grid's results.jsonl file(s); files of different grids are refused."""
  if not paths:
    raise ReportError("No results file given (--results=<grid root>/results.jsonl).")
  rows: list[dict[str, Any]] = []
  grid_of: dict[str, str] = {}
  for path in paths:
    if not os.path.exists(path):
      raise ReportError(f"Results file {path} does not exist.")
    with open(path) as f:
      for n, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          row = json.loads(line)
        except json.JSONDecodeError as e:
          raise ReportError(f"{path}:{n} is not JSON ({e}).") from e
        for key in ("grid", "bindings", "seed", "status"):
          if key not in row:
            raise ReportError(f"{path}:{n} has no {key!r}: not a t2t.experiment results file.")
        for other_path, other in grid_of.items():
          if other != row["grid"]:
            raise ReportError(f"{path} holds results of grid {row['grid']}, {other_path} of grid "
                              f"{other}: one report reads one grid's results.")
        grid_of.setdefault(path, row["grid"])
        rows.append(row)
  if not rows:
    raise ReportError(f"No results in {', '.join(paths)}.")
  return rows


def label(value: Any) -> str:
  """An axis value as text: None (e.g. no intermediate task) reads 'none'."""
  return "none" if value is None else str(value)


def axis_values(rows: Sequence[dict[str, Any]], axis: str) -> list[Any]:
  """The values an axis takes, in the grid's order (first appearance)."""
  if axis not in rows[0]["bindings"]:
    raise ReportError(f"The results have no axis {axis!r}; their axes: "
                      f"{', '.join(rows[0]['bindings'])}.")
  out: list[Any] = []
  for r in rows:
    if r["bindings"][axis] not in out:
      out.append(r["bindings"][axis])
  return out


def filter_rows(rows: Sequence[dict[str, Any]], where: Iterable[str]) -> list[dict[str, Any]]:
  """Keeps the rows whose axis AXIS takes VALUE (as text), for each 'AXIS=VALUE' in `where`."""
  out = list(rows)
  for condition in where:
    axis, sep, value = condition.partition("=")
    if not sep:
      raise ReportError(f"--where {condition!r}: write it as AXIS=VALUE.")
    values = [label(v) for v in axis_values(out, axis)] if out else []
    if value not in values:
      raise ReportError(f"--where {condition!r}: axis {axis!r} takes {values}.")
    out = [r for r in out if label(r["bindings"][axis]) == value]
  return out


def check_axes_covered(rows: Sequence[dict[str, Any]], used: Sequence[str]) -> None:
  """Refuses rows that vary along an axis the report does not show (it would mix them)."""
  for axis in used:
    axis_values(rows, axis)  # names the axes there are when one is unknown
  for axis in rows[0]["bindings"]:
    if axis not in used and len(axis_values(rows, axis)) > 1:
      values = [label(v) for v in axis_values(rows, axis)]
      raise ReportError(f"The results also vary {axis!r} ({values}); pick one with --where "
                        f"{axis}=VALUE.")


def metric_value(row: dict[str, Any], metric: str) -> float | None:
  """The row's value of `metric` ('task/metric', or 'metric' when one task has it); None when
  the cell did not finish."""
  if row["status"] != "ok":
    return None
  metrics = row.get("metrics", {})
  if metric in metrics:
    return float(metrics[metric])
  matches = [k for k in metrics if k.split("/", 1)[-1] == metric]
  if len(matches) == 1:
    return float(metrics[matches[0]])
  raise ReportError(f"Cell {row.get('cell')}: metric {metric!r} "
                    f"{'is ambiguous' if matches else 'is not in its results'}; it has "
                    f"{', '.join(sorted(metrics)) or 'no metrics'}.")


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
  """Mean and sample standard deviation (ddof 1; 0 for one value); None, None for none."""
  if not values:
    return None, None
  mean = sum(values) / len(values)
  if len(values) == 1:
    return mean, 0.0
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def fmt(value: float | None, signed: bool = False, digits: int = 1) -> str:
  if value is None:
    return MISSING
  return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def pyplot():
  """matplotlib.pyplot on the Agg backend (files only, no display)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def write_outputs(out: str, fig: Any, markdown: str) -> tuple[str, str]:
  """Saves `<out>.png` and `<out>.md`; returns their paths."""
  out = out[:-4] if out.endswith((".png", ".md")) else out
  directory = os.path.dirname(os.path.abspath(out))
  os.makedirs(directory, exist_ok=True)
  png, md = out + ".png", out + ".md"
  fig.savefig(png, dpi=120, bbox_inches="tight")
  pyplot().close(fig)
  with open(md, "w") as f:
    f.write(markdown)
  return png, md


def parser(description: str) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description)
  p.add_argument("--results", action="append", default=[], required=True,
                 help="a grid's results.jsonl (t2t.experiment)")
  p.add_argument("--out", required=True, help="output path without extension: writes .png, .md")
  p.add_argument("--metric", default="accuracy", help="'task/metric', or 'metric' (default "
                 "accuracy) when each cell's result has one task with it")
  p.add_argument("--where", action="append", default=[], help="AXIS=VALUE: keep these cells")
  p.add_argument("--title", default=None)
  return p


def cli(main: Callable[[Sequence[str]], int], argv: Sequence[str]) -> int:
  """Runs a report's main, printing bad input as one line."""
  try:
    return main(argv)
  except ReportError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
