"""Property tests (hypothesis) of the T5 objectives: `t2t.data.noise` and `t2t.data.objectives`.

Any token sequence (empty, one token, long, all EOS, ids at the edges of the vocabulary) must go
through every objective without a crash, within the configured lengths, with sentinels unique and
counting down from the top of the vocabulary, and reassemble into the original where the objective
defines it (span corruption, prefix LM, deshuffling). The TF functions are traced once
(`tf.function` with an input signature), so each example costs one graph call.
"""
import functools

import numpy as np
import pytest
import seqio
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from t2t.data import noise, objectives

BASE = 40      # ids 0 (pad), 1 (EOS), 2 (unk), 3..39 words
EXTRA = 10     # sentinels 49 (<extra_id_0>) down to 40 (<extra_id_9>)
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class IdVocabulary(seqio.Vocabulary):
  """Ids are their own tokens: `BASE` ordinary ids (pad 0, EOS 1, unk 2) and `EXTRA` sentinels."""

  def __init__(self, base: int = BASE, extra_ids: int = EXTRA):
    self._base = base
    super().__init__(extra_ids=extra_ids)

  @property
  def eos_id(self):
    return 1

  @property
  def unk_id(self):
    return 2

  @property
  def _base_vocab_size(self):
    return self._base

  def _encode(self, s):
    return [int(t) for t in s.split()]

  def _decode(self, ids):
    return " ".join(str(i) for i in ids)

  def _encode_tf(self, s):
    return tf.strings.to_number(tf.strings.split(s), tf.int32)

  def _decode_tf(self, ids):
    return tf.strings.reduce_join(tf.strings.as_string(ids), separator=" ")


VOCAB = IdVocabulary()
SIZE = VOCAB.vocab_size
FEATURES = {k: seqio.Feature(VOCAB, add_eos=True) for k in ("inputs", "targets")}

# Token ids of ordinary text, biased towards the edges (pad, EOS, the id below the sentinels).
token_ids = st.one_of(st.sampled_from([0, 1, 2, BASE - 1]), st.integers(0, BASE - 1))
sequences = st.one_of(
    st.lists(token_ids, max_size=300),
    st.integers(0, 600).map(lambda n: [1] * n),  # all EOS
    st.just([]), st.lists(token_ids, min_size=1, max_size=1))
densities = st.floats(0.01, 0.99)
mean_lengths = st.floats(1.0, 40.0)
seeds = st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**31 - 1))
SIG_TOKENS = tf.TensorSpec([None], tf.int32)
SIG_MASK = tf.TensorSpec([None], tf.bool)
SIG_SEED = tf.TensorSpec([2], tf.int64)


# --- traced once ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _spans_mask_fn(density: float, mean: float):
  @tf.function(input_signature=[tf.TensorSpec([], tf.int32), SIG_SEED, SIG_SEED])
  def fn(length, s0, s1):
    return noise.random_spans_noise_mask(length, density, [s0, s1], mean)
  return fn


@tf.function(input_signature=[SIG_TOKENS, SIG_MASK])
def _span_inputs_targets(tokens, mask):
  return (noise.noise_span_to_unique_sentinel(tokens, mask, VOCAB),
          noise.noise_spans_to_targets(tokens, mask, VOCAB, final_sentinel=False),
          noise.noise_spans_to_targets(tokens, mask, VOCAB, final_sentinel=True))


@tf.function(input_signature=[tf.TensorSpec([], tf.int32), SIG_SEED])
def _prefix_mask(length, seed):
  return noise.random_prefix_noise_mask(length, 0.5, [seed])


@tf.function(input_signature=[SIG_TOKENS, SIG_MASK, SIG_SEED])
def _other_token_fns(tokens, mask, seed):
  return {
      "drop": noise.drop_noise_tokens(tokens, mask),
      "dropped": noise.drop_nonnoise_tokens(tokens, mask),
      "shuffled": noise.shuffle_tokens(tokens, mask, VOCAB, seeds=[seed]),
      "bert": noise.bert_style_inputs(tokens, mask, VOCAB, [seed]),
      "mass": noise.bert_style_inputs(tokens, mask, VOCAB, [seed], random_token_rate=0.0),
  }


def _seed(pair):
  return tf.constant(pair, tf.int64)


def _reassemble(inputs, targets):
  """The original tokens from span-corruption inputs and targets; checks the sentinels on the way."""
  sentinels_in = [t for t in inputs if t >= BASE]
  assert sentinels_in == list(range(SIZE - 1, SIZE - 1 - len(sentinels_in), -1))  # unique, descending
  spans, current = [], None
  for t in targets:
    if t >= BASE:
      current = []
      spans.append(current)
    else:
      assert current is not None, "targets must start with a sentinel"
      current.append(t)
  out = []
  for t in inputs:
    out.extend(spans[SIZE - 1 - t] if t >= BASE else [t])
  return out


# --- length arithmetic ----------------------------------------------------------------------


