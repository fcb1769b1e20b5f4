"""The initialisers' Threefry-2x32 kernel gives JAX's bits, and the parameters with them."""
import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.extend.random import threefry2x32_p

from t2t.models import small_dots, threefry
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer
from t2t.training import optim
from t2t.training.partitioning import Partitioner
from t2t.training.trainer import Trainer
from tests.training import toy

# Needs an x86 CPU with AVX2 and a C++ compiler; where both exist it must build and run (a failed
# build fails these tests rather than skipping them).
_REASON = small_dots.unavailable_reason(small_dots.THREEFRY)
needs_kernel = pytest.mark.skipif(_REASON is not None and 'T2T_SMALL_DOTS=0' not in _REASON,
                                  reason=f'threefry kernel unavailable: {_REASON}')


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
  monkeypatch.delenv(small_dots.SWITCH, raising=False)
  monkeypatch.delenv(threefry.SWITCH, raising=False)


def _hash(k1, k2, x1, x2, kernel: bool):
  """threefry2x32 of the operands, lowered inside `for_initialisers()` or as JAX does; returns the
  two words and whether the program called the kernel."""
  fn = jax.jit(lambda *a: threefry2x32_p.bind(*a))   # a fresh function: no lowering reused
  if kernel:
    with threefry.for_initialisers() as used:
      assert used
      lowered = fn.lower(k1, k2, x1, x2)
  else:
    lowered = fn.lower(k1, k2, x1, x2)
  out = lowered.compile()(k1, k2, x1, x2)
  return [np.asarray(o) for o in out], threefry.TARGET in lowered.as_text()


@needs_kernel
def test_known_answers_of_the_reference_implementation():
  # Random123's test vectors for Threefry-2x32, 20 rounds (key, counter -> result), which JAX's
  # own tests use: zeros, all ones, and the digits of pi.
  cases = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
           ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
           ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]
  for key, count, expected in cases:
    operands = [np.uint32(v) for v in (*key, *count)]
    (y1, y2), called = _hash(*operands, kernel=True)
    assert called
    assert (int(y1), int(y2)) == expected


@needs_kernel
@pytest.mark.parametrize('key_shape, count_shape', [((), (1000,)), ((5, 7), (5, 7)),
                                                    ((), (3, 70001)), ((4,), ())])
def test_kernel_bits_equal_jaxs_lowering(key_shape, count_shape):
  rng = np.random.default_rng(0)
  out_shape = np.broadcast_shapes(key_shape, count_shape)
  k1, k2 = (rng.integers(0, 2 ** 32, key_shape, dtype=np.uint32) for _ in range(2))
  x1, x2 = (rng.integers(0, 2 ** 32, count_shape, dtype=np.uint32) for _ in range(2))
  kernel, called = _hash(k1, k2, x1, x2, kernel=True)
  reference, reference_called = _hash(k1, k2, x1, x2, kernel=False)
  assert called and not reference_called
  for a, b in zip(kernel, reference):
    assert a.shape == out_shape
    np.testing.assert_array_equal(a, b)


def test_operands_the_kernel_does_not_take_lower_as_jax_does():
  u32 = lambda *shape: jax.core.ShapedArray(shape, np.uint32)
  assert threefry.fits([u32(), u32(), u32(6), u32(6)], [u32(6), u32(6)])
  assert threefry.fits([u32(2, 3)] * 4, [u32(2, 3)] * 2)
  assert not threefry.fits([u32(2, 1), u32(2, 1), u32(2, 3), u32(2, 3)], [u32(2, 3)] * 2)
  assert not threefry.fits([u32(0)] * 4, [u32(0)] * 2)
  assert not threefry.fits([jax.core.ShapedArray((), np.int32)] + [u32()] * 3, [u32()] * 2)


def test_switches_or_several_devices_keep_jaxs_lowering(monkeypatch):
  monkeypatch.setenv(threefry.SWITCH, '0')
  assert threefry.unavailable_reason() == 'T2T_THREEFRY=0'
  monkeypatch.delenv(threefry.SWITCH)
  monkeypatch.setenv(small_dots.SWITCH, '0')
  assert threefry.unavailable_reason() == 'T2T_SMALL_DOTS=0'
  operands = [np.uint32(1), np.uint32(2), np.arange(8, dtype=np.uint32), np.ones(8, np.uint32)]
  fn = jax.jit(lambda *a: threefry2x32_p.bind(*a))
  with threefry.for_initialisers() as used:
    assert not used
    assert threefry.TARGET not in fn.lower(*operands).as_text()
  monkeypatch.delenv(small_dots.SWITCH)
  monkeypatch.setattr(small_dots, 'single_cpu_device', lambda: False)
  assert threefry.unavailable_reason() == 'not a single-device CPU backend'


@needs_kernel
def test_trainer_initialises_the_same_parameters_through_the_kernel():
  config = T5Config(vocab_size=64, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                    num_encoder_layers=2, num_decoder_layers=2)
  model = EncoderDecoderModel(Transformer(config), toy.VOCAB, toy.VOCAB)
  shapes = {'encoder_input_tokens': (2, 8), 'decoder_input_tokens': (2, 4),
            'decoder_target_tokens': (2, 4), 'decoder_loss_weights': (2, 4)}
  trainer = Trainer(model, optim.adafactor(learning_rate=0.01), Partitioner(), shapes, seed=3)
  fn = jax.jit(lambda rng: nn.unbox(trainer._init_params(rng)))
  lowered = fn.lower(trainer._init_rng)   # outside the context: JAX's lowering
  assert threefry.TARGET not in lowered.as_text()
  reference = lowered.compile()(trainer._init_rng)
  params = trainer.init_params()
  leaves, reference_leaves = jax.tree.leaves(params), jax.tree.leaves(reference)
  assert len(leaves) == len(reference_leaves) > 10
  for a, b in zip(leaves, reference_leaves):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert any(np.std(np.asarray(a)) > 0 for a in leaves)   # drawn, not constant
