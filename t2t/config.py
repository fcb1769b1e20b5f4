"""Gin configuration for the entry points: where gin files live, flags, REQUIRED macros.

t2t follows t5x's gin idiom: a run is `--gin_file=models/... --gin_file=runs/pretrain.gin` plus
bindings; `runs/*.gin` declare the macros a user must set as `X = %gin.REQUIRED`; `--gin.X=V` is
shorthand for the binding `X = V`; the operative config is written to `MODEL_DIR/config.gin`.

Gin files are found, in order, in the checkout's `gin/` directory, in the copy that
`pip install` places under `<prefix>/share/t2t/gin`, and relative to the current directory.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import sysconfig
import tokenize
from pathlib import Path
from typing import Iterable, Sequence

import gin

# Modules whose configurables every run may bind; importing them registers those with gin.
DEFAULT_GIN_IMPORTS = (
    "t2t.data.files",
    "t2t.data.limited",
    "t2t.data.mixing",
    "t2t.data.vocabularies",
    "t2t.models.api",
    "t2t.training.distributed",
    "t2t.training.optim",
    "t2t.training.partitioning",
    "tasks",
)

_INCLUDE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.MULTILINE)
_REQUIRED = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*=\s*%gin\.REQUIRED\b", re.MULTILINE)


class _HideGinSearchMisses(logging.Filter):
  """gin logs an ERROR for every search-path directory that lacks an included file; t2t
  searches several on purpose and reports a file that is nowhere itself."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Path not found:")


logging.getLogger().addFilter(_HideGinSearchMisses())


class GinConfigError(ValueError):
  """A gin file or binding is missing, malformed, or leaves a REQUIRED macro unset."""


def gin_search_paths() -> list[str]:
  """Directories searched for gin files: the checkout's gin/, the installed copy, cwd."""
  paths = []
  checkout = Path(__file__).resolve().parent.parent / "gin"
  if checkout.is_dir():
    paths.append(str(checkout))
  for prefix in (sysconfig.get_path("data"), sys.prefix):
    installed = Path(prefix) / "share" / "t2t" / "gin"
    if installed.is_dir() and str(installed) not in paths:
      paths.append(str(installed))
  paths.append(os.getcwd())
  return paths


def resolve_gin_file(name: str, search_paths: Sequence[str] | None = None) -> Path:
  """Finds a gin file by absolute path or relative to the search paths."""
  candidate = Path(name)
  if candidate.is_absolute():
    if candidate.is_file():
      return candidate
  else:
    for base in search_paths or gin_search_paths():
      if (Path(base) / name).is_file():
        return Path(base) / name
  raise GinConfigError(
      f"Gin file '{name}' not found. Searched: {', '.join(search_paths or gin_search_paths())}. "
      "Paths are relative to the current directory or to t2t's gin/ directory "
      "(e.g. --gin_file=models/t5_1_0/tiny.gin).")


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
  """Turns t5x's `--gin.X=V` shorthand into `--gin_bindings=X = V`.

  A bare value that gin could not parse (a path, a word) is quoted, so that
  `--gin.MODEL_DIR=/tmp/run` works as well as `--gin.MODEL_DIR="'/tmp/run'"`.
  """
  out = []
  for arg in argv:
    if arg.startswith("--gin.") and "=" in arg:
      key, value = arg[len("--gin."):].split("=", 1)
      out.append(f"--gin_bindings={key} = {quote_if_bare(value)}")
    else:
      out.append(arg)
  return out


def quote_if_bare(value: str) -> str:
  """`value` as gin text: a bare word or path becomes a quoted string, anything else stays."""
  stripped = value.strip()
  if not stripped or stripped[0] in "@%'\"[({-" or stripped in ("True", "False", "None"):
    return stripped
  if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", stripped):
    return stripped
  return repr(stripped)


@dataclasses.dataclass(frozen=True)
class RequiredMacro:
  name: str
  gin_file: str


def required_macros(gin_files: Iterable[str], search_paths: Sequence[str] | None = None
                   ) -> list[RequiredMacro]:
  """Lists `X = %gin.REQUIRED` declarations in the gin files and everything they include."""
  found: list[RequiredMacro] = []
  seen: set[Path] = set()

  def visit(name: str) -> None:
    path = resolve_gin_file(name, search_paths)
    if path in seen:
      return
    seen.add(path)
    text = path.read_text()
    for include in _INCLUDE.findall(text):
      visit(include)
    found.extend(RequiredMacro(m, str(path)) for m in _REQUIRED.findall(text))

  for name in gin_files:
    visit(name)
  return found


def _is_unset(macro: str) -> bool:
  try:
    return str(gin.query_parameter(f"%{macro}")) == "%gin.REQUIRED"
  except ValueError:
    return True


def _put_search_paths_first(search_paths: Sequence[str]) -> None:
  """Makes gin try t2t's search paths before its own '' (current directory) prefix.

  gin's resource reader takes the first component of a relative include as a Python package
  name; a directory such as `runs/` in the current directory then makes it crash on
  `include 'runs/pretrain.gin'`. Trying our directories first finds the file before that.
  (`gin.add_config_file_search_path` can only append, hence the direct edit.)
  """
  prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
  for path in reversed(list(search_paths)):
    if path in prefixes:
      prefixes.remove(path)
    prefixes.insert(0, path)


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str] = (),
              imports: Sequence[str] = DEFAULT_GIN_IMPORTS,
              extra_search_paths: Sequence[str] = ()) -> None:
  """Imports t2t's configurables, parses gin files and bindings, and checks REQUIRED macros.

  Raises:
    GinConfigError: a gin file is missing, a binding does not parse, or a macro declared
      `%gin.REQUIRED` was left unset (the message names the macro and the file declaring it).
  """
  import importlib
  for module in imports:
    importlib.import_module(module)
  search_paths = [*extra_search_paths, *gin_search_paths()]
  _put_search_paths_first(search_paths)
  resolved = [str(resolve_gin_file(f, search_paths)) for f in gin_files]
  try:
    gin.parse_config_files_and_bindings(resolved, list(gin_bindings), finalize_config=False)
  # OSError: an `include` of a file that is nowhere; TokenError: a binding such as `[1,` that
  # never closes (gin's tokenizer raises it before its own syntax check).
  except (ValueError, SyntaxError, ImportError, OSError, tokenize.TokenError) as e:
    from t2t import errors
    hint = errors.gin_suggestion(str(e))
    raise GinConfigError(f"Could not parse the gin configuration ({', '.join(gin_files)}; "
                         f"bindings {list(gin_bindings)}): {e}" + (f"\n{hint}" if hint else "")
                         ) from e
  unset = [m for m in required_macros(resolved, search_paths) if _is_unset(m.name)]
  if unset:
    lines = "\n".join(f"  {m.name}  (declared REQUIRED in {m.gin_file})" for m in unset)
    example = unset[0].name
    from t2t import errors
    hint = errors.macro_suggestion([m.name for m in unset], gin_bindings)
    raise GinConfigError(f"Required gin macros left unset{hint}:\n{lines}\n"
                         f"Set each one, e.g. --gin.{example}=... on the command line or "
                         f"'{example} = ...' in your gin file.")


def write_operative_config(directory: str, name: str = "config.gin") -> str:
  """Writes the operative gin config (what the run actually used) into `directory`.

  `directory` may be a URL (gs://...). In a multi-host run only process 0 writes; every process
  returns the path.
  """
  from t2t.training import distributed, paths
  path = paths.resolve(directory) / name
  if distributed.is_writer():
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(gin.operative_config_str())
  return os.fspath(path)
