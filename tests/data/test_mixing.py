"""Mixing rates: formulas by hand, and empirical task frequencies drawn from a real seqio.Mixture."""
import collections
import functools
import math

import numpy as np
import pytest
import scipy.stats
import seqio
import tensorflow as tf

from t2t.data import mixing

SIZES = {"mix_test_small": 10, "mix_test_medium": 100, "mix_test_large": 1000}
DRAWS = 4000


def _register_in_memory_tasks() -> None:
    """Three tasks whose examples carry their own index as the single target token."""
    features = {"targets": seqio.Feature(seqio.PassThroughVocabulary(size=8), add_eos=False)}
    for index, (name, size) in enumerate(SIZES.items()):
        def dataset_fn(split, shuffle_files, seed=None, _index=index, _size=size):
            del split, shuffle_files, seed
            return tf.data.Dataset.from_tensors({"targets": tf.constant([_index], tf.int32)}).repeat(_size)
        seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(
            name, source=seqio.FunctionDataSource(dataset_fn, splits=["train"],
                                                  num_input_examples={"train": size}),
            preprocessors=[], output_features=features)


def _empirical_frequencies(rate) -> np.ndarray:
    _register_in_memory_tasks()
    seqio.MixtureRegistry.remove("mix_test")
    mixture = seqio.MixtureRegistry.add("mix_test", list(SIZES), default_rate=rate)
    dataset = mixture.get_dataset({"targets": 1}, split="train", seed=123, shuffle=False)
    counts = collections.Counter(int(ex["targets"][0]) for ex in dataset.take(DRAWS).as_numpy_iterator())
    return np.array([counts[i] for i in range(len(SIZES))], dtype=np.float64)


def _expected(rates) -> np.ndarray:
    r = np.asarray(rates, dtype=np.float64)
    return r / r.sum()


@pytest.mark.parametrize("rate, expected", [
    # K = 300: min(N, K) = 10, 100, 300.
    (mixing.examples_proportional(maximum=300), _expected([10, 100, 300])),
    # T = 2, no cap: sqrt(N).
    (mixing.examples_proportional(temperature=2.0), _expected([10 ** 0.5, 100 ** 0.5, 1000 ** 0.5])),
    (mixing.equal, _expected([1, 1, 1])),
    (mixing.jiant_rate("log"), _expected([math.log(10), math.log(100), math.log(1000)])),
    (mixing.jiant_rate("power", exponent=0.5), _expected([10 ** 0.5, 100 ** 0.5, 1000 ** 0.5])),
    # An artificial size for the "unlabeled" large task overrides its real size.
    (mixing.examples_proportional(num_examples={"mix_test_large": 50}), _expected([10, 100, 50])),
    # UniMax, B = 600, 2 epochs: 20 (capped), 200 (capped: 580 / 2 > 2 x 100), the rest 380.
    (mixing.unimax(list(SIZES), budget=600, max_epochs=2), _expected([20, 200, 380])),
])
def test_seqio_mixture_samples_tasks_at_the_formula_rates(rate, expected):
    counts = _empirical_frequencies(rate)
    assert counts.sum() == DRAWS
    assert np.abs(counts / DRAWS - expected).max() < 0.02  # within 2 points
    assert scipy.stats.chisquare(counts, expected * DRAWS).pvalue > 1e-3


def test_proportional_rate_by_hand():
    assert mixing.proportional_rate(5000, maximum=2 ** 12) == 4096.0
    assert mixing.proportional_rate(100, maximum=2 ** 12) == 100.0
    assert mixing.proportional_rate(10_000, temperature=4.0) == pytest.approx(10.0)
    proportions = mixing.mixing_proportions(
        {"a": 1000, "b": 4000}, functools.partial(mixing.proportional_rate, maximum=2000))
    assert proportions == {"a": pytest.approx(1 / 3), "b": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="temperature must be > 0"):
        mixing.examples_proportional(temperature=0)
    with pytest.raises(ValueError, match="maximum must be > 0"):
        mixing.proportional_rate(10, maximum=-1)


def test_jiant_weights_and_loss_scaling():
    assert mixing.jiant_weight(100, "uniform") == 1.0
    assert mixing.jiant_weight(100, "proportional") == 100.0
    assert mixing.jiant_weight(100, "log") == pytest.approx(math.log(100))
    assert mixing.jiant_weight(16, "power", exponent=0.75) == pytest.approx(8.0)
    weights = mixing.jiant_loss_weights({"rte": 2500, "mnli": 400_000}, "power", exponent=0.5)
    assert weights == {"rte": pytest.approx(50 / (400_000 ** 0.5)), "mnli": 1.0}
    with pytest.raises(ValueError, match="unknown jiant sampling kind 'sqrt'"):
        mixing.jiant_rate("sqrt")


