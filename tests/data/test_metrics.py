"""Metric functions checked against values worked out by hand."""
import numpy as np
import pytest

from t2t.data import metrics


def test_accuracy_counts_exact_matches_in_percent():
    # 3 of 4 right.
    assert metrics.accuracy(["a", "b", "a", "c"], ["a", "b", "b", "c"]) == {"accuracy": 75.0}


def test_accuracy_invalid_output_is_wrong():
    assert metrics.accuracy(["yes", "no"], ["yes", "maybe"]) == {"accuracy": 50.0}


def test_accuracy_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        metrics.accuracy(["a", "b"], ["a"])


def test_macro_f1_by_hand_with_an_invalid_output():
    # targets a a b c, predictions a b b x (x is not a label).
    # a: tp 1 fp 0 fn 1 -> 2/3; b: tp 1 fp 1 fn 0 -> 2/3; c: tp 0 fp 0 fn 1 -> 0. Mean 4/9.
    result = metrics.macro_f1(["a", "a", "b", "c"], ["a", "b", "b", "x"], labels=["a", "b", "c"])
    assert result["macro_f1"] == pytest.approx(100 * 4 / 9)


def test_macro_f1_invalid_output_is_never_matched_even_when_labels_default_to_targets():
    # The invalid "x" must not become a class of its own that could score: label set is {a, b}.
    # a: tp 1 fp 0 fn 1 -> 2/3; b: tp 1 fp 0 fn 0 -> 1. Mean 5/6.
    result = metrics.macro_f1(["a", "a", "b"], ["a", "x", "b"])
    assert result["macro_f1"] == pytest.approx(100 * 5 / 6)


def test_macro_f1_perfect_and_label_never_seen():
    assert metrics.macro_f1([0, 1, 1], [0, 1, 1])["macro_f1"] == pytest.approx(100.0)
    # Label 2 is in neither targets nor predictions: it scores 0, as in scikit-learn.
    assert metrics.macro_f1([0, 1], [0, 1], labels=[0, 1, 2])["macro_f1"] == pytest.approx(200 / 3)


def test_binary_f1_of_positive_class():
    # positive 1: tp 2 (idx 0, 3), fp 1 (idx 1), fn 1 (idx 2 predicted invalid) -> 4 / 6.
    result = metrics.f1([1, 0, 1, 1, 0], [1, 1, -1, 1, 0], positive_label=1)
    assert result["f1"] == pytest.approx(100 * 4 / 6)


def test_mcc_binary_by_hand():
    # tp 1, fn 1, tn 2, fp 0: (1*2 - 0*1) / sqrt(1 * 2 * 2 * 3) = 2 / sqrt(12).
    result = metrics.matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0])
    assert result["mcc"] == pytest.approx(100 * 2 / 12 ** 0.5)


def test_mcc_invalid_output_is_a_class_no_target_has():
    # Multi-class form: s 4, c 3, t {1: 2, 0: 2}, p {1: 1, x: 1, 0: 2}; cross = 2 + 0 + 4 = 6;
    # (3*4 - 6) / sqrt((16 - 6) * (16 - 8)) = 6 / sqrt(80).
    result = metrics.matthews_corrcoef([1, 1, 0, 0], [1, "x", 0, 0])
    assert result["mcc"] == pytest.approx(100 * 6 / 80 ** 0.5)
    assert metrics.matthews_corrcoef([1, 1, 0], [1, 1, 0])["mcc"] == pytest.approx(100.0)
    # All predictions one class: undefined, reported as 0.
    assert metrics.matthews_corrcoef([1, 0, 1], [1, 1, 1])["mcc"] == 0.0


def test_pearson_and_spearman_by_hand():
    # Centered: t (-1, 0, 1), p (-1, 1, 0): sum of products 1, norms sqrt(2) each -> 0.5.
    assert metrics.pearson_corrcoef([1, 2, 3], [1, 3, 2])["pearson_corrcoef"] == pytest.approx(50.0)
    # Ranks of p = (1, 2, 4, 3): Pearson of ranks = 4 / 5.
    result = metrics.spearman_corrcoef([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 40.0, 30.0])
    assert result["spearman_corrcoef"] == pytest.approx(80.0)
    # Ties take the average rank: p ranks (1.5, 1.5, 3, 4) vs (1, 2, 3, 4):
    # centered (-1, -1, .5, 1.5) . (-1.5, -.5, .5, 1.5) = 4.5; norms sqrt(4.5) sqrt(5).
    result = metrics.spearman_corrcoef([1, 2, 3, 4], [0.4, 0.4, 2.0, 3.0])
    assert result["spearman_corrcoef"] == pytest.approx(100 * 4.5 / (4.5 * 5) ** 0.5)


def test_squad_normalisation():
    assert metrics.normalize_answer("The  Cat, sat.") == "cat sat"
    assert metrics.normalize_answer("An apple a day") == "apple day"
    assert metrics.normalize_answer("Carbon-Monoxide") == "carbonmonoxide"


