"""BERT (Devlin et al., 2019, §3 and Appendix A): an encoder-only Transformer and its masked LM.

Read top to bottom: `BertConfig`, the layers (`BertEmbeddings`, `BertLayer`), `BertEncoder` (the
encoder of the classifier protocol), `BertPooler`, the masked-LM head and module, then
`BertMaskedLMModel` (the t2t model API). Shapes: b = batch, l = length, d = hidden_size,
h = num_heads, k = d / h, f = intermediate_size, v = vocab_size.

BERT specifics (unlike t2t's T5 layers): word + learned absolute position + segment (token type)
embeddings, summed, then LayerNorm and dropout; post-LN residual blocks (LayerNorm(x + sublayer(x)))
with biases everywhere; attention logits scaled by 1 / sqrt(k); exact (erf) GELU in the FFN; keys
at padding positions (id 0) masked. The masked-LM head is dense + GELU + LayerNorm, then the word
embeddings (tied) plus an output bias (Appendix A.1). Weights are initialised N(0, 0.02).

Parameter tree of `BertMaskedLM` (a classifier that names its `BertEncoder` `encoder` has the
same `encoder/...` paths, so a pre-trained checkpoint restores into it by path):

  encoder/embeddings/word_embeddings/embedding                  [v, d]        (vocab, embed)
  encoder/embeddings/position_embeddings/embedding              [max_pos, d]  (abspos, embed)
  encoder/embeddings/token_type_embeddings/embedding            [types, d]    (token_types, embed)
  encoder/embeddings/layer_norm/{scale,bias}                    [d]           (embed)
  encoder/layers_{i}/attention/{query,key,value}/kernel         [d, h, k]     (embed, heads, kv)
  encoder/layers_{i}/attention/{query,key,value}/bias           [h, k]        (heads, kv)
  encoder/layers_{i}/attention/out/{kernel,bias}                [h, k, d], [d]
  encoder/layers_{i}/attention_layer_norm/{scale,bias}          [d]
  encoder/layers_{i}/mlp/wi/{kernel,bias}                       [d, f], [f]   (embed, mlp), (mlp)
  encoder/layers_{i}/mlp/wo/{kernel,bias}                       [f, d], [d]   (mlp, embed), (embed)
  encoder/layers_{i}/mlp_layer_norm/{scale,bias}                [d]
  mlm_head/transform/{kernel,bias}                              [d, d], [d]   (embed, embed_out)
  mlm_head/layer_norm/{scale,bias}                              [d]
  mlm_head/output_bias                                          [v]           (vocab)
  encoder/layers_{i}/adapter/{wi,wo}/kernel   with adapter_dim  [d, a], [a, d] (embed, adapter)
  prompt/embedding                      with num_prompt_tokens  [n, d]        (prompt, embed)

`BertPooler` (dense + tanh on the first token) is a separate module, `dense/{kernel,bias}`
[d, d] (embed, embed_out), wherever a classifier head puts it; the masked-LM model has none (no
next-sentence objective trains it).

Logical axis names beyond t2t/models/layers.py's: `abspos` (position-table rows), `token_types`
(token-type rows) and `embed_out` (the output side of the square [d, d] kernels; flax refuses a
name repeated within one array). The standard partitioning rules do not name them, so those
dimensions are replicated.

Hugging Face `BertModel` / `BertForMaskedLM` weights convert onto this tree with
`t2t.models.bert_hf.params_from_hf` (tested for parity in tests/models/test_bert.py).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import seqio

from t2t.data import mlm
from t2t.models import api, layers, matmuls, peft

Array = jax.Array
Batch = Mapping[str, Array]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Hyper-parameters of a BERT encoder. Defaults are BERT-base (Devlin et al., Table/§3)."""
  vocab_size: int                         # embedding rows incl. padding and special tokens
  hidden_size: int = 768                  # d: width of the residual stream
  num_layers: int = 12                    # Transformer blocks
  num_heads: int = 12                     # attention heads (hidden_size must divide evenly)
  intermediate_size: int = 3072           # f: hidden width of the feed-forward block
  max_position_embeddings: int = 512      # rows of the learned absolute position table
  type_vocab_size: int = 2                # segment (token type) ids: 0 = sentence A, 1 = sentence B
  dropout_rate: float = 0.1               # embeddings, residual branches (hidden_dropout_prob)
  attention_dropout_rate: float = 0.1     # attention weights (attention_probs_dropout_prob)
  layer_norm_epsilon: float = 1e-12       # BERT's LayerNorm epsilon
  initializer_range: float = 0.02         # stddev of the normal initialiser of every weight
  dtype: Any = jnp.float32                # activation / computation dtype
  param_dtype: Any = jnp.float32          # parameter storage dtype
  # Adapter layers (Houlsby et al. 2019 §2.1; t2t.models.peft.Adapter) of this inner width on each
  # block's FFN output, before its residual and LayerNorm; 0 = none. Parameters
  # `layers_{i}/adapter/{wi,wo}/kernel`, absent from a pre-trained checkpoint (start as identity).
  adapter_dim: int = 0
  # Prompt tuning (Lester et al. 2021 §2.2; t2t.models.peft.PromptEmbedding): this many learned
  # vectors `prompt/embedding` [n, d] prepended to the input of the first layer; 0 = none. See
  # `BertEncoder` for where they go and why.
  num_prompt_tokens: int = 0

  def __post_init__(self):
    for name in ('adapter_dim', 'num_prompt_tokens'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f'BertConfig.{name} must be a non-negative integer, got {value!r}.')
    for name in ('vocab_size', 'hidden_size', 'num_heads', 'intermediate_size',
                 'max_position_embeddings', 'type_vocab_size'):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f'BertConfig.{name} must be a positive integer, got {value!r}.')
    if not isinstance(self.num_layers, (int, np.integer)) or self.num_layers < 0:
      raise ValueError(f'BertConfig.num_layers must be a non-negative integer, got '
                       f'{self.num_layers!r}.')
    if self.hidden_size % self.num_heads:
      raise ValueError(f'BertConfig.hidden_size ({self.hidden_size}) must be divisible by '
                       f'num_heads ({self.num_heads}).')
    for name in ('dropout_rate', 'attention_dropout_rate'):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f'BertConfig.{name} must be in [0, 1), got {getattr(self, name)!r}.')
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype))
    object.__setattr__(self, 'param_dtype', jnp.dtype(self.param_dtype))

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads


