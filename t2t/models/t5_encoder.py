"""T5's encoder as a classifier encoder that returns every layer's output.

It builds `transformer.Encoder` (the very module of `Transformer`, under the same names), so its
parameters are exactly a T5 checkpoint's encoder side: `token_embedder/embedding` and
`encoder/{relpos_bias, layers_{i}, encoder_norm}/...`. A pre-trained T5 checkpoint therefore loads
by path into a `ClassifierModel` with this encoder (the decoder's parameters are simply absent).

Encoder protocol (docs/ARCHITECTURE.md): `encoder(tokens [b, l], token_types, enable_dropout)` ->
[embeddings, layer 1, ..., layer n], each [b, l, d_model]. As in Hugging Face's T5
`output_hidden_states`, the last entry is after the encoder's final RMSNorm (and dropout): it is
the representation T5's decoder reads. T5 has no token types; they are ignored.

Options of `T5Config` that add parameters work as in `Transformer`: `adapter_dim` (the layers
build the adapters) and `num_prompt_tokens` (prompt tuning, Lester et al. 2021 §2.2: n learned
vectors `prompt/embedding` [n, d] prepended to the embedded tokens, attended by every position, as
`Transformer.encode` does). The returned states drop the prompt positions, so they stay [b, l, d]
for the classifier head's pooling over real tokens.
"""
from __future__ import annotations

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t2t.models import layers, peft
from t2t.models.transformer import Encoder, T5Config

Array = jax.Array


@gin.configurable
class T5EncoderStates(nn.Module):
  """T5 encoder stack (embedding, relative-position self-attention layers, final norm)."""
  config: T5Config

  def setup(self):
    c = self.config
    if c.scan_layers:
      raise ValueError('T5EncoderStates needs each layer\'s output: set T5Config.scan_layers = '
                       'False (parameter paths are then encoder/layers_{i}, as in checkpoints).')
    self.token_embedder = layers.Embed(num_embeddings=c.vocab_size, features=c.d_model,
                                       embedding_init=nn.initializers.normal(stddev=1.0),
                                       dtype=c.dtype, param_dtype=c.param_dtype,
                                       matmul_dtype=c.matmul_dtype)
    self.encoder = Encoder(c, shared_embedding=self.token_embedder)
    self.prompt = (peft.PromptEmbedding(c.num_prompt_tokens, c.d_model, dtype=c.dtype,
                                        param_dtype=c.param_dtype)
                   if c.num_prompt_tokens else None)

  def __call__(self, tokens: Array, token_types: Array | None = None,
               enable_dropout: bool = False) -> list[Array]:
    del token_types
    enc = self.encoder
    drop = lambda y: enc.dropout(y, deterministic=not enable_dropout)
    valid = tokens > 0
    x = self.token_embedder(tokens)
    n = 0
    if self.prompt is not None:
      n = self.config.num_prompt_tokens
      x = jnp.concatenate([self.prompt(tokens.shape[0]).astype(x.dtype), x], axis=1)
      valid = jnp.concatenate([jnp.ones((tokens.shape[0], n), bool), valid], axis=1)
    length = x.shape[1]
    bias = layers.add_mask_bias(enc.relpos_bias(length, length),
                                layers.make_attention_mask(valid, valid))
    x = drop(x)
    states = [x[:, n:]]
    for layer in enc.layers:
      x = layer(x, bias, enable_dropout)
      states.append(x[:, n:])
    states[-1] = drop(enc.encoder_norm(x))[:, n:]
    return states
