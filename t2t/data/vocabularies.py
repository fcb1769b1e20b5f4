"""Vocabularies: the committed BBC SentencePiece model, and seqio's vocabulary class for gin.

`tasks/vocab/bbc_sp8k.model` (8,000 unigram pieces; pad 0, eos 1, unk 2, no bos) is produced by
`python -m tools.train_vocab --output tasks/vocab/bbc_sp8k`. With seqio's 100 extra ids the
vocabulary has 8,100 ids; `<extra_id_0>` is 8099, numbered down from the top as in T5.
"""
from __future__ import annotations

import importlib.util
import pathlib

import gin
import seqio

BBC_VOCAB_NAME = "bbc_sp8k.model"
DEFAULT_EXTRA_IDS = 100


def _tasks_vocab_dir() -> pathlib.Path:
  """Returns `<tasks package>/vocab`, found without importing `tasks` (which imports this module)."""
  spec = importlib.util.find_spec("tasks")
  roots = list(spec.submodule_search_locations or []) if spec is not None else []
  for root in roots:
    candidate = pathlib.Path(root) / "vocab"
    if (candidate / BBC_VOCAB_NAME).is_file():
      return candidate
  # Fall back to the checkout layout (<repo>/t2t/data/vocabularies.py -> <repo>/tasks/vocab).
  return pathlib.Path(__file__).resolve().parents[2] / "tasks" / "vocab"


BBC_VOCAB_PATH: str = str(_tasks_vocab_dir() / BBC_VOCAB_NAME)


@gin.configurable
def bbc_vocabulary(extra_ids: int = DEFAULT_EXTRA_IDS) -> seqio.SentencePieceVocabulary:
  """Returns the BBC SentencePiece vocabulary with `extra_ids` sentinels appended.

  Args:
    extra_ids: number of sentinel ids (`<extra_id_0>` is the highest id).
  """
  if extra_ids < 0:
    raise ValueError(f"extra_ids must be >= 0, got {extra_ids}.")
  if not pathlib.Path(BBC_VOCAB_PATH).is_file():
    raise FileNotFoundError(
      f"BBC vocabulary not found at {BBC_VOCAB_PATH}; regenerate it with "
      "`python -m tools.train_vocab --output tasks/vocab/bbc_sp8k` or reinstall t2t."
    )
  return seqio.SentencePieceVocabulary(BBC_VOCAB_PATH, extra_ids=extra_ids)


def _register_seqio_vocab_for_gin() -> None:
  """Makes `@seqio.SentencePieceVocabulary()` usable in gin files, once per process."""
  try:
    gin.external_configurable(seqio.SentencePieceVocabulary, module="seqio")
  except ValueError as err:  # already registered (module re-imported, or by another library)
    if "already" not in str(err).lower():
      raise


_register_seqio_vocab_for_gin()
