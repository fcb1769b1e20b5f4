"""The device mesh and the rules that map logical axis names onto it.

Models name every parameter and activation axis logically (`batch`, `embed`, `mlp`, `heads`, ...).
`Partitioner` owns a `('data', 'model')` mesh and a list of rules mapping those names to mesh axes;
everything downstream (initialisation, the train step, checkpoint restore) asks it for
`NamedSharding`s, so the same code runs on one CPU, eight simulated devices, or a pod.

The mesh is topology-aware (`jax.experimental.mesh_utils.create_device_mesh`; across slices or
processes `create_hybrid_device_mesh` with `dcn_data_parallelism`), and the rules come from named
presets (`RULE_PRESETS`: data parallel, 1-D model parallel, 2-D, FSDP) or an explicit list.
Optimizer slots get their parameter's sharding by tree path (`opt_state_shardings`).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LogicalAxisRules = Sequence[tuple[str, Any]]
MESH_AXES = ("data", "model")

# 1-D data parallelism plus Megatron-style model parallelism over `model`, as in t5x's
# standard rules: activations split by batch, weight matrices split on their wide axis.
STANDARD_LOGICAL_AXIS_RULES: LogicalAxisRules = (
    ("batch", "data"),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("kv", None),
    ("embed", None),
    ("length", None),
    ("relpos_buckets", None),
    ("layers", None),
    # Small axes of the baselines and adaptation methods: replicated.
    ("abspos", None),        # BERT learned positions
    ("token_types", None),   # BERT segment embeddings
    ("embed_out", None),     # BERT pooler / MLM transform output
    ("classes", None),       # classifier head output
    ("mix_layers", None),    # ELMo scalar mix weights
    ("lstm_gates", None),    # BiLSTM 4 * hidden gate axis
    ("lstm_hidden", None),
    ("adapter", None),       # adapter bottleneck
    ("prompt", None),        # prompt-tuning positions
    ("lora_rank", None),
)

# Every logical axis name a t2t model gives a parameter or an activation (the standard rules
# list them all); a rule naming anything else is a typo.
KNOWN_LOGICAL_AXES: tuple[str, ...] = tuple(name for name, _ in STANDARD_LOGICAL_AXIS_RULES)


def _with(rules: LogicalAxisRules, **mesh_axis_of: Any) -> tuple[tuple[str, Any], ...]:
  """`rules` with the mesh axis of some logical names replaced (order kept)."""
  return tuple((name, mesh_axis_of.get(name, axis)) for name, axis in rules)


# Pure data parallelism: batch over `data`, every parameter replicated.
DATA_PARALLEL_RULES = tuple((name, "data" if name == "batch" else None)
                            for name in KNOWN_LOGICAL_AXES)
# 1-D model parallelism (t5x standard rules): batch over `data`, wide weight axes over `model`.
MODEL_PARALLEL_RULES = tuple(STANDARD_LOGICAL_AXIS_RULES)
# 2-D parameter sharding (t5x `parameter_partitioning_dims=2`): as model parallel, and each
# weight's `embed` axis over `data` too. Activations keep batch on `data` (flax assigns a mesh
# axis once per array, and `batch` comes first), so their `embed` axis stays whole.
TWO_D_RULES = _with(MODEL_PARALLEL_RULES, embed="data")
# FSDP / ZeRO-3 (Rajbhandari et al. 2020, "ZeRO", §5.3, stage P_os+g+p): parameters
# and, through `opt_state_shardings`, optimizer state split over `data` on their `embed` axis
# (d_model: the axis every T5 weight matrix has); activations split by batch only. XLA gathers
# each weight before use and reduce-scatters its gradient.
FSDP_RULES = _with(DATA_PARALLEL_RULES, embed="data")

RULE_PRESETS: dict[str, tuple[tuple[str, Any], ...]] = {
    "data_parallel": DATA_PARALLEL_RULES,
    "model_parallel": MODEL_PARALLEL_RULES,
    "two_d": TWO_D_RULES,
    "fsdp": FSDP_RULES,
}


def resolve_rules(rules: LogicalAxisRules | str) -> tuple[tuple[str, Any], ...]:
  """The rules themselves, or the preset named by `rules`; checked against the known names.

  Raises ValueError naming an unknown preset, a rule for an unknown logical axis (listing the
  known ones), or a mesh axis other than 'data' / 'model'.
  """
  if isinstance(rules, str):
    if rules not in RULE_PRESETS:
      raise ValueError(f"Partitioner.logical_axis_rules: unknown preset {rules!r}; the presets "
                       f"are {sorted(RULE_PRESETS)}.")
    return RULE_PRESETS[rules]
  out = []
  for rule in rules:
    if len(rule) != 2:
      raise ValueError(f"Partitioner.logical_axis_rules: {rule!r} is not a (logical axis, mesh "
                       "axis) pair.")
    name, axis = rule
    if name not in KNOWN_LOGICAL_AXES:
      raise ValueError(f"Partitioner.logical_axis_rules: unknown logical axis {name!r}; the "
                       f"models use {', '.join(KNOWN_LOGICAL_AXES)}.")
    for a in (axis if isinstance(axis, (tuple, list)) else (axis,)):
      if a is not None and a not in MESH_AXES:
        raise ValueError(f"Partitioner.logical_axis_rules: rule {rule!r} names mesh axis {a!r}; "
                         f"the mesh axes are {MESH_AXES}.")
    out.append((name, tuple(axis) if isinstance(axis, list) else axis))
  return tuple(out)


def device_grid(devices: Sequence[Any], num_data: int, num_model: int,
                dcn_data_parallelism: int = 1) -> np.ndarray:
  """A [num_data, num_model] array of `devices`, laid out for the interconnect.

  One slice: `mesh_utils.create_device_mesh`, which on TPUs follows the physical torus (the
  `model` axis, the most communication-heavy, on the fastest links) and on CPU / GPU is a plain
  reshape (GPUs sorted by id). With `dcn_data_parallelism` > 1 the devices form that many
  granules (TPU slices by `slice_index`, else processes), and `create_hybrid_device_mesh` puts
  only the `data` axis across the slow data-centre network between them.
  """
  if dcn_data_parallelism < 1 or num_data % dcn_data_parallelism:
    raise ValueError(f"Partitioner.dcn_data_parallelism={dcn_data_parallelism} must divide the "
                     f"data-parallel size {num_data}.")
  if dcn_data_parallelism == 1:
    try:
      return mesh_utils.create_device_mesh((num_data, num_model), devices)
    except (ValueError, NotImplementedError, AssertionError) as e:
      # Odd TPU sub-slices the topology code does not handle: a plain reshape still works.
      logging.warning("create_device_mesh failed (%s); using the devices in their listed order.", e)
      return np.asarray(devices).reshape(num_data, num_model)
  by_slice = hasattr(devices[0], "slice_index")
  key = "slice_index" if by_slice else "process_index"
  granules = sorted({getattr(d, key) for d in devices})
  if len(granules) != dcn_data_parallelism:
    raise ValueError(
        f"Partitioner.dcn_data_parallelism={dcn_data_parallelism}, but the {len(devices)} devices "
        f"form {len(granules)} {'slices' if by_slice else 'processes'}.")
  return mesh_utils.create_hybrid_device_mesh(
      (num_data // dcn_data_parallelism, num_model), (dcn_data_parallelism, 1), devices,
      process_is_granule=not by_slice)


@gin.configurable
class Partitioner:
  """A device mesh with axes ('data', 'model') and the logical-axis rules for it.

  Attributes:
    num_partitions: size of the `model` mesh axis (tensor parallelism); the remaining devices
      form the `data` axis.
    logical_axis_rules: (logical name, mesh axis or None) pairs, first match wins; or the name of
      a preset in `RULE_PRESETS` ('data_parallel', 'model_parallel', 'two_d', 'fsdp').
    dcn_data_parallelism: how many slices (or processes) the `data` axis spans over the
      data-centre network; 1 = a single slice.
    num_data_partitions: size of the `data` axis; None = all devices / num_partitions. Given
      explicitly, data x model must equal the number of devices.
  """

  def __init__(self, num_partitions: int = 1,
               logical_axis_rules: LogicalAxisRules | str = STANDARD_LOGICAL_AXIS_RULES,
               devices: Sequence[jax.Device] | None = None,
               dcn_data_parallelism: int = 1,
               num_data_partitions: int | None = None):
    devices = list(devices if devices is not None else jax.devices())
    if num_partitions < 1 or num_partitions > len(devices):
      raise ValueError(f"Partitioner.num_partitions={num_partitions} asks for a mesh larger than "
                       f"the {len(devices)} devices." if num_partitions > len(devices) else
                       f"Partitioner.num_partitions={num_partitions} must be >= 1.")
    if len(devices) % num_partitions:
      raise ValueError(
          f"Partitioner.num_partitions={num_partitions} must divide the number of devices "
          f"({len(devices)}).")
    num_data = len(devices) // num_partitions
    if num_data_partitions is not None and num_data_partitions != num_data:
      raise ValueError(
          f"Partitioner mesh (data {num_data_partitions} x model {num_partitions}) = "
          f"{num_data_partitions * num_partitions} devices, but there are {len(devices)}: "
          + ("the mesh is larger than the devices." if num_data_partitions > num_data else
             "every device must be in the mesh."))
    self.logical_axis_rules = resolve_rules(logical_axis_rules)
    grid = device_grid(devices, num_data, num_partitions, dcn_data_parallelism)
    self.mesh = Mesh(grid, MESH_AXES)

  @property
  def data_parallelism(self) -> int:
    return self.mesh.shape["data"]

  @property
  def data_sharding(self) -> NamedSharding:
    """Sharding of a batch: leading (batch) axis over `data`."""
    return NamedSharding(self.mesh, PartitionSpec("data"))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  def shardings_for(self, boxed_tree: Any) -> Any:
    """NamedShardings for a tree whose leaves may be `nn.LogicallyPartitioned` boxes.

    Unannotated leaves are replicated.
    """
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, self.mesh, self.logical_axis_rules)

  @contextlib.contextmanager
  def activation_context(self) -> Iterator[None]:
    """Mesh and rules in scope, so the models' `nn.with_logical_constraint` calls take effect.

    Jitted functions must be traced (first called) inside it.
    """
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.logical_axis_rules):
      yield

  def shard_batch(self, batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    """Places a host-local numpy batch on the mesh, split along the batch axis."""
    return {k: jax.make_array_from_process_local_data(self.data_sharding, v)
            for k, v in batch.items()}

  def local_data_parallelism(self) -> int:
    """How many distinct `data` shards this process's devices hold (its batch is split so)."""
    me = jax.process_index()
    rows = {i for (i, _), d in np.ndenumerate(self.mesh.devices)
            if getattr(d, "process_index", 0) == me}
    return len(rows)

  def check_batch_size(self, batch_size: int, num_microbatches: int = 1) -> None:
    """Raises ValueError unless the global `batch_size` splits evenly: over the processes (each
    reads batch_size / process_count examples), over its `data` shards, and into
    `num_microbatches` microbatches that each still split over the whole `data` axis."""
    processes = jax.process_count()
    sizes = (f"data-parallel size {self.data_parallelism} (devices {self.mesh.size} / "
             f"num_partitions {self.mesh.shape['model']})")
    if num_microbatches < 1:
      raise ValueError(f"Trainer.num_microbatches={num_microbatches} must be >= 1.")
    if batch_size % processes or (batch_size // processes) % self.local_data_parallelism():
      raise ValueError(
          f"BATCH_SIZE={batch_size} must be divisible by the {processes} processes and then by "
          f"each process's {self.local_data_parallelism()} data shards ({sizes}).")
    if batch_size % (self.data_parallelism * num_microbatches):
      raise ValueError(
          f"BATCH_SIZE={batch_size} must be divisible by the {sizes}"
          + (f" times Trainer.num_microbatches={num_microbatches}." if num_microbatches > 1
             else "."))


# ------------------------------------------------------------------ shardings of derived trees
def _path_names(path: Sequence[Any]) -> tuple[str, ...]:
  out = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        out.append(str(getattr(k, attr)))
        break
    else:
      out.append(str(k))
  return tuple(out)


def _fits(shape: Sequence[int], spec: Sequence[Any], mesh: Mesh) -> bool:
  for dim, axis in zip(shape, spec):
    axes = axis if isinstance(axis, tuple) else (axis,)
    if dim % int(np.prod([mesh.shape[a] for a in axes if a is not None])):
      return False
  return True


def _dropped_axis_spec(slot_names: tuple[str, ...], param_shape: tuple[int, ...],
                       spec: tuple[Any, ...], slot_shape: tuple[int, ...]) -> tuple | None:
  """The spec of a slot shaped like its parameter with one axis removed or kept as size 1.

  AdaFactor's factored moments (Shazeer & Stern 2018, §3; optax's `_factored_dims`): `v_row`
  drops the largest axis, `v_col` the second largest. Other one-axis reductions are recognised
  by shape; when two axes could have been dropped and their sub-specs differ, None (replicate).
  """
  n = len(param_shape)
  if len(slot_shape) == n and all(s in (p, 1) for s, p in zip(slot_shape, param_shape)):
    return tuple(a if s == p else None for s, p, a in zip(slot_shape, param_shape, spec))
  if len(slot_shape) != n - 1:
    return None
  candidates = [i for i in range(n) if param_shape[:i] + param_shape[i + 1:] == slot_shape]
  if not candidates:
    return None
  order = np.argsort(param_shape)  # the call optax makes, so ties break the same way
  named = {"v_row": int(order[-1]), "v_col": int(order[-2])} if n >= 2 else {}
  for name, axis in named.items():
    if name in slot_names and axis in candidates:
      candidates = [axis]
  subs = {spec[:i] + spec[i + 1:] for i in candidates}
  return subs.pop() if len(subs) == 1 else None


def opt_state_shardings(opt_abstract: Any, params_abstract: Any, params_shardings: Any,
                        mesh: Mesh) -> Any:
  """NamedShardings for an optimizer state, from the parameter tree's structure.

  Optax states hold trees shaped like the parameters (Adam's `mu`/`nu`, AdaFactor's `v_row`,
  `v_col`, `v`, masked states of `multi_transform`), so a slot whose tree path ENDS with a
  parameter's path belongs to that parameter: same shape -> the parameter's sharding; one axis
  dropped or kept as 1 (factored moments) -> the matching sub-spec; any other shape (scalars,
  AdaFactor's (1,) placeholders, counts, learning-rate factors) -> replicated. Two parameters of
  the same shape keep their own shardings. A sub-spec that does not divide the slot replicates.
  """
  replicated = NamedSharding(mesh, PartitionSpec())
  by_path: dict[tuple[str, ...], tuple[tuple[int, ...], tuple]] = {}
  for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(params_abstract)[0],
                                    jax.tree.leaves(params_shardings)):
    spec = tuple(sharding.spec) + (None,) * (len(leaf.shape) - len(sharding.spec))
    by_path[_path_names(path)] = (tuple(leaf.shape), spec)
  lengths = sorted({len(p) for p in by_path}, reverse=True)

  def one(path, leaf):
    names = _path_names(path)
    shape = tuple(getattr(leaf, "shape", ()))
    for n in lengths:  # the longest parameter path that is a suffix of this slot's path
      if n > len(names) or names[len(names) - n:] not in by_path:
        continue
      param_shape, spec = by_path[names[len(names) - n:]]
      if shape == param_shape:
        sub = spec
      else:
        sub = _dropped_axis_spec(names[:len(names) - n], param_shape, spec, shape)
      if sub is None or all(a is None for a in sub) or not _fits(shape, sub, mesh):
        return replicated
      return NamedSharding(mesh, PartitionSpec(*sub))
    return replicated

  return jax.tree_util.tree_map_with_path(one, opt_abstract)


def check_divisible(abstract: Any, shardings: Any, what: str = "parameter") -> None:
  """Raises ValueError naming the first array whose dimension the mesh does not divide.

  jit would refuse it too, but by flattened-argument index; this names the parameter, its shape
  and the spec, before anything is compiled.
  """
  for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(abstract)[0],
                                    jax.tree.leaves(shardings)):
    spec = tuple(sharding.spec)
    if not _fits(leaf.shape, spec, sharding.mesh):
      raise ValueError(
          f"The {what} {'/'.join(_path_names(path))} of shape {tuple(leaf.shape)} cannot be "
          f"split as {PartitionSpec(*spec)} over the mesh {dict(sharding.mesh.shape)}: choose "
          "other logical_axis_rules / num_partitions or model dimensions divisible by them.")
