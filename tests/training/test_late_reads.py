"""The filter for tensorstore reads that finish after orbax closed its event loop."""
import asyncio
import gc
import sys
import warnings

import pytest
import tensorstore as ts

from t2t.training import late_reads


def _read_left_running_by_a_failed_restore():
  """What orbax's failed restore leaves: a coroutine awaiting a tensorstore read, ended early by
  another read's error, in a loop that is then closed. Returns the read's promise."""
  promise, future = ts.Promise.new()

  async def read():
    return await future

  async def restore():
    asyncio.ensure_future(read())
    await asyncio.sleep(0.01)  # the read is now awaiting tensorstore
    raise OSError("a damaged array file")

  loop = asyncio.new_event_loop()
  with pytest.raises(OSError):
    loop.run_until_complete(restore())
  loop.close()
  return promise


@pytest.fixture
def reported(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
  monkeypatch.setattr(late_reads, "_installed", None)
  return seen


def test_a_late_read_is_reported_without_the_filter(reported):
  _read_left_running_by_a_failed_restore().set_result(1)
  assert [str(e) for e in reported] == ["Event loop is closed"]


def test_the_filter_drops_the_late_read_and_nothing_else(reported):
  late_reads.ignore_late_read_completions()
  late_reads.ignore_late_read_completions()  # idempotent: one wrapper, not two
  _read_left_running_by_a_failed_restore().set_result(1)
  assert reported == []

  class Broken:
    def __del__(self):
      raise RuntimeError("Event loop is closed")  # same text, not a late read

  Broken()
  gc.collect()
  assert [str(e) for e in reported] == ["Event loop is closed"]


def test_only_call_soon_threadsafe_with_a_tensorstore_future_matches():
  loop = asyncio.new_event_loop()
  loop.close()
  _, future = ts.Promise.new()
  for args, expected in (((future,), True), ((object(),), False)):
    with pytest.raises(RuntimeError) as info:
      loop.call_soon_threadsafe(print, *args)
    assert late_reads.is_late_read_completion(info.value, info.value.__traceback__) is expected
  other = RuntimeError("something else")
  assert not late_reads.is_late_read_completion(other, None)


def test_orbax_metadata_reads_left_unstarted_are_not_warned_about_other_coroutines_are(reported):
  from etils import epath
  from orbax.checkpoint._src.metadata import array_metadata_store
  store = array_metadata_store.Store()

  async def other():
    return None

  def unawaited_warnings(make_coroutine, filtered):
    """The RuntimeWarnings Python gives when a coroutine from `make_coroutine` is collected."""
    with warnings.catch_warnings(record=True) as seen:
      warnings.simplefilter("always")
      if filtered:
        late_reads.ignore_late_read_completions()
      coroutine = make_coroutine()
      del coroutine
      gc.collect()
    return [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]

  def metadata_read():
    return store._get_array_metadatas(epath.Path("/nowhere"))

  assert unawaited_warnings(metadata_read, filtered=False) == [
      "coroutine 'Store._get_array_metadatas' was never awaited"]  # what the CI run showed
  assert unawaited_warnings(metadata_read, filtered=True) == []
  assert unawaited_warnings(other, filtered=True) == [
      f"coroutine '{other.__qualname__}' was never awaited"]


def _suspended_read(name):
  """A coroutine called `name` that handles its read's end as orbax's array read does (every
  BaseException, GeneratorExit included, re-raised as an Exception), suspended mid-read."""

  class Pending:
    def __await__(self):
      yield  # a read tensorstore has not finished

  async def read():
    try:
      await Pending()
    except BaseException as e:  # what orbax's _read_array_index_and_device_put does
      raise Exception("Encountered error while reading array index: (slice(0, 512, 1),)") from e

  read.__code__ = read.__code__.replace(co_name=name)
  coroutine = read()
  coroutine.send(None)
  return coroutine


def test_orbax_reads_closed_mid_read_are_dropped_others_are_not(reported):
  from orbax.checkpoint._src.serialization import serialization
  assert callable(getattr(serialization, late_reads.ORBAX_ARRAY_READ))  # still orbax's name
  # Without the filter: "Exception ignored in: <coroutine object ...>" and the spec.
  del_read = _suspended_read(late_reads.ORBAX_ARRAY_READ)
  del del_read
  gc.collect()
  assert [str(e)[:36] for e in reported] == ["Encountered error while reading arra"]
  reported.clear()
  late_reads.ignore_late_read_completions()
  for name in (late_reads.ORBAX_ARRAY_READ, "someone_elses_read"):
    coroutine = _suspended_read(name)
    del coroutine
    gc.collect()
  assert [type(e.__cause__) for e in reported] == [GeneratorExit]  # only the other one
  assert late_reads.is_closed_pending_read(Exception("x"), None) is False
