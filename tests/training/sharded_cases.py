"""The 8-device cases of test_sharded_training.py, run in ONE subprocess (the device count is
fixed when JAX starts): `python -m tests.training.sharded_cases OUT_DIR` with
XLA_FLAGS=--xla_force_host_platform_device_count=8. Asserts, and prints 'OK' at the end."""
from __future__ import annotations

import functools
import os
import sys

import flax.linen as nn
import gin
import jax
import numpy as np
from jax.sharding import PartitionSpec

from t2t import config
from t2t.models import decoding
from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from t2t.training import checkpoints, optim, partitioning
from t2t.training.partitioning import Partitioner
from t2t.training.predictor import Predictor
from t2t.training.trainer import Trainer, TrainState
from tests.models import helpers
from tests.training import toy

BATCH, STEPS = 8, 3
# heads 8 and vocab 64 divide every mesh axis used here; d_model 16 splits 8 ways under FSDP.
# One layer per stack: each of the 8 Trainers compiles in a few seconds.
MODEL = EncoderDecoderModel(
    Transformer(helpers.tiny_config(num_heads=8, d_kv=4, vocab_size=64, num_encoder_layers=1,
                                    num_decoder_layers=1)),
    toy.VOCAB, toy.VOCAB)
BATCHES = [helpers.seq2seq_batch(seed=s, batch=BATCH, vocab=64) for s in range(STEPS + 1)]
SHAPES = {k: v.shape for k, v in BATCHES[0].items()}
WI = ("encoder", "layers_0", "mlp", "wi", "kernel")  # (16, 32): embed x mlp
EMB = ("token_embedder", "embedding")               # (64, 16): vocab x embed


def optimizer():
  # Factored second moments for (16, 32) and (64, 16), not for the (16, 8, 4) attention kernels.
  return optim.adafactor(learning_rate=0.05, min_dim_size_to_factor=16)


def trainer(partitioner, **kw):
  return Trainer(MODEL, optimizer(), partitioner, SHAPES, **kw)


