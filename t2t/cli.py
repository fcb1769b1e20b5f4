"""Command-line plumbing shared by `t2t.train`, `t2t.eval` and `t2t.infer`.

Flags: `--gin_file` (repeatable), `--gin_bindings` (repeatable), `--gin.X=V` shorthand,
`--gin_search_path` (extra directories for gin files and includes). Multi-host runs (see
docs/scaling.md): `--coordinator_address`, `--num_processes`, `--process_id`, or the gin
bindings of `t2t.training.distributed.initialize`; nothing to set on TPU pods, SLURM or Open MPI.
`--compilation_cache_dir DIR`: JAX's persistent compilation cache (t2t/training/compilation_cache.py).
`--host_malloc {auto,retain,system}`: glibc malloc settings that spare XLA:CPU's steps their page
faults, and XLA:CPU's memory-minimising schedule (t2t/training/host_memory.py); `auto` applies
them when the backend is the CPU.
Errors that t2t raises for bad input (a gin macro left unset, an unknown task, an incompatible
checkpoint, a missing file) are printed as one clear message instead of a traceback; set
T2T_TRACEBACK=1 to see it.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Sequence

from absl import app, flags, logging

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin files to parse, in order.")
flags.DEFINE_multi_string("gin_bindings", [], "Individual gin bindings, e.g. 'TRAIN_STEPS = 10'.")
flags.DEFINE_multi_string("gin_search_path", [], "Extra directories to search for gin files.")
flags.DEFINE_string("coordinator_address", None,
                    "Multi-host: host:port of process 0's coordinator (jax.distributed).")
flags.DEFINE_integer("num_processes", None, "Multi-host: how many processes the run has.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index, 0 .. N - 1.")
flags.DEFINE_string("compilation_cache_dir", None,
                    "A private directory for JAX's persistent compilation cache: a later run of the "
                    "same programs reads XLA's executables from it instead of compiling "
                    "(t2t/training/compilation_cache.py). Child runs inherit it.")

flags.DEFINE_enum("host_malloc", "auto", ["auto", "retain", "system"],
                  "t2t.train/eval/infer: 'auto' keeps freed host memory mapped (one glibc arena, no "
                  "mmap chunks, no trimming) when the backend is the CPU, so XLA:CPU's per-step "
                  "buffers are not faulted in again every step, and asks XLA:CPU to schedule "
                  "programs for least memory; 'retain' always, 'system' never "
                  "(t2t/training/host_memory.py).")

DISTRIBUTED_FLAGS = ("coordinator_address", "num_processes", "process_id")

# Set when `run` has parsed gin already (to start jax.distributed before main); the entry point's
# own `parse_flags_into_gin()` call then has nothing to do.
_parsed_by_run = False


def parse_flags_into_gin() -> None:
  global _parsed_by_run
  if _parsed_by_run:
    _parsed_by_run = False
    return
  from t2t import config
  config.parse_gin(FLAGS.gin_file, FLAGS.gin_bindings,
                   extra_search_paths=FLAGS.gin_search_path)


def start_distributed() -> bool:
  """Joins a multi-host run (flags override gin's `initialize.*`); a no-op for one process.

  A joined run's CPU collectives (Gloo) print connection lines on standard output: with the
  libraries quiet, they are filtered out too (`t2t.logs.quiet_collectives`)."""
  from t2t import logs
  from t2t.training import distributed
  overrides = {name: getattr(FLAGS, name) for name in DISTRIBUTED_FLAGS
               if getattr(FLAGS, name) is not None}
  joined = distributed.initialize(**overrides)
  if joined:
    logs.quiet_collectives()
  return joined


# Markers of the checks t2t runs inside tf.data pipelines (tf.debugging assertions): the
# InvalidArgumentError they raise is bad data, not a bug, so it gets one line too.
DATA_CHECK_MARKERS = ("ClassifierModel:", "more sentinels than the vocabulary's extra_ids",
                      "formats: label")


def data_check_message(e: BaseException) -> str | None:
  """The readable part of a failed t2t data check raised by TensorFlow, else None."""
  text = str(e)
  if type(e).__name__ != "InvalidArgumentError" or not any(m in text for m in DATA_CHECK_MARKERS):
    return None
  first = text.split("\n", 1)[0].split("assertion failed: ", 1)[-1].replace("\\'", "'")
  return " ".join(part.strip("[] ") for part in first.split("] [")).strip()


def user_message(e: BaseException) -> str:
  """`e`'s message without the "In call to configurable 'train' (...)" lines gin appends to an
  error raised inside a configurable: the message itself names the culprit."""
  return "\n".join(line for line in str(e).split("\n")
                   if not line.startswith("  In call to configurable '")).rstrip()


# Entry points that may run on several hosts: gin is parsed and jax.distributed started before
# their main (which then finds gin parsed).
DISTRIBUTED_ENTRY_POINTS = ("t2t.train", "t2t.eval", "t2t.infer")


def run(main: Callable[[Sequence[str]], None], distributed: bool = False) -> None:
  """absl's app.run with `--gin.X=V` rewriting and readable errors for bad input.

  With `distributed`, gin and flags are parsed first and `start_distributed()` joins the other
  processes of a multi-host run before `main` (whose `parse_flags_into_gin()` is then a no-op).
  """
  from t2t import config
  argv = config.rewrite_gin_args(sys.argv)

  def guarded(args):
    if not any(a.startswith(("--verbosity", "-v")) for a in argv):
      logging.set_verbosity(logging.WARNING)  # library chatter off; progress is printed
    try:
      if distributed:  # t2t.train/eval/infer, before JAX starts its backend (host_memory.py)
        from t2t.training import host_memory
        host_memory.configure(FLAGS.host_malloc)
      if FLAGS.compilation_cache_dir:
        from t2t.training import compilation_cache
        compilation_cache.enable(FLAGS.compilation_cache_dir)
      if distributed:
        global _parsed_by_run
        # Gin and flags first, then jax.distributed, before the entry point touches a device.
        parse_flags_into_gin()
        _parsed_by_run = True
        start_distributed()
      main(args)
    except (ValueError, FileNotFoundError, FloatingPointError, RuntimeError, ImportError) as e:
      from t2t import errors  # a RuntimeError from XLA (e.g. out of memory) is no user error
      if os.environ.get("T2T_TRACEBACK") or not errors.is_user_error(e):
        raise
      print(f"\nerror: {user_message(e)}\n(set T2T_TRACEBACK=1 for the full traceback)",
            file=sys.stderr)
      sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C (t2t.train's loop handles it itself: it saves first)
      if os.environ.get("T2T_TRACEBACK"):
        raise
      print("\ninterrupted (Ctrl-C). Set T2T_TRACEBACK=1 for where it stopped.", file=sys.stderr)
      sys.exit(130)  # what a shell reports for SIGINT
    except Exception as e:  # pylint: disable=broad-except
      message = data_check_message(e)
      if message is None or os.environ.get("T2T_TRACEBACK"):
        raise
      print(f"\nerror: {message}\n(set T2T_TRACEBACK=1 for the full traceback)", file=sys.stderr)
      sys.exit(1)

  app.run(guarded, argv=argv)


def run_module(name: str) -> None:
  """Imports entry-point module `name` and runs its `main` (then exits).

  The imports run with Python's cyclic garbage collector paused, and what they leave is frozen
  out of its later collections (t2t/training/garbage_collection.py): a faster start and trace.
  """
  import importlib
  from t2t import logs
  from t2t.training import garbage_collection
  logs.quiet()  # before the entry point imports TensorFlow
  with garbage_collection.imports_without_collection():
    module = importlib.import_module(name)
  run(module.main, distributed=name in DISTRIBUTED_ENTRY_POINTS)
  sys.exit(0)