def _init(c: BertConfig) -> layers.Initializer:
  return nn.initializers.normal(stddev=c.initializer_range)


def _constrain(x: Array) -> Array:
  return nn.with_logical_constraint(x, ('batch', 'length', 'embed'))


class DenseWithBias(nn.Module):
  """Dense layer with a bias, contracting `axis` into `features` (like layers.DenseGeneral).

  `kernel_axes` names every kernel dimension (contracted first), `bias_axes` the output dims.
  """
  features: int | tuple[int, ...]
  kernel_axes: tuple[str, ...]
  bias_axes: tuple[str, ...]
  axis: int | tuple[int, ...] = -1
  kernel_init: layers.Initializer = nn.initializers.normal(stddev=0.02)
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    axis = tuple(a % x.ndim for a in axis)
    kernel = self.param('kernel', nn.with_logical_partitioning(self.kernel_init, self.kernel_axes),
                        tuple(x.shape[a] for a in axis) + features, self.param_dtype)
    bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, self.bias_axes),
                      features, self.param_dtype)
    contract = (axis, tuple(range(len(axis))))
    y = jax.lax.dot_general(jnp.asarray(x, self.dtype), jnp.asarray(kernel, self.dtype),
                            (contract, ((), ())))
    return y + jnp.asarray(bias, self.dtype)


class LayerNorm(nn.Module):
  """LayerNorm with scale and bias over the last axis, statistics in float32. [..., d]."""
  epsilon: float = 1e-12
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    d = x.shape[-1]
    scale = self.param('scale', nn.with_logical_partitioning(nn.initializers.ones, ('embed',)),
                       (d,), self.param_dtype)
    bias = self.param('bias', nn.with_logical_partitioning(nn.initializers.zeros, ('embed',)),
                      (d,), self.param_dtype)
    x32 = jnp.asarray(x, jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.epsilon)
    return jnp.asarray(y * scale + bias, self.dtype)


