r"""Transfer studies: rows of phase chains, each ending in restarts, summarised as one table.

`python -m t2t.study --gin_file=experiments/transfer_study/bbc_topic_200.gin \
    --gin.STUDY_ROOT=/tmp/t2t/study`

A row is a chain of `t2t.phases.Phase`s (e.g. span-corruption pre-training, then bbc_topic
fine-tuning with 3 seeds). Every row runs under the same root, so a phase that several rows
share -- the same `Phase.name` -- runs once: later rows find its `phase.json` and start from its
checkpoint (the T5 pre-training feeds the fine-tuned, frozen, adapter, LoRA and STILTs rows).
The last phase of each row must have `seeds` and `eval_gin_files`; its `restarts.json`
(`t2t.restarts`: mean and std over the seeds, best of N, degenerate runs as in STILTs §4-5) is
the row's result.

Resumable like t2t.phases: run the command again and finished phases are skipped. The study
writes `<root>/study.json` (every row's restarts summary, chain and wall time) and a markdown
table, `<root>/study.md`, copied to `report_path` when set. A row's wall time is the time its own
phases took in the invocation that ran them; a shared phase counts for the first row using it.
"""
from __future__ import annotations

if __name__ == "__main__":
  from t2t import cli
  cli.run_module("t2t.study")

import os
import shlex
import shutil
import sys
import time
from typing import Any, Mapping, Sequence

import gin
from absl import flags

from t2t import phases as phases_lib
from t2t import json_records
from t2t.training import reporting

STUDY_FILE = "study.json"
TABLE_FILE = "study.md"


@gin.configurable
def run_study(root: str = gin.REQUIRED,
              rows: Mapping[str, Sequence[phases_lib.Phase]] = gin.REQUIRED,
              title: str = "Transfer study", report_path: str | None = None,
              only: Sequence[str] = (), command: str = "",
              extra_gin_bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
              dry_run: bool = False) -> dict[str, Any]:
  """Runs every row's chain under `root`; returns {row: record}. See the module docstring.

  `only` restricts the run to the named rows (the table still lists every finished row);
  `extra_gin_bindings` go to every phase's commands (`--phase_bindings`, e.g. for a smoke run).
  """
  unknown = [r for r in only if r not in rows]
  if unknown:
    raise ValueError(f"run_study.only names no row: {unknown}; rows: {list(rows)}.")
  for name, chain in rows.items():
    last = chain[-1] if chain else None
    if last is None or not last.seeds or not last.eval_gin_files:
      raise ValueError(f"Study row {name!r}: its last phase needs `seeds` and `eval_gin_files` "
                       "(the restarts that make the row's result).")
  root = os.path.abspath(root)
  os.makedirs(root, exist_ok=True)
  path = os.path.join(root, STUDY_FILE)
  study = _read(path)
  if not (only and study.get("command")):  # a partial rerun keeps the whole study's command
    study["command"] = command or study.get("command", "")
  study["title"] = title
  records = study.setdefault("rows", {})
  for name, chain in rows.items():
    if only and name not in only:
      continue
    reporting.announce(f"\n=== study row: {name} ===")
    runner = phases_lib.Runner(root, chain, extra_gin_bindings=extra_gin_bindings,
                               search_paths=search_paths, dry_run=dry_run)
    start = time.time()
    try:
      result = runner.run()
    except phases_lib.PhaseError as e:  # the other rows still run; this one is reported
      result = {"error": str(e)}
    elapsed = time.time() - start
    if dry_run:
      continue
    previous = records.get(name, {})
    records[name] = {
        "chain": [p.name for p in chain],
        # A resumed row keeps the time its phases took when they ran.
        "wall_s": previous.get("wall_s", 0.0) + elapsed,
    }
    if "error" in result:
      records[name]["error"] = result["error"]
    else:
      records[name]["restarts"] = result[chain[-1].name]["restarts"]
    _write(path, study)
  table = format_table(study, [n for n in rows if n in records])
  with open(os.path.join(root, TABLE_FILE), "w") as f:
    f.write(table)
  if report_path:
    os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
    shutil.copyfile(os.path.join(root, TABLE_FILE), report_path)
  reporting.announce("\n" + table)
  failed = [n for n in rows if "error" in records.get(n, {}) and (not only or n in only)]
  if failed:
    raise StudyError(f"{len(failed)} row(s) failed: {', '.join(failed)}. Their errors are in "
                     f"{path}; fix the cause and run the same command again (finished phases "
                     "are skipped).")
  return records


class StudyError(RuntimeError):
  """Some rows of a study failed (the others ran and are in the table)."""


def format_table(study: Mapping[str, Any], order: Sequence[str]) -> str:
  """Markdown: one line per row (mean +- std over seeds, each seed, best, degenerate runs)."""
  rows = study.get("rows", {})
  metric = next((rows[n]["restarts"]["metric"] for n in order if "restarts" in rows[n]), "metric")
  lines = [f"## {study.get('title', 'Transfer study')}", ""]
  if study.get("command"):
    lines += ["```", study["command"], "```", ""]
  lines += [f"| row | chain | {metric} mean ± std | per seed | best | degenerate | wall |",
            "|---|---|---|---|---|---|---|"]
  total = 0.0
  for name in order:
    r = rows[name]
    total += r["wall_s"]
    if "restarts" not in r:
      lines.append(f"| {name} | {' → '.join(r['chain'])} | failed (see study.json) | | | | "
                   f"{_minutes(r['wall_s'])} |")
      continue
    s = r["restarts"]
    seeds = ", ".join(f"{run['value']:.1f}" + ("*" if run["degenerate"] else "")
                      for run in s["runs"])
    lines.append(f"| {name} | {' → '.join(r['chain'])} | {s['mean']:.1f} ± {s['std']:.1f} | "
                 f"{seeds} | {s['best']:.1f} | {s['num_degenerate']}/{s['num_runs']} | "
                 f"{_minutes(r['wall_s'])} |")
  lines += ["", f"Wall time, all rows: {_minutes(total)}. Std is the sample standard deviation "
            "over seeds; * marks a degenerate run (t2t.restarts: all predictions one label, or "
            "accuracy not above the majority class)."]
  return "\n".join(lines) + "\n"


def _minutes(seconds: float) -> str:
  return f"{seconds / 60:.1f} min"


def _read(path: str) -> dict[str, Any]:
  """The study record at `path` ({} before the first row); a half-written one is refused."""
  if not os.path.exists(path):
    return {}
  study = json_records.read_json(
      path, "Delete it and run the study's command again (every row): finished phases are "
      "skipped and each row's result is read again from its runs (their wall times restart).")
  if not isinstance(study, dict) or not isinstance(study.get("rows", {}), dict):
    raise ValueError(f"{path} is not a study record (a JSON object with 'rows'). Delete it, or "
                     "choose another run_study.root.")
  return study


def _write(path: str, study: Mapping[str, Any]) -> None:
  json_records.write_json(path, study)


flags.DEFINE_multi_string("row", [], "Run only this row (repeatable); default: every row.")


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import config
  fv = flags.FLAGS
  config.parse_gin(fv.gin_file, fv.gin_bindings, imports=("t2t.study",),
                   extra_search_paths=fv.gin_search_path)
  command = shlex.join(["python", "-m", "t2t.study", *sys.argv[1:]])
  run_study(only=fv.row, command=command, extra_gin_bindings=fv.phase_bindings,
            search_paths=fv.gin_search_path, dry_run=fv.dry_run)
