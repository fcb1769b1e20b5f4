"""T5's standard mixtures: membership, gin-set rates, leave-one-out, and drawing offline."""
import gin
import pytest
import seqio

import tasks.mixtures as mixtures
from t2t.data import mixing
from tests.tasks.task_checks import offline_tasks

# Hypothetical train sizes for every mixed task (mock data has none): 1000 * (i + 1).
# glue_mnli_mismatched has no training split, so no size.
SIZES = {name: 1000.0 * (i + 1) for i, name in enumerate(mixtures.SUPERVISED_TASKS)
         if name != "glue_mnli_mismatched"}


def _task(name):
    return seqio.get_mixture_or_task(name)


def test_mixture_membership():
    glue = {t.name for t in _task("glue_proportional").tasks}
    assert "glue_mnli_mismatched" in glue and not {"glue_wnli", "glue_ax"} & glue
    assert len(glue) == 9
    assert {t.name for t in _task("superglue_proportional").tasks} == set(mixtures.SUPERGLUE_MIXTURE_TASKS)
    all_mix = {t.name for t in _task("all_mix").tasks}
    assert all_mix == set(mixtures.SUPERVISED_TASKS) | {"c4_span_corruption"}
    assert len(all_mix) == 9 + 8 + 2 + 3 + 1
    for left_out in ("super_glue_rte", "squad", "wmt16_enro"):
        rest = {t.name for t in _task(f"all_mix_leave_out_{left_out}").tasks}
        assert rest == all_mix - {left_out}


def test_all_mix_rates_follow_gin():
    mixture = _task("all_mix")
    try:
        gin.bind_parameter("all_mix_rate.num_examples", SIZES)
        gin.bind_parameter("all_mix_rate.maximum", 5000)
        gin.bind_parameter("all_mix_rate.temperature", 2.0)
        rates = {t.name: mixture.get_rate(t) for t in mixture.tasks}
        assert rates["glue_cola"] == pytest.approx(1000 ** 0.5)
        assert rates["wmt16_enro"] == pytest.approx(5000 ** 0.5)    # capped at K
        assert rates["c4_span_corruption"] == pytest.approx(5000 ** 0.5)  # unlabeled counts as K
        assert rates["glue_mnli_mismatched"] == 0.0  # evaluation only
        gin.bind_parameter("all_mix_rate.unlabeled_size", 710_000)
        gin.bind_parameter("all_mix_rate.maximum", None)
        gin.bind_parameter("all_mix_rate.temperature", 1.0)
        assert mixture.get_rate(_task("c4_span_corruption")) == pytest.approx(710_000)
        gin.bind_parameter("all_mix_rate.strategy", "equal")
        assert {mixture.get_rate(t) for t in mixture.tasks} == {1.0}
        gin.bind_parameter("all_mix_rate.strategy", "temperature")
        with pytest.raises(ValueError, match="strategy must be one of"):
            mixture.get_rate(_task("squad"))
    finally:
        gin.clear_config()


def test_glue_proportional_defaults_to_uncapped_sizes():
    mixture = _task("glue_proportional")
    try:
        gin.bind_parameter("benchmark_rate.num_examples", SIZES)
        proportions = {t.name: mixture.get_rate(t) / mixture.total_rate for t in mixture.tasks}
        expected = mixing.mixing_proportions({n: SIZES.get(n, 0.0) for n in proportions}, lambda n: n)
        assert proportions == pytest.approx(expected)
    finally:
        gin.clear_config()


def test_superglue_proportional_draws_formatted_examples_offline():
    prefixes = ("boolq ", "cb ", "copa ", "multirc ", "record ", "rte ", "wic ", "wsc: ")
    with offline_tasks(num_examples=4):
        gin.bind_parameter("benchmark_rate.num_examples", SIZES)
        mixture = _task("superglue_proportional")
        dataset = mixture.get_dataset({"inputs": 64, "targets": 16}, split="train", seed=0, shuffle=False,
                                      copy_pretokenized=True, try_in_mem_cache=False)
        examples = list(dataset.take(12).as_numpy_iterator())
        assert len(examples) == 12
        for example in examples:
            assert example["inputs_pretokenized"].decode().startswith(prefixes)
