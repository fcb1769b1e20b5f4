"""Tests for t2t/data/files.py: TSV and JSON Lines files as a seqio task, on BBC articles.

The files are written from the offline BBC corpus (a few articles' openings and their
categories); the unit tests read them in this process, and one test trains on them through
`python -m t2t.train` with `gin/recipes/files_task.gin`, as a user would. `tests/test_eval.py`
evaluates a files task against the registered task it copies.
"""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import seqio

from t2t.data import files, registry, sources, vocabularies

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = vocabularies.bbc_vocabulary()


def _pairs(split, n):
  """(opening of the article, category) for the first `n` articles of a BBC split."""
  return [(" ".join(a["text"].split())[:200], a["category"])
          for a in sources.bbc_articles(split)[:n]]


def _write_tsv(path, pairs, header=None, newline="\n"):
  lines = ([header] if header else []) + [f"{x}\t{y}" for x, y in pairs]
  path.write_bytes(("".join(line + newline for line in lines)).encode("utf-8"))
  return str(path)


def _write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
  return str(path)


def _rows(name, split, **kwargs):
  task = seqio.get_mixture_or_task(name)
  return list(task.source.get_dataset(split, shuffle=False, **kwargs).as_numpy_iterator())


def test_tsv_and_jsonl_splits_hold_the_files_examples_in_order(tmp_path):
  train, dev = _pairs("train", 12), _pairs("validation", 5)
  # A blank line and a final line without its line break: both are how files come.
  tsv = _write_tsv(tmp_path / "train.tsv", train[:6])
  with open(tsv, "a", encoding="utf-8") as f:
    f.write("\n" + "\n".join(f"{x}\t{y}" for x, y in train[6:]))
  jsonl = _write_jsonl(tmp_path / "dev.jsonl",
                       [{"text": x, "label": y, "source": "bbc"} for x, y in dev])
  name = files.files_task("files_test_topic", {"train": tsv, "validation": jsonl},
                          prefix="topic:", inputs_key="text", targets_key="label",
                          vocabulary=VOCAB, metrics=["accuracy", "macro_f1"])
  assert name == "files_test_topic"
  task = seqio.get_mixture_or_task(name)
  assert task.num_input_examples("train") == 12 and task.num_input_examples("validation") == 5

  rows = _rows(name, "train")
  assert [(r["inputs"].decode(), r["targets"].decode()) for r in rows] == train
  # Line 7 is the blank one: ids count the file's lines, as an editor shows them.
  assert [r["id"].decode() for r in rows] == [f"train.tsv:{n}" for n in [*range(1, 7),
                                                                         *range(8, 14)]]
  assert [r["id"].decode() for r in _rows(name, "validation")] == [
      f"dev.jsonl:{n}" for n in range(1, 6)]

  # Preprocessed: the prefix, tokens of the bbc vocabulary, EOS; the texts kept for eval.
  ds = task.get_dataset({"inputs": 512, "targets": 8}, split="validation", shuffle=False)
  for example, (text, label) in zip(ds.as_numpy_iterator(), dev):
    assert example["inputs_pretokenized"].decode() == f"topic: {text}"
    assert list(example["inputs"]) == [*VOCAB.encode(f"topic: {text}"), 1]
    assert list(example["targets"]) == [*VOCAB.encode(label), 1]
    assert example["targets_pretokenized"].decode() == label
  assert [f.__name__ for f in task.metric_fns] == ["accuracy", "macro_f1"]
  assert task.postprocess_fn(" sport ", example=None, is_target=False) == "sport"


