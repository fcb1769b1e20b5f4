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

from t2t.training.partitioning import Partitioner


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
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
         "JAX_PLATFORMS": "cpu"}
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "OK" in out.stdout
