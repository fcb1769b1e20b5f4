"""jiant's BiLSTM sentence encoder (Wang et al., 2019, §4; PAPERS.md §6), as a classifier encoder.

Learned token embeddings -> `num_layers` bidirectional LSTM layers -> the last layer's output
concatenated with the input embeddings (the skip connection). Padding-aware in both directions:
rows are right-padded (token id 0), the forward LSTM stops at each row's last real token and the
backward LSTM starts there, so a row's states do not depend on how much padding follows it.

Encoder protocol (docs/ARCHITECTURE.md): `encoder(tokens [b, l], token_types, enable_dropout)` ->
[embeddings [b, l, e], layer 1 [b, l, 2h], ..., layer n [b, l, 2h (+ e with the skip connection)]],
zeros at padding. Token types are ignored (jiant encodes the two sentences of a pair separately).

Parameters (logical axes in brackets):
  embedder/embedding                                  [v, e]      (vocab, embed)
  encoder/layers_{i}/{forward,backward}/input_kernel  [in, 4h]    (embed, lstm_gates)
  encoder/layers_{i}/{forward,backward}/recurrent_kernel [h, 4h]  (lstm_hidden, lstm_gates)
  encoder/layers_{i}/{forward,backward}/bias          [4h]        (lstm_gates)
  encoder/layers_{i}/adapter/{wi,wo}/kernel  with adapter_dim [2h, a], [a, 2h] (embed, adapter)
  prompt/embedding                     with num_prompt_tokens [n, e]      (prompt, embed)
`CrossSentenceAttention` (a pair head option) adds head/pair_interaction/kernel [d, d] (embed, mlp).
"""
from __future__ import annotations

import dataclasses

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from t2t.models import layers, peft

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BiLSTMConfig:
  """Hyper-parameters of the BiLSTM encoder. Defaults are jiant's (PAPERS.md §6)."""
  vocab_size: int                  # embedding rows (>= the vocabulary's size)
  embed_dim: int = 300             # learned token embeddings (jiant: 300-d GloVe/ELMo inputs)
  hidden_dim: int = 1024           # LSTM state per direction
  num_layers: int = 2
  dropout_rate: float = 0.2        # on the embeddings and between layers
  skip_embeddings: bool = True     # concatenate the input embeddings to the last layer's output
  # Adapter layers (Houlsby et al. 2019 §2.1, as T5 §3.5.2; t2t.models.peft.Adapter) of this inner
  # width on each BiLSTM layer's output [b, l, 2h] (the place of a Transformer layer's FFN
  # output); identity at the start; 0 = none.
  adapter_dim: int = 0
  # Prompt tuning (Lester et al. 2021 §2.2): this many learned vectors [n, e] prepended to each
  # embedded sentence (see `BiLSTMEncoder`); 0 = none.
  num_prompt_tokens: int = 0

  def __post_init__(self):
    for name in ('vocab_size', 'embed_dim', 'hidden_dim', 'num_layers'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'BiLSTMConfig.{name} must be a positive integer, got {value!r}.')
    for name in ('adapter_dim', 'num_prompt_tokens'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f'BiLSTMConfig.{name} must be a non-negative integer, got {value!r}.')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'BiLSTMConfig.dropout_rate must be in [0, 1), got {self.dropout_rate!r}.')


def reverse_valid(x: Array, lengths: Array) -> Array:
  """Reverses each row's first `lengths[row]` steps and leaves its padding in place.

  x [b, l, ...], lengths [b] -> [b, l, ...]; its own inverse: [[1, 2, 3, 0]] with length 3 ->
  [[3, 2, 1, 0]].
  """
  steps = jnp.arange(x.shape[1])[None, :]
  index = jnp.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
  return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)


class LSTM(nn.Module):
  """One direction of an LSTM layer over a whole sequence (Hochreiter & Schmidhuber, 1997).

  Gates i, f, g, o from x W_x + h W_h + b (forget bias initialised to 1). x [b, l, in] with valid
  [b, l] -> h [b, l, hidden]; at padding the state is carried unchanged and the output is 0, so
  for right-padded rows the result on real tokens does not depend on the padding.
  """
  hidden_dim: int

  @nn.compact
  def __call__(self, x: Array, valid: Array) -> Array:
    h_dim = self.hidden_dim
    w_x = self.param('input_kernel', nn.with_logical_partitioning(
        nn.initializers.lecun_normal(), ('embed', 'lstm_gates')), (x.shape[-1], 4 * h_dim))
    w_h = self.param('recurrent_kernel', nn.with_logical_partitioning(
        nn.initializers.orthogonal(), ('lstm_hidden', 'lstm_gates')), (h_dim, 4 * h_dim))
    forget_one = lambda key, shape, dtype=jnp.float32: jnp.zeros(shape, dtype).at[
        h_dim:2 * h_dim].set(1.0)
    bias = self.param('bias', nn.with_logical_partitioning(forget_one, ('lstm_gates',)),
                      (4 * h_dim,))
    projected = jnp.einsum('bli,ig->blg', x, w_x) + bias  # all input projections at once

    def step(carry, inputs):
      h, c = carry
      gates_x, keep = inputs
      i, f, g, o = jnp.split(gates_x + h @ w_h, 4, axis=-1)
      new_c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      new_h = jax.nn.sigmoid(o) * jnp.tanh(new_c)
      keep = keep[:, None]
      h, c = jnp.where(keep, new_h, h), jnp.where(keep, new_c, c)
      return (h, c), jnp.where(keep, new_h, 0.0)

    zeros = jnp.zeros((x.shape[0], h_dim), projected.dtype)
    _, outputs = jax.lax.scan(step, (zeros, zeros),
                              (jnp.swapaxes(projected, 0, 1), jnp.swapaxes(valid, 0, 1)))
    return jnp.swapaxes(outputs, 0, 1)


