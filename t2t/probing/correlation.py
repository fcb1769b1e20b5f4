"""Do probe scores predict target-task scores? Spearman correlation across runs, Holm-corrected.

Pruksachatkun et al. (2020, "Intermediate-Task Transfer Learning with Pretrained Language
Models", §5 "Probing and target task correlations") correlate, over the intermediate-task runs,
each probing task's score with each target task's score (Spearman's rho) and mark a correlation
significant after Holm-Bonferroni correction for the many probe x target pairs tested.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def holm_bonferroni(p_values: Sequence[float], alpha: float = 0.05
                    ) -> tuple[list[bool], list[float]]:
  """Holm's step-down procedure (Holm 1979) for m hypotheses.

  Sort the p-values p_(1) <= ... <= p_(m); the adjusted value of the k-th smallest is
  max_{j <= k} min(1, (m - j + 1) p_(j)); hypothesis k is rejected when its adjusted value is
  <= alpha (equivalently: reject in order while p_(k) <= alpha / (m - k + 1), stop at the first
  failure). NaN p-values (undefined tests) are never rejected and stay NaN.

  Returns:
    (rejected, adjusted p-values), both in the input order.
  """
  p = np.asarray(p_values, np.float64)
  if not 0 < alpha < 1:
    raise ValueError(f"alpha must be in (0, 1), got {alpha}.")
  if np.any((p < 0) | (p > 1)):
    raise ValueError(f"p-values must lie in [0, 1], got {p.tolist()}.")
  defined = np.flatnonzero(~np.isnan(p))
  m = len(defined)
  adjusted = np.full(len(p), np.nan)
  order = defined[np.argsort(p[defined], kind="stable")]
  running = 0.0
  for k, index in enumerate(order):
    running = max(running, min(1.0, (m - k) * p[index]))
    adjusted[index] = running
  rejected = [bool(a <= alpha) if not np.isnan(a) else False for a in adjusted]
  return rejected, adjusted.tolist()


def probe_target_correlations(probe_scores: Mapping[str, Sequence[float]],
                              target_scores: Mapping[str, Sequence[float]],
                              alpha: float = 0.05) -> list[dict[str, Any]]:
  """Spearman's rho of every (probe task, target task) pair over runs, Holm-corrected jointly.

  Args:
    probe_scores: {probe task: its score in run 1 .. R}.
    target_scores: {target task: its score in the same runs 1 .. R}.
    alpha: family-wise error rate over all pairs.

  Returns:
    rows {probe, target, spearman, p_value, p_holm, significant}, probe-major.
  """
  import scipy.stats  # Deferred: only this analysis needs it.

  runs = {len(v) for v in [*probe_scores.values(), *target_scores.values()]}
  if len(runs) != 1:
    raise ValueError(f"every probe and target needs one score per run; got lengths {sorted(runs)}.")
  (num_runs,) = runs
  if num_runs < 3:
    raise ValueError(f"a rank correlation needs >= 3 runs, got {num_runs}.")
  rows = []
  for probe, xs in probe_scores.items():
    for target, ys in target_scores.items():
      if np.ptp(xs) == 0 or np.ptp(ys) == 0:
        rho, p = float("nan"), float("nan")  # a constant side: undefined
      else:
        result = scipy.stats.spearmanr(xs, ys)
        rho, p = float(result.statistic), float(result.pvalue)
      rows.append({"probe": probe, "target": target, "spearman": rho, "p_value": p})
  rejected, adjusted = holm_bonferroni([r["p_value"] for r in rows], alpha)
  for row, significant, p_holm in zip(rows, rejected, adjusted):
    row.update(p_holm=p_holm, significant=significant)
  return rows


def probe_scores_by_run(rows: Sequence[Mapping[str, Any]], runs: Sequence[str],
                        metric: str = "accuracy", layer: str | None = None,
                        pooling: str | None = None) -> dict[str, list[float]]:
  """{"<probe task>/<layer>/<pooling>": [score of run 1 .. R]} from `t2t.probing` result rows.

  ``runs`` are the checkpoint names in the order of the target scores; ``layer`` / ``pooling``
  restrict the rows (None: every one becomes its own probe). A probe missing for some run is an
  error naming it, so probe and target scores always pair up run by run.
  """
  table: dict[str, dict[str, float]] = {}
  for row in rows:
    if row["metric"] != metric or (layer and row["layer"] != layer) or (
        pooling and row["pooling"] != pooling):
      continue
    key = f"{row['probe_task']}/{row['layer']}/{row['pooling']}"
    table.setdefault(key, {})[row["checkpoint"]] = float(row["score"])
  if not table:
    raise ValueError(f"no probe rows with metric {metric!r}, layer {layer!r}, pooling {pooling!r}.")
  out = {}
  for key, scores in table.items():
    missing = [r for r in runs if r not in scores]
    if missing:
      raise ValueError(f"probe {key} has no score for runs {missing}; it has {sorted(scores)}.")
    out[key] = [scores[r] for r in runs]
  return out
