"""`python -m t2t.train` with one fault injected at a chosen moment (tests only).

    T2T_TEST_FAULT=<kind>:<step> python -m tests.support.faulty_train --gin_file=... [--gin.X=V]

kinds:
  after_step     SIGKILL right after training step <step> (its hooks, a save included, have run)
  before_commit  SIGKILL while checkpoint <step> is being written: every item (parameters,
                 optimizer state, meta) is in orbax's tmp directory, not yet renamed to its
                 final name -- the step is written but not finalised
  after_commit   SIGKILL right after orbax renamed checkpoint <step> to its final name, before
                 anything else happens (no later step, no clean-up of old input states)
  enospc         the write of checkpoint <step>'s meta fails with OSError(ENOSPC), as on a full
                 disk (in orbax's background thread, like a real write)

SIGKILL (`os.kill(os.getpid(), SIGKILL)`) cannot be caught: nothing of t2t runs after it. The
patches wrap orbax's and t2t's functions here, so no test hook lives in production code. It
also registers `kill_test_bbc_mix`, a mixture of two BBC tasks, for the mixture test.
"""
from __future__ import annotations

import errno
import os
import signal

KINDS = ("after_step", "before_commit", "after_commit", "enospc")
MIXTURE = "kill_test_bbc_mix"


def _kill() -> None:
  os.kill(os.getpid(), signal.SIGKILL)


def _install(kind: str, step: int) -> None:
  from orbax.checkpoint._src.handlers import json_checkpoint_handler
  from orbax.checkpoint._src.path import atomicity

  from t2t.training import checkpoints, preemption

  if kind == "after_step":
    original_hook = preemption.Preemption.hook

    def hook(self, s, state, metrics, batch):
      if s == step:
        _kill()
      return original_hook(self, s, state, metrics, batch)
    preemption.Preemption.hook = hook

  elif kind in ("before_commit", "after_commit"):
    original_finalize = atomicity.AtomicRenameTemporaryPath.finalize
    final_name = f"{checkpoints.STEP_PREFIX}_{step}"

    async def finalize(self, *args, **kwargs):
      is_step = self._final_path.name == final_name  # not one item's own tmp directory
      if is_step and kind == "before_commit":
        _kill()
      result = await original_finalize(self, *args, **kwargs)
      if is_step and kind == "after_commit":
        _kill()
      return result
    atomicity.AtomicRenameTemporaryPath.finalize = finalize

  elif kind == "enospc":
    original_save_fn = json_checkpoint_handler.JsonCheckpointHandler._save_fn

    async def save_fn(self, x, directory):
      if isinstance(x, dict) and x.get("step") == step:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(directory))
      return await original_save_fn(self, x, directory)
    json_checkpoint_handler.JsonCheckpointHandler._save_fn = save_fn

  else:
    raise ValueError(f"T2T_TEST_FAULT kind {kind!r} is none of {KINDS}.")


def _register_mixture() -> None:
  import importlib

  import seqio
  importlib.import_module("tasks.bbc")  # registers the BBC tasks
  if MIXTURE not in seqio.MixtureRegistry.names():
    seqio.MixtureRegistry.add(MIXTURE, [("bbc_span_corruption", 1.0), ("bbc_topic", 1.0)])


def main() -> None:
  fault = os.environ.get("T2T_TEST_FAULT", "")
  _register_mixture()
  if fault:
    kind, step = fault.split(":")
    _install(kind, int(step))
  from t2t import cli
  cli.run_module("t2t.train")


if __name__ == "__main__":
  main()
