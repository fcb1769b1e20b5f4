"""tools/train_vocab.py's command line on bad input: one line `error: ...`, exit status 2.

The corpus is replaced by a few sentences, so sentencepiece's own check runs in well under a
second (the tool's real training: tests/data/test_vocabularies.py).
"""
from tools import train_vocab

SENTENCES = ["the cat sat on the mat", "a dog ate the bone", "markets fell on monday"] * 3


def test_a_vocab_size_out_of_range_is_one_line(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(train_vocab, "training_sentences", lambda split="train": iter(SENTENCES))
  prefix = tmp_path / "vocab" / "small"
  # Before: the right message inside a 15-line traceback.
  assert train_vocab.main(["--output", str(prefix), "--vocab_size", "3"]) == 2
  assert capsys.readouterr().err == ("error: vocab_size must be >= 4 (pad, eos, unk + pieces), "
                                     "got 3.\n")
  # Before: sentencepiece's RuntimeError and its traceback.
  assert train_vocab.main(["--output", str(prefix), "--vocab_size", "500000"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: vocab_size 500000 is more pieces than the BBC 'train' split's "
                        "text yields: use a vocab_size <= "), err
  assert "Vocabulary size too high (500000)" in err and len(err.splitlines()) == 1
  assert not prefix.with_suffix(".model").exists()
