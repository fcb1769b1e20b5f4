"""A tiny cacheable BBC task for tests of seqio's Beam cache job (tests/data/test_cache.py).

`bbc_tiny_cached`: the first 12 articles of each BBC split (sorted by id), tokenized, then the
cache point, then span corruption (random, so it stays after the cache). The cache job imports
this module (`--module_import=tests.data.tiny_cached_task`). With T2T_TEST_NO_SOURCE=1 in the
environment the raw source refuses to be read, which proves that training read the cache.
"""
import functools
import os

import seqio
import tensorflow as tf

from t2t.data import objectives, sources, vocabularies

TASK = "bbc_tiny_cached"
NUM_ARTICLES = 12


def _dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  del shuffle_files, seed
  if os.environ.get("T2T_TEST_NO_SOURCE"):
    raise RuntimeError(f"{TASK}: the raw source was read although the task is cached")
  articles = sources.bbc_articles(split)[:NUM_ARTICLES]
  return tf.data.Dataset.from_tensor_slices(
      {k: tf.constant([a[k] for a in articles], tf.string) for k in ("id", "text")})


def register() -> None:
  vocabulary = vocabularies.bbc_vocabulary()
  features = {"inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
              "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True)}
  seqio.TaskRegistry.remove(TASK)
  seqio.TaskRegistry.add(
      TASK,
      source=seqio.FunctionDataSource(_dataset_fn, splits=("train", "validation")),
      preprocessors=[
          functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          seqio.preprocessors.tokenize,
          seqio.CacheDatasetPlaceholder(),
          objectives.span_corruption,
          seqio.preprocessors.append_eos_after_trim,
      ],
      output_features=features,
      metric_fns=[])


register()
