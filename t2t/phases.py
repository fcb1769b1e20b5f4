r"""Multi-phase runs (STILTs and friends): `python -m t2t.phases --gin_file=...`.

A chain of phases declared in one gin file, e.g. STILTs (Phang et al.): pre-trained model ->
intermediate labeled task -> target task; or jiant's multitask alternative: {intermediate,
target} jointly, then target only. Each phase is one `python -m t2t.train` run in its own
MODEL_DIR, `<root>/<phase name>`, with its own gin files and bindings (task, steps, learning
rate, ...) and a fresh optimizer, initialised from the previous phase's final checkpoint (its
`best/` one when the validation schedule kept one), optionally with a partial restore and a
fresh head; then, optionally, `python -m t2t.eval` into `<MODEL_DIR>/eval`.

Each phase runs in a subprocess, so no gin state leaks from one phase into the next, and every
command is printed in a form that can be pasted into a shell to redo that step by hand.

Resumable phase by phase: a phase whose `phase.json` exists is done and skipped; an interrupted
one is launched again and resumes from its own latest checkpoint. (Delete `phase.json`, or the
phase directory, to redo a phase after changing its configuration.)

Restarts: a phase with `seeds` runs once per seed in `<root>/<phase>/seed_<S>` (SEED bound to
S; with gin/recipes/limited_data.gin the capped training subset is redrawn per seed too), is
evaluated, and `<root>/<phase>/restarts.json` summarizes the runs (t2t.restarts: best of N on
validation, mean and std, degenerate runs); the next phase starts from the best run.

Example (gin/experiments/stilts_bbc.gin):

  python -m t2t.phases --gin_file=experiments/stilts_bbc.gin --gin.PHASES_ROOT=/tmp/t2t/stilts
"""
from __future__ import annotations

if __name__ == "__main__":
  # Run the importable module, so gin registers its configurables once (as t2t.phases.*).
  from t2t import cli
  cli.run_module("t2t.phases")

import dataclasses
import os
import shlex
import subprocess
import sys
from typing import Any, Mapping, Sequence

import gin
from absl import flags

from t2t import json_records, restarts
from t2t.training import reporting

DONE_FILE = "phase.json"
# Bindings of a phase that its evaluation needs too, when the phase sets them.
FORWARDED_TO_EVAL = ("MIXTURE_OR_TASK_NAME", "TASK_FEATURE_LENGTHS", "SEED")

flags.DEFINE_multi_string(
    "phase_bindings", [],
    "Gin bindings passed to every phase's train and eval command, e.g. 'BATCH_SIZE = 8'.")
flags.DEFINE_string("stop_after", None, "Stop after the phase of this name.")
flags.DEFINE_bool("dry_run", False, "Print the commands without running them.")


class PhaseError(RuntimeError):
  """A phase's subprocess failed; the message names the phase and the command."""


@gin.configurable
@dataclasses.dataclass
class Phase:
  """One phase of a chain (gin: `target/Phase.name = 'target'`, then `@target/Phase()`).

  Attributes:
    name: the phase's directory under the root, and its name in the log.
    gin_files: the train command's gin files (after the chain's common ones), e.g.
      ['experiments/bbc_demo/finetune.gin'].
    bindings: {gin name: value} for the train command (values are Python literals; a string
      starting with '@' or '%' is a gin reference, passed as it is).
    init_from: 'previous' (the previous phase's checkpoint; the first phase then starts as
      its gin files say), None (as its gin files say), or a checkpoint path. The checkpoint is
      passed as INITIAL_CHECKPOINT_PATH, so the gin files must use it (runs/finetune.gin does).
    partial_restore, reinitialize: t2t.train's `train.partial_restore` / `train.reinitialize`
      (e.g. ['head/.*'] for a fresh classifier head per phase).
    eval_gin_files: the eval command's gin files (after the common ones); empty: no eval.
    eval_bindings: {gin name: value} for the eval command, besides the phase's own
      MIXTURE_OR_TASK_NAME, TASK_FEATURE_LENGTHS and SEED, which are passed on.
    seeds: restarts, one run per seed (see the module docstring); empty: one run. Without
      eval_gin_files nothing ranks the restarts, and the next phase starts from the first.
    metric: 'task/metric' that picks the best restart (default: the first in metrics.json).
    enabled: a false value skips the phase (the next one starts from the phase before it). An
      experiment grid binds it to a macro, e.g. `intermediate/Phase.enabled = %INTERMEDIATE`
      with INTERMEDIATE = None for the cell without intermediate training (t2t.experiment).
  """
  name: str = gin.REQUIRED
  gin_files: Sequence[str] = ()
  bindings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  init_from: str | None = "previous"
  partial_restore: bool = False
  reinitialize: Sequence[str] = ()
  eval_gin_files: Sequence[str] = ()
  eval_bindings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  seeds: Sequence[int] = ()
  metric: str | None = None
  enabled: Any = True


