"""T5's standard mixtures of the TFDS-backed tasks (T5 paper §3.5), registered on import.

| mixture | tasks | rate |
|---|---|---|
| glue_proportional | GLUE training tasks (+ glue_mnli_mismatched, evaluation only) | ``benchmark_rate`` |
| superglue_proportional | the eight SuperGLUE training tasks | ``benchmark_rate`` |
| supervised_mix | GLUE + SuperGLUE + SQuAD + CNN/DM + WMT En-De/En-Fr/En-Ro | ``all_mix_rate`` |
| all_mix | supervised_mix's tasks + c4_span_corruption (unsupervised) | ``all_mix_rate`` |
| all_mix_leave_out_<task> | all_mix without <task> (leave-one-out, §3.5.3) | ``all_mix_rate`` |

Both rates are gin-configurable and read when data is drawn, so gin sets them after import::

    all_mix_rate.maximum = 524288        # K = 2**19 (examples-proportional)
    all_mix_rate.temperature = 2.0       # temperature-scaled
    all_mix_rate.strategy = "equal"      # equal mixing
    all_mix_rate.unlabeled_size = 710000 # T5's final Small mixture: C4's artificial size

WNLI is never trained on and the diagnostic sets (AX, AX-b, AX-g) are test-only, so none is mixed.
"""
from __future__ import annotations

from collections.abc import Mapping

import gin
import seqio

import tasks.c4
import tasks.cnn_dailymail
import tasks.glue
import tasks.squad
import tasks.superglue
import tasks.wmt
from t2t.data import mixing
from tasks import common

UNLABELED_TASK = tasks.c4.C4_DEFAULT_TASK
GLUE_MIXTURE_TASKS: tuple[str, ...] = tasks.glue.GLUE_EVAL_TASK_NAMES
SUPERGLUE_MIXTURE_TASKS: tuple[str, ...] = tasks.superglue.SUPER_GLUE_TRAINING_TASK_NAMES
SUPERVISED_TASKS: tuple[str, ...] = (
    GLUE_MIXTURE_TASKS + SUPERGLUE_MIXTURE_TASKS + ("squad", "cnn_dailymail") + tasks.wmt.WMT_TASK_NAMES)
ALL_MIX_TASKS: tuple[str, ...] = SUPERVISED_TASKS + (UNLABELED_TASK,)
# Tasks that can be left out (those with a training split).
LEAVE_ONE_OUT_TASKS: tuple[str, ...] = tuple(t for t in SUPERVISED_TASKS if t != "glue_mnli_mismatched")
MIXING_STRATEGIES = ("proportional", "equal")


@gin.configurable
def benchmark_rate(task: seqio.Task, maximum: float | None = None, temperature: float = 1.0,
                   num_examples: Mapping[str, float] | None = None) -> float:
    """The rate of ``glue_proportional`` / ``superglue_proportional``: min(N, K) ** (1 / T).

    Args:
      task: the task being sampled (seqio passes it).
      maximum: K; ``None`` (default) is plain examples-proportional mixing.
      temperature: T.
      num_examples: sizes by task name, overriding the data's split sizes.
    """
    return mixing.examples_proportional(maximum, temperature, num_examples=num_examples)(task)


@gin.configurable
def all_mix_rate(task: seqio.Task, strategy: str = "proportional", maximum: float | None = 2 ** 19,
                 temperature: float = 1.0, unlabeled_size: float | None = None,
                 num_examples: Mapping[str, float] | None = None) -> float:
    """The rate of ``supervised_mix``, ``all_mix`` and the leave-one-out mixtures.

    Args:
      task: the task being sampled (seqio passes it).
      strategy: "proportional" (min(N, K) ** (1 / T)) or "equal".
      maximum: K (T5's best examples-proportional setting, 2**19, by default; ``None``: no cap).
      temperature: T (T5 tried 2, 4, 8 with K = 2**21).
      unlabeled_size: C4's artificial size; ``None`` counts it as K (C4 is far larger than any K).
      num_examples: sizes by task name, overriding the data's split sizes.
    """
    if strategy not in MIXING_STRATEGIES:
        raise ValueError(f"all_mix_rate.strategy must be one of {MIXING_STRATEGIES}, got '{strategy}'.")
    if strategy == "equal":
        return mixing.equal(task)
    sizes = dict(num_examples or {})
    if task.name == UNLABELED_TASK and task.name not in sizes:
        size = unlabeled_size if unlabeled_size is not None else maximum
        if size is None:
            raise ValueError(
                f"'{UNLABELED_TASK}' needs an artificial size: set all_mix_rate.unlabeled_size or .maximum.")
        sizes[task.name] = size
    return mixing.examples_proportional(maximum, temperature, num_examples=sizes)(task)


def register() -> list[seqio.Mixture]:
    """Registers (replacing) every mixture of this module; returns them."""
    mixtures = [
        common.register_mixture("glue_proportional", GLUE_MIXTURE_TASKS, default_rate=benchmark_rate),
        common.register_mixture("superglue_proportional", SUPERGLUE_MIXTURE_TASKS, default_rate=benchmark_rate),
        common.register_mixture("supervised_mix", SUPERVISED_TASKS, default_rate=all_mix_rate),
        common.register_mixture("all_mix", ALL_MIX_TASKS, default_rate=all_mix_rate),
    ]
    mixtures += [mixing.leave_one_out(f"all_mix_leave_out_{name}", ALL_MIX_TASKS, name, all_mix_rate)
                 for name in LEAVE_ONE_OUT_TASKS]
    return mixtures


register()
