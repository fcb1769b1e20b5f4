"""Exact strings of each formatter on hand-written examples (most are the T5 paper's Appendix D)."""
import numpy as np
import pytest
import tensorflow as tf

from t2t.data import formats


def _run(preprocessor, example, **kwargs):
    """Formats one hand-written example through tf.data; returns the numpy output dict."""
    dataset = preprocessor(tf.data.Dataset.from_tensors(example), **kwargs)
    return next(dataset.as_numpy_iterator())


def _all(preprocessor, examples, **kwargs):
    dataset = tf.data.Dataset.from_tensor_slices(examples)
    return list(preprocessor(dataset, **kwargs).as_numpy_iterator())


def test_cola_appendix_d1():
    out = _run(formats.classification,
               {"sentence": "John made Bill master of himself.", "label": np.int64(1), "idx": 0},
               prefix="cola", fields=[("sentence", "sentence")],
               label_names=["unacceptable", "acceptable"])
    assert out["inputs"] == b"cola sentence: John made Bill master of himself."
    assert out["targets"] == b"acceptable"
    assert out["idx"] == 0


def test_mnli_appendix_d3_hypothesis_first():
    out = _run(formats.classification,
               {"premise": "yeah well losing is i mean", "hypothesis": "The St. Louis Cardinals have always won.",
                "label": np.int64(2), "idx": 7},
               prefix="mnli", fields=[("hypothesis", "hypothesis"), ("premise", "premise")],
               label_names=["entailment", "neutral", "contradiction"])
    assert out["inputs"] == (b"mnli hypothesis: The St. Louis Cardinals have always won. "
                             b"premise: yeah well losing is i mean")
    assert out["targets"] == b"contradiction"


def test_copa_appendix_d10():
    out = _run(formats.classification,
               {"premise": "Political violence broke out in the nation.",
                "choice1": "Many citizens relocated to the capitol.",
                "choice2": "Many citizens took refuge in other territories.",
                "question": "effect", "label": np.int64(1), "idx": 3},
               prefix="copa", fields=[("choice1", "choice1"), ("choice2", "choice2"),
                                      ("premise", "premise"), ("question", "question")],
               label_names=["False", "True"])
    assert out["inputs"] == (b"copa choice1: Many citizens relocated to the capitol. choice2: Many "
                             b"citizens took refuge in other territories. premise: Political violence "
                             b"broke out in the nation. question: effect")
    assert out["targets"] == b"True"


def test_unlabeled_test_example_gets_unk_target():
    out = _run(formats.classification, {"sentence": "x", "label": np.int64(-1)},
               prefix="sst2", fields=[("sentence", "sentence")], label_names=["negative", "positive"])
    assert out["targets"] == formats.UNLABELED.encode()
    assert "idx" not in out


def test_multirc_appendix_d11_keeps_grouping_indices():
    out = _run(formats.classification,
               {"paragraph": "Sent 1: Once upon a time.", "question": "Why was Joey surprised?",
                "answer": "There was only pie to eat", "label": np.int64(1),
                "idx": {"paragraph": np.int32(4), "question": np.int32(9), "answer": np.int32(2)}},
               prefix="multirc", fields=[("question", "question"), ("answer", "answer"),
                                         ("paragraph", "paragraph")],
               label_names=["False", "True"])
    assert out["inputs"] == (b"multirc question: Why was Joey surprised? answer: There was only pie "
                             b"to eat paragraph: Sent 1: Once upon a time.")
    assert out["targets"] == b"True"
    assert (out["idx/paragraph"], out["idx/question"], out["idx/answer"]) == (4, 9, 2)


@pytest.mark.parametrize("score, expected", [
    (3.25, b"3.2"),   # Appendix D.8
    (2.57, b"2.6"),   # Section 2.4
    (0.0, b"0.0"), (5.0, b"5.0"), (4.69, b"4.6"), (4.71, b"4.8"), (1.1, b"1.2"), (1.09, b"1.0"),
    (-1.0, b"<unk>"),  # unlabeled test example
])
def test_stsb_rounds_to_nearest_fifth(score, expected):
    out = _run(formats.stsb, {"sentence1": "a", "sentence2": "b", "label": np.float32(score)})
    assert out["targets"] == expected
    assert out["inputs"] == b"stsb sentence1: a sentence2: b"


