"""Which parameters train, and how fast: fine-tuning methods as optimizer wrappers.

Parameters are addressed by regular expressions over their '/'-joined paths
(`encoder/layers_3/mlp/wi/kernel`, see `t2t.training.checkpoints.param_shapes`), searched with
`re.search`. Layer-wise methods rely on the shared naming: stack layers `encoder/layers_{i}` and
`decoder/layers_{i}` (i = 0 at the bottom), embeddings under `token_embedder` / `embeddings` /
`embedder`, heads under `head`, the ELMo scalar mix under `scalar_mix`.

`adapted(base=...)` wraps any optax optimizer:
- frozen parameters get `optax.set_to_zero()` through `optax.multi_transform`, hence no optimizer
  state at all, and the trainer does not differentiate with respect to them (it asks the wrapper
  for its `trainable_mask`, see `trainable_mask` below);
- gradual unfreezing (T5 §3.5.2, after Howard & Ruder 2018 §3.2): the top layer of every stack
  trains first, one more layer per `unfreeze_every` steps, embeddings always;
- discriminative learning rates (Howard & Ruder 2018 §3.2, "discr"; Peters et al. 2019 App. A.2:
  x0.4 per layer going down): the update of a parameter at depth k below the top is scaled by
  `layer_decay ** k`.
`slanted_triangular` is Howard & Ruder's schedule (§3.2, eq. 3) as an optax schedule.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.training import checkpoints, warm_start

# Embedding tables of every family (PLAN convention 3); T5's relative position tables are not
# embeddings here: they belong to the bottom layer, as in the reference layout (layer 0 owns them).
EMBEDDING_PATTERNS = (r'(^|/)token_embedder/', r'(^|/)embeddings?/', r'(^|/)embedder/')
_LAYER = re.compile(r'^(?P<stack>.*?)/layers_(?P<index>\d+)(/|$)')
_RELPOS = re.compile(r'^(?P<stack>[^/]+)/relpos_bias/')
# Parameters that fine-tuning methods add to a pre-trained model (t2t/models/peft.py): a
# pre-trained checkpoint lacks them and they keep their fresh initialisation.
ADDED_PATTERNS = (r'/adapter/', r'^prompt/', r'_lora_[ab]$')


class PatternError(ValueError):
  """A parameter pattern from the configuration matches no parameter (or is not a regex)."""


# ----------------------------------------------------------------------------- paths and masks
def param_paths(params: Any) -> list[str]:
  """'/'-joined paths of every leaf, in `jax.tree.leaves` order."""
  return list(checkpoints.param_shapes(params))


def _abbreviate(paths: Sequence[str], limit: int = 30) -> str:
  """The paths one per line; runs of layers_{i} collapse to layers_{0..n} so the list stays short."""
  grouped: dict[str, list[int]] = {}
  for p in paths:
    m = re.search(r'layers_(\d+)', p)
    key = p if m is None else p[:m.start()] + 'layers_{i}' + p[m.end():]
    grouped.setdefault(key, []).append(-1 if m is None else int(m.group(1)))
  lines = []
  for key, idx in grouped.items():
    if idx[0] >= 0:
      lo, hi = min(idx), max(idx)
      key = key.replace('layers_{i}', f'layers_{{{lo}..{hi}}}' if lo != hi else f'layers_{lo}')
    lines.append(key)
  more = f'\n  ... and {len(lines) - limit} more' if len(lines) > limit else ''
  return '\n  '.join([''] + lines[:limit]) + more


def match_paths(paths: Sequence[str], patterns: Sequence[str], what: str) -> list[bool]:
  """Per path: does any pattern match it? Every pattern must match at least one path.

  Raises PatternError naming the first pattern that matches nothing (or does not compile) and
  listing the parameter paths that exist.
  """
  if isinstance(patterns, str):
    raise PatternError(f'{what} must be a list of regular expressions, got the string {patterns!r}.')
  hit = [False] * len(paths)
  for pattern in patterns:
    try:
      regex = re.compile(pattern)
    except re.error as e:
      raise PatternError(f'{what}: {pattern!r} is not a regular expression ({e}).') from None
    found = [bool(regex.search(p)) for p in paths]
    if not any(found):
      raise PatternError(f'{what}: pattern {pattern!r} matches no parameter. The parameters are '
                         f'(layers abbreviated):{_abbreviate(paths)}')
    hit = [a or b for a, b in zip(hit, found)]
  return hit


def _tree_like(params: Any, values: Sequence[Any]) -> Any:
  return jax.tree.unflatten(jax.tree.structure(params), list(values))


def select(params: Any, trainable: Sequence[str] | None = None,
           frozen: Sequence[str] = (), always_trainable: Sequence[str] = ()) -> Any:
  """A bool tree like `params`: True where the parameter trains.

  `trainable=None` means all parameters; `always_trainable` patterns are added to `trainable`;
  `frozen` patterns are then removed from that set.
  """
  paths = param_paths(params)
  train = ([True] * len(paths) if trainable is None
           else match_paths(paths, trainable, 'adapted.trainable'))
  if always_trainable:
    train = [t or a for t, a in zip(
        train, match_paths(paths, always_trainable, 'adapted.always_trainable'))]
  if frozen:
    train = [t and not f for t, f in zip(train, match_paths(paths, frozen, 'adapted.frozen'))]
  if not any(train):
    raise PatternError('adapted: these trainable / frozen patterns leave no parameter to train.')
  return _tree_like(params, train)


def trainable_mask(optimizer: optax.GradientTransformation, params: Any) -> Any:
  """Bool tree: the parameters `optimizer` trains (all of them unless it is an `adapted` one).

  The trainer differentiates only where this is True; the mask is static (computed from shapes).
  """
  mask_fn = getattr(optimizer, 'trainable_mask', None)
  return jax.tree.map(lambda _: True, params) if mask_fn is None else mask_fn(params)


def value_and_grad_trainable(fn: Callable[..., Any], mask: Any) -> Callable[..., Any]:
  """Like `jax.value_and_grad(fn, has_aux=True)` over argument 0, for the masked leaves only.

  Frozen leaves enter `fn` as constants: no gradient with respect to them is formed (back-prop
  still passes through them to trainable parameters below; with a frozen encoder under a trained
  head it stops at the head). Their entry in the returned tree is zeros, which
  `optax.set_to_zero` discards and XLA removes. Gradual unfreezing is dynamic, so it does not
  save gradient work: locked layers are differentiated and their updates zeroed.
  """
  keep = jax.tree.leaves(mask)

  def wrapped(params, *args):
    leaves, treedef = jax.tree.flatten(params)
    if len(leaves) != len(keep):
      raise ValueError(f'The trainable mask has {len(keep)} leaves, the parameters {len(leaves)}.')

    def on_trainable(train_leaves):
      it = iter(train_leaves)
      return fn(treedef.unflatten([next(it) if k else p for p, k in zip(leaves, keep)]), *args)

    value, grads = jax.value_and_grad(on_trainable, has_aux=True)(
        [p for p, k in zip(leaves, keep) if k])
    it = iter(grads)
    return value, treedef.unflatten([next(it) if k else jnp.zeros_like(p)
                                     for p, k in zip(leaves, keep)])
  return wrapped


# ----------------------------------------------------------------------------- layer depth
def layer_depths(paths: Sequence[str],
                 embedding_patterns: Sequence[str] = EMBEDDING_PATTERNS) -> list[int | None]:
  """Depth below the top of its stack for every path; None for embeddings.

  `<stack>/layers_{i}` has depth (top index of that stack) - i, so the encoder's and the
  decoder's top layers both have depth 0 (T5 unfreezes them in parallel). A stack's
  `relpos_bias` goes with its layer 0. Everything else outside the layers (final norms,
  `logits_dense`, `head`, `scalar_mix`) sits at the top, depth 0.
  """
  scanned = [p for p in paths if re.search(r'(^|/)layers/', p)]
  if scanned:
    raise ValueError(f'Layer-wise adaptation needs one subtree per layer (layers_{{i}}), but '
                     f'{scanned[0]!r} belongs to a scanned stack: set T5Config.scan_layers = False.')
  tops: dict[str, int] = {}
  for p in paths:
    m = _LAYER.match(p)
    if m:
      tops[m['stack']] = max(tops.get(m['stack'], 0), int(m['index']))
  embed = [any(re.search(e, p) for e in embedding_patterns) for p in paths]
  depths: list[int | None] = []
  for p, is_embedding in zip(paths, embed):
    m, r = _LAYER.match(p), _RELPOS.match(p)
    if is_embedding:
      depths.append(None)
    elif m:
      depths.append(tops[m['stack']] - int(m['index']))
    elif r and r['stack'] in tops:
      depths.append(tops[r['stack']])
    else:
      depths.append(0)
  return depths


def _unfreeze_gate(every: int) -> optax.GradientTransformation:
  """Zeroes updates of layers not yet unfrozen: depth k trains from step k * `every` on.

  Used on both sides of the base optimizer: before it, a locked layer's gradient is zero (its
  second-moment statistics see nothing); after it, its update is exactly zero (no momentum or
  weight-decay leak). The base optimizer's step count (and schedule) stays global.
  """
  def init(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update(updates, state, params=None):
    depths = layer_depths(param_paths(updates))
    unfrozen = state.count // every + 1  # layers per stack trainable at this step
    gated = [u if d is None else jnp.where(d < unfrozen, u, jnp.zeros_like(u))
             for u, d in zip(jax.tree.leaves(updates), depths)]
    return (_tree_like(updates, gated),
            optax.ScaleByScheduleState(count=optax.safe_increment(state.count)))
  return optax.GradientTransformation(init, update)


def _layer_scale(decay: float) -> optax.GradientTransformation:
  """Scales the update at depth k by decay ** k (embeddings: one below the deepest layer)."""
  def update(updates, state, params=None):
    depths = layer_depths(param_paths(updates))
    bottom = max([d for d in depths if d is not None], default=0) + 1
    scaled = [u * jnp.asarray(decay ** (bottom if d is None else d), u.dtype)
              for u, d in zip(jax.tree.leaves(updates), depths)]
    return _tree_like(updates, scaled), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


# ----------------------------------------------------------------------------- the wrapper
class AdaptedTransformation(optax.GradientTransformation):
  """An optax GradientTransformation that also says which parameters train.

  `trainable_mask(params)` -> bool tree (static: from paths and shapes only).
  """

  def __new__(cls, init, update, trainable_mask_fn):
    self = super().__new__(cls, init, update)
    self.trainable_mask = trainable_mask_fn
    return self


@gin.configurable
def adapted(base: optax.GradientTransformation = gin.REQUIRED,
            trainable: Sequence[str] | None = None,
            frozen: Sequence[str] = (),
            unfreeze_every: int | None = None,
            layer_decay: float | None = None,
            always_trainable: Sequence[str] = ()) -> AdaptedTransformation:
  """`base` restricted to some parameters, with optional gradual unfreezing and per-layer rates.

  trainable: regexes of the parameters that train (None: all); frozen: regexes removed from them.
    Frozen parameters get `optax.set_to_zero()` (no optimizer state, no gradient computation).
  always_trainable: regexes that train in addition to `trainable` under every recipe. A model's
    gin file binds it, not a recipe: the classifier families bind ['^head/'] (the task head is
    always fresh), so the recipes in gin/adaptation stay one line for every family.
  unfreeze_every: gradual unfreezing (T5 §3.5.2): at step s the top s // unfreeze_every + 1
    layers of every stack train, embeddings always. T5 uses 12 episodes over fine-tuning.
  layer_decay: discriminative learning rates (Howard & Ruder 2018 §3.2: eta^{l-1} = eta^l / 2.6;
    Peters et al. 2019 App. A.2: x0.4): updates at depth k below the top are scaled by decay ** k.

  Keep `adapted` outermost: wrapped in another optax transformation (e.g. `optax.chain`) it still
  freezes, but the trainer no longer sees its `trainable_mask` and differentiates everything.
  Put clipping etc. inside, in `base`.
  """
  if unfreeze_every is not None and unfreeze_every < 1:
    raise ValueError(f'adapted.unfreeze_every must be a positive number of steps, got '
                     f'{unfreeze_every}.')
  if layer_decay is not None and not 0.0 < layer_decay <= 1.0:
    raise ValueError(f'adapted.layer_decay must be in (0, 1], got {layer_decay}.')

  def mask_fn(params):
    return select(params, trainable, frozen, always_trainable)

  def labels(params):
    return jax.tree.map(lambda t: 'train' if t else 'frozen', mask_fn(params))

  # Layer-wise steps see the whole tree (frozen leaves as zeros), so depths count every layer.
  tx = optax.multi_transform({'train': base, 'frozen': optax.set_to_zero()}, labels)
  if unfreeze_every is not None:
    tx = optax.chain(_unfreeze_gate(unfreeze_every), tx, _unfreeze_gate(unfreeze_every))
  if layer_decay is not None:
    tx = optax.chain(tx, _layer_scale(layer_decay))
  return AdaptedTransformation(tx.init, tx.update, mask_fn)


# ----------------------------------------------------------------------------- schedules
@gin.configurable
def slanted_triangular(total_steps: int = gin.REQUIRED, max_learning_rate: float = 0.01,
                       cut_frac: float = 0.1, ratio: float = 32.0) -> optax.Schedule:
  """Slanted triangular learning rates (Howard & Ruder 2018, §3.2, eq. 3).

  cut = floor(T * cut_frac); p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1));
  eta_t = eta_max * (1 + p * (ratio - 1)) / ratio. A short linear warm-up to eta_max, then a long
  linear decay to eta_max / ratio at t = T. Paper defaults: cut_frac 0.1, ratio 32, eta_max 0.01.
  """
  if total_steps < 1:
    raise ValueError(f'slanted_triangular.total_steps must be >= 1, got {total_steps}.')
  if not 0.0 < cut_frac < 1.0:
    raise ValueError(f'slanted_triangular.cut_frac must be in (0, 1), got {cut_frac}.')
  if ratio < 1.0:
    raise ValueError(f'slanted_triangular.ratio must be >= 1, got {ratio}.')
  cut = max(int(np.floor(total_steps * cut_frac)), 1)

  def schedule(step):
    t = jnp.minimum(jnp.asarray(step, jnp.float32), float(total_steps))
    p = jnp.where(t < cut, t / cut, 1.0 - (t - cut) / (cut * (1.0 / cut_frac - 1.0)))
    return max_learning_rate * (1.0 + jnp.maximum(p, 0.0) * (ratio - 1.0)) / ratio
  return schedule


# ----------------------------------------------------------------------------- pre-trained weights
def load_pretrained(path: str, trainer: Any,
                    added: Sequence[str] = ADDED_PATTERNS) -> tuple[Any, int]:
  """Parameters for fine-tuning from a checkpoint that may lack the parameters a method adds.

  Every parameter the checkpoint holds is restored (shapes must agree); parameters missing from
  it must match an `added` pattern (adapters, prompts, LoRA factors) and keep the trainer's fresh
  initialisation. Anything else missing, or extra in the checkpoint, is the usual
  CheckpointMismatchError. `t2t.train` does the same through `warm_start.restore_params`.
  Returns (params, checkpoint step), sharded like `trainer.params_shardings`.
  """
  params, step, _ = warm_start.restore_params(
      path, trainer.params_abstract, trainer.params_shardings, trainer.init_params, added=added)
  return params, step
