"""seqio's Beam cache job on a tiny BBC task (DirectRunner), and training that reads the cache.

The job runs as a user runs it (`python -m t2t.data.cache ...`, seqio's flags) in a subprocess;
then `train()` with `use_cached_tasks=True` trains 2 steps while the raw source refuses to be
read (T2T_TEST_NO_SOURCE=1), so the batches can only have come from the cache.
"""
import importlib
import json
import os
import shutil
import subprocess

import numpy as np
import optax
import pytest
import seqio

from t2t import train as train_lib
from t2t.data import cache, integrity, vocabularies
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer
from t2t.training import input_state
from tests.data import tiny_cached_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENGTHS = {"inputs": 32, "targets": 8}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("seqio_cache"))
  command = cache.cache_command([tiny_cached_task.TASK], out,
                                module_imports=["tests.data.tiny_cached_task"], min_shards=2,
                                pipeline_options=["--direct_num_workers=1"])
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
  done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-4000:]
  return out


def test_the_job_writes_sharded_tfrecords_and_stats(cache_dir):
  task_dir = os.path.join(cache_dir, tiny_cached_task.TASK)
  files = sorted(os.listdir(task_dir))
  assert "COMPLETED" in files
  assert [f for f in files if f.startswith("train.tfrecord")] == [
      "train.tfrecord-00000-of-00002", "train.tfrecord-00001-of-00002"]
  with open(os.path.join(task_dir, "stats.train.json")) as f:
    assert json.load(f)["examples"] == tiny_cached_task.NUM_ARTICLES


def test_hosts_read_disjoint_deterministic_shards_of_the_cache(cache_dir, monkeypatch):
  monkeypatch.setenv("T2T_TEST_NO_SOURCE", "1")
  cache.add_cache_dirs([cache_dir])
  task = seqio.get_mixture_or_task(tiny_cached_task.TASK)

  # The cached examples (tokenized articles) a host reads: what Task.get_dataset(use_cached=True,
  # shard_info=...) reads before its post-cache preprocessors, since there are >= 2 files.
  source = task._get_cached_source("train")  # pylint: disable=protected-access
  assert len(source.list_shards("train")) == 2

  def host(index, num_hosts=2):
    ds = source.get_dataset("train", shuffle=False,
                            shard_info=seqio.ShardInfo(index=index, num_shards=num_hosts))
    return [tuple(ex["targets"].tolist()) for ex in ds.as_numpy_iterator()]

  a, b = host(0), host(1)
  assert a and b and not set(a) & set(b)
  assert len(a) + len(b) == tiny_cached_task.NUM_ARTICLES
  assert sorted(a + b) == sorted(host(0, num_hosts=1))  # together: the whole cache
  assert host(0) == a  # the same shard on every run


def _model():
  vocab = vocabularies.bbc_vocabulary()
  config = T5Config(vocab_size=8192, d_model=32, num_heads=2, d_kv=16, d_ff=64,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0)
  return EncoderDecoderModel(module=Transformer(config), input_vocabulary=vocab,
                             output_vocabulary=vocab)


def test_training_reads_the_cache(cache_dir, tmp_path, monkeypatch):
  monkeypatch.setenv("T2T_TEST_NO_SOURCE", "1")  # reading the raw source would now fail
  losses = []
  train_lib.train(model=_model(), mixture_or_task_name=tiny_cached_task.TASK,
                  task_feature_lengths=LENGTHS, train_steps=2, model_dir=str(tmp_path),
                  batch_size=2, optimizer=optax.adam(1e-3), checkpoint_every=2, log_every=1,
                  use_cached_tasks=True, cache_dirs=[cache_dir],
                  hooks=[lambda step, state, metrics, batch: losses.append(metrics["loss"])])
  assert len(losses) == 2 and np.all(np.isfinite(losses))
  assert input_state.exists(str(tmp_path), 2)  # a TFRecord pipeline is checkpointable too


