"""Task lookup by name, with suggestions for a mistyped one."""
import pytest
import seqio

import tasks  # noqa: F401  (registers the BBC tasks)
from t2t.data import registry


def test_finds_registered_tasks_and_mixtures():
  assert registry.get_mixture_or_task("bbc_topic").name == "bbc_topic"
  name = "t2t_test_registry_mixture"
  seqio.MixtureRegistry.remove(name)
  seqio.MixtureRegistry.add(name, ["bbc_topic", "bbc_span_corruption"], default_rate=1.0)
  try:
    assert isinstance(registry.get_mixture_or_task(name), seqio.Mixture)
    assert name in registry.registered_names()
  finally:
    seqio.MixtureRegistry.remove(name)


def test_mistyped_name_suggests_the_closest():
  count = len(registry.registered_names())
  with pytest.raises(ValueError) as err:
    registry.get_mixture_or_task("bbc_topc")
  message = str(err.value)
  assert message.startswith("Unknown task or mixture 'bbc_topc'. Did you mean: bbc_topic")
  assert f"({count} registered; import the module that registers yours" in message


def test_unrelated_name_and_bad_type():
  with pytest.raises(ValueError, match=r"Unknown task or mixture 'zzzz'\. \(\d+ registered"):
    registry.get_mixture_or_task("zzzz")
  with pytest.raises(ValueError, match="non-empty string"):
    registry.get_mixture_or_task("")


def test_unprepared_tfds_data_is_an_error_not_a_download(tmp_path, monkeypatch):
  import tasks  # noqa: F401  registers glue_cola (TFDS-backed)
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  with pytest.raises(ValueError, match="downloads nothing"):
    registry.check_split_readable(registry.get_mixture_or_task("glue_cola"), "train")
  assert not any(tmp_path.iterdir())  # nothing fetched or prepared


def test_missing_split_is_named():
  import tasks  # noqa: F401
  with pytest.raises(ValueError, match="has no split 'dev'"):
    registry.check_split_readable(registry.get_mixture_or_task("bbc_topic"), "dev")


def test_objectives_by_name_and_a_clear_error_for_an_unknown_one():
  from t2t.data import objectives
  assert registry.get_objective("prefix_lm") is objectives.prefix_lm
  assert set(registry.OBJECTIVE_NAMES) >= {"span_corruption", "bert_style", "deshuffling"}
  with pytest.raises(ValueError, match="Unknown objective 'prefix_llm'. Did you mean 'prefix_lm'"):
    registry.get_objective("prefix_llm")


def test_one_gin_line_switches_the_objective_of_bbc_pretraining():
  import gin
  import tasks  # noqa: F401
  lengths = {"inputs": 32, "targets": 32}
  task = registry.get_mixture_or_task("bbc_pretraining")

  def first_example():
    ds = task.get_dataset(lengths, split="validation", shuffle=False, seed=0)
    return next(ds.as_numpy_iterator())

  default = first_example()
  vocab = task.output_features["targets"].vocabulary
  assert "<extra_id_0>" in vocab.decode(default["inputs"].tolist())  # span corruption
  gin.parse_config("pretraining_objective.name = 'deshuffling'")
  shuffled = first_example()
  assert "<extra_id_0>" not in vocab.decode(shuffled["inputs"].tolist())
  assert sorted(shuffled["inputs"][:-1]) == sorted(shuffled["targets"][:-1])  # a permutation
  gin.parse_config("pretraining_objective.name = 'nonsense'")
  with pytest.raises(ValueError, match="Unknown objective 'nonsense'"):
    first_example()
