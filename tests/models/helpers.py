"""Tiny configs and batches shared by the model tests (real computations, just small)."""
from __future__ import annotations

import numpy as np
import pytest

from t2t.models import small_dots
from t2t.models.transformer import T5Config


def tiny_config(**overrides) -> T5Config:
  """A 2+2-layer T5 small enough to compile in about a second; heads * d_kv != d_model on purpose."""
  fields = dict(vocab_size=48, d_model=16, num_heads=3, d_kv=8, d_ff=32, num_encoder_layers=2,
                num_decoder_layers=2, dropout_rate=0.0)
  fields.update(overrides)
  return T5Config(**fields)


def seq2seq_batch(seed: int = 0, batch: int = 3, enc_len: int = 7, dec_len: int = 5,
                  vocab: int = 48) -> dict[str, np.ndarray]:
  """Unpacked feature-converter batch: EOS-terminated rows of different lengths, right-padded."""
  rng = np.random.RandomState(seed)
  enc = np.zeros((batch, enc_len), np.int32)
  tgt = np.zeros((batch, dec_len), np.int32)
  for i in range(batch):
    n_in = enc_len - (i % 3)
    n_out = dec_len - (i % 2) * 2
    enc[i, :n_in - 1] = rng.randint(2, vocab, n_in - 1)
    enc[i, n_in - 1] = 1
    tgt[i, :n_out - 1] = rng.randint(2, vocab, n_out - 1)
    tgt[i, n_out - 1] = 1
  dec_in = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
  return {'encoder_input_tokens': enc, 'decoder_input_tokens': dec_in,
          'decoder_target_tokens': tgt, 'decoder_loss_weights': (tgt > 0).astype(np.int32)}


def init_variables(model, batch: dict[str, np.ndarray]):
  """Boxed variables of `model` for `batch`'s shapes; jitted, which compiles faster than eager init."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  init = jax.jit(lambda rng, enc, dec: model.init({'params': rng}, enc, dec, enable_dropout=False))
  return init(jax.random.PRNGKey(0), jnp.asarray(batch['encoder_input_tokens']),
              jnp.asarray(batch['decoder_input_tokens']))


def trained_params(model, params, batch: dict[str, np.ndarray], steps: int = 40,
                   learning_rate: float = 1e-2):
  """`params` after `steps` Adam steps of `model.loss_fn` (an EncoderDecoderModel) on one batch.

  Returns (params, [loss per step]). Used to get a model that has memorised `batch`, so decoding
  produces EOS at known places.
  """
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  opt = optax.adam(learning_rate)

  @jax.jit
  def step(params, opt_state):
    (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, None)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = opt.init(params)
  losses = []
  for _ in range(steps):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  return params, losses


def use_float32_build(isa: str, monkeypatch, *libraries: small_dots.Library) -> None:
  """Selects the float32 kernels' build `isa` ('avx512' or 'avx2') for the calling test: skips it
  where one of `libraries` cannot run here (CPU flags, no compiler), and for 'avx2' switches the
  AVX-512F panels off, as on a processor without them. A library that should run but fails to
  build is left to fail the test."""
  reason = next((r for r in map(small_dots.unavailable_reason, libraries) if r is not None), None)
  if reason is not None:
    pytest.skip(f'{" / ".join(library.name for library in libraries)} unavailable: {reason}')
  if isa == 'avx2':
    monkeypatch.setenv(small_dots.F32_AVX512.switch, '0')
