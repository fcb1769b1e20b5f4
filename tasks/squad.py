"""SQuAD v1.1 as a text-to-text seqio task, from TFDS ``squad/v1.1`` (T5 paper App. D.15).

``squad``: "question: <question> context: <context>" -> the first gold answer. Evaluation compares
the output with every gold answer (SQuAD's normalisation; max EM and token F1 over answers).
Registered on import (``import tasks.squad``); the vocabulary: see ``tasks.common``.
"""
from __future__ import annotations

import seqio

from t2t.data import formats, metrics, postprocessors
from tasks import common

SQUAD_TFDS_NAME = "squad/v1.1:3.0.0"


def register(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """Registers ``squad`` (replacing an earlier registration) and returns it."""
    return common.register_task(
        "squad",
        source=seqio.TfdsDataSource(SQUAD_TFDS_NAME, splits={"train": "train", "validation": "validation"}),
        preprocessors=[formats.squad],
        postprocess_fn=postprocessors.squad,
        metric_fns=[metrics.squad],
        vocabulary=vocabulary,
    )


register()
