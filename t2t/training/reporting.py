"""What a run tells its user: TensorBoard events, a JSONL metrics file, and a progress bar.

On a terminal the bar shows step, loss, steps/s, tokens/s and ETA; when output is not a TTY
(CI, a log file) the same facts are printed as plain lines every `log_every` steps.

In a multi-host run only process 0 writes the files and prints (t2t.training.distributed); the
directory may be a URL (gs://...), written through etils.epath.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping, TextIO

from absl import logging

from t2t.training import distributed, paths, wandb_writer


class MetricsWriter:
  """Writes scalars to TensorBoard (`<dir>/<name>/`) and appends them to `<dir>/metrics.jsonl`
  (and to Weights & Biases with `wandb_logging.enabled = True`, t2t.training.wandb_writer).

  Only process 0 writes (elsewhere `write` is a no-op). A local file is appended to; a remote
  one (object stores cannot append) is rewritten whole on each `write`, its earlier lines kept.
  """

  def __init__(self, directory: str, name: str = "train", enable_tensorboard: bool = True):
    root = paths.resolve(directory)
    self.jsonl_path = os.fspath(root / "metrics.jsonl")
    self._name = name
    self._tb = None
    self._wandb = None
    self._enabled = distributed.is_writer()
    self._remote = paths.is_url(root)
    self._lines: list[str] = []
    if not self._enabled:
      return
    root.mkdir(parents=True, exist_ok=True)
    if self._remote and (root / "metrics.jsonl").exists():
      self._lines = (root / "metrics.jsonl").read_text().splitlines(keepends=True)
    if enable_tensorboard:
      from clu import metric_writers
      self._tb = metric_writers.SummaryWriter(os.fspath(root / name))
    self._wandb = wandb_writer.wandb_logging(os.fspath(root), name)  # None unless gin enables it

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    if not self._enabled:
      return
    scalars = {k: float(v) for k, v in scalars.items()}
    line = json.dumps({"step": int(step), "split": self._name, **scalars}) + "\n"
    if self._remote:
      self._lines.append(line)
      paths.resolve(self.jsonl_path).write_text("".join(self._lines))
    else:
      with open(self.jsonl_path, "a") as f:
        f.write(line)
    if self._tb is not None:
      self._tb.write_scalars(int(step), scalars)
    if self._wandb is not None:
      self._wandb.write(step, scalars)

  def close(self) -> None:
    if self._tb is not None:
      self._tb.flush()
      self._tb.close()
    if self._wandb is not None:
      self._wandb.close()


class Progress:
  """A progress bar for a loop of `total` steps starting at `start`."""

  def __init__(self, start: int, total: int, desc: str = "train", log_every: int = 10,
               stream: TextIO | None = None):
    self.start, self.total, self.log_every = start, total, max(1, log_every)
    self._stream = stream or sys.stderr
    self._quiet = not distributed.is_writer()  # one bar per run, on process 0
    self._t0 = time.perf_counter()
    self._tokens = 0
    self._bar = None
    if self._stream.isatty() and not self._quiet:
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
    elif (metrics is not None and not self._quiet
          and (step % self.log_every == 0 or step == self.total)):
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
  """A line the user should see whatever the log verbosity (resume, initialisation, eval).

  Printed by process 0 only (logged on every process)."""
  if distributed.is_writer():
    print(message, file=sys.stderr, flush=True)
  logging.info(message)
