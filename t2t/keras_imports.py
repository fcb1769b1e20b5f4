"""Keep Keras's optional scikit-learn and matplotlib integrations out of a t2t process's start.

TensorFlow 2.21 imports Keras 3 eagerly (`tensorflow/__init__.py` loads `keras._tf_keras`), and
Keras, at import time, imports scikit-learn (for `keras.wrappers.SKLearnClassifier` & co.) and
`matplotlib.pyplot` (for `keras.visualization.plot_image_gallery`) whenever they are installed,
each inside `try: import ... except ImportError:`. t2t uses neither integration, but it depends
on both packages itself (scikit-learn for `t2t.probing`'s probes, matplotlib for the figures of
`t2t.reports`), so every `python -m t2t.*` paid ~1.4 s of its ~6 s import for them (scikit-learn
pulls in SciPy's statistics). Keras cannot be left out (tensorflow_text, which
seqio's vocabularies load, subclasses `tf.keras.layers.Layer`).

`hide_optional_imports_from_keras` puts a finder first on `sys.meta_path` that answers
"not installed" to an import of `sklearn` or `matplotlib` (or a submodule) issued from the
top level of a module in the `keras` package while that module is executing, i.e. during
Keras's own import. Keras then takes its documented fallback (the integrations report scikit-learn
or matplotlib missing if called). Every other import is untouched: t2t's own deferred imports
(`t2t.probing` fits scikit-learn probes, `t2t.reports` draws with matplotlib) load the real
packages, and so does a user's code. A process that imports scikit-learn or matplotlib before
t2t (or TensorFlow before t2t) keeps Keras's integrations, since the finder is consulted only
for modules not yet imported.

t2t/__init__.py installs the finder, so it is in place before anything imports TensorFlow in a
`python -m t2t.*` process or any program that imports t2t first. `T2T_KERAS_OPTIONAL_IMPORTS=keep`
in the environment leaves Keras's imports alone (`python -m benchmarks.process_start` times both).
"""
import importlib.abc
import os
import sys
from types import FrameType

HIDDEN_PACKAGES = ("sklearn", "matplotlib")
KEEP_ENV = "T2T_KERAS_OPTIONAL_IMPORTS"  # "keep": install nothing
_IMPORT_MACHINERY = ("importlib", "_frozen_importlib")


def _importing_frame(frame: FrameType | None) -> FrameType | None:
  """The first frame above `frame` that is not Python's import machinery: the import statement's."""
  while frame is not None and frame.f_globals.get("__name__", "").startswith(_IMPORT_MACHINERY):
    frame = frame.f_back
  return frame


def issued_by_keras_import(frame: FrameType | None) -> bool:
  """Whether the import statement that led to `frame` is at the top level of a `keras` module."""
  importer = _importing_frame(frame)
  if importer is None or importer.f_code.co_name != "<module>":
    return False
  name = importer.f_globals.get("__name__", "")
  return name == "keras" or name.startswith("keras.")


class _HideFromKerasImport(importlib.abc.MetaPathFinder):
  """Answers 'not installed' for HIDDEN_PACKAGES when Keras's module-level code asks for them."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname.partition(".")[0] not in HIDDEN_PACKAGES:
      return None
    if issued_by_keras_import(sys._getframe(1)):
      raise ModuleNotFoundError(
          f"t2t keeps Keras's optional {fullname!r} integration out of its import "
          "(t2t/keras_imports.py); import it before t2t to have it", name=fullname)
    return None  # The normal finders that follow on sys.meta_path load it.


def hide_optional_imports_from_keras() -> None:
  """Installs the finder once (idempotent), first on `sys.meta_path`, unless KEEP_ENV is 'keep'."""
  if os.environ.get(KEEP_ENV, "").lower() == "keep":
    return
  if not any(isinstance(f, _HideFromKerasImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _HideFromKerasImport())
