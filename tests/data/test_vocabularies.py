"""The committed BBC SentencePiece vocabulary, its gin knobs, and the tool that trains it."""
import pathlib

import gin
import pytest
import seqio
import sentencepiece as spm

from t2t.data import sources, vocabularies
from tools import train_vocab


@gin.configurable("t2t_test_vocab_consumer")
def _consume(vocabulary=None):
  return vocabulary


@pytest.fixture
def clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_committed_model_lives_in_the_tasks_package():
  path = pathlib.Path(vocabularies.BBC_VOCAB_PATH)
  assert path.is_file() and path.parent.name == "vocab" and path.parent.parent.name == "tasks"
  assert path.with_suffix(".vocab").is_file()


def test_special_ids_and_sentinels():
  vocab = vocabularies.bbc_vocabulary()
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.vocab_size == 8100 and vocab.extra_ids == 100
  assert vocab.tokenizer.bos_id() == -1
  assert vocab.encode("<extra_id_0>") == [8099]
  assert vocab.encode("<extra_id_99>") == [8000]
  assert vocab.decode([8099]) == "<extra_id_0>"


def test_round_trips_real_text():
  text = sources.bbc_articles("test")[0]["text"].split("\n")[0]
  vocab = vocabularies.bbc_vocabulary()
  ids = vocab.encode(text)
  assert 0 < len(ids) < len(text) and vocab.unk_id not in ids
  assert vocab.decode(ids) == text


def test_gin_knobs(clean_gin):
  gin.parse_config(f"""
      bbc_vocabulary.extra_ids = 10
      v/seqio.SentencePieceVocabulary.sentencepiece_model_file = '{vocabularies.BBC_VOCAB_PATH}'
      v/seqio.SentencePieceVocabulary.extra_ids = 3
      t2t_test_vocab_consumer.vocabulary = @v/seqio.SentencePieceVocabulary()
  """)
  assert vocabularies.bbc_vocabulary().vocab_size == 8010
  vocab = _consume()
  assert isinstance(vocab, seqio.SentencePieceVocabulary) and vocab.vocab_size == 8003
  vocabularies._register_seqio_vocab_for_gin()  # registering again is harmless


def test_negative_extra_ids_is_a_clear_error():
  with pytest.raises(ValueError, match="extra_ids must be >= 0"):
    vocabularies.bbc_vocabulary(extra_ids=-1)


def test_train_vocab_tool_writes_a_t5_style_model(tmp_path):
  model = train_vocab.train_vocab(str(tmp_path / "small"), vocab_size=300, split="validation")
  sp = spm.SentencePieceProcessor(model_file=str(model))
  assert sp.get_piece_size() == 300
  assert (sp.pad_id(), sp.eos_id(), sp.unk_id(), sp.bos_id()) == (0, 1, 2, -1)
  assert (tmp_path / "small.vocab").read_text().splitlines()[0].startswith("<pad>")
  with pytest.raises(ValueError, match="vocab_size"):
    train_vocab.train_vocab(str(tmp_path / "bad"), vocab_size=2)