def _layer_norm(c: BertConfig, name: str | None = None) -> LayerNorm:
  return LayerNorm(epsilon=c.layer_norm_epsilon, dtype=c.dtype, param_dtype=c.param_dtype,
                   name=name)


def _table(c: BertConfig, rows: int, axis: str, name: str) -> nn.Module:
  if axis == 'vocab':  # the word embeddings: layers.Embed, with `attend` for the tied MLM output
    return layers.Embed(num_embeddings=rows, features=c.hidden_size, embedding_init=_init(c),
                        dtype=c.dtype, param_dtype=c.param_dtype, name=name)
  return _RenamedRows(rows=rows, axis=axis, config=c, name=name)


class _RenamedRows(nn.Module):
  """An embedding table [rows, d] whose row axis has the logical name `axis`."""
  rows: int
  axis: str
  config: BertConfig

  @nn.compact
  def __call__(self, ids: Array) -> Array:
    c = self.config
    table = self.param('embedding', nn.with_logical_partitioning(_init(c), (self.axis, 'embed')),
                       (self.rows, c.hidden_size), c.param_dtype)
    return jnp.take(jnp.asarray(table, c.dtype), ids, axis=0)


class BertEmbeddings(nn.Module):
  """word + position + token-type embeddings, LayerNorm, dropout (§3.2). [b, l] -> [b, l, d]."""
  config: BertConfig

  def setup(self):
    c = self.config
    self.word_embeddings = _table(c, c.vocab_size, 'vocab', 'word_embeddings')
    self.position_embeddings = _table(c, c.max_position_embeddings, 'abspos', 'position_embeddings')
    self.token_type_embeddings = _table(c, c.type_vocab_size, 'token_types',
                                        'token_type_embeddings')
    self.layer_norm = _layer_norm(c)
    self.dropout = layers.Dropout(c.dropout_rate)

  def __call__(self, tokens: Array, token_types: Array, positions: Array,
               enable_dropout: bool) -> Array:
    x = (self.word_embeddings(tokens) + self.position_embeddings(positions)
         + self.token_type_embeddings(token_types))
    x = self.dropout(self.layer_norm(x), deterministic=not enable_dropout)
    return _constrain(x)

  def attend(self, x: Array) -> Array:
    """[b, l, d] -> [b, l, v] logits against the word embeddings (the tied MLM output)."""
    return self.word_embeddings.attend(x)


class BertSelfAttention(nn.Module):
  """Scaled dot-product self-attention with biases; `bias` masks (0 / NEG_INF). [b, l, d]."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, bias: Array, enable_dropout: bool) -> Array:
    c = self.config
    proj = lambda name: DenseWithBias(
        (c.num_heads, c.head_dim), kernel_axes=('embed', 'heads', 'kv'), bias_axes=('heads', 'kv'),
        kernel_init=_init(c), dtype=c.dtype, param_dtype=c.param_dtype, name=name)(x)
    qkv_axes = ('batch', 'length', 'heads', 'kv')
    query = nn.with_logical_constraint(proj('query'), qkv_axes)
    key = nn.with_logical_constraint(proj('key'), qkv_axes)
    value = nn.with_logical_constraint(proj('value'), qkv_axes)
    logits = matmuls.einsum2('bqhk,bthk->bhqt', query, key, preferred_element_type=jnp.float32)
    logits = logits / math.sqrt(c.head_dim) + bias
    weights = jax.nn.softmax(logits, axis=-1).astype(c.dtype)
    weights = layers.Dropout(c.attention_dropout_rate)(weights, deterministic=not enable_dropout)
    out = nn.with_logical_constraint(matmuls.einsum2('bhqt,bthk->bqhk', weights, value), qkv_axes)
    out = DenseWithBias(c.hidden_size, kernel_axes=('heads', 'kv', 'embed'), bias_axes=('embed',),
                        axis=(-2, -1), kernel_init=_init(c), dtype=c.dtype,
                        param_dtype=c.param_dtype, name='out')(out)
    return _constrain(out)


class BertMlp(nn.Module):
  """wo(gelu_erf(wi x)): the position-wise feed-forward block. [b, l, d] -> [b, l, d]."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    h = DenseWithBias(c.intermediate_size, kernel_axes=('embed', 'mlp'), bias_axes=('mlp',),
                      kernel_init=_init(c), dtype=c.dtype, param_dtype=c.param_dtype, name='wi')(x)
    h = nn.with_logical_constraint(jax.nn.gelu(h, approximate=False), ('batch', 'length', 'mlp'))
    out = DenseWithBias(c.hidden_size, kernel_axes=('mlp', 'embed'), bias_axes=('embed',),
                        kernel_init=_init(c), dtype=c.dtype, param_dtype=c.param_dtype,
                        name='wo')(h)
    return _constrain(out)


