"""Python's cyclic garbage collector kept off the long-lived objects of TensorFlow, JAX and seqio.

Importing t2t's entry points leaves ~0.5 M objects that live as long as the process (modules,
functions, classes, registries). CPython's cyclic collector walks every tracked object of the
generations it collects, and its oldest generation holds all of these: while the imports run
(~0.8 M new objects) it walks a growing heap again and again, and later every full collection
walks the whole of it, which tracing a model -- millions of small short-lived objects -- sets
off often. Measured on the 2-core benchmark machine (benchmarks/EXPERIMENTS.md, "Tracing: einsums
straight to `dot_general`, ..."): `import t2t.train` 4.3-4.4 s with the collector on against
3.3-3.4 s with it off (plus ~0.35 s for one collection at the end), and the bf16 T5-small
gradient program traced and lowered in 1.46-1.53 s against 1.16-1.27 s with the imported objects
frozen.

`imports_without_collection` pauses the collector for a block of imports, then collects once and
moves everything still alive to the permanent generation (`gc.freeze`), which later collections
skip. Objects made later are collected as usual; the only cost is that a cycle among the frozen
objects that becomes garbage later is never freed, which for modules and their functions does not
happen in practice. `t2t.cli.run_module` (every `python -m t2t.*` entry point) and the
benchmarks use it.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


def freeze_long_lived() -> int:
  """Collects once, then moves every object still alive to the permanent generation.

  Returns how many objects are now frozen (`gc.get_freeze_count()`).
  """
  gc.collect()
  gc.freeze()
  return gc.get_freeze_count()


@contextlib.contextmanager
def imports_without_collection() -> Iterator[None]:
  """Pauses the cyclic collector for the block (meant for imports), then `freeze_long_lived()`.

  The collector is enabled again afterwards only if it was enabled before; if the block raises,
  nothing is frozen.
  """
  was_enabled = gc.isenabled()
  gc.disable()
  try:
    yield
    freeze_long_lived()
  finally:
    if was_enabled:
      gc.enable()
