"""ClassifierModel and its feature converter on small in-memory seqio tasks, and one end-to-end
run through `python -m t2t.train` / `python -m t2t.eval` on the offline BBC topic task."""
import functools
import json
import os
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf

from t2t.data import mlm, postprocessors, vocabularies
from t2t.models import bilstm, classifier_api, classifier_data as data, heads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB = vocabularies.bbc_vocabulary()
LABELS = ('equivalent', 'different')
PAIRS = [('mrpc sentence1: The market fell. sentence2: Shares dropped.', 'equivalent'),
         ('mrpc sentence1: He won the match. sentence2: The film opened.', 'different'),
         ('mrpc sentence1: Prices rose today. sentence2: Prices went up.', 'equivalent')]
SINGLES = [('cola sentence: The market fell.', 'acceptable'),
           ('cola sentence: Market the fell.', 'unacceptable')]
SCORES = [('stsb sentence1: A cat sat. sentence2: A cat sat down.', '4.6'),
          ('stsb sentence1: Rain today. sentence2: Stocks fell.', '0.2')]


def _register(name, examples, postprocess_fn=None):
  def source_fn(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    inputs, targets = zip(*examples)
    return tf.data.Dataset.from_tensor_slices({'inputs': list(inputs), 'targets': list(targets)})
  features = {k: seqio.Feature(VOCAB, add_eos=True) for k in ('inputs', 'targets')}
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
      name, source=seqio.FunctionDataSource(source_fn, splits=('train', 'validation')),
      preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
      output_features=features, postprocess_fn=postprocess_fn, metric_fns=[])
  return name


@pytest.fixture(scope='module', autouse=True)
def toy_tasks():
  _register('toy_pairs', PAIRS,
            functools.partial(postprocessors.classification, labels=LABELS))
  _register('toy_singles', SINGLES)
  _register('toy_scores', SCORES)
  _register('toy_unknown', PAIRS + [('mrpc sentence1: a. sentence2: b.', 'maybe')],
            functools.partial(postprocessors.classification, labels=LABELS))
  yield
  for name in ('toy_pairs', 'toy_singles', 'toy_scores', 'toy_unknown'):
    seqio.TaskRegistry.remove(name)


def _model(task, **kwargs):
  encoder = bilstm.BiLSTMEncoder(bilstm.BiLSTMConfig(vocab_size=VOCAB.vocab_size, embed_dim=8,
                                                     hidden_dim=8, dropout_rate=0.0))
  head = functools.partial(heads.ClassifierHead, hidden_dim=8, dropout_rate=0.0)
  return classifier_api.ClassifierModel(encoder, VOCAB, mixture_or_task_name=task, head=head,
                                        **kwargs)


def _features(model, task, split='validation', repeat=False, length=24):
  lengths = {'inputs': length, 'targets': 8}
  converter = model.feature_converter_cls(pack=True)
  if repeat:  # as t2t.training.inputs.train_batches reads a training stream
    ds = seqio.get_dataset(task, lengths, feature_converter=converter, dataset_split=split,
                           shuffle=False, num_epochs=None, verbose=False)
  else:
    ds = converter(seqio.get_mixture_or_task(task).get_dataset(lengths, split=split, shuffle=False),
                   lengths)
  return [ex for ex in ds.take(len(PAIRS) + 1).as_numpy_iterator()]


def _init(model, shape):
  """Unboxed initial parameters (jitted: eager Flax is slow on a busy CPU)."""
  init = jax.jit(lambda rng: model.get_initial_variables(rng, {'encoder_input_tokens': shape}))
  return nn.unbox(init(jax.random.PRNGKey(0))['params'])


def _batch(examples):
  return {k: np.stack([ex[k] for ex in examples]) for k in examples[0]}


def test_split_pair_in_python_and_tf_agree():
  markers = data.DEFAULT_PAIR_MARKERS
  cases = {'mrpc sentence1: A b. sentence2: C d.': ('mrpc sentence1: A b.', 'C d.'),
           'mnli hypothesis: H. premise: P.': ('mnli hypothesis: H.', 'P.'),
           'qnli question: Q? sentence: S.': ('qnli question: Q?', 'S.'),
           'cola sentence: Not a pair.': None, 'bbc topic: The sentence was long: 3 years.': None}
  for text, expected in cases.items():
    assert data.split_pair(text, markers) == expected
    a, b, found = data.split_pair_tf(tf.constant(text), markers)
    assert bool(found) == (expected is not None)
    if expected:
      assert (a.numpy().decode(), b.numpy().decode()) == expected