@FUZZ
@given(st.integers(0, 5000), densities, mean_lengths)
@example(1, 0.15, 3.0)
@example(2, 0.99, 40.0)
def test_python_and_tf_span_counts_agree(length, density, mean):
  """The length arithmetic counts what the TF mask will corrupt (mask's length < 2: no noise)."""
  expected = noise.random_spans_counts_py(length, density, mean)
  if length >= 2:
    got = tuple(int(v) for v in noise.random_spans_counts(length, density, mean))
    assert got == expected
    assert 1 <= expected[1] <= expected[0] < length and expected[1] <= length - expected[0]
  else:
    assert expected == (0, 0)


@FUZZ
@given(st.integers(2, 2048), densities, mean_lengths)
@example(20, 0.15, 30.0)   # regression: inputs came out 21 long (one span more than counted)
@example(2, 0.5, 3.0)      # regression: raw 2 gave 3 inputs tokens for inputs_length 2
@example(64, 0.9, 1.0)     # regression: inputs filled only 13 of 64 (spans cannot touch)
@example(512, 0.15, 3.0)
def test_random_spans_helper_never_overfills(inputs_length, density, mean):
  """Every segment up to the helper's raw length fits inputs_length and the targets length."""
  raw, targets_length = objectives.random_spans_helper(inputs_length, density, mean)
  assert raw >= 1
  for length in {1, max(1, raw // 2), raw - 1, raw} - {0}:
    num_noise, num_spans = noise.random_spans_counts_py(length, density, mean)
    assert length - num_noise + num_spans + 1 <= inputs_length
    assert num_noise + num_spans + 1 <= targets_length
  # The largest raw length: one more token would not fit.
  num_noise, num_spans = noise.random_spans_counts_py(raw + 1, density, mean)
  assert raw + 1 - num_noise + num_spans + 1 > inputs_length or (
      density == 0.5 and num_noise + num_spans + 1 > inputs_length)


# --- masks and token functions ----------------------------------------------------------------


# (density, mean) pairs the mask is traced for (a trace costs ~1 s; the counts are fuzzed above).
MASK_SETTINGS = [(0.15, 3.0), (0.5, 3.0), (0.99, 1.0), (0.01, 40.0), (0.3, 1.5)]


@FUZZ
@given(st.integers(0, 700), st.sampled_from(MASK_SETTINGS), seeds, seeds)
@example(0, (0.15, 3.0), (0, 0), (0, 1))
@example(1, (0.15, 3.0), (0, 0), (0, 1))
@example(2, (0.99, 1.0), (0, 0), (0, 1))
def test_random_spans_mask_has_the_counted_noise(length, setting, seed0, seed1):
  density, mean = setting
  mask = _spans_mask_fn(density, mean)(length, _seed(seed0), _seed(seed1)).numpy()
  assert mask.shape == (length,) and mask.dtype == bool
  num_noise, num_spans = noise.random_spans_counts_py(length, density, mean)
  starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
  assert mask.sum() == num_noise and len(starts) == num_spans
  if length:
    assert not mask[0]


@FUZZ
@given(sequences, st.data())
@example([], None)
@example([1], None)
@example([BASE - 1] * 5, None)
def test_span_corruption_reassembles_the_original(tokens, data):
  """Inputs + targets of any noise mask give back the tokens; sentinels count down, in order."""
  n = len(tokens)
  mask = (data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) if data is not None
          else [i % 2 == 1 for i in range(n)])
  num_spans = int(np.sum(np.diff(np.concatenate([[0], np.array(mask, int)])) == 1)) if n else 0
  t, m = tf.constant(tokens, tf.int32, [n]), tf.constant(mask, tf.bool, [n])
  if num_spans + 1 > EXTRA:  # more spans than sentinels: a clear error, not wrong ids
    with pytest.raises(tf.errors.InvalidArgumentError, match="more sentinels than the vocabulary"):
      _span_inputs_targets(t, m)
    return
  inputs, targets, closed = (x.numpy().tolist() for x in _span_inputs_targets(t, m))
  assert len(inputs) == n - sum(mask) + num_spans
  assert len(targets) == sum(mask) + num_spans and closed == targets + [SIZE - 1 - num_spans]
  assert _reassemble(inputs, targets) == tokens
  assert _reassemble(inputs, closed) == tokens


@FUZZ
@given(sequences, seeds, st.data())
@example([], (0, 0), None)
@example([1], (0, 0), None)
@example([0, BASE - 1], (3, 4), None)
def test_prefix_shuffle_bert_mass_token_functions(tokens, seed, data):
  n = len(tokens)
  t = tf.constant(tokens, tf.int32, [n])
  prefix = _prefix_mask(n, _seed(seed)).numpy()
  assert prefix.shape == (n,)
  out = {k: v.numpy().tolist() for k, v in _other_token_fns(t, tf.constant(prefix), _seed(seed)).items()}
  # Prefix LM: inputs + targets = the tokens, both non-empty from two tokens on.
  assert out["drop"] + out["dropped"] == tokens
  if n >= 2:
    assert out["drop"] and out["dropped"]
  # Deshuffling: a permutation of the tokens.
  assert sorted(out["shuffled"]) == sorted(tokens)
  # BERT / MASS on an arbitrary mask: only masked positions change, to <M> or an ordinary id.
  mask = (data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) if data is not None
          else [True] * n)
  out = {k: v.numpy().tolist() for k, v in _other_token_fns(t, tf.constant(mask, tf.bool, [n]),
                                                            _seed(seed)).items()}
  low, high = noise.random_token_range(VOCAB)
  mask_id = noise.default_mask_id(VOCAB)
  for name in ("bert", "mass"):
    assert len(out[name]) == n
    for orig, new, noised in zip(tokens, out[name], mask):
      if not noised:
        assert new == orig
      else:
        assert new == mask_id or (name == "bert" and low <= new < high)


