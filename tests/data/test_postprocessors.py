"""Postprocessors on hand-written decoded outputs and numpy evaluation examples."""
import functools

import numpy as np
import pytest

from t2t.data import metrics, postprocessors as pp


def test_classification_keeps_valid_labels_and_marks_the_rest_invalid():
    fn = functools.partial(pp.classification, labels=("entailment", "not_entailment"))
    assert fn(" entailment ") == "entailment"
    assert fn(b"not_entailment") == "not_entailment"
    assert fn("hamburger") == pp.INVALID_LABEL
    assert fn("Entailment") == pp.INVALID_LABEL  # labels are case-sensitive, as the targets
    with pytest.raises(ValueError, match="labels"):
        pp.classification("x")


def test_invalid_classification_outputs_are_one_wrong_class_in_mcc():
    fn = functools.partial(pp.classification, labels=("acceptable", "unacceptable"))
    targets = ["acceptable", "acceptable", "unacceptable", "unacceptable"]
    predictions = [fn(o) for o in ["acceptable", "hamburger", "unacceptable", "pizza"]]
    assert predictions[1] == predictions[3] == pp.INVALID_LABEL
    # s 4, c 2; t {a: 2, u: 2}; p {a: 1, u: 1, invalid: 2}; cross 2 + 2 = 4;
    # (2*4 - 4) / sqrt((16 - 6) * (16 - 8)) = 4 / sqrt(80).
    assert metrics.matthews_corrcoef(targets, predictions)["mcc"] == pytest.approx(100 * 4 / 80 ** 0.5)


def test_stsb_parses_numbers_in_range_only():
    assert pp.stsb("3.2") == pytest.approx(3.2)
    assert pp.stsb(b" 0.0") == 0.0
    assert pp.stsb("5.0") == 5.0
    assert pp.stsb("five") == pp.INVALID_SCORE
    assert pp.stsb("7.4") == pp.INVALID_SCORE
    assert pp.stsb("nan") == pp.INVALID_SCORE


def test_multirc_groups_by_paragraph_and_question():
    example = {"idx/paragraph": np.int32(3), "idx/question": np.int32(7), "idx/answer": np.int32(1)}
    assert pp.multirc("True", example, is_target=True) == {"group": (3, 7), "value": "True"}
    assert pp.multirc("maybe", example) == {"group": (3, 7), "value": pp.INVALID_LABEL}
    with pytest.raises(ValueError, match="idx/question"):
        pp.multirc("True", {"idx/paragraph": 0}, is_target=True)


def test_squad_and_record_targets_are_all_gold_answers():
    example = {"answers": np.array([b"carbon monoxide", b"CO"], dtype=object),
               "idx/passage": np.int32(2), "idx/query": np.int32(5)}
    assert pp.squad("carbon monoxide", example, is_target=True) == ["carbon monoxide", "CO"]
    assert pp.squad(" CO ", example) == "CO"
    assert pp.record("x", example, is_target=True) == {
        "group": (2, 5), "answers": ["carbon monoxide", "CO"]}
    with pytest.raises(ValueError, match="empty 'answers'"):
        pp.squad("x", {"answers": np.array([], dtype=object)}, is_target=True)


@pytest.mark.parametrize("prediction, candidate, expected", [
    ("stable", "The stable", True),           # determiners ignored
    ("the city councilmen", "city councilmen", True),
    ("councilmen", "The city councilmen", True),  # prediction's words subset of candidate's
    ("the city councilmen of Paris", "city councilmen", True),  # or vice versa
    ("fuzzy bunny", "his bunny", True),        # "his" is one of T5's determiners
    ("demonstrators", "The city councilmen", False),
    ("Mark's", "Mark", False),                 # apostrophe on one side only never matches
    ("Bob", "Bob's hat", False),
    ("bob's hat", "Bob's", True),             # apostrophes on both sides: the subset rule
    ("", "Mark", False),
    ("the", "Mark", False),                    # nothing left after cleaning
    ("THE STABLE", "stable", True),           # case ignored
    ("The Stable.", "stable", False),         # punctuation is not (as in T5)
])
def test_wsc_subset_rule(prediction, candidate, expected):
    assert pp.wsc_referent_matches(prediction, candidate) is expected


def test_wsc_postprocessor_turns_referents_into_labels():
    example = {"label": np.int64(0), "targets_pretokenized": b"the demonstrators"}
    assert pp.wsc("", example, is_target=True) == "False"
    assert pp.wsc("demonstrators", example) == "True"
    assert pp.wsc("the councilmen", example) == "False"
    # An empty prediction is invalid, not "False" (which would match this label-0 example).
    assert pp.wsc("", example) == pp.INVALID_LABEL
    assert pp.wsc("  the ", example) == pp.INVALID_LABEL
    with pytest.raises(ValueError, match="targets_pretokenized"):
        pp.wsc("x", {"label": 1})
