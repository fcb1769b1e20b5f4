"""benchmarks/summary.py on the committed Zen 3 runs (the figures the README's Performance table
states, and those of an earlier day) and on small hand-made results for grouping, loaded runs and
refusals."""
import json
import os

import pytest

from benchmarks import summary

RESULTS = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks', 'results')


def _fake(cpu: str, train: float, greedy_met: bool, loaded: bool = False) -> dict:
  """A minimal `all` result: what summary reads, nothing else."""
  targets = {
      'train_speedup': dict(measured=train, met=train >= 1.5),
      'train_roof_fraction': dict(measured=0.7, met=True),
      'greedy_speedup': dict(measured=2.1 if greedy_met else 1.9, met=greedy_met),
      'beam4_speedup': dict(measured=4.0, met=True),
      'compile_and_first_s': dict(measured=14.0, met=True)}
  side = lambda s: {'t2t': {'median_s': s}, 'peer': {'median_s': 2 * s}}
  return dict(benchmark='t5_small_cpu', mode='all', precision='fp32', loaded=loaded,
              machine=dict(cpu_identity=dict(microarchitecture=cpu), date_utc='2026-11-30T10:00:00Z'),
              results=dict(train=side(5.0), greedy=side(1.5), beam4=side(3.0)), targets=targets)


def _write(tmp_path, name, result):
  path = tmp_path / name
  path.write_text(json.dumps(result))
  return str(path)


def _zen3_runs(date: str, count: int) -> dict:
  """summary's one group over the committed `all` runs {date}_..._zen3_run1..count."""
  files = [os.path.join(RESULTS, f'{date}_t5_small_cpu_all_fp32_zen3_run{i}.json')
           for i in range(1, count + 1)]
  got = summary.summarise({f: summary.load(f) for f in files})
  assert list(got) == ['Zen 3, fp32']
  return got['Zen 3, fp32']


def _met_of(group: dict) -> dict:
  return {k: (t['met'], t['of']) for k, t in group['targets'].items()}


def test_the_zen3_runs_give_the_readmes_figures():
  zen3 = _zen3_runs('2026-12-07', 7)  # the README table's Zen 3 column
  targets = zen3['targets']
  # Run 1's 1.41x is the one train miss; greedy missed 2x in runs 2, 3 and 4 (1.69x, the farthest).
  assert _met_of(zen3) == {'train_speedup': (6, 7), 'train_roof_fraction': (7, 7),
                           'greedy_speedup': (4, 7), 'beam4_speedup': (7, 7),
                           'compile_and_first_s': (0, 7)}
  assert targets['train_speedup']['median'] == pytest.approx(1.68, abs=0.005)
  assert targets['train_speedup']['min'] == pytest.approx(1.41, abs=0.005)
  assert targets['greedy_speedup']['min'] == pytest.approx(1.69, abs=0.005)
  assert targets['compile_and_first_s']['median'] == pytest.approx(16.2, abs=0.05)
  assert targets['compile_and_first_s']['min'] == pytest.approx(15.4, abs=0.05)
  assert zen3['seconds']['greedy_t2t']['median'] == pytest.approx(2.05, abs=0.005)


def test_the_zen3_runs_of_2026_11_30_give_their_figures():
  zen3 = _zen3_runs('2026-11-30', 9)  # 02:41-10:24 UTC, the table's Zen 3 runs until 2026-12-07
  targets = zen3['targets']
  # Run 7's 1.37x is the one train miss; greedy met 2x in runs 3, 5, 7 and 8; no cold start <= 15 s.
  assert _met_of(zen3) == {'train_speedup': (8, 9), 'train_roof_fraction': (9, 9),
                           'greedy_speedup': (4, 9), 'beam4_speedup': (9, 9),
                           'compile_and_first_s': (0, 9)}
  assert targets['train_speedup']['median'] == pytest.approx(1.71, abs=0.005)
  assert targets['train_speedup']['min'] == pytest.approx(1.37, abs=0.005)
  assert targets['greedy_speedup']['max'] == pytest.approx(2.26, abs=0.005)
  assert targets['compile_and_first_s']['median'] == pytest.approx(20.4, abs=0.05)
  assert zen3['seconds']['greedy_t2t']['median'] == pytest.approx(2.53, abs=0.005)


def test_groups_by_processor_and_counts_the_runs_that_met_each_target(tmp_path):
  files = [_write(tmp_path, 'a.json', _fake('Zen 4', 1.6, True)),
           _write(tmp_path, 'b.json', _fake('Zen 4', 1.4, False)),
           _write(tmp_path, 'c.json', _fake('Zen 4', 1.8, True)),
           _write(tmp_path, 'd.json', _fake('Zen 3', 1.2, False))]
  got = summary.summarise({f: summary.load(f) for f in files})
  assert sorted(got) == ['Zen 3, fp32', 'Zen 4, fp32']
  zen4 = got['Zen 4, fp32']
  assert zen4['targets']['train_speedup'] == dict(median=1.6, min=1.4, max=1.8, met=2, of=3)
  table = summary.markdown(got)
  assert '**2 of 3**: 1.60x [1.40x - 1.80x] (5.00 s vs 10.00 s)' in table
  assert '**not met**: 1.20x [1.20x - 1.20x]' in table  # Zen 3's one run
  assert '**met**: 70% [70% - 70%]' in table


