"""Tests for t2t/reports: each report on a small synthetic results.jsonl / metrics.jsonl, its
markdown checked against hand-computed numbers, its PNG checked to be a real image."""
import json

import pytest
from PIL import Image

from t2t.reports import common, distribution, heatmap, learning_curve, mixing, training_curves

GRID = "abc123"


def row(inter, target, seed, value=None, status="ok", degenerate=(), **extra):
  metrics = {} if value is None else {f"{target}/accuracy": value, f"{target}/macro_f1": 1.0}
  return {"grid": GRID, "cell": f"{inter},{target},{seed}", "status": status,
          "bindings": {"INTERMEDIATE": inter, "TARGET": target, **extra}, "seed": seed,
          "wall_s": 1.0, "metrics": metrics if status == "ok" else {},
          "degenerate": list(degenerate)}


# Hand-computed: baseline (none) topic mean (60+70)/2 = 65, pair (50+54)/2 = 52.
# same/topic (72+74)/2 = 73 -> +8.0; same/pair only seed 0 finished: 49 -> -3.0 (1/2);
# broken/topic both seeds failed -> n/a; broken/pair (60+62)/2 = 61 -> +9.0.
ROWS = [row(None, "topic", 0, 60), row(None, "topic", 1, 70),
        row(None, "pair", 0, 50), row(None, "pair", 1, 54),
        row("same", "topic", 0, 72), row("same", "topic", 1, 74, degenerate=["topic"]),
        row("same", "pair", 0, 49), row("same", "pair", 1, status="failed"),
        row("broken", "topic", 0, status="failed"), row("broken", "topic", 1, status="missing"),
        row("broken", "pair", 0, 60), row("broken", "pair", 1, 62)]


@pytest.fixture
def results(tmp_path):
  path = tmp_path / "results.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  return str(path)


def assert_png(path, min_side=150):
  with Image.open(path) as image:
    image.verify()
  with Image.open(path) as image:
    assert image.format == "PNG"
    assert min(image.size) >= min_side and max(image.size) < 4000


def test_heatmap_deltas_against_the_baseline_per_target(results, tmp_path):
  out = tmp_path / "fig" / "heat"
  assert heatmap.main([f"--results={results}", f"--out={out}"]) == 0
  md = (tmp_path / "fig" / "heat.md").read_text()
  assert "| INTERMEDIATE \\ target | topic | pair |" in md
  assert "| none (baseline, absolute) | 65.0 (2/2) | 52.0 (2/2) |" in md
  assert "| same | +8.0 (2/2) | -3.0 (1/2) |" in md
  assert "| broken | n/a (0/2) | +9.0 (2/2) |" in md  # failed cells marked, not dropped
  assert_png(tmp_path / "fig" / "heat.png")


def test_heatmap_without_a_baseline_row_is_na(tmp_path):
  rows = [r for r in ROWS if not (r["bindings"]["INTERMEDIATE"] is None
                                   and r["bindings"]["TARGET"] == "pair")]
  rows += [row(None, "pair", 0, status="failed")]
  h = heatmap.compute(rows, "INTERMEDIATE", "TARGET", "accuracy")
  assert h["baseline"] == {"topic": 65.0, "pair": None}
  assert h["delta"][("broken", "pair")] is None and h["delta"][("same", "topic")] == 8.0
  with pytest.raises(common.ReportError, match="No baseline INTERMEDIATE='base'"):
    heatmap.compute(ROWS, "INTERMEDIATE", "TARGET", "accuracy", baseline="base")


def test_distribution_lists_every_seed_and_counts_missing(results, tmp_path):
  assert distribution.main([f"--results={results}", f"--out={tmp_path / 'dist'}"]) == 0
  md = (tmp_path / "dist.md").read_text()
  # std of (60, 70) with ddof 1 = 7.07; (72, 74) = 1.41
  assert "| topic | none | 0: 60.0, 1: 70.0 | 65.0 ± 7.1 | 60.0 | 70.0 | 0/2 | 0 |" in md
  assert "| topic | same | 0: 72.0, 1: 74.0* | 73.0 ± 1.4 | 72.0 | 74.0 | 0/2 | 1 |" in md
  assert "| pair | same | 0: 49.0, 1: n/a | 49.0 ± 0.0 | 49.0 | 49.0 | 1/2 | 0 |" in md
  assert "| topic | broken | 0: n/a, 1: n/a | n/a | n/a | n/a | 2/2 | 0 |" in md
  assert_png(tmp_path / "dist.png")


