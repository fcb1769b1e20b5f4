"""Philox-4x32-10 keys whose programs XLA can partition: `Trainer.dropout_prng = 'philox4x32'`.

Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC'11, section 3.2; it passes TestU01's BigCrush) is a counter-based generator: a block of four
32-bit words is ten rounds of two 32 x 32 -> 64-bit multiplications by fixed constants, whose
high and low halves are XOR-ed with the other two words and the key, the key being bumped by the
Weyl constants between rounds. On a CPU its integer rounds run ~2.8x faster than the Philox that
XLA's RngBitGenerator expands to (benchmarks/EXPERIMENTS.md, "The dropout PRNG").

JAX ships the same function as a key implementation (`jax.random.key(s, impl='philox4x32')`),
written with `lax.mulhi` for the high halves. XLA can run that on one device only: a program
with a `mulhi` on a mesh of several devices fails to compile ("Unable to convert MHLO to
StableHLO": XLA's `mulhi` instruction has no StableHLO form), with or without a sharding on it.
Here the high half is taken from a 64-bit product (convert, multiply, shift, convert), which the
partitioner handles. The rounds run as fast either way (a 16.8M-decision mask: 24.3 ms with
`mulhi` and with 64-bit products), but T5-small's train step compiles ~5 s slower this way
(21.0 vs 15.3 s, 2026-11-24), so `Trainer` takes JAX's implementation on one device and this one
on a mesh of several (`trainer.dropout_key_impl`).

Everything else follows JAX's `philox4x32` implementation word for word -- its seed, `split`,
`fold_in`, and `random_bits` (the XOR of a block's four outputs per word, the block counter being
the element's index) -- so the keys and bits are JAX's, on one device and on any mesh
(tests/models/test_philox.py checks both, and Random123's known answer).

`PHILOX4X32` is the implementation; use it as `jax.random.key(seed, impl=PHILOX4X32)`.

`block_words` gives dropout all 128 bits of each block (`jax.random.bits` folds them into 32) for
JAX's philox4x32 keys and for these, with `lax.mulhi` for JAX's and 64-bit products for these.
"""
from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np
from jax import lax

# Random123's Philox-4x32 constants: the round multipliers and the Weyl key bumps.
MULTIPLIERS = (np.uint32(0xD2511F53), np.uint32(0xCD9E8D57))
WEYL = (np.uint32(0x9E3779B9), np.uint32(0xBB67AE85))
ROUNDS = 10

_U32 = jnp.uint32


def mulhilo(a: jax.Array, m: np.uint32, partitionable: bool = True
            ) -> tuple[jax.Array, jax.Array]:
  """(high, low) 32-bit halves of the 64-bit product of uint32 `a` (any shape) and constant `m`.

  `partitionable`: the product is formed in uint64 (64-bit types enabled for these few ops only),
  which is what makes the program partitionable; else the high half is `lax.mulhi`'s (one device
  only, and the program compiles faster). The results are uint32 arrays of `a`'s shape.
  """
  if not partitionable:
    return lax.mulhi(a, _U32(m)), a * _U32(m)
  with jax.enable_x64(True):
    product = lax.convert_element_type(a, jnp.uint64) * jnp.uint64(m)
    high = lax.convert_element_type(lax.shift_right_logical(product, jnp.uint64(32)), _U32)
  return high, a * _U32(m)


def philox4x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array, x2: jax.Array,
               x3: jax.Array, partitionable: bool = True
               ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Philox-4x32-10 of the counter (x0, x1, x2, x3) under the key (k0, k1), elementwise.

  All arguments are uint32 arrays that broadcast together; returns the block's four output words.
  `partitionable`: how the products' high halves are formed (`mulhilo`); same words either way.
  """
  args = jnp.broadcast_arrays(*[jnp.asarray(v, _U32) for v in (k0, k1, x0, x1, x2, x3)])
  k0, k1, x0, x1, x2, x3 = args
  for round_ in range(ROUNDS):
    if round_:
      k0, k1 = k0 + _U32(WEYL[0]), k1 + _U32(WEYL[1])
    hi0, lo0 = mulhilo(x0, MULTIPLIERS[0], partitionable)
    hi1, lo1 = mulhilo(x2, MULTIPLIERS[1], partitionable)
    x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
  return x0, x1, x2, x3


def _index_words(shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
  """(high, low) uint32 words of each element's row-major index in `shape`, each of `shape`."""
  size = math.prod(shape)
  if not shape:
    return jnp.zeros((), _U32), jnp.zeros((), _U32)
  if size >= 1 << 32:
    raise NotImplementedError(f"philox4x32 bits for {size} elements (2**32 or more).")
  low = jnp.zeros(shape, _U32)
  stride = 1
  for axis in reversed(range(len(shape))):
    low = low + lax.broadcasted_iota(_U32, shape, axis) * _U32(stride)
    stride *= shape[axis]
  return jnp.zeros(shape, _U32), low