def test_labels_from_postprocessor_and_from_train_targets():
  assert _model('toy_pairs', encoding='separate').labels == LABELS
  assert _model('toy_singles').labels == ('acceptable', 'unacceptable')  # sorted scan
  assert _model('toy_singles', labels=['unacceptable', 'acceptable']).labels == (
      'unacceptable', 'acceptable')
  with pytest.raises(ValueError, match='mixture_or_task_name'):
    _model(None).labels


def test_label_round_trip_through_converter_and_predict_batch():
  model = _model('toy_pairs', encoding='separate')
  examples = _features(model, 'toy_pairs')[:3]
  batch = _batch(examples)
  assert batch[data.LABEL_FEATURE].tolist() == [[0], [1], [0]]
  assert batch['encoder_input_tokens'].shape == batch['encoder_pair_tokens'].shape == (3, 24)
  assert VOCAB.decode(batch['encoder_pair_tokens'][0].tolist()) == 'Shares dropped.'
  params = _init(model, (3, 24))
  assert set(params) == {'embedder', 'encoder', 'head'}
  # Force the prediction through the output layer: logits (-50, 50), label 1, everywhere.
  output = params['head']['mlp']['output']
  output['kernel'] = np.zeros_like(output['kernel'])
  output['bias'] = np.array([-50., 50.], np.float32)
  tokens = np.asarray(jax.jit(model.predict_batch)(params, batch))
  assert tokens.dtype == np.int32 and tokens.shape == (3, model.output_table.shape[1])
  assert [VOCAB.decode(t.tolist()) for t in tokens] == ['different'] * 3
  assert all(t[list(t).index(1) + 1:].sum() == 0 for t in tokens)  # EOS, then zeros
  with pytest.raises(data.ClassifierDataError, match="'not_equivalent' does not survive"):
    data.label_token_table(['not_equivalent'], VOCAB)  # no '_' in the BBC vocabulary
  loss, metrics = jax.jit(model.loss_fn)(params, batch, jax.random.PRNGKey(1))
  assert metrics['num_tokens'] == 3 and abs(float(metrics['accuracy']) - 1 / 3) < 1e-6
  scores = jax.jit(model.score_batch)(params, batch)
  np.testing.assert_allclose(scores, [-100., 0., -100.], atol=1e-3)
  assert float(loss) > 60


def test_unknown_training_target_is_an_error_naming_task_and_string():
  model = _model('toy_unknown', encoding='separate')
  with pytest.raises(tf.errors.InvalidArgumentError, match="toy_unknown.*maybe"):
    _features(model, 'toy_unknown', split='train', repeat=True)
  # In evaluation (one epoch) it is label -1: no loss weight, a wrong prediction.
  labels = [ex[data.LABEL_FEATURE][0] for ex in _features(model, 'toy_unknown')]
  assert labels == [0, 1, 0, -1]


def test_pair_task_for_single_model_and_single_task_for_pair_model_are_errors():
  with pytest.raises(data.ClassifierDataError, match="'toy_pairs'.*pair.*'single'"):
    _model('toy_pairs').feature_converter_cls(pack=True)
  with pytest.raises(data.ClassifierDataError, match="'toy_singles'.*single-sentence"):
    _model('toy_singles', encoding='separate').feature_converter_cls()
  _model('toy_singles', encoding='joint').feature_converter_cls()  # [CLS] A [SEP] is fine


def test_joint_encoding_layout_and_special_ids():
  model = _model('toy_pairs', encoding='joint')
  cls, sep = VOCAB.vocab_size - 2, VOCAB.vocab_size - 3  # BERT's: <extra_id_1>, <extra_id_2>
  assert (model.cls_id, model.sep_id) == (cls, sep) == (mlm.bert_special_ids(VOCAB).cls,
                                                          mlm.bert_special_ids(VOCAB).sep)
  assert [VOCAB.decode([i]) for i in (model.cls_id, model.sep_id)] == ['<extra_id_1>', '<extra_id_2>']
  ex = _features(model, 'toy_pairs')[0]
  a = VOCAB.encode('mrpc sentence1: The market fell.')
  b = VOCAB.encode('Shares dropped.')
  n = 3 + len(a) + len(b)
  assert ex['encoder_input_tokens'][:n].tolist() == [cls, *a, sep, *b, sep]
  assert ex['encoder_token_types'][:n].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  assert not ex['encoder_input_tokens'][n:].any()
  # Truncation keeps both sentences and the three special tokens.
  short = model.feature_converter_cls()._joint(tf.constant(a), tf.constant(b), 8)
  assert short[0].numpy()[0] == cls and list(short[0].numpy()).count(sep) == 2


