"""t2t/json_records.py: a record read back names the file at fault; a record written is whole."""
import json
import os

import pytest

from t2t import json_records


def test_a_record_round_trips_and_leaves_no_temporary_file(tmp_path):
  path = str(tmp_path / 'phase.json')
  json_records.write_json(path, {'step': 3, 'tasks': ['a', 'b']})
  assert json_records.read_json(path, 'unused') == {'step': 3, 'tasks': ['a', 'b']}
  json_records.write_json(path, {'step': 4})   # replaces the old record whole
  assert json.loads(open(path).read()) == {'step': 4}
  assert os.listdir(tmp_path) == ['phase.json']


def test_a_half_written_record_is_named_with_where_it_breaks_and_the_advice(tmp_path):
  path = tmp_path / 'metrics.json'
  path.write_text('{"accuracy": 93.3,\n "f1"')
  with pytest.raises(ValueError) as e:
    json_records.read_json(str(path), 'Delete it and run the same command again.')
  assert str(e.value) == (f"{path} is not valid JSON (Expecting ':' delimiter: line 2 column 6): "
                          "a half-written file? Delete it and run the same command again.")
  assert e.value.__cause__ is None   # one line, not json's traceback chained under it


def test_an_empty_record_says_so_with_the_callers_cause(tmp_path):
  path = tmp_path / 'config.json'
  path.write_text('  \n')
  with pytest.raises(ValueError, match=r'config.json is empty: a truncated copy\? Copy it again.'):
    json_records.read_json(str(path), 'Copy it again.', cause='a truncated copy?')


def test_a_missing_record_is_the_callers_to_handle(tmp_path):
  with pytest.raises(FileNotFoundError):
    json_records.read_json(str(tmp_path / 'nothing.json'), 'unused')
