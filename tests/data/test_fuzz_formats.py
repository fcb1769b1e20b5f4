"""Property tests (hypothesis) of the text-to-text formatters in `t2t.data.formats`.

Any text (empty, unicode, separators inside the fields), any label and score must format without a
crash: fields appear in order after their names, labels map to their names (negative ->
UNLABELED), STS-B scores round to 0.2 steps, and WSC marking only adds the two marks.
"""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from t2t.data import formats

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LABELS = ("entailment", "neutral", "contradiction")
texts = st.text(max_size=60)
words = st.lists(st.text(alphabet=st.characters(blacklist_characters=" *", blacklist_categories=("Cs",)),
                         min_size=1, max_size=8), max_size=12)
S = tf.TensorSpec([], tf.string)


@tf.function(input_signature=[S, S])
def _join(a, b):
  return formats.join_fields("mnli", [("hypothesis", a), ("premise", b)])


@tf.function(input_signature=[tf.TensorSpec([], tf.int64)])
def _label(label):
  return formats.label_name(label, LABELS)


@tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
def _stsb(score):
  return formats.stsb_target(score)


@tf.function(input_signature=[S, S, tf.TensorSpec([], tf.int32)])
def _mark(text, span, index):
  return formats.mark_span(text, span, index)


@tf.function(input_signature=[S])
def _passage(passage):
  return formats.record_passage(passage)


@FUZZ
@given(texts, texts)
@example("", "")
@example("premise: a", "hypothesis: b")
def test_join_fields_keeps_every_field_in_order(a, b):
  out = _join(a, b).numpy().decode("utf-8")
  assert out == f"mnli hypothesis: {a} premise: {b}"


@FUZZ
@given(st.integers(-3, len(LABELS) - 1))
def test_label_names_and_unlabeled(label):
  out = _label(label).numpy().decode()
  assert out == (formats.UNLABELED if label < 0 else LABELS[label])


@pytest.mark.parametrize("label", [len(LABELS), 10**6])
def test_label_out_of_range_is_a_clear_error(label):
  """A label the task does not name is bad data: an error naming it, not an index error."""
  with pytest.raises(tf.errors.InvalidArgumentError, match="is not one of the 3 label_names"):
    _label(label)


@FUZZ
@given(st.floats(0.0, 5.0, width=32))
@example(3.25)
@example(2.57)
@example(5.0)
def test_stsb_scores_round_to_fifths(score):
  out = _stsb(score).numpy().decode()
  value = float(out)
  assert len(out.split(".")[1]) == 1
  assert abs(value - score) <= 0.1 + 1e-6
  assert abs(value * 5 - round(value * 5)) < 1e-6


@FUZZ
@given(words, st.integers(-5, 15), st.integers(1, 3))
@example([], 0, 1)
@example(["it."], 0, 1)
def test_mark_span_only_adds_the_two_marks(text_words, index, span_words):
  text = " ".join(text_words)
  start = min(max(index, 0), len(text_words))
  span = " ".join(text_words[start:start + span_words]) or "x"
  out = _mark(text, span, index).numpy().decode("utf-8")
  assert out.count("*") == 2
  if start < len(text_words):  # a span inside the text: marked in place, nothing else changed
    assert out.replace("*", "") == text
    assert f"*{span}*" in out


@FUZZ
@given(texts)
@example("A.\n@highlight\nB\n@highlight\nC")
def test_record_passage_never_fails(passage):
  out = _passage(passage).numpy().decode("utf-8")
  if "@highlight" not in passage:
    assert out == passage


def test_translate_rejects_an_unknown_language():
  ds = tf.data.Dataset.from_tensors({"en": "a", "xx": "b"})
  with pytest.raises(ValueError, match="unknown language code 'xx'"):
    formats.translate(ds, source_language="en", target_language="xx")


def test_record_without_answers_gets_unlabeled():
  """Regression: answers of static shape [0] failed while tracing (tf.cond sliced answers[0])."""
  ds = tf.data.Dataset.from_tensors({"query": "q", "entities": np.array(["e"]), "passage": "p",
                                     "answers": np.zeros([0], np.str_).astype(object)})
  out = next(formats.record(ds).as_numpy_iterator())
  assert out["targets"].decode() == formats.UNLABELED
  ds = tf.data.Dataset.from_tensors({"query": "q", "entities": np.array(["e"]), "passage": "p",
                                     "answers": np.array(["x", "y"], object)})
  assert next(formats.record(ds).as_numpy_iterator())["targets"].decode() == "x"