def _gin_value(value: Any) -> str:
  """Gin text for a binding's value, as short as `--gin.X=V` allows (a bare word or path is
  quoted by t2t's flag parsing, so it is left bare where that gives back the same string)."""
  from t2t import config
  if isinstance(value, str):
    if value[:1] in ("@", "%"):
      return value
    if value and config.quote_if_bare(value) == repr(value):
      return value
  return repr(value)


def _binding_args(bindings: Mapping[str, Any]) -> list[str]:
  return [f"--gin.{k}={_gin_value(v)}" for k, v in bindings.items()]


def format_command(cmd: Sequence[str]) -> str:
  """A shell-pasteable rendering: `python -m <module>`, then one flag per line."""
  head, flags_ = cmd[:3], cmd[3:]
  return " \\\n    ".join([" ".join(shlex.quote(c) for c in head),
                             *(shlex.quote(c) for c in flags_)])


def checkpoint_of(model_dir: str) -> str:
  """The checkpoint a phase hands on: its best/ one when it kept one, else its latest."""
  best = os.path.join(model_dir, "best")
  return best if os.path.isdir(best) and os.listdir(best) else model_dir


@dataclasses.dataclass
class _Run:
  phase: Phase
  model_dir: str
  seed: int | None


class Runner:
  """Runs (or prints) a chain of phases under `root`; see the module docstring."""

  def __init__(self, root: str, phases: Sequence[Phase], gin_files: Sequence[str] = (),
               bindings: Mapping[str, Any] | None = None,
               extra_gin_bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
               python: str = sys.executable, dry_run: bool = False):
    names = [p.name for p in phases]
    if not phases:
      raise ValueError("run_phases.phases is empty: declare at least one @Phase().")
    if len(set(names)) != len(names):
      raise ValueError(f"Phase names must be distinct (they name directories): {names}.")
    self.root, self.phases = os.path.abspath(root), list(phases)
    self.gin_files, self.bindings = list(gin_files), dict(bindings or {})
    self.extra = [f"--gin_bindings={b}" for b in extra_gin_bindings]
    self.extra += [f"--gin_search_path={d}" for d in search_paths]
    self.python, self.dry_run = python, dry_run
    from t2t import config
    paths = [*search_paths, *config.gin_search_paths()]
    for f in {f for p in phases for f in [*p.gin_files, *p.eval_gin_files]} | set(gin_files):
      config.resolve_gin_file(f, paths)  # a typo fails now, not after an hour of phase 1

  def _common(self, files: Sequence[str], bindings: Mapping[str, Any]) -> list[str]:
    return ([f"--gin_file={f}" for f in [*self.gin_files, *files]]
            + _binding_args({**self.bindings, **bindings}) + self.extra)

  def train_command(self, run: _Run, init: str | None) -> list[str]:
    p = run.phase
    bindings = dict(p.bindings)
    if run.seed is not None:
      bindings["SEED"] = run.seed
    if init is not None:
      bindings["INITIAL_CHECKPOINT_PATH"] = init
    if p.partial_restore:
      bindings["train.partial_restore"] = True
    if p.reinitialize:
      bindings["train.reinitialize"] = list(p.reinitialize)
    bindings["MODEL_DIR"] = run.model_dir
    return [self.python, "-m", "t2t.train", *self._common(p.gin_files, bindings)]

  def eval_command(self, run: _Run) -> list[str]:
    p = run.phase
    bindings = {k: p.bindings[k] for k in FORWARDED_TO_EVAL if k in p.bindings}
    if run.seed is not None:
      bindings["SEED"] = run.seed
    bindings.update(p.eval_bindings)
    bindings["CHECKPOINT_PATH"] = checkpoint_of(run.model_dir)
    bindings["EVAL_OUTPUT_DIR"] = os.path.join(run.model_dir, "eval")
    return [self.python, "-m", "t2t.eval", *self._common(p.eval_gin_files, bindings)]

  def _execute(self, what: str, cmd: Sequence[str]) -> None:
    reporting.announce(f"\n[{what}]\n$ {format_command(cmd)}")
    if self.dry_run:
      return
    code = subprocess.call(list(cmd))
    if code != 0:
      raise PhaseError(f"{what} failed (exit code {code}). Fix the cause and run t2t.phases "
                       "again: finished phases are skipped and this one resumes.")

  def run(self, stop_after: str | None = None) -> dict[str, Any]:
    """Runs the chain; returns {phase name: its record (and restarts summary)}."""
    if stop_after is not None and stop_after not in [p.name for p in self.phases]:
      raise ValueError(f"--stop_after={stop_after!r} names no phase; phases: "
                       f"{', '.join(p.name for p in self.phases)}.")
    records: dict[str, Any] = {}
    previous: str | None = None
    for phase in self.phases:
      if not phase.enabled:
        reporting.announce(f"\n[{phase.name}] disabled (Phase.enabled={phase.enabled!r}); "
                           "skipping.")
        records[phase.name] = {"phase": phase.name, "disabled": True}
        continue
      init = previous if phase.init_from == "previous" else phase.init_from
      phase_dir = os.path.join(self.root, phase.name)
      runs = ([_Run(phase, os.path.join(phase_dir, f"seed_{s}"), s) for s in phase.seeds]
              or [_Run(phase, phase_dir, None)])
      done = [self._run_one(run, init) for run in runs]
      if phase.seeds and phase.eval_gin_files and not self.dry_run:
        summary = restarts.summarize({f"seed_{r.seed}": os.path.join(r.model_dir, "eval")
                                      for r in runs}, phase.metric)
        json_records.write_json(os.path.join(phase_dir, "restarts.json"), summary)
        reporting.announce(f"\n[{phase.name}: restarts]\n{restarts.format_summary(summary)}")
        chosen = os.path.dirname(summary["best_eval_dir"])
        records[phase.name] = {"runs": done, "restarts": summary}
      else:
        chosen = runs[0].model_dir
        records[phase.name] = done[0] if len(done) == 1 else {"runs": done}
      previous = checkpoint_of(chosen)
      if phase.name == stop_after:
        reporting.announce(f"Stopping after phase {phase.name!r} (--stop_after).")
        break
    return records

  def _run_one(self, run: _Run, init: str | None) -> dict[str, Any]:
    label = run.phase.name + (f" (seed {run.seed})" if run.seed is not None else "")
    marker = os.path.join(run.model_dir, DONE_FILE)
    if os.path.exists(marker) and not self.dry_run:
      record = json_records.read_json(marker, f"Delete it and run the same command again: "
                                      f"{label} runs again, resuming from its latest checkpoint.")
      reporting.announce(f"\n[{label}] done earlier ({marker}); skipping.")
      return record
    train = self.train_command(run, init)
    self._execute(f"{label}: train", train)
    record: dict[str, Any] = {"phase": run.phase.name, "seed": run.seed,
                              "model_dir": run.model_dir, "initial_checkpoint": init,
                              "train_command": format_command(train)}
    if run.phase.eval_gin_files:
      evaluate = self.eval_command(run)
      self._execute(f"{label}: eval", evaluate)
      record["eval_command"] = format_command(evaluate)
      if not self.dry_run:
        eval_dir = os.path.join(run.model_dir, "eval")
        record["eval"] = json_records.read_json(
            os.path.join(eval_dir, "metrics.json"),
            f"Run the same command again: {label} is evaluated again into {eval_dir}.")
    record["checkpoint"] = checkpoint_of(run.model_dir)
    if not self.dry_run:  # written whole or not at all: a killed chain leaves no half record
      json_records.write_json(marker, record)
    return record


@gin.configurable
def run_phases(root: str = gin.REQUIRED, phases: Sequence[Phase] = gin.REQUIRED,
               gin_files: Sequence[str] = (), bindings: Mapping[str, Any] | None = None,
               extra_gin_bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
               stop_after: str | None = None, dry_run: bool = False) -> dict[str, Any]:
  """Runs a chain of phases under `root` (gin: runs/phases.gin); see the module docstring.

  `gin_files` and `bindings` are given to every phase's train and eval command (e.g. the model's
  gin file), before the phase's own.
  """
  runner = Runner(root, phases, gin_files, bindings, extra_gin_bindings, search_paths,
                  dry_run=dry_run)
  return runner.run(stop_after)


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import config
  flag_values = flags.FLAGS
  config.parse_gin(flag_values.gin_file, flag_values.gin_bindings, imports=("t2t.phases",),
                   extra_search_paths=flag_values.gin_search_path)
  run_phases(extra_gin_bindings=flag_values.phase_bindings,
             search_paths=flag_values.gin_search_path, stop_after=flag_values.stop_after,
             dry_run=flag_values.dry_run)
