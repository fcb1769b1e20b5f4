"""Text-to-text formatters: raw TFDS examples -> ``{"inputs", "targets", ...}`` strings (T5 App. D).

Each formatter is a seqio preprocessor (``dataset -> dataset``, extra arguments by keyword) made with
``seqio.map_over_dataset``, so it runs inside tf.data. Besides ``inputs`` and ``targets`` it passes on
what evaluation needs (``idx``, gold answer lists, WSC labels); feature converters drop the rest.

Formats, with the feature keys of the TFDS builders (see ``tasks/`` for each task's arguments):

- classification: ``"<prefix> name1: text1 name2: text2"`` -> the label name;
  e.g. ``"mnli hypothesis: ... premise: ..."`` -> ``"contradiction"``.
- STS-B: the score rounded to the nearest 0.2 and written with one decimal (3.25 -> "3.2").
- WSC: ``"wsc: <text with the pronoun wrapped in asterisks>"`` -> the candidate noun phrase.
- ReCoRD: ``"record query: <query> entities: <e1>, <e2> passage: <passage>"`` -> an answer.
- SQuAD: ``"question: <question> context: <context>"`` -> the first gold answer.
- Summaries: ``"summarize: <article>"``; translation: ``"translate English to German: <text>"``.

An unlabeled example (label -1, the benchmarks' test splits) gets the target ``UNLABELED``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

Features = Mapping[str, tf.Tensor]

UNLABELED = "<unk>"
LANGUAGE_NAMES: Mapping[str, str] = {
    "en": "English", "de": "German", "fr": "French", "ro": "Romanian",
}


def join_fields(prefix: str, fields: Sequence[tuple[str, tf.Tensor]]) -> tf.Tensor:
    """``"prefix name1: value1 name2: value2"`` (no leading prefix when ``prefix`` is empty)."""
    parts = [prefix] if prefix else []
    for name, value in fields:
        parts.extend([f"{name}:", value])
    return tf.strings.join(parts, separator=" ")


def label_name(label: tf.Tensor, label_names: Sequence[str]) -> tf.Tensor:
    """The label's name; ``UNLABELED`` for a negative label (unlabeled test examples)."""
    if not label_names:
        raise ValueError("label_names must be a non-empty sequence of label strings.")
    label = tf.cast(label, tf.int32)
    # A label past the names is bad data: say so (tf.gather's index error names no culprit).
    check = tf.debugging.Assert(label < len(label_names), [
        "formats: label", label, f"is not one of the {len(label_names)} label_names "
        f"{list(label_names)}; fix the task's label_names or the data."])
    with tf.control_dependencies([check]):
        name = tf.gather(tf.constant(list(label_names)), tf.maximum(label, 0))
    return tf.where(label < 0, tf.constant(UNLABELED), name)


def _index_features(x: Features) -> dict[str, tf.Tensor]:
    """The example's ``idx``, flattened (``{"idx": {"question": q}}`` -> ``{"idx/question": q}``)."""
    if "idx" not in x:
        return {}
    idx = x["idx"]
    if isinstance(idx, Mapping):
        return {f"idx/{key}": value for key, value in idx.items()}
    return {"idx": idx}


@seqio.map_over_dataset
def classification(x: Features, *, prefix: str, fields: Sequence[tuple[str, str]],
                   label_names: Sequence[str]) -> dict[str, tf.Tensor]:
    """GLUE / SuperGLUE classification: named fields after a task prefix -> label name.

    Args:
      x: a TFDS example with the ``fields`` keys, ``label`` and optionally ``idx``.
      prefix: task prefix, e.g. ``"rte"``.
      fields: ``(name written in the input, feature key)`` pairs, in input order.
      label_names: label strings indexed by the integer label.
    """
    return {
        "inputs": join_fields(prefix, [(name, x[key]) for name, key in fields]),
        "targets": label_name(x["label"], label_names),
        **_index_features(x),
    }


def stsb_target(score: tf.Tensor) -> tf.Tensor:
    """A similarity score rounded to the nearest 0.2, one decimal: 3.25 -> "3.2", 2.57 -> "2.6"."""
    rounded = tf.round(tf.cast(score, tf.float32) * 5.0) / 5.0
    return tf.where(score < 0, tf.constant(UNLABELED), tf.strings.as_string(rounded, precision=1))


@seqio.map_over_dataset
def stsb(x: Features) -> dict[str, tf.Tensor]:
    """STS-B: ``"stsb sentence1: ... sentence2: ..."`` -> the score as a string, 0.2 steps."""
    return {
        "inputs": join_fields("stsb", [("sentence1", x["sentence1"]), ("sentence2", x["sentence2"])]),
        "targets": stsb_target(x["label"]),
        **_index_features(x),
    }


