"""T5 objectives: length arithmetic, masks, pure token functions, and span corruption on BBC text."""
import functools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t2t.data import noise, objectives, sources, vocabularies

SENTENCE = "Thank you for inviting me to your party last week ."


class WordVocabulary(seqio.Vocabulary):
  """Whitespace word vocabulary: pad 0, eos 1, unk 2, then the words, then `extra_ids` sentinels.

  Decodes sentinel j as `<S_j>` (the paper writes <X>, <Y>, <Z>) and `mask_word` as `<M>`.
  """

  def __init__(self, words, extra_ids=0):
    self._words = ["<pad>", "</s>", "<unk>"] + list(words)
    self._index = {w: i for i, w in enumerate(self._words)}
    super().__init__(extra_ids=extra_ids)

  @property
  def eos_id(self):
    return 1

  @property
  def unk_id(self):
    return 2

  @property
  def _base_vocab_size(self):
    return len(self._words)

  def _encode(self, s):
    return [self._index.get(w, 2) for w in s.split()]

  def _decode(self, ids):
    return " ".join(self._words[i] for i in ids)

  def decode(self, ids):
    ids = [int(i) for i in ids]
    out = []
    for i in ids:
      if i >= self._base_vocab_size:
        out.append(f"<S_{self.vocab_size - 1 - i}>")
      else:
        out.append(self._words[i])
    return " ".join(out)

  def _encode_tf(self, s):
    raise NotImplementedError("not needed by these tests")

  def _decode_tf(self, ids):
    raise NotImplementedError("not needed by these tests")


def _words_vocab(extra_ids=100):
  return WordVocabulary(sorted(set(SENTENCE.split())), extra_ids=extra_ids)


def _mask(*noise_words):
  """Mask over SENTENCE marking the listed word positions (by index) as noise."""
  mask = np.zeros(len(SENTENCE.split()), bool)
  mask[list(noise_words)] = True
  return tf.constant(mask)


# --- length arithmetic -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "noise_density, mean_span, raw, targets",
    [(0.15, 3, 568, 114), (0.10, 3, 548, 74), (0.25, 3, 614, 206), (0.5, 3, 766, 512),
     (0.15, 2, 552, 126), (0.15, 5, 581, 105), (0.15, 10, 591, 99)])
def test_random_spans_helper_reproduces_the_paper(noise_density, mean_span, raw, targets):
  assert objectives.random_spans_helper(512, noise_density, mean_span) == (raw, targets)


def test_feature_lengths_count_the_final_sentinel():
  assert objectives.span_corruption_feature_lengths(512) == {"inputs": 512, "targets": 114}
  assert objectives.span_corruption_feature_lengths(512, final_sentinel=True)["targets"] == 115


@pytest.mark.parametrize("kwargs, match", [
    ({"noise_density": 0.0}, "noise_density must be in"),
    ({"noise_density": 1.0}, "noise_density must be in"),
    ({"noise_density": -0.2}, "noise_density must be in"),
    ({"mean_noise_span_length": 0.5}, "mean_noise_span_length must be >= 1"),
    ({"inputs_length": 1}, "inputs_length must be >= 2"),
])
def test_random_spans_helper_rejects_bad_input(kwargs, match):
  args = {"inputs_length": 512, "noise_density": 0.15, "mean_noise_span_length": 3.0, **kwargs}
  with pytest.raises(ValueError, match=match):
    objectives.random_spans_helper(**args)


# --- masks ------------------------------------------------------------------------------------


def _runs(mask):
  """Lengths of the runs of True in a boolean vector."""
  padded = np.concatenate([[False], mask, [False]]).astype(int)
  edges = np.flatnonzero(np.diff(padded))
  return edges[1::2] - edges[::2]


def test_random_spans_mask_has_exact_counts_and_random_lengths():
  lengths = []
  for i in range(100):
    mask = noise.random_spans_noise_mask(568, 0.15, [(i, 1), (i, 2)]).numpy()
    runs = _runs(mask)
    assert mask.sum() == 85 and len(runs) == 28 and not mask[0]
    lengths.extend(runs)
  # Span lengths are random (not all 3): a spread of values, mean exactly 85 / 28.
  assert np.mean(lengths) == pytest.approx(85 / 28)
  assert len(set(lengths)) >= 5 and np.std(lengths) > 1


