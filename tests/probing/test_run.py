"""t2t/probing/run.py's arguments: `probe.checkpoints` given as one path (end to end:
tests/probing/test_cli.py)."""
import numpy as np
import pytest

from t2t.probing import representations, run


class _Loaded(Exception):
  """Stops `probe` once it has asked for its first checkpoint."""


def test_one_checkpoint_path_as_a_string_is_a_list_of_one(tmp_path, monkeypatch):
  monkeypatch.setattr(run, "task_examples", lambda *args: (np.zeros((2, 4), np.int32), ["a", "b"]))
  loaded = []

  def load(encoder, path):
    loaded.append(path)
    raise _Loaded()

  monkeypatch.setattr(representations, "load_encoder_params", load)
  # Before: iterated character by character, "No checkpoint in '/'".
  with pytest.raises(_Loaded):
    run.probe(checkpoints="/runs/bbc_demo/pretrain", encoder=None, probe_task="bbc_topic",
              output_dir=str(tmp_path))
  assert loaded == ["/runs/bbc_demo/pretrain"]
  with pytest.raises(ValueError, match="1 checkpoints but 2 checkpoint_names"):
    run.probe(checkpoints="/runs/a", encoder=None, probe_task="bbc_topic",
              output_dir=str(tmp_path), checkpoint_names=["a", "b"])
