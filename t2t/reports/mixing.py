"""Mixing sweep: a metric against a mixing-rate parameter -- the artificial limit K of
examples-proportional mixing or the temperature T of temperature-scaled mixing (T5 §3.5.2,
Table 11) -- mean ± std over seeds, one line per `--hue` value (e.g. the task evaluated).

  python -m t2t.reports.mixing --results=<root>/results.jsonl --x=MIXING_K \
    --out=docs/figures/mixing_k

The same figure as t2t.reports.learning_curve with the sweep's axis on x (log scale: K and T
are swept by factors); a point with no finished seed is 'n/a'.
"""
from __future__ import annotations

import sys
from typing import Sequence

from t2t.reports import common, learning_curve


def main(argv: Sequence[str]) -> int:
  return learning_curve.run(argv, None, __doc__, "{metric} vs mixing parameter {x}")


if __name__ == "__main__":
  sys.exit(common.cli(main, sys.argv[1:]))
