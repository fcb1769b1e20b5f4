"""What a run tells its user: TensorBoard events, a JSONL metrics file, and a progress bar.

On a terminal the bar shows step, loss, steps/s, tokens/s and ETA; when output is not a TTY
(CI, a log file) the same facts are printed as plain lines every `log_every` steps.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping, TextIO

from absl import logging


class MetricsWriter:
  """Writes scalars to TensorBoard (`<dir>/<name>/`) and appends them to `<dir>/metrics.jsonl`."""

  def __init__(self, directory: str, name: str = "train", enable_tensorboard: bool = True):
    os.makedirs(directory, exist_ok=True)
    self.jsonl_path = os.path.join(directory, "metrics.jsonl")
    self._name = name
    self._tb = None
    if enable_tensorboard:
      from clu import metric_writers
      self._tb = metric_writers.SummaryWriter(os.path.join(directory, name))

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    scalars = {k: float(v) for k, v in scalars.items()}
    with open(self.jsonl_path, "a") as f:
      f.write(json.dumps({"step": int(step), "split": self._name, **scalars}) + "\n")
    if self._tb is not None:
      self._tb.write_scalars(int(step), scalars)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.flush()
      self._tb.close()


class Progress:
  """A progress bar for a loop of `total` steps starting at `start`."""

  def __init__(self, start: int, total: int, desc: str = "train", log_every: int = 10,
               stream: TextIO | None = None):
    self.start, self.total, self.log_every = start, total, max(1, log_every)
    self._stream = stream or sys.stderr
    self._t0 = time.perf_counter()
    self._tokens = 0
    self._bar = None
    if self._stream.isatty():
      from tqdm import tqdm
      self._bar = tqdm(total=total, initial=start, desc=desc, unit="step", file=self._stream,
                       dynamic_ncols=True)

  def update(self, step: int, tokens: int, metrics: Mapping[str, Any] | None = None) -> dict:
    """Advances to `step` (1-based count of completed steps); returns the speed figures."""
    self._tokens += tokens
    elapsed = max(time.perf_counter() - self._t0, 1e-9)
    done = step - self.start
    rate = done / elapsed
    speed = {"steps_per_sec": rate, "tokens_per_sec": self._tokens / elapsed,
             "eta_sec": (self.total - step) / rate if rate > 0 else float("inf")}
    shown = {k: float(v) for k, v in (metrics or {}).items()}
    if self._bar is not None:
      self._bar.n = step
      if metrics is not None:
        self._bar.set_postfix(loss=f"{shown.get('loss', float('nan')):.4f}",
                              tok_s=f"{speed['tokens_per_sec']:.0f}", refresh=False)
      self._bar.refresh()
    elif metrics is not None and (step % self.log_every == 0 or step == self.total):
      line = (f"step {step}/{self.total}  loss {shown.get('loss', float('nan')):.4f}  "
              f"{speed['steps_per_sec']:.2f} steps/s  {speed['tokens_per_sec']:.0f} tokens/s  "
              f"ETA {_format_seconds(speed['eta_sec'])}")
      print(line, file=self._stream, flush=True)
      logging.info(line)
    return speed

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()


def _format_seconds(seconds: float) -> str:
  if seconds == float("inf"):
    return "?"
  seconds = int(seconds)
  return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def announce(message: str) -> None:
  """A line the user should see whatever the log verbosity (resume, initialisation, eval)."""
  print(message, file=sys.stderr, flush=True)
  logging.info(message)
