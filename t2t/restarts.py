r"""Random restarts: best of N on validation, mean and spread, and degenerate runs (STILTs §4-5).

Phang et al. fine-tune small targets with 20 random restarts (the limited-data subsample redrawn
for each), report the best run on validation, and count *degenerate* runs -- "performance
outliers that are close to random guessing", fewer after intermediate training. Wang et al.
report the spread (std 0.2-0.5 GLUE points over 5 seeds).

This module reads what `t2t.eval` writes in each run's output directory -- `metrics.json` and
`<task>.<split>.predictions.jsonl` -- so an experiment grid can reuse it on any set of runs:

  python -m t2t.restarts --metric=bbc_topic/accuracy /tmp/stilts/target/seed_*/eval

A run is flagged degenerate on a task when its predictions all take one value (while the
targets do not), or when its accuracy is not above the majority-class rate of the validation
targets (what always answering the most frequent label scores).
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import json
import os
import sys
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from t2t import json_records


@dataclasses.dataclass(frozen=True)
class Degeneracy:
  """Chance-level diagnostics of one run's predictions on one task."""
  accuracy: float          # percent of predictions equal to the target
  majority_rate: float     # percent of the most frequent target
  num_predicted: int       # distinct predictions
  reasons: tuple[str, ...]

  @property
  def degenerate(self) -> bool:
    return bool(self.reasons)


def degeneracy(rows: Sequence[Mapping[str, Any]]) -> Degeneracy:
  """Checks predictions rows ({'target', 'prediction', optional 'postprocessed'})."""
  if not rows:
    raise ValueError("No predictions to check for degenerate runs.")
  targets = [str(r["target"]) for r in rows]
  predictions = [str(r["postprocessed"] if r.get("postprocessed") is not None
                     else r["prediction"]) for r in rows]
  accuracy = 100.0 * float(np.mean([p == t for p, t in zip(predictions, targets)]))
  majority = 100.0 * collections.Counter(targets).most_common(1)[0][1] / len(targets)
  reasons = []
  if len(set(predictions)) == 1 and len(set(targets)) > 1:
    reasons.append(f"predicts one value ({predictions[0]!r}) for every example")
  if accuracy <= majority:
    reasons.append(f"accuracy {accuracy:.1f} is not above the majority-class rate {majority:.1f}")
  return Degeneracy(accuracy=accuracy, majority_rate=majority,
                    num_predicted=len(set(predictions)), reasons=tuple(reasons))


def _eval_advice(eval_dir: str) -> str:
  return (f"Rerun t2t.eval with EVAL_OUTPUT_DIR={eval_dir} to write it again (in a t2t.phases "
          "chain: delete the run's phase.json and run the chain's command again).")


def read_run(eval_dir: str) -> dict[str, Any]:
  """{'metrics': {task: {metric: value}}, 'degeneracy': {task: Degeneracy}} of one eval dir."""
  path = os.path.join(eval_dir, "metrics.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No metrics.json in {eval_dir}: run t2t.eval there first.")
  report = json_records.read_json(path, _eval_advice(eval_dir))
  if not isinstance(report, dict) or not isinstance(report.get("metrics"), dict):
    raise ValueError(f"{path} holds no 'metrics' mapping: is it t2t.eval's metrics.json? "
                     + _eval_advice(eval_dir))
  found = {}
  for pred_path in sorted(glob.glob(os.path.join(eval_dir, "*.predictions.jsonl"))):
    task = os.path.basename(pred_path).split(".")[0]
    rows = []
    with open(pred_path) as f:
      for number, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{pred_path}:{number} is not valid JSON ({e.msg}: column "
                           f"{e.colno}): a half-written file? {_eval_advice(eval_dir)}") from None
    if rows:
      found[task] = degeneracy(rows)
  return {"metrics": report["metrics"], "step": report.get("step"), "degeneracy": found}


