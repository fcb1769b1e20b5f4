"""What the T5-small benchmarks run, shared by every tool in benchmarks/: the model (T5 v1.0
small, or a tiny one for tests), its random inputs, the optimizer set as the peer's, the Trainer
and the decode setup, and the process settings a t2t entry point makes before its first XLA
program. `t5_small_cpu` times these against the peer; `cold_start`, `greedy_floor` and
`profile_t5_small` take them apart.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
os.environ.setdefault('TF_NUM_INTRAOP_THREADS', '1')   # seqio imports TensorFlow; keep it off the cores
os.environ.setdefault('TF_NUM_INTEROP_THREADS', '1')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from t2t.models import decoding  # noqa: E402
from t2t.models.api import EncoderDecoderModel  # noqa: E402
from t2t.models.transformer import T5Config, Transformer  # noqa: E402
from t2t.training import garbage_collection, host_memory, optim  # noqa: E402
from t2t.training.partitioning import Partitioner  # noqa: E402
from t2t.training.trainer import Trainer  # noqa: E402

VOCAB_SIZE = 32128
LENGTH_PENALTY = 0.6
# Tokens are drawn uniformly from [2, 32001) like the peer's (0 = pad, 1 = EOS excluded).
TOKEN_HIGH = 32001


# --precision: t2t's matmul operands (T5Config.matmul_dtype) and the peer's mode.
PRECISIONS = {'fp32': None, 'bf16': 'bfloat16'}


def t5_small_config(dropout_rate: float, tiny: bool = False, precision: str = 'fp32') -> T5Config:
  """T5 v1.0 small (60.5M params); `tiny` = a 1+1-layer, d_model 32 model for fast tests.

  `precision` 'bf16': bf16 matmul operands with float32 accumulation, float32 everywhere else.
  """
  if precision not in PRECISIONS:
    raise ValueError(f'--precision must be one of {sorted(PRECISIONS)}, got {precision!r}.')
  if tiny:
    return T5Config(vocab_size=128, d_model=32, num_heads=2, d_kv=16, d_ff=64, num_encoder_layers=1,
                    num_decoder_layers=1, dropout_rate=dropout_rate,
                    matmul_dtype=PRECISIONS[precision])
  return T5Config(vocab_size=VOCAB_SIZE, d_model=512, num_heads=8, d_kv=64, d_ff=2048,
                  num_encoder_layers=6, num_decoder_layers=6, dropout_rate=dropout_rate,
                  feed_forward_proj='relu', tie_word_embeddings=True,
                  matmul_dtype=PRECISIONS[precision])


def adafactor_like_peer(learning_rate: float = 1e-3) -> optax.GradientTransformation:
  """t2t's AdaFactor set as the peer's HF `Adafactor(lr=1e-3, scale_parameter=False,
  relative_step=False, warmup_init=False)`: constant lr, no parameter scaling, no momentum,
  decay 1 - t^-0.8, eps1 1e-30, update clipping 1.0, no weight decay.

  Differences optax does not let us remove: HF factors the LAST two axes of every >= 2-D parameter,
  optax the two LARGEST (here with min_dim_size_to_factor=1, so every >= 2-D one is factored too);
  t2t's attention kernels are [d, heads, d_kv] where HF's are [heads*d_kv, d], so the factored
  statistics differ in layout, not in cost. HF also computes each parameter's RMS every step (unused
  without scale_parameter).
  """
  return optim.adafactor(learning_rate=optim.constant_schedule(learning_rate), decay_rate=0.8,
                         clipping_threshold=1.0, momentum=None, multiply_by_parameter_scale=False,
                         min_dim_size_to_factor=1, epsilon1=1e-30, weight_decay_rate=None)


def _model(config: T5Config, decode_fn: Callable[..., jax.Array] = decoding.greedy_decode
           ) -> EncoderDecoderModel:
  """The model without vocabularies: the benchmarks feed random ids and never (de)tokenise, so
  seqio (which imports TensorFlow) stays out of it, as on an accelerator image without TensorFlow
  (`t5_gpu`)."""
  return EncoderDecoderModel(Transformer(config), None, None, decode_fn=decode_fn)


def _tokens(rng: np.random.Generator, shape: tuple[int, ...], vocab_size: int) -> np.ndarray:
  return rng.integers(2, min(TOKEN_HIGH, vocab_size), size=shape, dtype=np.int32)


def _train_setup(config: T5Config, batch: int, enc_len: int, dec_len: int,
                 split_update: bool = True) -> tuple[Trainer, dict[str, np.ndarray]]:
  """A Trainer for random tokens [batch, enc_len] -> [batch, dec_len] (all weighted), and the batch."""
  model = _model(config)
  rng = np.random.default_rng(0)
  targets = _tokens(rng, (batch, dec_len), config.vocab_size)
  data = dict(encoder_input_tokens=_tokens(rng, (batch, enc_len), config.vocab_size),
              decoder_target_tokens=targets,
              decoder_input_tokens=np.pad(targets[:, :-1], ((0, 0), (1, 0))),  # start id 0
              decoder_loss_weights=np.ones((batch, dec_len), np.float32))
  trainer = Trainer(model, adafactor_like_peer(), Partitioner(),
                    {k: v.shape for k, v in data.items()}, split_update=split_update)
  return trainer, data


def _no_eos(decode_fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
  """`decode_fn` whose logits have EOS at -1e9, so every row decodes the full length."""
  def wrapped(tokens_to_logits, cache, batch_size, max_decode_length, *, rng=None):
    def masked(tokens, c):
      logits, c = tokens_to_logits(tokens, c)
      return logits.at[:, decoding.EOS_ID].set(-1e9), c
    return decode_fn(masked, cache, batch_size, max_decode_length, rng=rng)
  return wrapped


def decode_strategy(beams: int) -> Callable[..., jax.Array]:
  """Greedy for `beams` == 1, else beam search of that width with the peer's length penalty."""
  if beams < 1:
    raise ValueError(f'--beams must be >= 1, got {beams}.')
  if beams == 1:
    return decoding.greedy_decode
  return functools.partial(decoding.beam_search, beam_size=beams, alpha=LENGTH_PENALTY)