def test_regression_parses_targets_and_rounds_predictions_to_the_grid():
  model = _model('toy_scores', encoding='separate', regression=True)
  batch = _batch(_features(model, 'toy_scores')[:2])
  np.testing.assert_allclose(batch[data.REGRESSION_FEATURE], [[4.6], [0.2]], rtol=1e-6)
  values, strings = data.regression_grid(0.0, 5.0, 0.2)
  assert len(values) == 26 and strings[:3] == ['0.0', '0.2', '0.4'] and strings[-1] == '5.0'
  index = model._grid_index(np.array([3.25, 2.57, 7.0, -1.0, 3.29], np.float32))
  assert [strings[i] for i in index] == ['3.2', '2.6', '5.0', '0.0', '3.2']
  params = _init(model, (2, 24))
  output = params['head']['mlp']['output']
  output['kernel'] = np.zeros_like(output['kernel'])
  output['bias'] = np.array([2.57], np.float32)
  tokens = jax.jit(model.predict_batch)(params, batch)
  assert [VOCAB.decode(t.tolist()) for t in np.asarray(tokens)] == ['2.6', '2.6']
  loss, _ = jax.jit(lambda p, b: model.loss_fn(p, b, None))(params, batch)
  np.testing.assert_allclose(loss, ((4.6 - 2.57) ** 2 + (0.2 - 2.57) ** 2) / 2, rtol=1e-5)
  np.testing.assert_allclose(jax.jit(model.score_batch)(params, batch), [-(4.6 - 2.57) ** 2,
                                                                -(0.2 - 2.57) ** 2], rtol=1e-5)


def test_scalar_mix_lives_under_its_own_scope():
  from t2t.models import t5_encoder
  from tests.models.helpers import tiny_config
  model = classifier_api.ClassifierModel(
      t5_encoder.T5EncoderStates(tiny_config(vocab_size=VOCAB.vocab_size, num_encoder_layers=1)),
      VOCAB,
      labels=LABELS, scalar_mix=True,
      head=functools.partial(heads.ClassifierHead, pooling='mean', hidden_dim=4))
  params = _init(model, (2, 5))
  assert set(params) == {'token_embedder', 'encoder', 'head', 'scalar_mix'}
  assert params['scalar_mix']['weights'].shape == (2,)  # embeddings + 1 layer
  batch = {'encoder_input_tokens': np.array([[5, 6, 1, 0, 0], [7, 1, 0, 0, 0]], np.int32),
           data.LABEL_FEATURE: np.array([[0], [1]], np.int32)}
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0]))(params)
  assert float(np.abs(grads['scalar_mix']['weights']).sum()) > 0


# ---------------------------------------------------------------- end to end through the CLI
def _t2t(entry, *args):
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}
  out = subprocess.run([sys.executable, '-m', f't2t.{entry}', *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, f'{entry} failed:\n{out.stderr[-4000:]}'
  return out


@pytest.fixture(scope='module')
def bilstm_bbc_run(tmp_path_factory):
  """Train a tiny BiLSTM classifier on bbc_topic for 3 steps, then evaluate it on 8 examples."""
  root = tmp_path_factory.mktemp('bilstm_bbc')
  common = ['--gin_file=models/bilstm/tiny.gin', '--gin.MIXTURE_OR_TASK_NAME="bbc_topic"',
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 4}"]
  _t2t('train', *common, '--gin_file=runs/pretrain.gin', f'--gin.MODEL_DIR="{root / "model"}"',
       '--gin.TRAIN_STEPS=3', '--gin.BATCH_SIZE=4', '--gin.CHECKPOINT_EVERY=3')
  _t2t('eval', *common, '--gin_file=runs/eval.gin', f'--gin.CHECKPOINT_PATH="{root / "model"}"',
       f'--gin.EVAL_OUTPUT_DIR="{root / "eval"}"', '--gin.EVAL_NUM_EXAMPLES=8',
       '--gin.EVAL_BATCH_SIZE=4')
  return root


def test_cli_train_then_eval_reports_the_tasks_metrics(bilstm_bbc_run):
  report = json.load(open(bilstm_bbc_run / 'eval' / 'metrics.json'))
  assert report['step'] == 3
  metrics = report['metrics']['bbc_topic']
  assert 0 <= metrics['accuracy'] <= 100 and 0 <= metrics['macro_f1'] <= 100
  rows = [json.loads(line) for line in
          open(bilstm_bbc_run / 'eval' / 'bbc_topic.validation.predictions.jsonl')]
  assert len(rows) == 8
  labels = {'business', 'entertainment', 'politics', 'sports', 'tech'}
  assert all(r['prediction'] in labels for r in rows)
  config = open(bilstm_bbc_run / 'model' / 'config.gin').read()
  assert 'ClassifierModel.encoder = @BiLSTMEncoder()' in config