def test_unimax_allocation_by_hand():
    # Algorithm 1 of Chung et al. (2023), smallest task first, each capped at N epochs.
    sizes = {"large": 1000, "small": 10, "medium": 100}
    assert mixing.unimax_allocation(sizes, 600, max_epochs=2) == {
        "large": 380.0, "small": 20.0, "medium": 200.0}
    # With room for 2.9 epochs the two larger tasks split the leftover evenly: 580 / 2 each.
    assert mixing.unimax_allocation({"a": 10, "b": 150, "c": 1000}, 600, max_epochs=2) == {
        "a": 20.0, "b": 290.0, "c": 290.0}
    # A budget below every cap is uniform; one above every cap stops at N epochs of each.
    assert mixing.unimax_allocation(sizes, 30, max_epochs=1) == {"large": 10.0, "small": 10.0,
                                                                "medium": 10.0}
    assert mixing.unimax_allocation(sizes, 10 ** 6, max_epochs=3) == {
        "large": 3000.0, "small": 30.0, "medium": 300.0}
    proportions = mixing.unimax_proportions(sizes, 600, max_epochs=2)
    assert proportions == {"large": pytest.approx(380 / 600), "small": pytest.approx(20 / 600),
                           "medium": pytest.approx(200 / 600)}
    with pytest.raises(ValueError, match="max_epochs must be > 0"):
        mixing.unimax_allocation(sizes, 600, max_epochs=0)
    with pytest.raises(ValueError, match="task 'b' has a negative size"):
        mixing.unimax_allocation({"a": 1, "b": -1}, 600)


def test_unimax_mixture_registers_unimax_rates():
    _register_in_memory_tasks()
    name = mixing.unimax_mixture(name="mix_test_unimax", task_names=list(SIZES), budget=600,
                                 max_epochs=2)
    mixture = seqio.get_mixture_or_task(name)
    assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {
        "mix_test_small": 20.0, "mix_test_medium": 200.0, "mix_test_large": 380.0}
    with pytest.raises(ValueError, match="nope"):
        mixing.unimax_mixture(name="x", task_names=["nope"], budget=1)


def test_task_size_errors_and_tasks_without_the_split():
    _register_in_memory_tasks()
    task = seqio.get_mixture_or_task("mix_test_small")
    assert mixing.task_size(task) == 10.0
    with pytest.raises(ValueError, match="num_examples"):
        mixing.task_size(task, split="validation")
    # An evaluation-only task (no train split) takes no share of training.
    assert mixing.examples_proportional(maximum=5)(task) == 5.0
    assert mixing.examples_proportional(split="validation")(task) == 0.0


def test_leave_one_out_registers_the_rest():
    _register_in_memory_tasks()
    mixture = mixing.leave_one_out("mix_test_loo", list(SIZES), "mix_test_medium", mixing.equal)
    assert [t.name for t in mixture.tasks] == ["mix_test_large", "mix_test_small"]
    assert seqio.get_mixture_or_task("mix_test_loo") is mixture
    with pytest.raises(ValueError, match="'nope' is not among"):
        mixing.leave_one_out("mix_test_loo", list(SIZES), "nope", mixing.equal)


def test_multitask_mixture_from_gin_registers_examples_proportional_rates():
  import gin
  from t2t import config
  from t2t.data import limited
  config.parse_gin(["experiments/bbc_multitask_joint.gin"],
                   ["MODEL_DIR = '/unused'", "INITIAL_CHECKPOINT_PATH = None"])
  try:
    name = gin.query_parameter("%MIXTURE_OR_TASK_NAME").scoped_configurable_fn()
  finally:
    gin.clear_config()
  assert name == "bbc_same_topic_and_topic_n200"
  mixture = seqio.get_mixture_or_task(name)
  capped = limited.limited_name("bbc_topic", 200, 0)
  pairs = mixing.task_size(seqio.get_mixture_or_task("bbc_same_topic"))
  # min(N, K) ** (1 / T) with no cap and T = 1: the rates are the training-set sizes.
  assert {t.name: mixture.get_rate(t) for t in mixture.tasks} == {"bbc_same_topic": pairs,
                                                                  capped: 200}
  with pytest.raises(ValueError, match="bbc_topc"):
    mixing.multitask_mixture(name="x", task_names=["bbc_topc"])
