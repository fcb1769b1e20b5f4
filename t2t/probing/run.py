r"""Diagnostic classifiers per layer for one or more checkpoints: `python -m t2t.probing`.

  python -m t2t.probing --gin_file=probing/t5_tiny.gin \
    --gin.probe.checkpoints="['runs/bbc_demo/pretrain', 'runs/bbc_demo/finetune']" \
    --gin.probe.probe_task=bbc_topic --gin.probe.output_dir=/tmp/t2t/probe \
    --gin.probe.layers="['embeddings', 'layer_2', 'layer_4']" --gin.probe.poolings="['mean', 'max']"

For each checkpoint, the probed encoder (`probe.encoder`, an encoder-protocol module such as
`@T5EncoderStates()`, `@BertEncoderStates()`, `@BiLSTMEncoder()`) is restored, the task's
`inputs` of `train_split` and `eval_split` (at most `max_examples` each) are encoded, every
requested layer is pooled, and a linear probe is fitted per (layer, pooling) on train and scored
on eval (`t2t.probing.diagnostic`; labels are the pretokenized targets, floats for
`kind='regression'`). Writes `output_dir/probe_results.jsonl` (one row per checkpoint, layer,
pooling, metric), `probe_curves.png` and `probe_report.md`.
"""
from __future__ import annotations

if __name__ == "__main__":
  from t2t import cli
  cli.run_module("t2t.probing.run")

import json
import os
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import gin
import numpy as np

from t2t.data import postprocessors, registry
from t2t.probing import diagnostic, edge, report, representations


def task_examples(task_name: str, split: str, max_examples: int, max_length: int,
                  kind: str = "classification", prefix: Sequence[int] = ()
                  ) -> tuple[np.ndarray, list[Any]]:
  """(tokens int32 [n, max_length], labels): ``max_examples`` examples of a seqio task's split.

  The split is shuffled with a fixed seed (a 10,000-example buffer) before taking, since splits
  are often sorted by label (BBC's are); the same examples come back every run.

  Tokens are ``prefix`` (e.g. BERT's [CLS]) + the task's tokenized ``inputs`` (cut, 0-padded);
  labels are the pretokenized targets (floats for regression).
  """
  task = registry.get_mixture_or_task(task_name)
  if split not in task.splits:
    raise ValueError(f"task '{task_name}' has no split '{split}'; it has {list(task.splits)}.")
  dataset = task.get_dataset({"inputs": max_length, "targets": 64}, split=split, shuffle=True,
                             seed=0, shuffle_buffer_size=10_000).take(max_examples)
  sequences, labels = [], []
  for example in dataset.as_numpy_iterator():
    if "targets_pretokenized" not in example:
      raise ValueError(f"task '{task_name}' yields no 'targets_pretokenized' to take labels from.")
    text = postprocessors.as_text(example["targets_pretokenized"]).strip()
    if kind == "regression":
      try:
        labels.append(float(text))
      except ValueError:
        raise ValueError(f"task '{task_name}' {split}: target {text!r} is not a number "
                         "(kind='regression').") from None
    else:
      labels.append(text)
    sequences.append(example["inputs"])
  if not sequences:
    raise ValueError(f"task '{task_name}' split '{split}' has no examples.")
  return representations.pad_tokens(sequences, max_length, prefix), labels


