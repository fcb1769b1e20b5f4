"""SuperGLUE as text-to-text seqio tasks, from TFDS ``super_glue`` (T5 paper §2.3-2.4, App. D.9-D.13).

Registered on import (``import tasks.superglue``), named ``super_glue_<task>``:

| task | input | targets | metrics |
|---|---|---|---|
| boolq | boolq passage: ... question: ... | False / True | accuracy |
| cb | cb hypothesis: ... premise: ... | entailment / contradiction / neutral | macro F1, accuracy |
| copa | copa choice1: ... choice2: ... premise: ... question: cause/effect | False / True (True: choice2) | accuracy |
| multirc | multirc question: ... answer: ... paragraph: ... | False / True | F1a, EM per question |
| record | record query: ... entities: a, b passage: ... | an entity | max-over-answers EM, F1 |
| rte | rte hypothesis: ... premise: ... | entailment / not_entailment | accuracy |
| wic | wic sentence1: ... sentence2: ... word: ... | False / True | accuracy |
| wsc | wsc: text with the *pronoun* marked | the candidate noun phrase | accuracy of the subset rule |
| axb | rte sentence1: ... sentence2: ... (test only) | as RTE | MCC |
| axg | rte hypothesis: ... premise: ... (test only) | as RTE | accuracy |

Training splits differ from evaluation splits in two tasks, as in T5: WSC trains only on examples
whose candidate is the referent (the target is that noun phrase) and evaluates on all, a prediction
counting as "True" when the subset rule matches the candidate; ReCoRD trains on one example per gold
answer and evaluates each query once against all its answers.
TFDS's WiC has no part-of-speech field, so the paper's "pos: N" is absent. DPR is not in TFDS.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import seqio
import tensorflow as tf

from t2t.data import formats, metrics, postprocessors
from tasks import common

SUPER_GLUE_VERSION = "1.0.2"
STANDARD_SPLITS = {"train": "train", "validation": "validation", "test": "test"}
BOOLEAN_LABELS = ("False", "True")
RTE_LABELS = ("entailment", "not_entailment")
CB_LABELS = ("entailment", "contradiction", "neutral")


@dataclasses.dataclass(frozen=True)
class SuperGlueTask:
    """One SuperGLUE task: TFDS config, formatter, postprocessor, metrics, splits.

    Attributes:
      name: ``super_glue_<name>`` once registered.
      tfds_config: the TFDS ``super_glue`` builder config.
      preprocessor: the formatter (a seqio preprocessor).
      postprocess_fn: decoded text -> what the metrics compare.
      metric_fns: seqio metric functions.
      splits: seqio split name -> TFDS split name.
      split_transforms: raw-example transforms for some splits (see ``common.SplitTransformTfdsSource``).
    """
    name: str
    tfds_config: str
    preprocessor: Callable[..., tf.data.Dataset]
    postprocess_fn: Callable[..., object]
    metric_fns: Sequence[Callable[..., Mapping[str, float]]]
    splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(STANDARD_SPLITS))
    split_transforms: Mapping[str, Callable[[tf.data.Dataset], tf.data.Dataset]] = dataclasses.field(
        default_factory=dict)


def _classification(prefix: str, keys: Sequence[str], labels: Sequence[str]) -> Callable[..., tf.data.Dataset]:
    return functools.partial(formats.classification, prefix=prefix, fields=[(k, k) for k in keys],
                             label_names=labels)


def _labels(labels: Sequence[str]) -> Callable[..., str]:
    return functools.partial(postprocessors.classification, labels=tuple(labels))


def keep_referent_examples(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """WSC training: keeps the examples whose candidate (span1) is the pronoun's referent."""
    return dataset.filter(lambda x: tf.equal(x["label"], 1))


SUPER_GLUE_TASKS: tuple[SuperGlueTask, ...] = (
    SuperGlueTask("boolq", "boolq", _classification("boolq", ("passage", "question"), BOOLEAN_LABELS),
                  _labels(BOOLEAN_LABELS), (metrics.accuracy,)),
    SuperGlueTask("cb", "cb", _classification("cb", ("hypothesis", "premise"), CB_LABELS), _labels(CB_LABELS),
                  (functools.partial(metrics.macro_f1, labels=CB_LABELS), metrics.accuracy)),
    SuperGlueTask("copa", "copa",
                  _classification("copa", ("choice1", "choice2", "premise", "question"), BOOLEAN_LABELS),
                  _labels(BOOLEAN_LABELS), (metrics.accuracy,)),
    SuperGlueTask("multirc", "multirc",
                  _classification("multirc", ("question", "answer", "paragraph"), BOOLEAN_LABELS),
                  postprocessors.multirc, (metrics.multirc,)),
    SuperGlueTask("record", "record", formats.record, postprocessors.record, (metrics.record,),
                  split_transforms={"train": formats.one_example_per_answer}),
    SuperGlueTask("rte", "rte", _classification("rte", ("hypothesis", "premise"), RTE_LABELS),
                  _labels(RTE_LABELS), (metrics.accuracy,)),
    SuperGlueTask("wic", "wic", _classification("wic", ("sentence1", "sentence2", "word"), BOOLEAN_LABELS),
                  _labels(BOOLEAN_LABELS), (metrics.accuracy,)),
    SuperGlueTask("wsc", "wsc.fixed", formats.wsc, postprocessors.wsc, (metrics.accuracy,),
                  split_transforms={"train": keep_referent_examples}),
    SuperGlueTask("axb", "axb", _classification("rte", ("sentence1", "sentence2"), RTE_LABELS),
                  _labels(RTE_LABELS), (metrics.matthews_corrcoef,), splits={"test": "test"}),
    SuperGlueTask("axg", "axg", _classification("rte", ("hypothesis", "premise"), RTE_LABELS),
                  _labels(RTE_LABELS), (metrics.accuracy,), splits={"test": "test"}),
)

# The tasks trained on and averaged into the SuperGLUE score (the diagnostics are test-only).
SUPER_GLUE_TRAINING_TASK_NAMES: tuple[str, ...] = tuple(
    f"super_glue_{name}" for name in ("boolq", "cb", "copa", "multirc", "record", "rte", "wic", "wsc"))


def _source(spec: SuperGlueTask) -> seqio.DataSource:
    name = f"super_glue/{spec.tfds_config}:{SUPER_GLUE_VERSION}"
    if spec.split_transforms:
        return common.SplitTransformTfdsSource(name, splits=spec.splits, split_transforms=spec.split_transforms)
    return seqio.TfdsDataSource(name, splits=dict(spec.splits))


def register(vocabulary: seqio.Vocabulary | None = None) -> list[seqio.Task]:
    """Registers every SuperGLUE task (replacing earlier registrations); returns them.

    Args:
      vocabulary: a fixed vocabulary; default the gin-chosen one (``tasks.common``).
    """
    return [
        common.register_task(f"super_glue_{spec.name}", source=_source(spec), preprocessors=[spec.preprocessor],
                             postprocess_fn=spec.postprocess_fn, metric_fns=spec.metric_fns,
                             vocabulary=vocabulary)
        for spec in SUPER_GLUE_TASKS
    ]


register()
