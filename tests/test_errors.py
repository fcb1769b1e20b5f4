"""Every row of docs/errors.md: the situation triggered through the public function or the CLI,
and the message t2t prints checked. Keep the two in step (test_the_catalogue_lists_every_case)."""
import os
import pathlib
import subprocess
import sys
import types

import importlib

import gin
import pytest
import seqio
import tensorflow as tf

from t2t import config, errors
from t2t.data import objectives, registry
from tests.support.environment import xla_flags_with

ROOT = pathlib.Path(__file__).resolve().parent.parent
importlib.import_module("tasks")  # registers bbc_topic
FEATURES = {k: seqio.Feature(seqio.PassThroughVocabulary(100), add_eos=True)
            for k in ("inputs", "targets")}


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_unknown_task():
  with pytest.raises(ValueError, match=r"Unknown task or mixture 'bbc_topc'\. Did you mean: bbc_topic"):
    registry.get_mixture_or_task("bbc_topc")


def test_misspelt_gin_parameter():
  with pytest.raises(config.GinConfigError,
                     match=r"doesn't have a parameter named 'd_modle'[\s\S]*Did you mean 'd_model'\?"):
    config.parse_gin(["experiments/bbc_demo/pretrain.gin"], ["T5Config.d_modle = 32"])


def test_misspelt_configurable():
  with pytest.raises(config.GinConfigError,
                     match=r"No configurable matching 'T5Confg'[\s\S]*Did you mean 'T5Config'( or '\w+')*\?"):
    config.parse_gin(["experiments/bbc_demo/pretrain.gin"], ["T5Confg.d_model = 32"])


def test_misspelt_macro():
  with pytest.raises(config.GinConfigError, match=(
      r"Required gin macros left unset \(you set 'MODEL_DIRR': did you mean 'MODEL_DIR'\?\)")):
    config.parse_gin(["experiments/bbc_demo/pretrain.gin"], ["MODEL_DIRR = '/tmp/x'"])


def test_missing_gin_file():
  with pytest.raises(config.GinConfigError, match=r"Gin file 'runs/pretrian.gin' not found"):
    config.parse_gin(["runs/pretrian.gin"])


def test_an_include_of_a_missing_file_and_an_unclosed_binding(tmp_path):
  # Both were tracebacks (gin's OSError, the tokenizer's TokenError) until an audit found them.
  including = tmp_path / "mine.gin"
  including.write_text("include 'nope/missing.gin'\n")
  with pytest.raises(config.GinConfigError, match=r"Could not parse the gin configuration "
                                                  r"\(.*mine.gin.*nope/missing.gin"):
    config.parse_gin([str(including)])
  with pytest.raises(config.GinConfigError, match=r"Could not parse .*'TRAIN_STEPS = \[1,'.*EOF"):
    config.parse_gin(["runs/pretrain.gin"], ["TRAIN_STEPS = [1,"])


def test_feature_lengths_too_short_for_the_objective():
  ds = tf.data.Dataset.from_tensors({"targets": tf.constant([5, 6, 7])})
  with pytest.raises(ValueError, match=r"prefix_lm needs feature lengths >= 3"):
    objectives.prefix_lm(ds, {"inputs": 2, "targets": 2}, FEATURES)
  with pytest.raises(ValueError, match=r"span_corruption: sequence_length\['inputs'\] must be >= 2"):
    objectives.span_corruption(ds, {"inputs": 1}, FEATURES)


