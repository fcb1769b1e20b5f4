"""Per-layer representations of a checkpoint: restore an encoder, run it, pool its states.

Every t2t encoder follows the encoder protocol (docs/ARCHITECTURE.md, `classifier_api`):
`encoder(tokens [b, l], token_types, enable_dropout) -> [embeddings, layer 1, ..., layer n]`,
each [b, l, d]. `T5EncoderStates` reads a T5 encoder-decoder checkpoint's `token_embedder` and
`encoder` (the decoder is ignored), `BertEncoderStates` a BERT masked-LM or classifier
checkpoint's `encoder`, `BiLSTMEncoder` a BiLSTM classifier's `embedder` and `encoder`. So no
model needs editing: the states the protocol returns are the probe's layers, named
"embeddings", "layer_1", ..., "layer_n" (index 0 .. n).

Pooling over the non-padding tokens (id 0 is padding): "mean" (Peters et al.'s diagnostic
classifiers), "max", "first" (BERT's [CLS] position).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from t2t.training import checkpoints, warm_start

POOLINGS = ("mean", "max", "first")
_LAYER_PARAM = re.compile(r"(?:^|/)layers_(\d+)/")


def layer_names(num_states: int) -> list[str]:
  """Names of an encoder's states: "embeddings", then "layer_1" .. "layer_{n}"."""
  return ["embeddings"] + [f"layer_{i}" for i in range(1, num_states)]


def layer_index(layer: str | int) -> int:
  """0 for "embeddings"/0, i for "layer_i"/i."""
  if isinstance(layer, (int, np.integer)):
    return int(layer)
  if layer == "embeddings":
    return 0
  match = re.fullmatch(r"layer_(\d+)", str(layer))
  if not match:
    raise ValueError(f"unknown layer {layer!r}: use 'embeddings', 'layer_<i>' or an index.")
  return int(match.group(1))


def select_layers(requested: Sequence[str | int] | None, num_states: int,
                  where: str) -> list[str]:
  """The requested layers' names (all when None), or a clear error listing those ``where`` has."""
  have = layer_names(num_states)
  if requested is None:
    return have
  names = []
  for layer in requested:
    index = layer_index(layer)
    if not 0 <= index < num_states:
      raise ValueError(f"{where} has no layer {layer!r}; it has {num_states} states: "
                       f"{', '.join(have)}.")
    names.append(have[index])
  return names


def pool(states: jax.Array, valid: jax.Array, pooling: str) -> jax.Array:
  """[b, l, d] states, [b, l] bool non-padding mask -> [b, d] pooled over the valid tokens.

  "mean": average of the valid positions; "max": elementwise max over them; "first": the first
  position (index 0: [CLS] for BERT inputs). A row without a valid token pools to zeros.
  """
  if pooling not in POOLINGS:
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {POOLINGS}.")
  states = jnp.asarray(states, jnp.float32)
  mask = jnp.asarray(valid)[..., None]
  any_valid = jnp.any(mask, axis=1)
  if pooling == "mean":
    total = jnp.sum(jnp.where(mask, states, 0.0), axis=1)
    return total / jnp.maximum(jnp.sum(mask, axis=1), 1)
  if pooling == "max":
    return jnp.where(any_valid, jnp.max(jnp.where(mask, states, -jnp.inf), axis=1), 0.0)
  return jnp.where(any_valid, states[:, 0], 0.0)


def abstract_params(encoder: nn.Module, length: int = 8) -> Any:
  """The encoder's parameter shapes (unboxed ShapeDtypeStructs), without computing them."""
  tokens = jnp.ones((1, length), jnp.int32)
  shapes = jax.eval_shape(lambda: encoder.init(jax.random.PRNGKey(0), tokens, None, False))
  return nn.unbox(shapes["params"])


def checkpoint_num_states(saved_names: Iterable[str], scope: str = "encoder") -> int | None:
  """1 + the number of `{scope}/layers_{i}` blocks among a checkpoint's parameter names."""
  indices = {int(m.group(1)) for name in saved_names if name.startswith(scope + "/")
             for m in [_LAYER_PARAM.search(name)] if m}
  return 1 + max(indices) + 1 if indices else None