def test_a_damaged_cache_shard_stops_training_with_its_name(cache_dir, tmp_path, monkeypatch):
  damaged = tmp_path / "cache"
  shutil.copytree(cache_dir, damaged)
  shard = damaged / tiny_cached_task.TASK / "train.tfrecord-00001-of-00002"
  shard.write_bytes(shard.read_bytes()[:-7])  # its last record cut short
  monkeypatch.setenv("T2T_TEST_NO_SOURCE", "1")
  monkeypatch.setattr(seqio.utils, "_GLOBAL_CACHE_DIRECTORIES", [])
  tiny_cached_task.register()  # a fresh Task: seqio remembers where it found the cache
  try:
    with pytest.raises(integrity.DamagedDataError) as err:
      train_lib.train(model=_model(), mixture_or_task_name=tiny_cached_task.TASK,
                      task_feature_lengths=LENGTHS, train_steps=2, model_dir=str(tmp_path / "run"),
                      batch_size=2, optimizer=optax.adam(1e-3), checkpoint_every=2,
                      use_cached_tasks=True, cache_dirs=[str(damaged)])
  finally:
    monkeypatch.undo()
    tiny_cached_task.register()  # forget the damaged copy
  message = str(err.value)
  assert message.startswith(
      f"Damaged data in the cache of {tiny_cached_task.TASK!r} (split 'train'): "
      f"{shard} of task {tiny_cached_task.TASK!r}: truncated record at "), message
  assert (f"--tasks={tiny_cached_task.TASK} --output_cache_dir={damaged} " in message
          and message.count("--overwrite") == 1), message
  assert "USE_CACHED_TASKS = False" in message


def test_uncacheable_or_uncached_tasks_are_clear_errors(tmp_path):
  importlib.import_module("tasks.bbc")  # registers the BBC tasks
  with pytest.raises(ValueError, match="'bbc_topic'.*has no cache point.*CacheDatasetPlaceholder"):
    cache.check_cached("bbc_topic")
  assert seqio.get_mixture_or_task("bbc_span_corruption_cached").supports_caching
  registered = seqio.get_mixture_or_task(tiny_cached_task.TASK)
  seqio.TaskRegistry.remove("bbc_tiny_uncached")
  seqio.TaskRegistry.add("bbc_tiny_uncached", source=registered.source,
                         preprocessors=registered.preprocessors,
                         output_features=registered.output_features, metric_fns=[])
  try:
    with pytest.raises(ValueError, match="'bbc_tiny_uncached' is not cached in any of .*"
                                         "t2t.data.cache --tasks=bbc_tiny_uncached"):
      cache.check_cached("bbc_tiny_uncached")
  finally:
    seqio.TaskRegistry.remove("bbc_tiny_uncached")


def test_the_cache_job_refuses_tasks_it_would_not_cache_before_beam_starts(tmp_path, capsys,
                                                                          monkeypatch):
  # seqio's job logged "No tasks have been selected" (or skipped the task) and exited 0.
  importlib.import_module("tasks.bbc")
  with pytest.raises(ValueError, match="Unknown task or mixture 'bbc_topc'. Did you mean: "
                                       "bbc_topic.*--module_import=my.tasks"):
    cache.check_cache_job_tasks(["bbc_topc"])
  with pytest.raises(ValueError, match="--tasks=bbc_topic: task 'bbc_topic' has no cache point "
                                       r"\(no seqio.CacheDatasetPlaceholder\(\).*write nothing"):
    cache.check_cache_job_tasks(["bbc_topic"])
  with pytest.raises(ValueError, match="pattern 'bbc_.*x' matches no registered task"):
    cache.check_cache_job_tasks(["bbc_.*x"])
  with pytest.raises(ValueError, match="every task 'bbc_span_corruption_cached' names .* is "
                                       "excluded"):
    cache.check_cache_job_tasks(["bbc_span_corruption_cached"], ["bbc_.*"])
  assert cache.check_cache_job_tasks(["bbc_span_corruption_cached", "bbc_topic|bbc_span.*"]) == [
      "bbc_span_corruption_cached"]  # a regex may select tasks seqio skips, if it caches one
  # The command line: one line, exit status 1, nothing written.
  out = tmp_path / "cache"
  monkeypatch.setattr("sys.argv", ["t2t.data.cache", "--tasks=bbc_topc",
                                   f"--output_cache_dir={out}", "--module_import=tasks.bbc"])
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    cache.main()
  err = capsys.readouterr().err
  assert exit_.value.code == 1 and not out.exists()
  assert err.strip().splitlines()[0].startswith("error: Unknown task or mixture 'bbc_topc'."), err
