"""Diagnostic classifiers: a linear probe per layer on frozen, pooled features.

Peters et al. (2019, "To Tune or Not to Tune?", §5 and Figure 2) fit a logistic regression on the
mean-pooled hidden states of each layer, for a pre-trained and a fine-tuned checkpoint (a linear
regression for STS-B), and compare the per-layer curves. Here: scikit-learn's
``LogisticRegression`` (L2, lbfgs) on standardised features for labels, scored by accuracy
(x 100), and ``Ridge`` for scores, scored by Pearson and Spearman correlation (x 100).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t2t.data import metrics

KINDS = ("classification", "regression")


def _check(x: np.ndarray, y: Sequence[Any], name: str) -> np.ndarray:
  x = np.asarray(x, np.float64)
  if x.ndim != 2:
    raise ValueError(f"{name} features must be [examples, dims], got shape {x.shape}.")
  if len(x) != len(y):
    raise ValueError(f"{name}: {len(x)} feature rows but {len(y)} labels.")
  if len(x) == 0:
    raise ValueError(f"{name}: no examples.")
  return x


def fit_probe(train_x: np.ndarray, train_y: Sequence[Any], eval_x: np.ndarray,
              eval_y: Sequence[Any], kind: str = "classification", l2: float = 1.0,
              seed: int = 0) -> dict[str, float]:
  """Fits a linear probe on (train_x [n, d], train_y) and scores it on (eval_x [m, d], eval_y).

  Args:
    kind: "classification" (labels: any hashable; logistic regression, inverse strength
      C = 1 / l2) or "regression" (floats; ridge regression, alpha = l2).
    l2: the L2 penalty.

  Returns:
    {"accuracy": ...} for classification, {"pearson_corrcoef", "spearman_corrcoef"} for
    regression, on the 0-100 scale of ``t2t.data.metrics``.
  """
  from sklearn.linear_model import LogisticRegression, Ridge  # Deferred: probing only.
  from sklearn.pipeline import make_pipeline
  from sklearn.preprocessing import StandardScaler

  if kind not in KINDS:
    raise ValueError(f"unknown probe kind {kind!r}; choose one of {KINDS}.")
  train_x, eval_x = _check(train_x, train_y, "train"), _check(eval_x, eval_y, "eval")
  if train_x.shape[1] != eval_x.shape[1]:
    raise ValueError(f"train features have {train_x.shape[1]} dims, eval {eval_x.shape[1]}.")
  if kind == "classification":
    if len(set(train_y)) < 2:
      raise ValueError(f"a classification probe needs >= 2 labels in train, got {set(train_y)}.")
    model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0 / l2, max_iter=2000,
                                                               random_state=seed))
    model.fit(train_x, list(train_y))
    return metrics.accuracy(list(eval_y), list(model.predict(eval_x)))
  model = make_pipeline(StandardScaler(), Ridge(alpha=l2))
  model.fit(train_x, np.asarray(train_y, np.float64))
  predictions = model.predict(eval_x).tolist()
  targets = [float(v) for v in eval_y]
  return {**metrics.pearson_corrcoef(targets, predictions),
          **metrics.spearman_corrcoef(targets, predictions)}


def probe_layers(train: Mapping[tuple[str, str], np.ndarray], train_y: Sequence[Any],
                 evaluation: Mapping[tuple[str, str], np.ndarray], eval_y: Sequence[Any],
                 kind: str = "classification", l2: float = 1.0) -> list[dict[str, Any]]:
  """One probe per (layer, pooling) key of the feature dicts -> rows {layer, pooling, metric, score}."""
  rows = []
  for key in train:
    if key not in evaluation:
      raise ValueError(f"evaluation features lack layer/pooling {key}.")
    scores = fit_probe(train[key], train_y, evaluation[key], eval_y, kind, l2)
    for metric, score in scores.items():
      rows.append({"layer": key[0], "pooling": key[1], "metric": metric, "score": float(score)})
  return rows
