r"""Grids of runs: `python -m t2t.experiment --gin_file=experiments/grids/<grid>.gin`.

A grid declares gin macros and the values each takes, and seeds; every combination is a *cell*,
one `t2t.phases` chain (the cell's gin files, e.g. an intermediate phase then a target phase
evaluated on validation) run with the cell's macro values bound, in its own directory:

  <root>/grid.json                the grid's spec (axes, seeds, gin files, bindings) and its id
  <root>/cells/<cell>/cell_spec.json   what the cell runs; <cell>/log.txt its output
  <root>/cells/<cell>/phases/<phase>/  the t2t.phases chain (train, eval/metrics.json, ...)
  <root>/cells/<cell>/cell.json   the cell's result: status ok / failed, wall time, metrics
  <root>/results.jsonl, results.csv    one row per cell: bindings, seed, status, wall, metrics

Each axis value is bound both in the cell's t2t.phases configuration (where a Phase can use it,
e.g. `target/Phase.bindings = {'LIMITED_TASK': %TARGET}`, or `intermediate/Phase.enabled =
%INTERMEDIATE` with INTERMEDIATE = None for the baseline without intermediate training) and in
every phase's train and eval command (where the run's own gin files use it, e.g. LEARNING_RATE
or DROPOUT_RATE); the seed is bound as SEED in every phase command (with recipes/limited_data.gin
the capped training subset is redrawn per seed, as in STILTs §4).

Resumable: run the same command again and finished cells are skipped, failed or interrupted
ones run again (their phases resume, t2t.phases). A root remembers its grid: a different grid
in the same root is refused with the difference named (use a new root). Cells run as
subprocesses, `max_parallel` at a time (default: half the host's cores, at least 1), with a
one-line status of cells done / running / failed and an ETA. A failed cell stays in the table
(status 'failed', the last lines of its log, no metrics) so the reports mark it missing.

The cell's metrics are those of the last evaluated phase of its chain (the mean over that
phase's runs when it has restarts); `phase_metrics` keeps every evaluated phase's.
"""
from __future__ import annotations

if __name__ == "__main__":
  from t2t import cli
  cli.run_module("t2t.experiment")

import csv
import difflib
import hashlib
import itertools
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Any, Iterable, Mapping, Sequence

import gin
from absl import flags

from t2t import phases as phases_lib
from t2t.training import reporting

GRID_FILE = "grid.json"
RESULTS_JSONL = "results.jsonl"
RESULTS_CSV = "results.csv"
CELL_SPEC = "cell_spec.json"
CELL_RESULT = "cell.json"
CHAIN_FILE = "chain.json"
LOG_FILE = "log.txt"
LOG_TAIL_LINES = 15

_MACRO = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEFINED = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", re.MULTILINE)
_REFERENCED = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)")
_INCLUDE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.MULTILINE)
_GIN_STRING = re.compile(r"""['"]([^'"\s]+\.gin)['"]""")

flags.DEFINE_integer("max_parallel", None, "Cells run at once (default: gin run_grid."
                     "max_parallel, else half the host's cores, at least 1).")
flags.DEFINE_string("run_cell", None, "Internal: run the cell in this directory (its "
                    "cell_spec.json) and exit; the grid launches each cell this way.")


class GridError(RuntimeError):
  """Some cells of a grid failed (the others ran; every cell is in the results table)."""


class GridMismatch(ValueError):
  """The root holds another grid's spec or results."""