def load_encoder_params(encoder: nn.Module, path: str) -> tuple[Any, int]:
  """The encoder's parameters from checkpoint ``path`` (a model dir or `checkpoint_<N>`).

  Only the encoder's own parameters are read (a T5 decoder, an MLM or classifier head are
  skipped). A checkpoint lacking some, or with other shapes, is an error naming the layers the
  checkpoint has, e.g. when the gin model has more layers than the checkpoint.
  Returns (params, step).
  """
  model_dir, step = checkpoints.resolve_checkpoint(path)
  where = f"checkpoint {model_dir} (step {step})"
  abstract = abstract_params(encoder)
  manager = ocp.CheckpointManager(
      model_dir, item_names=("params", "meta"),
      options=ocp.CheckpointManagerOptions(step_prefix=checkpoints.STEP_PREFIX, read_only=True))
  step_dir = checkpoints.step_dir(model_dir, step)
  try:
    with checkpoints.reading(step_dir, "meta"):
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    saved = meta["param_shapes"]
    plan = warm_start.plan_restore(saved, checkpoints.param_shapes(abstract))
    if plan.reinitialised:
      have = checkpoint_num_states(saved)
      layers = f"its encoder has {', '.join(layer_names(have))}" if have else (
          "it has no encoder/layers_<i> parameters")
      if any(name.startswith("encoder/layers/") for name in saved):
        layers += (" (scanned layers, T5Config.scan_layers=True: probing needs the per-layer "
                   "form, see t2t.models.transformer.unstack_layer_params)")
      missing = warm_start.abbreviate(sorted(plan.reinitialised))
      raise ValueError(
          f"{where} does not fit the probed encoder ({type(encoder).__name__}): "
          f"{len(plan.reinitialised)} parameters missing or of another shape ({missing}); "
          f"{layers}. Use the model gin file the checkpoint was trained with.")
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                          abstract)
    with checkpoints.reading(step_dir, "params"):
      params = manager.restore(step, args=ocp.args.Composite(params=ocp.args.PyTreeRestore(
          item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
          partial_restore=True)))["params"]
  finally:
    manager.close()
  return params, step


def states_fn(encoder: nn.Module):
  """A jitted ``(params, tokens [b, l]) -> list of [b, l, d]`` running the encoder without dropout."""
  return jax.jit(lambda params, tokens: encoder.apply({"params": params}, tokens, None, False))


def pooled_features(encoder: nn.Module, params: Any, token_batches: Iterable[np.ndarray],
                    layers: Sequence[str | int] | None = None,
                    poolings: Sequence[str] = ("mean",), where: str = "the encoder"
                    ) -> dict[tuple[str, str], np.ndarray]:
  """{(layer name, pooling): float32 [n, d]} over all examples of ``token_batches`` ([b, l] each).

  Raises a clear error when a requested layer is beyond the encoder's states.
  """
  for p in poolings:
    if p not in POOLINGS:
      raise ValueError(f"unknown pooling {p!r}; choose one of {POOLINGS}.")
  run = states_fn(encoder)
  out: dict[tuple[str, str], list[np.ndarray]] = {}
  names = None
  for tokens in token_batches:
    tokens = jnp.asarray(tokens, jnp.int32)
    states = run(params, tokens)
    if names is None:
      names = select_layers(layers, len(states), where)
    valid = tokens > 0
    for name in names:
      layer_states = states[layer_index(name)]
      if layer_states.shape[1] != tokens.shape[1]:  # e.g. prompt positions prepended
        layer_states = layer_states[:, -tokens.shape[1]:]
      for p in poolings:
        out.setdefault((name, p), []).append(np.asarray(pool(layer_states, valid, p)))
  if names is None:
    raise ValueError(f"no examples to probe {where} with.")
  return {key: np.concatenate(chunks) for key, chunks in out.items()}


def token_states(encoder: nn.Module, params: Any, tokens: np.ndarray,
                 layer: str | int, where: str = "the encoder") -> np.ndarray:
  """One layer's token states float32 [b, l, d] (edge probing pools spans of them)."""
  states = states_fn(encoder)(params, jnp.asarray(tokens, jnp.int32))
  (name,) = select_layers([layer], len(states), where)
  return np.asarray(states[layer_index(name)], np.float32)


def as_batches(tokens: np.ndarray, batch_size: int) -> list[np.ndarray]:
  """[n, l] -> chunks of at most ``batch_size`` rows."""
  return [tokens[i:i + batch_size] for i in range(0, len(tokens), batch_size)]


def pad_tokens(sequences: Sequence[Sequence[int]], length: int,
               prefix: Sequence[int] = ()) -> np.ndarray:
  """Ragged token lists -> int32 [n, length], each ``prefix + tokens`` cut to ``length``, 0-padded."""
  out = np.zeros((len(sequences), length), np.int32)
  for i, seq in enumerate(sequences):
    row = [*prefix, *[int(t) for t in seq]][:length]
    out[i, :len(row)] = row
  return out


def by_layer(features: Mapping[tuple[str, str], np.ndarray]) -> list[str]:
  """Layer names in a features dict, in encoder order."""
  return sorted({layer for layer, _ in features}, key=layer_index)
