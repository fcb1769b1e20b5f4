"""Orbax checkpoints: parameters, optimizer state and run metadata, one directory per step.

Layout under MODEL_DIR: `checkpoint_<step>/{params,opt_state,meta}`. `meta` is JSON: the step, how
many batches the input pipeline has consumed (for an exact resume), and every parameter's shape,
which lets t2t refuse an incompatible checkpoint with a readable message before anything is
restored or overwritten. Parameters are a separate item so fine-tuning can load them alone.
Arrays are restored with the shardings the caller asks for, so a checkpoint written on one
mesh loads onto another.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

STEP_PREFIX = "checkpoint"


class CheckpointMismatchError(ValueError):
  """A checkpoint does not fit the configured model (different parameters or shapes)."""


def param_shapes(params: Any) -> dict[str, list[int]]:
  """{'encoder/layers_0/.../kernel': shape} for every leaf of a parameter tree."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {"/".join(_key_name(k) for k in path): list(np.shape(leaf)) for path, leaf in flat}


def _key_name(key: Any) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def check_compatible(saved: Mapping[str, list[int]], expected: Mapping[str, list[int]],
                     where: str) -> None:
  """Raises CheckpointMismatchError naming the first parameter that differs."""
  for name in sorted(set(saved) | set(expected)):
    if name not in saved:
      raise CheckpointMismatchError(
          f"The checkpoint at {where} does not fit the configured model: parameter '{name}' "
          f"(shape {tuple(expected[name])}) is missing from the checkpoint. Was it written by "
          "another model configuration? Use a fresh MODEL_DIR or the matching model gin file.")
    if name not in expected:
      raise CheckpointMismatchError(
          f"The checkpoint at {where} does not fit the configured model: it has parameter "
          f"'{name}' (shape {tuple(saved[name])}) that the model lacks. Use a fresh MODEL_DIR "
          "or the matching model gin file.")
    if list(saved[name]) != list(expected[name]):
      raise CheckpointMismatchError(
          f"The checkpoint at {where} does not fit the configured model: parameter '{name}' "
          f"has shape {tuple(saved[name])} in the checkpoint but {tuple(expected[name])} in the "
          "model. Use a fresh MODEL_DIR or the matching model gin file.")


def _abstract(tree: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


class Checkpointer:
  """Saves and restores training state in a model directory."""

  def __init__(self, model_dir: str, keep: int | None = 3):
    self.model_dir = os.path.abspath(model_dir)
    self._manager = ocp.CheckpointManager(
        self.model_dir,
        item_names=("params", "opt_state", "meta"),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, step_prefix=STEP_PREFIX, create=True,
            enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def read_meta(self, step: int) -> dict[str, Any]:
    return dict(self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
                ["meta"])

  def check(self, params_abstract: Any) -> None:
    """Refuses a latest checkpoint whose parameters do not match `params_abstract`."""
    step = self.latest_step()
    if step is not None:
      check_compatible(self.read_meta(step)["param_shapes"], param_shapes(params_abstract),
                       os.path.join(self.model_dir, f"{STEP_PREFIX}_{step}"))

  def save(self, step: int, params: Any, opt_state: Any, meta: Mapping[str, Any]) -> None:
    meta = {**meta, "step": int(step), "param_shapes": param_shapes(params)}
    items = {"params": ocp.args.StandardSave(params), "meta": ocp.args.JsonSave(meta)}
    if jax.tree.leaves(opt_state):  # a stateless optimizer (SGD) has nothing to save
      items["opt_state"] = ocp.args.StandardSave(opt_state)
    self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, params: Any, params_shardings: Any, opt_state: Any,
              opt_state_shardings: Any) -> tuple[Any, Any, dict[str, Any]]:
    """Restores (params, opt_state, meta) at `step` onto the given shardings."""
    self.check(params)
    items = {"params": ocp.args.StandardRestore(_abstract(params, params_shardings)),
             "meta": ocp.args.JsonRestore()}
    if jax.tree.leaves(opt_state):
      items["opt_state"] = ocp.args.StandardRestore(_abstract(opt_state, opt_state_shardings))
    out = self._manager.restore(step, args=ocp.args.Composite(**items))
    return out["params"], out.get("opt_state", opt_state), dict(out["meta"])

  def close(self) -> None:
    self._manager.close()


def resolve_checkpoint(path: str) -> tuple[str, int]:
  """(model_dir, step) for a model directory (its latest step) or a `checkpoint_<N>` dir."""
  path = os.path.abspath(path)
  base = os.path.basename(path.rstrip("/"))
  if base.startswith(STEP_PREFIX + "_") and base[len(STEP_PREFIX) + 1:].isdigit():
    return os.path.dirname(path), int(base[len(STEP_PREFIX) + 1:])
  if not os.path.isdir(path):
    raise FileNotFoundError(f"Checkpoint path '{path}' does not exist.")
  steps = sorted(int(d[len(STEP_PREFIX) + 1:]) for d in os.listdir(path)
                 if d.startswith(STEP_PREFIX + "_") and d[len(STEP_PREFIX) + 1:].isdigit())
  if not steps:
    raise FileNotFoundError(
        f"No checkpoint in '{path}': expected a model directory holding {STEP_PREFIX}_<step> "
        f"directories, or one {STEP_PREFIX}_<step> directory.")
  return path, steps[-1]


def load_params(path: str, params_abstract: Any, params_shardings: Any) -> tuple[Any, int]:
  """Loads parameters alone (no optimizer state) from a checkpoint, e.g. to fine-tune.

  Returns (params, step). Raises CheckpointMismatchError when the shapes differ.
  """
  model_dir, step = resolve_checkpoint(path)
  manager = ocp.CheckpointManager(
      model_dir, item_names=("params", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix=STEP_PREFIX, read_only=True))
  try:
    meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    check_compatible(meta["param_shapes"], param_shapes(params_abstract),
                     os.path.join(model_dir, f"{STEP_PREFIX}_{step}"))
    params = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(_abstract(params_abstract, params_shardings))))["params"]
  finally:
    manager.close()
  return params, step