def flat(tree, is_leaf=None):
  return {partitioning._path_names(k): v  # pylint: disable=protected-access
          for k, v in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def train(tr, steps=STEPS, state=None, first=0):
  state = tr.init_state() if state is None else state
  losses, after_first = [], None
  for i in range(first, first + steps):
    state, metrics = tr.step(state, BATCHES[i])
    losses.append(float(metrics["loss"]))
    if after_first is None:
      after_first = jax.device_get(state.params)
  return state, losses, after_first


def shard_shape(shape, spec, mesh):
  spec = tuple(spec) + (None,) * (len(shape) - len(spec))
  return tuple(d // (mesh.shape[a] if a else 1) for d, a in zip(shape, spec))


def check_shardings(tr, state, name):
  """Parameters: the rules' spec for their logical names, and shards of that shape. Optimizer
  slots: their parameter's spec, or for factored moments the spec without the dropped axis."""
  mesh, rules = tr.partitioner.mesh, tr.partitioner.logical_axis_rules
  boxed = jax.eval_shape(lambda r: MODEL.get_initial_variables(r, SHAPES)["params"],
                         jax.random.PRNGKey(0))
  names = flat(nn.get_partition_spec(boxed), is_leaf=lambda x: isinstance(x, PartitionSpec))
  params = flat(state.params)
  for path, arr in params.items():
    want = nn.logical_to_mesh_axes(tuple(names[path]), rules)
    assert arr.sharding.spec == want, (name, path, arr.sharding.spec, want)
    got = arr.addressable_shards[0].data.shape
    assert got == shard_shape(arr.shape, want, mesh), (name, path, got)
  for path, arr in flat(state.opt_state).items():
    owner = next((path[i:] for i in range(len(path)) if path[i:] in params), None)
    spec = tuple(arr.sharding.spec)
    if owner is None or arr.ndim == 0 or arr.shape == (1,):
      assert arr.sharding.is_fully_replicated, (name, path, spec)
      continue
    pshape, pspec = params[owner].shape, tuple(params[owner].sharding.spec)
    if arr.shape == pshape:
      want = pspec
    else:  # optax: v_row drops the largest axis, v_col the second largest
      drop = int(np.argsort(pshape)[-1 if "v_row" in path else -2])
      want = pspec[:drop] + pspec[drop + 1:]
    if all(a is None for a in want):
      assert arr.sharding.is_fully_replicated, (name, path, spec)
    else:
      assert spec == want, (name, path, spec, want)
    got = arr.addressable_shards[0].data.shape
    assert got == shard_shape(arr.shape, want, mesh), (name, path, got)
  return params, flat(state.opt_state)


def _without_pad_and_eos(strategy):
  """`strategy` with the logits of pad (0) and EOS (1) at -1e9: every row decodes the full length,
  so the comparison covers every step (the young model here would mostly stop at once)."""
  def wrapped(tokens_to_logits, cache, batch_size, max_decode_length, *, rng=None):
    def masked(tokens, c):
      logits, c = tokens_to_logits(tokens, c)
      return logits.at[:, :decoding.EOS_ID + 1].set(-1e9), c
    return strategy(masked, cache, batch_size, max_decode_length, rng=rng)
  return wrapped


def check_decoding_on_meshes(params, meshes):
  """Greedy and beam-3 decoding give one device's tokens on each of `meshes` ({name: Partitioner}).

  The same parameters (`params`, host arrays) are laid out by each mesh's rules, so heads, FFN
  and vocabulary are split over `model` and the rows over `data`; beam search keeps one copy of
  the encoder side per row (api.split_encoder_side) under the split too.
  """
  examples = [dict(encoder_input_tokens=row) for row in BATCHES[0]["encoder_input_tokens"]]
  boxed = jax.eval_shape(lambda r: MODEL.get_initial_variables(r, SHAPES)["params"],
                         jax.random.PRNGKey(0))
  for strategy_name, strategy in (("greedy", decoding.greedy_decode),
                                  ("beam 3", functools.partial(decoding.beam_search, beam_size=3))):
    model = EncoderDecoderModel(MODEL.module, toy.VOCAB, toy.VOCAB,
                                decode_fn=_without_pad_and_eos(strategy))
    decode = lambda p, part: np.stack(Predictor(model, p, part, BATCH, max_decode_length=6,
                                                bucket_lengths=False).predict(examples))
    want = decode(params, Partitioner(devices=jax.devices()[:1]))
    print(strategy_name, "1 device", want.tolist())
    assert len(np.unique(want)) > 3, want  # not a degenerate decode that any layout would match
    for name, part in meshes.items():
      got = decode(jax.device_put(params, part.shardings_for(boxed)), part)
      np.testing.assert_array_equal(got, want, err_msg=f"{strategy_name} on {name}")

def main(out_dir):
  assert jax.device_count() == 8
  one = Partitioner(devices=jax.devices()[:1])
  base_tr = trainer(one)
  base_state, base_losses, base_first = train(base_tr)
  print("1 device", base_losses)

  cases = {"(8,1)": Partitioner(num_partitions=1), "(4,2)": Partitioner(num_partitions=2),
           "(2,4)": Partitioner(num_partitions=4), "(1,8)": Partitioner(num_partitions=8),
           "fsdp": Partitioner(logical_axis_rules="fsdp"),
           "two_d (4,2)": Partitioner(num_partitions=2, logical_axis_rules="two_d")}
  # The rules, by hand: shard shapes of the (16, 32) embed x mlp kernel and (64, 16) embedding,
  # and of the embedding's factored row moment (its largest axis, vocab, dropped -> (16,)).
  by_hand = {"(8,1)": ((16, 32), (64, 16), (16,)), "(4,2)": ((16, 16), (32, 16), (16,)),
             "(2,4)": ((16, 8), (16, 16), (16,)), "(1,8)": ((16, 4), (8, 16), (16,)),
             "fsdp": ((2, 32), (64, 2), (2,)), "two_d (4,2)": ((4, 16), (32, 4), (4,))}
  kept = {}
  for name, p in cases.items():
    tr = trainer(p)
    state, losses, _ = train(tr)
    print(name, losses)
    np.testing.assert_allclose(losses, base_losses, rtol=0, atol=1e-5, err_msg=name)
    params, opt = check_shardings(tr, state, name)
    got = (params[WI].addressable_shards[0].data.shape,
           params[EMB].addressable_shards[0].data.shape,
           opt[("0", "v_row") + EMB].addressable_shards[0].data.shape)
    assert got == by_hand[name], (name, got)
    kept[name] = (tr, state)

  # Decoding on model-parallel meshes gives the one-device tokens.
  check_decoding_on_meshes(jax.device_get(base_state.params),
                           {"(4,2)": cases["(4,2)"], "(1,8)": cases["(1,8)"]})
  print("decoding: same tokens on (4,2) and (1,8)")

  # Gradient accumulation on a (2, 4) mesh: 4 microbatches of 2, the whole batch's step.
  micro_tr = trainer(Partitioner(num_partitions=4), num_microbatches=4)
  _, micro_losses, micro_first = train(micro_tr)
  print("(2,4) x 4 microbatches", micro_losses)
  np.testing.assert_allclose(micro_losses, base_losses, rtol=0, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6),
               micro_first, base_first)

  # A checkpoint saved on (4, 2) restores on (1, 8), on FSDP and on one device, and training
  # continues there as it would have.
  saved_tr, saved_state = kept["(4,2)"]
  ckpt = checkpoints.Checkpointer(os.path.join(out_dir, "ckpt"))
  ckpt.save(STEPS, saved_state.params, saved_state.opt_state, {})
  saved = jax.device_get((saved_state.params, saved_state.opt_state))
  _, ref_next, _ = train(saved_tr, 1, saved_state, first=STEPS)
  for name, tr in [("(1,8)", kept["(1,8)"][0]), ("fsdp", kept["fsdp"][0]), ("1 device", base_tr)]:
    params, opt_state, _ = ckpt.restore(STEPS, tr.params_abstract, tr.params_shardings,
                                        tr.opt_state_abstract, tr.opt_state_shardings)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get((params, opt_state)), saved)
    jax.tree.map(lambda a, s, n=name: None if a.sharding.is_equivalent_to(s, a.ndim) else
                 sys.exit(f"{n}: restored with {a.sharding}, wanted {s}"),
                 (params, opt_state), (tr.params_shardings, tr.opt_state_shardings))
    state = TrainState(step=jax.device_put(np.int32(STEPS), tr.partitioner.replicated),
                       params=params, opt_state=opt_state)
    _, next_loss, _ = train(tr, 1, state, first=STEPS)
    print("restored on", name, next_loss)
    np.testing.assert_allclose(next_loss, ref_next, rtol=0, atol=1e-5, err_msg=name)
  ckpt.close()

  # The gin presets build the meshes and rules they describe.
  expected = {"data_parallel": (8, 1), "model_parallel": (1, 8), "two_d": (4, 2), "fsdp": (8, 1)}
  for preset, shape in expected.items():
    gin.clear_config()
    gin.parse_config_file(str(config.resolve_gin_file(f"partitioning/{preset}.gin")))
    p = Partitioner()
    assert (p.mesh.shape["data"], p.mesh.shape["model"]) == shape, (preset, p.mesh.shape)
    assert p.logical_axis_rules == partitioning.RULE_PRESETS[preset], preset
  gin.clear_config()

  # Dropout 0.1 with the default philox4x32 key: JAX's implementation on one device, t2t's
  # partitionable twin on the (4, 2) mesh (trainer.dropout_key_impl); the same masks, so the same
  # losses. The key type shows which one each trainer took.
  dropout_model = EncoderDecoderModel(Transformer(helpers.tiny_config(
      num_heads=8, d_kv=4, vocab_size=64, num_encoder_layers=1, num_decoder_layers=1,
      dropout_rate=0.1)), toy.VOCAB, toy.VOCAB)
  make = lambda p: Trainer(dropout_model, optimizer(), p, SHAPES)
  one_tr, mesh_tr = make(one), make(Partitioner(num_partitions=2))
  assert jax.random.key_impl(one_tr.dropout_rng) == "philox4x32"
  assert one_tr.dropout_rng.dtype != mesh_tr.dropout_rng.dtype  # JAX's vs t2t's implementation
  _, one_losses, _ = train(one_tr)
  _, mesh_losses, _ = train(mesh_tr)
  print("dropout 0.1, philox4x32: 1 device", one_losses, "(4,2)", mesh_losses)
  np.testing.assert_allclose(mesh_losses, one_losses, rtol=0, atol=1e-5)
  # The same model and initialisation without dropout (the first case above): masks were drawn.
  assert abs(one_losses[0] - base_losses[0]) > 1e-4, (one_losses, base_losses)
  print("OK")


if __name__ == "__main__":
  main(sys.argv[1])