def test_input_file_that_does_not_exist(tmp_path):
  from t2t import infer
  model = types.SimpleNamespace(feature_converter_cls=lambda pack: None)  # never reached
  with pytest.raises(FileNotFoundError, match=r"INPUT_FILE '.*nope\.txt' does not exist"):
    infer.infer(model=model, checkpoint_path=str(tmp_path), output_dir=str(tmp_path),
                task_feature_lengths={"inputs": 8, "targets": 4},
                input_file=str(tmp_path / "nope.txt"))
  # A directory, and text that is not UTF-8: each named as what it is (an audit found "does not
  # exist" and a bare UnicodeDecodeError naming no file).
  (tmp_path / "latin1.txt").write_bytes("caf\u00e9\nna\u00efve\n".encode("utf-8") + b"r\xe9sum\xe9\n")
  for name, message in (("", r"is a directory, not a text file"),
                        ("latin1.txt", r"latin1\.txt', line 3: not UTF-8 text \(invalid "
                                       r"continuation byte at byte 14\)")):
    with pytest.raises((FileNotFoundError, ValueError), match=message):
      infer.infer(model=model, checkpoint_path=str(tmp_path), output_dir=str(tmp_path),
                  task_feature_lengths={"inputs": 8, "targets": 4},
                  input_file=str(tmp_path / name))


def test_a_checkpoint_path_that_is_a_file(tmp_path):
  from t2t.training import checkpoints  # pylint: disable=g-import-not-at-top
  (tmp_path / "metrics.jsonl").write_text("{}\n")
  with pytest.raises(FileNotFoundError, match=r"metrics\.jsonl' is a file, not a checkpoint: "
                                              r"give a model directory"):
    checkpoints.resolve_checkpoint(str(tmp_path / "metrics.jsonl"))


# --- An empty split ---------------------------------------------------------------------------
EMPTY_TSV = "errors_empty_tsv"
ALL_FILTERED = "errors_all_filtered"
MIXTURE = "errors_mixture_with_an_empty_task"


def _ids(line):
  return tf.strings.to_number(tf.strings.split(line), tf.int32)


@pytest.fixture(scope="module")
def empty_tasks(tmp_path_factory):
  """A task over an empty text file (train and validation), one whose filter drops every
  example of a real source, and a mixture sampling the latter beside a good task."""
  import numpy as np
  sys.path.insert(0, str(ROOT / "tests" / "training"))
  import toy  # pylint: disable=g-import-not-at-top
  toy.register()
  empty = tmp_path_factory.mktemp("data") / "empty.tsv"
  empty.write_text("")
  features = {k: seqio.Feature(toy.VOCAB, add_eos=True) for k in ("inputs", "targets")}
  accuracy = lambda targets, predictions: {"accuracy": float(np.mean(  # noqa: E731
      [t == p for t, p in zip(targets, predictions)]))}
  for name in (EMPTY_TSV, ALL_FILTERED, MIXTURE):
    seqio.TaskRegistry.remove(name)
    seqio.MixtureRegistry.remove(name)
  seqio.TaskRegistry.add(
      EMPTY_TSV, source=seqio.TextLineDataSource({"train": str(empty), "validation": str(empty)}),
      preprocessors=[lambda ds: ds.map(lambda line: {"inputs": _ids(line), "targets": _ids(line)}),
                     seqio.preprocessors.append_eos_after_trim],
      output_features=features, metric_fns=[accuracy])
  seqio.TaskRegistry.add(
      ALL_FILTERED, source=seqio.get_mixture_or_task(toy.TASK).source,
      preprocessors=[lambda ds: ds.filter(lambda ex: tf.size(ex["inputs"]) > 1000),
                     seqio.preprocessors.append_eos_after_trim],
      output_features=features)
  seqio.MixtureRegistry.add(MIXTURE, [(toy.TASK, 1.0), (ALL_FILTERED, 1.0)])
  yield toy
  for name in (EMPTY_TSV, ALL_FILTERED, MIXTURE):
    seqio.TaskRegistry.remove(name)
    seqio.MixtureRegistry.remove(name)


def _train(toy, model_dir, **overrides):
  import optax  # pylint: disable=g-import-not-at-top
  from t2t import train  # pylint: disable=g-import-not-at-top
  kwargs = dict(model=toy.model(), mixture_or_task_name=toy.TASK, task_feature_lengths=toy.LENGTHS,
                train_steps=2, model_dir=str(model_dir), batch_size=2, optimizer=optax.sgd(0.1),
                checkpoint_every=2, log_every=1)
  return train.train(**{**kwargs, **overrides})


