"""The device mesh and the rules that map logical axis names onto it.

Models name every parameter and activation axis logically (`batch`, `embed`, `mlp`, `heads`, ...).
`Partitioner` owns a `('data', 'model')` mesh and a list of rules mapping those names to mesh axes;
everything downstream (initialisation, the train step, checkpoint restore) asks it for
`NamedSharding`s, so the same code runs on one CPU, eight simulated devices, or a pod.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LogicalAxisRules = Sequence[tuple[str, str | None]]

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


@gin.configurable
class Partitioner:
  """A device mesh with axes ('data', 'model') and the logical-axis rules for it.

  Attributes:
    num_partitions: size of the `model` mesh axis (tensor parallelism); the remaining devices
      form the `data` axis.
    logical_axis_rules: (logical name, mesh axis or None) pairs; first match wins.
  """

  def __init__(self, num_partitions: int = 1,
               logical_axis_rules: LogicalAxisRules = STANDARD_LOGICAL_AXIS_RULES,
               devices: Sequence[jax.Device] | None = None):
    devices = list(devices if devices is not None else jax.devices())
    if num_partitions < 1 or len(devices) % num_partitions:
      raise ValueError(
          f"Partitioner.num_partitions={num_partitions} must divide the number of devices "
          f"({len(devices)}).")
    grid = np.asarray(devices).reshape(len(devices) // num_partitions, num_partitions)
    self.mesh = Mesh(grid, ("data", "model"))
    self.logical_axis_rules = tuple(tuple(r) for r in logical_axis_rules)

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

  def check_batch_size(self, batch_size: int) -> None:
    if batch_size % (self.data_parallelism * jax.process_count()):
      raise ValueError(
          f"BATCH_SIZE={batch_size} must be divisible by the data-parallel size "
          f"{self.data_parallelism} (devices {jax.device_count()} / num_partitions "
          f"{self.mesh.shape['model']}).")
