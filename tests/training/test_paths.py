"""Remote and URL paths through config.py, reporting.py, checkpoints.py, eval.py and infer.py.

`file://` URLs are real local files (epath itself refuses them; t2t.training.paths maps them).
`gs://` runs against a fake bucket in a temporary directory: etils' `mock_epath` reroutes every
epath file operation on a `gs://` path to it. (etils sends gs:// to its TensorFlow backend when
TF is installed, past the mock, so the fixture turns that choice off too.) Orbax writes gs://
through tensorstore's GCS driver, which no fake reaches: checkpoints are tested on file:// here.
"""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from etils.epath import gpath, testing

from t2t import config, eval as eval_lib
from t2t.training import checkpoints, paths, reporting
from t2t.training.partitioning import Partitioner


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """gs://<anything> lives under tmp_path/<anything> while the test runs."""
  def local(path):
    path = os.fspath(path)
    assert path.startswith("gs://"), path
    return os.path.join(tmp_path, path[len("gs://"):])

  def one(fn, path, *args, **kwargs):
    return fn(local(path), *args, **kwargs)

  def two(fn, path, dst, *args, **kwargs):
    return fn(local(path), local(dst), *args, **kwargs)

  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  single = ("exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "open", "remove",
            "rmtree", "stat", "walk")
  with testing.mock_epath(**{n: one for n in single}, copy=two, rename=two, replace=two):
    yield tmp_path


def test_resolve_keeps_urls_and_makes_local_paths_absolute(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  assert os.fspath(paths.resolve("gs://b/run")) == "gs://b/run"
  assert paths.to_str("gs://b/run/") == "gs://b/run"
  assert paths.to_str("file:///data/run") == "/data/run"
  assert paths.to_str("run") == os.path.join(str(tmp_path), "run")
  assert paths.is_url("s3://b/x") and not paths.is_url("/tmp/x") and not paths.is_url("a:b")


def test_config_and_metrics_go_to_a_bucket(bucket):
  import gin
  gin.parse_config("")
  path = config.write_operative_config("gs://bucket/run")
  assert path == "gs://bucket/run/config.gin" and (bucket / "bucket/run/config.gin").is_file()
  writer = reporting.MetricsWriter("gs://bucket/run", enable_tensorboard=False)
  writer.write(1, {"loss": 2.0})
  writer.write(2, {"loss": 1.5})
  writer.close()
  again = reporting.MetricsWriter("gs://bucket/run", enable_tensorboard=False)  # a resumed run
  again.write(3, {"loss": 1.0})
  lines = (bucket / "bucket/run/metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]


def test_checkpoint_directories_are_listed_in_a_bucket(bucket):
  for step in (3, 12):
    (bucket / "bucket/run" / f"checkpoint_{step}").mkdir(parents=True)
  (bucket / "bucket/run/checkpoint_tmp").mkdir()
  assert checkpoints.resolve_checkpoint("gs://bucket/run") == ("gs://bucket/run", 12)
  assert checkpoints.resolve_checkpoint("gs://bucket/run/checkpoint_3") == ("gs://bucket/run", 3)
  with pytest.raises(FileNotFoundError, match="'gs://bucket/none' does not exist"):
    checkpoints.resolve_checkpoint("gs://bucket/none")


def test_checkpoints_save_and_load_through_a_file_url(tmp_path):
  params = {"kernel": jnp.arange(6, dtype=jnp.float32).reshape(2, 3)}
  replicated = {"kernel": Partitioner().replicated}
  url = f"file://{tmp_path}/run"
  ckpt = checkpoints.Checkpointer(url)
  assert ckpt.model_dir == f"{tmp_path}/run"
  ckpt.save(4, params, {}, {"batches_consumed": 4})
  ckpt.close()
  assert os.path.isdir(tmp_path / "run" / "checkpoint_4")
  loaded, step = checkpoints.load_params(url, params, replicated)
  assert step == 4
  np.testing.assert_array_equal(loaded["kernel"], params["kernel"])


def test_eval_predictions_file_goes_to_a_bucket(bucket):
  import seqio
  from tests.training import toy
  toy.register()
  task = seqio.get_mixture_or_task(toy.TASK)
  dataset = task.get_dataset(toy.LENGTHS, split="validation", shuffle=False).take(2)
  targets = [ex["targets"] for ex in dataset.as_numpy_iterator()]
  outputs = {seqio.metrics.ModelOutputType.PREDICTION: targets}
  epath.Path("gs://bucket/eval").mkdir(parents=True)  # as evaluate() does first
  eval_lib._write_predictions(task, dataset, outputs,
                              epath.Path("gs://bucket/eval/toy.predictions.jsonl"))
  rows = [json.loads(line) for line in
          (bucket / "bucket/eval/toy.predictions.jsonl").read_text().splitlines()]
  assert len(rows) == 2 and rows[0]["prediction"] == rows[0]["target"]


def test_check_writable_creates_a_local_dir_and_leaves_nothing_behind(tmp_path):
  paths.check_writable(tmp_path / "new" / "run")
  assert (tmp_path / "new" / "run").is_dir() and not list((tmp_path / "new" / "run").iterdir())
  (tmp_path / "kept.txt").write_text("mine")
  paths.check_writable(tmp_path)  # an existing directory: its files untouched
  assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt", "new"]
  assert (tmp_path / "kept.txt").read_text() == "mine"


def test_check_writable_refuses_a_file_and_a_path_under_a_file(tmp_path):
  (tmp_path / "f").write_text("data")
  with pytest.raises(paths.UnwritableDirError, match=r"MODEL_DIR '.*/f' is an existing file"):
    paths.check_writable(tmp_path / "f")
  with pytest.raises(paths.UnwritableDirError,
                     match=r"EVAL_OUTPUT_DIR '.*/f/run' cannot be written \(Not a directory"):
    paths.check_writable(tmp_path / "f" / "run", "EVAL_OUTPUT_DIR")
  assert (tmp_path / "f").read_text() == "data"


def test_check_writable_in_a_bucket(bucket):
  paths.check_writable("gs://bucket/run")
  assert (bucket / "bucket/run").is_dir() and not list((bucket / "bucket/run").iterdir())
  (bucket / "bucket/file").write_text("x")
  with pytest.raises(paths.UnwritableDirError, match="MODEL_DIR 'gs://bucket/file' is an existing"):
    paths.check_writable("gs://bucket/file")
