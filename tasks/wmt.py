"""WMT translation as text-to-text seqio tasks (T5 paper §2.3, App. D.16-D.18). Metric: SacreBLEU
("exp" smoothing, "intl" tokenisation).

| task | input | data (TFDS) |
|---|---|---|
| wmt_t2t_ende | translate English to German: ... | wmt_t2t_translate/de-en (Vaswani et al.'s data); validation newstest2013, test newstest2014 |
| wmt15_enfr | translate English to French: ... | wmt15_translate/fr-en (2015 training data, test newstest2015 + newsdiscusstest2015); validation = newstest2014 (wmt14_translate's test split) |
| wmt16_enro | translate English to Romanian: ... | wmt16_translate/ro-en; validation newsdev2016, test newstest2016 |

Registered on import (``import tasks.wmt``); the vocabulary: see ``tasks.common``.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

import seqio

from t2t.data import formats, metrics, postprocessors
from tasks import common

WMT_SPLITS: Mapping[str, Mapping[str, seqio.TfdsSplit]] = {
    "wmt_t2t_ende": {
        "train": seqio.TfdsSplit("wmt_t2t_translate/de-en:1.0.0", "train"),
        "validation": seqio.TfdsSplit("wmt_t2t_translate/de-en:1.0.0", "validation"),
        "test": seqio.TfdsSplit("wmt_t2t_translate/de-en:1.0.0", "test"),
    },
    "wmt15_enfr": {
        "train": seqio.TfdsSplit("wmt15_translate/fr-en:1.0.0", "train"),
        "validation": seqio.TfdsSplit("wmt14_translate/fr-en:1.0.0", "test"),  # newstest2014
        "test": seqio.TfdsSplit("wmt15_translate/fr-en:1.0.0", "test"),
    },
    "wmt16_enro": {
        "train": seqio.TfdsSplit("wmt16_translate/ro-en:1.0.0", "train"),
        "validation": seqio.TfdsSplit("wmt16_translate/ro-en:1.0.0", "validation"),
        "test": seqio.TfdsSplit("wmt16_translate/ro-en:1.0.0", "test"),
    },
}
TARGET_LANGUAGE = {"wmt_t2t_ende": "de", "wmt15_enfr": "fr", "wmt16_enro": "ro"}
WMT_TASK_NAMES: tuple[str, ...] = tuple(WMT_SPLITS)


def register(vocabulary: seqio.Vocabulary | None = None) -> list[seqio.Task]:
    """Registers the three English-to-X tasks (replacing earlier registrations); returns them."""
    return [
        common.register_task(
            name,
            source=seqio.TfdsDataSource(splits=dict(splits)),
            preprocessors=[functools.partial(formats.translate, source_language="en",
                                             target_language=TARGET_LANGUAGE[name])],
            postprocess_fn=postprocessors.strip,
            metric_fns=[metrics.bleu],
            vocabulary=vocabulary,
        )
        for name, splits in WMT_SPLITS.items()
    ]


register()
