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
                 # rows whose tests live beside their modules:
                 "is corrupted", "No readable checkpoint",  # tests/training/test_checkpoints.py
                 "was not finite"):  # tests/training/test_nonfinite.py
    assert phrase in text, phrase