def decode_setup(config: T5Config, batch: int, enc_len: int, gen_len: int, beams: int = 1,
                 partitioner: Partitioner | None = None
                 ) -> tuple[EncoderDecoderModel, Any, np.ndarray]:
  """The decode benchmarks' model (EOS never chosen, so every row decodes `gen_len` tokens), its
  parameters (PRNGKey(0), laid out by `partitioner`'s rules, one device by default) and random
  input tokens [batch, enc_len] (numpy seed 0): the same for every tool that times decoding."""
  partitioner = partitioner or Partitioner(num_partitions=1)
  model = _model(config, decode_fn=_no_eos(decode_strategy(beams)))
  inputs = _tokens(np.random.default_rng(0), (batch, enc_len), config.vocab_size)
  shapes = dict(encoder_input_tokens=(batch, enc_len), decoder_input_tokens=(batch, gen_len))
  with partitioner.activation_context():
    boxed = jax.eval_shape(lambda key: model.get_initial_variables(key, shapes)['params'],
                           jax.random.PRNGKey(0))
    init = jax.jit(lambda key: nn.unbox(model.get_initial_variables(key, shapes)['params']),
                   out_shardings=partitioner.shardings_for(boxed))
    params = init(jax.random.PRNGKey(0))
  return model, params, inputs


def check_decoded(out: np.ndarray, batch: int, gen_len: int) -> None:
  """Raises RuntimeError unless `out` is [batch, gen_len] tokens with no EOS among them."""
  if out.shape != (batch, gen_len) or (out == decoding.EOS_ID).any():
    raise RuntimeError(f'Decoding did not produce {gen_len} EOS-free tokens per row: {out.shape}.')


def prepare_process(host_malloc: str = 'auto', freeze_gc: bool = True) -> None:
  """What a t2t entry point does before its first XLA program, for a benchmark's own process:
  TensorFlow (seqio's, imported but its pools not yet made) kept to one thread each way, so it
  does not compete with JAX for the cores; the host malloc settings (`--host-malloc`,
  t2t/training/host_memory.py); the imports' objects frozen out of Python's collector, as
  `t2t.cli.run_module` does (`freeze_gc`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  host_memory.configure(host_malloc)
  if freeze_gc:
    garbage_collection.freeze_long_lived()
