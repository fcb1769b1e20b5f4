"""DecoderOnlyStates reads a decoder-only checkpoint's parameters and reproduces its logits."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import decoder_only, transformer
from t2t.probing import decoder_states, representations


@pytest.mark.parametrize("prefix_lm", [False, True])
def test_last_state_gives_the_models_logits(prefix_lm):
  config = transformer.T5Config(vocab_size=32, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                                num_encoder_layers=0, num_decoder_layers=2, dropout_rate=0.0)
  tokens = jnp.array([[3, 4, 5, 6], [7, 8, 9, 10]], jnp.int32)
  model = decoder_only.DecoderOnlyTransformer(config)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), tokens, enable_dropout=False)["params"])
  causal = jnp.ones_like(tokens) if prefix_lm else None
  logits = model.apply({"params": params}, tokens, decoder_causal_attention=causal,
                       enable_dropout=False)
  probe = decoder_states.DecoderOnlyStates(config, prefix_lm=prefix_lm)
  abstract = representations.abstract_params(probe)
  assert jax.tree.structure(abstract) == jax.tree.structure(params)  # same paths: restores by name
  states = probe.apply({"params": params}, tokens, None, False)
  assert len(states) == 3
  embedding = params["token_embedder"]["embedding"]
  by_hand = jnp.einsum("bld,vd->blv", states[-1], embedding) * config.d_model ** -0.5
  np.testing.assert_allclose(by_hand, logits, rtol=1e-4, atol=1e-4)
  # Causal: the first position's states do not depend on later tokens; prefix LM: they do.
  other = tokens.at[:, 3].set(11)
  moved = probe.apply({"params": params}, other, None, False)[1][:, 0]
  assert np.allclose(moved, states[1][:, 0], atol=1e-6) != prefix_lm