def _seed(seed: jax.Array) -> jax.Array:
  """The key [2] of an integer seed: Philox of the seed's two 32-bit halves, as JAX's philox4x32."""
  if seed.shape:
    raise TypeError(f"PRNG key seed must be a scalar; got {seed!r}.")
  if not jnp.issubdtype(seed.dtype, jnp.integer):
    raise TypeError(f"PRNG key seed must be an integer; got {seed!r}.")
  high = lax.convert_element_type(
      lax.shift_right_logical(seed, lax.convert_element_type(32, seed.dtype)), _U32)
  low = lax.convert_element_type(seed, _U32)  # the low 32 bits
  out = philox4x32(_U32(0), _U32(0), high, low, _U32(0), _U32(0))
  return jnp.stack([out[0], out[1]])


def _blocks(key: jax.Array, shape: tuple[int, ...], partitionable: bool = True
            ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The four words, each of `shape`, of the blocks whose counters are (index high, index low, 0,
  0) under the key words [2]: what `random_bits` and `block_words` draw."""
  high, low = _index_words(shape)
  zeros = jnp.zeros(shape, _U32)
  return philox4x32(key[0], key[1], high, low, zeros, zeros, partitionable)


def _split(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Keys [*shape, 2]: the block counter is (0, 0, index high, index low)."""
  high, low = _index_words(tuple(shape))
  zeros = jnp.zeros(shape, _U32)
  out = philox4x32(key[0], key[1], zeros, zeros, high, low)
  return jnp.stack([out[0], out[1]], axis=len(shape))


def _fold_in(key: jax.Array, data: jax.Array) -> jax.Array:
  """The key [2] for `key` and a uint32 scalar: the block counter is (0, 0, 0, data)."""
  out = philox4x32(key[0], key[1], _U32(0), _U32(0), _U32(0), jnp.asarray(data, _U32))
  return jnp.stack([out[0], out[1]])


def _random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
  """Bits of `shape`: element i is block (index high, index low, 0, 0) -- its four words XOR-ed
  (8/16/32 bits: truncated), or its first two words as one 64-bit value."""
  if bit_width not in (8, 16, 32, 64):
    raise TypeError("philox4x32 makes 8-, 16-, 32- or 64-bit words.")
  out = _blocks(key, tuple(shape))
  if bit_width == 64:
    with jax.enable_x64(True):
      return (lax.convert_element_type(out[0], jnp.uint64) << jnp.uint64(32)
              | lax.convert_element_type(out[1], jnp.uint64))
  words = out[0] ^ out[1] ^ out[2] ^ out[3]
  return words if bit_width == 32 else lax.convert_element_type(words, f"uint{bit_width}")


PHILOX4X32 = jax.extend.random.define_prng_impl(
    key_shape=(2,), seed=_seed, split=_split, random_bits=_random_bits, fold_in=_fold_in,
    name="philox4x32", tag="phx4p")


@functools.cache
def _key_dtypes() -> dict[Any, bool]:
  """{key dtype: partitionable} of the two philox4x32 implementations: JAX's and PHILOX4X32."""
  jaxs = jax.eval_shape(lambda: jax.random.key(0, impl="philox4x32")).dtype
  ours = jax.eval_shape(lambda: jax.random.key(0, impl=PHILOX4X32)).dtype
  return {jaxs: False, ours: True}


def is_philox4x32_key(key: jax.Array) -> bool:
  """Whether `key` is a typed key of JAX's philox4x32 implementation or of PHILOX4X32."""
  return jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.dtype in _key_dtypes()


@functools.partial(jax.jit, static_argnums=(1, 2))
def _block_words(key_data: jax.Array, shape: tuple[int, ...], partitionable: bool) -> jax.Array:
  return jnp.stack(_blocks(key_data, shape, partitionable), axis=len(shape))


def block_words(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """uint32 [*shape, 4]: the four output words of the Philox-4x32-10 block of each index in `shape`.

  `key` is a philox4x32 key, JAX's or PHILOX4X32 (`is_philox4x32_key`). Block i (row-major in
  `shape`) has the counter (i high, i low, 0, 0) under the key's two words: the block whose four
  words `jax.random.bits(key, shape)` XORs into its element i, so these are the same draws with
  all 128 bits kept -- a quarter of the rounds for the same number of random bits. The high
  halves come from `lax.mulhi` for JAX's key (one device) and from 64-bit products for
  PHILOX4X32's (any mesh): the words are the same. Traced once per shape (an inner `jax.jit`).
  """
  partitionable = _key_dtypes().get(key.dtype)
  if partitionable is None:
    raise TypeError(f"block_words needs a philox4x32 key; got a key of dtype {key.dtype}.")
  return _block_words(jax.random.key_data(key), tuple(shape), partitionable)
