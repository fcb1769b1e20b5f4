"""Postprocessors: decoded text -> the values that ``t2t.data.metrics`` compares.

Each has seqio's signature ``fn(output, example=None, is_target=False)``: ``output`` is the decoded
prediction (or, with ``is_target=True``, the pretokenized target), and ``example`` is the evaluation
example as numpy values (byte strings for text), which some tasks need: MultiRC groups answers
by question, SQuAD and ReCoRD score against every gold answer, WSC compares with the candidate.
"""
from __future__ import annotations

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


# T5's `wsc_simple` postprocessor (t5/data/postprocessors.py, the rule of T5 Appendix B's WSC
# format): determiners ignored when comparing the predicted referent with the candidate.
WSC_DETERMINERS = frozenset(
    "a an few her his each every many much my our some that the their these this those which "
    "whose your".split())


def _wsc_clean(text: str) -> str:
    """T5's cleaning: strip, lowercase, drop determiners (words split on single spaces)."""
    return " ".join(w for w in text.strip().lower().split(" ") if w not in WSC_DETERMINERS)


def wsc_referent_matches(prediction: str, candidate: str) -> bool:
    """T5's WSC rule (``wsc_simple``): after ``_wsc_clean``, the prediction's set of words is a
    subset of the candidate's, or vice versa ("fuzzy bunny" vs "bunny" match).

    As in T5: case and determiners are ignored, punctuation is not ("stable." is not "stable");
    when exactly one side contains an apostrophe it never matches ("Bob" vs "Bob's hat"); and
    an empty prediction never matches.
    """
    predicted, referent = _wsc_clean(prediction), _wsc_clean(candidate)
    if not predicted:
        return False
    if ("'" in predicted) != ("'" in referent):
        return False
    predicted_words, referent_words = set(predicted.split(" ")), set(referent.split(" "))
    return predicted_words <= referent_words or referent_words <= predicted_words


def wsc(output: str, example: Mapping[str, Any] | None = None, is_target: bool = False) -> str:
    """"True"/"False": targets from the example's label; predictions by comparing the predicted
    referent with the candidate noun phrase (the pretokenized target), see ``wsc_referent_matches``.

    An empty prediction is ``INVALID_LABEL`` (T5 returns -1 for it), so it is wrong whatever the
    label, instead of spuriously matching a "False" example.
    """
    if is_target:
        label = int(_feature(example, "label", "wsc"))
        return "True" if label == 1 else "False"
    candidate = as_text(_feature(example, "targets_pretokenized", "wsc"))
    if not _wsc_clean(as_text(output)):
        return INVALID_LABEL
    return "True" if wsc_referent_matches(as_text(output), candidate) else "False"