def test_wsc_appendix_d13_asterisks():
    text = ("The stable was very roomy, with four good stalls; a large swinging window opened into "
            "the yard , which made it pleasant and airy.")
    out = _run(formats.wsc, {"text": text, "span1_index": np.int32(1), "span2_index": np.int32(20),
                             "span1_text": "stable", "span2_text": "it", "label": np.int64(1),
                             "idx": np.int32(0)})
    assert out["inputs"] == (b"wsc: The stable was very roomy, with four good stalls; a large swinging "
                             b"window opened into the yard , which made *it* pleasant and airy.")
    assert out["targets"] == b"stable"
    assert out["label"] == 1


def test_mark_span_multiword_and_trailing_punctuation():
    def mark(text, span, index):
        return formats.mark_span(tf.constant(text), tf.constant(span), tf.constant(index)).numpy()

    assert mark("Mark told Pete many lies about himself.", "himself", 6) == (
        b"Mark told Pete many lies about *himself*.")
    assert mark("The city councilmen refused them", "The city councilmen", 0) == (
        b"*The city councilmen* refused them")
    assert mark("He left", "He", 0) == b"*He* left"


def test_record_format_and_one_example_per_answer():
    example = {
        "passage": "Obama met Merkel.\n@highlight\nThe two leaders talked\n@highlight\nTrade was on the agenda",
        "query": "@placeholder said trade matters",
        "entities": ["Obama", "Merkel"],
        "answers": ["Obama", "Barack Obama"],
        "idx": {"passage": np.int32(5), "query": np.int32(6)},
    }
    out = _run(formats.record, example)
    assert out["inputs"] == (b"record query: @placeholder said trade matters entities: Obama, Merkel "
                             b"passage: Obama met Merkel. The two leaders talked. Trade was on the agenda")
    assert out["targets"] == b"Obama"
    assert list(out["answers"]) == [b"Obama", b"Barack Obama"]
    assert (out["idx/passage"], out["idx/query"]) == (5, 6)

    expanded = list(formats.record(formats.one_example_per_answer(
        tf.data.Dataset.from_tensors(example))).as_numpy_iterator())
    assert [e["targets"] for e in expanded] == [b"Obama", b"Barack Obama"]
    assert all(e["inputs"] == out["inputs"] for e in expanded)


def test_squad_appendix_d15():
    out = _run(formats.squad, {
        "id": "q1", "title": "Oxygen",
        "question": "What does increased oxygen concentrations in the patient's lungs displace?",
        "context": "Increased O2 concentration in the lungs helps to displace carbon monoxide.",
        "answers": {"text": ["carbon monoxide", "carbon monoxide from the heme"],
                    "answer_start": np.array([54, 54], np.int32)}})
    assert out["inputs"] == (b"question: What does increased oxygen concentrations in the patient's "
                             b"lungs displace? context: Increased O2 concentration in the lungs helps "
                             b"to displace carbon monoxide.")
    assert out["targets"] == b"carbon monoxide"
    assert list(out["answers"]) == [b"carbon monoxide", b"carbon monoxide from the heme"]


def test_summarize_and_translate():
    out = _run(formats.summarize, {"article": "marouane fellaini and adnan januzaj ...",
                                   "highlights": "the belgian duo took to the dance floor ."})
    assert out["inputs"] == b"summarize: marouane fellaini and adnan januzaj ..."
    assert out["targets"] == b"the belgian duo took to the dance floor ."
    out = _run(formats.translate, {"en": "Taco Bell said it plans to add 2,000 locations.",
                                   "ro": "Taco Bell a afirmat."},
               source_language="en", target_language="ro")
    assert out["inputs"] == b"translate English to Romanian: Taco Bell said it plans to add 2,000 locations."
    assert out["targets"] == b"Taco Bell a afirmat."
    with pytest.raises(ValueError, match="unknown language code 'xx'"):
        _run(formats.translate, {"en": "a", "xx": "b"}, source_language="en", target_language="xx")


def test_mark_span_out_of_range_index_does_not_fail():
    # A bad index (as in random mock data) marks an empty segment at the end instead of crashing.
    out = formats.mark_span(tf.constant("a b"), tf.constant("zzzzzz"), tf.constant(9)).numpy()
    assert out == b"a b **"