class BiLSTMLayer(nn.Module):
  """Forward and backward LSTMs, concatenated: [b, l, in] -> [b, l, 2 * hidden].

  The backward LSTM reads each row's real tokens from the last to the first (`reverse_valid`).
  With `adapter_dim` > 0 a `peft.Adapter` (x + wo(relu(wi x)), wo zero at the start) follows;
  it maps the zero states at padding to zero.
  """
  hidden_dim: int
  adapter_dim: int = 0

  @nn.compact
  def __call__(self, x: Array, valid: Array) -> Array:
    lengths = jnp.sum(valid, axis=1)
    forward = LSTM(self.hidden_dim, name='forward')(x, valid)
    backward = reverse_valid(
        LSTM(self.hidden_dim, name='backward')(reverse_valid(x, lengths), valid), lengths)
    out = jnp.concatenate([forward, backward], axis=-1)
    if self.adapter_dim:
      out = peft.Adapter(self.adapter_dim, name='adapter')(out)
    return out


class _Stack(nn.Module):
  """The BiLSTM layers, `layers_{i}`; returns each layer's output."""
  config: BiLSTMConfig

  @nn.compact
  def __call__(self, x: Array, valid: Array, enable_dropout: bool) -> list[Array]:
    c = self.config
    outputs = []
    for i in range(c.num_layers):
      if i:
        x = layers.Dropout(c.dropout_rate)(x, deterministic=not enable_dropout)
      x = BiLSTMLayer(c.hidden_dim, c.adapter_dim, name=f'layers_{i}')(x, valid)
      outputs.append(x)
    return outputs


@gin.configurable
class BiLSTMEncoder(nn.Module):
  """Embeddings + stacked BiLSTM + skip connection; returns all layer states (see module doc).

  Prompt tuning (`num_prompt_tokens` = n > 0; Lester et al. 2021 §2.2): n learned vectors
  `prompt/embedding` [n, e] (initialised like the embeddings) are prepended to the embedded
  sentence, as real steps, before dropout; a pair encoded 'separate'ly gets the same prompt in
  front of each sentence (the encoder runs once per sentence). The returned states drop the
  prompt steps, so they stay [b, l, ...] and the skip connection concatenates the tokens'
  embeddings only. A recurrent encoder sees the prompt through its forward direction: the first
  layer's backward LSTM reaches the prompt only after the sentence, so its states at the tokens do
  not depend on it (the upper layers' do, through the first layer's forward half).
  """
  config: BiLSTMConfig

  def setup(self):
    c = self.config
    self.embedder = layers.Embed(num_embeddings=c.vocab_size, features=c.embed_dim,
                                 embedding_init=nn.initializers.normal(stddev=c.embed_dim ** -0.5))
    self.encoder = _Stack(c)
    self.dropout = layers.Dropout(c.dropout_rate)
    self.prompt = (peft.PromptEmbedding(c.num_prompt_tokens, c.embed_dim,
                                        init_stddev=c.embed_dim ** -0.5)
                   if c.num_prompt_tokens else None)

  def __call__(self, tokens: Array, token_types: Array | None = None,
               enable_dropout: bool = False) -> list[Array]:
    del token_types
    valid = tokens > 0
    embedded = jnp.where(valid[..., None], self.embedder(tokens), 0.0)
    x, steps = embedded, valid
    n = self.config.num_prompt_tokens
    if n:
      x = jnp.concatenate([self.prompt(tokens.shape[0]), embedded], axis=1)
      steps = jnp.concatenate([jnp.ones((tokens.shape[0], n), bool), valid], axis=1)
    outputs = self.encoder(self.dropout(x, deterministic=not enable_dropout), steps,
                           enable_dropout)
    outputs = [o[:, n:] for o in outputs]
    if self.config.skip_embeddings:
      outputs[-1] = jnp.concatenate([outputs[-1], embedded], axis=-1)
    return [embedded, *outputs]


@gin.configurable
class CrossSentenceAttention(nn.Module):
  """Optional pair interaction before pooling (jiant's attention pair model, PAPERS.md §6).

  Bilinear scores a_i W b_j (masked to real tokens); each sentence is concatenated with its
  attention-weighted summary of the other: a' = [a; softmax_j(s) b], b' = [b; softmax_i(s)^T a].
  [b, l_a, d], [b, l_b, d] -> [b, l_a, 2d], [b, l_b, 2d]. Parameter `kernel` [d, d] (embed, mlp).
  """

  @nn.compact
  def __call__(self, a: Array, valid_a: Array, b: Array,
               valid_b: Array) -> tuple[Array, Array]:
    d = a.shape[-1]
    w = self.param('kernel', nn.with_logical_partitioning(
        nn.initializers.lecun_normal(), ('embed', 'mlp')), (d, d))
    scores = jnp.einsum('bid,de,bje->bij', a, w, b)
    mask = valid_a[:, :, None] & valid_b[:, None, :]
    scores = jnp.where(mask, scores, layers.NEG_INF)
    a_summary = jnp.einsum('bij,bjd->bid', jax.nn.softmax(scores, axis=2), b)
    b_summary = jnp.einsum('bij,bid->bjd', jax.nn.softmax(scores, axis=1), a)
    a_out = jnp.where(valid_a[..., None], jnp.concatenate([a, a_summary], -1), 0.0)
    b_out = jnp.where(valid_b[..., None], jnp.concatenate([b, b_summary], -1), 0.0)
    return a_out, b_out
