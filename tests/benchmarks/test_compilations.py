"""No recompilation after the first step: training on a mixture whose tasks have different lengths
compiles the train step once; evaluation compiles once per length bucket and never again."""
import itertools

import flax.linen as nn
import jax
import numpy as np
import seqio

from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config, Transformer
from t2t.training import inputs, optim
from t2t.training.partitioning import Partitioner
from t2t.training.predictor import Predictor
from t2t.training.trainer import Trainer
from tests.support import eval_tasks

LENGTHS = {'inputs': 64, 'targets': 16}


def _model():
  vocab = eval_tasks.VOCABULARY
  config = T5Config(vocab_size=vocab.vocab_size, d_model=16, num_heads=2, d_kv=8, d_ff=32,
                    num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.1)
  return EncoderDecoderModel(Transformer(config), vocab, vocab)


def test_train_and_eval_compile_once_per_shape():
  model = _model()
  packed = seqio.EncDecFeatureConverter(pack=True)
  batches = inputs.train_batches(eval_tasks.MIXTURE_NAME, LENGTHS, packed, batch_size=2, seed=0)
  shapes = {k: (2, v) for k, v in packed.get_model_feature_lengths(LENGTHS).items()}
  trainer = Trainer(model, optim.adafactor(learning_rate=0.01), Partitioner(), shapes)
  state = trainer.init_state()
  for batch in itertools.islice(batches, 4):
    state, _ = trainer.step(state, batch)
  assert trainer._gradient_step._cache_size() == trainer._update_step._cache_size() == 1

  unpacked = seqio.EncDecFeatureConverter(pack=False)
  examples = []
  for task in ('bbc_headline', eval_tasks.TASK_NAME):  # headlines and 1-4 piece phrases
    ds = seqio.get_mixture_or_task(task).get_dataset(LENGTHS, split='validation', shuffle=False)
    examples += list(unpacked(ds.take(5), LENGTHS).as_numpy_iterator())
  # BBC articles fill all 64 input tokens: shorten some, as a mixture of short and long inputs.
  for ex, n in zip(examples, itertools.cycle((5, 12, 30, 64, 40))):
    ex['encoder_input_tokens'] = ex['encoder_input_tokens'].copy()
    ex['encoder_input_tokens'][n:] = 0
  predictor = Predictor(model, nn.unbox(state.params), Partitioner(), batch_size=4,
                        max_decode_length=LENGTHS['targets'])
  first = predictor.predict(examples)
  compiled = predictor._predict._cache_size()
  assert 1 <= compiled <= 3  # buckets 16, 32, 64
  again = predictor.predict(examples[::-1])
  predictor.score(examples)
  assert predictor._predict._cache_size() == compiled
  np.testing.assert_array_equal(np.stack(first), np.stack(again[::-1]))
