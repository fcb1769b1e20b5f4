"""Multi-task mixing rates (T5 §3.5.2; Wang et al.'s jiant sampling), usable as seqio Mixture rates.

A seqio rate is a number or ``fn(task) -> float``; seqio normalises the rates of a mixture's tasks
into sampling probabilities. Every strategy here is a pure function of the tasks' sizes N (examples
in their training splits; UniMax needs all of them at once, the others only the task's own) so it
can also be computed without seqio (``mixing_proportions``, ``unimax_proportions``):

| strategy | rate of a task with N examples | constructor |
|---|---|---|
| examples-proportional, cap K | min(N, K) | ``examples_proportional(maximum=K)`` |
| temperature T | min(N, K) ** (1 / T) | ``examples_proportional(maximum=K, temperature=T)`` |
| equal | 1 | ``equal`` |
| jiant f(N) | 1, N, log N, N ** a | ``jiant_rate("uniform" / "proportional" / "log" / "power", a)`` |
| UniMax, budget B, N epochs | min(remaining / tasks left, N * N_i), smallest first | ``unimax(task_names, B, N)`` |

A task with no countable size (an unlabeled corpus) gets an artificial size through
``num_examples={"c4_span_corruption": 710_000}`` (T5's final Small mixture). ``leave_one_out``
registers a mixture without one task (T5's leave-one-out multi-task training). A task without
the split being sized (an evaluation-only task) gets rate 0.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import gin
import seqio

from t2t.data import registry

RateFn = Callable[[seqio.Task], float]
JIANT_KINDS = ("uniform", "proportional", "log", "power")


def task_size(task: seqio.Task, split: str = "train",
              num_examples: Mapping[str, float] | None = None) -> float:
    """N for a task: ``num_examples[task.name]`` if given (an artificial size), else its split size.

    Raises:
      ValueError: when the size is unknown (data not prepared, or a source that cannot count).
    """
    if num_examples and task.name in num_examples:
        return float(num_examples[task.name])
    try:
        size = task.num_input_examples(split)
    except (KeyError, ValueError) as err:
        size, cause = None, err
    else:
        cause = None
    if size is None:
        raise ValueError(
            f"cannot size task '{task.name}' split '{split}' ({cause or 'the source does not count'}); "
            "prepare its data or give its size with num_examples={name: N}.")
    return float(size)


def _has_split(task: seqio.Task, split: str, num_examples: Mapping[str, float] | None) -> bool:
    """False for a task without the split (e.g. an evaluation-only task): its rate is then 0."""
    return bool(num_examples and task.name in num_examples) or split in task.splits


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value}.")


def proportional_rate(num_examples: float, maximum: float | None = None,
                      temperature: float = 1.0) -> float:
    """T5's rate: min(N, K) ** (1 / T). T = 1 is examples-proportional; T -> inf is equal mixing."""
    _check_positive("maximum", maximum)
    _check_positive("temperature", temperature)
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}.")
    capped = min(num_examples, maximum) if maximum is not None else num_examples
    return float(capped) ** (1.0 / temperature)


def examples_proportional(maximum: float | None = None, temperature: float = 1.0, split: str = "train",
                          num_examples: Mapping[str, float] | None = None) -> RateFn:
    """Rate function ``task -> min(N, K) ** (1 / T)`` (examples-proportional / temperature mixing).

    Args:
      maximum: the artificial size limit K (``None``: no cap).
      temperature: T >= 1 flattens the distribution (T5 used 2, 4, 8 with K = 2**21).
      split: the split whose size is N.
      num_examples: sizes by task name overriding the data (artificial sizes).
    """
    _check_positive("maximum", maximum)
    _check_positive("temperature", temperature)

    def rate(task: seqio.Task) -> float:
        if not _has_split(task, split, num_examples):
            return 0.0
        return proportional_rate(task_size(task, split, num_examples), maximum, temperature)

    return rate


def equal(task: seqio.Task) -> float:
    """Equal mixing: every task is sampled with the same probability."""
    del task
    return 1.0


