"""Test-only tasks for evaluating generative outputs of different lengths (imported by gin).

`bbc_topic_phrases` is BBC topic classification whose labels are phrases of different token
lengths (1 to 4 SentencePiece pieces), scored with three kinds of seqio metric at once: a predict
metric (accuracy), a score metric (mean log-likelihood of the targets) and a predict-with-aux
metric (mean log-likelihood of the predictions). `bbc_headline_and_phrases` mixes it with
`bbc_headline` (ROUGE, longer targets), so one `t2t.eval` run covers tasks with different feature
lengths and metric types.
"""
from __future__ import annotations

import numpy as np
import seqio
import tensorflow as tf

import tasks.examples.bbc_headline  # noqa: F401  (registers bbc_headline)
from t2t.data import metrics, postprocessors, sources, vocabularies

PHRASES = {
    "business": "business and economy",
    "entertainment": "arts",
    "politics": "uk politics",
    "sports": "sport",
    "tech": "science and technology",
}
TASK_NAME = "bbc_topic_phrases"
MIXTURE_NAME = "bbc_headline_and_phrases"


def _to_phrase(example):
  phrase = tf.constant("?")
  for category, text in PHRASES.items():
    phrase = tf.where(tf.equal(example["category"], category), text, phrase)
  body = tf.strings.strip(tf.strings.regex_replace(example["text"], r"\s+", " "))
  return {"inputs": tf.strings.join(["topic:", body], " "),
          "targets": phrase}


def accuracy(targets, predictions):
  return metrics.accuracy(targets, predictions)


def mean_target_log_likelihood(targets, scores):
  del targets
  return {"mean_target_log_likelihood": float(np.mean(scores))}


def mean_prediction_log_likelihood(targets, predictions, aux_values):
  del targets, predictions
  return {"mean_prediction_log_likelihood": float(np.mean(aux_values["scores"]))}


VOCABULARY = vocabularies.bbc_vocabulary()
seqio.TaskRegistry.remove(TASK_NAME)
seqio.TaskRegistry.add(
    TASK_NAME,
    source=sources.bbc_source(),
    preprocessors=[seqio.map_over_dataset(_to_phrase), seqio.preprocessors.tokenize,
                   seqio.preprocessors.append_eos_after_trim],
    output_features={"inputs": seqio.Feature(VOCABULARY, add_eos=True),
                     "targets": seqio.Feature(VOCABULARY, add_eos=True)},
    postprocess_fn=postprocessors.strip,
    metric_fns=[accuracy, mean_target_log_likelihood, mean_prediction_log_likelihood])

seqio.MixtureRegistry.remove(MIXTURE_NAME)
seqio.MixtureRegistry.add(MIXTURE_NAME, [("bbc_headline", 1.0), (TASK_NAME, 1.0)])
