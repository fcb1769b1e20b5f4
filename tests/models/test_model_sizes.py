"""Every model gin file builds the T5 it names, with the published parameter count.

Counts come from `jax.eval_shape` on the gin-built model's `get_initial_variables` (nothing is
allocated, so 11B is counted on a laptop) and are checked twice: against the figure published for
the size, and exactly against Hugging Face's `T5ForConditionalGeneration` built from the same
config on torch's meta device (again allocating nothing).

Full sizes reference the public T5 vocabulary on gs://; parsing and building them must not read it
(`test_full_size_gin_does_not_read_the_vocabulary`). Counting needs no vocabulary, so it is unbound
there (`VOCABULARY = None`): `get_initial_variables` would otherwise check the vocabulary's size.

`python -m tests.models.test_model_sizes` prints the table in docs/MODELS.md.
"""
from __future__ import annotations

if __name__ == '__main__':  # the table alone: quiet before TensorFlow is imported (t2t.logs)
  from t2t import logs
  logs.quiet()

import math
import pathlib

import flax.linen as nn
import gin
import jax
import pytest

import t2t.config  # noqa: F401  (hides gin's 'Path not found' log of each search-path miss)
import t2t.data.vocabularies  # noqa: F401  (registers gin configurables used by the gin files)
from t2t.models import hf_interop
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import T5Config

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / 'gin'
T5_VOCAB_SIZE = 32128

# (gin file, bindings, published parameters, relative tolerance, where the figure comes from)
PUBLISHED = [
    # t5_1_0/small.gin uses the local 8k BBC vocabulary; the paper's figure is for the 32k one.
    ('t5_1_0/small', ['NUM_EMBEDDINGS = 32128'], 60e6, 0.02, 'T5 paper: ~60M'),
    ('t5_1_0/base', [], 220e6, 0.02, 'T5 paper: ~220M'),
    # The paper rounds Large to "~770M"; the released T5-Large (and this config) has 737.7M.
    ('t5_1_0/large', [], 770e6, 0.05, 'T5 paper: ~770M (released checkpoint: 737.7M)'),
    ('t5_1_0/3B', [], 2.8e9, 0.02, 'T5 paper: ~2.8B'),
    # "~11B" is a round number; the released T5-11B has 11.31B.
    ('t5_1_0/11B', [], 11e9, 0.03, 'T5 paper: ~11B (released checkpoint: 11.3B)'),
    ('t5_1_1/small', [], 77e6, 0.02, 'T5 v1.1 release: 77M'),
    ('t5_1_1/base', [], 248e6, 0.02, 'T5 v1.1 release: 248M'),
    ('t5_1_1/large', [], 783e6, 0.02, 'T5 v1.1 release: 783M'),
    ('t5_1_1/xl', [], 2.85e9, 0.02, 'T5 v1.1 release: 2.85B'),
    ('t5_1_1/xxl', [], 11.1e9, 0.02, 'T5 v1.1 release: 11.1B'),
]
# Local-vocabulary sizes for tests and the demo: the arithmetic in each file's header.
LOCAL = [('t5_1_0/tiny', 9.44e6), ('t5_1_0/small', 48.2e6), ('t5_1_1/tiny', 11.3e6)]
ALL_GIN_FILES = sorted(str(p.relative_to(GIN_DIR / 'models'))[:-len('.gin')]
                       for p in (GIN_DIR / 'models').glob('t5_1_[01]/*.gin'))


def build_model(name: str, bindings: tuple[str, ...] | list[str] = ()) -> EncoderDecoderModel:
  """Parses gin/models/<name>.gin (+ bindings) and returns its MODEL. Leaves gin configured."""
  gin.clear_config()
  gin.add_config_file_search_path(str(GIN_DIR))
  gin.parse_config_files_and_bindings([str(GIN_DIR / 'models' / f'{name}.gin')], list(bindings))
  return gin.query_parameter('%MODEL').scoped_configurable_fn()


def count_params(model: EncoderDecoderModel) -> int:
  """Parameters of `model`, from shapes alone (`jax.eval_shape`; nothing is allocated)."""
  shapes = {'encoder_input_tokens': (1, 1), 'decoder_input_tokens': (1, 1)}
  abstract = jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0), shapes))
  return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(nn.unbox(abstract['params'])))


