"""Every dropout mask of a loss function made up front: one key derivation, one generator per shape.

A Flax model derives each dropout site's key with its own `fold_in` of the site's path into the
step's key (`Scope.make_rng`) and draws the site's mask from it, so T5-small's train step holds
64 scalar key derivations and 64 mask generators. Each is its own kernel that XLA's CPU backend
compiles separately, and together they were about half of the step's compile time
(benchmarks/EXPERIMENTS.md, "The dropout PRNG"). `with_planned_masks` makes the same masks with one
vectorised `fold_in` for all sites and one vectorised generator per (mask shape, rate):

1. a recording pass (`jax.eval_shape`, nothing computed) runs the loss function once and lists
   the sites that draw from the step's key: their flax rng suffix (module path and call count),
   mask shape and rate;
2. the keys of all sites are `fold_in(key, site hash)` in one `vmap`, the hash being flax's (the
   SHA-1 of the suffix, `site_hash`), and each group of sites with one shape and rate gets its
   masks from one `vmap` of `layers.dropout_keep_mask`;
3. the loss function runs again with the masks at hand; `layers.Dropout` takes its site's mask
   from the plan (`site_mask`) instead of deriving it. A site's mask is its row of the group's
   masks, taken at an index the program receives as an argument (`row_arguments`), not at a
   constant one. XLA fuses that slice into each of the mask's consumers; with a constant row,
   the consumers of like sites in different layers differ in nothing but that constant and
   compile as a kernel each, while with the row a runtime scalar they are one kernel, compiled
   once (T5-small's bf16 gradient program: 232 kernels -> 130, ~2 s less compile;
   benchmarks/EXPERIMENTS.md, "One kernel for every layer's dropout").

The keys, and so the masks, are bit for bit those of the sites deriving their own
(tests/models/test_dropout_plan.py), so a run's losses do not change. Sites whose key is not the
step's own -- inside `nn.scan` or `nn.remat`, which split or re-wrap the rngs, or a model that
passes a split key to `apply` -- are not planned and derive their keys as before. Only
Philox-4x32 keys are planned (the default `Trainer.dropout_prng`): `vmap` keeps their bits, while
the 'rbg' generator's bits change under `vmap`.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
from typing import Any, Callable, Iterator, NamedTuple, Sequence, TypeVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import philox

Array = jax.Array
T = TypeVar('T')
Suffix = tuple[Any, ...]
MaskFn = Callable[[Array, float, tuple[int, ...]], tuple[Array, float]]


def site_hash(suffix: Suffix) -> int:
  """The 32-bit value flax folds into the rng for a site with this rng `suffix` (path, count).

  `Scope.make_rng` hashes the suffix's items with SHA-1 -- strings as UTF-8, ints as their
  big-endian bytes, each after a NUL byte when `flax_fix_rng_separator` is set -- and folds the
  digest's first four bytes (big-endian) into the key.
  """
  digest = hashlib.sha1()
  for item in suffix:
    if flax.config.flax_fix_rng_separator:
      digest.update(b'\x00')
    if isinstance(item, str):
      digest.update(item.encode('utf-8'))
    elif isinstance(item, int):
      digest.update(item.to_bytes((item.bit_length() + 7) // 8, byteorder='big'))
    else:
      raise TypeError(f'An rng suffix holds strings and ints, not {item!r}.')
  return int.from_bytes(digest.digest()[:4], byteorder='big')


class Site(NamedTuple):
  """One dropout mask a loss function draws: the site's flax rng suffix, the mask's shape, the rate."""
  suffix: Suffix
  shape: tuple[int, ...]
  rate: float


@dataclasses.dataclass
class _Recording:
  """The recording pass's state: the step key's tracer and the sites seen, in call order."""
  root: Any
  sites: list[Site] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Plan:
  """The real pass's state: the step key and each site's mask."""
  root: Any
  masks: dict[Site, Array]


# How many row indices `row_arguments` makes by default: more than the largest group of sites of
# one shape and rate in T5 up to 24 layers a stack (T5-small's largest: 20 sites).
ROW_ARGUMENTS = 128

_ACTIVE: contextvars.ContextVar[_Recording | _Plan | None] = contextvars.ContextVar(
    't2t_dropout_plan', default=None)


@contextlib.contextmanager
def _active(state: _Recording | _Plan) -> Iterator[None]:
  token = _ACTIVE.set(state)
  try:
    yield
  finally:
    _ACTIVE.reset(token)


def site_mask(scope: Any, collection: str, rate: float, shape: tuple[int, ...]) -> Array | None:
  """The planned keep mask [shape] of the site that just called `scope.make_rng(collection)`.

  None when no plan is active or the site's key is not the step's own (the site then derives its
  mask itself). In the recording pass the site is recorded and an all-true mask stands in.
  """
  state = _ACTIVE.get()
  if state is None or not scope.has_rng(collection):
    return None
  lazy = scope.rngs[collection]
  if getattr(lazy, 'rng', None) is not state.root:
    return None
  site = Site((*lazy.suffix, scope.rng_counters[collection]), tuple(shape), rate)
  if isinstance(state, _Recording):
    state.sites.append(site)
    return jnp.ones(shape, jnp.bool_)
  if site not in state.masks:
    where = '/'.join(map(str, scope.path)) or 'the top-level module'
    seen = [s for s in state.masks if s.suffix == site.suffix]
    raise RuntimeError(
        f'Dropout at {where} (call {site.suffix[-1]}) asks for a {site.shape} mask at rate '
        f'{rate}, but the recording pass saw '
        f'{", ".join(f"{s.shape} at {s.rate}" for s in seen) or "no such site"}: the loss '
        f'function must draw the same dropout masks each time it is traced '
        f'(t2t/models/dropout_plan.py), or gin `Trainer.plan_dropout = False` lets each site '
        f'draw its own.')
  return state.masks[site]


def row_arguments(count: int = ROW_ARGUMENTS, sharding: Any = None) -> tuple[Array, ...]:
  """The int32 scalars 0, 1, ..., count - 1 on `sharding`, to pass into a jitted loss as `rows`.

  Inside the program they are runtime values, so `planned_masks` slices a group's masks at an
  index XLA cannot fold into the consumers' kernels (module docstring, step 3).
  """
  return tuple(jax.device_put(np.asarray(row, np.int32), sharding) for row in range(count))


def planned_masks(rng: Array, sites: Sequence[Site], mask_fn: MaskFn,
                  rows: Sequence[Array] = ()) -> dict[Site, Array]:
  """Each site's keep mask: `mask_fn(fold_in(rng, site_hash(suffix)), rate, shape)[0]`, batched.

  One `vmap`-ed `fold_in` derives every site's key; one `vmap`-ed `mask_fn` per (shape, rate)
  makes that group's masks, [sites in group, *shape], and the i-th site of a group takes row i:
  at index `rows[i]` (a traced int32 scalar holding i, `row_arguments`) where there is one, else
  at the constant i (the same mask, one kernel per site for its consumers). A site listed twice
  (a module applied twice with the same rng) gets one mask, as it would itself.
  """
  sites = list(dict.fromkeys(sites))
  hashes = jnp.asarray([site_hash(site.suffix) for site in sites], jnp.uint32)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, hashes)
  groups: dict[tuple[tuple[int, ...], float], list[int]] = {}
  for index, site in enumerate(sites):
    groups.setdefault((site.shape, site.rate), []).append(index)
  masks = {}
  for (shape, rate), members in groups.items():
    group_keys = keys[jnp.asarray(members)] if len(members) < len(sites) else keys
    stacked = jax.vmap(lambda key: mask_fn(key, rate, shape)[0])(group_keys)
    for row, index in enumerate(members):
      masks[sites[index]] = (jax.lax.dynamic_index_in_dim(stacked, rows[row], keepdims=False)
                             if row < len(rows) else stacked[row])
  return masks


def recorded_sites(loss_fn: Callable[..., Any], params: Any, batch: Any, rng: Array) -> list[Site]:
  """The dropout sites `loss_fn(params, batch, rng)` draws from `rng` itself, in call order.

  An abstract trace (`jax.eval_shape`): nothing is computed. Sites whose key flax derived from
  another key (a split, a lifted transform) are not listed.
  """
  recording = _Recording(root=None)

  def record(params, batch, root):
    recording.root = root
    with _active(recording):
      return loss_fn(params, batch, root)

  jax.eval_shape(record, params, batch, rng)
  return recording.sites


def with_planned_masks(loss_fn: Callable[..., T], mask_fn: MaskFn,
                       rows: Sequence[Array] = ()) -> Callable[..., T]:
  """`loss_fn(params, batch, rng)` with its dropout masks planned (see the module docstring).

  `rows`: the program's `row_arguments` (traced), at which each group's masks are sliced.
  Without an rng (no dropout), with a key that is not Philox-4x32, or when the loss function
  draws no dropout from `rng` directly, it is `loss_fn` as it is.
  """

  def planned(params: Any, batch: Any, rng: Array | None) -> T:
    if rng is None or not philox.is_philox4x32_key(rng):
      return loss_fn(params, batch, rng)
    sites = recorded_sites(loss_fn, params, batch, rng)
    if not sites:
      return loss_fn(params, batch, rng)
    with _active(_Plan(root=rng, masks=planned_masks(rng, sites, mask_fn, rows))):
      return loss_fn(params, batch, rng)

  return planned