def default_parallel() -> int:
  """What the host can spare: half its (usable) cores, at least 1 (1 on a 2-core machine)."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  return max(1, cores // 2)


def known_macros(gin_files: Sequence[str], search_paths: Sequence[str] = ()) -> set[str]:
  """Macros a cell's gin files can use: defined or referenced (`%X`) in them, in what they
  include, and in the gin files they name (a Phase's gin_files / eval_gin_files)."""
  from t2t import config
  paths = [*search_paths, *config.gin_search_paths()]
  found: set[str] = set()
  seen: set[str] = set()

  def visit(name: str, strict: bool) -> None:
    try:
      path = config.resolve_gin_file(name, paths)
    except config.GinConfigError:
      if strict:
        raise
      return
    if str(path) in seen:
      return
    seen.add(str(path))
    text = "\n".join(l.split("#", 1)[0] for l in path.read_text().splitlines())
    found.update(_DEFINED.findall(text))
    found.update(_REFERENCED.findall(text))
    for include in _INCLUDE.findall(text):
      visit(include, True)
    for named in _GIN_STRING.findall(text):
      visit(named, False)

  for f in gin_files:
    visit(f, True)
  return found


def check_axes(axes: Mapping[str, Sequence[Any]], gin_files: Sequence[str],
               search_paths: Sequence[str] = ()) -> None:
  """Refuses axes that are not a {macro: [values]} dict, and an axis that is not a macro of the
  cell's gin files (suggesting the closest)."""
  if not isinstance(axes, Mapping):
    raise ValueError(f"run_grid.axes must be a dict {{MACRO: [values]}}, e.g. {{'TARGET': "
                     f"['bbc_topic', 'bbc_same_topic']}}, got the {type(axes).__name__} "
                     f"{axes!r}.")
  if not axes:
    raise ValueError("run_grid.axes is empty: declare at least one {MACRO: [values]}.")
  macros = known_macros(gin_files, search_paths)
  for name, values in axes.items():
    if not _MACRO.match(name):
      raise ValueError(f"run_grid.axes: {name!r} is not a gin macro name; bind the parameter to "
                       f"a macro in the cell's gin file and vary the macro.")
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence) or not values:
      raise ValueError(f"run_grid.axes[{name!r}] must be a non-empty list of values, "
                       f"got {values!r}.")
    if name not in macros:
      close = difflib.get_close_matches(name, sorted(macros), n=1)
      hint = f" Did you mean {close[0]!r}?" if close else ""
      raise ValueError(f"run_grid.axes names macro {name!r}, which the cell's gin files "
                       f"({', '.join(gin_files)}) neither define nor use.{hint}")


def cell_name(bindings: Mapping[str, Any], seed: int) -> str:
  """A directory name for a cell, e.g. 'INTERMEDIATE=none,TARGET=bbc_topic,seed=0'."""
  parts = [f"{k}={_short(v)}" for k, v in bindings.items()] + [f"seed={seed}"]
  return re.sub(r"[^A-Za-z0-9_.=,+-]", "_", ",".join(parts))


def _short(value: Any) -> str:
  return "none" if value is None else str(value)


def grid_id(spec: Mapping[str, Any]) -> str:
  """A short hash of a grid's spec: rows of results.jsonl carry it."""
  return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _spec_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key), new.get(key)
    if a == b:
      continue
    if isinstance(a, dict) and isinstance(b, dict):
      for sub in sorted(set(a) | set(b)):
        if a.get(sub) != b.get(sub):
          out.append(f"{key}[{sub!r}]: stored {a.get(sub, '(absent)')!r}, now "
                     f"{b.get(sub, '(absent)')!r}")
    else:
      out.append(f"{key}: stored {a!r}, now {b!r}")
  return out


def cells_of(axes: Mapping[str, Sequence[Any]], seeds: Sequence[int]
             ) -> list[tuple[dict[str, Any], int]]:
  """Every (bindings, seed) of the grid, the first axis varying slowest, seeds fastest."""
  names = list(axes)
  return [(dict(zip(names, combo)), seed)
          for combo in itertools.product(*(axes[n] for n in names)) for seed in seeds]


def _binding(name: str, value: Any) -> str:
  return f"{name} = {value!r}"


def check_seeds(seeds: Sequence[int]) -> None:
  """Refuses seeds that are not a non-empty list of distinct integers (e.g. a bare `3`)."""
  if (isinstance(seeds, (str, bytes, Mapping)) or not isinstance(seeds, Sequence)
      or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)):
    raise ValueError(f"run_grid.seeds must be a list of integer seeds, e.g. [0, 1, 2] (one run "
                     f"of every cell per seed), got {seeds!r}.")
  if not seeds:
    raise ValueError("run_grid.seeds is empty: give at least one seed.")
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"run_grid.seeds repeats a seed: {list(seeds)}.")