def test_training_on_an_empty_split_fails_fast(empty_tasks, tmp_path):
  # Without the check: "The training data ran out at step 0" after compiling the step.
  with pytest.raises(registry.EmptySplitError,
                     match=rf"Task '{EMPTY_TSV}' yields no examples on split 'train'"):
    _train(empty_tasks, tmp_path / "run", mixture_or_task_name=EMPTY_TSV)
  assert not list((tmp_path / "run").glob("checkpoint_*"))


def test_a_mixture_with_an_all_filtered_task_fails_instead_of_hanging(empty_tasks):
  # Without the check, the first batch never comes: repeat() over a source whose every example
  # the filter drops spins forever, and so does the mixture sampling it.
  from t2t.training import inputs  # pylint: disable=g-import-not-at-top
  model = empty_tasks.model()
  with pytest.raises(registry.EmptySplitError, match=(
      rf"Task '{ALL_FILTERED}' \(in mixture '{MIXTURE}'\) yields no examples on split 'train' "
      "after its preprocessors")):
    inputs.train_batches(MIXTURE, empty_tasks.LENGTHS, model.feature_converter_cls(pack=True), 2,
                         seed=0)


def test_eval_and_infer_on_an_empty_split(empty_tasks, tmp_path):
  from t2t import eval as eval_lib, infer  # pylint: disable=g-import-not-at-top
  model = empty_tasks.model()
  nowhere = str(tmp_path / "no_checkpoint")  # never read: the split is refused first
  with pytest.raises(registry.EmptySplitError,
                     match=rf"Task '{EMPTY_TSV}' yields no examples on split 'validation'"):
    eval_lib.evaluate(model=model, mixture_or_task_name=EMPTY_TSV, checkpoint_path=nowhere,
                      output_dir=str(tmp_path / "eval"), task_feature_lengths=empty_tasks.LENGTHS)
  with pytest.raises(registry.EmptySplitError,
                     match=rf"Task '{EMPTY_TSV}' yields no examples on split 'validation'"):
    infer.infer(model=model, mixture_or_task_name=EMPTY_TSV, split="validation",
                checkpoint_path=nowhere, output_dir=str(tmp_path / "infer"),
                task_feature_lengths=empty_tasks.LENGTHS)
  (tmp_path / "empty.txt").write_text("")
  with pytest.raises(ValueError, match=r"INPUT_FILE '.*empty\.txt' is empty: nothing to decode"):
    infer.infer(model=model, input_file=str(tmp_path / "empty.txt"), checkpoint_path=nowhere,
                output_dir=str(tmp_path / "infer"), task_feature_lengths=empty_tasks.LENGTHS)


def test_limited_task_of_nothing(empty_tasks):
  from t2t.data import limited  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=r"limited_task.num_examples must be positive, got 0"):
    limited.limited_task(empty_tasks.TASK, 0, seed=1)
  with pytest.raises(registry.EmptySplitError,
                     match=rf"Task '{EMPTY_TSV}' yields no examples on split 'train' \(its source"):
    limited.limited_task(EMPTY_TSV, 10, seed=1)


