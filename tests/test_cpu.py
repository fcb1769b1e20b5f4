"""t2t.cpu: the processor's identity from /proc/cpuinfo, and the rule that picks AVX-512 builds."""
import pytest

from t2t import cpu

ZEN5 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16
vmx flags\t: ignored

processor\t: 1
vendor_id\t: GenuineIntel
cpu family\t: 6
"""


def test_the_first_processors_entry():
  entry = cpu.cpuinfo_entry(ZEN5)
  assert entry['vendor_id'] == 'AuthenticAMD'
  assert entry['cpu family'] == '26'
  assert entry['flags'].split() == ['fpu', 'sse2', 'avx2', 'fma', 'avx512f', 'avx512_bf16']
  assert entry['vmx flags'] == 'ignored'   # its own key, not 'flags'
  assert cpu.cpuinfo_entry('') == {}


@pytest.fixture
def cpuinfo(tmp_path, monkeypatch):
  """Points t2t.cpu at a file of the test's text (the answers are cached: cleared both ways)."""
  def use(text):
    path = tmp_path / 'cpuinfo'
    path.write_text(text)
    monkeypatch.setattr(cpu, 'CPUINFO', str(path))
    cpu._entry.cache_clear()
    cpu.flags.cache_clear()
  yield use
  cpu._entry.cache_clear()
  cpu.flags.cache_clear()


@pytest.mark.parametrize('vendor, family, full_width', [
    ('GenuineIntel', '6', True), ('AuthenticAMD', '25', False), ('AuthenticAMD', '26', True),
    ('AuthenticAMD', '', False), ('HygonGenuine', '24', False)])
def test_full_width_avx512_is_intel_or_zen5_on(cpuinfo, vendor, family, full_width):
  cpuinfo(f'vendor_id\t: {vendor}\ncpu family\t: {family}\nflags\t\t: avx2 avx512f\n')
  assert cpu.vendor() == vendor
  assert cpu.family() == (int(family) if family else None)
  assert cpu.full_width_avx512() == full_width


def test_no_cpuinfo_means_no_flags_and_no_vendor(cpuinfo, monkeypatch):
  cpuinfo('')
  monkeypatch.setattr(cpu, 'CPUINFO', '/nonexistent/cpuinfo')
  cpu._entry.cache_clear()
  assert cpu.flags() == frozenset() and cpu.vendor() is None and cpu.family() is None
  assert not cpu.full_width_avx512()


def test_this_machine_agrees_with_the_benchmarks_record():
  from benchmarks import machine
  identity = machine.cpu_identity()
  assert cpu.vendor() == identity['vendor'] and cpu.family() == identity['family']
  assert {flag for flag, has in identity['isa'].items() if has} <= cpu.flags() or not cpu.flags()