class BertLayer(nn.Module):
  """Post-LN block: x = LN(x + drop(attn(x))); x = LN(x + drop(mlp(x))). [b, l, d] -> [b, l, d]."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, bias: Array, enable_dropout: bool) -> Array:
    c = self.config
    drop = lambda y: layers.Dropout(c.dropout_rate)(y, deterministic=not enable_dropout)
    x = _layer_norm(c, 'attention_layer_norm')(
        x + drop(BertSelfAttention(c, name='attention')(x, bias, enable_dropout)))
    h = BertMlp(c, name='mlp')(x)
    if c.adapter_dim:
      h = peft.Adapter(c.adapter_dim, dtype=c.dtype, param_dtype=c.param_dtype, name='adapter')(h)
    x = _layer_norm(c, 'mlp_layer_norm')(x + drop(h))
    return _constrain(x)


@gin.configurable
class BertEncoder(nn.Module):
  """The BERT encoder of the classifier protocol: embeddings then `num_layers` post-LN blocks.

  Called as `encoder(tokens [b, l] int32, token_types [b, l] int32 | None, enable_dropout)` and
  returns `num_layers + 1` hidden states, each [b, l, d]: index 0 is the embeddings output, index
  i the output of layer i (the last one is BERT's sequence output). Padding is id 0: keys there are
  masked out of every attention. Optional packing features: `segment_ids` [b, l] (attention stays
  within a segment) and `positions` [b, l] (position ids; default 0..l-1).

  Prompt tuning (Lester et al. 2021 §2.2: learned vectors prepended to the embedded input, the
  model frozen): `prefix` [b, n, d] is prepended to the embeddings output, i.e. the first layer's
  input, before [CLS]. BERT's "embedded input" is LayerNorm(word + position + token type); the
  prompt vectors are free points of that space, so they get no position or token-type embedding
  (with dropout, like the embeddings) and the tokens keep their pre-trained positions 0..l-1 (so
  `max_position_embeddings` still bounds l alone). Every query attends to the n prompt keys.
  The returned states drop the prompt positions: [b, l, d] as without prompts, [CLS] still at
  index 0 for the pooler and 'first' pooling. Packed batches are refused (prompts are per row).
  """
  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = BertEmbeddings(c)
    self.layers = [BertLayer(c, name=f'layers_{i}') for i in range(c.num_layers)]

  def __call__(self, tokens: Array, token_types: Array | None = None, enable_dropout: bool = True,
               *, segment_ids: Array | None = None, positions: Array | None = None,
               prefix: Array | None = None) -> list[Array]:
    c = self.config
    if tokens.ndim != 2:
      raise ValueError(f'BertEncoder expects tokens [batch, length], got shape {tokens.shape}.')
    length = tokens.shape[1]
    if length > c.max_position_embeddings:
      raise ValueError(f'BERT: sequence length {length} (from TASK_FEATURE_LENGTHS) exceeds '
                       f'BertConfig.max_position_embeddings={c.max_position_embeddings}, the rows '
                       'of its learned position table; shorten TASK_FEATURE_LENGTHS, or raise '
                       'max_position_embeddings (MAX_POSITIONS) when training from scratch.')
    if token_types is None:
      token_types = jnp.zeros_like(tokens)
    if positions is None:
      positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), tokens.shape)
    if c.num_prompt_tokens and prefix is None:
      raise ValueError(f'BERT prompt tuning (BertConfig.num_prompt_tokens = {c.num_prompt_tokens}):'
                       ' a bare BertEncoder holds no prompt; use BertEncoderStates (classifier) or '
                       'BertMaskedLM, which own prompt/embedding.')
    valid = tokens > 0
    x = self.embeddings(tokens, token_types, positions, enable_dropout)
    n = 0
    if prefix is not None:
      if segment_ids is not None:
        raise ValueError('BERT prompt tuning (BertConfig.num_prompt_tokens > 0) needs unpacked '
                         'batches: set USE_PACKING = False (train.use_packing).')
      n = prefix.shape[1]
      prefix = self.embeddings.dropout(prefix.astype(x.dtype), deterministic=not enable_dropout)
      x = _constrain(jnp.concatenate([prefix, x], axis=1))
      valid = jnp.concatenate([jnp.ones(prefix.shape[:2], bool), valid], axis=1)
    # Only keys are masked (as in BERT): a padding query still attends to the real tokens, so its
    # (unused) output stays finite.
    mask = jnp.broadcast_to(valid[:, None, :], (tokens.shape[0], n + length, n + length))
    if segment_ids is not None:
      mask &= segment_ids[:, :, None] == segment_ids[:, None, :]
    bias = layers.mask_to_bias(mask[:, None])
    hidden = [x[:, n:]]
    for layer in self.layers:
      x = layer(x, bias, enable_dropout)
      hidden.append(x[:, n:])
    return hidden

  def attend(self, x: Array) -> Array:
    """[b, l, d] -> [b, l, v] logits against the word embeddings."""
    return self.embeddings.attend(x)


@gin.configurable
class BertEncoderStates(nn.Module):
  """`BertEncoder` under the scope `encoder`, for `ClassifierModel.encoder`.

  Same call and states as `BertEncoder`; its parameters are `encoder/embeddings/...` and
  `encoder/layers_{i}/...`, the paths of `BertMaskedLM`, so a masked-LM checkpoint loads into a
  classifier by path (the MLM head is skipped, the classifier head initialised fresh), and the
  layer-wise adaptation methods find `encoder/layers_{i}` as in T5. With
  `BertConfig.num_prompt_tokens` the prompt is `prompt/embedding`, at the top level as T5's.
  """
  config: BertConfig

  def setup(self):
    self.encoder = BertEncoder(self.config)
    self.prompt = _prompt(self.config)

  def __call__(self, tokens: Array, token_types: Array | None = None,
               enable_dropout: bool = False) -> list[Array]:
    prefix = None if self.prompt is None else self.prompt(tokens.shape[0])
    return self.encoder(tokens, token_types, enable_dropout, prefix=prefix)


def _prompt(c: BertConfig) -> peft.PromptEmbedding | None:
  """The prompt-tuning vectors, N(0, 1) like the LayerNorm-ed embeddings they sit beside."""
  if not c.num_prompt_tokens:
    return None
  return peft.PromptEmbedding(c.num_prompt_tokens, c.hidden_size, dtype=c.dtype,
                              param_dtype=c.param_dtype)


@gin.configurable
class BertPooler(nn.Module):
  """tanh(dense(h[:, 0])): the pooled [CLS] representation (§3). [b, l, d] -> [b, d]."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden: Array) -> Array:
    c = self.config
    first = hidden[:, 0]
    dense = DenseWithBias(c.hidden_size, kernel_axes=('embed', 'embed_out'), bias_axes=('embed',),
                          kernel_init=_init(c), dtype=c.dtype, param_dtype=c.param_dtype,
                          name='dense')
    return jnp.tanh(dense(first))


class BertMlmHead(nn.Module):
  """LayerNorm(gelu(dense(h))) -> tied word embeddings + output bias (Appendix A.1). [b, l, v]."""
  config: BertConfig

  @nn.compact
  def __call__(self, hidden: Array, encoder: BertEncoder) -> Array:
    c = self.config
    h = DenseWithBias(c.hidden_size, kernel_axes=('embed', 'embed_out'), bias_axes=('embed',),
                      kernel_init=_init(c), dtype=c.dtype, param_dtype=c.param_dtype,
                      name='transform')(hidden)
    h = _layer_norm(c, 'layer_norm')(jax.nn.gelu(h, approximate=False))
    output_bias = self.param('output_bias',
                             nn.with_logical_partitioning(nn.initializers.zeros, ('vocab',)),
                             (c.vocab_size,), c.param_dtype)
    logits = encoder.attend(h) + jnp.asarray(output_bias, c.dtype)
    return nn.with_logical_constraint(logits, ('batch', 'length', 'vocab'))


@gin.configurable
class BertMaskedLM(nn.Module):
  """`BertEncoder` + masked-LM head. tokens [b, l] -> logits [b, l, v] at every position."""
  config: BertConfig

  def setup(self):
    self.encoder = BertEncoder(self.config)
    self.mlm_head = BertMlmHead(self.config)
    self.prompt = _prompt(self.config)

  def __call__(self, tokens: Array, token_types: Array | None = None, enable_dropout: bool = True,
               *, segment_ids: Array | None = None, positions: Array | None = None) -> Array:
    prefix = None if self.prompt is None else self.prompt(tokens.shape[0])
    hidden = self.encoder(tokens, token_types, enable_dropout, segment_ids=segment_ids,
                          positions=positions, prefix=prefix)
    return self.mlm_head(hidden[-1], self.encoder)


_PACKING_KEYS = ('encoder_segment_ids', 'encoder_positions')


@gin.configurable
class BertMaskedLMModel:
  """Model API (t2t/models/api.py) for masked-LM pre-training of a `BertMaskedLM`.

  Batches come from `t2t.data.mlm.BertMlmFeatureConverter` (tasks preprocessed by `bert_mlm`):
  encoder_input_tokens / encoder_target_tokens / encoder_loss_weights [b, l], packed or not.
  The loss is cross-entropy on the corrupted positions only (encoder_loss_weights).
  """

  def __init__(self, module: BertMaskedLM, input_vocabulary: seqio.Vocabulary,
               output_vocabulary: seqio.Vocabulary | None = None):
    if not isinstance(module, BertMaskedLM):
      raise ValueError(f'BertMaskedLMModel.module must be a BertMaskedLM, got '
                       f'{type(module).__name__}.')
    output_vocabulary = input_vocabulary if output_vocabulary is None else output_vocabulary
    if output_vocabulary.vocab_size != input_vocabulary.vocab_size:
      raise ValueError('BertMaskedLMModel predicts input tokens: the input and output vocabularies '
                       f'must be the same, got sizes {input_vocabulary.vocab_size} and '
                       f'{output_vocabulary.vocab_size}.')
    if input_vocabulary.vocab_size > module.config.vocab_size:
      raise ValueError(f'The vocabulary has {input_vocabulary.vocab_size} ids but the model only '
                       f'{module.config.vocab_size} embeddings; raise BertConfig.vocab_size.')
    self.module = module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.special_ids = mlm.bert_special_ids(input_vocabulary)

  @property
  def feature_converter_cls(self) -> type[seqio.FeatureConverter]:
    return mlm.BertMlmFeatureConverter

  def get_initial_variables(self, rng: Array, input_shapes: Mapping[str, tuple[int, ...]],
                            input_types: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """Initial (boxed) variables for `input_shapes['encoder_input_tokens']`; eval_shape-safe."""
    if 'encoder_input_tokens' not in input_shapes:
      raise ValueError('get_initial_variables needs input_shapes["encoder_input_tokens"]; got keys '
                       f'{sorted(input_shapes)}.')
    del input_types
    tokens = jnp.ones(input_shapes['encoder_input_tokens'], jnp.int32)
    params_rng, dropout_rng = jax.random.split(rng)
    return self.module.init({'params': params_rng, 'dropout': dropout_rng}, tokens,
                            enable_dropout=False)

  def _logits(self, params: Any, batch: Batch, dropout_rng: Array | None) -> Array:
    rngs = {'dropout': dropout_rng} if dropout_rng is not None else None
    logits = self.module.apply(
        {'params': params}, batch['encoder_input_tokens'], None, dropout_rng is not None,
        segment_ids=batch.get('encoder_segment_ids'), positions=batch.get('encoder_positions'),
        rngs=rngs)
    return logits.astype(jnp.float32)

  def loss_fn(self, params: Any, batch: Batch,
              dropout_rng: Array | None) -> tuple[Array, dict[str, Array]]:
    """Mean cross-entropy over the corrupted positions (encoder_loss_weights); metrics as api.py."""
    _require(batch, ('encoder_input_tokens', 'encoder_target_tokens', 'encoder_loss_weights'),
             'loss_fn')
    weights = batch['encoder_loss_weights'].astype(jnp.float32)
    ce, correct = api.cross_entropy_with_logits(self._logits(params, batch, dropout_rng),
                                                batch['encoder_target_tokens'])
    num_tokens = jnp.sum(weights)
    denom = jnp.maximum(num_tokens, 1e-8)
    loss = jnp.sum(ce * weights) / denom
    return loss, {'loss': loss, 'accuracy': jnp.sum(correct * weights) / denom,
                  'num_tokens': num_tokens}

  def score_batch(self, params: Any, batch: Batch) -> Array:
    """Sum of the log-probabilities of the original tokens at the corrupted positions. [b]."""
    _require(batch, ('encoder_input_tokens', 'encoder_target_tokens', 'encoder_loss_weights'),
             'score_batch')
    _refuse_packed(batch, 'score_batch')
    log_probs = jax.nn.log_softmax(self._logits(params, batch, None), axis=-1)
    token = jnp.take_along_axis(log_probs, batch['encoder_target_tokens'][..., None], -1)[..., 0]
    return jnp.sum(token * batch['encoder_loss_weights'].astype(jnp.float32), axis=-1)

  def predict_batch(self, params: Any, batch: Batch, max_decode_length: int | None = None,
                    rng: Array | None = None) -> Array:
    """The reconstructed text: int32 [b, max_decode_length or l], EOS-terminated, then zeros.

    Every [MASK] position, and every position the batch marks as corrupted
    (encoder_loss_weights, when present), gets the model's argmax token; other tokens are copied
    from the input. [CLS], [SEP] and padding are dropped, the rest left-aligned, then EOS (id 1).
    A row longer than the output keeps its first tokens and ends with EOS in the last slot.
    """
    del rng  # deterministic: one forward pass
    _require(batch, ('encoder_input_tokens',), 'predict_batch')
    _refuse_packed(batch, 'predict_batch')
    tokens = batch['encoder_input_tokens']
    b, l = tokens.shape
    width = l if max_decode_length is None else max_decode_length
    api.check_max_decode_length(width, None, 'BertMaskedLMModel')
    ids = self.special_ids
    fill = tokens == ids.mask
    if 'encoder_loss_weights' in batch:
      fill |= batch['encoder_loss_weights'] > 0
    predicted = jnp.argmax(self._logits(params, batch, None), axis=-1).astype(jnp.int32)
    text = jnp.where(fill, predicted, tokens)
    keep = (tokens > 0) & (tokens != ids.cls) & (tokens != ids.sep)
    slot = jnp.cumsum(keep, axis=1) - 1
    slot = jnp.where(keep & (slot < width - 1), slot, width)  # overflow and dropped -> spare slot
    rows = jnp.arange(b)[:, None]
    out = jnp.zeros((b, width + 1), jnp.int32).at[rows, slot].set(text)
    n = jnp.minimum(jnp.sum(keep, axis=1), width - 1)
    out = out.at[jnp.arange(b), n].set(1)  # EOS
    return out[:, :width]


def _require(batch: Batch, keys: Sequence[str], where: str) -> None:
  api.require_features(batch, keys, where, 't2t.data.mlm.BertMlmFeatureConverter')


_refuse_packed = api.refuse_packed
