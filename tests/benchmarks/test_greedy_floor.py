"""benchmarks/greedy_floor.py: the fit on hand-made times, the bytes a token reads counted by hand
for the tiny model, a real interleaved run of it, and bad arguments."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import greedy_floor


def test_fit_line_recovers_before_first_and_per_token():
  # 1.0 s to the first token, then 10 ms a token: 2 -> 1.01, 33 -> 1.32, 64 -> 1.63.
  before_first, per_token = greedy_floor.fit_line([2, 33, 64], [1.01, 1.32, 1.63])
  assert before_first == pytest.approx(1.0)
  assert per_token == pytest.approx(0.010)
  # Noisy medians: the least-squares line (x = 1, 32, 63; mean 32, Sxx 1922, Sxy 31 x 0.6 = 18.6),
  # not the line through the end points (which would start at 0.9903 s).
  before_first, per_token = greedy_floor.fit_line([2, 33, 64], [1.0, 1.4, 1.6])
  assert per_token == pytest.approx(18.6 / 1922)
  assert before_first == pytest.approx(4.0 / 3 - 32 * 18.6 / 1922)
  with pytest.raises(ValueError, match='at least two different lengths'):
    greedy_floor.fit_line([8, 8], [1.0, 1.1])


def test_command_line_interleaves_lengths_counts_the_bytes_and_writes_json(tmp_path):
  # A process of its own: the command sets malloc and pins threads before JAX starts. One run
  # checks both the measurement and the command around it (each tiny predictor costs a compile).
  out = tmp_path / 'floor.json'
  run = subprocess.run(
      [sys.executable, '-m', 'benchmarks.greedy_floor', '--tiny', '--lengths', '4,2', '--rounds',
       '2', '--batch', '2', '--enc-len', '8', '--threads', '1', '--allow-loaded', '--out', str(out)],
      cwd=Path(greedy_floor.__file__).resolve().parent.parent, capture_output=True, text=True,
      timeout=300, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result == json.loads(run.stdout.strip().splitlines()[-1])
  assert result['benchmark'] == 'greedy_floor' and result['model'] == 'tiny'
  assert result['machine']['cores'] >= 1 and 'date_utc' in result['machine']
  assert set(result['times']) == set(result['median_s']) == {'2', '4'}
  assert all(len(t) == 2 and min(t) > 0 for t in result['times'].values())
  # Tiny T5 (d_model 32, 2 heads x 16, d_ff 64, vocab 128, one decoder layer, tied logits):
  # self-attention 4 x 32 x 32, cross-attention's query and output 2 x 32 x 32 (its key and value
  # only fill the cache), the FFN 2 x 32 x 64, three layer norms and the final one 4 x 32, the
  # position bias 32 buckets x 2 heads, the embedding 128 x 32: 14,528 float32 = 58,112 bytes;
  # the cross-attention cache 2 x 2 rows x 8 x 32 x 4 = 4,096 bytes, the self-attention's at 4
  # tokens 2,048.
  assert result['bytes_per_token'] == 58_112 + 4_096 + 2_048
  medians = [result['median_s'][k] for k in ('2', '4')]
  before_first, per_token = greedy_floor.fit_line([2, 4], medians)
  assert (result['before_first_s'], result['per_token_s']) == pytest.approx(
      (before_first, per_token))
  assert 'before the first token' in run.stderr and 'a token' in run.stderr


def test_bad_arguments_are_reported():
  for argv, message in ((['--lengths', 'two,3'], '--lengths must be comma-separated'),
                        (['--lengths', '64'], 'at least two different positive lengths'),
                        (['--rounds', '0'], '--rounds must be >= 1'),
                        (['--threads', '999'], 'more than the')):
    with pytest.raises(SystemExit, match=message):
      greedy_floor.main(['--tiny', '--allow-loaded'] + argv)
