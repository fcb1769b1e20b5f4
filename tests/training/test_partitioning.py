"""Tests for t2t/training/partitioning.py, on 1 device and on 8 simulated devices."""
import os
import subprocess
import sys
import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from t2t.training import adaptation, optim, partitioning
from t2t.training.partitioning import Partitioner
from tests.support.environment import xla_flags_with


class _Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    w = self.param("wi", nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp")),
                   (x.shape[-1], 16))
    return nn.with_logical_constraint(x @ w, ("batch", "mlp"))


def test_single_device_mesh_and_batch_placement():
  p = Partitioner()
  assert p.mesh.axis_names == ("data", "model") and p.data_parallelism == 1
  batch = p.shard_batch({"x": np.ones((4, 3), np.int32)})
  assert batch["x"].shape == (4, 3)


def test_logical_names_map_to_mesh_axes():
  p = Partitioner()
  boxed = jax.eval_shape(_Mlp().init, jax.random.PRNGKey(0), jnp.ones((2, 8)))
  shardings = p.shardings_for(boxed)
  assert shardings["params"]["wi"].spec == PartitionSpec(None, "model")


def test_bad_partitioning_is_reported():
  with pytest.raises(ValueError, match="num_partitions=3 must divide"):
    Partitioner(num_partitions=3, devices=jax.devices() * 4)
  with pytest.raises(ValueError, match="BATCH_SIZE=3"):
    Partitioner(devices=jax.devices() * 2).check_batch_size(3)


def test_eight_devices_split_data_and_model_axes():
  code = textwrap.dedent("""
      import jax, jax.numpy as jnp, numpy as np, flax.linen as nn
      from t2t.training.partitioning import Partitioner
      from tests.training.test_partitioning import _Mlp
      p = Partitioner(num_partitions=2)
      assert dict(p.mesh.shape) == {"data": 4, "model": 2}, p.mesh.shape
      boxed = jax.eval_shape(_Mlp().init, jax.random.PRNGKey(0), jnp.ones((2, 8)))
      sh = p.shardings_for(boxed)
      params = jax.jit(lambda r: nn.unbox(_Mlp().init(r, jnp.ones((2, 8)))), out_shardings=sh)(
          jax.random.PRNGKey(0))
      wi = params["params"]["wi"]
      assert len(wi.sharding.device_set) == 8
      assert wi.addressable_shards[0].data.shape == (8, 8)  # mlp split over model=2
      batch = p.shard_batch({"x": np.ones((8, 8), np.float32)})
      assert batch["x"].addressable_shards[0].data.shape == (2, 8)  # batch split over data=4
      with p.activation_context():  # the activation constraint is honoured only inside it
        y = jax.jit(lambda prm, b: _Mlp().apply(prm, b["x"]))(params, batch)
      np.testing.assert_allclose(np.asarray(y), 8.0)
      assert y.sharding.spec == jax.sharding.PartitionSpec("data", "model"), y.sharding
      print("OK")
  """)
  env = {**os.environ, "XLA_FLAGS": xla_flags_with("--xla_force_host_platform_device_count=8"),
         "JAX_PLATFORMS": "cpu"}
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK" in out.stdout


# ------------------------------------------------------------------ presets, mesh, checks
def test_presets_shard_parameters_as_named():
  boxed = jax.eval_shape(_Mlp().init, jax.random.PRNGKey(0), jnp.ones((2, 8)))
  expected = {"data_parallel": PartitionSpec(None, None),
              "model_parallel": PartitionSpec(None, "model"),
              "two_d": PartitionSpec("data", "model"),
              "fsdp": PartitionSpec("data", None)}
  for name, spec in expected.items():
    p = Partitioner(logical_axis_rules=name)
    assert p.logical_axis_rules == partitioning.RULE_PRESETS[name]
    assert p.shardings_for(boxed)["params"]["wi"].spec == spec, name
    # Activations: batch over data in every preset; embed stays whole next to it.
    assert nn.logical_to_mesh_axes(("batch", "length", "embed"), p.logical_axis_rules) == \
        PartitionSpec("data", None, None), name


def test_bad_rules_are_reported_with_the_known_names():
  with pytest.raises(ValueError, match=r"unknown logical axis 'emebd'; the models use batch, "
                                       r"vocab, mlp"):
    Partitioner(logical_axis_rules=[("batch", "data"), ("emebd", "model")])
  with pytest.raises(ValueError, match=r"unknown preset 'fdsp'.*'fsdp'"):
    Partitioner(logical_axis_rules="fdsp")
  with pytest.raises(ValueError, match=r"names mesh axis 'tensor'"):
    Partitioner(logical_axis_rules=[("mlp", "tensor")])


def test_mesh_larger_than_the_devices_is_refused():
  with pytest.raises(ValueError, match=r"num_partitions=16 asks for a mesh larger than the 8 "):
    Partitioner(num_partitions=16, devices=jax.devices() * 8)
  with pytest.raises(ValueError, match=r"\(data 4 x model 2\) = 8 devices, but there are 4: the "
                                       r"mesh is larger"):
    Partitioner(num_partitions=2, num_data_partitions=4, devices=jax.devices() * 4)


def test_batch_must_split_into_microbatches_over_the_data_axis():
  p = Partitioner(devices=jax.devices() * 4)  # data axis of 4
  p.check_batch_size(8)
  p.check_batch_size(8, num_microbatches=2)
  with pytest.raises(ValueError, match=r"BATCH_SIZE=8 must be divisible by the data-parallel size "
                                       r"4 .* times Trainer.num_microbatches=4"):
    p.check_batch_size(8, num_microbatches=4)
  with pytest.raises(ValueError, match=r"BATCH_SIZE=6 .* 4 data shards"):
    p.check_batch_size(6)


