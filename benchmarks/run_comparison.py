"""What two t2t runs left in their model directories, compared: final checkpoints and losses.

The soak (`benchmarks/soak.py`) trains one run through interruptions and one straight through, then
asks whether they ended in the same place. A restarted run rewrites metrics.jsonl from the step it
resumes at, so before each restart the soak moves the file's rows to metrics_history.jsonl
(`set_aside_metrics`); `read_losses` reads both, so a step trained twice is compared twice.
Checkpoints are read with orbax, read-only, and compared leaf by leaf (`compare_runs`);
`comparison_failures` says in words why two runs do not match within a tolerance.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

TOLERANCE = 1e-6
STEP_PREFIX = 'checkpoint'


HISTORY = 'metrics_history.jsonl'


def set_aside_metrics(model_dir: str) -> None:
  """Appends metrics.jsonl to metrics_history.jsonl and removes it, before a restart.

  t2t cuts metrics.jsonl back to the step it resumes from (the rows a killed run logged past its
  last checkpoint go); the soak keeps them here so that a recomputed step's earlier losses are
  compared too.
  """
  path = os.path.join(model_dir, 'metrics.jsonl')
  if not os.path.exists(path):
    return
  with open(path, 'rb') as f:
    data = f.read()
  if data and not data.endswith(b'\n'):
    data += b'\n'  # a line cut by SIGKILL stays a (torn) line of its own
  with open(os.path.join(model_dir, HISTORY), 'ab') as f:
    f.write(data)
  os.remove(path)


def read_losses(model_dir: str) -> tuple[dict[int, float], dict[int, list[float]], int]:
  """Training losses: (last value per step, every value per step, torn lines).

  Read from metrics_history.jsonl (earlier runs' rows, kept by `set_aside_metrics`) then
  metrics.jsonl, so a step recomputed after a kill appears several times; the last value is
  the one the run finally trained with. A line that does not parse (a write cut by SIGKILL) is
  counted, not fatal.
  """
  last: dict[int, float] = {}
  every: dict[int, list[float]] = {}
  torn = 0
  lines: list[str] = []
  for name in (HISTORY, 'metrics.jsonl'):
    path = os.path.join(model_dir, name)
    if os.path.exists(path):
      with open(path) as f:
        lines.extend(f)
  for line in lines:
    try:
      record = json.loads(line)
    except ValueError:
      torn += 1
      continue
    if record.get('split') == 'train' and 'loss' in record:
      step = int(record['step'])
      last[step] = float(record['loss'])
      every.setdefault(step, []).append(float(record['loss']))
  return last, every, torn


def checkpoint_steps(model_dir: str) -> list[int]:
  """Finalised checkpoint steps (`checkpoint_<N>`), oldest first."""
  prefix = STEP_PREFIX + '_'
  return sorted(int(d[len(prefix):]) for d in os.listdir(model_dir)
                if d.startswith(prefix) and d[len(prefix):].isdigit())



def load_checkpoint(model_dir: str, step: int) -> dict[str, Any]:
  """{'params': {name: array}, 'opt_state': {name: array}, 'meta': dict} at `step`, read-only."""
  import jax
  import orbax.checkpoint as ocp
  from absl import logging
  logging.set_verbosity(logging.ERROR)  # not orbax's read-only notices
  step_dir = os.path.join(model_dir, f'{STEP_PREFIX}_{step}')
  if not os.path.isdir(step_dir):
    raise FileNotFoundError(f'No checkpoint {step_dir} to compare (steps there: '
                            f'{checkpoint_steps(model_dir) if os.path.isdir(model_dir) else "none"}).')
  items = [i for i in ('params', 'opt_state', 'meta') if os.path.isdir(os.path.join(step_dir, i))]
  manager = ocp.CheckpointManager(model_dir, item_names=tuple(items), options=(
      ocp.CheckpointManagerOptions(step_prefix=STEP_PREFIX, read_only=True)))
  try:
    args = {i: ocp.args.JsonRestore() if i == 'meta' else ocp.args.StandardRestore() for i in items}
    out = manager.restore(step, args=ocp.args.Composite(**args))
  finally:
    manager.close()
  flat = lambda tree: {jax.tree_util.keystr(p): np.asarray(x)
                       for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  return {'params': flat(out['params']), 'opt_state': flat(out['opt_state'] if 'opt_state' in items
                                                          else {}),
          'meta': dict(out['meta'])}


def compare_trees(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, Any]:
  """Leaf-by-leaf comparison of two flattened trees: structure, shapes, dtypes, max |a - b|."""
  problems = [f'{k}: only in the first' for k in sorted(set(a) - set(b))]
  problems += [f'{k}: only in the second' for k in sorted(set(b) - set(a))]
  worst, worst_name, unequal = 0.0, None, 0
  for k in sorted(set(a) & set(b)):
    x, y = a[k], b[k]
    if x.shape != y.shape or x.dtype != y.dtype:
      problems.append(f'{k}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}')
      continue
    if np.array_equal(x, y):
      continue
    unequal += 1
    d = float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) if x.size else 0.0
    if not d <= worst:  # NaN counts as the worst
      worst, worst_name = d, k
  return {'leaves': len(a), 'structure_problems': problems, 'max_abs_diff': worst,
          'worst_leaf': worst_name, 'unequal_leaves': unequal}


def compare_runs(dir_a: str, dir_b: str, step: int) -> dict[str, Any]:
  """Compares two runs' checkpoints at `step` and their per-step training losses.

  `losses.max_abs_diff_last` compares the last logged value of each step; `..._all` also every
  earlier value of a step logged twice (a step recomputed after a kill must give the same loss).
  """
  a, b = load_checkpoint(dir_a, step), load_checkpoint(dir_b, step)
  last_a, every_a, torn_a = read_losses(dir_a)
  last_b, _, torn_b = read_losses(dir_b)
  common = sorted(set(last_a) & set(last_b))
  diff = lambda x, y: abs(x - y) if math.isfinite(x) and math.isfinite(y) else math.inf
  last = max((diff(last_a[s], last_b[s]) for s in common), default=0.0)
  per_step = {s: max(diff(v, last_b[s]) for v in every_a[s]) for s in common}
  every = max(per_step.values(), default=0.0)
  worst_step = max(common, key=per_step.get) if every > 0 else None
  expected = list(range(1, step + 1))
  return {
      'step': step,
      'params': compare_trees(a['params'], b['params']),
      'opt_state': compare_trees(a['opt_state'], b['opt_state']),
      'batches_consumed': [a['meta'].get('batches_consumed'), b['meta'].get('batches_consumed')],
      'losses': {'steps_compared': len(common), 'max_abs_diff_last': last,
                 'max_abs_diff_all': every, 'worst_step': worst_step,
                 'missing_steps': [len(set(expected) - set(last_a)), len(set(expected) - set(last_b))],
                 'recomputed_steps': sum(len(v) > 1 for v in every_a.values()),
                 'torn_lines': [torn_a, torn_b]}}


def comparison_failures(c: dict[str, Any], tol: float = TOLERANCE) -> list[str]:
  """Why a `compare_runs` result is not a match (empty when it is)."""
  out = []
  for item in ('params', 'opt_state'):
    t = c[item]
    if t['structure_problems']:
      out.append(f'{item} trees differ: ' + '; '.join(t['structure_problems'][:3]))
    if not t['max_abs_diff'] <= tol:
      out.append(f"{item} differ: max |diff| {t['max_abs_diff']:.3g} at {t['worst_leaf']} "
                 f"({t['unequal_leaves']} of {t['leaves']} leaves unequal)")
  losses = c['losses']
  for key in ('max_abs_diff_last', 'max_abs_diff_all'):
    if not losses[key] <= tol:
      out.append(f"losses differ: {key} {losses[key]:.3g} (worst step {losses['worst_step']})")
  if any(losses['missing_steps']):
    out.append(f"steps missing from metrics.jsonl (interrupted, straight): {losses['missing_steps']}")
  if c['batches_consumed'][0] != c['batches_consumed'][1]:
    out.append(f"batches_consumed differ: {c['batches_consumed']}")
  return out
