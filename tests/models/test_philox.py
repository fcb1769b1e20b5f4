"""Tests for t2t/models/philox.py: Random123's known answer, JAX's philox4x32 keys and bits
reproduced exactly, and the masks on a mesh of eight devices (a subprocess) equal to one device's."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import layers, philox
from tests.support.environment import xla_flags_with

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_random123_known_answer():
  """Philox-4x32-10, key (0xa4093822, 0x299f31d0), counter (pi's digits): Random123's kat_vectors."""
  words = [jnp.uint32(v) for v in (0xa4093822, 0x299f31d0, 0x243f6a88, 0x85a308d3, 0x13198a2e,
                                   0x03707344)]
  out = [int(w) for w in philox.philox4x32(*words)]
  assert out == [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]


def test_mulhilo_is_the_64_bit_product():
  a = np.array([0, 1, 0xFFFFFFFF, 0x12345678, 0x80000000], np.uint32)
  for m in philox.MULTIPLIERS:
    hi, lo = philox.mulhilo(jnp.asarray(a), m)
    product = a.astype(object) * int(m)
    np.testing.assert_array_equal(np.asarray(hi), np.array([p >> 32 for p in product], np.uint32))
    np.testing.assert_array_equal(np.asarray(lo), np.array([p & 0xFFFFFFFF for p in product],
                                                           np.uint32))


def _words(key):
  return np.asarray(jax.random.key_data(key))


@pytest.mark.parametrize("seed", [0, 1, 7, 123456789, -5, 2 ** 31 - 1])
def test_keys_are_jax_philox4x32s(seed):
  ours, jaxs = jax.random.key(seed, impl=philox.PHILOX4X32), jax.random.key(seed, impl="philox4x32")
  np.testing.assert_array_equal(_words(ours), _words(jaxs))
  np.testing.assert_array_equal(_words(jax.random.split(ours, (3, 4))),
                                _words(jax.random.split(jaxs, (3, 4))))
  np.testing.assert_array_equal(_words(jax.random.fold_in(ours, 77)),
                                _words(jax.random.fold_in(jaxs, 77)))


def test_bits_are_jax_philox4x32s_at_every_width_and_under_jit():
  ours, jaxs = jax.random.key(3, impl=philox.PHILOX4X32), jax.random.key(3, impl="philox4x32")
  for dtype in (jnp.uint8, jnp.uint16, jnp.uint32):
    a, b = jax.random.bits(ours, (5, 77), dtype), jax.random.bits(jaxs, (5, 77), dtype)
    assert a.dtype == b.dtype == dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  draw = lambda k: jax.random.uniform(jax.random.fold_in(k, 5), (1000,))
  np.testing.assert_array_equal(np.asarray(jax.jit(draw)(ours)), np.asarray(jax.jit(draw)(jaxs)))
  with jax.enable_x64(True):
    np.testing.assert_array_equal(np.asarray(jax.random.bits(ours, (7,), jnp.uint64)),
                                  np.asarray(jax.random.bits(jaxs, (7,), jnp.uint64)))
  keep = jax.jit(lambda k: layers.dropout_keep_mask(k, 0.1, (3, 50))[0])
  np.testing.assert_array_equal(np.asarray(keep(ours)), np.asarray(keep(jaxs)))


def test_block_words_are_the_blocks_that_jaxs_bits_fold_into_one_word():
  """Each block's four words XOR to `jax.random.bits`' word of that index (the same counters), for
  JAX's key (lax.mulhi) and the twin's (64-bit products) alike; other keys are refused."""
  jaxs, ours = jax.random.key(5, impl="philox4x32"), jax.random.key(5, impl=philox.PHILOX4X32)
  assert philox.is_philox4x32_key(jaxs) and philox.is_philox4x32_key(ours)
  a = np.asarray(jax.jit(lambda k: philox.block_words(k, (6, 7)))(jaxs))
  b = np.asarray(philox.block_words(ours, (6, 7)))
  assert a.shape == (6, 7, 4) and a.dtype == np.uint32
  np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(a[..., 0] ^ a[..., 1] ^ a[..., 2] ^ a[..., 3],
                                np.asarray(jax.random.bits(jaxs, (6, 7), jnp.uint32)))
  rbg = jax.random.key(5, impl="rbg")
  assert not philox.is_philox4x32_key(rbg) and not philox.is_philox4x32_key(jnp.zeros(2, jnp.uint32))
  with pytest.raises(TypeError, match="philox4x32 key"):
    philox.block_words(rbg, (2,))


MESH_CASE = textwrap.dedent("""
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from t2t.models import layers, philox
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
    x = np.arange(8 * 4 * 16 * 16, dtype=np.float32).reshape(8, 4, 16, 16) + 1
    drop = jax.jit(lambda x, k: layers.Dropout(0.1).apply(
        {}, x, deterministic=False, rngs={"dropout": jax.random.fold_in(k, 3)}))
    ours = jax.random.key(1, impl=philox.PHILOX4X32)
    sharded = drop(jax.device_put(x, NamedSharding(mesh, P("data", "model"))), ours)
    assert sharded.sharding.spec == P("data", "model"), sharded.sharding
    one = drop(x, jax.random.key(1, impl="philox4x32"))  # JAX's own, on one device
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(one))
    assert 0.08 < float((np.asarray(one) == 0).mean()) < 0.12
    print("OK")
""")


def test_masks_on_a_mesh_of_eight_equal_one_devices_with_jaxs_key():
  """JAX's own philox4x32 does not compile on this mesh (XLA cannot partition its mulhi); ours does,
  keeps the activation's sharding, and draws the one-device mask."""
  env = {**os.environ, "XLA_FLAGS": xla_flags_with("--xla_force_host_platform_device_count=8"),
         "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
  out = subprocess.run([sys.executable, "-c", MESH_CASE], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stderr[-3000:]
