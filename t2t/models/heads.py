"""Task heads for the classifier baselines: pooling, jiant's MLP classifier, the sentence-pair
combination, a regression head, and ELMo's scalar mix over an encoder's layers.

Shapes: b = batch, l = length, d = hidden width, n = outputs (labels, or 1 for regression).
`valid` masks are [b, l] booleans (True at real tokens; padding id 0 -> False).

Parameters carry logical axis names: `embed` (the encoder width), `mlp` (the head's hidden width),
`classes` (one per label) and `mix_layers` (one per mixed layer). The classifier model stores a
head's parameters under the top-level `head` scope and the mix under `scalar_mix`.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from t2t.models import layers

Array = jax.Array

POOLINGS = ('max', 'mean', 'first', 'projected_max')
CLASSIFIERS = ('mlp', 'linear')


def pool(states: Array, valid: Array, method: str) -> Array:
  """Pools [b, l, d] states over their valid positions -> [b, d].

  'max': element-wise max over real tokens (a row without any is 0); 'mean': their average;
  'first': position 0 (BERT's [CLS]). ('projected_max' is `ClassifierHead`'s: a projection first.)
  """
  if method == 'first':
    return states[:, 0]
  mask = valid[..., None]
  if method in ('max', 'projected_max'):
    pooled = jnp.max(jnp.where(mask, states, -jnp.inf), axis=1)
    return jnp.where(jnp.any(valid, axis=1)[:, None], pooled, 0.0).astype(states.dtype)
  if method == 'mean':
    count = jnp.maximum(jnp.sum(mask, axis=1), 1)
    return jnp.sum(jnp.where(mask, states, 0.0), axis=1) / count
  raise ValueError(f'Unknown pooling {method!r}; choose one of {POOLINGS}.')


def combine_pair(u: Array, v: Array) -> Array:
  """jiant's pair features [u; v; |u - v|; u * v] of two pooled sentences [b, d] -> [b, 4d].

  Wang et al. (2019), "Can you tell me how to get past Sesame Street?", §4 (PAPERS.md §6), after
  InferSent (Conneau et al., 2017).
  """
  if u.shape != v.shape:
    raise ValueError(f'combine_pair needs equal shapes, got {u.shape} and {v.shape}.')
  return jnp.concatenate([u, v, jnp.abs(u - v), u * v], axis=-1)


def _dense(features: int, axes: tuple[str, str], name: str) -> nn.Dense:
  return nn.Dense(features, name=name,
                  kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros, (axes[1],)))


class ScalarMix(nn.Module):
  """ELMo's learned layer mix: gamma * sum_j softmax(w)_j * h_j over all layers (Peters et al.,
  2018, "Deep contextualized word representations", §3.2 eq. 1; PAPERS.md §7 feature extraction).

  Parameters: `weights` [num_layers] ('mix_layers'; zeros, i.e. an even mix at the start) and a
  scalar `gamma` (1.0). States: a sequence of num_layers arrays [b, l, d] -> [b, l, d].
  """
  num_layers: int

  @nn.compact
  def __call__(self, states: Sequence[Array]) -> Array:
    if len(states) != self.num_layers:
      raise ValueError(f'ScalarMix was built for {self.num_layers} layers, got {len(states)}.')
    widths = {s.shape for s in states}
    if len(widths) != 1:
      raise ValueError(f'ScalarMix needs every layer in the same shape, got {sorted(widths)}; '
                       'mix the layers of an encoder whose states share one width (T5, BERT).')
    w = self.param('weights', nn.with_logical_partitioning(nn.initializers.zeros, ('mix_layers',)),
                   (self.num_layers,), jnp.float32)
    gamma = self.param('gamma', nn.with_logical_partitioning(nn.initializers.ones, ()), (),
                       jnp.float32)
    s = jax.nn.softmax(w)
    stacked = jnp.stack(states, axis=0)  # [num_layers, b, l, d]
    return gamma * jnp.einsum('j,j...->...', s, stacked.astype(jnp.float32))


class MLPClassifier(nn.Module):
  """jiant's classifier: Linear -> tanh -> LayerNorm -> Dropout -> Linear. [b, d_in] -> [b, n].

  Wang et al. (2019) §4 / jiant's `Classifier` (PAPERS.md §6); hidden_dim and dropout by task size
  (small 128 / 0.4, medium 256 / 0.2, large 512 / 0.2; see gin/models/bilstm/).
  """
  num_outputs: int
  hidden_dim: int = 512
  dropout_rate: float = 0.2

  @nn.compact
  def __call__(self, x: Array, enable_dropout: bool = False) -> Array:
    h = jnp.tanh(_dense(self.hidden_dim, ('embed', 'mlp'), 'hidden')(x))
    h = nn.LayerNorm(name='layer_norm',
                     scale_init=nn.with_logical_partitioning(nn.initializers.ones, ('mlp',)),
                     bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ('mlp',)))(h)
    h = layers.Dropout(self.dropout_rate)(h, deterministic=not enable_dropout)
    return _dense(self.num_outputs, ('mlp', 'classes'), 'output')(h)


@gin.configurable
class ClassifierHead(nn.Module):
  """Pool the encoder states (of one sentence, or of two and combine them), then classify.

  `__call__(states_a, valid_a, states_b=None, valid_b=None, enable_dropout)`: [b, l, d] states with
  [b, l] masks -> logits [b, num_outputs]. With `states_b`, u = pool(a), v = pool(b) are combined
  as [u; v; |u-v|; u*v] (`combine_pair`). `pair_interaction` (e.g. bilstm.CrossSentenceAttention)
  maps (a, valid_a, b, valid_b) -> (a', b') before pooling. `classifier='linear'` is a plain
  linear layer (a logistic-regression probe, Peters et al. 2019 §5 diagnostic classifiers).

  The regression head (STS-B; jiant's is its classifier with one output trained with MSE,
  PAPERS.md §6) is `regression=True`: one output, returned as a [b] score.
  """
  num_outputs: int
  hidden_dim: int = 512
  dropout_rate: float = 0.2
  pooling: str = 'max'
  projection_dim: int = 512  # jiant's d_proj, for pooling='projected_max'
  classifier: str = 'mlp'
  pair_interaction: nn.Module | None = None
  regression: bool = False

  @nn.compact
  def __call__(self, states_a: Array, valid_a: Array, states_b: Array | None = None,
               valid_b: Array | None = None, enable_dropout: bool = False) -> Array:
    if self.pooling not in POOLINGS:
      raise ValueError(f'Unknown pooling {self.pooling!r}; choose one of {POOLINGS}.')
    if self.regression and self.num_outputs != 1:
      raise ValueError(f'A regression head has one output, got num_outputs={self.num_outputs}.')
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'Unknown classifier {self.classifier!r}; choose one of {CLASSIFIERS}.')
    if states_b is not None and self.pair_interaction is not None:
      states_a, states_b = self.pair_interaction(states_a, valid_a, states_b, valid_b)
    project = (_dense(self.projection_dim, ('embed', 'mlp'), 'pool_projection')
               if self.pooling == 'projected_max' else (lambda s: s))
    features = pool(project(states_a), valid_a, self.pooling)
    if states_b is not None:
      features = combine_pair(features, pool(project(states_b), valid_b, self.pooling))
    if self.classifier == 'linear':
      outputs = _dense(self.num_outputs, ('embed', 'classes'), 'output')(features)
    else:
      outputs = MLPClassifier(self.num_outputs, self.hidden_dim, self.dropout_rate, name='mlp')(
          features, enable_dropout)
    return outputs[:, 0] if self.regression else outputs
