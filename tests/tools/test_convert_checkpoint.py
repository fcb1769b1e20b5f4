"""tools/convert_checkpoint.py: Hugging Face <-> t2t checkpoints, offline, on small random T5s.

Hugging Face models are built from configs (nothing is downloaded) and saved with save_pretrained,
then converted as a user would convert the published T5 weights.
"""
import json
import os
import subprocess
import sys

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

from t2t import config as t2t_config  # noqa: E402
from t2t.models import transformer  # noqa: E402
from t2t.training import checkpoints  # noqa: E402
from tools import convert_checkpoint as convert  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = 8192  # the local BBC vocabulary's embedding count, so the imported model can really train
VARIANTS = {
    'v1_0': dict(feed_forward_proj='relu', tie_word_embeddings=True),
    'v1_1': dict(feed_forward_proj='gated-gelu', tie_word_embeddings=False),
}


def _save_hf_t5(variant: str, directory: str):
  """A small random HF T5 (2+3 layers, 3 heads x 6 = 18 != d_model 16) saved to `directory`."""
  torch.manual_seed(0)
  config = transformers.T5Config(
      vocab_size=VOCAB, d_model=16, d_kv=6, d_ff=24, num_layers=2, num_decoder_layers=3, num_heads=3,
      relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **VARIANTS[variant])
  model = transformers.T5ForConditionalGeneration(config).eval()
  if not VARIANTS[variant]['tie_word_embeddings']:
    # Recent transformers tie lm_head on construction; v1.1 checkpoints carry their own head.
    model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 16) * 0.25)
    getattr(model, 'all_tied_weights_keys', {}).pop('lm_head.weight', None)
  model.save_pretrained(directory)
  if not VARIANTS[variant]['tie_word_embeddings']:  # as the published v1.1 config.json says
    path = os.path.join(directory, 'config.json')
    raw = json.load(open(path))
    json.dump(dict(raw, tie_word_embeddings=False), open(path, 'w'))
  return model


def _batch():
  enc = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 8000,
                   25, 26], [10, 11, 12, 13] + [0] * 18], np.int64)
  dec = np.array([[0, 12, 13, 14, 4000, 16, 1, 0], [0, 15, 1, 0, 0, 0, 0, 0]], np.int64)
  return enc, dec


def _build_model(gin_file: str, bindings=()):
  gin.clear_config()
  t2t_config.parse_gin([gin_file], list(bindings))
  return gin.query_parameter('%MODEL').scoped_configurable_fn()


def _load(model_dir: str, model):
  """Parameters as a fine-tuning run loads INITIAL_CHECKPOINT_PATH (trainer's abstract params)."""
  shapes = {'encoder_input_tokens': (2, 8), 'decoder_input_tokens': (2, 8)}
  abstract = nn.unbox(jax.eval_shape(
      lambda: model.get_initial_variables(jax.random.PRNGKey(0), shapes))['params'])
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return checkpoints.load_params(model_dir, abstract, jax.tree.map(lambda _: device, abstract))


def _load_plain(model_dir: str, config):
  """The per-layer parameters of a Transformer with `config` from `model_dir`."""
  abstract = convert.params_abstract(config)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return checkpoints.load_params(model_dir, abstract, jax.tree.map(lambda _: device, abstract))[0]


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config()


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_import_gives_hf_logits_and_a_trainable_checkpoint(tmp_path, variant):
  hf = _save_hf_t5(variant, str(tmp_path / 'hf'))
  config = convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 't2t'))
  assert config.feed_forward_proj == VARIANTS[variant]['feed_forward_proj']
  assert config.tie_word_embeddings == VARIANTS[variant]['tie_word_embeddings']
  assert (config.num_encoder_layers, config.num_decoder_layers, config.d_kv) == (2, 3, 6)

  # The written model.gin (family base + printed bindings) builds the imported model; with the
  # local vocabulary it is a real model a fine-tuning run can start from.
  model = _build_model(str(tmp_path / 't2t' / convert.MODEL_GIN),
                       ['VOCABULARY = @t2t.data.vocabularies.bbc_vocabulary()', 'DROPOUT_RATE = 0.0'])
  built = model.module.config
  for field in convert._SHAPE_FIELDS + ('vocab_size',):
    assert getattr(built, field) == getattr(config, field), field
  params, step = _load(str(tmp_path / 't2t'), model)
  assert step == 0

  enc, dec = _batch()
  with torch.no_grad():
    expected = hf(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                  decoder_input_ids=torch.tensor(dec)).logits.numpy()
  got = model.module.apply({'params': params}, jnp.asarray(enc, jnp.int32),
                           jnp.asarray(dec, jnp.int32), enable_dropout=False)
  np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4, rtol=1e-4)
  # And a gradient step runs on it (the loss is finite and the gradient reaches every parameter).
  batch = {'encoder_input_tokens': jnp.asarray(enc[:, :8], jnp.int32),
           'decoder_input_tokens': jnp.asarray(dec, jnp.int32),
           'decoder_target_tokens': jnp.asarray(np.roll(dec, -1, axis=1), jnp.int32),
           'decoder_loss_weights': jnp.asarray(np.roll(dec, -1, axis=1) > 0, jnp.float32)}
  (loss, _), grads = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(params, batch, None)
  assert np.isfinite(float(loss))
  assert all(float(jnp.abs(g).sum()) > 0 for g in jax.tree.leaves(grads))


