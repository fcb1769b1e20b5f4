"""Tests for t2t/reports/training_curves.py's checks of its flags (the curves themselves:
tests/reports/test_reports.py)."""
import json

import pytest

from t2t.reports import common, training_curves


def test_a_scalar_no_row_holds_is_refused_naming_the_ones_logged(tmp_path, capsys):
  path = tmp_path / "metrics.jsonl"
  rows = [{"step": 10, "split": "train", "loss": 4.0, "learning_rate": 0.01},
          {"step": 10, "split": "eval", "loss": 9.0, "accuracy": 50.0}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  # Before: exit status 0, a figure and a table of n/a.
  assert common.cli(training_curves.main, [f"--metrics_jsonl={path}", "--scalar=lossx",
                                           f"--out={tmp_path / 'tc'}"]) == 1
  assert capsys.readouterr().err == (
      f"error: --scalar=lossx is in no row of {path}. Did you mean 'loss'? The scalars logged, "
      "per split: eval: accuracy, loss; train: learning_rate, loss.\n")
  assert not (tmp_path / "tc.png").exists()
  with pytest.raises(common.ReportError, match=r"--scalar=accuracy is logged in .* for split\(s\) "
                                               "eval, not for --split=train"):
    training_curves.main([f"--metrics_jsonl={path}", "--scalar=accuracy", f"--out={tmp_path}/x"])
  # A scalar one run lacks is that run's n/a, not an error.
  other = tmp_path / "other.jsonl"
  other.write_text(json.dumps({"step": 5, "split": "train", "accuracy": 1.0}) + "\n")
  assert training_curves.main([f"--metrics_jsonl={path}", f"--metrics_jsonl={other}",
                               "--scalar=accuracy", "--split=eval", f"--out={tmp_path / 'y'}"]) == 0
