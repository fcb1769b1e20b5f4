"""Autoregressive decoding over a KV cache: greedy, temperature / top-k sampling, beam search.

Every strategy is model-agnostic: it drives a `tokens_to_logits(tokens [b, 1], cache) -> (logits [b, v],
new_cache)` callable (see `t2t.models.api.EncoderDecoderModel.predict_batch`), in the manner of t5x.
Conventions (T5): the decoder starts from token 0 (pad), stops at EOS (id 1), and positions after a
row's EOS are filled with 0. Loops are `jax.lax.while_loop`s, so each strategy is jit-able and stops as
soon as every row has finished.

All strategies share one signature, so a model can take any of them as its `decode_fn` (gin):
  decode_fn(tokens_to_logits, initial_cache, batch_size, max_decode_length, *, rng) -> [b, length]
Cache convention: every cache leaf with at least one dimension has the batch on axis 0; scalars
(cache indices) are shared by the batch. Beam search relies on this to expand and reorder beams.
`start_id` is an int, or a [b] array of per-row first tokens (decoder-only models start each row
from the last token of its prompt).
"""
from __future__ import annotations

from typing import Any, Callable

import gin
import jax
import jax.numpy as jnp

Array = jax.Array
Cache = Any
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]

EOS_ID = 1
PAD_ID = 0
DECODER_START_ID = 0


def _check_lengths(batch_size: int, max_decode_length: int) -> None:
  if batch_size <= 0:
    raise ValueError(f'batch_size must be positive, got {batch_size}.')
  if max_decode_length <= 0:
    raise ValueError(f'max_decode_length must be positive, got {max_decode_length}.')


def _autoregressive_loop(choose: Callable[[Array, Array], Array], tokens_to_logits: TokensToLogits,
                         initial_cache: Cache, batch_size: int, max_decode_length: int, rng: Array,
                         eos_id: int, pad_id: int, start_id: int | Array) -> Array:
  """Shared loop: `choose(logits [b, v], step_rng) -> next tokens [b]`. Returns [b, max_decode_length]."""
  _check_lengths(batch_size, max_decode_length)

  def cond(state):
    step, _, _, _, done, _ = state
    return (step < max_decode_length) & ~jnp.all(done)

  def body(state):
    step, last, cache, out, done, rng = state
    rng, step_rng = jax.random.split(rng)
    logits, cache = tokens_to_logits(last[:, None], cache)
    nxt = choose(logits.astype(jnp.float32), step_rng).astype(jnp.int32)
    nxt = jnp.where(done, pad_id, nxt)
    out = jax.lax.dynamic_update_slice(out, nxt[:, None], (0, step))
    return step + 1, nxt, cache, out, done | (nxt == eos_id), rng

  state = (jnp.array(0, jnp.int32), jnp.full((batch_size,), start_id, jnp.int32), initial_cache,
           jnp.full((batch_size, max_decode_length), pad_id, jnp.int32),
           jnp.zeros((batch_size,), bool), rng)
  return jax.lax.while_loop(cond, body, state)[3]