@pytest.mark.parametrize('variant', sorted(VARIANTS))
def test_export_then_import_round_trips_exactly(tmp_path, variant):
  hf = _save_hf_t5(variant, str(tmp_path / 'hf'))
  convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 'a'))
  gin_file = str(tmp_path / 'a' / convert.MODEL_GIN)
  config = convert.export_hf([gin_file], str(tmp_path / 'a' / 'checkpoint_0'), str(tmp_path / 'hf2'))
  assert json.load(open(tmp_path / 'hf2' / 'config.json'))['tie_word_embeddings'] == \
      config.tie_word_embeddings

  # The exported directory holds the original weights, bit for bit, and loads in transformers.
  exported = convert.load_hf_state_dict(str(tmp_path / 'hf2'))
  for key, value in hf.state_dict().items():
    if key in exported:
      np.testing.assert_array_equal(exported[key].numpy(), value.numpy(), err_msg=key)
  assert 'lm_head.weight' in exported or config.tie_word_embeddings
  reloaded = transformers.T5ForConditionalGeneration.from_pretrained(str(tmp_path / 'hf2')).eval()
  enc, dec = _batch()
  kwargs = dict(input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0),
                decoder_input_ids=torch.tensor(dec))
  with torch.no_grad():
    np.testing.assert_array_equal(reloaded(**kwargs).logits.numpy(), hf(**kwargs).logits.numpy())

  # A run configured with scan_layers (stacked layer params) exports the same weights.
  if variant == 'v1_0':
    scanned_dir = str(tmp_path / 'scanned')
    ckpt = checkpoints.Checkpointer(scanned_dir)
    a = _load_plain(str(tmp_path / 'a'), config)
    stacked = dict(a, **{s: transformer.stack_layer_params(a[s], n) for s, n in
                         (('encoder', config.num_encoder_layers), ('decoder', config.num_decoder_layers))})
    ckpt.save(0, stacked, opt_state={}, meta={})
    ckpt.close()
    convert.export_hf([gin_file], scanned_dir, str(tmp_path / 'hf3'), ['T5Config.scan_layers = True'])
    again = convert.load_hf_state_dict(str(tmp_path / 'hf3'))
    assert set(again) == set(exported)
    for key, value in exported.items():
      np.testing.assert_array_equal(again[key].numpy(), value.numpy(), err_msg=key)

  # Importing the export again gives the same t2t parameters.
  convert.import_hf(str(tmp_path / 'hf2'), str(tmp_path / 'b'))
  a, b = _load_plain(str(tmp_path / 'a'), config), _load_plain(str(tmp_path / 'b'), config)
  flat_a, flat_b = jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves_with_path(b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b]
  for (path, x), (_, y) in zip(flat_a, flat_b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('other', ['bert', 'gpt2'])
def test_import_refuses_other_architectures(tmp_path, other):
  hf_config = (transformers.BertConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2,
                                       intermediate_size=8) if other == 'bert'
               else transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2))
  hf_config.save_pretrained(str(tmp_path / other))
  with pytest.raises(ValueError, match=f"model_type='{other}'.*not T5"):
    convert.import_hf(str(tmp_path / other), str(tmp_path / 'out'))
  assert not (tmp_path / 'out').exists()
  with pytest.raises(FileNotFoundError, match='config.json'):
    convert.import_hf(str(tmp_path / 'nothing'), str(tmp_path / 'out'))


def test_import_refuses_to_overwrite_and_missing_weights(tmp_path):
  _save_hf_t5('v1_0', str(tmp_path / 'hf'))
  convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 't2t'))
  with pytest.raises(ValueError, match='already holds checkpoints'):
    convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 't2t'))
  os.remove(tmp_path / 'hf' / 'model.safetensors')
  with pytest.raises(FileNotFoundError, match='No weights'):
    convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 'other'))


