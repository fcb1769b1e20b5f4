"""Silences the reads a failed checkpoint restore leaves behind, and nothing else.

orbax runs a restore's reads in a fresh asyncio event loop (`asyncio_utils.run_sync`, orbax
0.12) and closes that loop as soon as the restore coroutine ends. When one array file is damaged,
its read fails and ends the coroutine while tensorstore is still reading the step's other files
on its own threads. Each of those reads, on finishing, hands its result to the closed loop
(`loop.call_soon_threadsafe` with the `tensorstore.Future`), which raises
`RuntimeError('Event loop is closed')` on tensorstore's thread; Python reports it through
`sys.unraisablehook` as "Exception ignored in: None" and a traceback, printed after t2t's own
one-line report of the damaged checkpoint. Nothing is lost (nobody waits for those results), but
a user is shown a traceback for an error that was already handled.

`ignore_late_read_completions()` wraps the current `sys.unraisablehook` so that exactly those
reports are dropped: a RuntimeError "Event loop is closed" raised in `call_soon_threadsafe` whose
arguments include a `tensorstore.Future`. Every other unraisable exception goes to the previous
hook unchanged. t2t installs it before each checkpoint read it makes (`checkpoints.reading`,
`Checkpointer.restore_latest_good`), not after a failure: the stragglers may finish between
orbax closing its loop and its error reaching t2t (seen under load), and at any moment
afterwards, so it stays installed. A read that succeeds leaves none, so nothing else changes.

The same failure can leave orbax's array-metadata reads created but never started (the loop was
closed before `asyncio.gather` ran them); when they are collected Python warns "coroutine
'Store._get_array_metadatas' was never awaited" (seen once, in a loaded CI run).
`ignore_late_read_completions()` also ignores exactly that RuntimeWarning; any other coroutine
left unawaited is still reported.

And the reads still waiting on tensorstore when the loop closes are coroutines suspended inside
orbax's `_read_array_index_and_device_put`; when they are collected Python closes them, and
orbax's `except BaseException` around the read turns the GeneratorExit into
`Exception('Encountered error while reading array index: ...')`, which Python reports as
"Exception ignored in: <coroutine object _read_array_index_and_device_put>" with the array's
whole TensorStore spec: 700 lines after a resume past a checkpoint whose large data file was
truncated (in about half of such runs). The hook drops exactly those: an exception raised from
GeneratorExit by a coroutine of that name.
"""
from __future__ import annotations

import sys
import types
import warnings
from typing import Any, Callable

_installed: Callable[[Any], object] | None = None
UNAWAITED_METADATA_READ = r"coroutine 'Store\._get_array_metadatas' was never awaited"
ORBAX_ARRAY_READ = "_read_array_index_and_device_put"  # orbax.checkpoint serialization (0.12)


def is_late_read_completion(exc_value: BaseException | None,
                            exc_traceback: types.TracebackType | None) -> bool:
  """Whether an unraisable exception is a tensorstore read delivered to a closed event loop."""
  if not isinstance(exc_value, RuntimeError) or str(exc_value) != "Event loop is closed":
    return False
  tb = exc_traceback
  while tb is not None:
    frame = tb.tb_frame
    if frame.f_code.co_name == "call_soon_threadsafe":
      args = frame.f_locals.get("args") or ()
      return any(type(a).__module__ == "tensorstore" and type(a).__name__ == "Future"
                 for a in args)
    tb = tb.tb_next
  return False


def is_closed_pending_read(exc_value: BaseException | None, obj: Any) -> bool:
  """Whether an unraisable exception is orbax's array read closed while it waited on tensorstore:
  raised from GeneratorExit by a coroutine named `ORBAX_ARRAY_READ`."""
  code = getattr(obj, "cr_code", None)
  return (isinstance(exc_value, Exception) and isinstance(exc_value.__cause__, GeneratorExit)
          and getattr(code, "co_name", None) == ORBAX_ARRAY_READ)


def ignore_late_read_completions() -> None:
  """Installs the filter in front of the current `sys.unraisablehook` (once; idempotent) and the
  warnings filter for orbax's unstarted metadata reads (again each call: a `catch_warnings` block,
  as pytest puts around each test, restores the filters it found)."""
  global _installed
  warnings.filterwarnings("ignore", message=UNAWAITED_METADATA_READ, category=RuntimeWarning)
  if _installed is not None and sys.unraisablehook is _installed:
    return
  previous = sys.unraisablehook

  def hook(unraisable: Any) -> None:
    if (is_late_read_completion(unraisable.exc_value, unraisable.exc_traceback)
        or is_closed_pending_read(unraisable.exc_value, unraisable.object)):
      return
    previous(unraisable)

  _installed = hook
  sys.unraisablehook = hook
