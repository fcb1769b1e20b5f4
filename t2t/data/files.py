"""Tasks from your own files: TSV or JSON Lines of (inputs, targets) text pairs, in one gin line.

Most of a researcher's own tasks are already text to text, or one script away from it: a file per
split with an input text and a target text per example. `files_task` registers such data as a
seqio Task (and returns its name) without any Python, the way `limited_task` derives one:

    MIXTURE_OR_TASK_NAME = @files_task()
    files_task.name = 'my_sentiment'
    files_task.splits = {'train': 'data/train.tsv', 'validation': 'data/dev.tsv'}
    files_task.prefix = 'sentiment:'        # optional, T5's task prefix (§2.4)
    files_task.metrics = ['accuracy', 'macro_f1']

(`gin/recipes/files_task.gin` is this recipe; from Python, `files_task('my_sentiment', {...})`.)

Formats, chosen by each file's extension (`.gz` after it is decompressed) or by `format`:

- `.tsv`: one example per line, `inputs<TAB>targets`; blank lines are skipped, and with
  `tsv_header=True` each file's first line too. A text that holds a tab or a newline cannot be
  written this way: use JSON Lines.
- `.jsonl` / `.json`: one JSON object per line, its `inputs_key` and `targets_key` fields (default
  "inputs" and "targets") strings, or numbers (a label 0 / 1 becomes the text "0" / "1").

A split's value is a path, a glob pattern (`data/train-*.tsv`) or a list of them, read with
`tf.io.gfile` (so `gs://` works; relative paths are relative to the working directory) in sorted
order. Every example keeps an `id` feature, `<file name>:<line>`, that `t2t.eval` writes beside its
prediction. The task tokenizes `inputs` (after the prefix) and `targets` with `vocabulary`
(default: the `task_vocabulary()` that the task library uses, set in gin with
`task_vocabulary.spm_path` or `task_vocabulary.vocabulary`), appends EOS, strips the decoded
prediction and scores it with `metrics` against the target text.

A split's files are parsed on first use, checked line by line (a bad line is an error naming
file and line, before any step runs) and held in memory; `num_input_examples` is exact, so the
task mixes by examples-proportional rates like any other. Each host reads every `k`-th example
(`seqio.ShardInfo`). For data larger than memory write a TFRecord source instead.
"""
from __future__ import annotations

import gzip
import json
import os
from typing import Callable, Iterator, Mapping, Optional, Sequence, Union

import gin
import numpy as np
import seqio
import tensorflow as tf

from t2t.data import metrics as metrics_lib
from t2t.data import postprocessors