def curve_rows():
  # TRAIN_EXAMPLES 50: 40, 50 -> 45.0 ± 7.1; 200: 80 and a failed seed -> 80.0 ± 0.0 (1/2);
  # 800: both failed -> n/a.
  return [
      row(None, "topic", 0, 40, TRAIN_EXAMPLES=50), row(None, "topic", 1, 50, TRAIN_EXAMPLES=50),
      row(None, "topic", 0, 80, TRAIN_EXAMPLES=200),
      row(None, "topic", 1, status="failed", TRAIN_EXAMPLES=200),
      row(None, "topic", 0, status="failed", TRAIN_EXAMPLES=800),
      row(None, "topic", 1, status="failed", TRAIN_EXAMPLES=800)]


def test_learning_curve_mean_std_and_missing_points(tmp_path):
  path = tmp_path / "lc.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in curve_rows()))
  assert learning_curve.main([f"--results={path}", f"--out={tmp_path / 'lc'}"]) == 0
  md = (tmp_path / "lc.md").read_text()
  assert "| 50 | 45.0 ± 7.1 (2/2) |" in md
  assert "| 200 | 80.0 ± 0.0 (1/2) |" in md
  assert "| 800 | n/a (0/2) |" in md
  assert md.index("| 50 |") < md.index("| 200 |") < md.index("| 800 |")
  assert_png(tmp_path / "lc.png")


def test_mixing_sweep_with_a_hue_axis(tmp_path):
  rows = []
  for k, (a, b) in {8: (30, 32), 64: (40, 44)}.items():
    for hue, base in (("x", 0), ("y", 10)):
      rows += [row(None, "topic", 0, a + base, MIXING_K=k, EVAL=hue),
               row(None, "topic", 1, b + base, MIXING_K=k, EVAL=hue)]
  path = tmp_path / "mix.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert mixing.main([f"--results={path}", "--x=MIXING_K", "--hue=EVAL",
                      f"--out={tmp_path / 'mix'}"]) == 0
  md = (tmp_path / "mix.md").read_text()
  assert "| MIXING_K | EVAL=x | EVAL=y |" in md
  assert "| 8 | 31.0 ± 1.4 (2/2) | 41.0 ± 1.4 (2/2) |" in md
  assert "| 64 | 42.0 ± 2.8 (2/2) | 52.0 ± 2.8 (2/2) |" in md
  assert_png(tmp_path / "mix.png")
  # Without --hue the EVAL axis would be averaged over silently: refused.
  with pytest.raises(common.ReportError, match="also vary 'EVAL'.*--where EVAL=VALUE"):
    mixing.main([f"--results={path}", "--x=MIXING_K", f"--out={tmp_path / 'm2'}"])
  assert mixing.main([f"--results={path}", "--x=MIXING_K", "--where=EVAL=y",
                      f"--out={tmp_path / 'm3'}"]) == 0
  assert "| 8 | 41.0 ± 1.4 (2/2) |" in (tmp_path / "m3.md").read_text()


def test_training_curves_from_metrics_jsonl(tmp_path):
  run = tmp_path / "run_a"
  run.mkdir()
  lines = [{"step": 10, "split": "train", "loss": 4.0}, {"step": 10, "split": "eval", "loss": 9},
           {"step": 20, "split": "train", "loss": 2.5}, {"step": 30, "split": "train", "loss": 3.0}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(l) + "\n" for l in lines))
  missing = tmp_path / "run_b" / "metrics.jsonl"
  assert training_curves.main([f"--metrics_jsonl={run / 'metrics.jsonl'}",
                               f"--metrics_jsonl={missing}", f"--out={tmp_path / 'tc'}"]) == 0
  md = (tmp_path / "tc.md").read_text()
  assert f"| {run} | 10–30 | 4.0000 | 3.0000 | 2.5000 |" in md
  assert f"| {missing.parent} | n/a | n/a | n/a | n/a |" in md
  assert_png(tmp_path / "tc.png")


def test_results_of_two_grids_are_refused_naming_both(results, tmp_path):
  other = tmp_path / "other.jsonl"
  other.write_text(json.dumps({**ROWS[0], "grid": "zzz999"}) + "\n")
  with pytest.raises(common.ReportError, match=f"{other} holds results of grid zzz999, "
                     f"{results} of grid {GRID}"):
    common.load_results([results, str(other)])
  # The command line turns it into one line and exit code 1.
  assert common.cli(heatmap.main, [f"--results={results}", f"--results={other}",
                                   f"--out={tmp_path / 'x'}"]) == 1


def test_bad_axis_and_metric_names_are_clear(results):
  rows = common.load_results([results])
  with pytest.raises(common.ReportError, match="no axis 'TASK'; their axes: INTERMEDIATE, TARGET"):
    heatmap.compute(rows, "INTERMEDIATE", "TASK", "accuracy")
  with pytest.raises(common.ReportError, match="metric 'f1' is not in its results"):
    heatmap.compute(rows, "INTERMEDIATE", "TARGET", "f1")
