"""Tests for t2t.training.garbage_collection (each in a fresh Python: the collector is process-wide)."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Prints, as JSON, what the collector looked like inside and after a block of "imports" that
# leaves a long-lived object and a garbage cycle behind.
BLOCK = r"""
import gc, json, sys, weakref
from t2t.training import garbage_collection

class Node:
  pass

def run(raise_inside):
  seen = {}
  frozen_before = gc.get_freeze_count()
  try:
    with garbage_collection.imports_without_collection():
      seen["enabled_inside"] = gc.isenabled()
      cycle = Node(); cycle.self = cycle
      seen["cycle"] = weakref.ref(cycle)
      del cycle
      global kept
      kept = [Node() for _ in range(1000)]
      if raise_inside:
        raise KeyError("inside")
  except KeyError:
    seen["raised"] = True
  return dict(enabled_inside=seen["enabled_inside"], enabled_after=gc.isenabled(),
              cycle_freed=seen["cycle"]() is None, raised=seen.get("raised", False),
              newly_frozen=gc.get_freeze_count() - frozen_before, kept_tracked=len(kept))

if sys.argv[1] == "disabled":
  gc.disable()
print(json.dumps(run(sys.argv[1] == "raise")))
"""


def _block(mode: str) -> dict:
  out = subprocess.run([sys.executable, "-c", BLOCK, mode], cwd=ROOT, capture_output=True,
                       text=True, check=True, timeout=120)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_imports_run_without_collection_then_garbage_is_freed_and_the_rest_frozen():
  seen = _block("plain")
  assert seen["enabled_inside"] is False and seen["enabled_after"] is True
  assert seen["cycle_freed"]   # one collection before the freeze: garbage is not frozen
  assert seen["newly_frozen"] >= 1000   # at least the 1000 kept objects made in the block


def test_a_block_that_raises_freezes_nothing_and_turns_the_collector_back_on():
  seen = _block("raise")
  assert seen["raised"] and seen["enabled_after"] is True
  assert seen["newly_frozen"] == 0


def test_a_collector_that_was_off_stays_off():
  seen = _block("disabled")
  assert seen["enabled_inside"] is False and seen["enabled_after"] is False
  assert seen["newly_frozen"] >= 1000


def test_entry_points_import_with_the_collector_paused_and_run_with_it_frozen(tmp_path):
  """`cli.run_module`, which every `python -m t2t.*` entry point goes through."""
  (tmp_path / "gc_probe_entry.py").write_text(
      "import gc, json\n"
      "ENABLED_AT_IMPORT = gc.isenabled()\n"
      "def main(argv):\n"
      "  print(json.dumps(dict(enabled_at_import=ENABLED_AT_IMPORT, enabled=gc.isenabled(),\n"
      "                        frozen=gc.get_freeze_count())))\n")
  program = ("import sys; sys.path.insert(0, sys.argv[1]); sys.argv = ['gc_probe_entry']; "
             "from t2t import cli; cli.run_module('gc_probe_entry')")
  out = subprocess.run([sys.executable, "-c", program, str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  seen = json.loads(out.stdout.strip().splitlines()[-1])
  assert seen["enabled_at_import"] is False and seen["enabled"] is True
  assert seen["frozen"] > 0
