"""t2t's task library: importing this package registers its seqio tasks and mixtures."""
from tasks import bbc  # noqa: F401  (registers bbc_span_corruption, bbc_topic)
