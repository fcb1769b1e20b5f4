"""The small JSON records t2t's runs write and read back (phase.json, study.json, grid.json,
an eval's metrics.json, a Hugging Face config.json): read with a named error, written whole.

A record half-written by a killed run, or truncated by an interrupted copy, used to surface as
json's bare "Expecting value: line 2 column 1"; `read_json` names the file and says what
rewrites it. `write_json` writes a temporary file and renames it, so a killed run leaves either
the old record or the new one, never half of one.
"""
from __future__ import annotations

import json
import os
from typing import Any


def read_json(path: str, advice: str, cause: str = "a half-written file?") -> Any:
  """The JSON value in file `path`.

  Raises:
    ValueError: the file is empty or not valid JSON; the message names it, where it breaks,
      the likely `cause` and `advice` (what rewrites it, e.g. "Delete it and run the same
      command again.").
  """
  with open(path) as f:
    text = f.read()
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    state = "is empty" if not text.strip() else (
        f"is not valid JSON ({e.msg}: line {e.lineno} column {e.colno})")
    raise ValueError(f"{path} {state}: {cause} {advice}") from None


def write_json(path: str, value: Any) -> None:
  """Writes `value` to `path` as indented JSON, atomically (a temporary file, then a rename)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(value, f, indent=2)
  os.replace(tmp, path)
