"""Diagnostic classifiers, edge probes and Holm-corrected correlations on hand-made cases."""
import numpy as np
import pytest

from t2t.probing import correlation, diagnostic, edge


def test_holm_bonferroni_by_hand():
  # Sorted: 0.005 (x4 = 0.02), 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 -> max(0.06, 0.04)).
  rejected, adjusted = correlation.holm_bonferroni([0.01, 0.04, 0.03, 0.005], alpha=0.05)
  assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert rejected == [True, False, False, True]
  # Step-down stops at the first failure even if a later raw p-value would pass its own bound:
  # 0.011 x 2 = 0.022, then max(0.022, 0.02 x 1) = 0.022; at alpha 0.02 nothing is rejected.
  rejected, adjusted = correlation.holm_bonferroni([0.02, 0.011], alpha=0.02)
  assert adjusted == pytest.approx([0.022, 0.022]) and rejected == [False, False]
  # Capped at 1: 0.001 x 3, min(1, 0.6 x 2), max(1, 0.7 x 1).
  _, adjusted = correlation.holm_bonferroni([0.6, 0.7, 0.001])
  assert adjusted == pytest.approx([1.0, 1.0, 0.003])
  # NaN (an undefined test) is never rejected and does not count in m (= 2 here).
  rejected, adjusted = correlation.holm_bonferroni([0.6, float("nan"), 0.001])
  assert adjusted[0] == pytest.approx(0.6) and np.isnan(adjusted[1])
  assert adjusted[2] == pytest.approx(0.002) and rejected == [False, False, True]
  with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
    correlation.holm_bonferroni([1.5])


def test_probe_target_correlations():
  targets = {"rte": [60.0, 62.0, 65.0, 70.0, 71.0, 75.0]}
  probes = {"tracks": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],      # same order: rho 1
            "reverse": [6.0, 5.0, 4.0, 3.0, 2.0, 1.0],     # rho -1
            "noise": [3.0, 1.0, 4.0, 1.5, 5.0, 2.0],
            "constant": [1.0] * 6}
  rows = {r["probe"]: r for r in correlation.probe_target_correlations(probes, targets)}
  assert rows["tracks"]["spearman"] == pytest.approx(1.0)
  assert rows["reverse"]["spearman"] == pytest.approx(-1.0)
  assert rows["tracks"]["significant"] and rows["reverse"]["significant"]
  assert not rows["noise"]["significant"] and np.isnan(rows["constant"]["spearman"])
  # Holm over the three defined tests: the smallest p-value is multiplied by 3.
  smallest = min(r["p_value"] for r in rows.values() if not np.isnan(r["p_value"]))
  assert min(r["p_holm"] for r in rows.values() if not np.isnan(r["p_holm"])) == pytest.approx(
      3 * smallest)
  with pytest.raises(ValueError, match="one score per run"):
    correlation.probe_target_correlations({"a": [1, 2, 3]}, {"b": [1, 2]})


def test_probe_scores_by_run_from_result_rows():
  rows = [{"checkpoint": c, "probe_task": "topic", "layer": l, "pooling": "mean",
           "metric": "accuracy", "score": s}
          for c, s1, s2 in (("a", 50, 60), ("b", 55, 70), ("c", 52, 65))
          for l, s in (("layer_1", s1), ("layer_2", s2))]
  table = correlation.probe_scores_by_run(rows, ["c", "a", "b"], layer="layer_2")
  assert table == {"topic/layer_2/mean": [65.0, 60.0, 70.0]}
  assert len(correlation.probe_scores_by_run(rows, ["a", "b"])) == 2
  with pytest.raises(ValueError, match=r"probe topic/layer_1/mean has no score for runs \['d'\]"):
    correlation.probe_scores_by_run(rows, ["a", "d"], layer="layer_1")


