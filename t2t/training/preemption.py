"""Preemption: SIGTERM/SIGINT stop training cleanly after the step in flight, at one step on all hosts.

A preemptible VM is told to go with SIGTERM (and a user presses Ctrl-C, SIGINT). Killing the
process there would lose everything since the last checkpoint; instead the handler only sets a
flag, and `Preemption.hook` (a training-loop hook, run after each step) returns
`Control(stop=PREEMPTED)`, so train.py saves a checkpoint at that step and returns normally.

With several processes, each host may get the signal at a different step; they must stop at the
same one (the checkpoint is saved collectively). The flags are combined with an allgather every
`sync_every` steps (cheap: one int per host), and every host stops when any host has one set.
One process checks its own flag after every step.
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Mapping

import numpy as np

from t2t.training import distributed
from t2t.training import trainer as trainer_lib

PREEMPTED = "preempted"
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
  """A flag set by SIGTERM/SIGINT and the hook that stops the loop when it is set."""

  def __init__(self, sync_every: int = 10):
    self.sync_every = max(int(sync_every), 1)
    self.requested = False
    self._previous: dict[int, Any] = {}

  def install(self) -> None:
    """Installs the handlers (main thread only; elsewhere signals cannot be caught)."""
    if threading.current_thread() is not threading.main_thread():
      return
    for sig in SIGNALS:
      self._previous[sig] = signal.signal(sig, self._handle)

  def uninstall(self) -> None:
    """Puts back the handlers that were there before `install`."""
    for sig, previous in self._previous.items():
      signal.signal(sig, previous)
    self._previous.clear()

  def _handle(self, signum: int, frame: Any) -> None:
    del frame
    if self.requested and signum == signal.SIGINT:  # a second Ctrl-C: stop at once
      raise KeyboardInterrupt
    self.requested = True

  def should_stop(self, step: int) -> bool:
    """Whether to stop after `step`; the same answer on every host."""
    if distributed.process_count() == 1:
      return self.requested
    if step % self.sync_every:
      return False
    from jax.experimental import multihost_utils
    flags = multihost_utils.process_allgather(np.asarray(int(self.requested), np.int32))
    return bool(np.any(flags))

  def hook(self, step: int, state: trainer_lib.TrainState,
           metrics: Mapping[str, float] | None, batch: Any) -> trainer_lib.Control | None:
    """The loop hook: Control(stop=PREEMPTED) once a signal has been received (on any host)."""
    del state, metrics, batch
    return trainer_lib.Control(stop=PREEMPTED) if self.should_stop(step) else None
