"""Warm start: a run's initial parameters from another run's checkpoint, loading what fits.

Parameters whose '/'-joined path and shape match are loaded, the model's new ones are initialised
fresh, the checkpoint's extra ones are skipped, and name patterns force a fresh start (a new head
per phase, as the STILTs and jiant protocols do). `RestorePlan.report` prints which parameters
went where. Parameters only: the optimizer state of the earlier run is never read. The checkpoint
layout, the shape and vocabulary checks are t2t.training.checkpoints'.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import orbax.checkpoint as ocp

from t2t.training import checkpoints

PARTIAL_RESTORE_HINT = (
    "To load only the parameters whose name and shape match (new ones initialised fresh, the "
    "checkpoint's extra ones skipped), set `train.partial_restore = True` "
    "(--gin.train.partial_restore=True); to re-initialise some on purpose, list name patterns "
    "in `train.reinitialize`, e.g. ['head/.*'].")


@dataclasses.dataclass(frozen=True)
class RestorePlan:
  """Which parameters a partial restore loads, initialises fresh, or leaves in the checkpoint.

  `reinitialised` maps a model parameter to why it is fresh: 'new' (not in the checkpoint),
  'shape' (the checkpoint's has another shape) or the `reinitialize` pattern that matched.
  """
  loaded: tuple[str, ...]
  reinitialised: Mapping[str, str]
  skipped: tuple[str, ...]
  saved_names: tuple[str, ...] = ()  # every checkpoint parameter (for abbreviating)

  @property
  def model_names(self) -> tuple[str, ...]:
    return (*self.loaded, *self.reinitialised)

  def report(self, where: str, step: int, max_names: int = 6) -> str:
    """A few lines for the user: counts and (abbreviated) names of each group."""
    why = {}
    for name, reason in self.reinitialised.items():
      why.setdefault(reason, []).append(name)
    lines = [f"Partial restore from {where} (step {step}):",
             f"  loaded {len(self.loaded)} parameters: "
             f"{abbreviate(self.loaded, max_names, self.model_names)}",
             f"  reinitialised {len(self.reinitialised)}" + (":" if why else "")]
    labels = {"new": "not in the checkpoint", "shape": "shape differs"}
    for reason, names in sorted(why.items()):
      label = labels.get(reason, f"matches {reason!r}")
      lines.append(f"    {len(names)} {label}: {abbreviate(names, max_names, self.model_names)}")
    lines.append(f"  skipped {len(self.skipped)} checkpoint parameters the model lacks"
                 + (f": {abbreviate(self.skipped, max_names, self.saved_names)}"
                    if self.skipped else ""))
    return "\n".join(lines)


def plan_restore(saved: Mapping[str, list[int]], expected: Mapping[str, list[int]],
                 reinitialize: Sequence[str] = ()) -> RestorePlan:
  """Matches checkpoint parameters to model parameters by '/'-joined path and shape.

  A model parameter whose full path matches one of the `reinitialize` regular expressions
  (`re.fullmatch`, e.g. 'head/.*') is initialised fresh even when the checkpoint has it.
  """
  patterns = [(p, re.compile(p)) for p in reinitialize]
  loaded, fresh = [], {}
  for name in sorted(expected):
    forced = next((p for p, rx in patterns if rx.fullmatch(name)), None)
    if forced is not None:
      fresh[name] = forced
    elif name not in saved:
      fresh[name] = "new"
    elif list(saved[name]) != list(expected[name]):
      fresh[name] = "shape"
    else:
      loaded.append(name)
  skipped = tuple(sorted(set(saved) - set(expected)))
  return RestorePlan(loaded=tuple(loaded), reinitialised=fresh, skipped=skipped,
                     saved_names=tuple(sorted(saved)))


def abbreviate(names: Sequence[str], limit: int = 6, universe: Sequence[str] = ()) -> str:
  """A short rendering of parameter names, at most `limit` items.

  A scope whose every parameter (among `universe`, e.g. all of the model's) is in `names` is
  shown once, as 'encoder/layers_1/* (8)'; then layer indices are folded:
  'decoder/layers_{0-5}/mlp/wi/kernel'.
  """
  names = sorted(names)
  chosen, everything = set(names), set(universe) | set(names)
  items: list[tuple[str, int]] = []
  covered: set[str] = set()
  for name in names:
    if name in covered:
      continue
    parts = name.split("/")
    for k in range(1, len(parts) + 1):
      prefix = "/".join(parts[:k])
      if all(u in chosen for u in everything if u == prefix or u.startswith(prefix + "/")):
        break
    members = [n for n in names if n == prefix or n.startswith(prefix + "/")]
    covered.update(members)
    items.append((members[0], 1) if len(members) == 1 else (prefix + "/*", len(members)))
  groups: dict[str, tuple[list[int], int]] = {}
  for label, count in items:
    m = _LAYER.search(label)
    key = _LAYER.sub("layers_{}", label, count=1) if m else label
    indices, total = groups.get(key, ([], 0))
    groups[key] = (indices + ([int(m.group(1))] if m else []), total + count)
  shown = []
  for key, (idx, count) in groups.items():
    if idx:
      idx = sorted(idx)
      span = (str(idx[0]) if len(idx) == 1 else
              f"{idx[0]}-{idx[-1]}" if idx == list(range(idx[0], idx[-1] + 1)) else
              ",".join(map(str, idx)))
      key = key.replace("{}", span if len(idx) == 1 else "{" + span + "}")
    shown.append(f"{key} ({count})" if key.endswith("/*") else key)
  more = len(shown) - limit
  return ", ".join(shown[:limit]) + (f" (+{more} more)" if more > 0 else "")


_LAYER = re.compile(r"layers_(\d+)")


def _subtree(tree: Any, names: set[str]) -> dict:
  """The nested-dict subtree of `tree` holding only the leaves named in `names`."""
  out: dict = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    keys = [checkpoints.key_name(k) for k in path]
    if "/".join(keys) in names:
      node = out
      for k in keys[:-1]:
        node = node.setdefault(k, {})
      node[keys[-1]] = leaf
  return out


def restore_params(path: str, params_abstract: Any, params_shardings: Any,
                   init_params: Callable[[], Any], partial: bool = False,
                   reinitialize: Sequence[str] = (),
                   added: Sequence[str] = (),
                   vocabulary: Mapping[str, Mapping[str, Any]] | None = None,
                   ) -> tuple[Any, int, RestorePlan]:
  """Initial parameters for a run from another run's checkpoint (parameters only).

  Without `partial` (and no `reinitialize` patterns) every parameter must match, as in
  `load_params`; a mismatch is an error naming the first one and how to ask for a partial
  restore. With it, matching parameters are loaded, the others come from `init_params()`
  (a fresh initialisation, already sharded) and the checkpoint's extra ones are skipped.
  Model parameters the checkpoint lacks whose path matches an `added` pattern (`re.search`;
  the adapters, prompts and LoRA factors a fine-tuning method adds to a pre-trained model,
  `t2t.training.adaptation.ADDED_PATTERNS`) start fresh without `partial`.
  `vocabulary` ({feature: fingerprint}, the run's) must match the checkpoint's record
  (`checkpoints.check_vocabulary`; VocabularyMismatchError otherwise), partial restores included:
  a new head does not change what the loaded token embedding (T5's, shared by encoder, decoder
  and the logits) means, and a same-sized vocabulary would pass every shape check.
  Returns (params, checkpoint step, plan).
  """
  model_dir, step = checkpoints.resolve_checkpoint(path)
  where = checkpoints.step_dir(model_dir, step)
  manager = ocp.CheckpointManager(
      model_dir, item_names=("params", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix=checkpoints.STEP_PREFIX, read_only=True))
  try:
    with checkpoints.reading(where, "meta"):
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    checkpoints.check_vocabulary(meta, vocabulary, where)
    expected = checkpoints.param_shapes(params_abstract)
    plan = plan_restore(meta["param_shapes"], expected, reinitialize)
    if not partial:  # everything must match, except what the patterns re-initialise
      forced = [re.compile(p) for p in reinitialize]
      new = [re.compile(p) for p in added]
      saved = meta["param_shapes"]
      keep = lambda names: {k: v for k, v in names.items()
                            if not any(rx.fullmatch(k) for rx in forced)
                            and not (k not in saved and any(rx.search(k) for rx in new))}
      try:
        checkpoints.check_compatible(keep(meta["param_shapes"]), keep(expected), where,
                                     checkpoints.LOAD_ADVICE)
      except checkpoints.CheckpointMismatchError as e:
        raise checkpoints.CheckpointMismatchError(f"{e} {PARTIAL_RESTORE_HINT}") from None
    wanted_names = set(plan.loaded)
    target = _subtree(checkpoints.abstract_arrays(params_abstract, params_shardings), wanted_names)
    restored = {}
    if wanted_names:
      with checkpoints.reading(where, "params"):
        restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True)))["params"]
  finally:
    manager.close()
  if len(plan.loaded) == len(expected):
    return _merge(params_abstract, restored, None), step, plan
  return _merge(params_abstract, restored, init_params()), step, plan


def _merge(like: Any, restored: Mapping, fresh: Any | None) -> Any:
  """A tree shaped like `like`: restored leaves where present, else the fresh ones."""
  flat_fresh = (jax.tree_util.tree_flatten_with_path(fresh)[0] if fresh is not None else None)
  paths, treedef = jax.tree_util.tree_flatten_with_path(like)
  leaves = []
  for i, (path, _) in enumerate(paths):
    node = restored
    for k in path:
      node = node.get(checkpoints.key_name(k)) if isinstance(node, Mapping) else None
      if node is None:
        break
    leaves.append(node if node is not None else flat_fresh[i][1])
  return jax.tree_util.tree_unflatten(treedef, leaves)
