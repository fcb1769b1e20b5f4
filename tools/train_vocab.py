"""Trains the BBC SentencePiece vocabulary that `tasks/vocab/` ships.

The exact command that produced the committed model:

  python -m tools.train_vocab --output tasks/vocab/bbc_sp8k

It writes `tasks/vocab/bbc_sp8k.model` and `tasks/vocab/bbc_sp8k.vocab`: a unigram model of 8,000
pieces trained on the TRAINING split of the BBC articles only (validation and test text never
shapes the vocabulary), with pad=0, eos=1, unk=2 and no bos, as in T5. seqio appends the 100
sentinels (`extra_ids=100`), so the vocabulary the model sees has 8,100 ids.

Training is deterministic: one thread, input in a fixed order (sorted article ids, one paragraph
per line), no sentence sampling or shuffling, a fixed seed-piece budget.
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys
from typing import Iterator, Sequence

import sentencepiece as spm

from t2t.data import sources

DEFAULT_VOCAB_SIZE = 8000


def training_sentences(split: str = "train") -> Iterator[str]:
  """Yields the non-empty paragraphs of the split's articles, in sorted-id order."""
  for article in sources.bbc_articles(split):
    for line in article["text"].splitlines():
      line = line.strip()
      if line:
        yield line


def train_vocab(output_prefix: str, vocab_size: int = DEFAULT_VOCAB_SIZE, split: str = "train") -> pathlib.Path:
  """Trains the unigram SentencePiece model; returns the path of the written `.model` file.

  Args:
    output_prefix: path prefix; `<prefix>.model` and `<prefix>.vocab` are written.
    vocab_size: number of pieces, including pad/eos/unk.
    split: BBC split to train on; anything but "train" leaks evaluation text.
  """
  if vocab_size < 4:
    raise ValueError(f"vocab_size must be >= 4 (pad, eos, unk + pieces), got {vocab_size}.")
  prefix = pathlib.Path(output_prefix)
  prefix.parent.mkdir(parents=True, exist_ok=True)
  try:
    _train(prefix, vocab_size, split)
  except RuntimeError as e:
    # sentencepiece's check against the pieces the text allows: bad input, not a bug.
    too_high = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)",
                         str(e))
    if not too_high:
      raise
    raise ValueError(f"vocab_size {vocab_size} is more pieces than the BBC {split!r} split's text "
                     f"yields: use a vocab_size <= {too_high.group(1)} (sentencepiece: "
                     f"{too_high.group(0)}.)") from e
  return prefix.with_suffix(".model")


def _train(prefix: pathlib.Path, vocab_size: int, split: str) -> None:
  """sentencepiece's unigram trainer with the settings the module docstring gives."""
  spm.SentencePieceTrainer.train(
    sentence_iterator=training_sentences(split),
    model_prefix=str(prefix),
    model_type="unigram",
    vocab_size=vocab_size,
    pad_id=0,
    eos_id=1,
    unk_id=2,
    bos_id=-1,
    character_coverage=1.0,
    num_threads=1,
    input_sentence_size=0,
    shuffle_input_sentence=False,
    seed_sentencepiece_size=1000000,
    minloglevel=1,
  )


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; bad input (a vocab_size out of range) is one line `error: ...`, status 2."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--output", required=True, help="output prefix, e.g. tasks/vocab/bbc_sp8k")
  parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
  args = parser.parse_args(argv)
  try:
    path = train_vocab(args.output, args.vocab_size)
  except (ValueError, FileNotFoundError) as e:  # bad input: one line
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {path} and {path.with_suffix('.vocab')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
