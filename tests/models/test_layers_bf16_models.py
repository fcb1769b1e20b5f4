"""bf16 matmuls (`matmuls.matmul`, T5Config.matmul_dtype) run forward and backward in every model built
on T5Config, with scanned layers and with dropout.

XLA's CPU runtime refuses some bf16 x bf16 -> f32 dot forms at run time ("Unsupported element type
for DotThunk::Execute"), and which form a dot gets depends on the graph around it, so each model
family is compiled and run here, not only the layers (tests/models/test_layers.py).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.decoder_only import DecoderOnlyTransformer
from t2t.models.t5_encoder import T5EncoderStates
from t2t.models.transformer import Transformer

from tests.models import helpers

BATCH = helpers.seq2seq_batch()
ENC = jnp.asarray(BATCH['encoder_input_tokens'])
DEC = jnp.asarray(BATCH['decoder_input_tokens'])
VOCAB = helpers.tiny_config().vocab_size


def _grads(module, *inputs, **kwargs):
  rngs = {'params': jax.random.PRNGKey(0), 'dropout': jax.random.PRNGKey(1)}
  variables = jax.jit(lambda: module.init(rngs, *inputs, **kwargs))()

  def loss(params):
    out = module.apply({**variables, 'params': params}, *inputs, rngs={'dropout': rngs['dropout']},
                       **kwargs)
    if isinstance(out, jax.Array) and out.shape[-1] == VOCAB:  # logits: a cross-entropy-like loss
      return jnp.mean(jax.nn.logsumexp(out, axis=-1) - out[..., 0])
    return sum(jnp.mean(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(out))

  return jax.jit(jax.value_and_grad(loss))(variables['params'])


# The plain encoder-decoder is tests/models/test_transformer.py's; remat leaves the dots as they are.
CASES = [('encoder_decoder', {'scan_layers': True}), ('encoder_decoder', {'dropout_rate': 0.1}),
         ('decoder_only', {}), ('decoder_only', {'dropout_rate': 0.1, 'scan_layers': True}),
         ('t5_encoder', {})]


@pytest.mark.parametrize('family,overrides', CASES,
                         ids=[f'{f}-{"-".join(o) or "plain"}' for f, o in CASES])
def test_bf16_matmuls_train_in_every_model_family(family, overrides):
  results = {}
  for matmul_dtype in (None, 'bfloat16'):
    config = helpers.tiny_config(matmul_dtype=matmul_dtype, **overrides)
    if family == 'encoder_decoder':
      results[matmul_dtype] = _grads(Transformer(config), ENC, DEC, enable_dropout=True)
    elif family == 'decoder_only':
      results[matmul_dtype] = _grads(DecoderOnlyTransformer(config), DEC)
    else:
      results[matmul_dtype] = _grads(T5EncoderStates(config), ENC)
  (v32, g32), (v16, g16) = results[None], results['bfloat16']
  np.testing.assert_allclose(float(v16), float(v32), rtol=2e-2)
  # As in test_transformer: bf16 keeps ~3 significant digits, so the whole gradient within 5% of
  # float32's in norm and each leaf pointing the same way (a broken leaf would be near 0).
  flat16 = jnp.concatenate([a.ravel() for a in jax.tree.leaves(g16)])
  flat32 = jnp.concatenate([b.ravel() for b in jax.tree.leaves(g32)])
  assert bool(jnp.all(jnp.isfinite(flat16)))
  assert float(jnp.linalg.norm(flat16 - flat32)) <= 5e-2 * float(jnp.linalg.norm(flat32))
  for a, b in zip(jax.tree.leaves(g16), jax.tree.leaves(g32)):
    assert a.dtype == jnp.float32
    cosine = jnp.vdot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b) + 1e-30)
    assert float(cosine) >= 0.95  # a small leaf (the relative position bias) reaches ~0.975