def test_export_refuses_an_output_that_holds_a_model(tmp_path):
  """Before: exporting into the run's own MODEL_DIR put config.json and model.safetensors beside
  its checkpoints, and into an earlier export replaced that model's files."""
  _save_hf_t5('v1_0', str(tmp_path / 'hf'))
  convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 't2t'))
  before = sorted(os.listdir(tmp_path / 'hf'))
  with pytest.raises(ValueError, match=r"'.*hf' already holds a model \(config.json, "
                                       r"generation_config.json, model.safetensors\)"):
    convert.check_export_output(str(tmp_path / 'hf'))
  assert sorted(os.listdir(tmp_path / 'hf')) == before
  with pytest.raises(ValueError, match='is a t2t model directory'):
    convert.check_export_output(str(tmp_path / 't2t'))
  (tmp_path / 'file').write_text('x')
  with pytest.raises(ValueError, match="'.*file' is a file"):
    convert.check_export_output(str(tmp_path / 'file'))
  (tmp_path / 'empty').mkdir()
  convert.check_export_output(str(tmp_path / 'empty'))   # an empty or new directory is fine
  convert.check_export_output(str(tmp_path / 'new'))


def test_export_refuses_a_checkpoint_of_another_shape(tmp_path):
  _save_hf_t5('v1_0', str(tmp_path / 'hf'))
  convert.import_hf(str(tmp_path / 'hf'), str(tmp_path / 't2t'))
  # models/t5_1_0/tiny.gin is v1.0 too, but 4+4 layers of width 256: d_model differs first.
  with pytest.raises(checkpoints.CheckpointMismatchError,
                     match=r"parameter 'decoder/decoder_norm/scale' has shape \(16,\) in the "
                           r"checkpoint but \(256,\) in the model\. Give the model gin file\(s\) "
                           r"and bindings the checkpoint was trained with\.$"):
    convert.export_hf(['models/t5_1_0/tiny.gin'], str(tmp_path / 't2t'), str(tmp_path / 'hf2'))
  assert not (tmp_path / 'hf2').exists()
  no_model = tmp_path / 'no_model.gin'
  no_model.write_text('import t2t.models.api\nT5Config.d_model = 16\n')
  with pytest.raises(ValueError, match='define no MODEL'):
    convert.export_hf([str(no_model)], str(tmp_path / 't2t'), str(tmp_path / 'hf2'))


def test_command_line(tmp_path, capsys):
  _save_hf_t5('v1_1', str(tmp_path / 'hf'))
  run = lambda *args: subprocess.run([sys.executable, '-m', 'tools.convert_checkpoint', *args],
                                     cwd=REPO, capture_output=True, text=True, timeout=300)
  out = run('import', f'--hf_dir={tmp_path / "hf"}', f'--output={tmp_path / "t2t"}')
  assert out.returncode == 0, out.stderr
  assert "T5Config.feed_forward_proj = 'gated-gelu'" in out.stdout
  assert 'T5Config.tie_word_embeddings = False' in out.stdout
  assert f'--gin.INITIAL_CHECKPOINT_PATH={tmp_path / "t2t"}' in out.stdout
  assert (tmp_path / 't2t' / 'checkpoint_0').is_dir()
  # Bad input (in-process, same `main`): one readable line and status 1, no traceback.
  capsys.readouterr()  # drop what the setup printed
  status = convert.main(['import', f'--hf_dir={tmp_path / "hf"}', f'--output={tmp_path / "t2t"}'])
  err = capsys.readouterr().err
  assert status == 1 and err.startswith('error:') and 'already holds checkpoints' in err
  assert len(err.strip().splitlines()) == 1


def test_import_names_a_truncated_config_json(tmp_path, capsys):
  # Before: "error: Expecting value: line 2 column 1 (char 2)", no file named.
  (tmp_path / 'hf').mkdir()
  path = tmp_path / 'hf' / 'config.json'
  path.write_text('{\n')
  status = convert.main(['import', f'--hf_dir={tmp_path / "hf"}', f'--output={tmp_path / "t2t"}'])
  err = capsys.readouterr().err
  assert status == 1
  assert err == (f'error: {path} is not valid JSON (Expecting property name enclosed in double '
                 'quotes: line 2 column 1): a truncated copy? Copy the Hugging Face directory '
                 'again (config.json and weights as save_pretrained wrote them).\n'), err
  assert not (tmp_path / 't2t').exists()
  index = tmp_path / 'hf' / 'model.safetensors.index.json'
  index.write_text('{"metadata": {}}')
  with pytest.raises(ValueError, match=f"{index} is not a JSON object with 'weight_map'"):
    convert.load_hf_state_dict(str(tmp_path / 'hf'))
