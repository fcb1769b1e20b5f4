"""Metric functions in seqio's idiom: ``fn(targets, predictions) -> {name: value}``.

Targets and predictions are the postprocessed outputs of a task (strings, numbers, answer lists
or dicts; see ``t2t.data.postprocessors``), one per evaluation example and in the same order.
Every value is on T5's 0-100 scale: percentages, correlations x 100, BLEU and ROUGE x 100.

A classification output that is not a valid label is simply a value no target has: it never
matches, so it counts as wrong everywhere (in F1 and MCC it is a wrong class of its own).
"""
from __future__ import annotations

import collections
import re
import string
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np


def _check_lengths(targets: Sequence[Any], predictions: Sequence[Any]) -> None:
    """Raises if the two sequences do not pair up one to one."""
    if len(targets) != len(predictions):
        raise ValueError(
            f"targets and predictions must have the same length, got {len(targets)} targets and "
            f"{len(predictions)} predictions.")
    if len(targets) == 0:
        raise ValueError("targets and predictions are empty: there is nothing to score.")


# ---------------------------------------------------------------------------------------------
# Classification.
# ---------------------------------------------------------------------------------------------


def accuracy(targets: Sequence[Hashable], predictions: Sequence[Hashable]) -> dict[str, float]:
    """Percentage of predictions equal to their target."""
    _check_lengths(targets, predictions)
    correct = sum(t == p for t, p in zip(targets, predictions))
    return {"accuracy": 100.0 * correct / len(targets)}


def _f1_of_label(targets: Sequence[Hashable], predictions: Sequence[Hashable],
                 label: Hashable) -> float:
    """F1 (0-1) of one label as the positive class; 0 when it is neither a target nor predicted."""
    tp = sum(t == label and p == label for t, p in zip(targets, predictions))
    fp = sum(t != label and p == label for t, p in zip(targets, predictions))
    fn = sum(t == label and p != label for t, p in zip(targets, predictions))
    denominator = 2 * tp + fp + fn
    return 2.0 * tp / denominator if denominator else 0.0


def f1(targets: Sequence[Hashable], predictions: Sequence[Hashable],
       positive_label: Hashable = 1) -> dict[str, float]:
    """Binary F1 of ``positive_label`` (GLUE's F1 for MRPC and QQP), in percent.

    Anything that is not ``positive_label`` (an invalid output included) is the negative class.
    """
    _check_lengths(targets, predictions)
    return {"f1": 100.0 * _f1_of_label(targets, predictions, positive_label)}


def macro_f1(targets: Sequence[Hashable], predictions: Sequence[Hashable],
             labels: Iterable[Hashable] | None = None) -> dict[str, float]:
    """Unweighted mean over ``labels`` of each label's F1 (SuperGLUE's F1 for CB), in percent.

    Args:
      targets: gold labels, one per example.
      predictions: predicted labels; a value outside ``labels`` is wrong (never a true positive)
        and is not itself scored as a class.
      labels: the label set to average over; defaults to the set of targets. A label that appears
        in neither targets nor predictions scores 0 (scikit-learn's convention, used by T5).
    """
    _check_lengths(targets, predictions)
    label_set = list(dict.fromkeys(labels)) if labels is not None else list(dict.fromkeys(targets))
    if not label_set:
        raise ValueError("macro_f1 needs at least one label; `labels` is empty.")
    scores = [_f1_of_label(targets, predictions, label) for label in label_set]
    return {"macro_f1": 100.0 * float(np.mean(scores))}


