"""Tests for t2t/restarts.py on hand-made eval outputs: best of N, spread, degenerate runs."""
import json
import os

import pytest

from t2t import restarts

TARGETS = ["sports"] * 5 + ["tech"] * 3 + ["politics"] * 2  # majority rate 50%


def _rows(predictions):
  return [{"target": t, "prediction": p, "postprocessed": p} for t, p in zip(TARGETS, predictions)]


def _eval_dir(tmp_path, name, predictions):
  d = tmp_path / name
  d.mkdir()
  rows = _rows(predictions)
  accuracy = 100.0 * sum(r["target"] == r["prediction"] for r in rows) / len(rows)
  json.dump({"step": 10, "split": "validation",
             "metrics": {"bbc_topic": {"accuracy": accuracy, "macro_f1": 1.0}}},
            open(d / "metrics.json", "w"))
  with open(d / "bbc_topic.validation.predictions.jsonl", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(d)


def test_one_class_for_everything_is_degenerate():
  d = restarts.degeneracy(_rows(["sports"] * 10))  # 50% = the majority rate
  assert d.degenerate and d.accuracy == 50.0 and d.majority_rate == 50.0
  assert d.reasons == ("predicts one value ('sports') for every example",
                       "accuracy 50.0 is not above the majority-class rate 50.0")


def test_varied_but_chance_level_predictions_are_degenerate():
  d = restarts.degeneracy(_rows(["tech", "sports"] * 5))  # hits at 1, 3, 6: 30%
  assert d.num_predicted == 2 and d.accuracy == 30.0
  assert d.reasons == ("accuracy 30.0 is not above the majority-class rate 50.0",)


def test_a_run_above_the_majority_rate_is_healthy():
  d = restarts.degeneracy(_rows(TARGETS[:9] + ["tech"]))  # 90%
  assert not d.degenerate and d.accuracy == 90.0


def test_summary_best_mean_std_and_degenerate_count(tmp_path):
  runs = {"seed_0": _eval_dir(tmp_path, "a", TARGETS[:8] + ["tech", "tech"]),  # 80
          "seed_1": _eval_dir(tmp_path, "b", ["sports"] * 10),                 # 50, degenerate
          "seed_2": _eval_dir(tmp_path, "c", TARGETS)}                         # 100
  s = restarts.summarize(runs, "bbc_topic/accuracy")
  assert s["best_run"] == "seed_2" and s["best"] == 100.0
  assert s["mean"] == pytest.approx(230 / 3)
  assert s["std"] == pytest.approx(25.166114784235834)  # sample std of 80, 50, 100
  assert s["num_degenerate"] == 1
  assert [bool(r["degenerate"]) for r in s["runs"]] == [False, True, False]
  assert s["mean_non_degenerate"] == 90.0
  table = restarts.format_summary(s)
  assert "best seed_2: 100.00" in table and "degenerate 1/3" in table
  long = dict(s, runs=[dict(r, run=f"/a/long/path/to/{r['run']}/eval") for r in s["runs"]])
  rows = restarts.format_summary(long).splitlines()[:4]  # the header and the three runs
  end = len("/a/long/path/to/seed_0/eval") + 1 + 22  # run column, a space, the value column
  assert [row[end - 1] != " " and row[end:end + 2] for row in rows] == ["  "] * 4, rows
  lower = restarts.summarize(runs, "bbc_topic/accuracy", higher_is_better=False)
  assert lower["best_run"] == "seed_1"


def test_unknown_metric_and_missing_eval_are_clear_errors(tmp_path):
  runs = {"a": _eval_dir(tmp_path, "a", TARGETS)}
  with pytest.raises(ValueError, match="'bleu'.*bbc_topic/accuracy, bbc_topic/macro_f1"):
    restarts.summarize(runs, "bleu")
  with pytest.raises(FileNotFoundError, match="No metrics.json"):
    restarts.summarize({"x": str(tmp_path / "nothing")})


def test_command_line(tmp_path, capsys):
  a = _eval_dir(tmp_path, "a", TARGETS)
  out = tmp_path / "summary.json"
  assert restarts.main([a, "--metric=bbc_topic/accuracy", f"--output={out}"]) == 0
  assert "best" in capsys.readouterr().out
  assert json.load(open(out))["best"] == 100.0


def test_a_half_written_eval_file_is_named_with_what_to_do(tmp_path, capsys):
  a = _eval_dir(tmp_path, "a", TARGETS)
  metrics = os.path.join(a, "metrics.json")
  with open(metrics) as f:
    text = f.read()
  with open(metrics, "w") as f:
    f.write(text[:51])  # cut inside a string: "Invalid control character at: line 1 column 52"
  with pytest.raises(ValueError, match=f"^{metrics} is not valid JSON .*: a half-written file\\? "
                                       f"Rerun t2t.eval with EVAL_OUTPUT_DIR={a} "):
    restarts.read_run(a)
  assert restarts.main([a]) == 1
  assert capsys.readouterr().err.startswith(f"error: {metrics} is not valid JSON")
  b = _eval_dir(tmp_path, "b", TARGETS)
  predictions = os.path.join(b, "bbc_topic.validation.predictions.jsonl")
  with open(predictions, "a") as f:
    f.write('{"target": "sp')
  with pytest.raises(ValueError, match=f"^{predictions}:11 is not valid JSON"):
    restarts.read_run(b)


def test_an_output_directory_is_refused_before_the_summary(tmp_path, capsys):
  a = _eval_dir(tmp_path, "a", TARGETS)
  # Before: the summary was printed, then IsADirectoryError and its traceback.
  assert restarts.main([a, f"--output={tmp_path}"]) == 1
  captured = capsys.readouterr()
  assert captured.err == (f"error: --output={tmp_path} is a directory; give a file path for the "
                          f"JSON summary, e.g. {tmp_path / 'restarts.json'}.\n")
  assert "best" not in captured.out
  assert restarts.main([a, f"--output={tmp_path / 'no' / 'summary.json'}"]) == 1
  assert "does not exist" in capsys.readouterr().err