@gin.configurable
def probe(checkpoints: Sequence[str] = gin.REQUIRED, encoder: nn.Module = gin.REQUIRED,
          probe_task: str = gin.REQUIRED, output_dir: str = gin.REQUIRED,
          train_split: str = "train", eval_split: str = "validation",
          layers: Sequence[str | int] | None = None, poolings: Sequence[str] = ("mean",),
          kind: str = "classification", max_examples: int = 1000, max_length: int = 128,
          batch_size: int = 32, prefix_ids: Sequence[int] = (), l2: float = 1.0,
          checkpoint_names: Sequence[str] | None = None, edge_window: int = 0,
          edge_steps: int = 300) -> list[dict[str, Any]]:
  """Probes every layer of every checkpoint (see the module docstring); returns the rows.

  Args:
    checkpoints: model dirs or `checkpoint_<N>` dirs, all of the architecture of ``encoder``;
      one path alone (a string, e.g. `--gin.probe.checkpoints=/path`) is a list of one.
    layers: layer names/indices (None: all); a layer the encoder lacks is an error listing
      the layers it has.
    prefix_ids: ids put before each input (BERT: its [CLS], `mlm.bert_special_ids(...).cls`,
      so that "first" pooling reads [CLS]).
    checkpoint_names: labels for the report (default: the paths' last two components).
    edge_window: > 0 adds an edge probe per layer (``t2t.probing.edge``, classification only):
      one random window of this many tokens per example, labelled with its example's label,
      rows with pooling "span" and probe task "<task>_window<w>".
    edge_steps: Adam steps of each edge probe.
  """
  # A string is one path (iterating it would probe '/', 'p', 'a', ... character by character).
  if isinstance(checkpoints, (str, os.PathLike)):
    checkpoints = [os.fspath(checkpoints)]
  if isinstance(checkpoint_names, str):
    checkpoint_names = [checkpoint_names]
  if not checkpoints:
    raise ValueError("probe.checkpoints is empty: give at least one checkpoint path.")
  if diagnostic.KINDS.count(kind) == 0:
    raise ValueError(f"probe.kind must be one of {diagnostic.KINDS}, got {kind!r}.")
  names = list(checkpoint_names or [os.path.join(*os.path.normpath(p).split(os.sep)[-2:])
                                    for p in checkpoints])
  if len(names) != len(checkpoints):
    raise ValueError(f"{len(checkpoints)} checkpoints but {len(names)} checkpoint_names.")
  train_tokens, train_y = task_examples(probe_task, train_split, max_examples, max_length, kind,
                                        prefix_ids)
  eval_tokens, eval_y = task_examples(probe_task, eval_split, max_examples, max_length, kind,
                                      prefix_ids)
  rows = []
  for path, name in zip(checkpoints, names):
    params, step = representations.load_encoder_params(encoder, path)
    where = f"checkpoint {path}"
    features = [representations.pooled_features(
        encoder, params, representations.as_batches(tokens, batch_size), layers, poolings, where)
        for tokens in (train_tokens, eval_tokens)]
    for row in diagnostic.probe_layers(features[0], train_y, features[1], eval_y, kind, l2):
      rows.append({"checkpoint": name, "step": step, "probe_task": probe_task, **row})
    if edge_window > 0:
      for row in _edge_rows(encoder, params, where, (train_tokens, train_y), (eval_tokens, eval_y),
                            layers, edge_window, edge_steps, batch_size):
        rows.append({"checkpoint": name, "step": step,
                     "probe_task": f"{probe_task}_window{edge_window}", **row})
  os.makedirs(output_dir, exist_ok=True)
  with open(os.path.join(output_dir, "probe_results.jsonl"), "w") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
  report.write_report(rows, output_dir)
  return rows


def _edge_rows(encoder: nn.Module, params: Any, where: str, train: tuple, evaluation: tuple,
               layers: Sequence[str | int] | None, width: int, steps: int,
               batch_size: int) -> list[dict[str, Any]]:
  """Edge-probe accuracy per layer on one random ``width``-token window per example."""
  train_labels, classes = edge.label_ids(list(train[1]))
  eval_labels, _ = edge.label_ids(list(evaluation[1]), classes)
  run_encoder = representations.states_fn(encoder)

  def all_states(tokens):  # [num_states] of float32 [n, l, d]
    chunks = [[np.asarray(s, np.float32)[:, -chunk.shape[1]:] for s in run_encoder(params, chunk)]
              for chunk in representations.as_batches(tokens, batch_size)]
    return [np.concatenate(per_layer) for per_layer in zip(*chunks)]

  train_states, eval_states = all_states(train[0]), all_states(evaluation[0])
  spans = (edge.window_spans(train[0], width, seed=0), edge.window_spans(evaluation[0], width, 1))
  rows = []
  for layer in representations.select_layers(layers, len(train_states), where):
    index = representations.layer_index(layer)
    score = edge.train_edge_probe(
        edge.EdgeData(train_states[index], spans[0], train_labels),
        edge.EdgeData(eval_states[index], spans[1], eval_labels), len(classes),
        steps=steps)["accuracy"]
    rows.append({"layer": layer, "pooling": "span", "metric": "accuracy", "score": score})
  return rows


def main(argv: Sequence[str]) -> None:
  del argv
  from t2t import cli
  cli.parse_flags_into_gin()
  rows = probe()
  for row in rows:
    print(f"{row['checkpoint']} {row['layer']} {row['pooling']} {row['probe_task']} "
          f"{row['metric']} {row['score']:.2f}")
