"""A `jax.profiler` trace of chosen steps of a `t2t.train` run (gin: `train.profile = @Profile()`).

`benchmarks/profile_t5_small.py` profiles the benchmark's T5-small; this profiles the user's own
run, whatever its model, mixture and mesh. Steps `first_step` .. `first_step + num_steps - 1`
(step s is the update that takes the state's step from s - 1 to s) are traced into
`MODEL_DIR/profile/` (`MODEL_DIR/profile/process_<i>/` on each process of a multi-process run,
since every host traces its own devices), as TensorBoard's profile plugin reads it
(`plugins/profile/<time>/<host>.xplane.pb`) and as a Perfetto trace (`perfetto_trace.json.gz`,
for ui.perfetto.dev).

The trace starts after step `first_step - 1` and its hooks have finished and stops once the last
traced step has, before its hooks: it holds those steps' work (with step 1, the compilation too)
and the hooks run between them (a checkpoint save), nothing from the steps either side. Both ends
wait for the device, which a run without a profile does not, so the traced steps' wall time
(announced, and written to `profile/summary.json` by process 0) includes the profiler's own
cost. On a CPU backend that time is split into the seconds some XLA thread was running a program
(`xla_busy_s_per_step`) and the rest (`outside_xla_s_per_step`): nothing compiled was running,
so Python, the input pipeline, dispatch or the hooks held the step up. Dispatch is asynchronous,
so host work that overlaps a running program is not in the rest; a large rest says the run waits
on its host, not on its model. Choose steps after the first few: the first compiles, and on a CPU
the next ones may still grow the heap (benchmarks/EXPERIMENTS.md, "Host memory"). A trace that
cannot start (another profiler already running in the process) is announced and the run trains
on without it.

Recipe: gin/recipes/profile.gin.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import gin
import jax

from t2t.training import distributed, paths, reporting

PROFILE_DIR = "profile"
SUMMARY_FILE = "summary.json"


@gin.configurable
@dataclasses.dataclass
class Profile:
  """Which steps to trace: `first_step` (>= 1) and the `num_steps` (>= 1) after it."""
  first_step: int = 10
  num_steps: int = 3

  def __post_init__(self):
    for name in ("first_step", "num_steps"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Profile.{name} must be an integer >= 1, got {value!r} (gin: "
                         f"Profile.{name}).")

  @property
  def last_step(self) -> int:
    return self.first_step + self.num_steps - 1

  def hook(self, model_dir: str, start_step: int, last_step: int) -> "ProfileHook":
    """The training hook for a run that resumes at `start_step` and ends at `last_step`."""
    return ProfileHook(self, model_dir, start_step, last_step)


def trace_dir(model_dir: str, process_index: int, process_count: int) -> str:
  """Where a process writes its trace: MODEL_DIR/profile, or .../process_<i> with several."""
  base = os.path.join(paths.to_str(model_dir), PROFILE_DIR)
  return base if process_count == 1 else os.path.join(base, f"process_{process_index}")


class ProfileHook:
  """Starts the trace after step `first_step - 1` (`start_hook`, the last of the loop's hooks)
  and stops it after step `last_step` (`stop_hook`, the first), so that the hooks of the steps
  either side stay out of it (those between traced steps, a checkpoint save, are in it); `close`
  stops it when the run ends or fails in between. Every process traces."""

  def __init__(self, config: Profile, model_dir: str, start_step: int, last_step: int):
    self.config = config
    self.model_dir = paths.to_str(model_dir)
    self.dir = trace_dir(model_dir, jax.process_index(), jax.process_count())
    self._started: float | None = None
    self._done = False
    if start_step >= config.first_step:
      reporting.announce(f"Profile: the run resumes at step {start_step}, past "
                         f"Profile.first_step = {config.first_step}; nothing is profiled.")
      self._done = True
    elif config.first_step > last_step:
      reporting.announce(f"Profile: Profile.first_step = {config.first_step} is after the run's "
                         f"last step ({last_step}); nothing is profiled.")
      self._done = True

  def start_hook(self, step: int, state: Any, metrics: Any, batch: Any) -> None:
    """Last of a step's hooks: after step `first_step - 1` (and its checkpoint, validation,
    ...), starts the trace. Also called before the loop with the start step, for a trace that
    begins with the run's first step."""
    del metrics, batch
    if not self._done and self._started is None and step == self.config.first_step - 1:
      self._start(state)

  def stop_hook(self, step: int, state: Any, metrics: Any, batch: Any) -> None:
    """First of a step's hooks: after step `last_step`, stops the trace (before that step's
    other hooks, whose work is not the steps')."""
    del metrics, batch
    if not self._done and self._started is not None and step == self.config.last_step:
      self._stop(state, step)

  def close(self) -> None:
    """Stops a trace still running (the run ended or failed before its last step)."""
    if self._started is not None and not self._done:
      self._stop(None, None)

  def _start(self, state: Any) -> None:
    if state is not None:
      jax.block_until_ready(state)   # earlier steps' work stays out of the trace
    try:
      paths.resolve(self.dir).mkdir(parents=True, exist_ok=True)
      jax.profiler.start_trace(self.dir, create_perfetto_trace=True)
    except Exception as e:  # noqa: BLE001  (a profile is not worth a training run)
      self._done = True
      reporting.announce(f"Profile: the trace could not start in {self.dir} "
                         f"({type(e).__name__}: {str(e).strip()[:300]}); training goes on "
                         "without it.")
      return
    self._started = time.perf_counter()

  def _stop(self, state: Any, step: int | None) -> None:
    if state is not None:
      jax.block_until_ready(state)   # the last traced step's work is in the trace
    wall = time.perf_counter() - self._started
    self._done = True
    jax.profiler.stop_trace()
    first = self.config.first_step
    perfetto = sorted(paths.resolve(self.dir).glob("plugins/profile/*/perfetto_trace.json.gz"),
                      key=lambda p: p.parent.name)   # the runs' directories are named by time
    perfetto = os.fspath(perfetto[-1]) if perfetto else None
    summary = dict(first_step=first, last_step=step, complete=step is not None,
                   wall_s=wall, process_count=jax.process_count(), trace_dir=self.dir,
                   perfetto_trace=perfetto)
    if step is not None:
      summary["wall_s_per_step"] = wall / self.config.num_steps
      busy = xla_busy_s(self.dir) if jax.default_backend() == "cpu" else None
      if busy is not None:
        summary["xla_busy_s_per_step"] = busy / self.config.num_steps
        summary["outside_xla_s_per_step"] = max(0.0, wall - busy) / self.config.num_steps
    if distributed.is_writer():
      base = paths.resolve(self.model_dir) / PROFILE_DIR
      base.mkdir(parents=True, exist_ok=True)
      (base / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    if step is None:
      reporting.announce(f"Profile: the run ended before step {self.config.last_step}; the "
                         f"trace from step {first} on is in {self.dir} ({wall:.2f} s).")
      return
    split = ""
    if "xla_busy_s_per_step" in summary:
      split = (f"; XLA ran {summary['xla_busy_s_per_step']:.3f} s of it, "
               f"{summary['outside_xla_s_per_step']:.3f} s outside XLA: Python, input, hooks")
    reporting.announce(
        f"Profile: steps {first}-{step} traced in {self.dir} ({wall / self.config.num_steps:.3f} s "
        f"a step under the profiler{split}). View: tensorboard --logdir {self.dir} (Profile "
        f"tab, needs tensorboard-plugin-profile), or open {perfetto or 'its perfetto_trace.json.gz'} in "
        "ui.perfetto.dev.")


def xla_busy_s(trace_dir: str) -> float | None:
  """Seconds in which some XLA:CPU thread was running a program, in the newest trace under
  `trace_dir` (this host's `.xplane.pb`): the union over XLA's threads (`tf_XLA...` lines of the
  `/host:CPU` plane) of their events with a duration. The rest of the traced wall time nothing
  compiled was running: Python, the input pipeline, dispatch, hooks. None without a trace."""
  runs = sorted(paths.resolve(trace_dir).glob("plugins/profile/*/*.xplane.pb"),
                key=lambda p: p.parent.name)
  if not runs:
    return None
  newest = [p for p in runs if p.parent.name == runs[-1].parent.name]
  spans = []
  for path in newest:
    data = jax.profiler.ProfileData.from_serialized_xspace(path.read_bytes())
    for plane in data.planes:
      if plane.name != "/host:CPU":
        continue
      for line in plane.lines:
        if line.name.startswith("tf_XLA"):
          spans.extend((e.start_ns, e.end_ns) for e in line.events if e.duration_ns > 0)
  total, end = 0.0, float("-inf")
  for start, stop in sorted(spans):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total / 1e9