def jiant_weight(num_examples: float, kind: str, exponent: float = 0.75) -> float:
    """Wang et al.'s f(N): "uniform" 1, "proportional" N, "log" log N, "power" N ** exponent."""
    if kind not in JIANT_KINDS:
        raise ValueError(f"unknown jiant sampling kind '{kind}'; choose one of {JIANT_KINDS}.")
    if num_examples < 1:
        raise ValueError(f"num_examples must be >= 1, got {num_examples}.")
    if kind == "uniform":
        return 1.0
    if kind == "proportional":
        return float(num_examples)
    if kind == "log":
        # log 1 = 0 would starve a one-example task entirely; such a task gets a tiny weight instead.
        return max(math.log(num_examples), 1e-6)
    _check_positive("exponent", exponent)
    return float(num_examples) ** exponent


def jiant_rate(kind: str, exponent: float = 0.75, split: str = "train",
               num_examples: Mapping[str, float] | None = None) -> RateFn:
    """Rate function ``task -> f(N)`` for jiant-style sampling (see ``jiant_weight``)."""
    jiant_weight(2.0, kind, exponent)  # validate now, not at the first draw

    def rate(task: seqio.Task) -> float:
        if not _has_split(task, split, num_examples):
            return 0.0
        return jiant_weight(task_size(task, split, num_examples), kind, exponent)

    return rate


def jiant_loss_weights(sizes: Mapping[str, float], kind: str,
                       exponent: float = 0.75) -> dict[str, float]:
    """Loss scaling w_i = f(N_i) / max_j f(N_j) (Wang et al.: use it OR non-uniform sampling)."""
    if not sizes:
        raise ValueError("jiant_loss_weights needs at least one task size.")
    weights = {name: jiant_weight(n, kind, exponent) for name, n in sizes.items()}
    top = max(weights.values())
    return {name: w / top for name, w in weights.items()}


def mixing_proportions(sizes: Mapping[str, float],
                       rate: Callable[[float], float]) -> dict[str, float]:
    """Normalised sampling probabilities ``rate(N_i) / sum_j rate(N_j)`` for sizes by task name.

    ``rate`` takes a size, e.g. ``functools.partial(proportional_rate, maximum=2**19)``.
    """
    rates = {name: float(rate(n)) for name, n in sizes.items()}
    total = sum(rates.values())
    if not total > 0:
        raise ValueError(f"the rates sum to {total}; at least one task needs a positive rate.")
    return {name: r / total for name, r in rates.items()}


def leave_one_out(name: str, task_names: Sequence[str], left_out: str,
                  rate: RateFn | float) -> seqio.Mixture:
    """Registers (replacing) mixture ``name``: ``task_names`` without ``left_out``, at ``rate``.

    T5 §3.5.3: pre-train on this mixture, then fine-tune on the left-out task.
    """
    if left_out not in task_names:
        raise ValueError(f"'{left_out}' is not among the mixture's tasks {list(task_names)}.")
    kept = [t for t in task_names if t != left_out]
    if not kept:
        raise ValueError(f"leaving '{left_out}' out leaves mixture '{name}' empty.")
    seqio.MixtureRegistry.remove(name)
    return seqio.MixtureRegistry.add(name, kept, default_rate=rate)


@gin.configurable
def multitask_mixture(name: str = gin.REQUIRED, task_names: Sequence[str] = gin.REQUIRED,
                      maximum: float | None = None, temperature: float = 1.0) -> str:
    """Registers (replacing) mixture ``name`` of ``task_names`` at examples-proportional rates
    min(N, K) ** (1 / T) (T5 §3.5.2) and returns its name, for a gin value such as
    ``MIXTURE_OR_TASK_NAME = @multitask_mixture()``: jiant's multitask alternative to STILTs
    trains on {intermediate, target} jointly, then on the target alone (t2t.phases)."""
    if not task_names:
        raise ValueError(f"multitask_mixture '{name}' has no tasks.")
    for task_name in task_names:
        registry.get_mixture_or_task(task_name)  # a clear error naming an unknown task
    seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, list(task_names),
                              default_rate=examples_proportional(maximum, temperature))
    return name


