"""Tests for t2t/training/wandb_writer.py with a fake `wandb` module (no network, not installed)."""
import sys
import types

import pytest

from t2t.training import wandb_writer


class FakeRun:
  def __init__(self, **kwargs):
    self.init_kwargs, self.logged, self.finished = kwargs, [], 0

  def log(self, data, step):
    self.logged.append((step, data))

  def finish(self):
    self.finished += 1


@pytest.fixture
def fake_wandb(monkeypatch):
  module = types.ModuleType("wandb")
  module.runs = []

  def init(**kwargs):
    module.runs.append(FakeRun(**kwargs))
    return module.runs[-1]

  module.init = init
  monkeypatch.setitem(sys.modules, "wandb", module)
  return module


def test_writes_scalars_under_the_split_offline_by_default(fake_wandb, tmp_path):
  writer = wandb_writer.WandbWriter(str(tmp_path / "run1"), name="train", config={"lr": 0.1})
  writer.write(3, {"loss": 2.5, "accuracy": 1})
  writer.write(4, {"loss": 2.0})
  writer.close()
  writer.close()  # a second close is harmless
  run, = fake_wandb.runs
  assert run.init_kwargs["mode"] == "offline" and run.init_kwargs["name"] == "run1"
  assert run.init_kwargs["dir"] == str(tmp_path / "run1")
  assert run.init_kwargs["config"] == {"lr": 0.1}
  assert run.logged == [(3, {"train/loss": 2.5, "train/accuracy": 1.0}),
                        (4, {"train/loss": 2.0})]
  assert isinstance(run.logged[0][1]["train/accuracy"], float)
  assert run.finished == 1


def test_not_installed_is_a_clear_error(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
  with pytest.raises(ImportError, match="wandb.*not installed"):
    wandb_writer.WandbWriter(str(tmp_path))


def test_unknown_mode_is_refused(fake_wandb, tmp_path):
  with pytest.raises(ValueError, match="mode 'cloud'"):
    wandb_writer.WandbWriter(str(tmp_path), mode="cloud")
  assert not fake_wandb.runs


def test_metrics_writer_logs_to_wandb_when_gin_enables_it(fake_wandb, tmp_path):
  import gin
  from t2t.training import reporting
  off = reporting.MetricsWriter(str(tmp_path / "off"), "train", enable_tensorboard=False)
  off.write(1, {"loss": 1.0})
  off.close()
  assert not fake_wandb.runs  # off by default
  with gin.unlock_config():
    gin.bind_parameter("wandb_logging.enabled", True)
  try:
    on = reporting.MetricsWriter(str(tmp_path / "on"), "validation", enable_tensorboard=False)
    on.write(5, {"accuracy": 0.5})
    on.close()
  finally:
    gin.clear_config()
  run, = fake_wandb.runs
  assert run.logged == [(5, {"validation/accuracy": 0.5})] and run.finished == 1
  assert (tmp_path / "on" / "metrics.jsonl").read_text().count("\n") == 1  # the file still written