@gin.configurable
def run_grid(root: str = gin.REQUIRED, cell_gin_files: Sequence[str] = gin.REQUIRED,
             axes: Mapping[str, Sequence[Any]] = gin.REQUIRED, seeds: Sequence[int] = (0,),
             bindings: Sequence[str] = (), phase_bindings: Sequence[str] = (),
             max_parallel: int | None = None, title: str = "Grid",
             search_paths: Sequence[str] = (), python: str = sys.executable,
             dry_run: bool = False, status_every_s: float = 30.0) -> list[dict[str, Any]]:
  """Runs every cell of the grid under `root`; returns the results rows (module docstring).

  Args:
    root: the grid's directory.
    cell_gin_files: gin files of one cell's t2t.phases chain (they declare run_phases.phases).
    axes: {macro: [values]}, e.g. {'INTERMEDIATE': [None, 'bbc_same_topic'], 'TARGET': [...]}.
    seeds: each combination runs once per seed (bound as SEED in every phase command).
    bindings: gin bindings for the cells' t2t.phases configuration, e.g. 'X = 1'.
    phase_bindings: gin bindings for every phase's train and eval command (e.g. a tiny model).
    max_parallel: cells run at once (None: `default_parallel()`).
    status_every_s: the status line is printed on every change and at least this often.
  """
  check_seeds(seeds)
  if max_parallel is not None and (isinstance(max_parallel, bool)
                                   or not isinstance(max_parallel, int) or max_parallel < 1):
    raise ValueError(f"run_grid.max_parallel (--max_parallel) must be an integer >= 1 (cells run "
                     f"at once), got {max_parallel!r}.")
  check_axes(axes, cell_gin_files, search_paths)
  spec = {"axes": {k: list(v) for k, v in axes.items()}, "seeds": list(seeds),
          "cell_gin_files": list(cell_gin_files), "bindings": list(bindings),
          "phase_bindings": list(phase_bindings)}
  gid = grid_id(spec)
  root = os.path.abspath(root)
  cells = cells_of(axes, seeds)
  names = [cell_name(b, s) for b, s in cells]
  if len(set(names)) != len(names):
    raise ValueError("Two cells of the grid get the same directory name; make the axis values "
                     "distinct as text.")
  parallel = max_parallel or default_parallel()
  if dry_run:
    for (b, s), name in zip(cells, names):
      command = _cell_command(python, os.path.join(root, "cells", name))
      reporting.announce(f"[{name}] $ {shlex.join(command)}")
    return []
  os.makedirs(root, exist_ok=True)
  _claim_root(root, spec, gid, title)

  todo = []
  for (b, s), name in zip(cells, names):
    cell_dir = os.path.join(root, "cells", name)
    result = _read_json(os.path.join(cell_dir, CELL_RESULT))
    if result.get("status") == "ok":
      continue
    os.makedirs(cell_dir, exist_ok=True)
    with open(os.path.join(cell_dir, CELL_SPEC), "w") as f:
      json.dump({"cell": name, "bindings": b, "seed": s,
                 "gin_files": list(cell_gin_files),
                 "gin_bindings": [*bindings, *(_binding(k, v) for k, v in b.items())],
                 "phase_bindings": [*phase_bindings, *(_binding(k, v) for k, v in b.items()),
                                    _binding("SEED", s)],
                 "search_paths": list(search_paths)}, f, indent=2)
    todo.append((name, cell_dir))
  reporting.announce(f"Grid {title!r} ({gid}): {len(cells)} cells, {len(cells) - len(todo)} done "
                     f"earlier, {len(todo)} to run, {parallel} at a time, in {root}")
  _schedule(todo, python, parallel, len(cells) - len(todo), len(cells), status_every_s)
  rows = write_results(root, gid, cells, names)
  failed = [r["cell"] for r in rows if r["status"] != "ok"]
  if failed:
    raise GridError(f"{len(failed)} of {len(rows)} cell(s) failed: {', '.join(failed)}. Their "
                    f"logs' last lines are in {os.path.join(root, RESULTS_JSONL)}; fix the cause "
                    "and run the same command again (finished cells are skipped).")
  return rows


def _claim_root(root: str, spec: Mapping[str, Any], gid: str, title: str) -> None:
  """Stores the grid's spec in `root`, or refuses when the root holds another grid."""
  path = os.path.join(root, GRID_FILE)
  stored = _read_json(path)
  if stored and stored.get("spec") != spec:
    diff = "; ".join(_spec_difference(stored.get("spec", {}), spec))
    raise GridMismatch(f"{root} holds another grid ({stored.get('id')}, {path}) than this one "
                       f"({gid}): {diff}. Use a new root, or delete {path} to adopt this grid "
                       "(finished cells whose directory names match are then kept).")
  results = os.path.join(root, RESULTS_JSONL)
  other = {r.get("grid") for r in read_jsonl(results)} - {gid}
  if other and not stored:
    raise GridMismatch(f"{results} holds results of grid {sorted(other)[0]}, not of this grid "
                       f"({gid}); use a new root.")
  with open(path + ".tmp", "w") as f:
    json.dump({"id": gid, "title": title, "spec": spec}, f, indent=2)
  os.replace(path + ".tmp", path)