def hf_param_count(config: T5Config) -> int:
  """Parameters of the Hugging Face T5 with this config, built on torch's meta device."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  with torch.device('meta'):
    model = transformers.T5ForConditionalGeneration(hf_interop.hf_config_from_t5(config))
  count = sum(p.numel() for p in model.parameters())  # shared tensors are counted once
  if not config.tie_word_embeddings and model.lm_head.weight is model.shared.weight:
    # Recent transformers tie lm_head on construction; the v1.1 checkpoints carry their own head.
    count += model.lm_head.weight.numel()
  return count


@pytest.fixture(autouse=True)
def _clean_gin():
  yield
  gin.clear_config()


def test_every_model_gin_file_is_covered():
  published = {name for name, *_ in PUBLISHED} | {name for name, _ in LOCAL}
  assert set(ALL_GIN_FILES) == published, 'a gin file without a size check (or a check without a file)'


@pytest.mark.parametrize('name,bindings,published,tolerance,source', PUBLISHED,
                         ids=[p[0] for p in PUBLISHED])
def test_published_sizes(name, bindings, published, tolerance, source):
  model = build_model(name, [*bindings, 'VOCABULARY = None'])
  config = model.module.config
  assert config.vocab_size == T5_VOCAB_SIZE
  v1_1 = name.startswith('t5_1_1/')
  assert config.feed_forward_proj == ('gated-gelu' if v1_1 else 'relu')
  assert config.tie_word_embeddings is (not v1_1)
  assert config.dropout_rate == (0.0 if v1_1 else 0.1)  # v1.1 pre-trains without dropout
  count = count_params(model)
  assert abs(count - published) / published < tolerance, f'{name}: {count:,} vs {source}'
  pytest.importorskip('transformers')
  assert count == hf_param_count(config), name


@pytest.mark.parametrize('name,expected', LOCAL, ids=[n for n, _ in LOCAL])
def test_local_vocabulary_sizes(name, expected):
  model = build_model(name)  # the real BBC vocabulary: its 8,100 ids must fit the 8,192 embeddings
  assert model.output_vocabulary.vocab_size == 8100 <= model.module.config.vocab_size == 8192
  count = count_params(model)
  assert abs(count - expected) / expected < 0.01, f'{name}: {count:,}'
  pytest.importorskip('transformers')
  assert count == hf_param_count(model.module.config)


def test_full_size_gin_does_not_read_the_vocabulary(monkeypatch):
  import seqio  # pylint: disable=g-import-not-at-top
  loaded = []

  def refuse_to_load(path, *args, **kwargs):
    loaded.append(path)
    raise AssertionError(f'the vocabulary at {path} was read')

  # seqio reads a SentencePiece model in one place, on first use of the vocabulary.
  monkeypatch.setattr(seqio.vocabularies, '_load_model', refuse_to_load)
  model = build_model('t5_1_1/xxl')
  assert model.module.config.d_model == 4096
  assert isinstance(model.input_vocabulary, seqio.SentencePieceVocabulary)
  assert loaded == []
  # The patch is live: using the vocabulary would read gs://, and is caught.
  with pytest.raises(AssertionError, match='gs://t5-data'):
    _ = model.input_vocabulary.vocab_size
  assert loaded


def size_table() -> str:
  """The markdown table of docs/MODELS.md: gin file, shape, and counted parameters."""
  local = {n for n, _ in LOCAL}
  runs = [(n, [] if n in local else ['VOCABULARY = None']) for n in ALL_GIN_FILES]
  runs.append(('t5_1_0/small', ['NUM_EMBEDDINGS = 32128', 'VOCABULARY = None']))
  rows = []
  for name, bindings in runs:
    model = build_model(name, bindings)
    c = model.module.config
    note = ' (NUM_EMBEDDINGS=32128)' if 'NUM_EMBEDDINGS = 32128' in bindings else ''
    count = count_params(model)
    rows.append((name.split('/')[0], count,
                 f'| `models/{name}.gin`{note} | {c.d_model} | {c.d_ff} | {c.num_heads} x {c.d_kv} | '
                 f'{c.num_encoder_layers}+{c.num_decoder_layers} | {c.feed_forward_proj} | '
                 f"{c.vocab_size:,} {'tied' if c.tie_word_embeddings else 'untied'} | {count:,} |"))
  gin.clear_config()
  header = ['| gin file | d_model | d_ff | heads x d_kv | layers | FFN | embeddings | parameters |',
            '|---|---|---|---|---|---|---|---|']
  return '\n'.join(header + [row for *_, row in sorted(rows)])


if __name__ == '__main__':
  print(size_table())