# --- Unwritable output directories --------------------------------------------------------------
def test_unwritable_model_dir_fails_before_anything(empty_tasks, tmp_path):
  from t2t import eval as eval_lib, infer  # pylint: disable=g-import-not-at-top
  from t2t.training import paths  # pylint: disable=g-import-not-at-top
  (tmp_path / "taken").write_text("keep me")
  with pytest.raises(paths.UnwritableDirError,
                     match=r"MODEL_DIR '.*taken/run' cannot be written \(Not a directory"):
    _train(empty_tasks, tmp_path / "taken" / "run")
  with pytest.raises(paths.UnwritableDirError, match=r"MODEL_DIR '.*taken' is an existing file"):
    _train(empty_tasks, tmp_path / "taken")
  assert (tmp_path / "taken").read_text() == "keep me"
  model = empty_tasks.model()
  with pytest.raises(paths.UnwritableDirError, match=r"EVAL_OUTPUT_DIR '.*taken' is an existing"):
    eval_lib.evaluate(model=model, mixture_or_task_name=empty_tasks.TASK, checkpoint_path="x",
                      output_dir=str(tmp_path / "taken"))
  with pytest.raises(paths.UnwritableDirError, match=r"INFER_OUTPUT_DIR '.*taken' is an existing"):
    infer.infer(model=model, mixture_or_task_name=empty_tasks.TASK, checkpoint_path="x",
                output_dir=str(tmp_path / "taken"), task_feature_lengths=empty_tasks.LENGTHS)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only directory")
def test_model_dir_under_a_read_only_directory(empty_tasks, tmp_path):
  from t2t.training import paths  # pylint: disable=g-import-not-at-top
  (tmp_path / "ro").mkdir()
  (tmp_path / "ro").chmod(0o555)
  try:
    with pytest.raises(paths.UnwritableDirError,
                       match=r"MODEL_DIR '.*ro/run' cannot be written \(Permission denied"):
      _train(empty_tasks, tmp_path / "ro" / "run")
  finally:
    (tmp_path / "ro").chmod(0o755)


# --- A checkpoint of another vocabulary ----------------------------------------------------------
def test_fine_tuning_from_a_checkpoint_of_another_vocabulary(empty_tasks, tmp_path):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from t2t.data import vocabularies  # pylint: disable=g-import-not-at-top
  from t2t.training import checkpoints, input_state  # pylint: disable=g-import-not-at-top
  # What `t2t.train` records for a run on the BBC vocabulary (tests/training/test_vocab_check.py
  # checks the record itself; the vocabulary is compared before any parameter shape).
  bbc = vocabularies.fingerprint(vocabularies.bbc_vocabulary())
  meta = input_state.run_meta("bbc_topic", 8, {"inputs": 16, "targets": 4}, True, False)
  assert meta["vocabulary"]["inputs"] == bbc
  ckpt = checkpoints.Checkpointer(str(tmp_path / "pretrained"))
  ckpt.save(7, {"w": jnp.zeros((2,))}, {}, meta)
  ckpt.close()
  with pytest.raises(checkpoints.VocabularyMismatchError, match=(
      r"The checkpoint at .*pretrained/checkpoint_7 was trained with another vocabulary: inputs: "
      r"SentencePieceVocabulary \(8100 ids, 100 extra ids, sentencepiece sha256 [0-9a-f]{16}\) "
      r"in the checkpoint, PassThroughVocabulary \(64 ids, 0 extra ids\) now")):
    _train(empty_tasks, tmp_path / "run", initial_checkpoint_path=str(tmp_path / "pretrained"))
  assert not list((tmp_path / "run").glob("checkpoint_*"))


def test_a_vocabulary_file_out_of_reach(empty_tasks, tmp_path):
  # The models' default is T5's vocabulary on gs://, out of reach offline; a missing local file
  # fails the same way. Without the check: TensorFlow's NotFoundError (or, for gs://, a
  # FailedPreconditionError from libcurl) deep inside model initialisation.
  from t2t import eval as eval_lib, infer  # pylint: disable=g-import-not-at-top
  missing = str(tmp_path / "t5" / "spiece.model")
  model = empty_tasks.model()
  model.input_vocabulary = seqio.SentencePieceVocabulary(missing)
  message = (rf"The model's input vocabulary cannot be read from {missing}: .*No such file.* "
             r"t2t downloads nothing: point seqio\.SentencePieceVocabulary\.sentencepiece_model_file")
  with pytest.raises(ValueError, match=message):
    _train(empty_tasks, tmp_path / "run", model=model)
  assert not list((tmp_path / "run").glob("checkpoint_*"))
  with pytest.raises(ValueError, match=message):
    eval_lib.evaluate(model=model, mixture_or_task_name=empty_tasks.TASK, checkpoint_path="x",
                      output_dir=str(tmp_path / "eval"))
  with pytest.raises(ValueError, match=message):
    infer.infer(model=model, checkpoint_path="x", output_dir=str(tmp_path / "infer"),
                task_feature_lengths=empty_tasks.LENGTHS, input_file=str(tmp_path / "in.txt"))