def test_globs_gzip_headers_crlf_byte_order_marks_and_numbers(tmp_path):
  pairs = _pairs("train", 6)
  (tmp_path / "shards").mkdir()
  for i, part in enumerate((pairs[:3], pairs[3:])):
    text = "\ufeffinputs\ttargets\r\n" + "".join(f"{x}\t{y}\r\n" for x, y in part)
    (tmp_path / "shards" / f"train-{i}.tsv.gz").write_bytes(gzip.compress(text.encode("utf-8")))
  labels = _write_jsonl(tmp_path / "labels.json", [{"inputs": "two", "targets": 2},
                                                     {"inputs": "half", "targets": 0.5}])
  name = files.files_task("files_test_shards",
                          {"train": str(tmp_path / "shards" / "train-*.tsv.gz"),
                           "test": [labels]}, tsv_header=True, vocabulary=VOCAB)
  rows = _rows(name, "train")
  assert [(r["inputs"].decode(), r["targets"].decode()) for r in rows] == pairs
  assert [r["id"].decode() for r in rows][:4] == ["train-0.tsv.gz:2", "train-0.tsv.gz:3",
                                                  "train-0.tsv.gz:4", "train-1.tsv.gz:2"]
  assert [r["targets"].decode() for r in _rows(name, "test")] == ["2", "0.5"]


def test_hosts_read_disjoint_shards_and_shuffling_follows_the_seed(tmp_path):
  tsv = _write_tsv(tmp_path / "train.tsv", _pairs("train", 11))
  name = files.files_task("files_test_sharded", {"train": tsv}, vocabulary=VOCAB)
  source = seqio.get_mixture_or_task(name).source
  everything = [r["id"] for r in _rows(name, "train")]
  task = seqio.get_mixture_or_task(name)
  shards = [[r["id"] for r in task.get_dataset({"inputs": 32, "targets": 4}, split="train",
                                                shuffle=False, shard_info=seqio.ShardInfo(i, 3))
             .as_numpy_iterator()] for i in range(3)]  # seqio's path: sharded once, by the source
  assert shards == [everything[i::3] for i in range(3)]

  def shuffled(seed):
    return [r["id"] for r in source.get_dataset("train", shuffle=True, seed=seed)
            .as_numpy_iterator()]
  assert shuffled(7) == shuffled(7) and sorted(shuffled(7)) == sorted(everything)
  assert shuffled(7) != shuffled(8) and shuffled(7) != everything


def test_the_same_arguments_keep_the_task_and_others_replace_it(tmp_path):
  a = _write_tsv(tmp_path / "a.tsv", _pairs("train", 3))
  b = _write_tsv(tmp_path / "b.tsv", _pairs("validation", 2))
  files.files_task("files_test_again", {"train": a}, vocabulary=VOCAB)
  task = seqio.get_mixture_or_task("files_test_again")
  assert files.files_task("files_test_again", {"train": a}, vocabulary=VOCAB) == "files_test_again"
  assert seqio.get_mixture_or_task("files_test_again") is task
  files.files_task("files_test_again", {"train": b}, vocabulary=VOCAB)
  assert seqio.get_mixture_or_task("files_test_again").num_input_examples("train") == 2
  with pytest.raises(ValueError, match="'bbc_topic' is already the name of a registered task"):
    import tasks.bbc  # noqa: F401  (registers bbc_topic)
    files.files_task("bbc_topic", {"train": a}, vocabulary=VOCAB)


BAD_FILES = [
    # (file name, bytes, the error's text)
    ("x.tsv", b"one\ttwo\nthree\tfour\tfive\n",
     r"x.tsv:2: expected 2 tab-separated fields \(inputs, targets\), found 3"),
    ("x.tsv", b"one\ttwo\nno tab here\n", r"x.tsv:2: expected 2 tab-separated fields"),
    ("x.jsonl", b'{"inputs": "a", "targets": "b"}\n{"inputs": "a", "targets": \n',
     r"x.jsonl:2: not valid JSON \(Expecting value at column 28\)"),
    ("x.json", b'[{"inputs": "a",\n "targets": "b"}]\n',
     r"x.json:1: not valid JSON .* \(JSON Lines holds one object per line, not one JSON array\)"),
    ("x.jsonl", b'"just a string"\n', r"x.jsonl:1: a JSON string, not an object"),
    ("x.jsonl", b'{"question": "a", "targets": "b"}\n',
     r"x.jsonl:1: no 'inputs' field \(it has \['question', 'targets'\]\); set "
     r"files_task.inputs_key"),
    ("x.jsonl", b'{"inputs": ["a"], "targets": "b"}\n',
     r"x.jsonl:1: field 'inputs' is a JSON array, not a string or a number"),
    ("x.tsv", b"caf\xc3\xa9\tok\nna\xefve\tbad\n", r"x.tsv:2: not UTF-8 text"),
    ("x.tsv.gz", gzip.compress(b"a\tb\n" * 50, mtime=0)[:-12], r"x.tsv.gz: not a complete gzip file"),
    ("x.csv", b"a,b\n", r"x.csv: cannot tell the format from the extension '.csv'"),
    ("x.tsv", b"\n\n", r"files_task.splits\['train'\]: .*x.tsv holds no examples"),
]