FORMATS = ("tsv", "jsonl")
_EXTENSIONS = {".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}

# Metrics by the name a gin file gives them: each compares postprocessed prediction and target text.
METRICS: dict[str, Callable] = {
    "accuracy": metrics_lib.accuracy,
    "macro_f1": metrics_lib.macro_f1,
    "matthews_corrcoef": metrics_lib.matthews_corrcoef,
    "rouge": metrics_lib.rouge,
    "bleu": metrics_lib.bleu,
}

SplitFiles = Union[str, Sequence[str]]
Example = tuple[str, str, str]  # (id, inputs, targets)


def file_format(path: str, format: Optional[str] = None) -> str:  # pylint: disable=redefined-builtin
  """'tsv' or 'jsonl': `format` when given, else from `path`'s extension (a `.gz` looked through)."""
  if format is not None:
    if format not in FORMATS:
      raise ValueError(f"files_task.format must be one of {FORMATS} or None (by extension), "
                       f"got {format!r}.")
    return format
  stem = path[:-3] if path.endswith(".gz") else path
  extension = os.path.splitext(stem)[1].lower()
  if extension not in _EXTENSIONS:
    raise ValueError(f"{path}: cannot tell the format from the extension {extension or '(none)'!r}; "
                     f"name it .tsv or .jsonl (.json), or set files_task.format to one of {FORMATS}.")
  return _EXTENSIONS[extension]


def _lines(path: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its line break), read with tf.io.gfile; `.gz` decompressed."""
  with tf.io.gfile.GFile(path, "rb") as stream:
    data = stream.read()
  if path.endswith(".gz"):
    try:
      data = gzip.decompress(data)
    except (OSError, EOFError) as err:
      raise ValueError(f"{path}: not a complete gzip file ({err}).") from None
  try:
    text = data.decode("utf-8-sig")  # a byte-order mark (spreadsheet exports) is dropped
  except UnicodeDecodeError as err:
    line = data.count(b"\n", 0, err.start) + 1
    raise ValueError(f"{path}:{line}: not UTF-8 text ({err.reason} at byte {err.start}); save "
                     "the file as UTF-8.") from None
  for number, line in enumerate(text.split("\n"), start=1):
    yield number, line.rstrip("\r")


def _json_type(value) -> str:
  names = {str: "string", list: "array", dict: "object", bool: "boolean", type(None): "null"}
  return names.get(type(value), "number")


def _text(value, path: str, number: int, key: str) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return str(value)
  raise ValueError(f"{path}:{number}: field {key!r} is a JSON {_json_type(value)}, not a string "
                   "or a number.")


def read_examples(path: str, format: str, inputs_key: str = "inputs",  # pylint: disable=redefined-builtin
                  targets_key: str = "targets", tsv_header: bool = False) -> list[Example]:
  """Parses one file into (id, inputs, targets) triples; a malformed line is a ValueError naming
  `path:line` and what is wrong with it."""
  name = os.path.basename(path)
  examples = []
  for number, line in _lines(path):
    if format == "tsv" and tsv_header and number == 1:
      continue
    if not line.strip():
      continue
    if format == "tsv":
      fields = line.split("\t")
      if len(fields) != 2:
        raise ValueError(
            f"{path}:{number}: expected 2 tab-separated fields (inputs, targets), found "
            f"{len(fields)}. A text holding tabs or newlines needs JSON Lines (.jsonl).")
      examples.append((f"{name}:{number}", fields[0], fields[1]))
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as err:
      hint = (" (JSON Lines holds one object per line, not one JSON array)"
              if number == 1 and line.lstrip().startswith("[") else "")
      raise ValueError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})"
                       f"{hint}.") from None
    if not isinstance(record, dict):
      raise ValueError(f"{path}:{number}: a JSON {_json_type(record)}, not an object with "
                       f"{inputs_key!r} and {targets_key!r} fields.")
    for key, what in ((inputs_key, "inputs_key"), (targets_key, "targets_key")):
      if key not in record:
        raise ValueError(f"{path}:{number}: no {key!r} field (it has {sorted(record)}); set "
                         f"files_task.{what} to the field that holds the {what[:-4]}.")
    examples.append((f"{name}:{number}", _text(record[inputs_key], path, number, inputs_key),
                     _text(record[targets_key], path, number, targets_key)))
  return examples


def match_files(split: str, patterns: SplitFiles) -> list[str]:
  """The files of one split: each pattern's matches, sorted; a pattern matching nothing is an error."""
  if isinstance(patterns, str):
    patterns = [patterns]
  if not patterns or not all(isinstance(p, str) and p for p in patterns):
    raise ValueError(f"files_task.splits[{split!r}] must be a path, a glob pattern or a list of "
                     f"them, got {patterns!r}.")
  files = []
  for pattern in patterns:
    matched = sorted(tf.io.gfile.glob(pattern))
    if not matched:
      where = os.path.abspath(pattern) if "://" not in pattern else pattern
      raise FileNotFoundError(f"files_task.splits[{split!r}]: no file matches {pattern!r} "
                              f"({where}).")
    files.extend(m for m in matched if m not in files)
  return files


class FilesSource(seqio.DataSource):
  """A seqio source over the examples of text files, parsed on first use and kept in memory.

  `get_dataset` yields {"id", "inputs", "targets"} strings; shard `i` of `n` holds the examples at
  positions i, i + n, ... of the split (files in sorted order, lines in order), shuffled with
  `seed` when `shuffle`.
  """

  def __init__(self, splits: Mapping[str, SplitFiles], format: Optional[str] = None,  # pylint: disable=redefined-builtin
               inputs_key: str = "inputs", targets_key: str = "targets",
               tsv_header: bool = False):
    if not isinstance(splits, Mapping) or not splits:
      raise ValueError("files_task.splits must map split names to files, e.g. "
                       "{'train': 'data/train.tsv', 'validation': 'data/dev.tsv'}; "
                       f"got {splits!r}.")
    self._patterns = dict(splits)
    self._read = dict(format=format, inputs_key=inputs_key, targets_key=targets_key,
                      tsv_header=tsv_header)
    if format is not None:
      file_format("", format)  # checks the name now rather than at the first read
    self._cache: dict[str, np.ndarray] = {}
    super().__init__(splits=tuple(self._patterns), num_input_examples=None,
                     caching_permitted=False)

  def examples(self, split: str) -> np.ndarray:
    """The split's examples as a [num_examples, 3] array of str (id, inputs, targets)."""
    if split not in self._patterns:
      raise ValueError(f"files_task has no {split!r} split; its splits are {sorted(self._patterns)} "
                       "(files_task.splits).")
    if split not in self._cache:
      rows = []
      files = match_files(split, self._patterns[split])
      for path in files:
        rows.extend(read_examples(path, file_format(path, self._read["format"]),
                                  self._read["inputs_key"], self._read["targets_key"],
                                  self._read["tsv_header"]))
      if not rows:
        raise ValueError(f"files_task.splits[{split!r}]: {', '.join(files)} "
                         f"{'holds' if len(files) == 1 else 'hold'} no examples.")
      self._cache[split] = np.array(rows, dtype=object)  # [num_examples, 3]
    return self._cache[split]

  def num_input_examples(self, split: str) -> int:
    return len(self.examples(split))

  @property
  def supports_arbitrary_sharding(self) -> bool:
    return True

  def list_shards(self, split: str) -> Sequence[str]:
    return [split]

  def get_dataset(self, split: str = "train", shuffle: bool = True, seed: Optional[int] = None,
                  shard_info: Optional[seqio.ShardInfo] = None, *, sequence_length=None,
                  use_cached: bool = False, num_epochs: Optional[int] = 1) -> tf.data.Dataset:
    del sequence_length, use_cached, num_epochs
    rows = self.examples(split)
    order = np.arange(len(rows))
    if shard_info is not None and shard_info.num_shards > 1:
      order = order[shard_info.index::shard_info.num_shards]
    if shuffle:
      np.random.default_rng(seed).shuffle(order)
    picked = rows[order]
    return tf.data.Dataset.from_tensor_slices({
        key: tf.constant(list(picked[:, column]), tf.string, shape=[len(order)])
        for column, key in enumerate(("id", "inputs", "targets"))})


def _metric(metric: Union[str, Callable]) -> Callable:
  if callable(metric):
    return metric
  if metric not in METRICS:
    raise ValueError(f"files_task.metrics: unknown metric {metric!r}; choose from "
                     f"{sorted(METRICS)} or give a function (targets, predictions) -> dict.")
  return METRICS[metric]


def _prefixer(prefix: str) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
  @seqio.map_over_dataset
  def add_prefix(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    return {**example, "inputs": tf.strings.join([prefix, example["inputs"]], separator=" ")}
  return add_prefix


# name -> the arguments it was registered with, for the names files_task registered itself.
_REGISTERED: dict[str, tuple] = {}


@gin.configurable
def files_task(name: str = gin.REQUIRED, splits: Mapping[str, SplitFiles] = gin.REQUIRED, *,
               prefix: str = "", metrics: Sequence[Union[str, Callable]] = ("accuracy",),
               format: Optional[str] = None,  # pylint: disable=redefined-builtin
               inputs_key: str = "inputs", targets_key: str = "targets", tsv_header: bool = False,
               vocabulary: Optional[seqio.Vocabulary] = None) -> str:
  """Registers the seqio Task `name` over your files (see the module docstring); returns `name`.

  Calling it again with the same arguments returns the task already registered; with other
  arguments it replaces a task it registered before. A name some other module registered (e.g.
  'bbc_topic') is refused.

  Args:
    name: the task's name, as runs, metrics and predictions show it.
    splits: split name -> a path, glob pattern or list of them, e.g. {'train': 'train.tsv'}.
    prefix: text put before each input, joined with a space ('' for none).
    metrics: names from `METRICS`, or functions (targets, predictions) -> {name: value}.
    format: 'tsv' or 'jsonl' for every file; None tells each file's from its extension.
    inputs_key, targets_key: the JSON Lines fields that hold the input and target texts.
    tsv_header: skip the first line of each TSV file.
    vocabulary: tokenizes both features; None is the task library's `task_vocabulary()`.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"files_task.name must be a non-empty string, got {name!r}.")
  metric_fns = [_metric(m) for m in metrics]
  if vocabulary is None:
    from tasks import common  # the task library's gin-chosen vocabulary (tasks imports t2t.data)
    vocabulary = common.DeferredVocabulary()
  key = (repr(dict(splits)) if isinstance(splits, Mapping) else repr(splits), prefix,
         tuple(metric_fns), format, inputs_key, targets_key, tsv_header, vocabulary)
  if name in seqio.TaskRegistry.names():
    if name not in _REGISTERED:
      raise ValueError(f"files_task.name {name!r} is already the name of a registered task; "
                       "choose another.")
    if _REGISTERED[name] == key:
      return name
    seqio.TaskRegistry.remove(name)
  source = FilesSource(splits, format=format, inputs_key=inputs_key, targets_key=targets_key,
                       tsv_header=tsv_header)
  preprocessors = [_prefixer(prefix)] if prefix else []
  seqio.TaskRegistry.add(
      name,
      source=source,
      preprocessors=[*preprocessors, seqio.preprocessors.tokenize,
                     seqio.preprocessors.append_eos_after_trim],
      output_features={"inputs": seqio.Feature(vocabulary, add_eos=True),
                       "targets": seqio.Feature(vocabulary, add_eos=True)},
      postprocess_fn=postprocessors.strip,
      metric_fns=metric_fns)
  _REGISTERED[name] = key
  return name