def matthews_corrcoef(targets: Sequence[Hashable],
                      predictions: Sequence[Hashable]) -> dict[str, float]:
    """Matthews correlation x 100 (CoLA; the R3 statistic of GLUE's diagnostic set).

    The multi-class form (Gorodkin 2004), which is the usual binary MCC when there are two
    classes: ``(c*s - sum_k p_k*t_k) / sqrt((s^2 - sum_k p_k^2) * (s^2 - sum_k t_k^2))`` with
    ``c`` correct predictions, ``s`` examples, ``p_k``/``t_k`` times class k is predicted/true.
    An invalid output is a class of its own that no target has. 0 when undefined (one class).
    """
    _check_lengths(targets, predictions)
    s = len(targets)
    c = sum(t == p for t, p in zip(targets, predictions))
    t_counts = collections.Counter(targets)
    p_counts = collections.Counter(predictions)
    classes = set(t_counts) | set(p_counts)
    cross = sum(p_counts[k] * t_counts[k] for k in classes)
    denominator = (s * s - sum(v * v for v in p_counts.values())) * (
        s * s - sum(v * v for v in t_counts.values()))
    if denominator == 0:
        return {"mcc": 0.0}
    return {"mcc": 100.0 * (c * s - cross) / float(np.sqrt(denominator))}


# ---------------------------------------------------------------------------------------------
# Regression (STS-B).
# ---------------------------------------------------------------------------------------------


