"""C4 pre-training tasks, one per unsupervised objective (T5 paper §2.2, §3.3; TFDS ``c4/en``).

``c4_<objective>`` reads the cleaned English C4 (TFDS applies C4's cleaning; to clean a raw crawl
yourself, see ``t2t.data.c4_cleaning.c4_clean``), tokenizes the page text into ``targets`` and
applies the objective from ``t2t.data.objectives``:

    c4_span_corruption (T5's default), c4_iid_noise_replace_spans, c4_iid_noise_drop_tokens,
    c4_bert_style, c4_mass_style, c4_deshuffling, c4_prefix_lm, c4_full_lm

Objectives are gin-configurable (e.g. ``span_corruption.noise_density = 0.25``). No metrics.
Registered on import (``import tasks.c4``); the vocabulary: see ``tasks.common``.
"""
from __future__ import annotations

import functools

import seqio

from t2t.data import objectives, registry
from tasks import common

C4_TFDS_NAME = "c4/en:3.1.0"
OBJECTIVE_NAMES: tuple[str, ...] = registry.OBJECTIVE_NAMES
# T5's unsupervised task in multi-task mixtures.
C4_DEFAULT_TASK = "c4_span_corruption"


def available_objectives() -> tuple[str, ...]:
    """The objectives of ``OBJECTIVE_NAMES`` that ``t2t.data.objectives`` provides."""
    return tuple(name for name in OBJECTIVE_NAMES if callable(getattr(objectives, name, None)))


def register(vocabulary: seqio.Vocabulary | None = None) -> list[seqio.Task]:
    """Registers ``c4_<objective>`` for every available objective (replacing earlier ones)."""
    source = seqio.TfdsDataSource(C4_TFDS_NAME, splits={"train": "train", "validation": "validation"})
    return [
        common.register_task(
            f"c4_{name}",
            source=source,
            preprocessors=[functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"})],
            tokenized_preprocessors=[getattr(objectives, name)],
            metric_fns=[],
            vocabulary=vocabulary,
        )
        for name in available_objectives()
    ]


register()
