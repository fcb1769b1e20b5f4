"""Paths that may be URLs: MODEL_DIR, CHECKPOINT_PATH, EVAL_OUTPUT_DIR, INFER_OUTPUT_DIR, ...

Every file operation on a user-given path goes through `etils.epath`, which serves local paths
and remote ones (`gs://`, `s3://`, ... through its tf.io.gfile or fsspec backends) alike.
`resolve` is the one place a path is normalised: a URL stays as given (never `abspath`-ed into
`./gs:/bucket`), a `file://` URL becomes its local path (epath itself does not accept `file://`),
and a relative local path becomes absolute (so that a run's files do not depend on the current
directory of whoever reads them later).
"""
from __future__ import annotations

import os
import re

from etils import epath

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str | os.PathLike) -> bool:
  """True for 'scheme://...' (gs://, s3://, file://), False for a local path."""
  return bool(_SCHEME.match(os.fspath(path)))


def resolve(path: str | os.PathLike) -> epath.Path:
  """`path` as an epath.Path: URLs as given, `file://` and local paths absolute and local."""
  text = os.fspath(path)
  if text.startswith("file://"):
    text = text[len("file://"):] or "/"
  if is_url(text):
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))


def to_str(path: str | os.PathLike) -> str:
  """`resolve(path)` as text, e.g. for orbax (which takes local paths and gs:// URLs) or logs."""
  return os.fspath(resolve(path))
