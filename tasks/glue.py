"""GLUE as text-to-text seqio tasks, from TFDS ``glue`` (T5 paper §2.3, Appendix D.1-D.8).

Registered on import (``import tasks.glue``), one task per benchmark task, named ``glue_<task>``:

| task | input | targets | metrics |
|---|---|---|---|
| glue_cola | cola sentence: ... | unacceptable / acceptable | MCC |
| glue_sst2 | sst2 sentence: ... | negative / positive | accuracy |
| glue_mrpc | mrpc sentence1: ... sentence2: ... | not_equivalent / equivalent | F1, accuracy |
| glue_qqp | qqp question1: ... question2: ... | not_duplicate / duplicate | F1, accuracy |
| glue_stsb | stsb sentence1: ... sentence2: ... | "3.2" (0.2 steps) | Pearson, Spearman |
| glue_mnli | mnli hypothesis: ... premise: ... | entailment / neutral / contradiction | accuracy |
| glue_mnli_mismatched | as glue_mnli; validation/test = the mismatched sets; no train split | | accuracy |
| glue_qnli | qnli question: ... sentence: ... | entailment / not_entailment | accuracy |
| glue_rte | rte sentence1: ... sentence2: ... | entailment / not_entailment | accuracy |
| glue_wnli | wnli sentence1: ... sentence2: ... | not_entailment / entailment | accuracy |
| glue_ax | cast as MNLI (test split only) | as MNLI | MCC (GLUE's R3) |

``glue_mnli``'s validation/test splits are the matched sets. T5 never trains on WNLI and leaves it
out of the GLUE average (``t2t.data.metrics.GLUE_AVERAGE``); it is registered for completeness.
An output that is not a label counts as wrong. The vocabulary: see ``tasks.common``.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import seqio

from t2t.data import formats, metrics, postprocessors
from tasks import common

GLUE_VERSION = "2.0.0"
STANDARD_SPLITS = {"train": "train", "validation": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task's text-to-text form.

    Attributes:
      name: the task name, ``glue_<name>`` once registered.
      tfds_config: the TFDS ``glue`` builder config holding its data.
      prefix: the task prefix in the input text.
      fields: ``(name written in the input, TFDS feature key)``, in input order.
      label_names: strings for the integer labels; ``None`` for STS-B (a score).
      metric_fns: seqio metric functions.
      splits: seqio split name -> TFDS split name.
    """
    name: str
    tfds_config: str
    prefix: str
    fields: Sequence[tuple[str, str]]
    label_names: Sequence[str] | None
    metric_fns: Sequence[Callable[..., Mapping[str, float]]]
    splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(STANDARD_SPLITS))


_TWO_SENTENCES = (("sentence1", "sentence1"), ("sentence2", "sentence2"))
_MNLI_FIELDS = (("hypothesis", "hypothesis"), ("premise", "premise"))
_MNLI_LABELS = ("entailment", "neutral", "contradiction")

GLUE_TASKS: tuple[GlueTask, ...] = (
    GlueTask("cola", "cola", "cola", (("sentence", "sentence"),), ("unacceptable", "acceptable"),
             (metrics.matthews_corrcoef,)),
    GlueTask("sst2", "sst2", "sst2", (("sentence", "sentence"),), ("negative", "positive"),
             (metrics.accuracy,)),
    GlueTask("mrpc", "mrpc", "mrpc", _TWO_SENTENCES, ("not_equivalent", "equivalent"),
             (functools.partial(metrics.f1, positive_label="equivalent"), metrics.accuracy)),
    GlueTask("qqp", "qqp", "qqp", (("question1", "question1"), ("question2", "question2")),
             ("not_duplicate", "duplicate"),
             (functools.partial(metrics.f1, positive_label="duplicate"), metrics.accuracy)),
    GlueTask("stsb", "stsb", "stsb", _TWO_SENTENCES, None,
             (metrics.pearson_corrcoef, metrics.spearman_corrcoef)),
    GlueTask("mnli", "mnli", "mnli", _MNLI_FIELDS, _MNLI_LABELS, (metrics.accuracy,),
             splits={"train": "train", "validation": "validation_matched", "test": "test_matched",
                     "validation_mismatched": "validation_mismatched",
                     "test_mismatched": "test_mismatched"}),
    GlueTask("mnli_mismatched", "mnli", "mnli", _MNLI_FIELDS, _MNLI_LABELS, (metrics.accuracy,),
             splits={"validation": "validation_mismatched", "test": "test_mismatched"}),
    GlueTask("qnli", "qnli", "qnli", (("question", "question"), ("sentence", "sentence")),
             ("entailment", "not_entailment"), (metrics.accuracy,)),
    GlueTask("rte", "rte", "rte", _TWO_SENTENCES, ("entailment", "not_entailment"), (metrics.accuracy,)),
    GlueTask("wnli", "wnli", "wnli", _TWO_SENTENCES, ("not_entailment", "entailment"), (metrics.accuracy,)),
    GlueTask("ax", "ax", "mnli", _MNLI_FIELDS, _MNLI_LABELS, (metrics.matthews_corrcoef,),
             splits={"test": "test"}),
)

# The tasks T5 trains on (WNLI never; AX and MNLI-mismatched have no training split).
GLUE_TRAINING_TASK_NAMES: tuple[str, ...] = tuple(
    f"glue_{name}" for name in ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte"))
# The tasks evaluated for the GLUE average.
GLUE_EVAL_TASK_NAMES: tuple[str, ...] = GLUE_TRAINING_TASK_NAMES + ("glue_mnli_mismatched",)


def _preprocessor(spec: GlueTask) -> Callable[..., object]:
    if spec.label_names is None:
        return formats.stsb
    return functools.partial(formats.classification, prefix=spec.prefix, fields=spec.fields,
                             label_names=spec.label_names)


def _postprocessor(spec: GlueTask) -> Callable[..., object]:
    if spec.label_names is None:
        return postprocessors.stsb
    return functools.partial(postprocessors.classification, labels=tuple(spec.label_names))


def register(vocabulary: seqio.Vocabulary | None = None) -> list[seqio.Task]:
    """Registers every GLUE task (replacing earlier registrations); returns them.

    Args:
      vocabulary: a fixed vocabulary; default the gin-chosen one (``tasks.common``).
    """
    return [
        common.register_task(
            f"glue_{spec.name}",
            source=seqio.TfdsDataSource(f"glue/{spec.tfds_config}:{GLUE_VERSION}", splits=dict(spec.splits)),
            preprocessors=[_preprocessor(spec)],
            postprocess_fn=_postprocessor(spec),
            metric_fns=spec.metric_fns,
            vocabulary=vocabulary,
        )
        for spec in GLUE_TASKS
    ]


register()
