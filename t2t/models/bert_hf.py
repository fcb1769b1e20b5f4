"""Hugging Face `BertModel` / `BertForMaskedLM` weights -> t2t's BERT (t2t/models/bert.py).

So the BERT baseline can start from a published checkpoint that is already on disk (nothing is
downloaded here): `params = params_from_hf(torch_model_or_state_dict, bert_config_from_hf(cfg))`.
Works on plain mappings of arrays (torch tensors are converted with `.numpy()`).

Weight layout (Hugging Face `nn.Linear.weight` is [out, in]; t2t kernels are [in..., out...]):
  attention.self.{query,key,value} [d, d]  ->  attention/{query,key,value}/kernel [d, h, k], bias
  attention.output.dense [d, d]            ->  attention/out/kernel [h, k, d]
  intermediate.dense [f, d], output.dense [d, f]  ->  mlp/wi [d, f], mlp/wo [f, d]
  *.LayerNorm.{weight,bias}                ->  */{scale,bias}
  cls.predictions.{transform.dense, transform.LayerNorm, bias}  ->  mlm_head/{transform, layer_norm,
  output_bias} (the decoder weight is the tied word embedding table)
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from t2t.models.bert import BertConfig

Params = dict[str, Any]


def bert_config_from_hf(hf_config: Any, **overrides: Any) -> BertConfig:
  """A `BertConfig` from a Hugging Face BERT config; `overrides` replace fields (e.g. dtype)."""
  if getattr(hf_config, 'model_type', None) != 'bert':
    raise ValueError(f"Expected a Hugging Face BERT config (model_type 'bert'), got "
                     f"{getattr(hf_config, 'model_type', None)!r}.")
  if hf_config.hidden_act != 'gelu':
    raise ValueError(f"t2t's BERT uses the exact (erf) GELU; hidden_act={hf_config.hidden_act!r} "
                     'is not supported.')
  fields = dict(
      vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
      num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
      intermediate_size=hf_config.intermediate_size,
      max_position_embeddings=hf_config.max_position_embeddings,
      type_vocab_size=hf_config.type_vocab_size, dropout_rate=hf_config.hidden_dropout_prob,
      attention_dropout_rate=hf_config.attention_probs_dropout_prob,
      layer_norm_epsilon=hf_config.layer_norm_eps, initializer_range=hf_config.initializer_range)
  fields.update(overrides)
  return BertConfig(**fields)


def _state_dict(model_or_state_dict: Any) -> dict[str, np.ndarray]:
  sd = model_or_state_dict.state_dict() if hasattr(model_or_state_dict, 'state_dict') else dict(
      model_or_state_dict)
  out = {}
  for key, value in sd.items():
    if hasattr(value, 'detach'):
      value = value.detach().cpu().float().numpy()
    out[key] = np.asarray(value, np.float32)
  return out


def _dense(sd: Mapping[str, np.ndarray], prefix: str, in_shape: tuple[int, ...] | None = None,
           out_shape: tuple[int, ...] | None = None) -> Params:
  """torch Linear (weight [out, in]) -> {kernel [in..., out...], bias [out...]}."""
  w, b = sd[f'{prefix}.weight'].T, sd[f'{prefix}.bias']
  if in_shape is not None:
    w = w.reshape(*in_shape, w.shape[-1])
  if out_shape is not None:
    w, b = w.reshape(*w.shape[:-1], *out_shape), b.reshape(out_shape)
  return {'kernel': w, 'bias': b}


def _norm(sd: Mapping[str, np.ndarray], prefix: str) -> Params:
  return {'scale': sd[f'{prefix}.weight'], 'bias': sd[f'{prefix}.bias']}


def params_from_hf(model_or_state_dict: Any, config: BertConfig) -> Params:
  """{'encoder': ..., 'mlm_head': ... (BertForMaskedLM only), 'pooler': ... (if present)}.

  'encoder' is `BertEncoder`'s tree (also `BertMaskedLM`'s `encoder`), 'pooler' `BertPooler`'s.
  Keys may carry BertForMaskedLM's 'bert.' prefix or none (BertModel).
  """
  sd = _state_dict(model_or_state_dict)
  p = 'bert.' if 'bert.embeddings.word_embeddings.weight' in sd else ''
  if f'{p}embeddings.word_embeddings.weight' not in sd:
    raise ValueError('Not a Hugging Face BERT state dict: no embeddings.word_embeddings.weight '
                     f'(keys start {sorted(sd)[:3]}).')
  rows = sd[f'{p}embeddings.word_embeddings.weight'].shape[0]
  if rows != config.vocab_size:
    raise ValueError(f'The checkpoint has {rows} word embeddings but BertConfig.vocab_size is '
                     f'{config.vocab_size}; build the config with bert_config_from_hf.')
  heads = (config.num_heads, config.head_dim)
  encoder: Params = {'embeddings': {
      'word_embeddings': {'embedding': sd[f'{p}embeddings.word_embeddings.weight']},
      'position_embeddings': {'embedding': sd[f'{p}embeddings.position_embeddings.weight']},
      'token_type_embeddings': {'embedding': sd[f'{p}embeddings.token_type_embeddings.weight']},
      'layer_norm': _norm(sd, f'{p}embeddings.LayerNorm')}}
  for i in range(config.num_layers):
    hf = f'{p}encoder.layer.{i}'
    encoder[f'layers_{i}'] = {
        'attention': {
            **{n: _dense(sd, f'{hf}.attention.self.{n}', out_shape=heads)
               for n in ('query', 'key', 'value')},
            'out': _dense(sd, f'{hf}.attention.output.dense', in_shape=heads)},
        'attention_layer_norm': _norm(sd, f'{hf}.attention.output.LayerNorm'),
        'mlp': {'wi': _dense(sd, f'{hf}.intermediate.dense'),
                'wo': _dense(sd, f'{hf}.output.dense')},
        'mlp_layer_norm': _norm(sd, f'{hf}.output.LayerNorm')}
  params: Params = {'encoder': encoder}
  if 'cls.predictions.bias' in sd:
    params['mlm_head'] = {'transform': _dense(sd, 'cls.predictions.transform.dense'),
                          'layer_norm': _norm(sd, 'cls.predictions.transform.LayerNorm'),
                          'output_bias': sd['cls.predictions.bias']}
  if f'{p}pooler.dense.weight' in sd:
    params['pooler'] = {'dense': _dense(sd, f'{p}pooler.dense')}
  return params
