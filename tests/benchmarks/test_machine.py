"""benchmarks/machine.py: which CPU a figure was measured on, and what a timed section reports."""
import json
import time

import pytest

from benchmarks import machine

# The first entries of /proc/cpuinfo on the two kinds of VM this project's benchmarks ran on
# (both report the model name "AMD EPYC"), cut to the fields that matter, and on an Arm server.
ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
stepping\t: 1
cpu MHz\t\t: 2445.430
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2 sha_ni vaes vpclmulqdq
bogomips\t: 4890.86

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
"""
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
cpu MHz\t\t: 2600.000
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni
"""
EMERALD_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 207
model name\t: Intel(R) Xeon(R) Processor
stepping\t: 2
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512bw avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve bf16
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_zen3_is_told_apart_from_zen4_though_both_are_called_amd_epyc():
  zen3, zen4 = machine.cpu_identity(ZEN3), machine.cpu_identity(ZEN4)
  assert zen3['model_name'] == zen4['model_name'] == 'AMD EPYC'
  assert (zen3['family'], zen3['model'], zen3['stepping']) == (25, 1, 1)
  assert zen3['microarchitecture'] == 'Zen 3' and zen4['microarchitecture'] == 'Zen 4'
  assert zen3['mhz'] == 2445.43
  assert zen3['isa']['avx2'] and not zen3['isa']['avx512f'] and not zen3['native_bf16']
  assert zen4['isa']['avx512_bf16'] and zen4['native_bf16']
  assert machine.describe_cpu(zen3) == (
      'AMD EPYC (family 25 model 1, Zen 3, AVX2, no AVX-512; bf16 emulated)')
  assert machine.describe_cpu(zen4) == 'AMD EPYC (family 25 model 17, Zen 4, AVX-512; native bf16)'


def test_an_intel_xeon_is_named_by_its_model_and_amx_is_shown():
  emr = machine.cpu_identity(EMERALD_RAPIDS)
  assert (emr['vendor'], emr['family'], emr['model']) == ('GenuineIntel', 6, 207)
  assert emr['microarchitecture'] == 'Emerald Rapids'
  assert emr['isa']['amx_bf16'] and emr['native_bf16']
  assert machine.describe_cpu(emr) == (
      'Intel(R) Xeon(R) Processor (family 6 model 207, Emerald Rapids, AVX-512 + AMX; native bf16)')
  # An Intel model outside the table, and a non-server family, stay unnamed rather than guessed.
  other = machine.cpu_identity(EMERALD_RAPIDS.replace('model\t\t: 207', 'model\t\t: 151'))
  assert other['microarchitecture'] is None


def test_arm_features_and_a_missing_file():
  arm = machine.cpu_identity(ARM)
  assert arm['vendor'] is None and arm['family'] is None and arm['microarchitecture'] is None
  assert arm['isa']['sve'] and arm['native_bf16'] and not arm['isa']['avx2']
  assert machine.describe_cpu(arm) == 'CPU (NEON + SVE; native bf16)'
  nothing = machine.cpu_identity('')
  assert nothing['native_bf16'] is None and set(nothing['isa']) == set(machine.ISA_FLAGS)
  assert machine.describe_cpu(nothing) == 'unknown CPU'


def test_the_quiet_check_records_this_machines_cpu():
  record = machine.check_quiet(allow_loaded=True)
  assert record['cpu_identity'] == machine.cpu_identity()


def test_versions_name_the_installed_packages_and_none_for_missing_ones(monkeypatch):
  import builtins
  import platform

  import jax
  got = machine.versions()
  assert got['python'] == platform.python_version() and got['jax'] == jax.__version__
  assert set(got) == {'python', 'jax', 'flax', 'optax', 'jaxlib', 'torch', 'transformers'}
  real_import = builtins.__import__

  def no_torch(name, *args, **kwargs):
    if name == 'torch':
      raise ImportError('no torch here')
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, '__import__', no_torch)
  assert machine.versions()['torch'] is None


def test_a_section_reports_its_start_and_its_time_on_stderr(capsys):
  with machine.Section('train/t2t') as section:
    time.sleep(0.05)
  err = capsys.readouterr().err.splitlines()
  assert err[0].startswith('[train/t2t] started (1-minute load ')
  assert err[1].startswith(f'[train/t2t] done in {section.wall_s:.1f} s')
  assert section.wall_s >= 0.05 and section.as_dict()['name'] == 'train/t2t'


def test_a_failing_section_says_so_and_keeps_the_error(capsys):
  with pytest.raises(RuntimeError, match='peer crashed'):
    with machine.Section('greedy/peer'):
      raise RuntimeError('peer crashed')
  assert '[greedy/peer] failed after ' in capsys.readouterr().err


def test_record_adds_sections_machine_and_loaded_then_writes_one_line(tmp_path, capsys):
  quiet = dict(loadavg_at_start=[0.5, 0.5, 0.5], cores=2, loaded_at_start=False)
  calm, busy = machine.Section('calm'), machine.Section('busy')
  calm.foreign_cores, busy.foreign_cores = 0.0, machine.FOREIGN_CORES_LIMIT + 0.5
  out = tmp_path / 'result.json'
  line = machine.record({'benchmark': 'x'}, quiet, [calm], str(out))
  assert out.read_text() == line + '\n' and capsys.readouterr().out == line + '\n'
  got = json.loads(line)
  assert got['benchmark'] == 'x' and got['loaded'] is False
  assert [s['name'] for s in got['sections']] == ['calm']
  assert got['machine']['cores'] == 2 and got['machine']['date_utc'].endswith('Z')
  assert json.loads(machine.record({}, quiet, [calm, busy], None))['loaded'] is True
  assert json.loads(machine.record({}, dict(quiet, loaded_at_start=True), [], None))['loaded']
