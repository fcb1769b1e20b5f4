"""Tests for t2t.models.decoding: greedy decoding semantics, early stop, cached vs uncached decoding."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio

from t2t.models import decoding
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from tests.models import helpers

VOCAB = 6


def _table_model(next_token: np.ndarray):
  """tokens_to_logits whose arg-max after token t is next_token[row, t]; the cache counts steps."""
  table = jnp.asarray(next_token)

  def tokens_to_logits(tokens, cache):
    rows = jnp.arange(tokens.shape[0])
    logits = jax.nn.one_hot(table[rows, tokens[:, 0]], VOCAB) * 5.0
    return logits, cache + 1
  return tokens_to_logits


def test_greedy_follows_argmax_and_pads_after_eos():
  # Row 0: 0 -> 3 -> 4 -> 1 (EOS). Row 1: 0 -> 2 -> 5 -> 5 -> ... never ends.
  nxt = np.array([[3, 0, 0, 4, 1, 0], [2, 0, 5, 0, 0, 5]])
  out = decoding.greedy_decode(_table_model(nxt), jnp.int32(0), batch_size=2, max_decode_length=6)
  np.testing.assert_array_equal(out, [[3, 4, 1, 0, 0, 0], [2, 5, 5, 5, 5, 5]])


def test_greedy_stops_when_every_row_has_ended():
  nxt = np.array([[1, 0, 0, 0, 0, 0], [4, 0, 0, 0, 1, 0]])  # rows end after 1 and 2 tokens
  calls = []
  base = _table_model(nxt)

  def counted(tokens, cache):
    jax.debug.callback(lambda: calls.append(1))
    return base(tokens, cache)
  out = jax.jit(lambda: decoding.greedy_decode(counted, jnp.int32(0), 2, 10))()
  jax.effects_barrier()
  np.testing.assert_array_equal(out, [[1] + [0] * 9, [4, 1] + [0] * 8])
  assert len(calls) == 2


def test_greedy_rejects_bad_lengths():
  with pytest.raises(ValueError, match='max_decode_length'):
    decoding.greedy_decode(_table_model(np.zeros((1, VOCAB), int)), 0, 1, 0)
  with pytest.raises(ValueError, match='batch_size'):
    decoding.greedy_decode(_table_model(np.zeros((1, VOCAB), int)), 0, 0, 3)


def _uncached_greedy(module, params, enc, length):
  """Reference: re-run the full (causal) decoder on the prefix decoded so far, no cache."""
  apply = jax.jit(lambda e, d: module.apply({'params': params}, e, d, enable_dropout=False))
  dec = np.zeros((enc.shape[0], length), np.int32)  # position t holds the token fed at step t
  done = np.zeros(enc.shape[0], bool)
  out = np.zeros((enc.shape[0], length), np.int32)
  for t in range(length):
    tok = np.asarray(jnp.argmax(apply(enc, jnp.asarray(dec))[:, t], -1)).astype(np.int32)
    tok = np.where(done, 0, tok)
    done |= tok == 1
    out[:, t] = tok
    if t + 1 < length:
      dec[:, t + 1] = tok
  return out


@pytest.fixture(scope='module', params=['v1_0', 'v1_1'])
def memorised(request):
  """A tiny model trained to reproduce one batch: its rows end with EOS at different steps (row 1
  two steps early), which exercises the early stop and the padding after EOS as well as the cache.

  80 Adam steps at 3e-2 leave every target token ahead of the runner-up by > 5 logits. After 40
  the v1.0 model's smallest margin was 3.4 with XLA's default LLVM level and -0.07 at -O0 (the
  losses agree to 1e-6 at first, then the large steps amplify the rounding), so whether the
  decodes matched the batch depended on compiler flags rather than on the code under test."""
  overrides = {} if request.param == 'v1_0' else {'feed_forward_proj': 'gated-gelu',
                                                  'tie_word_embeddings': False}
  module = Transformer(helpers.tiny_config(**overrides))
  batch = helpers.seq2seq_batch(seed=3, dec_len=9)
  model = EncoderDecoderModel(module, seqio.PassThroughVocabulary(48), seqio.PassThroughVocabulary(48))
  params = nn.unbox(helpers.init_variables(module, batch))['params']
  params, _ = helpers.trained_params(model, params, batch, steps=80, learning_rate=3e-2)
  return module, params, batch


def test_cached_decoding_equals_uncached(memorised):
  module, params, batch = memorised
  model = EncoderDecoderModel(module, seqio.PassThroughVocabulary(48), seqio.PassThroughVocabulary(48))
  enc = jnp.asarray(batch['encoder_input_tokens'])
  cached = jax.jit(model.predict_batch, static_argnames='max_decode_length')(
      params, {'encoder_input_tokens': enc}, max_decode_length=9)
  reference = _uncached_greedy(module, params, enc, 9)
  np.testing.assert_array_equal(cached, reference)
  np.testing.assert_array_equal(reference, batch['decoder_target_tokens'])


def test_beam_search_through_the_model_api(memorised):
  """The KV cache is expanded per beam and reordered with the beams: the memorised batch comes back."""
  module, params, batch = memorised
  model = EncoderDecoderModel(module, seqio.PassThroughVocabulary(48), seqio.PassThroughVocabulary(48),
                              decode_fn=decoding.beam_search)
  out = jax.jit(model.predict_batch)(params, batch)
  np.testing.assert_array_equal(out, batch['decoder_target_tokens'])


# ----------------------------------------------------------------------------- sampling
def _fixed_logits(logits_row):
  """tokens_to_logits returning the same logits for every row and step."""
  logits_row = jnp.asarray(logits_row, jnp.float32)
  return lambda tokens, cache: (jnp.broadcast_to(logits_row, (tokens.shape[0],) + logits_row.shape),
                                cache)


def test_temperature_zero_and_top1_are_greedy():
  nxt = np.array([[3, 0, 0, 4, 1, 0], [2, 0, 5, 0, 0, 5]])
  greedy = decoding.greedy_decode(_table_model(nxt), jnp.int32(0), 2, 6)
  for kwargs in ({'temperature': 0.0}, {'topk': 1}):
    sampled = decoding.temperature_sample(_table_model(nxt), jnp.int32(0), 2, 6,
                                          rng=jax.random.PRNGKey(3), **kwargs)
    np.testing.assert_array_equal(sampled, greedy)


def test_sampling_follows_softmax_and_respects_topk():
  logits = np.log(np.array([1e-9, 1e-9, 0.5, 0.3, 0.15, 0.05]))  # never pad / EOS
  sample = jax.jit(lambda rng: decoding.temperature_sample(_fixed_logits(logits), 0, 4000, 1, rng=rng))
  tokens = np.asarray(sample(jax.random.PRNGKey(0)))[:, 0]
  freq = np.bincount(tokens, minlength=VOCAB) / tokens.size
  np.testing.assert_allclose(freq[2:], [0.5, 0.3, 0.15, 0.05], atol=0.03)
  top2 = decoding.temperature_sample(_fixed_logits(logits), 0, 4000, 1, rng=jax.random.PRNGKey(1),
                                     topk=2)
  freq2 = np.bincount(np.asarray(top2)[:, 0], minlength=VOCAB) / 4000
  assert set(np.flatnonzero(freq2)) == {2, 3}
  np.testing.assert_allclose(freq2[2], 0.5 / 0.8, atol=0.03)
  hot = decoding.temperature_sample(_fixed_logits(logits), 0, 4000, 1, rng=jax.random.PRNGKey(2),
                                    temperature=0.5)  # sharper: p ~ p0 ** 2
  freq_hot = np.bincount(np.asarray(hot)[:, 0], minlength=VOCAB) / 4000
  p = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
  np.testing.assert_allclose(freq_hot[2:], p / p.sum(), atol=0.03)
  with pytest.raises(ValueError, match='temperature'):
    decoding.temperature_sample(_fixed_logits(logits), 0, 1, 1, temperature=-1.0)


# ----------------------------------------------------------------------------- beam search
def _prefix_model(table: np.ndarray):
  """tokens_to_logits with logits table[position, last token]; the cache holds per-row positions."""
  table = jnp.asarray(table, jnp.float32)

  def tokens_to_logits(tokens, cache):
    return table[cache['pos'], tokens[:, 0]], {'pos': cache['pos'] + 1, 'step': cache['step'] + 1}
  return tokens_to_logits


def _brute_force_best(table: np.ndarray, length: int, alpha: float):
  """Best EOS-terminated sequence (of at most `length` tokens) under the T5 length penalty."""
  logp = table - np.log(np.exp(table).sum(-1, keepdims=True))
  best = (-np.inf, None)
  frontier = [((), 0.0)]
  for pos in range(length):
    new = []
    for seq, lp in frontier:
      last = seq[-1] if seq else 0
      for tok in range(table.shape[-1]):
        s = lp + logp[pos, last, tok]
        if tok == 1:
          score = s / ((5.0 + pos + 1) / 6.0) ** alpha
          if score > best[0]:
            best = (score, seq + (1,))
        else:
          new.append((seq + (tok,), s))
    frontier = new
  return best


@pytest.mark.parametrize('alpha', [0.0, 0.6, 2.0])
def test_wide_beam_search_finds_the_exact_optimum(alpha):
  rng = np.random.RandomState(0)
  length = 4
  table = rng.normal(size=(length, VOCAB, VOCAB)) * 2.0
  cache = {'pos': jnp.zeros((2,), jnp.int32), 'step': jnp.int32(0)}
  seqs, scores = decoding.beam_search_with_scores(_prefix_model(np.stack([table, table])[0]), cache,
                                                  2, length, beam_size=VOCAB ** (length - 1),
                                                  alpha=alpha)
  best_score, best_seq = _brute_force_best(table, length, alpha)
  for row in range(2):
    np.testing.assert_allclose(scores[row, 0], best_score, rtol=1e-5)
    expected = np.zeros(length, np.int32)
    expected[:len(best_seq)] = best_seq
    np.testing.assert_array_equal(seqs[row, 0], expected)
    assert np.all(np.diff(np.asarray(scores[row])) <= 1e-6)  # best first


def test_beam_search_beats_greedy_when_greedy_is_myopic():
  """Step 0 favours token 2 slightly, but only token 3 leads to a likely EOS."""
  table = np.full((3, VOCAB, VOCAB), -5.0)
  table[0, 0, 2], table[0, 0, 3] = 1.0, 0.8
  table[1, 2, :] = 0.0          # after 2 everything is equally (un)likely
  table[1, 3, 1] = 5.0          # after 3, EOS is almost certain
  table[2, :, 1] = 5.0
  cache = {'pos': jnp.zeros((1,), jnp.int32), 'step': jnp.int32(0)}
  greedy = decoding.greedy_decode(_prefix_model(table), cache, 1, 3)
  beam = decoding.beam_search(_prefix_model(table), cache, 1, 3, beam_size=2, alpha=0.0)
  assert int(greedy[0, 0]) == 2
  np.testing.assert_array_equal(beam, [[3, 1, 0]])
  with pytest.raises(ValueError, match='beam_size'):
    decoding.beam_search(_prefix_model(table), cache, 1, 3, beam_size=0)


def test_beam_of_one_is_greedy(memorised):
  """One beam follows the arg-max path. (Not on every model: a single beam still keeps the best
  EOS-ended candidate seen, which can beat a greedy path that ends late or never; on a confident
  model the greedy sequence is also the best finished one.)"""
  module, params, batch = memorised
  enc = {'encoder_input_tokens': jnp.asarray(batch['encoder_input_tokens'])}
  greedy = EncoderDecoderModel(module, None, None).predict_batch(params, enc, max_decode_length=9)
  beam1 = EncoderDecoderModel(module, None, None, decode_fn=functools.partial(
      decoding.beam_search, beam_size=1, alpha=0.0)).predict_batch(params, enc, max_decode_length=9)
  np.testing.assert_array_equal(beam1, greedy)


def test_per_row_start_tokens():
  """Decoder-only models start each row from its own prompt token ([b] start_id)."""
  nxt = np.array([[0, 0, 4, 0, 1, 0], [0, 0, 0, 5, 0, 1]])  # row 0: 2 -> 4 -> EOS; row 1: 3 -> 5 -> EOS
  start = jnp.array([2, 3])
  greedy = decoding.greedy_decode(_table_model(nxt), jnp.int32(0), 2, 3, start_id=start)
  np.testing.assert_array_equal(greedy, [[4, 1, 0], [5, 1, 0]])
  beam = decoding.beam_search(_table_model(nxt), jnp.int32(0), 2, 3, start_id=start, beam_size=2,
                              alpha=0.0)
  np.testing.assert_array_equal(beam, greedy)


def test_beam_search_does_not_reorder_cache_leaves_the_step_leaves_unchanged():
  """A leaf the step returns as the same array (encoder keys/values) is not gathered each step."""
  gathered = []
  real_reorder = decoding._reorder

  def spy(x, rows):
    gathered.append(x.shape)
    return real_reorder(x, rows)

  def tokens_to_logits(tokens, cache):
    logits = jnp.zeros((tokens.shape[0], 5)).at[:, 2].set(1.0) + cache['static'][:, :1]
    return logits, dict(cache, step=cache['step'] + tokens)

  cache = dict(static=jnp.arange(2.0)[:, None] * jnp.ones((2, 7)), step=jnp.zeros((2, 1), jnp.int32))
  import unittest.mock
  with unittest.mock.patch.object(decoding, '_reorder', spy):
    out = decoding.beam_search(tokens_to_logits, cache, 2, 3, beam_size=2)
  assert out.shape == (2, 3)
  assert gathered == [(4, 1)]  # only the changing leaf, traced once in the loop body


def test_first_argmax_is_jnp_argmax_on_ties_nans_and_infinities():
  """decoding.first_argmax (two plain reductions) picks what jnp.argmax picks: the first maximum,
  the first NaN if any, index 0 when every logit is -inf."""
  logits = jnp.array([[1.0, 3.0, 3.0, 2.0],             # tie: the first, 1
                      [jnp.nan, 5.0, jnp.nan, 9.0],      # NaN first: 0
                      [1.0, 2.0, jnp.nan, 9.0],          # a NaN wins: 2
                      [-jnp.inf] * 4,                     # all -inf: 0
                      [-jnp.inf, -1.0, jnp.inf, jnp.inf]])  # +inf twice: 2
  np.testing.assert_array_equal(decoding.first_argmax(logits), [1, 0, 2, 0, 2])
  np.testing.assert_array_equal(decoding.first_argmax(logits), jnp.argmax(logits, axis=-1))
  rand = jax.random.normal(jax.random.PRNGKey(0), (3, 5, 32128)).astype(jnp.bfloat16)
  rand = rand.at[:, :, 7].set(rand.max())  # ties with the maximum elsewhere
  got = jax.jit(decoding.first_argmax)(rand)
  assert got.dtype == jnp.int32 and got.shape == (3, 5)
  np.testing.assert_array_equal(got, jnp.argmax(rand, axis=-1))