def _cell_command(python: str, cell_dir: str) -> list[str]:
  return [python, "-m", "t2t.experiment", f"--run_cell={cell_dir}"]


def _schedule(todo: Sequence[tuple[str, str]], python: str, parallel: int, done_before: int,
              total: int, status_every_s: float) -> None:
  """Runs the cells as subprocesses, `parallel` at a time, printing a status line."""
  pending = list(todo)
  running: dict[str, tuple[subprocess.Popen, float, Any, str]] = {}
  done, failed, times = done_before, 0, []
  start, last_line, last_print = time.time(), "", 0.0
  try:
    while pending or running:
      while pending and len(running) < parallel:
        name, cell_dir = pending.pop(0)
        log = open(os.path.join(cell_dir, LOG_FILE), "w")
        cmd = _cell_command(python, cell_dir)
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        # Its own process group, so that stopping the grid stops the cell's train/eval too.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        running[name] = (proc, time.time(), log, cell_dir)
      for name in list(running):
        proc, t0, log, cell_dir = running[name]
        code = proc.poll()
        if code is None:
          continue
        log.close()
        del running[name]
        wall = time.time() - t0
        times.append(wall)
        ok = _finish_cell(cell_dir, code, wall)
        done += ok
        failed += not ok
        reporting.announce(f"[{name}] {'done' if ok else 'FAILED'} in {wall / 60:.1f} min")
      now = time.time()
      remaining = len(pending) + len(running)
      eta = None
      if times:  # whole cells left at the mean cell time, less what the running ones have done
        mean = sum(times) / len(times)
        ran = sum(min(now - r[1], mean) for r in running.values()) / parallel
        eta = max(0.0, math.ceil(remaining / parallel) * mean - ran)
      counts = (f"[grid] {done}/{total} done, {len(running)} running, {failed} failed, "
                f"{len(pending)} queued")
      if counts != last_line or now - last_print >= status_every_s:
        reporting.announce(f"{counts}, ETA {_clock(eta)}  (elapsed {_clock(now - start)})")
        last_line, last_print = counts, now
      if running:
        time.sleep(0.5)
  except BaseException:
    for proc, _, log, _ in running.values():  # only the cells this grid started
      _stop(proc)
      log.close()
    raise


def _stop(proc: subprocess.Popen) -> None:
  """Stops a cell and the train/eval processes it started (its process group)."""
  import signal
  try:
    os.killpg(proc.pid, signal.SIGTERM)
  except ProcessLookupError:
    pass
  try:
    proc.wait(timeout=30)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _clock(seconds: float | None) -> str:
  if seconds is None:
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _finish_cell(cell_dir: str, code: int, wall: float) -> bool:
  """Writes the cell's cell.json from its chain.json (ok) or its log's tail (failed)."""
  spec = _read_json(os.path.join(cell_dir, CELL_SPEC))
  previous = _read_json(os.path.join(cell_dir, CELL_RESULT))
  result: dict[str, Any] = {"cell": spec["cell"], "bindings": spec["bindings"],
                            "seed": spec["seed"],
                            "wall_s": previous.get("wall_s", 0.0) + wall}
  chain = _read_json(os.path.join(cell_dir, CHAIN_FILE))
  if code == 0 and chain:
    result.update(status="ok", **chain_metrics(chain))
  else:
    result.update(status="failed", exit_code=code, error=log_tail(cell_dir))
  with open(os.path.join(cell_dir, CELL_RESULT), "w") as f:
    json.dump(result, f, indent=2)
  return result["status"] == "ok"


def log_tail(cell_dir: str, lines: int = LOG_TAIL_LINES) -> str:
  path = os.path.join(cell_dir, LOG_FILE)
  if not os.path.exists(path):
    return f"(no log at {path})"
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:]).rstrip()