# --- the seqio preprocessors end to end -------------------------------------------------------

# Building a tf.data pipeline costs seconds and iterating one ~0.1 s, so each objective gets one
# pipeline (inputs_length 9: many segments, a short last one), fed by the drawn documents.
INPUTS_LENGTH = 9
OBJECTIVES = ("span_corruption", "iid_noise_replace_spans", "iid_noise_drop_tokens", "bert_style",
              "mass_style", "deshuffling", "prefix_lm", "full_lm")
_DOCS: list = []  # what the pipelines read next


def _lengths(name):
  if name == "span_corruption":
    return objectives.span_corruption_feature_lengths(INPUTS_LENGTH, 0.15, 3.0, True)
  if name == "iid_noise_replace_spans":  # 8 raw tokens: at most 4 spans + the final sentinel
    return {"inputs": INPUTS_LENGTH, "targets": 2 * INPUTS_LENGTH}
  return {"inputs": INPUTS_LENGTH, "targets": INPUTS_LENGTH}


@functools.lru_cache(maxsize=None)
def _pipeline(name):
  ds = tf.data.Dataset.from_generator(
      lambda: ({"targets": np.array(d, np.int32)} for d in _DOCS),
      output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  kwargs = {"final_sentinel": True} if name == "span_corruption" else {}
  with seqio.utils.map_seed_manager(0):
    return getattr(objectives, name)(ds, _lengths(name), FEATURES,
                                     merge_examples_to_reduce_padding=False, **kwargs)


@pytest.mark.parametrize("name", OBJECTIVES)
@settings(FUZZ, max_examples=8)
@given(docs=st.lists(sequences, min_size=1, max_size=12))
@example(docs=[[], [5], [1] * 9, [0, BASE - 1] * 9])
def test_objectives_fit_their_lengths_and_lose_nothing(name, docs):
  """Every objective, any documents: outputs within the lengths (EOS excluded), no token lost."""
  _DOCS[:] = docs
  examples = [{k: v.tolist() for k, v in ex.items()} for ex in _pipeline(name).as_numpy_iterator()]
  lengths = _lengths(name)
  stream = [t for d in docs for t in d]
  assert all(len(ex["targets"]) <= lengths["targets"] - 1 for ex in examples)
  assert all(len(ex["inputs"]) <= lengths["inputs"] - 1 for ex in examples)
  if name in ("span_corruption", "iid_noise_replace_spans"):
    assert [t for ex in examples for t in _reassemble(ex["inputs"], ex["targets"])] == stream
  elif name == "prefix_lm":
    assert [t for ex in examples for t in ex["inputs"] + ex["targets"]] == stream
  elif name == "iid_noise_drop_tokens":
    assert sorted(t for ex in examples for t in ex["inputs"] + ex["targets"]) == sorted(stream)
  elif name == "full_lm":
    assert [t for ex in examples for t in ex["targets"]] == stream
    assert all(ex["inputs"] == [] for ex in examples)
  else:  # deshuffling, bert_style, mass_style: the targets are the original text
    assert [t for ex in examples for t in ex["targets"]] == stream
    assert all(len(ex["inputs"]) == len(ex["targets"]) for ex in examples)
  if name == "deshuffling":
    assert all(sorted(ex["inputs"]) == sorted(ex["targets"]) for ex in examples)


@pytest.mark.parametrize("inputs_length", [2, 3, 4])
def test_objectives_at_the_smallest_lengths(inputs_length):
  """Tiny feature lengths: a clear error (prefix LM) or outputs that fit, never a crash."""
  docs = [[5], [1, 1, 1], [BASE - 1] * 7]
  ds = lambda: tf.data.Dataset.from_generator(
      lambda: ({"targets": np.array(d, np.int32)} for d in docs),
      output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  lengths = objectives.span_corruption_feature_lengths(inputs_length, 0.5, 3.0, True)
  out = list(objectives.span_corruption(ds(), lengths, FEATURES, noise_density=0.5,
                                        final_sentinel=True).as_numpy_iterator())
  assert out and all(len(ex["inputs"]) <= inputs_length - 1 for ex in out)
  assert all(len(ex["targets"]) <= lengths["targets"] - 1 for ex in out)
  if inputs_length < 3:
    with pytest.raises(ValueError, match="prefix_lm needs feature lengths >= 3"):
      objectives.prefix_lm(ds(), {"inputs": inputs_length}, FEATURES)