def test_random_spans_mask_edge_cases_and_determinism():
  assert noise.random_spans_noise_mask(0, 0.15, [(1, 1), (1, 2)]).numpy().tolist() == []
  assert noise.random_spans_noise_mask(1, 0.15, [(1, 1), (1, 2)]).numpy().tolist() == [False]
  assert noise.random_spans_noise_mask(2, 0.15, [(1, 1), (1, 2)]).numpy().tolist() == [False, True]
  a = noise.random_spans_noise_mask(100, 0.3, [(5, 1), (5, 2)]).numpy()
  b = noise.random_spans_noise_mask(100, 0.3, [(5, 1), (5, 2)]).numpy()
  c = noise.random_spans_noise_mask(100, 0.3, [(6, 1), (6, 2)]).numpy()
  assert (a == b).all() and (a != c).any()
  with pytest.raises(ValueError, match="noise_density"):
    noise.random_spans_noise_mask(10, 1.5, [(1, 1), (1, 2)])


# --- pure token functions (the paper's Table 3 rows that span corruption builds on) --------------


def test_replace_spans_row_of_table_3():
  vocab = _words_vocab()
  tokens = tf.constant(vocab.encode(SENTENCE))
  mask = _mask(2, 3, 8)  # "for inviting", "last"
  inputs = noise.noise_span_to_unique_sentinel(tokens, mask, vocab)
  targets = noise.noise_spans_to_targets(tokens, mask, vocab)
  assert vocab.decode(inputs.numpy()) == "Thank you <S_0> me to your party <S_1> week ."
  assert vocab.decode(targets.numpy()) == "<S_0> for inviting <S_1> last <S_2>"
  assert inputs.numpy()[2] == vocab.vocab_size - 1  # <extra_id_0> is the top id


def test_random_spans_row_of_table_3():
  vocab = _words_vocab()
  tokens = tf.constant(vocab.encode(SENTENCE))
  mask = _mask(2, 3, 4, 6, 7, 8)  # "for inviting me", "your party last"
  inputs = noise.noise_span_to_unique_sentinel(tokens, mask, vocab)
  targets = noise.noise_spans_to_targets(tokens, mask, vocab)
  assert vocab.decode(inputs.numpy()) == "Thank you <S_0> to <S_1> week ."
  assert vocab.decode(targets.numpy()) == "<S_0> for inviting me <S_1> your party last <S_2>"
  no_final = noise.noise_spans_to_targets(tokens, mask, vocab, final_sentinel=False)
  assert vocab.decode(no_final.numpy()) == "<S_0> for inviting me <S_1> your party last"


