"""Which x86 processor this is: what t2t's CPU kernels may use and which of their builds to pick.

Read once from Linux's /proc/cpuinfo (the first processor's entry: a machine's or a VM's cores are
alike). Elsewhere (other systems, other architectures) every answer is empty or None, and no
kernel of t2t's own applies (`small_dots.unavailable_reason`). `benchmarks/machine.py` records
the same entry in each benchmark's JSON. Imports nothing heavy (no JAX), so a benchmark may ask
before it sets up JAX's environment.
"""
from __future__ import annotations

import functools
import platform

CPUINFO = '/proc/cpuinfo'


def cpuinfo_entry(text: str | None = None) -> dict[str, str]:
  """The first processor's fields in /proc/cpuinfo (or in `text`), keys lower-cased, e.g.
  {'vendor_id': 'AuthenticAMD', 'cpu family': '26', 'flags': 'fpu ... avx512f ...'}; empty where
  there is no such file."""
  if text is None:
    try:
      with open(CPUINFO) as f:
        text = f.read()
    except OSError:
      text = ''
  fields: dict[str, str] = {}
  for line in text.splitlines():
    if not line.strip():
      if fields:
        break
      continue
    key, sep, value = line.partition(':')
    if sep:
      fields.setdefault(key.strip().lower(), value.strip())
  return fields


@functools.cache
def _entry() -> dict[str, str]:
  return cpuinfo_entry()


@functools.cache
def flags() -> frozenset[str]:
  """The processor's instruction-set flags ('avx2', 'avx512f', ...) on x86-64 Linux; empty
  elsewhere."""
  if platform.system() != 'Linux' or platform.machine() not in ('x86_64', 'AMD64'):
    return frozenset()
  return frozenset(_entry().get('flags', '').split())


def vendor() -> str | None:
  """/proc/cpuinfo's vendor_id ('GenuineIntel', 'AuthenticAMD'), None where it has none."""
  return _entry().get('vendor_id')


def family() -> int | None:
  """/proc/cpuinfo's 'cpu family' (6 for Intel's cores, 25 for AMD's Zen 3 and 4, 26 for Zen 5),
  None where it has none."""
  value = _entry().get('cpu family', '')
  return int(value) if value.isdigit() else None


def full_width_avx512() -> bool:
  """Whether this processor's cores run 512-bit FMAs at full width, twice AVX2's float32 work a
  cycle: Intel's (two 512-bit FMA units a Xeon core) and AMD's from Zen 5 on (CPUID family 26).
  Zen 4 (family 25) splits each 512-bit operation into two 256-bit halves, so t2t's AVX-512
  builds of a kernel that has an AVX2 one (`gemm.prefers_avx512`,
  `train_attention.prefers_avx512`) are chosen by default only where this holds. Measured:
  benchmarks/EXPERIMENTS.md, "Intel Emerald Rapids" and "Zen 5"."""
  if vendor() == 'GenuineIntel':
    return True
  return vendor() == 'AuthenticAMD' and (family() or 0) >= 26
