"""Tests for t2t/config.py: gin search paths, the --gin.X=V shorthand, REQUIRED macros."""
import os

import gin
import pytest

from t2t import config


def test_rewrite_gin_args_quotes_bare_words_and_keeps_gin_values():
  argv = ["prog", "--gin.MODEL_DIR=/tmp/run", "--gin.TRAIN_STEPS=10", "--gin.LR=1e-3",
          "--gin.NAME='x'", "--gin.M=@foo()", "--gin.F=%BAR", "--gin.L={'inputs': 8}",
          "--gin.B=True", "--gin_file=a.gin"]
  out = config.rewrite_gin_args(argv)
  assert out == ["prog", "--gin_bindings=MODEL_DIR = '/tmp/run'",
                 "--gin_bindings=TRAIN_STEPS = 10", "--gin_bindings=LR = 1e-3",
                 "--gin_bindings=NAME = 'x'", "--gin_bindings=M = @foo()",
                 "--gin_bindings=F = %BAR", "--gin_bindings=L = {'inputs': 8}",
                 "--gin_bindings=B = True", "--gin_file=a.gin"]


def test_gin_files_are_found_in_the_checkout_from_any_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  path = config.resolve_gin_file("runs/pretrain.gin")
  assert path.name == "pretrain.gin" and path.is_file()


def test_missing_gin_file_names_the_file_and_the_search_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(config.GinConfigError, match=r"'runs/nope.gin' not found.*Searched"):
    config.resolve_gin_file("runs/nope.gin")


def _write(tmp_path, text):
  path = tmp_path / "exp.gin"
  path.write_text(text)
  return str(path)


def test_unset_required_macro_names_the_macro_and_the_file_declaring_it(tmp_path):
  exp = _write(tmp_path, "include 'runs/pretrain.gin'\nMODEL = None\n"
               "MIXTURE_OR_TASK_NAME = 'x'\nTASK_FEATURE_LENGTHS = {'inputs': 4, 'targets': 4}\n"
               "TRAIN_STEPS = 1\n")
  with pytest.raises(config.GinConfigError) as err:
    config.parse_gin([exp])
  message = str(err.value)
  assert "MODEL_DIR" in message
  assert os.path.join("runs", "pretrain.gin") in message
  assert "TRAIN_STEPS" not in message  # set, so not reported


def test_required_macro_set_by_binding_passes(tmp_path):
  exp = _write(tmp_path, "include 'runs/finetune.gin'\nMODEL = None\n")
  config.parse_gin([exp], ["MIXTURE_OR_TASK_NAME = 'x'", "TASK_FEATURE_LENGTHS = None",
                           "TRAIN_STEPS = 3", "MODEL_DIR = '/tmp/m'",
                           "INITIAL_CHECKPOINT_PATH = None"])
  assert gin.query_parameter("%TRAIN_STEPS") == 3
  assert gin.query_parameter("%LEARNING_RATE") == 0.001


def test_bad_binding_is_a_config_error(tmp_path):
  exp = _write(tmp_path, "X = 1\n")
  with pytest.raises(config.GinConfigError, match="Could not parse"):
    config.parse_gin([exp], ["nonexistent_configurable.param = 3"])


def test_write_operative_config(tmp_path):
  @gin.configurable
  def fn(a=1):
    return a
  gin.parse_config("fn.a = 7")
  assert fn() == 7
  path = config.write_operative_config(str(tmp_path / "model"))
  assert "fn.a = 7" in open(path).read()


def test_includes_resolve_when_the_current_directory_has_a_runs_folder(tmp_path, monkeypatch):
  # A `runs/` (or `models/`) directory in cwd used to make gin's resource reader crash on
  # `include 'runs/...'`, e.g. after the demo wrote runs/bbc_demo.
  (tmp_path / "runs" / "bbc_demo").mkdir(parents=True)
  (tmp_path / "models").mkdir()
  monkeypatch.chdir(tmp_path)
  config.parse_gin(["experiments/bbc_demo/finetune.gin"],
                   ["MODEL_DIR = '/tmp/m'", "INITIAL_CHECKPOINT_PATH = None"])
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME") == "bbc_topic"