def first_argmax(logits: Array) -> Array:
  """`jnp.argmax(logits, axis=-1)` as two plain reductions: logits [..., vocab] -> int32 [...].

  The first index of the maximum, or of the first NaN if there is one, as `jnp.argmax` gives.
  XLA:CPU runs argmax's paired (value, index) reduction as a scalar loop: over T5's 32k
  vocabulary at batch 8, 0.58 ms a token against 0.19 ms for a max and then a min over the
  matching indices (benchmarks/EXPERIMENTS.md, "Greedy decoding").
  """
  top = jnp.max(logits, axis=-1, keepdims=True)
  vocab = logits.shape[-1]
  hit = (logits == top) | jnp.isnan(logits)
  return jnp.min(jnp.where(hit, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)


@gin.configurable
def greedy_decode(tokens_to_logits: TokensToLogits, initial_cache: Cache, batch_size: int,
                  max_decode_length: int, *, rng: Array | None = None, eos_id: int = EOS_ID,
                  pad_id: int = PAD_ID, start_id: int | Array = DECODER_START_ID) -> Array:
  """Arg-max decoding (T5's default). Returns tokens [batch_size, max_decode_length]; `rng` unused."""
  del rng
  choose = lambda logits, _: first_argmax(logits)
  return _autoregressive_loop(choose, tokens_to_logits, initial_cache, batch_size, max_decode_length,
                              jax.random.PRNGKey(0), eos_id, pad_id, start_id)


@gin.configurable
def temperature_sample(tokens_to_logits: TokensToLogits, initial_cache: Cache, batch_size: int,
                       max_decode_length: int, *, rng: Array | None = None, temperature: float = 1.0,
                       topk: int = 0, eos_id: int = EOS_ID, pad_id: int = PAD_ID,
                       start_id: int | Array = DECODER_START_ID) -> Array:
  """Ancestral sampling from softmax(logits / temperature), optionally restricted to the top k.

  temperature 0 is greedy; topk 0 samples from the whole vocabulary. Returns [batch_size, length].
  """
  if temperature < 0:
    raise ValueError(f'temperature must be >= 0, got {temperature}.')
  if topk < 0:
    raise ValueError(f'topk must be >= 0 (0 = no top-k filtering), got {topk}.')
  rng = jax.random.PRNGKey(0) if rng is None else rng

  def choose(logits, step_rng):
    if temperature == 0:
      return first_argmax(logits)
    if topk:
      kth = jax.lax.top_k(logits, topk)[0][..., -1:]
      logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(step_rng, logits / temperature, axis=-1)
  return _autoregressive_loop(choose, tokens_to_logits, initial_cache, batch_size, max_decode_length,
                              rng, eos_id, pad_id, start_id)


def brevity_penalty(alpha: float, length: Array) -> Array:
  """T5 / GNMT length penalty ((5 + length) / 6) ** alpha; finished beams score log_prob / penalty."""
  return jnp.power((5.0 + length.astype(jnp.float32)) / 6.0, alpha)


def _map_batch_leaves(fn: Callable[[Array], Array], cache: Cache) -> Cache:
  """Applies `fn` to every cache leaf that has a batch axis (ndim >= 1), keeps scalars."""
  return jax.tree_util.tree_map(lambda x: fn(x) if jnp.ndim(x) >= 1 else x, cache)


def _reorder(x: Array, rows: Array) -> Array:
  return jnp.take(x, rows, axis=0) if jnp.ndim(x) >= 1 else x


def beam_search_with_scores(tokens_to_logits: TokensToLogits, initial_cache: Cache,
                            batch_size: int, max_decode_length: int, *, beam_size: int = 4,
                            alpha: float = 0.6, eos_id: int = EOS_ID, pad_id: int = PAD_ID,
                            start_id: int | Array = DECODER_START_ID) -> tuple[Array, Array]:
  """Beam search with the T5 length penalty (beam 4, alpha 0.6 in the paper's final models).

  `initial_cache` is for `batch_size` rows; it is repeated per beam here. Each step reorders the
  cache rows to follow the surviving beams' parents, except the leaves the step returns unchanged
  (the very same array, e.g. the encoder's cross-attention keys/values): they are still the per-row
  repeats of the initial cache, identical across a row's beams, so gathering them within a row would
  copy them onto themselves. Returns
  (sequences [b, beam_size, max_decode_length], scores [b, beam_size]), best first; a score is the
  sequence log-probability divided by `brevity_penalty(alpha, length)` (length counts EOS). Rows that
  finish no beam within `max_decode_length` return their live beams, scored at that length.
  """
  _check_lengths(batch_size, max_decode_length)
  if beam_size < 1:
    raise ValueError(f'beam_size must be >= 1, got {beam_size}.')
  if alpha < 0:
    raise ValueError(f'alpha (length penalty exponent) must be >= 0, got {alpha}.')
  b, k, n = batch_size, beam_size, max_decode_length
  neg = jnp.float32(-1e9)  # "impossible" score, finite so that arithmetic on it stays finite
  cache = _map_batch_leaves(lambda x: jnp.repeat(x, k, axis=0), initial_cache)
  batch_offsets = (jnp.arange(b) * k)[:, None]
  start = jnp.asarray(start_id, jnp.int32)
  start = start[:, None] if start.ndim == 1 else start  # per-row start tokens [b] -> [b, 1]

  def top(scores, m, *arrays):
    """The m best of `scores` [b, c] and the matching entries of each array [b, c, ...]."""
    best, idx = jax.lax.top_k(scores, m)
    return (best, idx) + tuple(jnp.take_along_axis(a, idx.reshape(idx.shape + (1,) * (a.ndim - 2)),
                                                   axis=1) for a in arrays)

  def cond(state):
    step, _, live_lp, _, fin_scores, _ = state
    # Stop early once no live beam can still beat the worst finished beam of any row: log-probs only
    # fall as sequences grow, and the penalty is largest at the maximum length.
    best_possible = live_lp[:, 0] / brevity_penalty(alpha, jnp.array(n))
    settled = jnp.all(fin_scores[:, -1] >= best_possible)
    return (step < n) & ~settled

  def body(state):
    step, live_seqs, live_lp, fin_seqs, fin_scores, cache = state
    last = jax.lax.dynamic_index_in_dim(live_seqs, step - 1, axis=2, keepdims=False)
    last = jnp.where(step == 0, start, last)
    logits, step_cache = tokens_to_logits(last.reshape(b * k, 1), cache)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    vocab = log_probs.shape[-1]
    cand_lp = (live_lp[:, :, None] + log_probs.reshape(b, k, vocab)).reshape(b, k * vocab)
    # 2k candidates guarantee k of them are not EOS.
    cand_lp, cand_idx = jax.lax.top_k(cand_lp, 2 * k)
    cand_beam, cand_tok = cand_idx // vocab, cand_idx % vocab
    cand_seqs = jnp.take_along_axis(live_seqs, cand_beam[:, :, None], axis=1)
    cand_seqs = jax.lax.dynamic_update_slice(cand_seqs, cand_tok[:, :, None].astype(jnp.int32),
                                             (0, 0, step))
    is_eos = cand_tok == eos_id
    # Live beams: the k best candidates that did not just end; their caches follow their parents.
    live_lp, _, live_seqs, parents = top(jnp.where(is_eos, neg, cand_lp), k, cand_seqs,
                                         cand_beam[:, :, None])
    flat = (batch_offsets + parents[:, :, 0]).reshape(b * k)
    cache = jax.tree_util.tree_map(
        lambda new, old: new if new is old else _reorder(new, flat), step_cache, cache)
    # Finished beams: merge the candidates that just ended with the ones kept so far.
    new_scores = jnp.where(is_eos, cand_lp / brevity_penalty(alpha, step + 1), neg)
    fin_scores, _, fin_seqs = top(jnp.concatenate([fin_scores, new_scores], axis=1), k,
                                  jnp.concatenate([fin_seqs, cand_seqs], axis=1))
    return step + 1, live_seqs, live_lp, fin_seqs, fin_scores, cache

  live_lp = jnp.tile(jnp.array([0.0] + [neg] * (k - 1), jnp.float32), (b, 1))  # one initial beam
  seqs = jnp.full((b, k, n), pad_id, jnp.int32)
  state = (jnp.array(0, jnp.int32), seqs, live_lp, seqs, jnp.full((b, k), neg), cache)
  _, live_seqs, live_lp, fin_seqs, fin_scores, _ = jax.lax.while_loop(cond, body, state)
  any_finished = fin_scores[:, :1] > neg / 2
  live_scores = live_lp / brevity_penalty(alpha, jnp.array(n))
  seqs = jnp.where(any_finished[:, :, None], fin_seqs, live_seqs)
  scores = jnp.where(any_finished, fin_scores, live_scores)
  return seqs, scores


@gin.configurable
def beam_search(tokens_to_logits: TokensToLogits, initial_cache: Cache, batch_size: int,
                max_decode_length: int, *, rng: Array | None = None, beam_size: int = 4,
                alpha: float = 0.6, eos_id: int = EOS_ID, pad_id: int = PAD_ID,
                start_id: int | Array = DECODER_START_ID) -> Array:
  """The best beam of `beam_search_with_scores`: tokens [batch_size, max_decode_length]."""
  del rng
  seqs, _ = beam_search_with_scores(tokens_to_logits, initial_cache, batch_size, max_decode_length,
                                    beam_size=beam_size, alpha=alpha, eos_id=eos_id, pad_id=pad_id,
                                    start_id=start_id)
  return seqs[:, 0]
