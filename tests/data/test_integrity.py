"""t2t.data.integrity: naming the damaged TFRecord file behind a DataLossError.

Here on a task whose source is three small TFRecord files; tests/data/test_cache.py does the
same through training on a damaged shard of seqio's cache.
"""
import seqio
import pytest
import tensorflow as tf

from t2t import eval as eval_lib
from t2t.data import integrity
from t2t.training import validation
from t2t.training.partitioning import Partitioner
from tests.training import toy

TASK = "integrity_tfrecords"


def _example(i):
  return tf.train.Example(features=tf.train.Features(feature={
      "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=[i + 3] * 20))}))


def _copy_task(ds):
  return ds.map(lambda ex: {"inputs": tf.cast(ex["tokens"], tf.int32),
                            "targets": tf.cast(ex["tokens"], tf.int32)})


@pytest.fixture
def files(tmp_path):
  paths = []
  for f in range(3):
    path = str(tmp_path / f"train.tfrecord-{f:05d}-of-00003")
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(10):
        writer.write(_example(i).SerializeToString())
    paths.append(path)
  seqio.TaskRegistry.remove(TASK)
  seqio.TaskRegistry.add(
      TASK, source=seqio.TFExampleDataSource(
          {"train": str(tmp_path / "train.tfrecord-*")},
          {"tokens": tf.io.FixedLenSequenceFeature([], tf.int64, allow_missing=True)}),
      preprocessors=[_copy_task],
      output_features={k: seqio.Feature(toy.VOCAB) for k in ("inputs", "targets")},
      metric_fns=[toy._accuracy])  # pylint: disable=protected-access  (an eval needs one)
  yield paths
  seqio.TaskRegistry.remove(TASK)


def _truncate(path, by=5):
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:-by])


def _flip_a_payload_byte(path):
  with open(path, "rb") as f:
    data = bytearray(f.read())
  data[40] ^= 0xFF  # inside the first record's payload: its CRC no longer matches
  with open(path, "wb") as f:
    f.write(bytes(data))


def test_the_task_files_are_listed_and_whole_files_pass(files):
  assert integrity.record_files(TASK, "train") == [(TASK, p) for p in files]
  assert [integrity.check_file(p) for p in files] == [None, None, None]


def test_truncated_and_corrupted_files_are_named(files):
  _truncate(files[1])
  _flip_a_payload_byte(files[2])
  found = integrity.scan(integrity.record_files(TASK, "train"))
  assert (found.checked, found.total) == (3, 3)
  assert [(d.task, d.path) for d in found.damaged] == [(TASK, files[1]), (TASK, files[2])]
  assert found.damaged[0].message.startswith("truncated record at ")
  assert found.damaged[1].message.startswith("corrupted record at ")


def test_a_training_streams_data_loss_error_becomes_one_line_naming_the_file(files):
  _truncate(files[2])
  stream = iter(seqio.get_mixture_or_task(TASK).get_dataset(
      None, split="train", shuffle=False, num_epochs=1).as_numpy_iterator())
  named = integrity.NamingDamagedFiles(stream, TASK, "train")
  with pytest.raises(integrity.DamagedDataError) as err:
    for _ in named:
      pass
  message = str(err.value)
  assert message.startswith(f"Damaged data in {TASK!r} (split 'train'): {files[2]} of "
                            f"task {TASK!r}: truncated record at "), message
  assert message.endswith("Copy or regenerate the file; the checkpoints written so far are "
                          "intact, so rerunning the same command then resumes from the last one.")
  assert "\n" not in message
  assert isinstance(err.value.__cause__, tf.errors.DataLossError)


def test_an_evaluation_or_validation_names_the_damaged_file_before_any_decoding(files, tmp_path):
  _truncate(files[0])
  with pytest.raises(integrity.DamagedDataError,
                     match=f"Damaged data in {TASK!r} \\(split 'train'\\): {files[0]} .*"
                           "Copy or regenerate the file; then rerun the same command\\."):
    eval_lib.evaluate(model=toy.model(), mixture_or_task_name=TASK, split="train",
                      checkpoint_path=str(tmp_path / "not_read"),
                      output_dir=str(tmp_path / "eval"))
  # Validation during training reads its split when its hook is made, before the first step.
  schedule = validation.Validation(split="train", batch_size=8)
  with pytest.raises(integrity.DamagedDataError, match=f"{files[0]} .*the checkpoints written"):
    schedule.hook(model=toy.model(), mixture_or_task_name=TASK, task_feature_lengths=None,
                  model_dir=str(tmp_path / "run"), partitioner=Partitioner(), start_step=0,
                  last_step=4)


def test_what_a_budget_whole_files_or_other_sources_leave_to_say(files):
  error = tf.errors.DataLossError(None, None, "truncated record at 10")
  assert str(integrity.damaged_data_error(error, TASK, "train")) == (
      f"TensorFlow reported damaged data (truncated record at 10) while reading {TASK!r} (split "
      "'train'), and all 3 of its TFRecord files read back whole now. The checkpoints written so "
      "far are intact.")
  _truncate(files[2])
  message = str(integrity.damaged_data_error(error, TASK, "train", budget_s=-1))
  assert "and 0 of its 3 TFRecord files read back whole in -1 s; " in message
  assert f"`python -m t2t.data.integrity {TASK} --split=train` checks them all" in message
  seqio.TaskRegistry.remove("integrity_function")
  seqio.TaskRegistry.add("integrity_function", source=seqio.FunctionDataSource(
      lambda split, shuffle_files: tf.data.Dataset.range(3), splits=["train"]),
      output_features={}, preprocessors=[], metric_fns=[])
  try:
    assert integrity.record_files("integrity_function", "train") == []
    assert "its sources are not TFRecord files t2t can list" in str(
        integrity.damaged_data_error(error, "integrity_function", "train"))
  finally:
    seqio.TaskRegistry.remove("integrity_function")


def test_the_command_line_check(files, capsys):
  args = [TASK, "--module_import=tests.data.test_integrity"]
  assert integrity.main(args) == 0
  assert "3 files checked, 0 damaged." in capsys.readouterr().out
  _truncate(files[0])
  assert integrity.main(args) == 1
  out = capsys.readouterr().out
  assert f"damaged: {files[0]} (task {TASK!r}): truncated record at" in out
  assert integrity.main(["no_such_task", "--module_import=tests.data.test_integrity"]) == 2
  assert "Unknown task or mixture 'no_such_task'" in capsys.readouterr().err
