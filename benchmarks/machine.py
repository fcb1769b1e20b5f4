"""How busy the machine is while a benchmark runs, so a noisy figure is never taken for a result;
which processor it is (`cpu_identity`), so figures from two processors are never compared; and
the CPUs a benchmark runs on (`pin_threads`).

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
import json
import os
import re
import sys
import time
from typing import Any

from t2t import cpu

# Average cores used by other processes above which a section counts as measured on a loaded machine.
FOREIGN_CORES_LIMIT = 0.25


# Instruction-set extensions that decide which code paths XLA, PyTorch and t2t's own kernel take
# (`/proc/cpuinfo` spelling): AVX-512 and its bf16 dot product, AMX, AVX-VNNI; `asimd`, `bf16`,
# `sve` on Arm.
ISA_FLAGS = ('avx2', 'fma', 'avx512f', 'avx512bw', 'avx512_vnni', 'avx512_bf16', 'amx_bf16',
             'avx_vnni', 'asimd', 'bf16', 'sve')

# AMD's CPUID family and model ranges -> microarchitecture, for the families of AMD EPYC servers.
_AMD_MICROARCHITECTURES = {
    23: ((0x00, 0x2F, 'Zen / Zen+'), (0x30, 0xFF, 'Zen 2')),
    25: ((0x00, 0x0F, 'Zen 3'), (0x10, 0x1F, 'Zen 4'), (0x20, 0x5F, 'Zen 3'),
         (0x60, 0x7F, 'Zen 4'), (0xA0, 0xAF, 'Zen 4')),
    26: ((0x00, 0xFF, 'Zen 5'),),
}


# Intel's family 6 server models -> microarchitecture (Xeon Scalable generations). A VM may call
# itself just "Intel(R) Xeon(R) Processor"; AMX (Sapphire Rapids on) changes what bf16 costs.
_INTEL_MICROARCHITECTURES = {
    0x55: 'Skylake / Cascade Lake', 0x6A: 'Ice Lake', 0x6C: 'Ice Lake',
    0x8F: 'Sapphire Rapids', 0xCF: 'Emerald Rapids', 0xAD: 'Granite Rapids',
    0xAE: 'Granite Rapids',
}


def _microarchitecture(vendor: str | None, family: int | None, model: int | None) -> str | None:
  if vendor == 'GenuineIntel':
    return _INTEL_MICROARCHITECTURES.get(model) if family == 6 else None
  if vendor != 'AuthenticAMD':
    return None
  for low, high, name in _AMD_MICROARCHITECTURES.get(family, ()):
    if model is not None and low <= model <= high:
      return name
  return None


def cpu_identity(cpuinfo: str | None = None) -> dict[str, Any]:
  """What processor this is, from the first entry of /proc/cpuinfo (or the text `cpuinfo`).

  "AMD EPYC", the model name a VM reports, names processors three generations apart whose
  speeds differ by ~2x and whose bf16 arithmetic is native on one and emulated on another
  (benchmarks/EXPERIMENTS.md, "Two processors"), so the JSON keeps the vendor, CPUID family /
  model / stepping, the microarchitecture where known (AMD EPYC and Intel Xeon), the clock the
  kernel reports, which of `ISA_FLAGS` the processor has, and `native_bf16`: whether bf16 dot
  products are instructions (AVX512_BF16 or AMX-BF16 on x86, BF16 on Arm) rather than
  conversions to float32.
  Fields the file lacks are None; without the file every field is None.
  """
  fields = cpu.cpuinfo_entry(cpuinfo)
  if not fields:
    return dict(model_name=None, vendor=None, family=None, model=None, stepping=None,
                microarchitecture=None, mhz=None, isa={flag: None for flag in ISA_FLAGS},
                native_bf16=None)

  def number(key: str) -> int | None:
    value = fields.get(key, '')
    if re.fullmatch(r'[0-9]+', value):
      return int(value)
    return int(value, 16) if re.fullmatch(r'0x[0-9a-fA-F]+', value) else None

  flags = set((fields.get('flags') or fields.get('features') or '').split())
  vendor, family, model = fields.get('vendor_id'), number('cpu family'), number('model')
  mhz = fields.get('cpu mhz', '')
  return dict(
      model_name=fields.get('model name'), vendor=vendor, family=family, model=model,
      stepping=number('stepping'),
      microarchitecture=_microarchitecture(vendor, family, model),
      mhz=float(mhz) if re.fullmatch(r'[0-9]+(\.[0-9]*)?', mhz) else None,
      isa={flag: flag in flags for flag in ISA_FLAGS},
      native_bf16=bool(flags & {'avx512_bf16', 'amx_bf16', 'bf16'}))


def describe_cpu(identity: dict[str, Any]) -> str:
  """One line for a table, e.g. 'AMD EPYC (family 25 model 1, Zen 3, AVX2, no AVX-512; bf16
  emulated)'."""
  isa = identity.get('isa') or {}
  if all(v is None for v in isa.values()):
    return 'unknown CPU'
  details = []
  if identity.get('family') is not None:
    details.append(f'family {identity["family"]} model {identity["model"]}')
  if identity.get('microarchitecture'):
    details.append(identity['microarchitecture'])
  if isa.get('avx512f'):
    details.append('AVX-512 + AMX' if isa.get('amx_bf16') else 'AVX-512')
  elif isa.get('avx2'):
    details.append('AVX2, no AVX-512')
  elif isa.get('asimd'):
    details.append('NEON' + (' + SVE' if isa.get('sve') else ''))
  bf16 = 'native bf16' if identity.get('native_bf16') else 'bf16 emulated'
  return f'{identity.get("model_name") or "CPU"} ({", ".join(details)}; {bf16})'