class _FakeDevice:
  """Enough of a device for mesh_utils' CPU path: id, platform, kind, process."""

  def __init__(self, i, process):
    self.id, self.process_index = i, process
    self.platform = self.device_kind = "cpu"

  def __repr__(self):
    return f"D{self.id}@{self.process_index}"


def test_hybrid_mesh_puts_only_the_data_axis_across_processes():
  devices = [_FakeDevice(i, i // 4) for i in range(8)]  # 2 processes x 4 devices
  grid = partitioning.device_grid(devices, num_data=4, num_model=2, dcn_data_parallelism=2)
  assert grid.shape == (4, 2)
  # Each model group (a row) lies within one process; the data axis spans both.
  assert [{d.process_index for d in row} for row in grid] == [{0}, {0}, {1}, {1}]
  assert [[d.id for d in row] for row in grid] == [[0, 1], [2, 3], [4, 5], [6, 7]]
  with pytest.raises(ValueError, match=r"dcn_data_parallelism=4, but the 8 devices form 2 "
                                       r"processes"):
    partitioning.device_grid(devices, num_data=4, num_model=2, dcn_data_parallelism=4)
  with pytest.raises(ValueError, match=r"dcn_data_parallelism=3 must divide the data-parallel "
                                       r"size 4"):
    partitioning.device_grid(devices, num_data=4, num_model=2, dcn_data_parallelism=3)


# ------------------------------------------------------------------ optimizer-state shardings
class _TwoSame(nn.Module):
  """Two (8, 6) kernels with different logical axes, a factored-size matrix and a bias."""

  @nn.compact
  def __call__(self, x):
    a = self.param("a", nn.with_logical_partitioning(nn.initializers.ones, ("embed", "mlp")),
                   (8, 6))
    b = self.param("b", nn.with_logical_partitioning(nn.initializers.ones, ("vocab", "embed")),
                   (8, 6))
    c = self.param("c", nn.with_logical_partitioning(nn.initializers.ones, ("mlp", "embed")),
                   (4, 8))
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("mlp",)), (6,))
    return x @ a + x @ b + bias + jnp.sum(c)


def _opt_specs(opt, rules="two_d"):
  p = Partitioner(logical_axis_rules=rules)
  boxed = jax.eval_shape(_TwoSame().init, jax.random.PRNGKey(0), jnp.ones((2, 8)))
  params, shardings = nn.unbox(boxed)["params"], p.shardings_for(boxed)["params"]
  state = jax.eval_shape(opt.init, params)
  out = partitioning.opt_state_shardings(state, params, shardings, p.mesh)
  flat = {"/".join(partitioning._path_names(k)): v.spec  # pylint: disable=protected-access
          for k, v in jax.tree_util.tree_flatten_with_path(out)[0]}
  return {k: s for k, s in flat.items()}, jax.tree.map(lambda s: s.spec, shardings)


def test_adamw_slots_take_their_own_parameters_sharding():
  specs, params = _opt_specs(optim.adamw(1e-3))
  assert params["a"] == PartitionSpec("data", "model")  # same shape as b, other sharding
  assert params["b"] == PartitionSpec("model", "data")
  for slot in ("mu", "nu"):
    assert specs[f"0/{slot}/a"] == params["a"] and specs[f"0/{slot}/b"] == params["b"]
    assert specs[f"0/{slot}/bias"] == PartitionSpec("model")
  assert specs["0/count"] == PartitionSpec()


def test_adafactor_factored_moments_take_the_sub_spec():
  specs, _ = _opt_specs(optim.adafactor(min_dim_size_to_factor=4))
  # a: (8, 6) embed x mlp -> (data, model). optax drops the largest axis (8) for v_row and the
  # second largest (6) for v_col.
  assert specs["0/v_row/a"] == PartitionSpec("model") and specs["0/v_col/a"] == PartitionSpec("data")
  assert specs["0/v_row/b"] == PartitionSpec("data") and specs["0/v_col/b"] == PartitionSpec("model")
  # c: (4, 8) mlp x embed -> (model, data); the largest axis is the second one.
  assert specs["0/v_row/c"] == PartitionSpec("model") and specs["0/v_col/c"] == PartitionSpec("data")
  # Unfactored (a vector): full second moment `v` like the parameter, (1,) placeholders replicate.
  assert specs["0/v/bias"] == PartitionSpec("model")
  assert specs["0/v_row/bias"] == PartitionSpec() and specs["0/v/a"] == PartitionSpec()
  assert specs["0/count"] == PartitionSpec()


def test_masked_optimizer_state_follows_the_trainable_parameters():
  opt = adaptation.adapted(base=optim.adamw(1e-3), trainable=["^a$", "^bias$"])
  specs, params = _opt_specs(opt, rules="fsdp")
  mu = {k.split("/")[-1]: v for k, v in specs.items() if "/mu/" in k}
  assert mu == {"a": PartitionSpec("data", None), "bias": PartitionSpec()}  # b, c frozen
  assert params["b"] == PartitionSpec(None, "data")


def test_a_parameter_the_mesh_does_not_divide_is_named():
  p = Partitioner(num_partitions=4, devices=jax.devices() * 4)  # model axis of 4
  boxed = jax.eval_shape(_TwoSame().init, jax.random.PRNGKey(0), jnp.ones((2, 8)))
  with pytest.raises(ValueError, match=r"The parameter params/a of shape \(8, 6\) cannot be split "
                                       r"as P\(None, 'model'\) over the mesh "
                                       r"\{'data': 1, 'model': 4\}"):
    partitioning.check_divisible(nn.unbox(boxed), p.shardings_for(boxed))
