"""A worked example of a new task, `bbc_headline`: copy this file to register your own.

Every BBC article file opens with its headline on the first line, so the data labels itself:

    inputs:  "headline: <the article without its first line, whitespace collapsed>"
    targets: "<the first line>"

A seqio Task is four things: a source of raw examples (here t2t's offline BBC articles and their
fixed train/validation/test split), preprocessors (raw example -> text `inputs`/`targets` -> token
ids -> EOS), output features (the vocabulary of each feature), and metrics over postprocessed
text (ROUGE for a generated headline). Importing the module registers the task; a gin file does
so with an `import tasks.examples.bbc_headline` line (see gin/experiments/bbc_headline.gin), and
`python -m tools.inspect_task bbc_headline --module tasks.examples.bbc_headline` shows it.
"""
from __future__ import annotations

import seqio
import tensorflow as tf

from t2t.data import metrics, postprocessors, sources, vocabularies

TASK_NAME = "bbc_headline"
PREFIX = "headline:"


@seqio.map_over_dataset
def headline_from_first_line(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """{id, text, category} -> {inputs: "headline: <body>", targets: <first line>, id}."""
  text = example["text"]
  headline = tf.strings.regex_replace(text, r"\n[\s\S]*", "")  # drop the first newline onwards
  body = tf.strings.regex_replace(text, r"^[^\n]*", "", replace_global=False)  # drop line 1
  body = tf.strings.strip(tf.strings.regex_replace(body, r"\s+", " "))
  return {
      "inputs": tf.strings.join([PREFIX, body], separator=" "),
      "targets": tf.strings.strip(headline),
      "id": example["id"],  # kept for looking at predictions; the model never sees it
  }


VOCABULARY = vocabularies.bbc_vocabulary()

seqio.TaskRegistry.remove(TASK_NAME)  # so that re-importing the module replaces the task
seqio.TaskRegistry.add(
    TASK_NAME,
    source=sources.bbc_source(),
    preprocessors=[
        headline_from_first_line,
        seqio.preprocessors.tokenize,
        seqio.preprocessors.append_eos_after_trim,
    ],
    output_features={
        "inputs": seqio.Feature(VOCABULARY, add_eos=True),
        "targets": seqio.Feature(VOCABULARY, add_eos=True),
    },
    postprocess_fn=postprocessors.strip,  # the generated headline without surrounding whitespace
    metric_fns=[metrics.rouge],  # ROUGE-1/2/L/Lsum F-measures x 100
)
