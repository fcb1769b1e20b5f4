"""Dropout with 16-bit keep masks drawn from philox4x32 blocks, and its planned (batched) form.

`Dropout` is flax.linen.Dropout's contract (inverted dropout: kept elements scaled by
1 / keep_prob), with masks from `dropout_keep_mask`: the T5 recipe's dropout (Raffel et al. 2020,
section 2.1: within the FFN, on the residual, on the attention weights, at each stack's input and
output; rate 0.1, section 3.1.1) at a quarter of the PRNG work of
`jax.random.bernoulli` (benchmarks/EXPERIMENTS.md, "The dropout PRNG"). `Dropout.keep_mask` gives a
site's mask to a kernel that applies it itself (t2t/models/train_attention.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.models import dropout_plan, philox

Array = jax.Array


# Random bits per dropout decision. 16 bits quantise the rate to multiples of 2**-16 (0.1 -> 0.100006)
# and halve the random words a mask needs (two decisions per 32-bit word).
DROPOUT_BITS = 16


def _materialised(rng: Array) -> Array:
  """`rng` unchanged, behind an optimisation barrier.

  The key of a dropout site is a short scalar chain (flax's `fold_in` of the module path, itself
  after the step's `fold_in`). Left to itself, XLA fuses that chain into the mask's elementwise
  kernel; behind the barrier it is computed once as its own small kernel. Same bits either way
  (tests/models/test_layers.py); the T5-small train step with 'philox4x32' keys compiled in 15.5 s
  instead of 18.7 s (benchmarks/README, "The dropout PRNG").
  """
  # A typed key goes through the barrier as it is: unwrapping it and wrapping it again by
  # `jax.random.key_impl`, which names an implementation, would swap t2t's philox4x32
  # (t2t/models/philox.py) for JAX's, whose name it shares.
  return jax.lax.optimization_barrier(rng)


def dropout_keep_mask(rng: Array, rate: float, shape: tuple[int, ...]) -> tuple[Array, float]:
  """A boolean keep mask [shape] with P(drop) = round(rate * 2**16) / 2**16, and that keep probability.

  Each decision is a 16-bit random value (a bitcast half of a 32-bit word: no arithmetic); one
  below the threshold drops its element. The halves of uniform 32-bit words are independent
  uniform 16-bit values, so the decisions are independent Bernoulli draws, and the rate is exact
  to 2**-16 (`jax.random.bernoulli` instead turns one 32-bit word into a float per element).
  Where the words come from depends on the key's PRNG (`Trainer.dropout_prng`):
  - philox4x32 (the default; JAX's implementation or t2t's partitionable twin): all four words
    of each Philox-4x32-10 block (`philox.block_words`), eight decisions per block: element e
    takes the 16-bit half e % 2 (low first) of word (e % 8) // 2 of block e // 8, the blocks
    indexed row-major over `shape` with its last axis / 8 when that divides (else flat). Per
    decision that is a quarter of the Philox rounds of `jax.random.bits`, which folds each
    block into one word: T5-small's step ~10% faster on the 2-core CPU (benchmarks/README,
    "The dropout PRNG").
  - any other key ('rbg', 'threefry2x32'): `jax.random.bits`' 32-bit words, two decisions each.
  """
  threshold = int(round(rate * 2 ** DROPOUT_BITS))
  size = math.prod(shape)
  rng = _materialised(rng)
  in_shape = False
  if philox.is_philox4x32_key(rng):
    per_block = 128 // DROPOUT_BITS
    in_shape = bool(shape) and shape[-1] % per_block == 0
    blocks = (*shape[:-1], shape[-1] // per_block) if in_shape else (-(-size // per_block),)
    words = philox.block_words(rng, blocks)
  else:
    words = jax.random.bits(rng, ((size + 1) // 2,), jnp.uint32)
  halves = jax.lax.bitcast_convert_type(words, jnp.uint16)
  if in_shape:  # [*shape[:-1], last / 8, 4, 2]: only trailing axes merge, so the mask of a
    halves = halves.reshape(shape)  # sharded activation is made in its shards
  else:
    halves = halves.reshape(-1)[:size].reshape(shape)
  keep = halves >= jnp.uint16(threshold)
  return keep, dropout_keep_prob(rate)


def dropout_keep_prob(rate: float) -> float:
  """The keep probability of `dropout_keep_mask`'s masks: 1 - rate quantised to 2**-16."""
  return 1.0 - int(round(rate * 2 ** DROPOUT_BITS)) / 2 ** DROPOUT_BITS


def with_planned_dropout(loss_fn: Callable[..., Any], rows: Sequence[Array] = ()
                         ) -> Callable[..., Any]:
  """`loss_fn(params, batch, rng)` whose `Dropout` sites take masks made up front, in batches.

  Same masks as the sites would make themselves, from fewer kernels: see
  t2t/models/dropout_plan.py (`with_planned_masks`; `rows`: the program's
  `dropout_plan.row_arguments`).
  """
  return dropout_plan.with_planned_masks(loss_fn, dropout_keep_mask, rows)


class Dropout(nn.Module):
  """Inverted dropout (`flax.linen.Dropout`'s contract) with a 16-bit keep mask (`dropout_keep_mask`).

  Kept elements are scaled by 1 / keep_prob so the expectation is unchanged; uses the 'dropout' rng.
  Same shape in and out.
  """
  rate: float
  rng_collection: str = 'dropout'

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    keep, keep_prob = self.keep_mask(x.shape)
    return jnp.where(keep, x * jnp.asarray(1.0 / keep_prob, x.dtype), jnp.zeros((), x.dtype))

  def keep_mask(self, shape: tuple[int, ...]) -> tuple[Array, float]:
    """The boolean keep mask [shape] this site applies, and its keep probability: for a kernel
    that applies the dropout itself (`train_attention`), with the same bits as `__call__`."""
    if not 0.0 <= self.rate < 1.0:
      raise ValueError(f'Dropout rate must be in [0, 1), got {self.rate}.')
    rng = self.make_rng(self.rng_collection)
    keep = dropout_plan.site_mask(self.scope, self.rng_collection, self.rate, tuple(shape))
    if keep is None:
      return dropout_keep_mask(rng, self.rate, tuple(shape))
    # made up front with the step's other masks (t2t/models/dropout_plan.py); same bits
    return keep, dropout_keep_prob(self.rate)


def _dropout(x: Array, rate: float, enable_dropout: bool, name: str | None = None) -> Array:
  return Dropout(rate=rate, name=name)(x, deterministic=not enable_dropout)
