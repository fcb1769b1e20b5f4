"""Packages that seqio imports at its top level but t2t never calls, loaded on first use instead.

`seqio/dataset_providers.py` imports PyGlove (`import pyglove as pg`) for one `isinstance` check
in `PyGloveTunableMixture.__init__`, a mixture class t2t does not use. Importing PyGlove executes
~120 modules of its own (its symbolic, hyper-parameter and evolution packages): ~0.24 s of the
~5.7 s that `import t2t.train` took (0.34 s under `-X importtime`), paid by every
`python -m t2t.*` and by each of the test suite's ~140 processes (benchmarks/README.md,
"process_start").

`defer_unused_imports` puts a finder first on `sys.meta_path` that answers an import of the
top-level `pyglove` package with the real package's spec, its loader wrapped in
`importlib.util.LazyLoader`: `sys.modules['pyglove']` is then a module object whose code runs
on the first attribute access (`pg.hyper`, `pyglove.__path__` for a submodule import, ...), with
the same result as an eager import. So seqio imports, and any code that does use PyGlove (seqio's
PyGlove mixture, a user's search space) gets the whole package, only later; a process that never
touches it never pays for it. Only the top-level package is deferred, and only when it has not
been imported before t2t.

t2t/__init__.py installs the finder before anything imports seqio. `T2T_DEFERRED_IMPORTS=off` in
the environment installs nothing (`python -m benchmarks.process_start --compare deferred_imports`
times both).
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

DEFERRED_PACKAGES = ("pyglove",)
OFF_ENV = "T2T_DEFERRED_IMPORTS"  # "off": install nothing


class _DeferOnFirstUse(importlib.abc.MetaPathFinder):
  """Finds DEFERRED_PACKAGES with the normal finders and wraps their loader in a LazyLoader."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname not in DEFERRED_PACKAGES:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(fullname, path, target)
      if spec is not None:
        break
    else:
      return None  # not installed: the import fails as it would without this finder
    if spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec  # a namespace package or an old-style loader: imported as usual
    spec.loader = importlib.util.LazyLoader(spec.loader)
    return spec


def defer_unused_imports() -> None:
  """Installs the finder once (idempotent), first on `sys.meta_path`, unless OFF_ENV is 'off'."""
  if os.environ.get(OFF_ENV, "").lower() == "off":
    return
  if not any(isinstance(f, _DeferOnFirstUse) for f in sys.meta_path):
    sys.meta_path.insert(0, _DeferOnFirstUse())