def _as_float_arrays(targets: Sequence[float],
                     predictions: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    _check_lengths(targets, predictions)
    if len(targets) < 2:
        raise ValueError(f"a correlation needs at least 2 examples, got {len(targets)}.")
    return np.asarray(targets, dtype=np.float64), np.asarray(predictions, dtype=np.float64)


def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """Pearson correlation x 100; 0 when either side is constant (correlation undefined)."""
    t, p = _as_float_arrays(targets, predictions)
    tc, pc = t - t.mean(), p - p.mean()
    denominator = np.sqrt((tc * tc).sum() * (pc * pc).sum())
    return {"pearson_corrcoef": 100.0 * float((tc * pc).sum() / denominator) if denominator else 0.0}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """Spearman rank correlation x 100 (Pearson of average ranks, so ties are handled)."""
    import scipy.stats  # Deferred: scipy is only needed by this metric.

    t, p = _as_float_arrays(targets, predictions)
    value = pearson_corrcoef(scipy.stats.rankdata(t), scipy.stats.rankdata(p))["pearson_corrcoef"]
    return {"spearman_corrcoef": value}


# ---------------------------------------------------------------------------------------------
# Extractive QA: SQuAD and ReCoRD.
# ---------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _token_f1(target: str, prediction: str) -> float:
    """F1 (0-1) of the bag of normalised tokens of one prediction against one answer."""
    target_tokens = normalize_answer(target).split()
    prediction_tokens = normalize_answer(prediction).split()
    common = collections.Counter(target_tokens) & collections.Counter(prediction_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(prediction_tokens)
    recall = overlap / len(target_tokens)
    return 2 * precision * recall / (precision + recall)


def squad(targets: Sequence[Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """SQuAD exact match and token F1, each the max over an example's answers, in percent.

    Args:
      targets: for each example, its list of acceptable answers (a bare string is one answer).
      predictions: one answer string per example.
    """
    _check_lengths(targets, predictions)
    em_total, f1_total = 0.0, 0.0
    for answers, prediction in zip(targets, predictions):
        answers = [answers] if isinstance(answers, str) else list(answers)
        if not answers:
            raise ValueError("every SQuAD/ReCoRD target needs at least one answer; got an empty list.")
        normalized = normalize_answer(prediction)
        em_total += max(float(normalize_answer(a) == normalized) for a in answers)
        f1_total += max(_token_f1(a, prediction) for a in answers)
    n = len(targets)
    return {"em": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


def record(targets: Sequence[Sequence[str] | Mapping[str, Any]],
           predictions: Sequence[str]) -> dict[str, float]:
    """ReCoRD: the max over the gold entity mentions of SQuAD's EM and F1, in percent.

    Args:
      targets: per example, its gold answers, or ``{"group": query id, "answers": [...]}``
        (``postprocessors.record``); with groups, each query is scored once, at its first
        example, so a query repeated once per gold answer does not weigh more.
      predictions: one answer string per example.
    """
    _check_lengths(targets, predictions)
    if all(isinstance(t, Mapping) for t in targets):
        first = {}
        for target, prediction in zip(targets, predictions):
            if "group" not in target or "answers" not in target:
                raise ValueError(f"a ReCoRD target dict needs 'group' and 'answers'; got {target!r}.")
            first.setdefault(target["group"], (target["answers"], prediction))
        targets = [answers for answers, _ in first.values()]
        predictions = [prediction for _, prediction in first.values()]
    return squad(targets, predictions)


# ---------------------------------------------------------------------------------------------
# MultiRC: answers grouped by question.
# ---------------------------------------------------------------------------------------------


def multirc(targets: Sequence[Mapping[str, Any]],
            predictions: Sequence[Mapping[str, Any] | Hashable],
            positive_label: Hashable = "True") -> dict[str, float]:
    """MultiRC's F1a (binary F1 over all answer options) and EM (questions with every option right).

    Args:
      targets: ``{"group": question id, "value": label}`` per answer option.
      predictions: the predicted label per option, bare or as ``{"value": label, ...}``.
      positive_label: the label meaning "this answer is correct".

    Returns:
      ``{"f1a": ..., "em": ...}`` in percent; EM is the mean over questions of all-correct.
    """
    _check_lengths(targets, predictions)
    gold, predicted, correct_by_group = [], [], collections.defaultdict(list)
    for target, prediction in zip(targets, predictions):
        if not isinstance(target, Mapping) or "group" not in target or "value" not in target:
            raise ValueError(f"a MultiRC target must be a dict with 'group' and 'value'; got {target!r}.")
        value = prediction["value"] if isinstance(prediction, Mapping) else prediction
        gold.append(target["value"])
        predicted.append(value)
        correct_by_group[target["group"]].append(value == target["value"])
    exact = [all(flags) for flags in correct_by_group.values()]
    return {"f1a": 100.0 * _f1_of_label(gold, predicted, positive_label),
            "em": 100.0 * float(np.mean(exact))}


# ---------------------------------------------------------------------------------------------
# Generation: ROUGE and BLEU.
# ---------------------------------------------------------------------------------------------


def rouge(targets: Sequence[str], predictions: Sequence[str],
          score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeL", "rougeLsum"),
          bootstrap_seed: int = 0) -> dict[str, float]:
    """ROUGE F-measures x 100 exactly as T5 reports them (``t5.evaluation.metrics.rouge``).

    The T5 reference code's choices, kept here so numbers compare with the paper's:
      - rouge-score's ``RougeScorer`` with its defaults: *no* Porter stemming, its own tokenizer
        (lowercase, non-alphanumerics to spaces).
      - every " . " becomes " .\n" in targets and predictions, so ``rougeLsum`` (summary-level
        ROUGE-L, which splits sentences on newlines) sees CNN/DM's highlights as sentences;
        the other scores ignore newlines.
      - aggregation by ``rouge_score.scoring.BootstrapAggregator`` (1,000 resamples of the
        examples), reporting the *mid* (median of the resampled means) F-measure. T5 leaves the
        resampling unseeded; here it draws from ``bootstrap_seed`` (the global numpy state is
        restored afterwards) so that a score is reproducible. The mid is within a hair of the
        plain mean (equal to it for a single example).
    T5's default keys are rouge1, rouge2 and rougeLsum (the paper's "ROUGE-L" is rougeLsum);
    rougeL (ROUGE-L over the whole text) is also reported by default here.
    """
    from rouge_score import rouge_scorer, scoring  # Deferred: only generation tasks need them.

    _check_lengths(targets, predictions)
    scorer = rouge_scorer.RougeScorer(list(score_keys))
    aggregator = scoring.BootstrapAggregator()

    def sentences_on_lines(text: str) -> str:
        return text.replace(" . ", " .\n")

    for target, prediction in zip(targets, predictions):
        aggregator.add_scores(scorer.score(sentences_on_lines(target), sentences_on_lines(prediction)))
    state = np.random.get_state()
    try:
        np.random.seed(bootstrap_seed)
        result = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    return {key: 100.0 * float(result[key].mid.fmeasure) for key in score_keys}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Corpus SacreBLEU as T5 reports it: "exp" smoothing, "intl" tokenisation, cased, one reference."""
    import sacrebleu  # Deferred: only translation tasks need it.

    _check_lengths(targets, predictions)
    score = sacrebleu.corpus_bleu(list(predictions), [list(targets)], smooth_method="exp",
                                  tokenize="intl", lowercase=False, use_effective_order=False)
    return {"bleu": float(score.score)}


# ---------------------------------------------------------------------------------------------
# Benchmark averages.
# ---------------------------------------------------------------------------------------------

# Benchmark task -> the (registered task name, metric) pairs averaged into its one score.
# A task with two metrics (MRPC, QQP, STS-B, CB, MultiRC, ReCoRD) and MNLI's matched/mismatched
# pair count once each, as the benchmarks compute them; WNLI is left out (T5 §2.3).
GLUE_AVERAGE: Mapping[str, Sequence[tuple[str, str]]] = {
    "cola": [("glue_cola", "mcc")],
    "sst2": [("glue_sst2", "accuracy")],
    "mrpc": [("glue_mrpc", "f1"), ("glue_mrpc", "accuracy")],
    "stsb": [("glue_stsb", "pearson_corrcoef"), ("glue_stsb", "spearman_corrcoef")],
    "qqp": [("glue_qqp", "f1"), ("glue_qqp", "accuracy")],
    "mnli": [("glue_mnli", "accuracy"), ("glue_mnli_mismatched", "accuracy")],
    "qnli": [("glue_qnli", "accuracy")],
    "rte": [("glue_rte", "accuracy")],
}
SUPERGLUE_AVERAGE: Mapping[str, Sequence[tuple[str, str]]] = {
    "boolq": [("super_glue_boolq", "accuracy")],
    "cb": [("super_glue_cb", "macro_f1"), ("super_glue_cb", "accuracy")],
    "copa": [("super_glue_copa", "accuracy")],
    "multirc": [("super_glue_multirc", "f1a"), ("super_glue_multirc", "em")],
    "record": [("super_glue_record", "f1"), ("super_glue_record", "em")],
    "rte": [("super_glue_rte", "accuracy")],
    "wic": [("super_glue_wic", "accuracy")],
    "wsc": [("super_glue_wsc", "accuracy")],
}


def benchmark_average(results: Mapping[str, Mapping[str, float]],
                      spec: Mapping[str, Sequence[tuple[str, str]]]) -> float:
    """Mean over the benchmark's tasks of each task's score (the mean of its metrics).

    Args:
      results: ``{registered task name: {metric name: value}}``, e.g. an evaluation's output.
      spec: ``GLUE_AVERAGE``, ``SUPERGLUE_AVERAGE`` or a mapping of the same form.
    """
    task_scores = []
    for benchmark_task, parts in spec.items():
        values = []
        for task_name, metric in parts:
            if task_name not in results or metric not in results[task_name]:
                have = sorted(results.get(task_name, {})) if task_name in results else "no such task"
                raise ValueError(
                    f"the average needs metric '{metric}' of task '{task_name}' (for "
                    f"'{benchmark_task}'); results have: {have}.")
            values.append(float(results[task_name][metric]))
        task_scores.append(float(np.mean(values)))
    return float(np.mean(task_scores))


def glue_average(results: Mapping[str, Mapping[str, float]]) -> float:
    """The GLUE validation score as T5 reports it (WNLI left out; see ``GLUE_AVERAGE``)."""
    return benchmark_average(results, GLUE_AVERAGE)


def superglue_average(results: Mapping[str, Mapping[str, float]]) -> float:
    """The SuperGLUE score as T5 reports it (see ``SUPERGLUE_AVERAGE``)."""
    return benchmark_average(results, SUPERGLUE_AVERAGE)
