"""Vocabularies: the committed BBC SentencePiece model, and seqio's vocabulary class for gin.

`tasks/vocab/bbc_sp8k.model` (8,000 unigram pieces; pad 0, eos 1, unk 2, no bos) is produced by
`python -m tools.train_vocab --output tasks/vocab/bbc_sp8k`. With seqio's 100 extra ids the
vocabulary has 8,100 ids; `<extra_id_0>` is 8099, numbered down from the top as in T5.
"""
from __future__ import annotations

import hashlib
import importlib.util
import pathlib
from typing import Any, Mapping

import gin
import seqio
import tensorflow as tf
from google.protobuf import message as protobuf_message

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


# --- Readable before anything runs ----------------------------------------------------------------

def check_readable(vocabulary: seqio.Vocabulary, what: str) -> None:
  """Reads `vocabulary`'s SentencePiece model now; a file that cannot be read is one ValueError.

  seqio reads the model file on first use, which is deep inside model initialisation or a tf.data
  pipeline, so a missing local file or an unreachable URL (the models' default
  `gs://t5-data/...` on a machine without GCS access) would end a run with TensorFlow's
  traceback. t2t's entry points call this first, for the model's and the tasks' vocabularies
  (`what` names which, e.g. "the model's input vocabulary"); the message names the file, the
  reason and the gin binding that points at a local copy. Other vocabulary classes hold no
  file and pass.
  """
  resolved = _unwrap(vocabulary)
  if not isinstance(resolved, seqio.SentencePieceVocabulary):
    return
  path = resolved.sentencepiece_model_file
  binding = ("task_vocabulary.spm_path (or task_vocabulary.vocabulary)"
             if resolved is not vocabulary else
             "seqio.SentencePieceVocabulary.sentencepiece_model_file (or VOCABULARY)")
  try:
    resolved.vocab_size  # pylint: disable=pointless-statement  (loads the model file)
  except (tf.errors.OpError, OSError) as err:
    reason = " ".join(str(getattr(err, "message", err)).split())
    raise ValueError(
        f"{what} cannot be read from {path}: {reason}. t2t downloads nothing: point {binding} "
        "at a local copy of that SentencePiece model (a Hugging Face T5 directory has it as "
        "spiece.model), or use the offline vocabulary, @bbc_vocabulary().") from None
  except protobuf_message.DecodeError as err:
    raise ValueError(f"{what}: {path} is not a SentencePiece model ({err}); point {binding} at "
                     "the .model file that spm_train wrote.") from None


def check_model_readable(model: Any) -> None:
  """`check_readable` for a model's input and output vocabularies (attributes it may lack)."""
  for feature, attr in (("input", "input_vocabulary"), ("output", "output_vocabulary")):
    vocabulary = getattr(model, attr, None)
    if vocabulary is not None:
      check_readable(vocabulary, f"The model's {feature} vocabulary")


def check_task_readable(provider: seqio.Task | seqio.Mixture) -> None:
  """`check_readable` for every output feature's vocabulary of a task or of a mixture's tasks."""
  tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
  for task in tasks:
    for name, feature in sorted(task.output_features.items()):
      check_readable(feature.vocabulary, f"The {name!r} vocabulary of task {task.name!r}")


# --- Fingerprints: which vocabulary a checkpoint was trained with ---------------------------------

def _unwrap(vocabulary: seqio.Vocabulary) -> seqio.Vocabulary:
  """The vocabulary a wrapper stands for (tasks.common.DeferredVocabulary's `resolved`)."""
  while isinstance(getattr(type(vocabulary), "resolved", None), property):
    vocabulary = vocabulary.resolved
  return vocabulary


