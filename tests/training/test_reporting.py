"""Tests for t2t/training/reporting.py: JSONL + TensorBoard metrics, the progress display."""
import io
import json
import os

from t2t.training import reporting


def test_metrics_writer_appends_jsonl_and_writes_tensorboard_events(tmp_path):
  writer = reporting.MetricsWriter(str(tmp_path), "train")
  writer.write(10, {"loss": 2.5, "accuracy": 0.25})
  writer.write(20, {"loss": 2.0, "accuracy": 0.5})
  writer.close()
  lines = [json.loads(l) for l in open(tmp_path / "metrics.jsonl")]
  assert lines == [{"step": 10, "split": "train", "loss": 2.5, "accuracy": 0.25},
                   {"step": 20, "split": "train", "loss": 2.0, "accuracy": 0.5}]
  events = os.listdir(tmp_path / "train")
  assert any(name.startswith("events.out.tfevents") for name in events)


def test_progress_prints_plain_lines_when_not_a_tty():
  stream = io.StringIO()
  progress = reporting.Progress(start=0, total=20, log_every=10, stream=stream)
  for step in range(1, 21):
    speed = progress.update(step, tokens=100, metrics={"loss": 1.0} if step % 10 == 0 else None)
  progress.close()
  lines = stream.getvalue().strip().splitlines()
  assert len(lines) == 2
  assert lines[0].startswith("step 10/20  loss 1.0000")
  assert "steps/s" in lines[0] and "tokens/s" in lines[0] and "ETA" in lines[0]
  assert speed["tokens_per_sec"] > 0 and speed["eta_sec"] == 0
