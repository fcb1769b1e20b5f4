"""One test per C4 cleaning rule (T5 §2.2), on hand-written pages."""
import importlib.util

import pytest
import tensorflow as tf

from t2t.data import c4_cleaning as c4

GOOD = ("The committee met on Monday to discuss the budget.\n"
        "Members agreed that spending should rise next year.\n"
        "A final vote is expected before the end of the month.")


def _clean(text, **kwargs):
    kwargs.setdefault("min_language_probability", None)  # language is tested on its own
    return c4.clean_page(text, **kwargs)


def test_good_page_survives_unchanged():
    assert _clean(GOOD) == GOOD


def test_rule_citation_markers_removed():
    assert c4.remove_citations("Paris is large.[1] It is old[citation needed]. See [edit] [12]") == (
        "Paris is large. It is old. See  ")
    page = GOOD.replace("budget.", "budget.[3]")
    assert _clean(page) == GOOD  # with "[3]" gone the line ends in "." again and is kept


def test_rule_lines_must_end_in_terminal_punctuation():
    assert c4.ends_in_terminal_punctuation('He said "stop."') and c4.ends_in_terminal_punctuation("Really?")
    assert not c4.ends_in_terminal_punctuation("Click here to read more")
    assert _clean(GOOD + "\nRead more about the budget here") == GOOD


def test_rule_lines_need_five_words():
    assert c4.has_enough_words("one two three four five.") and not c4.has_enough_words("Home. About us.")
    assert _clean("Share this page.\n" + GOOD) == GOOD


def test_rule_javascript_lines_dropped():
    line = "Please enable JavaScript in your browser to continue."
    assert c4.mentions_javascript(line)
    assert _clean(GOOD + "\n" + line) == GOOD


@pytest.mark.parametrize("phrase", c4.POLICY_PHRASES)
def test_rule_policy_lines_dropped(phrase):
    line = f"By continuing you accept that this site applies {phrase.upper()} rules."
    assert c4.mentions_policy(line)
    assert _clean(line + "\n" + GOOD) == GOOD


def test_rule_lorem_ipsum_and_curly_bracket_drop_the_page():
    assert _clean(GOOD + "\nLorem ipsum dolor sit amet, consectetur.") is None
    assert _clean(GOOD.replace("budget.", "budget { x }.")) is None


def test_rule_bad_words_drop_the_page_whole_words_only():
    pattern = c4.bad_word_pattern(["badword", "two words"])
    assert c4.has_bad_word("This has a BadWord in it.", pattern)
    assert c4.has_bad_word("Just say two words now.", pattern)  # a phrase on the list
    assert not c4.has_bad_word("Two wordsmiths met.", pattern)
    assert not c4.has_bad_word("A badwords-free sentence, notbadword.", pattern)
    assert _clean(GOOD + "\nThis last line has the badword in it.", bad_words=["badword"]) is None
    assert _clean(GOOD, bad_words=["badword"]) == GOOD
    assert c4.bad_word_pattern([]) is None


def test_rule_pages_need_three_sentences():
    assert c4.split_sentences('One is here. "Two is here!" Three? Four') == [
        "One is here.", '"Two is here!"', "Three?", "Four"]
    two_sentences = "The committee met on Monday to discuss it. Members agreed on everything there."
    assert _clean(two_sentences) is None
    assert _clean(two_sentences + " A vote follows next week, they said.") is not None


def test_rule_language_probability_threshold():
    seen = []

    def fake_probability(text):
        seen.append(text)
        return 0.995 if "committee" in text else 0.5

    assert c4.clean_page(GOOD, language_probability=fake_probability) == GOOD
    assert seen == [GOOD]  # judged on the cleaned text
    german = GOOD.replace("committee", "Ausschuss")
    assert c4.clean_page(german, language_probability=fake_probability) is None
    assert c4.clean_page(GOOD, language_probability=lambda t: 0.99) == GOOD  # p >= 0.99 kept
    assert c4.clean_page(GOOD, language_probability=lambda t: 0.989) is None
    with pytest.raises(ValueError, match="language_probability is None"):
        c4.clean_page(GOOD, language_probability=None)


def test_rule_language_with_langdetect_or_clear_import_error():
    if importlib.util.find_spec("langdetect") is None:
        with pytest.raises(ImportError, match="pip install langdetect"):
            c4.clean_page(GOOD)
    else:
        assert c4.clean_page(GOOD) == GOOD
        french = ("Le comité s'est réuni lundi pour discuter du budget.\n"
                  "Les membres ont convenu que les dépenses devraient augmenter.\n"
                  "Un vote final est attendu avant la fin du mois prochain.")
        assert c4.clean_page(french) is None


def test_rule_three_sentence_spans_deduplicated_across_pages():
    shared = "Alpha beta gamma delta one. Alpha beta gamma delta two. Alpha beta gamma delta three."
    page_a = "Page A opens with its own sentence here.\n" + shared
    page_b = "Page B has its own first line of words.\nIt also has a second unique line now.\n" \
             "And a third line that is unique too.\n" + shared
    page_c = shared  # nothing left after removing the repeated span -> dropped
    out = list(c4.clean_pages([page_a, page_b, page_c], min_language_probability=None))
    assert out == [page_a, page_b.rsplit("\n", 1)[0]]


def test_c4_clean_preprocessor_keeps_other_features():
    pages = [GOOD, "too short.", GOOD]  # second fails, third is a duplicate of the first
    dataset = tf.data.Dataset.from_tensor_slices({"text": pages, "url": ["u1", "u2", "u3"],
                                                  "length": [1, 2, 3]})
    out = list(c4.c4_clean(dataset, min_language_probability=None).as_numpy_iterator())
    assert out == [{"text": GOOD.encode(), "url": b"u1"}]
    out = list(c4.c4_clean(dataset, deduplicate=False, min_language_probability=None).as_numpy_iterator())
    assert [o["url"] for o in out] == [b"u1", b"u3"]
    with pytest.raises(ValueError, match="'body' feature"):
        c4.c4_clean(dataset, text_key="body")