@pytest.mark.parametrize("override,message", [
    (dict(train_steps="abc"), r"TRAIN_STEPS \(train.train_steps\) must be a whole number >= 1, "
                              r"got 'abc' \(str\)"),
    (dict(train_steps=-5), r"TRAIN_STEPS .* got -5"),
    (dict(batch_size=0), r"BATCH_SIZE \(train.batch_size\) must be a whole number >= 1, got 0"),
    (dict(seed="abc"), r"SEED \(train.seed\) must be a whole number"),
    (dict(use_packing="no"), r"USE_PACKING \(train.use_packing\) must be True or False"),
    (dict(task_feature_lengths={"inputs": 16}), r"TASK_FEATURE_LENGTHS .* no length for "
                                                 r"feature\(s\) \['targets'\]"),
    (dict(task_feature_lengths={"inputs": 16.5, "targets": 16}), r"every length must be a whole"),
    (dict(model_dir=""), r"MODEL_DIR \(train.model_dir\) must be a directory path"),
])
def test_gin_values_of_the_wrong_kind_are_named_before_anything_runs(empty_tasks, tmp_path,
                                                                   override, message):
  # Found by an audit: tracebacks from the loop, JAX or tf.data, or a run that did otherwise.
  model_dir = override.pop("model_dir", tmp_path / "run")
  with pytest.raises(ValueError, match=message):
    _train(empty_tasks, model_dir, **override)
  assert not (tmp_path / "run").exists()  # checked before MODEL_DIR is created


def test_eval_and_infer_values_of_the_wrong_kind(empty_tasks, tmp_path):
  from t2t import eval as eval_lib, infer  # pylint: disable=g-import-not-at-top
  common = dict(model=empty_tasks.model(), mixture_or_task_name=empty_tasks.TASK,
                checkpoint_path="x")
  for kwargs, message in ((dict(num_examples=0), r"EVAL_NUM_EXAMPLES .* or None \(the whole "
                                                 r"split\), got 0"),
                          (dict(batch_size=0), r"EVAL_BATCH_SIZE .* got 0"),
                          (dict(output_dir=""), r"EVAL_OUTPUT_DIR .* directory path")):
    with pytest.raises(ValueError, match=message):
      eval_lib.evaluate(**{"output_dir": str(tmp_path / "eval"), **common, **kwargs})
  for kwargs, message in ((dict(batch_size=0), r"INFER_BATCH_SIZE .* got 0"),
                          (dict(num_examples=0), r"INFER_NUM_EXAMPLES .* got 0"),
                          (dict(task_feature_lengths={"inputs": 32, "targets": 0}),
                           r"TASK_FEATURE_LENGTHS \(infer.task_feature_lengths\): every length")):
    with pytest.raises(ValueError, match=message):
      infer.infer(**{"output_dir": str(tmp_path / "infer"), "model": common["model"],
                     "checkpoint_path": "x", "task_feature_lengths": empty_tasks.LENGTHS,
                     "mixture_or_task_name": empty_tasks.TASK, **kwargs})
  assert not (tmp_path / "eval").exists() and not (tmp_path / "infer").exists()