def fingerprint(vocabulary: seqio.Vocabulary) -> dict[str, Any]:
  """A short JSON record of `vocabulary`: class, size (ids, extra ids included), extra ids, and
  for a SentencePiece vocabulary the first 16 hex digits of the SHA-256 of its model file.

  Two vocabularies with the same record map text to the same ids (up to a hash collision); the
  record holds no model, a few dozen bytes. The file's bytes are hashed, not seqio's in-memory
  model (re-serialised with the extra ids added, so it could change with a protobuf version);
  what seqio changes that moves ids is recorded beside it when not the default: the extra ids'
  order (`reverse_extra_ids`) and a normalizer override. Other classes (pass-through, byte,
  WordPiece) are told apart by class and size only.
  """
  vocabulary = _unwrap(vocabulary)
  record: dict[str, Any] = {"class": type(vocabulary).__name__,
                            "size": int(vocabulary.vocab_size),
                            "extra_ids": int(vocabulary.extra_ids or 0)}
  if isinstance(vocabulary, seqio.SentencePieceVocabulary):
    with tf.io.gfile.GFile(vocabulary.sentencepiece_model_file, "rb") as f:
      record["sentencepiece_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
    if record["extra_ids"] and getattr(vocabulary, "_reverse_extra_ids", True) is False:
      record["reverse_extra_ids"] = False
    overrides = getattr(vocabulary, "_normalizer_spec_overrides", None)
    if overrides is not None:
      record["normalizer_overrides_sha256"] = hashlib.sha256(
          overrides.SerializeToString(deterministic=True)).hexdigest()[:16]
  return record


def describe(record: Mapping[str, Any]) -> str:
  """'SentencePieceVocabulary (8100 ids, 100 extra ids, sentencepiece sha256 0123abcd...)'."""
  parts = [f"{record.get('size')} ids", f"{record.get('extra_ids')} extra ids"]
  if record.get("sentencepiece_sha256"):
    parts.append(f"sentencepiece sha256 {record['sentencepiece_sha256']}")
  if record.get("reverse_extra_ids") is False:
    parts.append("extra ids in forward order")
  if record.get("normalizer_overrides_sha256"):
    parts.append(f"normalizer override {record['normalizer_overrides_sha256']}")
  return f"{record.get('class')} ({', '.join(parts)})"


def task_record(provider: seqio.Task | seqio.Mixture) -> dict[str, dict[str, Any]]:
  """{feature: fingerprint} of a task's (or mixture's) output features' vocabularies.

  A mixture's `output_features` are its first task's, so every task is fingerprinted: tasks of
  one mixture that tokenize a feature differently are refused (a model reads one vocabulary;
  the others' text would be read with the wrong ids, and their scores would be nonsense)."""
  tasks = provider.tasks if isinstance(provider, seqio.Mixture) else [provider]
  records = {task.name: {name: fingerprint(feature.vocabulary)
                         for name, feature in sorted(task.output_features.items())}
             for task in tasks}
  first_task, first = next(iter(records.items()))
  for task_name, record in records.items():
    for feature in sorted(set(first) & set(record)):
      if dict(first[feature]) != dict(record[feature]):
        raise ValueError(
            f"Mixture {provider.name!r} mixes vocabularies: the {feature!r} feature of task "
            f"{first_task!r} is {describe(first[feature])}, of task {task_name!r} "
            f"{describe(record[feature])}. A model reads one vocabulary: give the tasks the same "
            "one, or evaluate them separately.")
  return first


def model_record(model: Any) -> dict[str, dict[str, Any]]:
  """{'inputs': ..., 'targets': ...} fingerprints of a model's input and output vocabularies."""
  out = {}
  for feature, attr in (("inputs", "input_vocabulary"), ("targets", "output_vocabulary")):
    vocabulary = getattr(model, attr, None)
    if vocabulary is not None:
      out[feature] = fingerprint(vocabulary)
  return out


def differences(saved: Mapping[str, Mapping[str, Any]],
                current: Mapping[str, Mapping[str, Any]]) -> list[str]:
  """'inputs: <saved> vs <current>' for each feature both records hold that differs."""
  return [f"{feature}: {describe(saved[feature])} in the checkpoint, {describe(current[feature])} "
          "now" for feature in sorted(set(saved) & set(current))
          if dict(saved[feature]) != dict(current[feature])]