@pytest.mark.parametrize("file_name,content,message", BAD_FILES,
                         ids=[f"{i}-{name}" for i, (name, _, _) in enumerate(BAD_FILES)])
def test_a_bad_file_is_an_error_naming_the_file_and_line(tmp_path, file_name, content, message):
  (tmp_path / file_name).write_bytes(content)
  files.files_task("files_test_bad", {"train": str(tmp_path / file_name)}, vocabulary=VOCAB)
  with pytest.raises(ValueError, match=message):
    seqio.get_mixture_or_task("files_test_bad").num_input_examples("train")
  # What the entry points call first: the task named, no advice meant for TFDS tasks.
  with pytest.raises(ValueError, match=r"^task 'files_test_bad' cannot read split 'train': ") as err:
    registry.check_split_readable(seqio.get_mixture_or_task("files_test_bad"), "train")
  assert "tfds build" not in str(err.value)


def test_bad_arguments_are_errors_naming_the_binding(tmp_path):
  tsv = _write_tsv(tmp_path / "a.tsv", _pairs("train", 2))
  with pytest.raises(FileNotFoundError, match=r"files_task.splits\['train'\]: no file matches "
                                              r"'.*missing-\*.tsv'"):
    files.files_task("files_test_args", {"train": str(tmp_path / "missing-*.tsv")},
                     vocabulary=VOCAB)
    seqio.get_mixture_or_task("files_test_args").num_input_examples("train")
  with pytest.raises(ValueError, match="files_task has no 'validation' split; its splits are "
                                       r"\['train'\]"):
    files.files_task("files_test_args", {"train": tsv}, vocabulary=VOCAB)
    seqio.get_mixture_or_task("files_test_args").num_input_examples("validation")
  with pytest.raises(ValueError, match=r"unknown metric 'acc'; choose from \['accuracy'"):
    files.files_task("files_test_args", {"train": tsv}, metrics=["acc"], vocabulary=VOCAB)
  with pytest.raises(ValueError, match="files_task.format must be one of"):
    files.files_task("files_test_args", {"train": tsv}, format="csv", vocabulary=VOCAB)
  with pytest.raises(ValueError, match="files_task.splits must map split names to files"):
    files.files_task("files_test_args", [tsv], vocabulary=VOCAB)
  # The format named for every file wins over the extension.
  odd = tmp_path / "train.txt"
  odd.write_text("a\tb\n")
  files.files_task("files_test_args", {"train": str(odd)}, format="tsv", vocabulary=VOCAB)
  assert seqio.get_mixture_or_task("files_test_args").num_input_examples("train") == 1


def test_the_recipe_registers_the_task_from_two_macros(tmp_path):
  from t2t import config
  tsv = _write_tsv(tmp_path / "train.tsv", _pairs("train", 4))
  config.parse_gin(["experiments/bbc_demo/finetune.gin", "recipes/files_task.gin"],
                   ["MODEL_DIR = '/tmp/unused'", "INITIAL_CHECKPOINT_PATH = None",
                    "FILES_TASK = 'files_test_recipe'", f"FILES_SPLITS = {{'train': '{tsv}'}}",
                    "files_task.metrics = ['rouge']",
                    "task_vocabulary.vocabulary = @bbc_vocabulary()"])
  import gin
  assert gin.query_parameter("%MIXTURE_OR_TASK_NAME").selector == "files_task"
  assert files.files_task() == "files_test_recipe"
  task = seqio.get_mixture_or_task("files_test_recipe")
  assert task.num_input_examples("train") == 4
  assert [f.__name__ for f in task.metric_fns] == ["rouge"]
  # The default vocabulary is the task library's gin-chosen one: here the bbc vocabulary.
  assert task.output_features["inputs"].vocabulary.vocab_size == VOCAB.vocab_size


