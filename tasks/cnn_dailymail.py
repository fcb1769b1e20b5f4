"""CNN/Daily Mail summarisation as a text-to-text seqio task (T5 paper §2.3, App. D.14).

``cnn_dailymail``: "summarize: <article>" -> the highlights, from TFDS ``cnn_dailymail`` (the
non-anonymised version of See et al.). Metrics: ROUGE-1/2/L/Lsum F-measures.
Registered on import (``import tasks.cnn_dailymail``); the vocabulary: see ``tasks.common``.
"""
from __future__ import annotations

import seqio

from t2t.data import formats, metrics, postprocessors
from tasks import common

CNN_DAILYMAIL_TFDS_NAME = "cnn_dailymail:3.4.0"


def register(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """Registers ``cnn_dailymail`` (replacing an earlier registration) and returns it."""
    return common.register_task(
        "cnn_dailymail",
        source=seqio.TfdsDataSource(CNN_DAILYMAIL_TFDS_NAME,
                                    splits={"train": "train", "validation": "validation", "test": "test"}),
        preprocessors=[formats.summarize],
        postprocess_fn=postprocessors.strip,
        metric_fns=[metrics.rouge],
        vocabulary=vocabulary,
    )


register()
