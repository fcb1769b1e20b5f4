"""What the TFDS-backed task modules share: the gin-chosen vocabulary, features, sources, registration.

The vocabulary is resolved lazily. Tasks are registered at import time, before a gin file's
bindings exist, so their features hold a ``DeferredVocabulary`` that asks the gin-configurable
``task_vocabulary()`` which vocabulary to use each time it is used. Nothing is read (no GCS, no
file) until data is tokenized or decoded. Choose it in gin::

    task_vocabulary.spm_path = "/path/to/sentencepiece.model"          # a SentencePiece file
    task_vocabulary.vocabulary = @t2t.data.vocabularies.bbc_vocabulary()  # or any vocabulary

or pass ``vocabulary=`` to a module's ``register(...)`` to re-register its tasks with a fixed one.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import gin
import seqio
import tensorflow as tf

T5_SPM_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
T5_EXTRA_IDS = 100


@functools.lru_cache(maxsize=None)
def _sentencepiece(spm_path: str, extra_ids: int) -> seqio.SentencePieceVocabulary:
    # seqio loads the model file lazily, on first use; one instance per (path, extra_ids).
    return seqio.SentencePieceVocabulary(spm_path, extra_ids=extra_ids)


@gin.configurable
def task_vocabulary(vocabulary: seqio.Vocabulary | None = None, spm_path: str = T5_SPM_PATH,
                    extra_ids: int = T5_EXTRA_IDS) -> seqio.Vocabulary:
    """The vocabulary of the TFDS-backed tasks: ``vocabulary`` if given, else SentencePiece at ``spm_path``.

    Args:
      vocabulary: any seqio vocabulary; wins over ``spm_path``.
      spm_path: a SentencePiece model file (default: T5's 32,000-piece C4 vocabulary on GCS).
      extra_ids: sentinel ids appended to the SentencePiece vocabulary (T5: 100).
    """
    if vocabulary is not None:
        if not isinstance(vocabulary, seqio.Vocabulary):
            raise ValueError(f"task_vocabulary.vocabulary must be a seqio.Vocabulary, got {type(vocabulary).__name__}.")
        return vocabulary
    if not spm_path:
        raise ValueError("task_vocabulary.spm_path is empty; set it or bind task_vocabulary.vocabulary.")
    return _sentencepiece(spm_path, int(extra_ids))


class DeferredVocabulary(seqio.Vocabulary):
    """A seqio vocabulary that forwards every use to ``resolve()``, called at the time of use.

    Two deferred vocabularies with the same ``resolve`` are equal without resolving anything, so
    mixtures of deferred-vocabulary tasks are built without touching the vocabulary file.
    """

    def __init__(self, resolve: Callable[[], seqio.Vocabulary] = task_vocabulary):
        # seqio.Vocabulary.__init__ only stores extra_ids, which are the resolved vocabulary's.
        self._resolve = resolve

    @property
    def resolved(self) -> seqio.Vocabulary:
        vocabulary = self._resolve()
        if not isinstance(vocabulary, seqio.Vocabulary):
            raise ValueError(f"{self._resolve!r} returned {type(vocabulary).__name__}, not a seqio.Vocabulary.")
        return vocabulary

    bos_id = property(lambda self: self.resolved.bos_id)
    eos_id = property(lambda self: self.resolved.eos_id)
    pad_id = property(lambda self: self.resolved.pad_id)
    unk_id = property(lambda self: self.resolved.unk_id)
    extra_ids = property(lambda self: self.resolved.extra_ids)
    vocab_size = property(lambda self: self.resolved.vocab_size)
    _base_vocab_size = property(lambda self: self.resolved._base_vocab_size)  # pylint: disable=protected-access

    def encode(self, s):
        return self.resolved.encode(s)

    def decode(self, ids):
        return self.resolved.decode(ids)

    def encode_tf(self, s: tf.Tensor) -> tf.Tensor:
        return self.resolved.encode_tf(s)

    def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
        return self.resolved.decode_tf(ids)

    # The abstract hooks; the public methods above never reach them.
    def _encode(self, s):
        return self.resolved._encode(s)  # pylint: disable=protected-access

    def _decode(self, ids):
        return self.resolved._decode(ids)  # pylint: disable=protected-access

    def _encode_tf(self, s):
        return self.resolved._encode_tf(s)  # pylint: disable=protected-access

    def _decode_tf(self, ids):
        return self.resolved._decode_tf(ids)  # pylint: disable=protected-access

    def __getattr__(self, name: str) -> Any:
        # Anything else (sp_model, tokenizer, ...) is the resolved vocabulary's.
        if name.startswith("__") or name == "_resolve":
            raise AttributeError(name)
        return getattr(self.resolved, name)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeferredVocabulary):
            return self._resolve is other._resolve or self.resolved == other.resolved
        return isinstance(other, seqio.Vocabulary) and self.resolved == other

    def __hash__(self) -> int:
        return hash(self._resolve)

    def __repr__(self) -> str:
        return f"DeferredVocabulary(resolve={getattr(self._resolve, '__name__', self._resolve)!r})"


DEFAULT_VOCABULARY = DeferredVocabulary()


def output_features(vocabulary: seqio.Vocabulary | None = None) -> dict[str, seqio.Feature]:
    """``inputs`` and ``targets`` features, EOS appended, with the (default: deferred) vocabulary."""
    vocabulary = DEFAULT_VOCABULARY if vocabulary is None else vocabulary
    return {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
    }


class SplitTransformTfdsSource(seqio.TfdsDataSource):
    """A TFDS source that transforms some splits' raw examples before the task's preprocessors.

    Used where the training split differs in kind from the evaluation splits: WSC trains only on
    examples whose candidate is the referent; ReCoRD trains on one example per gold answer.
    ``num_input_examples`` still counts the raw examples.
    """

    def __init__(self, tfds_name: str, splits: Mapping[str, str],
                 split_transforms: Mapping[str, Callable[[tf.data.Dataset], tf.data.Dataset]]):
        unknown = set(split_transforms) - set(splits)
        if unknown:
            raise ValueError(f"split_transforms names splits {sorted(unknown)} that are not in {sorted(splits)}.")
        super().__init__(tfds_name, splits=dict(splits))
        self._split_transforms = dict(split_transforms)

    def get_dataset(self, split: str | None = None, shuffle: bool = True, seed: int | None = None,
                    shard_info: seqio.ShardInfo | None = None, **kwargs) -> tf.data.Dataset:
        dataset = super().get_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info, **kwargs)
        transform = self._split_transforms.get(split or "train")
        return transform(dataset) if transform else dataset


def register_task(name: str, source: seqio.DataSource, preprocessors: Sequence[Callable[..., Any]],
                  metric_fns: Iterable[Callable[..., Mapping[str, float]]],
                  postprocess_fn: Callable[..., Any] | None = None,
                  vocabulary: seqio.Vocabulary | None = None,
                  tokenized_preprocessors: Sequence[Callable[..., Any]] = ()) -> seqio.Task:
    """Registers (or re-registers, replacing) a task: format, tokenize, [cache], objective, EOS.

    Args:
      name: the seqio task name.
      source: where raw examples come from.
      preprocessors: the formatting steps producing string ``inputs``/``targets``.
      metric_fns: seqio metric functions ``fn(targets, predictions) -> dict``.
      postprocess_fn: maps decoded text to what the metrics compare.
      vocabulary: fixed vocabulary; default the gin-chosen ``DEFAULT_VOCABULARY``.
      tokenized_preprocessors: steps on token ids after the cache point (e.g. a random objective).
    """
    task = seqio.Task(
        name,
        source=source,
        preprocessors=[*preprocessors, seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(),
                       *tokenized_preprocessors, seqio.preprocessors.append_eos_after_trim],
        output_features=output_features(vocabulary),
        postprocess_fn=postprocess_fn,
        metric_fns=list(metric_fns),
    )
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add_provider(name, task)
    return task


def register_mixture(name: str, tasks: Sequence[str | tuple[str, Any]],
                     default_rate: Any = None) -> seqio.Mixture:
    """Registers (or re-registers, replacing) a seqio mixture."""
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, tasks, default_rate=default_rate)
