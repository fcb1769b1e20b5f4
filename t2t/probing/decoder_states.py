"""A decoder-only T5 (`t2t.models.decoder_only`) as an encoder-protocol module, for probing.

`DecoderOnlyStates(config)(tokens [b, l], token_types, enable_dropout)` -> [embeddings, layer 1,
..., layer n], each [b, l, d]; the last is after the final RMSNorm (as `T5EncoderStates`). Its
submodules carry the decoder-only model's names (`token_embedder`, `decoder`), so a
`DecoderOnlyTransformer` checkpoint restores into it by path; the model file is not edited.
With ``prefix_lm=True`` the real tokens see each other (the prefix LM reading its inputs);
otherwise attention is causal (the language model).
"""
from __future__ import annotations

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t2t.models import decoder_only, layers
from t2t.models import transformer as t5

Array = jax.Array


@gin.configurable
class DecoderOnlyStates(nn.Module):
  """Every layer's output of a decoder-only T5 stack (see the module docstring)."""
  config: t5.T5Config
  prefix_lm: bool = False

  def setup(self):
    c = self.config
    if c.scan_layers:
      raise ValueError("DecoderOnlyStates needs each layer's output: set T5Config.scan_layers = "
                       "False (parameter paths are then decoder/layers_{i}, as in checkpoints).")
    self.token_embedder = layers.Embed(num_embeddings=c.vocab_size, features=c.d_model,
                                       embedding_init=nn.initializers.normal(stddev=1.0),
                                       dtype=c.dtype, param_dtype=c.param_dtype)
    self.decoder = decoder_only.DecoderOnlyStack(c, shared_embedding=self.token_embedder)

  def __call__(self, tokens: Array, token_types: Array | None = None,
               enable_dropout: bool = False) -> list[Array]:
    del token_types
    stack = self.decoder
    drop = lambda y: stack.dropout(y, deterministic=not enable_dropout)
    length = tokens.shape[1]
    prefix = (tokens > 0).astype(jnp.int32) if self.prefix_lm else None
    bias = stack.relpos_bias(length, length) + layers.mask_to_bias(
        decoder_only.decoder_only_mask(tokens.shape, None, prefix))
    x = drop(self.token_embedder(tokens))
    states = [x]
    for layer in stack.layers:
      x = layer(x, None, bias, None, enable_dropout, False)
      states.append(x)
    states[-1] = drop(stack.decoder_norm(x))
    return states