def test_squad_em_and_f1_max_over_answers():
    # Example 1 matches its first answer after normalisation: EM 1, F1 1.
    # Example 2: prediction tokens {paris, france}, answer {paris}: P 1/2, R 1 -> F1 2/3, EM 0.
    result = metrics.squad([["carbon monoxide", "CO"], ["Paris"]],
                           ["the carbon monoxide", "paris france"])
    assert result["em"] == pytest.approx(50.0)
    assert result["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_record_takes_best_entity_mention():
    # Answers "Obama" and "Barack Obama": "Barack Obama" is an exact match of the second.
    result = metrics.record([["Obama", "Barack Obama"], ["Trump"]], ["Barack Obama", "Biden"])
    assert result == {"em": pytest.approx(50.0), "f1": pytest.approx(50.0)}


def test_multirc_f1a_over_answers_and_em_per_question():
    targets = [{"group": "q1", "value": "True"}, {"group": "q1", "value": "False"},
               {"group": "q1", "value": "True"}, {"group": "q2", "value": "False"},
               {"group": "q2", "value": "True"}]
    predictions = ["True", "False", "True", "True", "True"]
    # q1 all right, q2 one wrong -> EM 1/2. F1a: tp 3, fp 1, fn 0 -> 6/7.
    result = metrics.multirc(targets, predictions)
    assert result["em"] == pytest.approx(50.0)
    assert result["f1a"] == pytest.approx(100 * 6 / 7)
    with pytest.raises(ValueError, match="'group' and 'value'"):
        metrics.multirc(["True"], ["True"])


def test_rouge_by_hand():
    # Unigrams: 2 of 3 shared -> 2/3; bigrams {the cat, cat sat} vs {the cat, cat ran} -> 1/2;
    # LCS "the cat" -> 2/3.
    result = metrics.rouge(["the cat sat"], ["the cat ran"])
    assert result["rouge1"] == pytest.approx(100 * 2 / 3)
    assert result["rouge2"] == pytest.approx(50.0)
    assert result["rougeL"] == pytest.approx(100 * 2 / 3)


def test_rouge_is_t5s_no_stemming_bootstrap_mid_and_lsum_sentences():
    # No stemming (T5 uses rouge-score's default): "cats" does not match "cat".
    assert metrics.rouge(["the cat sat"], ["the cats sat"])["rouge1"] == pytest.approx(100 * 2 / 3)
    # rougeLsum splits sentences at " . ": target sentences "a b ." / "c d", prediction "c d ." /
    # "a b" -> the union LCS with each reference sentence covers a b and c d: recall 4/4
    # (punctuation is dropped by the tokenizer), precision 4/4; plain rougeL only gets LCS 2 of 4.
    result = metrics.rouge(["a b . c d"], ["c d . a b"])
    assert result["rougeLsum"] == pytest.approx(100.0)
    assert result["rougeL"] == pytest.approx(50.0)
    # Aggregation: the median of 1,000 bootstrap means, seeded -> reproducible and near the mean.
    targets, predictions = ["a b", "a b", "a b", "a b"], ["a b", "a x", "x y", "a b"]
    first = metrics.rouge(targets, predictions)
    assert first == metrics.rouge(targets, predictions)
    assert first["rouge1"] == pytest.approx(100 * (1 + 0.5 + 0 + 1) / 4, abs=3.0)
    state = np.random.get_state()
    metrics.rouge(targets, predictions)
    assert np.array_equal(np.random.get_state()[1], state[1])  # the global state is untouched


def test_bleu_exp_smoothing_by_hand():
    assert metrics.bleu(["the cat sat on the mat"], ["the cat sat on the mat"])["bleu"] == pytest.approx(100.0)
    # Precisions 3/4, 2/3, 1/2 and 0/1 -> exp smoothing makes the last 1 / (2 * 1); equal lengths.
    expected = 100 * (0.75 * (2 / 3) * 0.5 * 0.5) ** 0.25
    assert metrics.bleu(["a b c d"], ["a b c e"])["bleu"] == pytest.approx(expected, abs=1e-3)



def test_glue_and_superglue_average_reproduce_t5_table_16_baseline():
    # T5 Table 16, "Baseline average" row; GLUE 83.28, SuperGLUE 71.36.
    glue = {
        "glue_cola": {"mcc": 53.84}, "glue_sst2": {"accuracy": 92.68},
        "glue_mrpc": {"f1": 92.07, "accuracy": 88.92},
        "glue_stsb": {"pearson_corrcoef": 88.02, "spearman_corrcoef": 87.94},
        "glue_qqp": {"f1": 88.67, "accuracy": 91.56}, "glue_mnli": {"accuracy": 84.24},
        "glue_mnli_mismatched": {"accuracy": 84.57}, "glue_qnli": {"accuracy": 90.48},
        "glue_rte": {"accuracy": 76.28}, "glue_wnli": {"accuracy": 0.0},  # left out
    }
    assert metrics.glue_average(glue) == pytest.approx(83.28, abs=0.005)
    superglue = {
        "super_glue_boolq": {"accuracy": 76.62}, "super_glue_cb": {"macro_f1": 91.22, "accuracy": 91.96},
        "super_glue_copa": {"accuracy": 66.20}, "super_glue_multirc": {"f1a": 66.13, "em": 25.78},
        "super_glue_record": {"f1": 69.05, "em": 68.16}, "super_glue_rte": {"accuracy": 75.34},
        "super_glue_wic": {"accuracy": 68.04}, "super_glue_wsc": {"accuracy": 78.56},
    }
    assert metrics.superglue_average(superglue) == pytest.approx(71.36, abs=0.005)
    del glue["glue_qqp"]
    with pytest.raises(ValueError, match="glue_qqp"):
        metrics.glue_average(glue)


def test_record_scores_each_grouped_query_once():
    # Query (0, 0) appears twice (one example per gold answer), query (0, 1) once.
    # Per query: (0, 0) -> EM 1; (0, 1) -> EM 0, F1 0. Ungrouped it would be EM 2/3.
    targets = [{"group": (0, 0), "answers": ["Obama", "Barack Obama"]},
               {"group": (0, 0), "answers": ["Obama", "Barack Obama"]},
               {"group": (0, 1), "answers": ["Trump"]}]
    result = metrics.record(targets, ["Obama", "Obama", "Biden"])
    assert result == {"em": pytest.approx(50.0), "f1": pytest.approx(50.0)}