def _value(metrics: Mapping[str, Mapping[str, float]], metric: str | None) -> tuple[str, float]:
  names = [f"{t}/{m}" for t in sorted(metrics) for m in sorted(metrics[t])]
  metric = metric or (names[0] if names else None)
  if metric not in names:
    raise ValueError(f"Metric {metric!r} is not in the eval results; they have: "
                     f"{', '.join(names)}. Name it as 'task/metric'.")
  task, name = metric.split("/", 1)
  return metric, float(metrics[task][name])


def summarize(runs: Mapping[str, str], metric: str | None = None,
              higher_is_better: bool = True) -> dict[str, Any]:
  """Summary of restarts: {label: eval dir} -> best, mean, std, degenerate runs.

  `std` is the sample standard deviation (ddof 1; 0 for one run). The mean and std are also
  given over the non-degenerate runs alone.
  """
  if not runs:
    raise ValueError("No runs to summarize.")
  rows = []
  for label, eval_dir in runs.items():
    run = read_run(eval_dir)
    metric, value = _value(run["metrics"], metric)
    task = metric.split("/", 1)[0]
    deg = run["degeneracy"].get(task)
    rows.append({"run": label, "eval_dir": eval_dir, "value": value, "step": run["step"],
                 "degenerate": list(deg.reasons) if deg else [],
                 "majority_rate": deg.majority_rate if deg else None})
  values = np.array([r["value"] for r in rows])
  healthy = np.array([r["value"] for r in rows if not r["degenerate"]])
  best = (max if higher_is_better else min)(rows, key=lambda r: r["value"])
  std = lambda v: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0
  return {"metric": metric, "higher_is_better": higher_is_better, "num_runs": len(rows),
          "best_run": best["run"], "best": best["value"], "best_eval_dir": best["eval_dir"],
          "mean": float(values.mean()), "std": std(values),
          "num_degenerate": int(sum(bool(r["degenerate"]) for r in rows)),
          "mean_non_degenerate": float(healthy.mean()) if len(healthy) else None,
          "std_non_degenerate": std(healthy) if len(healthy) else None,
          "runs": rows}


def format_summary(summary: Mapping[str, Any]) -> str:
  """A small table: one line per run, then best / mean +- std / degenerate count."""
  width = max([16, *(len(str(r["run"])) for r in summary["runs"])])  # long paths stay aligned
  lines = [f"{'run':<{width}} {summary['metric']:>22}  degenerate"]
  for r in summary["runs"]:
    lines.append(f"{r['run']:<{width}} {r['value']:>22.2f}  {'; '.join(r['degenerate']) or '-'}")
  lines.append(f"best {summary['best_run']}: {summary['best']:.2f}   mean {summary['mean']:.2f} "
               f"+- {summary['std']:.2f} over {summary['num_runs']} runs   "
               f"degenerate {summary['num_degenerate']}/{summary['num_runs']}")
  return "\n".join(lines)


def main(argv: Iterable[str]) -> int:
  import argparse
  parser = argparse.ArgumentParser(prog="python -m t2t.restarts", description=__doc__.split(
      "\n")[0])
  parser.add_argument("eval_dirs", nargs="+", help="t2t.eval output directories, one per run")
  parser.add_argument("--metric", default=None, help="'task/metric' (default: the first)")
  parser.add_argument("--lower_is_better", action="store_true")
  parser.add_argument("--output", default=None, help="also write the summary as JSON here")
  args = parser.parse_args(list(argv))
  try:
    if args.output:
      check_output(args.output)
    summary = summarize({d: d for d in args.eval_dirs}, args.metric, not args.lower_is_better)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(format_summary(summary))
  if args.output:
    with open(args.output, "w") as f:
      json.dump(summary, f, indent=2)
  return 0


def check_output(path: str) -> None:
  """Refuses an --output the summary cannot be written to (checked before reading the runs)."""
  if os.path.isdir(path):
    raise ValueError(f"--output={path} is a directory; give a file path for the JSON summary, "
                     f"e.g. {os.path.join(path, 'restarts.json')}.")
  parent = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(parent):
    raise FileNotFoundError(f"--output={path}: its directory {parent} does not exist.")


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
