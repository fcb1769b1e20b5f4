"""The offline BBC news tasks (the demo's data; nothing is downloaded).

- `bbc_span_corruption`: T5 pre-training on the article text (`text` -> `targets`, then t2t's
  `span_corruption`); no metrics.
- `bbc_span_corruption_cached`: the same with seqio's cache point after tokenization, for
  seqio's Beam cache job (`python -m t2t.data.cache`, see t2t/data/cache.py) and training with
  `USE_CACHED_TASKS = True`; span corruption stays after the cache, so it is drawn afresh.
- `bbc_pretraining`: the same text under whichever objective gin names
  (`pretraining_objective.name = 'prefix_lm'`, default span corruption).
- `bbc_topic`: "bbc topic: <article>" -> the category folder name (`business`, `entertainment`,
  `politics`, `sports`, `tech`); accuracy and macro-F1 over the five labels. An output that is
  not one of them simply matches no target, so it counts as wrong.
- `bbc_bert_mlm`: BERT's masked-LM objective over the article text (`t2t.data.mlm.bert_mlm`:
  `[CLS] corrupted [SEP]` inputs, aligned sparse targets; use `BertMlmFeatureConverter`, equal
  `inputs` / `targets` lengths); no metrics. For BERT pre-training (gin/models/bert/).
- `bbc_same_topic`: a sentence-pair task for intermediate training (STILTs):
  "bbc same topic sentence1: <headline A> sentence2: <headline B>" -> `same` / `different`
  (do the two articles share a category?); accuracy. Pairs are drawn deterministically within
  one split (`same_topic_pairs`), half of each label; the raw `sentence1` / `sentence2` strings
  stay in the examples for encoders that read a pair jointly ([CLS] A [SEP] B [SEP]).

Label lists, for classifiers that map target strings to ids: `task_labels(name)` (also
`BBC_LABELS`, `BBC_SAME_TOPIC_LABELS`; for `bbc_same_topic` also the `labels` keyword of its
`postprocess_fn`, `seqio.get_mixture_or_task(name).postprocessor.keywords["labels"]`,
as the GLUE tasks have).

Splits train/validation/test as in `t2t.data.sources` (a fixed hash of the article path, 80/10/10).
Registration happens on import and replaces an earlier registration of the same name, so
re-importing (or `importlib.reload`) is safe.
"""
from __future__ import annotations

import functools
import hashlib
import random
import re

import seqio
import tensorflow as tf

from t2t.data import metrics, mlm, objectives, postprocessors, registry, sources, vocabularies

BBC_TOPIC_PREFIX = "bbc topic:"
BBC_LABELS = sources.BBC_CATEGORIES
BBC_SAME_TOPIC_PREFIX = "bbc same topic"
BBC_SAME_TOPIC_LABELS = ("different", "same")
TASK_LABELS = {"bbc_topic": BBC_LABELS, "bbc_same_topic": BBC_SAME_TOPIC_LABELS}


def task_labels(task_name: str) -> tuple[str, ...]:
  """The label strings (targets) of a BBC classification task, in label-id order."""
  if task_name not in TASK_LABELS:
    raise ValueError(f"{task_name!r} is not a BBC classification task; those with labels are "
                     f"{sorted(TASK_LABELS)}.")
  return tuple(TASK_LABELS[task_name])


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


def headline(text: str) -> str:
  """An article's headline: its first line, whitespace collapsed."""
  return re.sub(r"\s+", " ", text.split("\n", 1)[0]).strip()


