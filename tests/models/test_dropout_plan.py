"""Tests for t2t.models.dropout_plan: masks made up front are the sites' own masks, bit for bit."""
import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import seqio
from flax.core import scope as flax_scope

from t2t.models import api, dropout, dropout_plan, layers, philox
from t2t.models.transformer import Transformer
from tests.models import helpers

SHAPES = {'encoder_input_tokens': (3, 7), 'decoder_input_tokens': (3, 5)}


def _key(impl: str, seed: int = 5):
  return jax.random.key(seed, impl='philox4x32' if impl == 'philox4x32' else philox.PHILOX4X32
                        if impl == 'twin' else impl)


@pytest.mark.parametrize('separator, expected', [(False, 0x24f48346), (True, 0x167549ca)])
def test_site_hash_is_the_sha1_of_the_suffix(separator, expected):
  """Hand-computed: SHA-1 of b'encoder' + b'\\x02' (b'\\0encoder\\0\\x02' with separators)."""
  with flax.config.temp_flip_flag('fix_rng_separator', separator):
    assert dropout_plan.site_hash(('encoder', 2)) == expected


@pytest.mark.parametrize('suffix', [('encoder', 1), ('decoder', 'layers_1', 'dropout', 3),
                                    ('x', 0), ('emb', 2 ** 40), ('über', 7)])
def test_site_key_is_flaxs_make_rng_key(suffix):
  key = _key('philox4x32')
  ours = jax.random.fold_in(key, jnp.uint32(dropout_plan.site_hash(suffix)))
  theirs = flax_scope._fold_in_static(key, suffix)  # what Scope.make_rng returns
  np.testing.assert_array_equal(jax.random.key_data(ours), jax.random.key_data(theirs))


def _t5(**overrides):
  vocab = seqio.PassThroughVocabulary(48)
  model = api.EncoderDecoderModel(
      Transformer(helpers.tiny_config(**{'dropout_rate': 0.3, 'num_encoder_layers': 1,
                                         'num_decoder_layers': 1, **overrides})), vocab, vocab)
  params = nn.unbox(jax.jit(lambda r: model.get_initial_variables(r, SHAPES))(
      jax.random.PRNGKey(0)))['params']
  batch = {k: jnp.asarray(v) for k, v in helpers.seq2seq_batch().items()}
  return model, params, batch


def _loss_and_grads(loss_fn, params, batch, rng):
  (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch, rng)
  return loss, grads


def _counting_masks(monkeypatch):
  """Records the shape of every `dropout_keep_mask` trace (per site, or per planned group)."""
  shapes = []
  original = dropout.dropout_keep_mask

  def counted(rng, rate, shape):
    shapes.append(tuple(shape))
    return original(rng, rate, shape)

  monkeypatch.setattr(dropout, 'dropout_keep_mask', counted)
  return shapes


@pytest.mark.parametrize('impl', ['philox4x32', 'twin'])
def test_planned_t5_loss_and_gradients_equal_the_sites_own(impl, monkeypatch):
  """T5 (one layer each side, dropout 0.3): same loss and gradients to the bit; one mask trace per shape."""
  model, params, batch = _t5()
  shapes = _counting_masks(monkeypatch)
  own = _loss_and_grads(model.loss_fn, params, batch, _key(impl))
  per_site = list(shapes)
  shapes.clear()
  planned = _loss_and_grads(layers.with_planned_dropout(model.loss_fn), params, batch, _key(impl))
  assert len(per_site) > len(set(per_site)) > 1  # shared shapes: the plan batches them
  assert sorted(shapes) == sorted(set(per_site))
  np.testing.assert_array_equal(planned[0], own[0])
  jax.tree.map(np.testing.assert_array_equal, planned[1], own[1])
  other = _loss_and_grads(layers.with_planned_dropout(model.loss_fn), params, batch,
                          _key(impl, seed=6))
  assert float(other[0]) != float(own[0])  # the masks follow the key


