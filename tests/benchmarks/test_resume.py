"""benchmarks/resume.py: the first batch after a resume, by restored input state and by replay,
on the real BBC stream; and the two model directories whose resumes the benchmark times."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import resume
from t2t.training import checkpoints, input_state


def test_restore_and_replay_give_the_batch_an_unbroken_stream_gives(tmp_path, capsys):
  out = tmp_path / 'resume.json'
  resume.main(['--steps', '2', '--batch', '1', '--skip-train', '--allow-loaded', '--out', str(out)])
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert json.loads(out.read_text()) == result
  (only,) = result['inputs']
  assert only['n'] == 2 and only['same_first_batch'] is True and only['state_bytes'] > 0
  assert only['restore_first_batch_s'] > 0 and only['replay_first_batch_s'] > 0
  assert 'train' not in result and 'cpu_identity' in result['machine']
  assert result['loaded'] == (result['machine']['loaded_at_start']
                              or any(s['loaded'] for s in only['sections']))


def test_a_loaded_machine_is_refused_with_the_way_round(monkeypatch):
  monkeypatch.setattr(os, 'getloadavg', lambda: (os.cpu_count() + 3.0, 1.0, 1.0))
  with pytest.raises(SystemExit, match='benchmarks.resume: error: The machine is loaded.*--allow'):
    resume.main(['--steps', '2', '--skip-train'])


def test_the_restore_directory_has_the_input_state_and_the_replay_one_does_not(tmp_path):
  # A real iterator state at step 3, saved where train() saves it, beside a small checkpoint.
  iterator = iter(tf.data.Dataset.range(10))
  for _ in range(3):
    next(iterator)
  input_state.save(iterator, str(tmp_path / 'inputs'), 3)
  params = {'w': np.arange(4, dtype=np.float32)}
  run, replay = resume.resume_dirs(str(tmp_path), 3, str(tmp_path / 'inputs'), params, {},
                                   {'input_skip': 0})
  assert input_state.exists(run, 3) and not input_state.exists(replay, 3)
  for model_dir in (run, replay):
    ckpt = checkpoints.Checkpointer(model_dir)
    assert ckpt.latest_step() == 3
    ckpt.close()
  # The state restores a fresh iterator to the fourth element.
  fresh = iter(tf.data.Dataset.range(10))
  input_state.restore(fresh, run, 3)
  assert int(next(fresh)) == 3


def test_a_state_outside_the_layout_a_resume_reads_is_an_error(tmp_path, monkeypatch):
  iterator = iter(tf.data.Dataset.range(4))
  input_state.save(iterator, str(tmp_path / 'inputs'), 1)
  monkeypatch.setattr(input_state, 'exists', lambda model_dir, step: False)
  with pytest.raises(RuntimeError, match='input state is not where a resume looks'):
    resume.resume_dirs(str(tmp_path), 1, str(tmp_path / 'inputs'), {'w': np.zeros(2)}, {}, {})
