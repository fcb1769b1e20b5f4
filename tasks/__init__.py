"""t2t's task library: importing this package registers its seqio tasks and mixtures.

The TFDS-backed tasks read nothing (and touch no vocabulary) until a dataset is requested.
"""
from tasks import bbc  # noqa: F401  (bbc_span_corruption, bbc_topic: offline)
from tasks import glue, superglue, squad, cnn_dailymail, wmt, c4, mixtures  # noqa: F401
