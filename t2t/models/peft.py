"""Parameter-efficient fine-tuning: modules and a model wrapper that add a few trainable parameters.

- `Adapter`: T5 §3.5.2 / Table 10 (after Houlsby et al. 2019): a dense-ReLU-dense block with a
  residual after every feed-forward network; the T5 layers build it when `T5Config.adapter_dim > 0`.
- `Adapter` is also built by BERT (`BertConfig.adapter_dim`, on each FFN output, Houlsby et al.)
  and the BiLSTM (`BiLSTMConfig.adapter_dim`, after each BiLSTM layer).
- `PromptEmbedding`: prompt tuning (Lester et al. 2021): `{T5,Bert,BiLSTM}Config.num_prompt_tokens`
  learned vectors prepended to the embedded encoder input (T5 encoder-decoder and T5 classifier
  encoder, BERT, BiLSTM; each family's docstring says where exactly).
- `LoraModel`: LoRA (Hu et al. 2021, §4.1) for any model family, in parameter space: it wraps a
  model of the t2t API, adds low-rank factors next to the chosen kernels, and runs the base model
  on W + (alpha / r) A B. `merge` turns its parameters into a plain base-model tree for export.

Which parameters train is the optimizer's business (`t2t.training.adaptation.adapted`, see
gin/adaptation/*.gin): these only add parameters. New parameter names: `adapter/{wi,wo}/kernel`,
`prompt/embedding`, `<kernel>_lora_a` / `<kernel>_lora_b` beside each LoRA target.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t2t.models import layers

Array = jax.Array
LORA_A, LORA_B = '_lora_a', '_lora_b'


class Adapter(nn.Module):
  """x + wo(relu(wi x)): [b, l, d] -> [b, l, d] with an inner width `d_adapter`.

  `wo` starts at zero, so a freshly added adapter is exactly the identity and fine-tuning starts
  from the pre-trained function (Houlsby et al. 2019 §2.1 use a near-identity initialisation).
  """
  d_adapter: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    d = x.shape[-1]
    h = layers.DenseGeneral(self.d_adapter, kernel_axes=('embed', 'adapter'),
                            kernel_init=nn.initializers.normal(d ** -0.5), dtype=self.dtype,
                            param_dtype=self.param_dtype, name='wi')(x)
    h = nn.with_logical_constraint(jax.nn.relu(h), ('batch', 'length', 'adapter'))
    out = layers.DenseGeneral(d, kernel_axes=('adapter', 'embed'),
                              kernel_init=nn.initializers.zeros, dtype=self.dtype,
                              param_dtype=self.param_dtype, name='wo')(h)
    return x + out


class PromptEmbedding(nn.Module):
  """`num_tokens` learned input vectors [n, d], broadcast over the batch: -> [b, n, d].

  Initialised N(0, init_stddev^2); the default 1.0 is T5's token-embedding initialisation (a
  family passes its own embeddings' scale, e.g. the BiLSTM's embed_dim ** -0.5).
  """
  num_tokens: int
  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  init_stddev: float = 1.0

  @nn.compact
  def __call__(self, batch_size: int) -> Array:
    table = self.param('embedding', nn.with_logical_partitioning(
        nn.initializers.normal(self.init_stddev), ('prompt', 'embed')), (self.num_tokens, self.features),
                       self.param_dtype)
    return jnp.broadcast_to(jnp.asarray(table, self.dtype)[None],
                            (batch_size, self.num_tokens, self.features))


# ----------------------------------------------------------------------------- LoRA
def _split_axis(shape: tuple[int, ...], names: Sequence[str | None] | None) -> int:
  """How many leading kernel axes are its input: all but the last for a projection back into the
  residual stream (last axis 'embed', e.g. attention `out` [heads, kv, embed]), else the first."""
  if len(shape) > 2 and names is not None and names[-1] == 'embed':
    return len(shape) - 1
  return 1


def merge(params: Mapping[str, Any], scale: float) -> dict[str, Any]:
  """A base-model parameter tree: every `k_lora_a`/`k_lora_b` pair folded into `k`.

  W [*in, *out] + scale * A [*in, r] . B [r, *out], computed in float32, stored in W's dtype.
  """
  flat = traverse_util.flatten_dict(dict(params), sep='/')
  out = {k: v for k, v in flat.items() if not k.endswith((LORA_A, LORA_B))}
  for key in flat:
    if key.endswith(LORA_A):
      target = key[:-len(LORA_A)]
      a = jnp.asarray(flat[key], jnp.float32)
      b = jnp.asarray(flat[target + LORA_B], jnp.float32)
      w = out[target]
      out[target] = (w + scale * jnp.tensordot(a, b, axes=1)).astype(w.dtype)
  return traverse_util.unflatten_dict(out, sep='/')


@gin.configurable
class LoraModel:
  """LoRA around any t2t model: params = the base's + `<target>_lora_a` [*in, r] and
  `<target>_lora_b` [r, *out] beside each target kernel; every method runs the base model on
  `merge(params)`, i.e. W + (alpha / rank) A B (Hu et al. 2021, eq. 3; B starts at zero, A is
  Gaussian, so the wrapped model starts as the base model).

  targets: regexes over '/'-joined parameter paths (e.g. `attention/(query|value)/kernel$`, the
  paper's W_q and W_v); each must match at least one parameter. Other attributes (vocabularies,
  `feature_converter_cls`, ...) are the base model's. Gradients reach W + scale A B as a whole, so
  a step costs about what full fine-tuning costs; the savings are optimizer state and storage.
  """

  def __init__(self, base: Any = gin.REQUIRED, targets: Sequence[str] = gin.REQUIRED,
               rank: int = 8, alpha: float = 16.0):
    if not isinstance(rank, (int, np.integer)) or rank < 1:
      raise ValueError(f'LoraModel.rank must be a positive integer, got {rank!r}.')
    if isinstance(base, LoraModel):
      raise ValueError('LoraModel.base is already a LoraModel; wrap the plain model once.')
    self.base, self.targets, self.rank, self.alpha = base, tuple(targets), int(rank), float(alpha)
    self.scale = self.alpha / self.rank

  def __getattr__(self, name: str) -> Any:
    if name == 'base':  # not yet set (e.g. during unpickling): no recursion
      raise AttributeError(name)
    return getattr(self.base, name)

  def get_initial_variables(self, rng: Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """The base model's boxed variables plus the LoRA factors (logical axes: the kernel's input
    axes + 'lora_rank', and 'lora_rank' + its output axes)."""
    from t2t.training import adaptation  # pylint: disable=g-import-not-at-top  (no cycle at import)
    base_rng, lora_rng = jax.random.split(rng)
    variables = dict(self.base.get_initial_variables(base_rng, input_shapes, input_types))
    flat = traverse_util.flatten_dict(dict(variables['params']), sep='/')
    paths = sorted(flat)
    hit = adaptation.match_paths(paths, self.targets, 'LoraModel.targets')
    for i, (path, is_target) in enumerate(zip(paths, hit)):
      if not is_target:
        continue
      if path.endswith((LORA_A, LORA_B)):
        raise ValueError(f'LoraModel.targets: {path!r} is itself a LoRA factor.')
      leaf = flat[path]
      names = getattr(leaf, 'names', None)
      value = nn.unbox(leaf)
      if value.ndim < 2:
        raise ValueError(f'LoraModel.targets: {path!r} has shape {value.shape}; LoRA needs a '
                         'kernel with at least two axes. Narrow the pattern (e.g. end it in '
                         '"kernel$").')
      if names is not None and names[0] == 'layers':
        raise ValueError(f'LoraModel.targets: {path!r} is a scanned stack ([layers, ...]); '
                         'set T5Config.scan_layers = False for LoRA.')
      k = _split_axis(value.shape, names)
      in_shape, out_shape = value.shape[:k], value.shape[k:]
      fan_in = int(np.prod(in_shape))
      a = jax.random.normal(jax.random.fold_in(lora_rng, i), (*in_shape, self.rank),
                            value.dtype) * fan_in ** -0.5
      b = jnp.zeros((self.rank, *out_shape), value.dtype)
      in_names = tuple(names[:k]) if names is not None else (None,) * k
      out_names = tuple(names[k:]) if names is not None else (None,) * len(out_shape)
      flat[path + LORA_A] = nn.LogicallyPartitioned(a, (*in_names, 'lora_rank'))
      flat[path + LORA_B] = nn.LogicallyPartitioned(b, ('lora_rank', *out_names))
    variables['params'] = traverse_util.unflatten_dict(flat, sep='/')
    return variables

  def merge(self, params: Mapping[str, Any]) -> dict[str, Any]:
    """The equivalent base-model parameters (for export or for serving without the wrapper)."""
    return merge(params, self.scale)

  def loss_fn(self, params: Any, batch: Mapping[str, Array],
              dropout_rng: Array | None) -> tuple[Array, dict[str, Array]]:
    return self.base.loss_fn(self.merge(params), batch, dropout_rng)

  def predict_batch(self, params: Any, batch: Mapping[str, Array],
                    max_decode_length: int | None = None, rng: Array | None = None) -> Array:
    return self.base.predict_batch(self.merge(params), batch, max_decode_length=max_decode_length,
                                   rng=rng)

  def score_batch(self, params: Any, batch: Mapping[str, Array]) -> Array:
    return self.base.score_batch(self.merge(params), batch)


def merge_checkpoint(lora_path: str, out_dir: str, alpha: float) -> str:
  """Writes a plain base-model checkpoint (params only) from a LoRA run's checkpoint.

  `lora_path`: a model directory (its latest step) or a `checkpoint_<N>` directory;
  `alpha`: the run's LoraModel.alpha (the rank is read from the factors). Returns the directory
  written (`out_dir/checkpoint_<N>`), loadable as INITIAL_CHECKPOINT_PATH or by eval/infer with the
  base model's gin.
  """
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from t2t.training import checkpoints  # pylint: disable=g-import-not-at-top
  model_dir, step = checkpoints.resolve_checkpoint(lora_path)
  manager = ocp.CheckpointManager(model_dir, item_names=('params',), options=(
      ocp.CheckpointManagerOptions(step_prefix=checkpoints.STEP_PREFIX, read_only=True)))
  try:
    with checkpoints.reading(checkpoints.step_dir(model_dir, step), 'params'):
      params = manager.restore(step, args=ocp.args.Composite(
          params=ocp.args.StandardRestore()))['params']
  finally:
    manager.close()
  ranks = {int(np.shape(v)[-1]) for k, v in traverse_util.flatten_dict(params, sep='/').items()
           if k.endswith(LORA_A)}
  if len(ranks) != 1:
    raise ValueError(f'{lora_path} holds no LoRA factors (*{LORA_A}); is it a LoraModel run?'
                     if not ranks else f'{lora_path}: LoRA factors of several ranks {ranks}.')
  merged = jax.device_get(merge(params, alpha / ranks.pop()))
  ckpt = checkpoints.Checkpointer(out_dir, keep=None)
  try:
    ckpt.save(step, merged, {}, {'merged_from': os.path.abspath(lora_path)})
  finally:
    ckpt.close()
  return os.path.join(os.path.abspath(out_dir), f'{checkpoints.STEP_PREFIX}_{step}')