def test_diagnostic_probe_finds_the_layer_that_encodes_the_label():
  rng = np.random.RandomState(0)
  labels = rng.randint(0, 3, size=300)
  noise_layer = rng.normal(size=(300, 8))
  informative = noise_layer.copy()
  informative[:, 0] += 6.0 * labels  # the label is linearly readable from dimension 0
  names = np.array(["a", "b", "c"])[labels]
  train, held = slice(0, 200), slice(200, 300)
  rows = diagnostic.probe_layers(
      {("embeddings", "mean"): noise_layer[train], ("layer_1", "mean"): informative[train]},
      names[train].tolist(),
      {("embeddings", "mean"): noise_layer[held], ("layer_1", "mean"): informative[held]},
      names[held].tolist())
  scores = {r["layer"]: r["score"] for r in rows}
  assert {r["metric"] for r in rows} == {"accuracy"}
  assert scores["layer_1"] > 95.0 and scores["embeddings"] < 50.0  # chance is 1/3
  # Regression (STS-B style): a linear score is recovered by ridge.
  y = informative @ np.arange(1, 9) * 0.1
  result = diagnostic.fit_probe(informative[train], y[train], informative[held], y[held],
                                kind="regression", l2=1e-3)
  assert result["pearson_corrcoef"] > 99.0 and result["spearman_corrcoef"] > 99.0
  with pytest.raises(ValueError, match="200 feature rows but 3 labels"):
    diagnostic.fit_probe(noise_layer[train], [0, 1, 0], noise_layer[held], labels[held])


def _synthetic_edges(n, rng, pair):
  """One-hot token states over 6 ids; span label: the span contains id 1; pair label: whether
  span1 contains id 1 equals whether span2 contains id 2 (only both spans together decide it)."""
  length, vocab = 10, 6
  ids = rng.randint(0, vocab, size=(n, length))
  states = np.eye(vocab, dtype=np.float32)[ids] + 0.05 * rng.normal(size=(n, length, vocab))
  starts = rng.randint(0, length - 3, size=(n, 2))
  widths = rng.randint(1, 4, size=(n, 2))
  span1 = np.stack([starts[:, 0], starts[:, 0] + widths[:, 0]], 1)
  span2 = np.stack([starts[:, 1], starts[:, 1] + widths[:, 1]], 1)
  if pair:
    labels = np.array([int((1 in ids[i, a:b]) == (2 in ids[i, c:d]))
                       for i, ((a, b), (c, d)) in enumerate(zip(span1, span2))])
    return edge.EdgeData(states.astype(np.float32), span1, labels, span2)
  labels = np.array([int(1 in ids[i, s:e]) for i, (s, e) in enumerate(span1)])
  return edge.EdgeData(states.astype(np.float32), span1, labels)


@pytest.mark.parametrize("pair", [False, True])
def test_edge_probe_learns_span_and_span_pair_labels(pair):
  rng = np.random.RandomState(1 + pair)
  train, held = _synthetic_edges(1500, rng, pair), _synthetic_edges(300, rng, pair)
  majority = 100.0 * max(held.labels.mean(), 1 - held.labels.mean())
  score = edge.train_edge_probe(train, held, num_labels=2, steps=400)["accuracy"]
  assert score > 92.0 and score > majority + 10
  # Control: shuffled training labels carry no signal, so the probe cannot beat the majority much.
  shuffled = edge.EdgeData(train.states, train.span1, rng.permutation(train.labels), train.span2)
  control = edge.train_edge_probe(shuffled, held, num_labels=2, steps=100)["accuracy"]
  assert control < majority + 8


def test_window_spans_and_label_ids():
  tokens = np.array([[5, 6, 7, 8, 9, 0], [5, 6, 0, 0, 0, 0]])
  spans = edge.window_spans(tokens, 3, seed=0)
  assert spans[1].tolist() == [0, 2]  # shorter than the window: the whole row
  assert 0 <= spans[0, 0] <= 2 and spans[0, 1] - spans[0, 0] == 3
  with pytest.raises(ValueError, match="example 0 has no tokens"):
    edge.window_spans(np.zeros((1, 4)), 2)
  ids, classes = edge.label_ids(["tech", "sport", "tech"])
  assert ids.tolist() == [1, 0, 1] and classes == ["sport", "tech"]
  with pytest.raises(ValueError, match=r"labels \['politics'\] are not among"):
    edge.label_ids(["politics"], classes)


def test_edge_data_errors_name_the_example():
  states = np.zeros((2, 5, 3), np.float32)
  bad = edge.EdgeData(states, np.array([[0, 2], [3, 3]]), np.array([0, 1]))
  with pytest.raises(ValueError, match=r"span1 of example 1 is \[3, 3\]"):
    edge.train_edge_probe(bad, bad, num_labels=2, steps=1)
  good = edge.EdgeData(states, np.array([[0, 2], [3, 5]]), np.array([0, 2]))
  with pytest.raises(ValueError, match=r"labels must be \[2\] ints in \[0, 2\)"):
    edge.train_edge_probe(good, good, num_labels=2, steps=1)
