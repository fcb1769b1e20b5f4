"""How busy the machine is while a benchmark runs, so a noisy figure is never taken for a result;
and the CPUs a benchmark runs on (`pin_threads`).

Two measures, both recorded in the benchmark's JSON:
- the 1-minute load average (`os.getloadavg`), checked before anything runs: above the core count the
  benchmark refuses to start unless told `--allow-loaded`;
- `foreign_cores`: the average number of cores that OTHER processes kept busy during a timed section,
  from the machine-wide busy time in /proc/stat minus this process's own CPU time (and that of its
  finished children, e.g. the peer subprocess). The load average cannot tell this apart from the
  benchmark's own threads; this can.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

# Average cores used by other processes above which a section counts as measured on a loaded machine.
FOREIGN_CORES_LIMIT = 0.25


class LoadedMachineError(ValueError):
  """The machine is too busy for a figure worth writing down."""


def pin_threads(threads: int) -> list[int]:
  """Restricts this process (and its children) to `threads` CPUs; returns them. Call before JAX runs."""
  if threads < 1:
    raise ValueError(f'--threads must be >= 1, got {threads}.')
  cpus = sorted(os.sched_getaffinity(0))
  if threads > len(cpus):
    raise ValueError(f'--threads {threads} is more than the {len(cpus)} cores this process may use '
                     f'(os.cpu_count() = {os.cpu_count()}); both sides would oversubscribe them. '
                     f'Use --threads {len(cpus)} or fewer.')
  os.sched_setaffinity(0, cpus[:threads])
  return cpus[:threads]


def _busy_seconds() -> float | None:
  """Machine-wide non-idle CPU seconds since boot (None where /proc/stat is unavailable)."""
  try:
    with open('/proc/stat') as f:
      fields = f.readline().split()
  except OSError:
    return None
  if not fields or fields[0] != 'cpu':
    return None
  # user nice system idle iowait irq softirq steal [guest guest_nice: already inside user/nice]
  values = [int(v) for v in fields[1:9]]
  busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
  return busy / os.sysconf('SC_CLK_TCK')


def _own_seconds() -> float:
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


@dataclasses.dataclass
class Section:
  """CPU accounting of one timed section (`with Section() as s: ...`)."""
  name: str
  wall_s: float = 0.0
  own_cores: float | None = None
  foreign_cores: float | None = None
  loadavg_before: float = 0.0
  loadavg_after: float = 0.0

  def __enter__(self) -> 'Section':
    self.loadavg_before = os.getloadavg()[0]
    self._t0, self._busy0, self._own0 = time.perf_counter(), _busy_seconds(), _own_seconds()
    return self

  def __exit__(self, *exc: Any) -> None:
    self.wall_s = time.perf_counter() - self._t0
    busy1, own1 = _busy_seconds(), _own_seconds()
    self.loadavg_after = os.getloadavg()[0]
    if self.wall_s > 0:
      own = own1 - self._own0
      self.own_cores = own / self.wall_s
      if busy1 is not None and self._busy0 is not None:
        self.foreign_cores = max(0.0, (busy1 - self._busy0 - own) / self.wall_s)

  @property
  def loaded(self) -> bool:
    return self.foreign_cores is not None and self.foreign_cores > FOREIGN_CORES_LIMIT

  def as_dict(self) -> dict[str, Any]:
    return dict(name=self.name, wall_s=self.wall_s, own_cores=self.own_cores,
                foreign_cores=self.foreign_cores, loadavg_before=self.loadavg_before,
                loadavg_after=self.loadavg_after, loaded=self.loaded)


def check_quiet(allow_loaded: bool) -> dict[str, Any]:
  """Refuses to start on a machine whose 1-minute load average exceeds its core count.

  Returns what was checked (recorded in the JSON). With `allow_loaded` it only records.
  """
  load1, load5, load15 = os.getloadavg()
  cores = os.cpu_count() or 1
  loaded = load1 > cores
  if loaded and not allow_loaded:
    raise LoadedMachineError(
        f'The machine is loaded: 1-minute load average {load1:.2f} exceeds its {cores} cores, so '
        'timings would measure the other work. Wait for a quiet machine (`uptime`), or pass '
        '--allow-loaded to run anyway; the JSON then marks every figure as measured under load.')
  return dict(loadavg_at_start=[load1, load5, load15], cores=cores, loaded_at_start=loaded,
              allow_loaded=allow_loaded, foreign_cores_limit=FOREIGN_CORES_LIMIT)
