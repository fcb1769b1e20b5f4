"""The real Trainer on T5-tiny over 8 simulated devices, and gradient accumulation on 1 device.

The 8-device cases (tests/training/sharded_cases.py) run in one subprocess: meshes (8,1), (4,2),
(2,4), (1,8), FSDP and 2-D give the 1-device losses; parameter and optimizer-slot shardings are
what the rules say; microbatches on a (2,4) mesh; a checkpoint moves between meshes; the gin
presets build their meshes.
"""
import os
import subprocess
import sys

import jax
import numpy as np
import optax

from t2t.models.api import EncoderDecoderModel
from t2t.models.transformer import Transformer
from t2t.training.partitioning import Partitioner
from t2t.training.trainer import Trainer
from tests.models import helpers
from tests.support.environment import xla_flags_with
from tests.training import toy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_microbatches_give_the_big_batch_update():
  """One step on a batch of 8 = 4 microbatches of 2, though they hold unequal numbers of target
  tokens (the loss is a token mean, so the microbatch gradients are token-weighted).

  SGD at rate 1, so the parameter change IS the gradient; Adam's first step, lr * g / (|g| + eps),
  would blow float round-off on gradients near eps up to ~lr (seen: 1e-5 on 1 of 384 entries).
  """
  # One layer per stack: the accumulation is over every parameter's gradient, whatever the depth.
  model = EncoderDecoderModel(
      Transformer(helpers.tiny_config(vocab_size=64, num_encoder_layers=1,
                                      num_decoder_layers=1)), toy.VOCAB, toy.VOCAB)
  batch = helpers.seq2seq_batch(batch=8, vocab=64)
  batch["decoder_loss_weights"][5, 1:] = 0  # microbatch 1 (rows 1, 5) now has 5 tokens, not 8
  shapes = {k: v.shape for k, v in batch.items()}
  results = []
  for m in (1, 4):
    tr = Trainer(model, optax.sgd(1.0), Partitioner(), shapes, num_microbatches=m)
    state, metrics = tr.step(tr.init_state(), batch)
    results.append((jax.device_get(state.params), jax.device_get(metrics)))
  (big, big_m), (micro, micro_m) = results
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6), big, micro)
  for k in ("loss", "accuracy", "num_tokens", "grad_norm"):
    np.testing.assert_allclose(micro_m[k], big_m[k], rtol=1e-6, err_msg=k)
  assert float(big_m["num_tokens"]) == float(np.sum(batch["decoder_loss_weights"]))


def test_trainer_on_eight_devices(tmp_path):
  env = {**os.environ, "XLA_FLAGS": xla_flags_with("--xla_force_host_platform_device_count=8"),
         "JAX_PLATFORMS": "cpu"}
  out = subprocess.run([sys.executable, "-m", "tests.training.sharded_cases", str(tmp_path)],
                       env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
  assert out.stdout.strip().endswith("OK"), out.stdout