def unimax_allocation(sizes: Mapping[str, float], budget: float,
                      max_epochs: float = 1.0) -> dict[str, float]:
    """UniMax budgets (Chung et al. 2023, "UniMax: Fairer and More Effective Language Sampling for
    Large-Scale Multilingual Pretraining", §3, Algorithm 1).

    The total ``budget`` is spread uniformly over the tasks, but no task gets more than
    ``max_epochs`` passes over its data; what a small task cannot use is redistributed to the
    larger ones. Tasks are visited from smallest to largest: the i-th of L gets
    ``min(remaining / (L - i), max_epochs * N_i)`` and ``remaining`` shrinks by that amount.
    Sizes and budget share one unit: the paper counts characters; t2t's tasks count examples
    (give character counts through ``num_examples`` to follow the paper literally).

    Example: sizes [10, 100, 1000], budget 600, 2 epochs -> 20 (capped at 2 x 10), 200 (its
    share 580 / 2 = 290 exceeds 2 x 100) and the remaining 380.

    Args:
      sizes: N_i by task name.
      budget: the total budget B (> 0), in the unit of ``sizes``.
      max_epochs: the epoch cap N (> 0).

    Returns:
      ``{task name: U_i}``; sum U_i = B unless every task is capped (then it is sum N * N_i).
    """
    _check_positive("budget", budget)
    _check_positive("max_epochs", max_epochs)
    if not sizes:
        raise ValueError("unimax needs at least one task size.")
    for name, n in sizes.items():
        if n < 0:
            raise ValueError(f"unimax: task '{name}' has a negative size {n}.")
    # Ties keep the given order (stable sort), so the result does not depend on dict hashing.
    order = sorted(sizes, key=lambda name: sizes[name])
    remaining, allocation = float(budget), {}
    for i, name in enumerate(order):
        share = remaining / (len(order) - i)
        allocation[name] = min(share, max_epochs * float(sizes[name]))
        remaining -= allocation[name]
    return {name: allocation[name] for name in sizes}


def unimax_proportions(sizes: Mapping[str, float], budget: float,
                       max_epochs: float = 1.0) -> dict[str, float]:
    """UniMax sampling probabilities: the ``unimax_allocation`` budgets normalised to sum to 1."""
    allocation = unimax_allocation(sizes, budget, max_epochs)
    total = sum(allocation.values())
    if not total > 0:
        raise ValueError(f"unimax: every task is empty (sizes {dict(sizes)}); nothing to sample.")
    return {name: u / total for name, u in allocation.items()}


def unimax(task_names: Sequence[str], budget: float, max_epochs: float = 1.0,
           split: str = "train", num_examples: Mapping[str, float] | None = None) -> RateFn:
    """Rate function ``task -> U_task`` for a seqio Mixture of ``task_names`` (UniMax, Algorithm 1).

    UniMax needs every task's size at once, so the allocation over ``task_names`` is computed at
    the first call (when seqio asks for the first rate) and reused; a task outside
    ``task_names`` or without the split gets rate 0.
    """
    _check_positive("budget", budget)
    _check_positive("max_epochs", max_epochs)
    names = list(task_names)
    if not names:
        raise ValueError("unimax needs at least one task name.")
    cache: dict[str, float] = {}

    def rate(task: seqio.Task) -> float:
        if not cache:
            sizes = {}
            for name in names:
                member = registry.get_mixture_or_task(name)
                if _has_split(member, split, num_examples):
                    sizes[name] = task_size(member, split, num_examples)
            if not sizes:
                raise ValueError(f"unimax: none of {names} has split '{split}'.")
            cache.update(unimax_allocation(sizes, budget, max_epochs))
        return cache.get(task.name, 0.0)

    return rate


@gin.configurable
def unimax_mixture(name: str = gin.REQUIRED, task_names: Sequence[str] = gin.REQUIRED,
                   budget: float = gin.REQUIRED, max_epochs: float = 1.0,
                   num_examples: Mapping[str, float] | None = None) -> str:
    """Registers (replacing) mixture ``name`` of ``task_names`` at UniMax rates and returns its
    name, for a gin value such as ``MIXTURE_OR_TASK_NAME = @unimax_mixture()``.

    Gin: ``unimax_mixture.budget`` (in examples unless ``num_examples`` gives other units) and
    ``unimax_mixture.max_epochs`` (the paper's N; it found 1-5 epochs best for small languages).
    """
    if not task_names:
        raise ValueError(f"unimax_mixture '{name}' has no tasks.")
    for task_name in task_names:
        registry.get_mixture_or_task(task_name)  # a clear error naming an unknown task
    seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, list(task_names),
                              default_rate=unimax(task_names, budget, max_epochs,
                                                  num_examples=num_examples))
    return name
