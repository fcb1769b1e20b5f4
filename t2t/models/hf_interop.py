"""Conversion between t2t's T5 and Hugging Face's `T5ForConditionalGeneration` (config and weights).

`transformers` and `torch` are optional: they are imported only by the functions that build Hugging Face
objects (`hf_config_from_t5`, `hf_model_from_t5`). The weight converters work on plain mappings of
arrays (torch tensors are converted with `.numpy()`), so a state dict saved by either side can be read.

Weight layout (Hugging Face `nn.Linear.weight` is [out, in]; t2t kernels are [in, ...out]):
  q/k/v [h*d_kv, d]  <->  query/key/value kernel [d, h, d_kv]
  o     [d, h*d_kv]  <->  out kernel [h, d_kv, d]
  wi / wi_0 / wi_1 [d_ff, d], wo [d, d_ff]  <->  transposes
  relative_attention_bias [buckets, h] (in block 0 only)  <->  relpos_bias/rel_embedding [h, buckets]
  shared [v, d]  <->  token_embedder/embedding; lm_head [v, d]  <->  decoder/logits_dense [d, v] (untied)
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from t2t.models.transformer import T5Config

Params = dict[str, Any]

_ACCEPTED_MODEL_TYPES = ('t5', 'mt5')


def t5_config_from_hf(hf_config: Any, **overrides: Any) -> T5Config:
  """Builds a `T5Config` from a Hugging Face T5 (or mT5) config; `overrides` replace fields (e.g. dtype).

  Raises ValueError for another architecture or a feed-forward variant t2t does not implement.
  """
  model_type = getattr(hf_config, 'model_type', None)
  if model_type not in _ACCEPTED_MODEL_TYPES:
    raise ValueError(f'Expected a Hugging Face T5 config (model_type in {_ACCEPTED_MODEL_TYPES}), '
                     f'got model_type={model_type!r}.')
  if not getattr(hf_config, 'is_encoder_decoder', True):
    raise ValueError('Expected an encoder-decoder T5 config, got is_encoder_decoder=False.')
  ff = hf_config.feed_forward_proj
  if ff not in ('relu', 'gated-gelu'):
    raise ValueError(f"Hugging Face feed_forward_proj={ff!r} is not supported; t2t implements 'relu' "
                     "(T5 v1.0) and 'gated-gelu' (T5 v1.1).")
  # Recent transformers always tie the weights in the config and record T5 v1.0's output rescaling
  # (which is what "tied" means for the computation) in `scale_decoder_outputs`; older releases use
  # `tie_word_embeddings` for both.
  tied = bool(getattr(hf_config, 'scale_decoder_outputs', hf_config.tie_word_embeddings))
  num_decoder_layers = hf_config.num_decoder_layers
  fields = dict(
      vocab_size=hf_config.vocab_size, d_model=hf_config.d_model, num_heads=hf_config.num_heads,
      d_kv=hf_config.d_kv, d_ff=hf_config.d_ff, num_encoder_layers=hf_config.num_layers,
      num_decoder_layers=hf_config.num_layers if num_decoder_layers is None else num_decoder_layers,
      dropout_rate=hf_config.dropout_rate,
      relative_attention_num_buckets=hf_config.relative_attention_num_buckets,
      relative_attention_max_distance=getattr(hf_config, 'relative_attention_max_distance', 128),
      layer_norm_epsilon=hf_config.layer_norm_epsilon, feed_forward_proj=ff, tie_word_embeddings=tied)
  fields.update(overrides)
  return T5Config(**fields)


def hf_config_from_t5(config: T5Config) -> Any:
  """The Hugging Face `transformers.T5Config` equivalent to `config` (needs `transformers`)."""
  import transformers  # pylint: disable=g-import-not-at-top
  return transformers.T5Config(
      vocab_size=config.vocab_size, d_model=config.d_model, d_kv=config.d_kv, d_ff=config.d_ff,
      num_layers=config.num_encoder_layers, num_decoder_layers=config.num_decoder_layers,
      num_heads=config.num_heads, relative_attention_num_buckets=config.relative_attention_num_buckets,
      relative_attention_max_distance=config.relative_attention_max_distance,
      dropout_rate=config.dropout_rate, layer_norm_epsilon=config.layer_norm_epsilon,
      feed_forward_proj=config.feed_forward_proj, tie_word_embeddings=config.tie_word_embeddings,
      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def _to_numpy(value: Any) -> np.ndarray:
  if hasattr(value, 'detach'):  # torch tensor; bfloat16 has no numpy twin, so widen it
    value = value.detach().cpu()
    if str(value.dtype) == 'torch.bfloat16':
      value = value.float()
    return value.numpy()
  return np.asarray(value)


def _layer_names(stack: str) -> list[tuple[int, str]]:
  """(HF sub-layer index, t2t attention name) for each attention in a block of `stack`."""
  if stack == 'encoder':
    return [(0, 'attention')]
  return [(0, 'self_attention'), (1, 'encoder_decoder_attention')]


def _t2t_block_names(stack: str) -> tuple[list[str], str]:
  if stack == 'encoder':
    return ['pre_attention_layer_norm'], 'pre_mlp_layer_norm'
  return ['pre_self_attention_layer_norm', 'pre_cross_attention_layer_norm'], 'pre_mlp_layer_norm'


def _mlp_names(config: T5Config) -> list[str]:
  return ['wi'] if config.feed_forward_proj == 'relu' else ['wi_0', 'wi_1']


def _mapping(config: T5Config) -> list[tuple[str, tuple[str, ...], str]]:
  """(HF key, t2t param path, kind) for every weight except embeddings / lm_head."""
  out = []
  for stack, num_layers in (('encoder', config.num_encoder_layers),
                            ('decoder', config.num_decoder_layers)):
    attn_norms, mlp_norm = _t2t_block_names(stack)
    ff_index = 1 if stack == 'encoder' else 2
    for i in range(num_layers):
      hf_block, t2t_layer = f'{stack}.block.{i}.layer', (stack, f'layers_{i}')
      for (sub, attn), norm in zip(_layer_names(stack), attn_norms):
        hf_attn = 'SelfAttention' if sub == 0 else 'EncDecAttention'
        for proj, name in (('q', 'query'), ('k', 'key'), ('v', 'value')):
          out.append((f'{hf_block}.{sub}.{hf_attn}.{proj}.weight', t2t_layer + (attn, name, 'kernel'),
                      'qkv'))
        out.append((f'{hf_block}.{sub}.{hf_attn}.o.weight', t2t_layer + (attn, 'out', 'kernel'), 'o'))
        out.append((f'{hf_block}.{sub}.layer_norm.weight', t2t_layer + (norm, 'scale'), 'copy'))
      for name in _mlp_names(config):
        out.append((f'{hf_block}.{ff_index}.DenseReluDense.{name}.weight',
                    t2t_layer + ('mlp', name, 'kernel'), 'transpose'))
      out.append((f'{hf_block}.{ff_index}.DenseReluDense.wo.weight', t2t_layer + ('mlp', 'wo', 'kernel'),
                  'transpose'))
      out.append((f'{hf_block}.{ff_index}.layer_norm.weight', t2t_layer + (mlp_norm, 'scale'), 'copy'))
    out.append((f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
                (stack, 'relpos_bias', 'rel_embedding'), 'transpose'))
    out.append((f'{stack}.final_layer_norm.weight', (stack, f'{stack}_norm', 'scale'), 'copy'))
  return out


def _set(tree: dict, path: tuple[str, ...], value: np.ndarray) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: Mapping, path: tuple[str, ...]) -> np.ndarray:
  for key in path:
    if not isinstance(tree, Mapping) or key not in tree:
      raise ValueError(f"t2t params have no entry {'/'.join(path)}; do they match the config?")
    tree = tree[key]
  return np.asarray(tree)


def params_from_hf(hf_state_dict_or_model: Any, config: T5Config) -> Params:
  """Hugging Face T5 weights -> t2t `params` tree (nested dict of numpy arrays in config.param_dtype).

  Accepts a `T5ForConditionalGeneration` (anything with `.state_dict()`) or a mapping of name -> array.
  Raises ValueError when a weight is missing or has the wrong shape for `config`.
  """
  source = hf_state_dict_or_model
  if hasattr(source, 'state_dict'):
    source = source.state_dict()
  if not isinstance(source, Mapping):
    raise ValueError(f'params_from_hf expects a state dict or a model, got {type(source).__name__}.')
  h, dkv, d = config.num_heads, config.d_kv, config.d_model
  dtype = np.dtype(config.param_dtype)

  def fetch(key: str, shape: tuple[int, ...]) -> np.ndarray:
    if key not in source:
      raise ValueError(f'Hugging Face weights lack {key!r}; are they a T5 model matching the config?')
    value = _to_numpy(source[key])
    if value.shape != shape:
      raise ValueError(f'Hugging Face weight {key!r} has shape {value.shape}, expected {shape} '
                       'for this T5Config.')
    return value

  params: Params = {}
  for key, path, kind in _mapping(config):
    if kind == 'qkv':
      value = fetch(key, (h * dkv, d)).T.reshape(d, h, dkv)
    elif kind == 'o':
      value = fetch(key, (d, h * dkv)).T.reshape(h, dkv, d)
    elif kind == 'transpose':
      if 'relative_attention_bias' in key:
        value = fetch(key, (config.relative_attention_num_buckets, h)).T
      elif key.endswith('wo.weight'):
        value = fetch(key, (d, config.d_ff)).T
      else:
        value = fetch(key, (config.d_ff, d)).T
    else:
      value = fetch(key, (d,))
    _set(params, path, value.astype(dtype))

  emb_key = 'shared.weight' if 'shared.weight' in source else 'encoder.embed_tokens.weight'
  embedding = fetch(emb_key, (config.vocab_size, d))
  _set(params, ('token_embedder', 'embedding'), embedding.astype(dtype))
  if config.tie_word_embeddings:
    if 'lm_head.weight' in source and not np.array_equal(_to_numpy(source['lm_head.weight']),
                                                         embedding):
      raise ValueError('The config says tied embeddings (T5 v1.0: logits from the shared embedding '
                       'with d_model**-0.5 scaling) but lm_head.weight differs from shared.weight; '
                       'convert with tie_word_embeddings=False.')
  else:
    lm_head = fetch('lm_head.weight', (config.vocab_size, d))
    _set(params, ('decoder', 'logits_dense', 'kernel'), lm_head.T.astype(dtype))
  return params


def params_to_hf(params: Mapping, config: T5Config) -> dict[str, np.ndarray]:
  """t2t `params` -> Hugging Face state dict (name -> numpy array); inverse of `params_from_hf`.

  Includes the embedding aliases (`encoder.embed_tokens.weight`, `decoder.embed_tokens.weight`) and
  `lm_head.weight` (the shared embedding when tied, as Hugging Face stores it).
  """
  if 'params' in params and 'token_embedder' not in params:
    params = params['params']
  h, dkv, d = config.num_heads, config.d_kv, config.d_model
  state: dict[str, np.ndarray] = {}
  for key, path, kind in _mapping(config):
    value = _get(params, path)
    if kind == 'qkv':
      value = value.reshape(d, h * dkv).T
    elif kind == 'o':
      value = value.reshape(h * dkv, d).T
    elif kind == 'transpose':
      value = value.T
    state[key] = np.ascontiguousarray(value)
  embedding = np.ascontiguousarray(_get(params, ('token_embedder', 'embedding')))
  for key in ('shared.weight', 'encoder.embed_tokens.weight', 'decoder.embed_tokens.weight'):
    state[key] = embedding
  if config.tie_word_embeddings:
    state['lm_head.weight'] = embedding
  else:
    state['lm_head.weight'] = np.ascontiguousarray(_get(params, ('decoder', 'logits_dense', 'kernel')).T)
  return state


def hf_model_from_t5(params: Mapping, config: T5Config) -> Any:
  """A Hugging Face `T5ForConditionalGeneration` (fp32, eval mode) carrying t2t `params`.

  For untied configs the output head is given its own parameter: recent transformers tie `lm_head`
  to `shared` on construction whatever the config says.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.T5ForConditionalGeneration(hf_config_from_t5(config))
  state = params_to_hf(params, config)
  if not config.tie_word_embeddings and model.lm_head.weight is model.shared.weight:
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    tied_keys = getattr(model, 'all_tied_weights_keys', None)
    if isinstance(tied_keys, dict):
      tied_keys.pop('lm_head.weight', None)
  tensors = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in state.items()}
  missing, unexpected = model.load_state_dict(tensors, strict=False)
  if missing or unexpected:
    raise ValueError(f'Hugging Face model did not accept the converted weights: missing={missing}, '
                     f'unexpected={unexpected}.')
  return model.eval()