def test_two_files_tasks_mix_by_their_exact_sizes_from_gin(tmp_path):
  """Scoped bindings make two tasks, multitask_mixture mixes them at rates min(N, K) (T5 §3.5.2)."""
  from t2t import config
  small = _write_tsv(tmp_path / "small.tsv", _pairs("train", 3))
  large = _write_jsonl(tmp_path / "large.jsonl", [{"inputs": x, "targets": y}
                                                  for x, y in _pairs("validation", 8)])
  config.parse_gin([], [
      "files_task.vocabulary = @bbc_vocabulary()",
      "small/files_task.name = 'files_test_small'", f"small/files_task.splits = {{'train': '{small}'}}",
      "large/files_task.name = 'files_test_large'", f"large/files_task.splits = {{'train': '{large}'}}",
      "multitask_mixture.name = 'files_test_mix'",
      "multitask_mixture.task_names = [@small/files_task(), @large/files_task()]",
      "multitask_mixture.maximum = 5"])
  from t2t.data import mixing
  mixture = seqio.get_mixture_or_task(mixing.multitask_mixture())
  rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
  assert rates == {"files_test_small": 3.0, "files_test_large": 5.0}


def test_train_on_your_files_from_the_command_line(tmp_path):
  """`python -m t2t.train` with the recipe: 2 steps of the demo's tiny model on a TSV file."""
  train = _write_tsv(tmp_path / "train.tsv", _pairs("train", 16))
  dev = _write_jsonl(tmp_path / "dev.jsonl", [{"inputs": x, "targets": y}
                                              for x, y in _pairs("validation", 4)])
  model_dir = tmp_path / "run"
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
  env.pop("T2T_TRACEBACK", None)
  out = subprocess.run(
      [sys.executable, "-m", "t2t.train", "--gin_file=experiments/bbc_demo/finetune.gin",
       "--gin_file=recipes/files_task.gin", "--gin.FILES_TASK='my_topic'",
       f"--gin.FILES_SPLITS={{'train': '{train}', 'validation': '{dev}'}}",
       "--gin.files_task.prefix='topic:'", "--gin.task_vocabulary.vocabulary=@bbc_vocabulary()",
       "--gin.INITIAL_CHECKPOINT_PATH=None", "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=4",
       "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 4}", f"--gin.MODEL_DIR={model_dir}",
       "--gin.T5Config.d_model=32", "--gin.T5Config.d_ff=64", "--gin.T5Config.num_heads=2",
       "--gin.T5Config.d_kv=16"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  operative = (model_dir / "config.gin").read_text()
  assert "FILES_TASK = 'my_topic'" in operative and "MIXTURE_OR_TASK_NAME = @files_task()" in operative
  records = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
  assert [r["step"] for r in records] == [2] and np.isfinite(records[0]["loss"])
  assert os.path.isdir(model_dir / "checkpoint_2")

  # A bad line stops the run before its first step, naming the file and line.
  (tmp_path / "bad.tsv").write_text("a\tb\nc\n")
  bad = subprocess.run(
      [sys.executable, "-m", "t2t.train", "--gin_file=experiments/bbc_demo/finetune.gin",
       "--gin_file=recipes/files_task.gin", "--gin.FILES_TASK='my_bad'",
       f"--gin.FILES_SPLITS={{'train': '{tmp_path / 'bad.tsv'}'}}",
       "--gin.task_vocabulary.vocabulary=@bbc_vocabulary()", "--gin.INITIAL_CHECKPOINT_PATH=None",
       "--gin.TRAIN_STEPS=2", f"--gin.MODEL_DIR={tmp_path / 'bad_run'}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert bad.returncode != 0
  assert "bad.tsv:2: expected 2 tab-separated fields" in bad.stderr, bad.stderr[-3000:]
  assert "Traceback" not in bad.stderr
  assert "tfds build" not in bad.stderr  # the TFDS advice is for TFDS tasks only