# --- Batch size and sequence length against the model -------------------------------------------
def test_batch_not_divisible_by_the_mesh():
  # One device cannot hold a mesh with more data shards than the batch: 4 simulated devices.
  code = ("from t2t.training.partitioning import Partitioner\n"
          "from t2t import errors\n"
          "try:\n  Partitioner().check_batch_size(6)\n"
          "except ValueError as e:\n  assert errors.is_user_error(e)\n  print(e)\n")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
         "XLA_FLAGS": xla_flags_with("--xla_force_host_platform_device_count=4")}
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert ("BATCH_SIZE=6 must be divisible by the 1 processes and then by each process's 4 data "
          "shards (data-parallel size 4 (devices 4 / num_partitions 1))") in out.stdout


def test_bert_sequence_longer_than_its_position_table(tmp_path):
  from t2t import cli, train  # pylint: disable=g-import-not-at-top
  config.parse_gin(["experiments/bert_bbc/pretrain.gin"], [
      f"MODEL_DIR = '{tmp_path / 'run'}'", "BATCH_SIZE = 2",
      "TASK_FEATURE_LENGTHS = {'inputs': 200, 'targets': 200}"])  # MAX_POSITIONS = 128 (tiny)
  with pytest.raises(ValueError) as raised:
    train.train()  # refused when the Trainer is built: nothing compiled, restored or written
  message = cli.user_message(raised.value)
  assert message == (
      "BERT: sequence length 200 (from TASK_FEATURE_LENGTHS) exceeds "
      "BertConfig.max_position_embeddings=128, the rows of its learned position table; shorten "
      "TASK_FEATURE_LENGTHS, or raise max_position_embeddings (MAX_POSITIONS) when training from "
      "scratch."), message
  assert "In call to configurable" in str(raised.value)  # gin's lines, which the CLI drops
  assert errors.is_user_error(raised.value)
  assert not list((tmp_path / "run").glob("checkpoint_*"))


def test_xla_runtime_error_is_not_a_user_error():
  assert not errors.is_user_error(RuntimeError("RESOURCE_EXHAUSTED: Out of memory"))
  assert errors.is_user_error(errors.UserError("bad input"))
  assert errors.is_user_error(config.GinConfigError("bad gin"))


def test_the_cli_prints_one_line():
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run([sys.executable, "-m", "t2t.train",
                        "--gin_file=experiments/bbc_demo/pretrain.gin", "--gin.T5Config.d_modle=32"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  assert "error: Could not parse the gin configuration" in out.stderr
  assert "Did you mean 'd_model'?" in out.stderr


def test_the_catalogue_lists_every_case():
  text = (ROOT / "docs" / "errors.md").read_text()
  for phrase in ("Unknown task or mixture", "doesn't have a parameter named", "No configurable matching",
                 "Required gin macros left unset", "Gin file", "prefix_lm needs feature lengths",
                 "must be >= 2", "INPUT_FILE", "RESOURCE_EXHAUSTED",
                 "yields no examples on split", "is empty: nothing to decode",
                 "limited_task.num_examples must be positive", "cannot be written",
                 "is an existing file", "was trained with another vocabulary",
                 "the vocabulary changed", "must be divisible by the",
                 "BertConfig.max_position_embeddings", "relative position",
                 "cannot be read from", "is not a SentencePiece model",  # + test_vocabularies.py
                 "must be a whole number >= 1", "must be True or False", "mixes vocabularies",
                 "Unable to open file",
                 "a half-written file?",  # test_restarts.py, test_phases.py, test_study.py, ...
                 "has no cache point",  # tests/data/test_cache.py
                 "already holds a model",  # tests/tools/test_convert_checkpoint.py
                 # rows whose tests live beside their modules:
                 "is corrupted", "No readable checkpoint",  # tests/training/test_checkpoints.py
                 "cannot be read (DIR/checkpoint_N/params",  # ... and test_warm_start.py
                 "Damaged data in the cache of",  # tests/data/test_cache.py
                 "expected 2 tab-separated fields", "no file matches",  # tests/data/test_files.py
                 "No space left on the device while writing checkpoint",  # ... and test_kill_resume
                 "was not finite"):  # tests/training/test_nonfinite.py
    assert phrase in text, phrase