def check_bf16_is_native(precision: str, cpu: dict[str, Any], peer_runs: bool,
                         allow_emulated: bool = False) -> None:
  """Refuses bf16 against a peer on a processor without bf16 instructions (`cpu_identity`).

  There both sides emulate bf16 with float32 conversions, and PyTorch's autocast far more slowly
  than XLA (benchmarks/EXPERIMENTS.md, "Two processors"), so the ratio would time the emulation, not
  the frameworks. A run without the peer, or with `allow_emulated`, may go on.
  """
  if precision != 'bf16' or not peer_runs or allow_emulated or cpu.get('native_bf16') is not False:
    return
  raise ValueError(
      f'--precision bf16 on {describe_cpu(cpu)}: this processor has no bf16 instructions '
      '(AVX512_BF16 or AMX), so t2t and the peer would both emulate bf16 and the ratio would '
      'measure the emulation. Use --precision fp32 (the fair comparison here), --no-peer to time '
      't2t alone, or --allow-emulated-bf16 to run it anyway.')


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
  """CPU accounting of one timed section (`with Section() as s: ...`).

  Says on stderr when it starts and how long it took (a whole `t5_small_cpu all` runs ~7 minutes),
  with a warning when other processes kept more than `FOREIGN_CORES_LIMIT` cores busy meanwhile.
  """
  name: str
  wall_s: float = 0.0
  own_cores: float | None = None
  foreign_cores: float | None = None
  loadavg_before: float = 0.0
  loadavg_after: float = 0.0

  def __enter__(self) -> 'Section':
    self.loadavg_before = os.getloadavg()[0]
    print(f'[{self.name}] started (1-minute load {self.loadavg_before:.2f})', file=sys.stderr,
          flush=True)
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
    others = ('' if self.foreign_cores is None else
              f', other processes {self.foreign_cores:.2f} cores'
              + (f' (more than {FOREIGN_CORES_LIMIT}: this section counts as loaded)'
                 if self.loaded else ''))
    print(f'[{self.name}] {"failed after" if exc[0] else "done in"} {self.wall_s:.1f} s{others}',
          file=sys.stderr, flush=True)

  @property
  def loaded(self) -> bool:
    return self.foreign_cores is not None and self.foreign_cores > FOREIGN_CORES_LIMIT

  def as_dict(self) -> dict[str, Any]:
    return dict(name=self.name, wall_s=self.wall_s, own_cores=self.own_cores,
                foreign_cores=self.foreign_cores, loadavg_before=self.loadavg_before,
                loadavg_after=self.loadavg_after, loaded=self.loaded)


def check_quiet(allow_loaded: bool) -> dict[str, Any]:
  """Refuses to start on a machine whose 1-minute load average exceeds its core count.

  Returns what was checked and which processor it is (`cpu_identity`), recorded in the JSON.
  With `allow_loaded` it only records.
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
              allow_loaded=allow_loaded, foreign_cores_limit=FOREIGN_CORES_LIMIT,
              cpu_identity=cpu_identity())


def record(result: dict[str, Any], quiet: dict[str, Any], sections: list[Section],
           out: str | None) -> str:
  """Completes a benchmark's `result` with its timed `sections`, the machine (`quiet` from
  `check_quiet`, plus the time the run ended) and `loaded` (loaded at the start or in any
  section); writes it as one JSON line to `out` (if given) and stdout; returns the line."""
  result.update(sections=[s.as_dict() for s in sections],
                machine=dict(quiet, date_utc=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())),
                loaded=bool(quiet.get('loaded_at_start') or any(s.loaded for s in sections)))
  line = json.dumps(result)
  if out:
    with open(out, 'w') as f:
      f.write(line + '\n')
  print(line)
  return line


def versions() -> dict[str, str | None]:
  """The versions of Python and of the packages the benchmarks time (None: not installed)."""
  import platform  # pylint: disable=g-import-not-at-top
  out: dict[str, str | None] = dict(python=platform.python_version())
  for name in ('jax', 'flax', 'optax', 'jaxlib', 'torch', 'transformers'):
    try:
      out[name] = __import__(name).__version__
    except ImportError:
      out[name] = None
  return out