@functools.lru_cache(maxsize=None)
def same_topic_pairs(split: str) -> tuple[dict[str, str], ...]:
  """The `bbc_same_topic` pairs of one split, deterministic (no seed; stable across machines).

  Article i of the split (sorted by id) is sentence1 of pair i; its partner is drawn, by a
  generator seeded from the split name, from the same category when i is even (label `same`)
  and from the other four when i is odd (`different`), never an article with the same headline
  (the corpus holds duplicates). So `same` pairs are ceil(n / 2) and `different` ones floor(n / 2).

  Returns:
    dicts {"id": "<id A>|<id B>", "sentence1", "sentence2", "label"}, one per article.
  """
  articles = sources.bbc_articles(split)
  heads = [headline(a["text"]) for a in articles]
  by_category: dict[str, list[int]] = {}
  for i, a in enumerate(articles):
    by_category.setdefault(a["category"], []).append(i)
  seed = int(hashlib.sha256(f"bbc_same_topic/{split}".encode()).hexdigest(), 16) % 2**32
  rng = random.Random(seed)
  pairs = []
  for i, a in enumerate(articles):
    same = i % 2 == 0
    pool = by_category[a["category"]] if same else range(len(articles))
    for _ in range(100_000):  # rejection sampling: deterministic given the generator
      j = pool[rng.randrange(len(pool))]
      if heads[j] != heads[i] and (articles[j]["category"] == a["category"]) == same:
        break
    else:
      raise ValueError(f"bbc_same_topic: no {'same' if same else 'different'}-topic partner with "
                       f"another headline for {a['id']} in split {split!r}.")
    pairs.append({"id": f"{a['id']}|{articles[j]['id']}", "sentence1": heads[i],
                  "sentence2": heads[j], "label": BBC_SAME_TOPIC_LABELS[int(same)]})
  return tuple(pairs)


def same_topic_dataset_fn(split: str, shuffle_files: bool,
                          seed: int | None = None) -> tf.data.Dataset:
  """seqio dataset function of `bbc_same_topic`: {id, sentence1, sentence2, label} strings."""
  pairs = list(same_topic_pairs(split))
  if shuffle_files:
    random.Random(seed).shuffle(pairs)
  return tf.data.Dataset.from_tensor_slices(
      {k: tf.constant([p[k] for p in pairs], tf.string)
       for k in ("id", "sentence1", "sentence2", "label")})


@seqio.map_over_dataset
def format_bbc_same_topic(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  """-> {inputs: "bbc same topic sentence1: A sentence2: B", targets: label, + the raw fields}."""
  return {
      "inputs": tf.strings.join([BBC_SAME_TOPIC_PREFIX, "sentence1:", example["sentence1"],
                                 "sentence2:", example["sentence2"]], separator=" "),
      "targets": example["label"],
      "sentence1": example["sentence1"],
      "sentence2": example["sentence2"],
      "id": example["id"],
  }


def _register(task: seqio.Task) -> None:
  seqio.TaskRegistry.remove(task.name)
  seqio.TaskRegistry.add_provider(task.name, task)


def register_bbc_tasks() -> None:
  """Registers `bbc_span_corruption` (and `_cached`), `bbc_pretraining`, `bbc_topic`,
  `bbc_bert_mlm` and `bbc_same_topic` (idempotent)."""
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
      "bbc_span_corruption_cached",  # preprocessed once by seqio's Beam job (t2t.data.cache)
      source=source,
      preprocessors=[
          functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
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
  _register(seqio.Task(
      "bbc_bert_mlm",
      source=source,
      preprocessors=mlm.mlm_preprocessors(text_key="text"),
      output_features=mlm.mlm_output_features(features["targets"].vocabulary),
      metric_fns=[],
  ))
  _register(seqio.Task(
      "bbc_same_topic",
      source=seqio.FunctionDataSource(dataset_fn=same_topic_dataset_fn, splits=sources.BBC_SPLITS,
                                      num_input_examples=dict(sources.bbc_num_examples())),
      preprocessors=[
          format_bbc_same_topic,
          seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      postprocess_fn=functools.partial(postprocessors.classification,
                                       labels=BBC_SAME_TOPIC_LABELS),
      metric_fns=[metrics.accuracy],
  ))


register_bbc_tasks()
