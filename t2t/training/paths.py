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
import uuid

from etils import epath

from t2t import errors

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


class UnwritableDirError(errors.UserError):
  """A directory t2t must write into (MODEL_DIR, an output dir) cannot be created or written."""


def check_writable(path: str | os.PathLike, name: str = "MODEL_DIR") -> None:
  """Creates directory `path` if needed and proves it writable, before any expensive work.

  Writes and removes one empty probe file with a name unique to this process (nothing already
  in the directory is touched). Process 0 checks (it is the one that writes shared files) and
  tells the others, so in a multi-host run every process raises, none waits on a dead peer; call
  it on every process. Works for local paths and URLs alike (through epath). Raises
  UnwritableDirError naming `name` (the gin macro), the path and the OS reason: a path that is
  an existing file, a parent that is read-only or not a directory, a bucket that refuses writes.
  """
  from t2t.training import distributed  # pylint: disable=g-import-not-at-top  (imports JAX)
  error = None
  if distributed.is_writer():
    try:
      _probe(path, name)
    except UnwritableDirError as e:
      error = e
  message = distributed.broadcast_json(None if error is None else str(error))
  if error is not None:
    raise error
  if message is not None:
    raise UnwritableDirError(message)


def _probe(path: str | os.PathLike, name: str) -> None:
  target = resolve(path)
  try:
    if target.exists() and not target.is_dir():
      raise UnwritableDirError(
          f"{name} '{os.fspath(path)}' is an existing file, not a directory. Choose another "
          f"{name} (or move the file away).")
    target.mkdir(parents=True, exist_ok=True)
    probe = target / f".t2t_write_check_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    probe.write_text("")
    probe.unlink()
  except OSError as e:
    reason = e.strerror or str(e) or type(e).__name__
    culprit = f": {e.filename}" if getattr(e, "filename", None) else ""
    raise UnwritableDirError(
        f"{name} '{os.fspath(path)}' cannot be written ({reason}{culprit}). Choose a {name} "
        "you may write to, or fix its permissions.") from e