def chain_metrics(chain: Mapping[str, Any]) -> dict[str, Any]:
  """{'metrics': flat 'task/metric' of the last evaluated phase, 'phase_metrics': {phase: ...},
  'degenerate': [task, ...] of that phase's run(s), 'result_phase': its name}."""
  from t2t import restarts
  per_phase: dict[str, dict[str, float]] = {}
  degenerate: dict[str, list[str]] = {}
  for name, record in chain.items():
    runs = record.get("runs") or ([record] if "eval" in record else [])
    runs = [r for r in runs if "eval" in r]
    if not runs:
      continue
    flat = [_flatten(r["eval"]["metrics"]) for r in runs]
    per_phase[name] = {k: float(sum(f[k] for f in flat) / len(flat)) for k in flat[0]}
    bad = set()
    for r in runs:
      eval_dir = os.path.join(r["model_dir"], "eval")
      if os.path.isdir(eval_dir):
        bad |= {t for t, d in restarts.read_run(eval_dir)["degeneracy"].items() if d.degenerate}
    degenerate[name] = sorted(bad)
  if not per_phase:
    return {"metrics": {}, "phase_metrics": {}, "degenerate": [], "result_phase": None}
  last = list(per_phase)[-1]
  return {"metrics": per_phase[last], "phase_metrics": per_phase,
          "degenerate": degenerate[last], "result_phase": last}


def _flatten(metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
  return {f"{t}/{m}": float(v) for t, ms in metrics.items() for m, v in ms.items()}


def write_results(root: str, gid: str, cells: Sequence[tuple[dict[str, Any], int]],
                  names: Sequence[str]) -> list[dict[str, Any]]:
  """Writes results.jsonl and results.csv: one row per cell, never-run cells as 'missing'."""
  rows = []
  for (b, s), name in zip(cells, names):
    r = _read_json(os.path.join(root, "cells", name, CELL_RESULT))
    rows.append({"grid": gid, "cell": name, "status": r.get("status", "missing"),
                 "bindings": b, "seed": s, "wall_s": r.get("wall_s"),
                 "metrics": r.get("metrics", {}) if r.get("status") == "ok" else {},
                 "phase_metrics": r.get("phase_metrics", {}),
                 "degenerate": r.get("degenerate", []), "error": r.get("error"),
                 "dir": os.path.join(root, "cells", name)})
  path = os.path.join(root, RESULTS_JSONL)
  with open(path + ".tmp", "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  os.replace(path + ".tmp", path)
  axes = list(cells[0][0]) if cells else []
  metrics = sorted({m for r in rows for m in r["metrics"]})
  with open(os.path.join(root, RESULTS_CSV), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["cell", "status", *axes, "seed", "wall_s", *metrics, "degenerate", "error"])
    for r in rows:
      w.writerow([r["cell"], r["status"], *(_short(r["bindings"][a]) for a in axes), r["seed"],
                  "" if r["wall_s"] is None else f"{r['wall_s']:.1f}",
                  *(r["metrics"].get(m, "") for m in metrics), ";".join(r["degenerate"]),
                  (r["error"] or "").splitlines()[-1] if r["error"] else ""])
  return rows


def read_jsonl(path: str) -> list[dict[str, Any]]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def run_cell(cell_dir: str) -> dict[str, Any]:
  """Runs one cell's t2t.phases chain in this process (the grid's subprocess for a cell)."""
  from t2t import config
  spec = _read_json(os.path.join(cell_dir, CELL_SPEC))
  if not spec:
    raise FileNotFoundError(f"No {CELL_SPEC} in {cell_dir}: not a grid cell.")
  root = os.path.join(cell_dir, "phases")
  config.parse_gin(spec["gin_files"], [*spec["gin_bindings"], _binding("PHASES_ROOT", root)],
                   imports=("t2t.phases",), extra_search_paths=spec["search_paths"])
  reporting.announce(f"Cell {spec['cell']}: bindings {spec['bindings']}, seed {spec['seed']}")
  records = phases_lib.run_phases(root=root, extra_gin_bindings=spec["phase_bindings"],
                                  search_paths=spec["search_paths"])
  with open(os.path.join(cell_dir, CHAIN_FILE), "w") as f:
    json.dump(records, f, indent=2)
  return records


def main(argv: Iterable[str]) -> None:
  del argv
  from t2t import config
  fv = flags.FLAGS
  if fv.run_cell:
    run_cell(fv.run_cell)
    return
  if fv.max_parallel is not None and fv.max_parallel < 1:  # 0 used to mean the default
    raise ValueError(f"--max_parallel must be at least 1 (cells run at once), got "
                     f"{fv.max_parallel}.")
  import signal
  # `kill <grid pid>` stops the running cells too (the cleanup in _schedule).
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  config.parse_gin(fv.gin_file, fv.gin_bindings, imports=("t2t.experiment",),
                   extra_search_paths=fv.gin_search_path)
  kwargs = {"max_parallel": fv.max_parallel} if fv.max_parallel is not None else {}
  run_grid(search_paths=fv.gin_search_path, dry_run=fv.dry_run, **kwargs)
