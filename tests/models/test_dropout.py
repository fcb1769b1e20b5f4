"""Tests for t2t.models.dropout: the 16-bit keep masks (rate, independence, the Philox words they
use), the Dropout module, and the mask a kernel takes from a site (`Dropout.keep_mask`)."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import dropout


@pytest.mark.parametrize('impl', ['philox4x32', 'rbg'])  # Trainer.dropout_prng's default and 'rbg'
def test_dropout_keep_mask_rate_independence_and_expectation(impl):
  """16-bit decisions: the drop rate is round(rate * 2**16) / 2**16, decisions look independent
  (neighbours sharing a word or a Philox block, and elements far apart), and the mean is kept."""
  n = 1 << 20
  key = jax.random.key(0, impl=impl)
  keep, keep_prob = dropout.dropout_keep_mask(key, 0.1, (n,))
  assert keep_prob == pytest.approx(1 - 6554 / 65536)
  k = np.asarray(keep, np.float64)
  sd = np.sqrt(keep_prob * (1 - keep_prob) / n)
  assert abs(k.mean() - keep_prob) < 5 * sd
  # Pairs within a word, a block, across blocks and far apart: correlation ~ N(0, 1/n).
  for lag in (1, 2, 8, 1000):
    corr = np.corrcoef(k[:-lag], k[lag:])[0, 1]
    assert abs(corr) < 5 / np.sqrt(n), (lag, corr)
  # Different keys give different masks; an odd size works.
  other, _ = dropout.dropout_keep_mask(jax.random.fold_in(key, 1), 0.1, (n,))
  assert 0.15 < np.mean(np.asarray(other) != np.asarray(keep)) < 0.2  # 2p(1-p) = 0.18
  odd, _ = dropout.dropout_keep_mask(key, 0.5, (3, 5))
  assert odd.shape == (3, 5)


@pytest.mark.parametrize('make_key', [lambda: jax.random.key(3, impl='rbg'),
                                      lambda: jax.random.PRNGKey(3)], ids=['rbg', 'raw'])
def test_dropout_keep_mask_of_other_keys_is_their_bits_halves_against_the_threshold(make_key):
  """The mask under jit (with the barrier around the key) is exactly: the key's 32-bit words,
  split into 16-bit halves in memory order, each kept when >= round(0.1 * 2**16) = 6554."""
  key, shape = make_key(), (5, 77)
  keep = jax.jit(lambda k: dropout.dropout_keep_mask(k, 0.1, shape)[0])(key)
  words = np.asarray(jax.random.bits(key, ((5 * 77 + 1) // 2,), jnp.uint32))
  halves = words.view(np.uint16)[:5 * 77].reshape(shape)   # little-endian: low half first
  np.testing.assert_array_equal(np.asarray(keep), halves >= 6554)


def _philox4x32_10(key, counter):
  """Random123's Philox-4x32-10 in Python integers: (k0, k1), (x0, x1, x2, x3) -> 4 words."""
  (k0, k1), (x0, x1, x2, x3) = key, counter
  for round_ in range(10):
    if round_:
      k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    p0, p1 = x0 * 0xD2511F53, x2 * 0xCD9E8D57
    x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ x3 ^ k1, p0 & 0xFFFFFFFF
  return x0, x1, x2, x3


def test_python_philox_reference_meets_random123s_known_answer():
  assert _philox4x32_10((0xa4093822, 0x299f31d0), (0x243f6a88, 0x85a308d3, 0x13198a2e,
                                                   0x03707344)) == (0xd16cfe09, 0x94fdcceb,
                                                                    0x5001e420, 0x24126ea1)


@pytest.mark.parametrize('impl', ['philox4x32', 'twin'])
@pytest.mark.parametrize('shape', [(3, 16), (5, 7)], ids=['in_shape', 'flat'])
def test_dropout_keep_mask_of_philox_keys_uses_every_word_of_each_block(impl, shape):
  """Element e is kept when half e % 2 (low first) of word (e % 8) // 2 of Philox block e // 8 --
  counter (0, e // 8, 0, 0) under the key's words -- is >= 6554; computed here in Python integers.
  Both implementations (JAX's, t2t's partitionable twin) give the same mask; (5, 7) is the flat
  case (the last axis not a multiple of 8)."""
  from t2t.models import philox
  key = jax.random.key(3, impl='philox4x32' if impl == 'philox4x32' else philox.PHILOX4X32)
  keep = np.asarray(jax.jit(lambda k: dropout.dropout_keep_mask(k, 0.1, shape)[0])(key))
  k0, k1 = (int(w) for w in np.asarray(jax.random.key_data(key)))
  halves = []
  for block in range(-(-math.prod(shape) // 8)):
    for word in _philox4x32_10((k0, k1), (0, block, 0, 0)):
      halves += [word & 0xFFFF, word >> 16]
  expected = np.array(halves[:math.prod(shape)]).reshape(shape) >= 6554
  np.testing.assert_array_equal(keep, expected)
  assert 0 < (~keep).sum() < keep.size  # some dropped, some kept: the threshold is in range


def test_dropout_module_scales_kept_values_and_is_identity_when_off():
  x = jnp.ones((64, 256))
  drop = dropout.Dropout(rate=0.25)
  y = drop.apply({}, x, deterministic=False, rngs={'dropout': jax.random.key(3, impl='rbg')})
  kept = np.asarray(y) != 0
  np.testing.assert_allclose(np.asarray(y)[kept], 1 / 0.75, rtol=1e-6)
  assert abs(kept.mean() - 0.75) < 0.02 and abs(float(y.mean()) - 1.0) < 0.03
  np.testing.assert_array_equal(drop.apply({}, x, deterministic=True), x)
  with pytest.raises(Exception, match='dropout'):  # flax: the rng collection is needed
    drop.apply({}, x, deterministic=False)


# ------------------------------------------------------------------ bf16 matmuls in the layers


def test_dropout_keep_mask_is_what_the_site_applies():
  """`Dropout.keep_mask` draws the same bits as the site's own call, so the kernel drops what
  XLA's path would."""
  x = jnp.ones((2, 3, 8, 16), jnp.float32)
  rngs = {'dropout': jax.random.key(3, impl='philox4x32')}
  applied = dropout.Dropout(rate=0.25).apply({}, x, False, rngs=rngs)
  keep, keep_prob = dropout.Dropout(rate=0.25).apply({}, x.shape, rngs=rngs,
                                                    method=dropout.Dropout.keep_mask)
  np.testing.assert_array_equal(np.asarray(applied),
                                np.where(np.asarray(keep), np.float32(1 / keep_prob), 0))
  assert 0.0 < float(jnp.mean(keep)) < 1.0
