"""The offline BBC news tasks (the demo's data; nothing is downloaded).

- `bbc_span_corruption`: T5 pre-training on the article text (`text` -> `targets`, then t2t's
  `span_corruption`); no metrics.
- `bbc_pretraining`: the same text under whichever objective gin names
  (`pretraining_objective.name = 'prefix_lm'`, default span corruption).
- `bbc_topic`: "bbc topic: <article>" -> the category folder name (`business`, `entertainment`,
  `politics`, `sports`, `tech`); accuracy and macro-F1 over the five labels. An output that is
  not one of them simply matches no target, so it counts as wrong.

Splits train/validation/test as in `t2t.data.sources` (a fixed hash of the article path, 80/10/10).
Registration happens on import and replaces an earlier registration of the same name, so
re-importing (or `importlib.reload`) is safe.
"""
from __future__ import annotations

import functools

import seqio
import tensorflow as tf

from t2t.data import metrics, objectives, postprocessors, registry, sources, vocabularies

BBC_TOPIC_PREFIX = "bbc topic:"
BBC_LABELS = sources.BBC_CATEGORIES


def _output_features() -> dict[str, seqio.Feature]:
  vocabulary = vocabularies.bbc_vocabulary()
  return {
      "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
      "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }


@seqio.map_over_dataset
def format_bbc_topic(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{text, category} -> {inputs: "bbc topic: <text, whitespace collapsed>", targets: category}."""
  text = tf.strings.strip(tf.strings.regex_replace(example["text"], r"\s+", " "))
  return {
      "inputs": tf.strings.join([BBC_TOPIC_PREFIX, text], separator=" "),
      "targets": example["category"],
      "id": example["id"],
  }


def bbc_topic_accuracy(targets, predictions) -> dict[str, float]:
  """Percent of articles whose predicted label equals the category."""
  return metrics.accuracy(targets, predictions)


def bbc_topic_macro_f1(targets, predictions) -> dict[str, float]:
  """Unweighted mean F1 over the five categories (an invalid output is wrong for every label)."""
  return metrics.macro_f1(targets, predictions, labels=BBC_LABELS)


def _register(task: seqio.Task) -> None:
  seqio.TaskRegistry.remove(task.name)
  seqio.TaskRegistry.add_provider(task.name, task)


def register_bbc_tasks() -> None:
  """Registers `bbc_span_corruption`, `bbc_pretraining` and `bbc_topic` (idempotent)."""
  features = _output_features()
  source = sources.bbc_source()
  _register(seqio.Task(
      "bbc_span_corruption",
      source=source,
      preprocessors=[
          functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          seqio.preprocessors.tokenize,
          objectives.span_corruption,
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      metric_fns=[],
  ))
  _register(seqio.Task(
      "bbc_pretraining",  # the objective is a gin choice: pretraining_objective.name = '...'
      source=source,
      preprocessors=[
          functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          seqio.preprocessors.tokenize,
          registry.pretraining_objective,
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      metric_fns=[],
  ))
  _register(seqio.Task(
      "bbc_topic",
      source=source,
      preprocessors=[
          format_bbc_topic,
          seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      postprocess_fn=postprocessors.strip,  # the label without surrounding whitespace
      metric_fns=[bbc_topic_accuracy, bbc_topic_macro_f1],
  ))


register_bbc_tasks()
