"""C4's cleaning heuristics (T5 paper §2.2), one function per rule, and a seqio preprocessor.

Page rules, in the order ``clean_page`` applies them:

1. remove citation markers such as "[1]", "[citation needed]", "[edit]";
2. keep only lines ending in terminal punctuation (. ! ? or a closing quote);
3. keep only lines with at least 5 words;
4. drop lines containing "javascript";
5. drop lines containing a policy phrase ("terms of use", "privacy policy", "cookie policy",
   "uses cookies", "use of cookies", "use cookies");
6. drop the page if it contains "lorem ipsum" or a curly bracket "{";
7. drop the page if it contains a word from the bad-word list (C4 used the "List of Dirty, Naughty,
   Obscene or Otherwise Bad Words"; t2t ships no list: pass ``bad_words``);
8. drop the page if fewer than 3 sentences remain;
9. drop the page unless it is English with probability >= 0.99 (``langdetect``, an optional
   dependency, as C4 used; or any ``language_probability`` function).

Across pages, ``SpanDeduplicator`` keeps the first occurrence of every three-sentence span and
removes the lines of later pages that repeat one (pages left with < 3 sentences are dropped).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence

import tensorflow as tf

TERMINAL_PUNCTUATION = (".", "!", "?", '"', "\u201d")
MIN_WORDS_PER_LINE = 5
MIN_SENTENCES_PER_PAGE = 3
MIN_LANGUAGE_PROBABILITY = 0.99
POLICY_PHRASES = ("terms of use", "privacy policy", "cookie policy", "uses cookies",
                  "use of cookies", "use cookies")
PAGE_BLOCKERS = ("lorem ipsum", "{")
_CITATION = re.compile(r"\[\d+\]|\[citation needed\]|\[edit\]", re.IGNORECASE)
# A sentence ends at . ! or ? (optionally followed by closing quotes/brackets) before whitespace.
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"'\u201d)\]]))\s+")

LanguageProbability = Callable[[str], float]


# --- Line rules -------------------------------------------------------------------------------

def remove_citations(line: str) -> str:
    """Rule 1: "Paris is big.[1]" -> "Paris is big."."""
    return _CITATION.sub("", line)


def ends_in_terminal_punctuation(line: str) -> bool:
    """Rule 2."""
    return line.rstrip().endswith(TERMINAL_PUNCTUATION)


def has_enough_words(line: str, min_words: int = MIN_WORDS_PER_LINE) -> bool:
    """Rule 3: at least ``min_words`` whitespace-separated words."""
    return len(line.split()) >= min_words


def mentions_javascript(line: str) -> bool:
    """Rule 4 (case-insensitive), e.g. "Please enable JavaScript to view this page."."""
    return "javascript" in line.lower()


def mentions_policy(line: str) -> bool:
    """Rule 5: a cookie / privacy / terms-of-use notice (case-insensitive)."""
    lower = line.lower()
    return any(phrase in lower for phrase in POLICY_PHRASES)


# --- Page rules -------------------------------------------------------------------------------

def has_page_blocker(text: str) -> bool:
    """Rule 6: placeholder text ("lorem ipsum") or code (a "{")."""
    lower = text.lower()
    return any(blocker in lower for blocker in PAGE_BLOCKERS)


def bad_word_pattern(bad_words: Iterable[str]) -> re.Pattern[str] | None:
    """A case-insensitive whole-word (or whole-phrase) regex for the list; ``None`` if empty."""
    words = sorted({w.strip().lower() for w in bad_words if w.strip()}, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in words) + r")(?!\w)", re.IGNORECASE)


def has_bad_word(text: str, pattern: re.Pattern[str] | None) -> bool:
    """Rule 7: whole words only ("ass" does not match "class")."""
    return pattern is not None and pattern.search(text) is not None


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: split after . ! ? (and closing quotes) followed by whitespace."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def langdetect_english_probability(text: str) -> float:
    """Rule 9's detector: langdetect's probability that ``text`` is English (0 if undetectable).

    Raises:
      ImportError: when the optional dependency ``langdetect`` is not installed.
    """
    try:
        import langdetect  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise ImportError(
            "C4 language filtering needs the optional package 'langdetect' "
            "(pip install langdetect, or the extra: pip install 't2t[c4]'), "
            "or pass language_probability=<fn> / min_language_probability=None.") from err
    langdetect.DetectorFactory.seed = 0  # langdetect is randomised; fix it for repeatability
    try:
        return next((l.prob for l in langdetect.detect_langs(text) if l.lang == "en"), 0.0)
    except langdetect.LangDetectException:
        return 0.0


def clean_lines(text: str, min_words: int = MIN_WORDS_PER_LINE) -> list[str]:
    """Rules 1-5: the page's surviving lines, citations removed, stripped."""
    kept = []
    for line in text.splitlines():
        line = remove_citations(line).strip()
        if (ends_in_terminal_punctuation(line) and has_enough_words(line, min_words)
                and not mentions_javascript(line) and not mentions_policy(line)):
            kept.append(line)
    return kept