def test_loaded_runs_are_left_out_and_named(tmp_path, capsys):
  quiet = _write(tmp_path, 'quiet.json', _fake('Zen 4', 1.6, True))
  noisy = _write(tmp_path, 'noisy.json', _fake('Zen 4', 0.9, False, loaded=True))
  assert summary.main([quiet, noisy, '--json']) == 0
  out, err = capsys.readouterr()
  assert 'leaving out 1 run(s) measured on a loaded machine' in err and 'noisy.json' in err
  assert json.loads(out)['Zen 4, fp32']['runs'] == [quiet]
  assert summary.main([quiet, noisy, '--json', '--include-loaded']) == 0
  assert len(json.loads(capsys.readouterr().out)['Zen 4, fp32']['runs']) == 2


def test_a_file_that_is_not_an_all_run_is_refused_by_name(tmp_path, capsys):
  train_only = _write(tmp_path, 'train_only.json', {**_fake('Zen 4', 1.6, True), 'mode': 'train'})
  assert summary.main([train_only]) == 2
  err = capsys.readouterr().err
  assert err.startswith(f'error: {train_only}: not a `python -m benchmarks.t5_small_cpu all` result')
  broken = tmp_path / 'broken.json'
  broken.write_text('{"benchmark": ')
  assert summary.main([str(broken)]) == 2
  assert f'error: {broken}: cannot read it as JSON' in capsys.readouterr().err


def test_plot_draws_each_run_as_a_dot_with_the_median_and_the_target(tmp_path, capsys):
  early, late = _fake('Zen 4', 1.4, False), _fake('Zen 4', 1.8, True)
  early['machine']['date_utc'], late['machine']['date_utc'] = '2026-11-30T09:00Z', '2026-11-30T11:00Z'
  files = [_write(tmp_path, 'late.json', late), _write(tmp_path, 'early.json', early),
           _write(tmp_path, 'zen3.json', _fake('Zen 3', 1.7, True))]
  results = {f: summary.load(f) for f in files}
  # In time order whatever the files' order; the roof fraction stays a fraction here.
  assert summary.points(results)['train_speedup'] == {
      'Zen 3, fp32': [(1.7, True)], 'Zen 4, fp32': [(1.4, False), (1.8, True)]}
  fig = summary.plot(results, str(tmp_path / 'targets.png'))
  train, roof = fig.axes[0], fig.axes[1]
  dots = [c for c in train.collections]
  assert [len(c.get_offsets()) for c in dots] == [1, 2]  # Zen 3's one run, Zen 4's two
  assert [list(map(float, c.get_offsets()[:, 1])) for c in dots] == [[1.7], [1.4, 1.8]]
  assert list(dots[1].get_offsets()[:, 0]) == [0.75, 1.25]  # Zen 4's slot, earliest left
  assert dots[1].get_facecolors()[0][3] == 0.0 and dots[1].get_facecolors()[1][3] == 1.0  # missed: hollow
  lines = {tuple(line.get_ydata()) for line in train.get_lines()}
  assert {(1.5, 1.5), (1.7, 1.7), (1.6, 1.6)} <= lines  # the target, Zen 3's one run, Zen 4's median
  assert (70.0, 70.0) in {tuple(line.get_ydata()) for line in roof.get_lines()}  # in percent
  assert [t.get_text() for t in train.get_xticklabels()] == ['Zen 3\nfp32', 'Zen 4\nfp32']
  png = tmp_path / 'targets.png'
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert summary.main([*files, '--plot', str(tmp_path / 'cli.png')]) == 0
  assert (tmp_path / 'cli.png').stat().st_size > 10_000 and 'wrote' in capsys.readouterr().err


def test_runs_at_other_shapes_are_a_group_of_their_own():
  issue = _fake('Zen 3', 1.7, True)
  other = _fake('Zen 3', 1.3, False)
  for mode, shapes in (('train', dict(batch=32, enc_len=128, dec_len=8)),
                       ('greedy', dict(batch=32, enc_len=128, gen_len=8, beams=1))):
    other['results'][mode]['shapes'] = shapes
  got = summary.summarise({'a.json': issue, 'b.json': other})
  assert sorted(got) == ['Zen 3, fp32', 'Zen 3, fp32, batch 32, 128/8 -> 8']
  assert got['Zen 3, fp32, batch 32, 128/8 -> 8']['targets']['train_speedup']['median'] == 1.3
  # The committed fine-tuning-shape runs: their own group, every train step faster than the peer's.
  files = [os.path.join(RESULTS, f'2026-12-07_t5_small_cpu_all_fp32_zen3_b32_128_8_run{i}.json')
           for i in (1, 2, 3)]
  got = summary.summarise({f: summary.load(f) for f in files})
  assert list(got) == ['Zen 3, fp32, batch 32, 128/8 -> 8']
  train = got['Zen 3, fp32, batch 32, 128/8 -> 8']['targets']['train_speedup']
  assert train['of'] == 3 and 1.2 < train['min'] <= train['max'] < 1.5