def test_row_arguments_give_the_same_masks_from_one_kernel_for_like_layers(tmp_path):
  """Two layers a side. Sliced at runtime row indices (`row_arguments`), the masks give the
  sites' own loss and gradients to the bit, as constant rows do, and XLA compiles fewer kernels:
  the consumers of like layers' masks no longer differ by a constant offset (counted in XLA's
  dump of the compiled objects)."""
  model, params, batch = _t5(num_encoder_layers=2, num_decoder_layers=2)
  rng = _key('philox4x32')
  own = _loss_and_grads(model.loss_fn, params, batch, rng)

  def loss_and_grads(params, batch, rng, rows):
    loss_fn = layers.with_planned_dropout(model.loss_fn, rows)
    return jax.value_and_grad(loss_fn, has_aux=True)(params, batch, rng)

  kernels = {}
  for name, rows in (('rows', dropout_plan.row_arguments()), ('constant', ())):
    dump = tmp_path / name
    compiled = jax.jit(loss_and_grads).lower(params, batch, rng, rows).compile(
        compiler_options={'xla_dump_to': str(dump)})
    kernels[name] = len(list(dump.glob('*obj-file*')))
    (loss, _), grads = compiled(params, batch, rng, rows)
    np.testing.assert_array_equal(loss, own[0], err_msg=name)
    jax.tree.map(functools.partial(np.testing.assert_array_equal, err_msg=name), grads, own[1])
  assert 0 < kernels['rows'] < kernels['constant'], kernels


def _mask_generators(loss_fn, params, batch, rng) -> int:
  """How many mask generators the traced program holds (each unwraps one key or one key batch)."""
  return str(jax.make_jaxpr(loss_fn)(params, batch, rng)).count('random_unwrap')


def test_sites_inside_scanned_layers_derive_their_own_keys():
  """Under `nn.scan` the rng is split per layer: those sites are not planned, the rest are."""
  model, params, batch = _t5(scan_layers=True)
  rng = _key('philox4x32')
  planned_fn = layers.with_planned_dropout(model.loss_fn)
  own = _loss_and_grads(model.loss_fn, params, batch, rng)
  planned = _loss_and_grads(planned_fn, params, batch, rng)
  np.testing.assert_array_equal(planned[0], own[0])
  jax.tree.map(np.testing.assert_array_equal, planned[1], own[1])
  scanned = _mask_generators(planned_fn, params, batch, rng)
  assert 0 < scanned < _mask_generators(model.loss_fn, params, batch, rng)


def test_other_prngs_and_no_rng_run_the_loss_as_it_is(monkeypatch):
  impl = 'rbg'
  model, params, batch = _t5()
  shapes = _counting_masks(monkeypatch)
  own = _loss_and_grads(model.loss_fn, params, batch, _key(impl))
  per_site = len(shapes)
  planned = _loss_and_grads(layers.with_planned_dropout(model.loss_fn), params, batch, _key(impl))
  assert len(shapes) == 2 * per_site  # each site made its own mask again
  np.testing.assert_array_equal(planned[0], own[0])
  no_dropout = jax.jit(layers.with_planned_dropout(model.loss_fn))(params, batch, None)[0]
  np.testing.assert_array_equal(no_dropout, jax.jit(model.loss_fn)(params, batch, None)[0])


def test_a_loss_that_changes_its_sites_between_traces_is_named():
  traces = []

  def loss_fn(params, batch, rng):
    traces.append(1)
    x = jnp.ones((len(traces), 8))  # a different shape each time it is traced
    return layers.Dropout(0.5, name='drop').apply({}, x, deterministic=False,
                                                  rngs={'dropout': rng}).sum()

  with pytest.raises(RuntimeError, match=r"Dropout at the top-level module \(call 1\) asks for a "
                                         r"\(2, 8\) mask at rate 0.5, but the recording pass saw "
                                         r"\(1, 8\) at 0.5: the loss function must draw"):
    layers.with_planned_dropout(loss_fn)(None, None, _key('philox4x32'))


def test_a_module_applied_again_with_the_same_rng_gets_the_same_masks_as_unplanned():
  """Three applies with one rng: each restarts flax's call count, so sites repeat by suffix."""
  def loss_fn(params, batch, rng):
    drop = layers.Dropout(0.5, name='drop')
    outs = [drop.apply({}, jnp.arange(1.0, 1.0 + n * 16).reshape(n, 16), deterministic=False,
                       rngs={'dropout': rng}) for n in (2, 3, 2)]
    return sum((o * (i + 1)).sum() for i, o in enumerate(outs))

  rng = _key('philox4x32')
  planned = jax.jit(layers.with_planned_dropout(loss_fn))(None, None, rng)
  np.testing.assert_array_equal(planned, jax.jit(loss_fn)(None, None, rng))
  sites = dropout_plan.recorded_sites(loss_fn, None, None, rng)
  assert [s.shape for s in sites] == [(2, 16), (3, 16), (2, 16)]
  assert len(dropout_plan.planned_masks(rng, sites, layers.dropout_keep_mask)) == 2