def clean_page(text: str, *, bad_words: re.Pattern[str] | Iterable[str] | None = None,
               language_probability: LanguageProbability | None = langdetect_english_probability,
               min_language_probability: float | None = MIN_LANGUAGE_PROBABILITY,
               min_words: int = MIN_WORDS_PER_LINE,
               min_sentences: int = MIN_SENTENCES_PER_PAGE) -> str | None:
    """Applies rules 1-9 to one page; returns the cleaned text, or ``None`` if the page is dropped.

    Args:
      text: the page, lines separated by newlines.
      bad_words: a word list (or a pattern from ``bad_word_pattern``); none by default.
      language_probability: ``fn(text) -> P(English)``; default langdetect.
      min_language_probability: threshold of rule 9; ``None`` skips language filtering.
      min_words: rule 3's threshold.
      min_sentences: rule 8's threshold.
    """
    if has_page_blocker(text):
        return None
    pattern = bad_words if isinstance(bad_words, re.Pattern) else bad_word_pattern(bad_words or ())
    if has_bad_word(text, pattern):
        return None
    lines = clean_lines(text, min_words)
    cleaned = "\n".join(lines)
    if len(split_sentences(cleaned)) < min_sentences:
        return None
    if min_language_probability is not None:
        if language_probability is None:
            raise ValueError("min_language_probability is set but language_probability is None.")
        if language_probability(cleaned) < min_language_probability:
            return None
    return cleaned


class SpanDeduplicator:
    """Removes repeated three-sentence spans across pages, keeping each span's first occurrence.

    Call it on pages in order; a later page loses every line that holds part of a span seen
    before, and is dropped (``None``) if fewer than ``min_sentences`` sentences remain. Spans are
    compared after lowercasing and collapsing whitespace; 8-byte hashes are kept in memory, so for
    all of C4 run it in a distributed job keyed by span instead.
    """

    def __init__(self, span_sentences: int = 3, min_sentences: int = MIN_SENTENCES_PER_PAGE):
        if span_sentences < 1:
            raise ValueError(f"span_sentences must be >= 1, got {span_sentences}.")
        self.span_sentences = span_sentences
        self.min_sentences = min_sentences
        self._seen: set[bytes] = set()

    def _key(self, sentences: Sequence[str]) -> bytes:
        text = " ".join(" ".join(s.lower().split()) for s in sentences)
        return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()

    def __call__(self, text: str) -> str | None:
        lines = text.split("\n")
        sentences = [(i, s) for i, line in enumerate(lines) for s in split_sentences(line)]
        n = self.span_sentences
        drop_lines: set[int] = set()
        for start in range(len(sentences) - n + 1):
            window = sentences[start:start + n]
            key = self._key([s for _, s in window])
            if key in self._seen:
                drop_lines.update(i for i, _ in window)
            else:
                self._seen.add(key)
        kept = "\n".join(line for i, line in enumerate(lines) if i not in drop_lines)
        return kept if len(split_sentences(kept)) >= self.min_sentences else None


class PageCleaner:
    """``clean_page`` then (optionally) ``SpanDeduplicator``, as one stateful callable.

    Args:
      deduplicate: remove repeated three-sentence spans across the pages it sees, in order.
      **clean_kwargs: ``clean_page``'s options (bad_words, language_probability, thresholds).
    """

    def __init__(self, *, deduplicate: bool = True, **clean_kwargs):
        bad_words = clean_kwargs.get("bad_words")
        if bad_words is not None and not isinstance(bad_words, re.Pattern):
            clean_kwargs["bad_words"] = bad_word_pattern(bad_words)  # compile once, not per page
        self._clean_kwargs = clean_kwargs
        min_sentences = clean_kwargs.get("min_sentences", MIN_SENTENCES_PER_PAGE)
        self._dedup = SpanDeduplicator(min_sentences=min_sentences) if deduplicate else None

    def __call__(self, text: str) -> str | None:
        cleaned = clean_page(text, **self._clean_kwargs)
        if cleaned is not None and self._dedup is not None:
            cleaned = self._dedup(cleaned)
        return cleaned


def clean_pages(pages: Iterable[str], *, deduplicate: bool = True, **clean_kwargs) -> Iterator[str]:
    """The surviving pages of a stream, cleaned and deduplicated (see ``PageCleaner``)."""
    cleaner = PageCleaner(deduplicate=deduplicate, **clean_kwargs)
    for page in pages:
        cleaned = cleaner(page)
        if cleaned is not None:
            yield cleaned


def c4_clean(dataset: tf.data.Dataset, *, text_key: str = "text", deduplicate: bool = True,
             **clean_kwargs) -> tf.data.Dataset:
    """seqio preprocessor: C4-cleans ``text_key`` of a dataset of scalar string features.

    Dropped pages disappear; the other scalar string features (e.g. ``url``) pass through, the
    rest are dropped. The cleaning runs in Python over the input (``from_generator``), so call it
    eagerly, as seqio does, and cache its output (``seqio.CacheDatasetPlaceholder`` after it)
    for large corpora. Each iteration starts a fresh deduplicator.

    Args:
      dataset: examples with a scalar ``tf.string`` feature ``text_key``.
      text_key: the feature holding the page text.
      deduplicate: also remove repeated three-sentence spans across pages.
      **clean_kwargs: ``clean_page``'s options (bad_words, language_probability, thresholds).
    """
    spec = dataset.element_spec
    if not isinstance(spec, dict) or text_key not in spec:
        raise ValueError(f"c4_clean needs dict examples with a '{text_key}' feature; got {spec}.")
    keys = [k for k, s in spec.items()
            if isinstance(s, tf.TensorSpec) and s.dtype == tf.string and s.shape.rank == 0]
    if text_key not in keys:
        raise ValueError(f"c4_clean: feature '{text_key}' must be a scalar tf.string, got {spec[text_key]}.")

    def generate():
        cleaner = PageCleaner(deduplicate=deduplicate, **clean_kwargs)
        for example in dataset.as_numpy_iterator():
            cleaned = cleaner(example[text_key].decode("utf-8"))
            if cleaned is not None:
                yield {**{k: example[k] for k in keys}, text_key: cleaned.encode("utf-8")}

    return tf.data.Dataset.from_generator(
        generate, output_signature={k: tf.TensorSpec((), tf.string) for k in keys})
