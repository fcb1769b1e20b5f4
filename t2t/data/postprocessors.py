"""Postprocessors: decoded text -> the values that ``t2t.data.metrics`` compares.

Each has seqio's signature ``fn(output, example=None, is_target=False)``: ``output`` is the decoded
prediction (or, with ``is_target=True``, the pretokenized target), and ``example`` is the evaluation
example as numpy values (byte strings for text), which some tasks need: MultiRC groups answers
by question, SQuAD and ReCoRD score against every gold answer, WSC compares with the candidate.
"""
from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# The single value every invalid classification output becomes: it matches no target, and all
# invalid outputs fall in one (wrong) class, as T5's reference maps them all to -1.
INVALID_LABEL = "<invalid>"
# What a non-number (or out-of-range) STS-B output becomes: far from every gold score in [0, 5].
INVALID_SCORE = -1.0
STSB_RANGE = (0.0, 5.0)


def as_text(value: Any) -> str:
    """Returns ``value`` as ``str``: decodes UTF-8 bytes (numpy or Python), passes ``str`` through."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value).decode("utf-8")
    if isinstance(value, str):
        return value
    raise ValueError(f"expected text (str or bytes), got {type(value).__name__}: {value!r}.")


def _feature(example: Mapping[str, Any] | None, key: str, who: str) -> Any:
    """Returns ``example[key]`` or a clear error when the evaluation example lacks it."""
    if example is None or key not in example:
        have = sorted(example) if example is not None else "no example"
        raise ValueError(f"postprocessor '{who}' needs feature '{key}' in the example; got {have}.")
    return example[key]


def strip(output: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str:
    """The text with surrounding whitespace removed (generation tasks: translation, summaries)."""
    del example, is_target
    return as_text(output).strip()


def classification(output: str, example: Mapping[str, Any] | None = None,
                   is_target: bool = False, *, labels: Sequence[str] = ()) -> str:
    """The label if ``output`` (stripped) is one of ``labels``, else ``INVALID_LABEL``.

    Bind the label set with ``functools.partial(classification, labels=(...))``.
    """
    del example, is_target
    if not labels:
        raise ValueError("classification postprocessor needs a non-empty `labels` tuple.")
    text = as_text(output).strip()
    return text if text in labels else INVALID_LABEL


def stsb(output: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> float:
    """Parses an STS-B score; a non-number or a number outside [0, 5] is ``INVALID_SCORE``."""
    del example, is_target
    try:
        value = float(as_text(output).strip())
    except ValueError:
        return INVALID_SCORE
    low, high = STSB_RANGE
    return value if low <= value <= high and np.isfinite(value) else INVALID_SCORE


def multirc(output: str, example: Mapping[str, Any] | None = None,
            is_target: bool = False) -> dict[str, Any]:
    """``{"group": (paragraph idx, question idx), "value": "True"/"False"/INVALID_LABEL}``.

    Answer options of one question share a group; ``metrics.multirc`` scores EM per group.
    """
    value = classification(output, labels=("False", "True"))
    group = (int(_feature(example, "idx/paragraph", "multirc")),
             int(_feature(example, "idx/question", "multirc")))
    return {"group": group, "value": value}


def _answers(example: Mapping[str, Any] | None, who: str) -> list[str]:
    answers = [as_text(a) for a in np.asarray(_feature(example, "answers", who)).reshape(-1)]
    if not answers:
        raise ValueError(f"postprocessor '{who}': the example has an empty 'answers' list (unlabeled split?).")
    return answers


def squad(output: str, example: Mapping[str, Any] | None = None,
          is_target: bool = False) -> list[str] | str:
    """Targets: the example's list of gold answers. Predictions: the stripped answer text."""
    if is_target:
        return _answers(example, "squad")
    return as_text(output).strip()


def record(output: str, example: Mapping[str, Any] | None = None,
           is_target: bool = False) -> dict[str, Any] | str:
    """Targets: ``{"group": (passage idx, query idx), "answers": [...]}``; predictions: the text.

    The group lets ``metrics.record`` score each query once even though the training split has
    one example per gold answer.
    """
    if is_target:
        group = (int(_feature(example, "idx/passage", "record")),
                 int(_feature(example, "idx/query", "record")))
        return {"group": group, "answers": _answers(example, "record")}
    return as_text(output).strip()


# Words ignored when comparing a WSC prediction with the candidate: the paper ignores articles;
# possessive and demonstrative determiners are equally uninformative about the referent.
_WSC_IGNORED = frozenset(
    "a an the his her its their our my your this that these those".split())
_WSC_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation.replace(chr(39), ''))}]")


def _wsc_words(text: str) -> set[str]:
    text = _WSC_PUNCTUATION.sub(" ", text.lower())
    return {w for w in text.split() if w not in _WSC_IGNORED}


def wsc_referent_matches(prediction: str, candidate: str) -> bool:
    """T5's WSC rule: the prediction's words are a subset of the candidate's, or vice versa.

    Case, punctuation and articles/determiners are ignored; an empty prediction never matches.
    """
    predicted, referent = _wsc_words(prediction), _wsc_words(candidate)
    if not predicted or not referent:
        return False
    return predicted <= referent or referent <= predicted


def wsc(output: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str:
    """"True"/"False": targets from the example's label; predictions by comparing the predicted
    referent with the candidate noun phrase (the pretokenized target), see ``wsc_referent_matches``.
    """
    if is_target:
        label = int(_feature(example, "label", "wsc"))
        return "True" if label == 1 else "False"
    candidate = as_text(_feature(example, "targets_pretokenized", "wsc"))
    return "True" if wsc_referent_matches(as_text(output), candidate) else "False"