def test_library_noise_runs_without_autograph_a_users_function_still_gets_it():
  """t2t.data.noise is marked graph-only (AutoGraph skips it, which saves start-up time): it must
  build its graph with AutoGraph off. A user's own mask function passed to `denoise` is still
  converted: its Python `if` on a tensor works inside the tf.data map."""
  vocab = _words_vocab()
  seeds = [tf.constant([1, 2]), tf.constant([3, 4])]
  graph_mask = tf.function(lambda n: noise.random_spans_noise_mask(n, 0.3, seeds), autograph=False)
  assert (graph_mask(tf.constant(11)).numpy() == noise.random_spans_noise_mask(11, 0.3, seeds)
          .numpy()).all()
  assert graph_mask(tf.constant(11)).numpy().sum() == 3  # round(11 * 0.3) noise tokens

  def first_half_when_long(length, noise_density, seeds):
    del noise_density, seeds
    if length > 4:  # a tensor inside tf.data: only AutoGraph turns this into a tf.cond
      return tf.range(length) < length // 2
    return tf.zeros([length], tf.bool)

  features = {"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)}
  docs = tf.data.Dataset.from_tensors({"targets": tf.constant(vocab.encode(SENTENCE))})
  with seqio.utils.map_seed_manager(0):
    out = objectives.denoise(docs, features, 0.5, first_half_when_long,
                             noise.noise_span_to_unique_sentinel, noise.noise_spans_to_targets)
  example = next(out.as_numpy_iterator())
  assert vocab.decode(example["inputs"]) == "<S_0> to your party last week ."
  assert vocab.decode(example["targets"]) == "<S_0> Thank you for inviting me <S_1>"


def test_more_spans_than_sentinels_is_a_clear_error():
  vocab = _words_vocab(extra_ids=2)
  tokens = tf.constant(vocab.encode(SENTENCE))
  mask = _mask(1, 3, 5)  # three spans, two sentinels
  with pytest.raises(tf.errors.InvalidArgumentError, match="extra_ids=2"):
    noise.noise_span_to_unique_sentinel(tokens, mask, vocab)
  with pytest.raises(tf.errors.InvalidArgumentError, match="extra_ids=2"):
    noise.noise_spans_to_targets(tokens, _mask(1, 3), vocab)  # 2 spans + final sentinel


# --- span corruption on real text ----------------------------------------------------------------


def _bbc_features():
  vocab = vocabularies.bbc_vocabulary()
  return vocab, {"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)}


def _token_dataset(docs):
  return tf.data.Dataset.from_tensor_slices(tf.ragged.constant(docs, dtype=tf.int32)).map(
      lambda t: {"targets": t})


def _split_example(inputs, targets, vocab):
  """Checks the sentinels of one example and returns (raw tokens, noise-span lengths).

  Accepts both target formats: with a closing sentinel (`final_sentinel=True`) and without
  (the reference code's, the default).
  """
  first_sentinel = vocab.vocab_size - vocab.extra_ids
  in_sentinels = [t for t in inputs if t >= first_sentinel]
  tgt_sentinels = [t for t in targets if t >= first_sentinel]
  k = len(in_sentinels)
  assert in_sentinels == [vocab.vocab_size - 1 - j for j in range(k)]  # unique, in order
  closing = tgt_sentinels == in_sentinels + [vocab.vocab_size - 1 - k]
  assert closing or tgt_sentinels == in_sentinels  # same order, optionally + closing
  if closing:
    assert targets[-1] == vocab.vocab_size - 1 - k
    targets = targets[:-1]
  assert not targets or targets[0] == vocab.vocab_size - 1
  spans, current = [], None
  for t in targets:
    if t >= first_sentinel:
      current = []
      spans.append(current)
    else:
      current.append(t)
  raw = []
  for t in inputs:
    raw.extend(spans[vocab.vocab_size - 1 - t] if t >= first_sentinel else [t])
  return raw, [len(s) for s in spans]


def test_span_corruption_statistics_over_2000_examples():
  vocab, features = _bbc_features()
  docs = [vocab.encode(a["text"]) for a in sources.bbc_articles("train")[:640]]
  lengths = objectives.span_corruption_feature_lengths(128, final_sentinel=True)
  with seqio.utils.map_seed_manager(17):
    ds = objectives.span_corruption(_token_dataset(docs), lengths, features, final_sentinel=True)
  examples = list(ds.take(2000).as_numpy_iterator())
  assert len(examples) == 2000
  raw_all, span_lengths = [], []
  for ex in examples:
    inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
    assert len(inputs) <= lengths["inputs"] - 1 and len(targets) <= lengths["targets"] - 1
    raw, spans = _split_example(inputs, targets, vocab)
    raw_all.extend(raw)
    span_lengths.extend(spans)
  full = sum(len(ex["inputs"]) == lengths["inputs"] - 1 for ex in examples)
  assert full >= 0.95 * len(examples)  # concatenation fills the inputs
  # Nothing lost or reordered: the examples decode back to the concatenated documents.
  concatenated = [t for d in docs for t in d]
  assert raw_all == concatenated[:len(raw_all)]
  density = sum(span_lengths) / len(raw_all)
  assert abs(density - 0.15) <= 0.01
  assert np.mean(span_lengths) == pytest.approx(3.0, rel=0.05)
  assert np.std(span_lengths) > 1  # random lengths, not fixed 3s
  text = vocab.decode(examples[0]["inputs"].tolist())
  assert "<extra_id_0>" in text and "<extra_id_1>" in text


def test_span_corruption_default_is_the_reference_format_at_512_114():
  vocab, features = _bbc_features()
  docs = [vocab.encode(a["text"]) for a in sources.bbc_articles("train")[:200]]
  with seqio.utils.map_seed_manager(5):
    ds = objectives.span_corruption(_token_dataset(docs), {"inputs": 512}, features)
  examples = list(ds.take(40).as_numpy_iterator())
  first_sentinel = vocab.vocab_size - vocab.extra_ids
  for ex in examples[:-1]:  # every full segment fills 511 + EOS / 113 + EOS exactly
    assert len(ex["inputs"]) == 511 and len(ex["targets"]) == 113
    assert ex["targets"][-1] < first_sentinel  # ends with the last span, no closing sentinel
    assert sum(t >= first_sentinel for t in ex["targets"]) == sum(
        t >= first_sentinel for t in ex["inputs"])


def test_span_corruption_is_deterministic_under_seqio_seeds():
  vocab, features = _bbc_features()
  docs = [vocab.encode(a["text"]) for a in sources.bbc_articles("validation")[:20]]

  def run(seed):
    with seqio.utils.map_seed_manager(seed):
      ds = objectives.span_corruption(_token_dataset(docs), {"inputs": 64}, features)
    return [ex["inputs"].tolist() for ex in ds.as_numpy_iterator()]

  first = run(3)
  assert first == run(3) and first != run(4)


def test_span_corruption_edge_cases_are_documented_behaviour():
  vocab, features = _bbc_features()
  docs = [[], [7], [5, 6]]
  with seqio.utils.map_seed_manager(1):
    ds = objectives.span_corruption(
        _token_dataset(docs), {"inputs": 64}, features, merge_examples_to_reduce_padding=False,
        final_sentinel=True)
  examples = [(ex["inputs"].tolist(), ex["targets"].tolist()) for ex in ds.as_numpy_iterator()]
  # Empty document dropped; a one-token document is kept uncorrupted; two tokens: one kept, one noise.
  assert examples == [([7], [8099]), ([5, 8099], [8099, 6, 8098])]


@pytest.mark.parametrize("kwargs, match", [
    ({"noise_density": 1.0}, "noise_density"),
    ({"mean_noise_span_length": 0.0}, "mean_noise_span_length"),
    ({"sequence_length": None}, r"sequence_length\['inputs'\]"),
    ({"sequence_length": {"inputs": 4096}}, "needs 227 sentinels .* extra_ids=100"),
])
def test_span_corruption_rejects_bad_settings(kwargs, match):
  _, features = _bbc_features()
  args = {"sequence_length": {"inputs": 64}, **kwargs}
  with pytest.raises(ValueError, match=match):
    objectives.span_corruption(_token_dataset([[5, 6, 7]]), output_features=features, **args)


# --- every row of the paper's Table 3, with a word-level vocabulary and fixed masks ----------------


def _table_vocab():
  return WordVocabulary(sorted(set(SENTENCE.split()) | {"apple"}), extra_ids=100)


def _words(vocab, ids, mask_id=None):
  text = vocab.decode(ids.numpy() if hasattr(ids, "numpy") else ids)
  return text.replace("<S_0>", "<M>") if mask_id is not None else text


def test_table_3_prefix_lm_row():
  vocab = _table_vocab()
  tokens = tf.constant(vocab.encode(SENTENCE))
  mask = _mask(4, 5, 6, 7, 8, 9, 10)  # the suffix after "inviting"
  assert _words(vocab, noise.drop_noise_tokens(tokens, mask)) == "Thank you for inviting"
  assert _words(vocab, noise.drop_nonnoise_tokens(tokens, mask)) == "me to your party last week ."


def test_table_3_bert_and_mass_rows():
  vocab = _table_vocab()
  tokens = tf.constant(vocab.encode(SENTENCE))
  mask_id = noise.default_mask_id(vocab)
  assert mask_id == vocab.vocab_size - 1
  mask = _mask(2, 3, 8)
  random_at_last = _mask(8)
  apples = tf.fill(tf.shape(tokens), vocab.encode("apple")[0])
  bert = noise.mask_noise_tokens(tokens, mask, mask_id, random_at_last, apples)
  assert _words(vocab, bert, mask_id) == "Thank you <M> <M> me to your party apple week ."
  mass = noise.mask_noise_tokens(tokens, mask, mask_id)
  assert _words(vocab, mass, mask_id) == "Thank you <M> <M> me to your party <M> week ."
  assert _words(vocab, noise.keep_all_tokens(tokens, mask)) == SENTENCE  # both targets


def test_table_3_deshuffling_row():
  # The paper's row has a stray "fun" that is not in the source sentence (an erratum); the
  # permutation of the eleven real words is reproduced.
  vocab = _table_vocab()
  words = SENTENCE.split()
  shuffled = "party me for your to . last you inviting week Thank".split()
  permutation = tf.constant([words.index(w) for w in shuffled])
  tokens = tf.constant(vocab.encode(SENTENCE))
  assert _words(vocab, noise.permute_tokens(tokens, permutation)) == " ".join(shuffled)
  assert _words(vocab, noise.keep_all_tokens(tokens, None)) == SENTENCE


def test_table_3_iid_rows():
  vocab = _table_vocab()
  tokens = tf.constant(vocab.encode(SENTENCE))
  mask = _mask(2, 3, 8)
  assert _words(vocab, noise.noise_span_to_unique_sentinel(tokens, mask, vocab)) == (
      "Thank you <S_0> me to your party <S_1> week .")
  assert _words(vocab, noise.noise_spans_to_targets(tokens, mask, vocab)) == (
      "<S_0> for inviting <S_1> last <S_2>")
  assert _words(vocab, noise.drop_noise_tokens(tokens, mask)) == "Thank you me to your party week ."
  assert _words(vocab, noise.drop_nonnoise_tokens(tokens, mask)) == "for inviting last"


# --- the random parts of the other objectives --------------------------------------------------


def test_bert_style_inputs_mix_mask_and_random_tokens():
  vocab = vocabularies.bbc_vocabulary()
  tokens = tf.constant(vocab.encode(" ".join(a["text"] for a in sources.bbc_articles("test")[:40])))
  mask = noise.iid_noise_mask(tf.size(tokens), 0.15, [(3, 4)])
  corrupted = noise.bert_style_inputs(tokens, mask, vocab, [(5, 6)]).numpy()
  tokens, mask = tokens.numpy(), mask.numpy()
  assert abs(mask.mean() - 0.15) < 0.01 and len(tokens) > 10000
  assert (corrupted[~mask] == tokens[~mask]).all()
  masked = corrupted[mask] == vocab.vocab_size - 1
  assert 0.87 < masked.mean() < 0.93  # 90% <M>, 10% random
  random_ids = corrupted[mask][~masked]
  assert random_ids.min() >= 3 and random_ids.max() < 8000  # ordinary pieces only
  assert len(set(random_ids.tolist())) > 0.8 * len(random_ids)  # spread over the vocabulary


def test_prefix_and_shuffle_generators():
  splits = set()
  for i in range(50):
    mask = noise.random_prefix_noise_mask(10, 0.5, [(i, 0)]).numpy()
    split = int((~mask).sum())
    assert 1 <= split <= 9 and (mask == (np.arange(10) >= split)).all()
    splits.add(split)
  assert len(splits) >= 7
  assert not noise.random_prefix_noise_mask(1, 0.5, [(1, 0)]).numpy().any()
  tokens = tf.range(3, 23)
  shuffled = noise.shuffle_tokens(tokens, None, None, [(1, 2)]).numpy()
  assert sorted(shuffled) == list(range(3, 23)) and shuffled.tolist() != list(range(3, 23))
  assert (noise.shuffle_tokens(tokens, None, None, [(1, 2)]).numpy() == shuffled).all()


def test_iid_mask_rate_and_bad_inputs():
  mask = noise.iid_noise_mask(20000, 0.15, [(9, 9)]).numpy()
  assert abs(mask.mean() - 0.15) < 0.01
  with pytest.raises(ValueError, match="noise_density"):
    noise.iid_noise_mask(10, 0.0, [(1, 1)])
  with pytest.raises(ValueError, match="extra_ids >= 1"):
    noise.default_mask_id(WordVocabulary(["a"], extra_ids=0))
  with pytest.raises(ValueError, match="random_token_rate"):
    noise.bert_style_inputs(tf.constant([3]), tf.constant([True]), _table_vocab(), [(1, 1)],
                            random_token_rate=1.5)


# --- every objective as a preprocessor inside a real seqio Task ----------------------------------


def _bbc_text_task(name, objective, features):
  articles = sources.bbc_articles("validation")[:12]

  def dataset_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({"text": [a["text"] for a in articles]})

  seqio.TaskRegistry.remove(name)
  return seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(dataset_fn, splits=["validation"]),
      preprocessors=[
          functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
          seqio.preprocessors.tokenize, objective, seqio.preprocessors.append_eos_after_trim],
      output_features=features)


def _strip_eos(ids):
  ids = ids.tolist()
  assert ids[-1] == 1
  return ids[:-1]


@pytest.mark.parametrize("objective", [
    "span_corruption", "iid_noise_replace_spans", "iid_noise_drop_tokens", "bert_style",
    "mass_style", "deshuffling", "prefix_lm", "full_lm"])
def test_every_objective_runs_in_a_seqio_task(objective):
  vocab, _ = _bbc_features()
  features = {"inputs": seqio.Feature(vocab, add_eos=True, required=False),
              "targets": seqio.Feature(vocab, add_eos=True)}
  task = _bbc_text_task(f"t2t_test_{objective}", getattr(objectives, objective), features)
  lengths = {"inputs": 48, "targets": 48}
  try:
    examples = list(task.get_dataset(lengths, split="validation", shuffle=False, seed=11)
                    .as_numpy_iterator())
  finally:
    seqio.TaskRegistry.remove(task.name)
  assert len(examples) > 20
  mask_id, first_sentinel = vocab.vocab_size - 1, vocab.vocab_size - vocab.extra_ids
  for ex in examples:
    inputs, targets = _strip_eos(ex["inputs"]), _strip_eos(ex["targets"])
    assert len(inputs) <= 47 and len(targets) <= 47
    if objective in ("bert_style", "mass_style"):
      assert len(inputs) == len(targets)
      changed = [i != t for i, t in zip(inputs, targets)]
      assert all(i == mask_id or objective == "bert_style" for i, c in zip(inputs, changed) if c)
    elif objective == "deshuffling":
      assert sorted(inputs) == sorted(targets)
    elif objective in ("prefix_lm", "iid_noise_drop_tokens"):
      assert all(t < first_sentinel for t in inputs + targets)
      if objective == "prefix_lm":
        assert inputs and targets
    elif objective == "full_lm":
      assert inputs == [] and targets
    else:  # sentinel objectives
      _split_example(inputs, targets, vocab)
  if objective == "prefix_lm":
    assert len({len(_strip_eos(ex["inputs"])) for ex in examples}) > 5  # random split points
  if objective in ("iid_noise_drop_tokens", "bert_style", "mass_style"):
    noisy = sum(len(_strip_eos(ex["targets"])) for ex in examples)
    total = sum(len(_strip_eos(ex["inputs"])) for ex in examples)
    if objective == "iid_noise_drop_tokens":
      assert 0.12 < noisy / (noisy + total) < 0.18
    else:
      changed = sum((ex["inputs"] != ex["targets"]).sum() for ex in examples)
      assert 0.12 < changed / total < 0.18


def test_text_formats_for_decoder_only_and_prefix_lm():
  ds = tf.data.Dataset.from_tensors(
      {"inputs": "translate English to German: That is good.", "targets": "Das ist gut."})
  (prefix,) = objectives.prefix_lm_text_format(ds).as_numpy_iterator()
  assert prefix["inputs"].decode() == "translate English to German: That is good. target:"
  assert prefix["targets"].decode() == "Das ist gut."
  (lm,) = objectives.decoder_only_text_format(ds).as_numpy_iterator()
  assert set(lm) == {"targets"}
  assert lm["targets"].decode() == "translate English to German: That is good. target: Das ist gut."


def test_objective_knobs_are_gin_configurable():
  import gin
  vocab, features = _bbc_features()
  docs = [vocab.encode(a["text"]) for a in sources.bbc_articles("validation")[:30]]
  gin.clear_config()
  try:
    gin.parse_config("span_corruption.noise_density = 0.5\n"
                     "span_corruption.mean_noise_span_length = 10.0")
    with seqio.utils.map_seed_manager(0):
      ds = objectives.span_corruption(_token_dataset(docs), {"inputs": 128}, features)
    spans = []
    for ex in ds.as_numpy_iterator():
      spans.extend(_split_example(ex["inputs"].tolist(), ex["targets"].tolist(), vocab)[1])
    assert np.mean(spans) == pytest.approx(10.0, rel=0.1)
  finally:
    gin.clear_config()
