"""Edge probing: span and span-pair classifiers on frozen token states (JAX/optax).

Tenney et al. (2019, "What do you learn from context? Probing for sentence structure in
contextualized word representations", §3.1 and Figure 1), the edge-probing suite Pruksachatkun
et al. (2020, §3.2) run on each intermediate-task model: the encoder is frozen; each span's
token states are projected, pooled by self-attentive pooling (a learned score per token, softmax
over the span's tokens), the one or two span vectors are concatenated and an MLP (one hidden
layer, tanh, LayerNorm) predicts the label. Tenney et al. train with a sigmoid per label for
multi-label targets; the tasks here have one label per edge, so a softmax cross-entropy is used.

Spans are [start, end) token indices into the rows of `states` [n, l, d].
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class EdgeData:
  """Frozen token states and the edges to classify.

  states: float32 [n, l, d]; span1: int [n, 2] ([start, end)); span2: int [n, 2] for span-pair
  tasks, else None; labels: int [n] in [0, num_labels).
  """
  states: np.ndarray
  span1: np.ndarray
  labels: np.ndarray
  span2: np.ndarray | None = None

  def check(self, name: str, num_labels: int) -> None:
    """Raises a clear error on bad shapes, spans outside the rows, or labels out of range."""
    n, length = self.states.shape[:2] if self.states.ndim == 3 else (None, None)
    if self.states.ndim != 3:
      raise ValueError(f"{name}: states must be [examples, length, dims], got {self.states.shape}.")
    for which, spans in (("span1", self.span1), ("span2", self.span2)):
      if spans is None:
        continue
      spans = np.asarray(spans)
      if spans.shape != (n, 2):
        raise ValueError(f"{name}: {which} must be [{n}, 2], got {spans.shape}.")
      bad = np.flatnonzero((spans[:, 0] < 0) | (spans[:, 1] <= spans[:, 0]) | (spans[:, 1] > length))
      if len(bad):
        raise ValueError(f"{name}: {which} of example {bad[0]} is {spans[bad[0]].tolist()}; spans "
                         f"are [start, end) with 0 <= start < end <= {length}.")
    labels = np.asarray(self.labels)
    if labels.shape != (n,) or labels.min() < 0 or labels.max() >= num_labels:
      raise ValueError(f"{name}: labels must be [{n}] ints in [0, {num_labels}).")


class SelfAttentiveSpan(nn.Module):
  """Projection + self-attentive pooling of one span: [b, l, d], [b, 2] -> [b, proj_dim]."""
  proj_dim: int

  @nn.compact
  def __call__(self, states: Array, spans: Array) -> Array:
    x = nn.Dense(self.proj_dim, name="projection")(states)
    positions = jnp.arange(states.shape[1])[None, :]
    inside = (positions >= spans[:, :1]) & (positions < spans[:, 1:2])
    scores = jnp.where(inside, nn.Dense(1, name="attention")(x)[..., 0], -1e9)
    weights = jax.nn.softmax(scores, axis=-1) * inside
    return jnp.einsum("bl,bld->bd", weights, x)


class EdgeProbe(nn.Module):
  """Span (or span-pair) representations -> MLP -> logits [b, num_labels]."""
  num_labels: int
  proj_dim: int = 64
  hidden_dim: int = 64

  @nn.compact
  def __call__(self, states: Array, span1: Array, span2: Array | None = None) -> Array:
    parts = [SelfAttentiveSpan(self.proj_dim, name="span1")(states, span1)]
    if span2 is not None:
      parts.append(SelfAttentiveSpan(self.proj_dim, name="span2")(states, span2))
    h = jnp.tanh(nn.Dense(self.hidden_dim, name="hidden")(jnp.concatenate(parts, axis=-1)))
    h = nn.LayerNorm(name="layer_norm")(h)
    return nn.Dense(self.num_labels, name="out")(h)


def _batch(data: EdgeData, index: np.ndarray) -> tuple[Any, ...]:
  span2 = None if data.span2 is None else jnp.asarray(data.span2[index], jnp.int32)
  return (jnp.asarray(data.states[index], jnp.float32), jnp.asarray(data.span1[index], jnp.int32),
          span2, jnp.asarray(data.labels[index], jnp.int32))


def train_edge_probe(train: EdgeData, evaluation: EdgeData, num_labels: int, steps: int = 300,
                     batch_size: int = 64, learning_rate: float = 3e-3, proj_dim: int = 64,
                     hidden_dim: int = 64, seed: int = 0) -> dict[str, float]:
  """Trains an ``EdgeProbe`` with Adam on ``train`` and returns its accuracy (x 100) on ``evaluation``.

  Both sets must agree on being span or span-pair tasks.
  """
  train.check("train", num_labels)
  evaluation.check("evaluation", num_labels)
  if (train.span2 is None) != (evaluation.span2 is None):
    raise ValueError("train and evaluation must both be span tasks or both span-pair tasks.")
  probe = EdgeProbe(num_labels, proj_dim, hidden_dim)
  rng = np.random.RandomState(seed)
  first = _batch(train, np.arange(min(batch_size, len(train.labels))))
  params = probe.init(jax.random.PRNGKey(seed), *first[:3])["params"]
  optimizer = optax.adam(learning_rate)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, states, span1, span2, labels):
    def loss_fn(p):
      logits = probe.apply({"params": p}, states, span1, span2)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  n = len(train.labels)
  for _ in range(steps):
    index = rng.choice(n, size=min(batch_size, n), replace=False)
    params, opt_state, _ = step(params, opt_state, *_batch(train, index))

  predict = jax.jit(lambda p, s, a, b: jnp.argmax(probe.apply({"params": p}, s, a, b), -1))
  predictions = []
  for start in range(0, len(evaluation.labels), 256):
    index = np.arange(start, min(start + 256, len(evaluation.labels)))
    states, span1, span2, _ = _batch(evaluation, index)
    predictions.append(np.asarray(predict(params, states, span1, span2)))
  correct = np.concatenate(predictions) == np.asarray(evaluation.labels)
  return {"accuracy": 100.0 * float(correct.mean())}


def window_spans(tokens: np.ndarray, width: int, seed: int = 0) -> np.ndarray:
  """One random span of ``width`` tokens inside each row's non-padding tokens: int [n, 2].

  A row shorter than ``width`` gets its whole length. Used for a real span task from a
  classification task: the label of each window is its example's label ("what does this local
  context say about the topic?").
  """
  if width < 1:
    raise ValueError(f"window width must be >= 1, got {width}.")
  rng = np.random.RandomState(seed)
  lengths = (np.asarray(tokens) > 0).sum(axis=1)
  if np.any(lengths == 0):
    raise ValueError(f"example {int(np.argmax(lengths == 0))} has no tokens to put a span on.")
  starts = np.array([rng.randint(0, max(n - width, 0) + 1) for n in lengths])
  return np.stack([starts, np.minimum(starts + width, lengths)], axis=1)


def label_ids(labels: list, classes: list | None = None) -> tuple[np.ndarray, list]:
  """String labels -> int ids (classes in sorted order unless given); unknown labels are errors."""
  classes = sorted(set(labels)) if classes is None else list(classes)
  index = {c: i for i, c in enumerate(classes)}
  unknown = sorted({l for l in labels if l not in index})
  if unknown:
    raise ValueError(f"labels {unknown[:5]} are not among the training labels {classes}.")
  return np.array([index[l] for l in labels], np.int32), classes
