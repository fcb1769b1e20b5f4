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


def test_an_unreadable_model_file_is_one_error_naming_file_and_binding(tmp_path):
  missing = str(tmp_path / "t5" / "spiece.model")
  with pytest.raises(ValueError) as err:
    vocabularies.check_readable(seqio.SentencePieceVocabulary(missing), "The model's input vocabulary")
  message = str(err.value)
  assert message.startswith(f"The model's input vocabulary cannot be read from {missing}: ")
  assert "No such file or directory" in message and "\n" not in message
  assert "seqio.SentencePieceVocabulary.sentencepiece_model_file" in message
  not_a_model = tmp_path / "notes.model"
  not_a_model.write_text("hello\n")
  with pytest.raises(ValueError, match=rf"^The model's input vocabulary: {not_a_model} is not a "
                                       r"SentencePiece model \(Error parsing"):
    vocabularies.check_readable(seqio.SentencePieceVocabulary(str(not_a_model)),
                                "The model's input vocabulary")
  vocabularies.check_readable(vocabularies.bbc_vocabulary(), "The model's input vocabulary")
  vocabularies.check_readable(seqio.ByteVocabulary(), "bytes")  # no file to read


def test_the_task_librarys_deferred_vocabulary_names_its_gin_binding(clean_gin, tmp_path):
  from tasks import common
  missing = str(tmp_path / "sp.model")
  gin.bind_parameter("task_vocabulary.spm_path", missing)
  deferred = common.DeferredVocabulary()
  with pytest.raises(ValueError, match=r"The 'inputs' vocabulary of task 'x' cannot be read from "
                                       rf"{missing}: .* point task_vocabulary\.spm_path"):
    vocabularies.check_readable(deferred, "The 'inputs' vocabulary of task 'x'")
  gin.bind_parameter("task_vocabulary.vocabulary", vocabularies.bbc_vocabulary())
  vocabularies.check_readable(deferred, "The 'inputs' vocabulary of task 'x'")


def test_a_tasks_and_a_models_vocabularies_are_checked_by_feature(tmp_path):
  import types
  from t2t.data import files
  data = tmp_path / "train.tsv"
  data.write_text("a b\tc\n")
  bad = seqio.SentencePieceVocabulary(str(tmp_path / "missing.model"))
  name = files.files_task("vocab_check_files", {"train": str(data)}, vocabulary=bad)
  try:
    with pytest.raises(ValueError, match=r"^The 'inputs' vocabulary of task 'vocab_check_files' cannot"):
      vocabularies.check_task_readable(seqio.get_mixture_or_task(name))
  finally:
    seqio.TaskRegistry.remove(name)
  model = types.SimpleNamespace(input_vocabulary=vocabularies.bbc_vocabulary(),
                                output_vocabulary=bad)
  with pytest.raises(ValueError, match=r"^The model's output vocabulary cannot be read"):
    vocabularies.check_model_readable(model)
