"""An optional Weights & Biases writer, next to TensorBoard (off by default).

Same interface as `reporting.MetricsWriter`: `write(step, scalars)` and `close()`. `wandb` is
imported only when a writer is built, so t2t neither needs it installed nor touches the network
unless the user asks: the default mode is 'offline' (runs are kept under `<directory>/wandb`,
to upload later with `wandb sync`); 'online' is the user's explicit choice.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import gin

MODES = ("offline", "online", "disabled")


class WandbWriter:
  """Logs scalars of one run (split `name`, e.g. 'train') to a wandb run in `directory`.

  Args:
    directory: the run's directory (MODEL_DIR); wandb keeps its files in `<directory>/wandb`.
    name: the split; scalars are logged as '<name>/<scalar>' (e.g. 'train/loss').
    project: the wandb project.
    run_name: the wandb run's name (default: the directory's base name).
    mode: 'offline' (default, no network), 'online' or 'disabled'.
    config: the run's configuration to record (e.g. {'gin': operative config text}).
  """

  def __init__(self, directory: str, name: str = "train", project: str = "t2t",
               run_name: str | None = None, mode: str = "offline",
               config: Mapping[str, Any] | None = None):
    if mode not in MODES:
      raise ValueError(f"WandbWriter: mode {mode!r} is not one of {', '.join(MODES)}.")
    try:
      import wandb  # pylint: disable=import-outside-toplevel
    except ImportError as e:
      raise ImportError("Weights & Biases logging is enabled but the `wandb` package is not "
                        "installed: `pip install wandb`, or turn the wandb writer off.") from e
    os.makedirs(directory, exist_ok=True)
    self._name = name
    self._run = wandb.init(project=project, name=run_name or os.path.basename(
        os.path.normpath(directory)), dir=directory, mode=mode, config=dict(config or {}),
                           resume="allow", reinit=True)

  def write(self, step: int, scalars: Mapping[str, float]) -> None:
    self._run.log({f"{self._name}/{k}": float(v) for k, v in scalars.items()}, step=int(step))

  def close(self) -> None:
    if self._run is not None:
      self._run.finish()
      self._run = None


@gin.configurable
def wandb_logging(directory: str, name: str, enabled: bool = False, project: str = "t2t",
                  run_name: str | None = None, mode: str = "offline") -> WandbWriter | None:
  """The run's wandb writer when `wandb_logging.enabled = True` (gin; off by default), else None.

  `reporting.MetricsWriter` calls it, so one gin line turns wandb on for train, validation and
  eval scalars alike: `--gin.wandb_logging.enabled=True` (offline unless `mode='online'`).
  """
  if not enabled:
    return None
  return WandbWriter(directory, name=name, project=project, run_name=run_name, mode=mode)