def mark_span(text: tf.Tensor, span_text: tf.Tensor, word_index: tf.Tensor,
              mark: str = "*") -> tf.Tensor:
    """Wraps ``span_text``, which starts at word ``word_index`` of ``text`` (words split on " "),
    in ``mark``: ("... made it pleasant", "it", 20) -> "... made *it* pleasant".

    Punctuation glued to the span's last word stays outside the marks ("it." -> "*it*.").
    """
    words = tf.strings.split(text, sep=" ")
    num_words = tf.size(words)
    start = tf.clip_by_value(tf.cast(word_index, tf.int32), 0, num_words)
    span_words = tf.size(tf.strings.split(span_text, sep=" "))
    end = tf.minimum(start + span_words, num_words)
    segment = tf.strings.reduce_join(words[start:end], separator=" ")
    segment_len = tf.strings.length(segment)
    span_len = tf.minimum(tf.strings.length(span_text), segment_len)
    starts_with_span = tf.equal(tf.strings.substr(segment, 0, span_len), span_text)
    rest = tf.strings.substr(segment, span_len, segment_len - span_len)
    marked = tf.where(starts_with_span,
                      tf.strings.join([mark, span_text, mark, rest]),
                      tf.strings.join([mark, segment, mark]))
    pieces = tf.concat([words[:start], tf.reshape(marked, [1]), words[end:]], axis=0)
    return tf.strings.reduce_join(pieces, separator=" ")


@seqio.map_over_dataset
def wsc(x: Features) -> dict[str, tf.Tensor]:
    """WSC (T5's "referent noun" form): ``"wsc: <text, pronoun in asterisks>"`` -> candidate noun.

    ``label`` (1 when the candidate is the referent) is passed on for evaluation; the training
    split keeps only label-1 examples (done by the task's source, see ``tasks/superglue.py``).
    """
    marked = mark_span(x["text"], x["span2_text"], x["span2_index"])
    return {
        "inputs": tf.strings.join(["wsc:", marked], separator=" "),
        "targets": x["span1_text"],
        "label": x["label"],
        **_index_features(x),
    }


def record_passage(passage: tf.Tensor) -> tf.Tensor:
    """Joins ReCoRD's "@highlight" bullets into sentences: ".\\n@highlight\\nX" -> ". X"."""
    passage = tf.strings.regex_replace(passage, r"([.!?\"'])\n@highlight\n", r"\1 ")
    return tf.strings.regex_replace(passage, r"\n@highlight\n", ". ")


@seqio.map_over_dataset
def record(x: Features) -> dict[str, tf.Tensor]:
    """ReCoRD: ``"record query: Q entities: e1, e2 passage: P"`` -> the first gold answer.

    All gold answers are passed on as ``answers`` for the max-over-answers EM/F1.
    """
    answers = x["answers"]
    # The first answer, else UNLABELED; no tf.cond, whose slice fails at trace time when the
    # answers' static shape is [0] (a split without answers).
    target = tf.concat([tf.reshape(answers, [-1]), [UNLABELED]], axis=0)[0]
    inputs = join_fields("record", [
        ("query", x["query"]),
        ("entities", tf.strings.reduce_join(x["entities"], separator=", ")),
        ("passage", record_passage(x["passage"])),
    ])
    return {"inputs": inputs, "targets": target, "answers": answers, **_index_features(x)}


def one_example_per_answer(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """ReCoRD training: repeats each raw example once per gold answer, ``answers`` = [that answer].

    Examples without answers are dropped (nothing to learn from them).
    """
    def expand(x):
        answers = x["answers"]
        per_answer = {k: v for k, v in x.items() if k != "answers"}
        repeated = tf.data.Dataset.from_tensors(per_answer).repeat(tf.cast(tf.size(answers), tf.int64))
        answer_ds = tf.data.Dataset.from_tensor_slices(tf.reshape(answers, [-1, 1]))
        return tf.data.Dataset.zip((repeated, answer_ds)).map(lambda ex, a: {**ex, "answers": a})

    return dataset.flat_map(expand)


@seqio.map_over_dataset
def squad(x: Features) -> dict[str, tf.Tensor]:
    """SQuAD: ``"question: Q context: C"`` -> the first gold answer; all answers as ``answers``."""
    answers = x["answers"]["text"]
    return {
        "inputs": join_fields("", [("question", x["question"]), ("context", x["context"])]),
        "targets": answers[0],
        "answers": answers,
        "id": x["id"],
    }


@seqio.map_over_dataset
def summarize(x: Features, *, article_key: str = "article",
              summary_key: str = "highlights") -> dict[str, tf.Tensor]:
    """Summarisation (CNN/Daily Mail): ``"summarize: <article>"`` -> the summary."""
    return {"inputs": tf.strings.join(["summarize:", x[article_key]], separator=" "),
            "targets": x[summary_key]}


def _language_name(code: str) -> str:
    if code not in LANGUAGE_NAMES:
        raise ValueError(f"unknown language code '{code}'; known: {sorted(LANGUAGE_NAMES)}.")
    return LANGUAGE_NAMES[code]


@seqio.map_over_dataset
def translate(x: Features, *, source_language: str, target_language: str) -> dict[str, tf.Tensor]:
    """Translation: ``"translate English to German: <en>"`` -> ``<de>`` (keys are language codes)."""
    prefix = f"translate {_language_name(source_language)} to {_language_name(target_language)}:"
    return {"inputs": tf.strings.join([prefix, x[source_language]], separator=" "),
            "targets": x[target_language]}
