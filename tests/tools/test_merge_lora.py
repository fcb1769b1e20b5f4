"""tools/merge_lora.py's checks before merging: alpha against the run's config.gin, the output.

A LoRA run here is a directory with a `config.gin` and an empty `checkpoint_<N>`: the checks
run before any checkpoint is read, and the merge itself (tests/models/test_peft.py) is replaced
by a fake that records its alpha.
"""
import pytest

from t2t.models import peft
from tools import merge_lora

LORA_GIN = """# Macros:
# ==============================================================================
LORA_ALPHA = 16.0
LORA_RANK = 8

# Parameters for LoraModel:
# ==============================================================================
LoraModel.alpha = %LORA_ALPHA
LoraModel.rank = %LORA_RANK
"""


@pytest.fixture
def run(tmp_path, monkeypatch):
  lora = tmp_path / "lora"
  (lora / "checkpoint_1").mkdir(parents=True)
  (lora / "config.gin").write_text(LORA_GIN)
  merged = []
  monkeypatch.setattr(peft, "merge_checkpoint", lambda path, out, alpha: merged.append(alpha)
                      or f"{out}/checkpoint_1")
  return lora, merged


def test_alpha_comes_from_the_runs_config_and_a_contradicting_one_is_refused(run, tmp_path,
                                                                             capsys):
  lora, merged = run
  out = str(tmp_path / "merged")
  assert merge_lora.main(["--lora_dir", str(lora), "--output", out]) == 0
  assert merge_lora.main(["--lora_dir", str(lora / "checkpoint_1"), "--output", out,
                          "--alpha", "16"]) == 0
  assert merged == [16.0, 16.0]
  capsys.readouterr()
  # Before: merged with alpha -5 (or 8) and exit status 0, the weights wrongly scaled.
  assert merge_lora.main(["--lora_dir", str(lora), "--output", out, "--alpha=-5"]) == 2
  assert capsys.readouterr().err == ("error: --alpha must be a positive number (the run's "
                                     "LoraModel.alpha), got -5.0.\n")
  assert merge_lora.main(["--lora_dir", str(lora), "--output", out, "--alpha", "8"]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: --alpha=8.0 contradicts the run's LoraModel.alpha = 16.0 "
                        f"recorded in {lora}/config.gin:"), err
  assert "--alpha is for runs whose config.gin records none" in err
  assert merged == [16.0, 16.0]
  # A run whose config.gin records no LoraModel (built in Python) needs --alpha.
  (lora / "config.gin").write_text("train.train_steps = 2\n")
  assert merge_lora.main(["--lora_dir", str(lora), "--output", out]) == 2
  assert "records no LoraModel.alpha: pass --alpha=" in capsys.readouterr().err
  assert merge_lora.main(["--lora_dir", str(lora), "--output", out, "--alpha", "8"]) == 0
  assert merged[-1] == 8.0


def test_recorded_alphas_resolve_macros_and_scopes():
  assert merge_lora.recorded_alphas(LORA_GIN) == [16.0]
  assert merge_lora.recorded_alphas("t2t.models.peft.LoraModel.alpha = 4\n"
                                    "big/LoraModel.alpha = 32.0\n") == [4.0, 32.0]
  assert merge_lora.recorded_alphas("LoraModel.rank = 8\n") == []


def test_an_output_holding_the_step_is_named(run, tmp_path, capsys):
  lora, merged = run
  out = tmp_path / "merged"
  (out / "checkpoint_1").mkdir(parents=True)
  # Before: "Checkpoint for step 1 already exists." without the directory.
  assert merge_lora.main(["--lora_dir", str(lora), "--output", str(out)]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"error: --output {out} already holds {out}/checkpoint_1 "), err
  assert not merged
