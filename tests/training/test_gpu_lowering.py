"""t2t's programs lower for a GPU without its CPU kernels, and build without TensorFlow.

t2t's C++ kernels (`t2t/models/small_dots.py`: decoding, training attention, the initialisers'
Threefry) are XLA:CPU custom calls, chosen while a program is traced when JAX's backend is a single
CPU device. On a GPU they must stay out, or the program cannot compile there. No GPU is needed to
check that: JAX lowers a program for another platform (`lowering_platforms=('cuda',)`), so a
process whose `jax.default_backend()` answers 'gpu' traces every program a GPU run would (the
trainer's initialisers, its gradient and update programs and the fused step, greedy and beam
decoding) for T5 v1.0 in float32 (the configuration with the most kernels), v1.0 with bf16
matmuls and v1.1 in bfloat16, and the StableHLO must name no t2t kernel. The same process, back on
its CPU, then finds the kernels in the same programs where this processor can run them (the check
can fail), and imports neither TensorFlow nor seqio throughout (a GPU image has neither).

A process of its own: traced programs are cached per function, and the backend is patched.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import t2t
from tests.support.environment import REFUSE_TENSORFLOW

SCRIPT = REFUSE_TENSORFLOW + r"""
import dataclasses, json, re
import flax.linen as nn
import jax
import numpy as np
from benchmarks import t5_gpu
from benchmarks.t5_small_setup import _model, _train_setup, decode_strategy
from t2t.models import decoder_step, threefry, train_attention
from t2t.models.transformer import T5Config

TINY = dict(vocab_size=128, d_model=32, num_heads=2, d_kv=16, d_ff=64, num_encoder_layers=1,
            num_decoder_layers=1, dropout_rate=0.1)
CONFIGS = {'v1_0_fp32': T5Config(**TINY), 'v1_0_bf16_matmuls': T5Config(**TINY, matmul_dtype='bfloat16'),
           'v1_1_bf16': t5_gpu.t5_1_1_base_config(0.1, tiny=True)}


def kernels(lowered):
  return sorted({t for t in re.findall(r'custom_call @(\w+)', lowered.as_text()) if t.startswith('t2t_')})


def programs(config, platforms):
  # {program: the t2t kernels it calls}, lowered from abstract values (nothing compiles).
  lower = lambda fn, *args: kernels(fn.trace(*args).lower(lowering_platforms=platforms))
  trainer, data = _train_setup(config, 2, 32, 16)
  rep = trainer.partitioner.replicated
  state = trainer.abstract_state()
  params, scalar = state.params, state.step
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=trainer.partitioner.data_sharding)
           for k, v in data.items()}
  out = {}
  with trainer.partitioner.activation_context():
    init = jax.jit(lambda rng: nn.unbox(trainer._init_params(rng)),
                   out_shardings=trainer.params_shardings)
    with threefry.for_initialisers():
      out['init'] = lower(init, trainer._init_rng)
    out['gradient'] = lower(trainer._gradient_step, params, scalar, batch, trainer.dropout_rng,
                            trainer.dropout_rows)
    out['update'] = lower(trainer._update_step, state, params,
                          jax.ShapeDtypeStruct((), np.float32, sharding=rep))
    out['fused_step'] = lower(trainer._train_step, state, batch, trainer.dropout_rng,
                              trainer.dropout_rows)
  decoding = dataclasses.replace(config, dropout_rate=0.0)
  shapes = dict(encoder_input_tokens=(2, 32), decoder_input_tokens=(2, 8))
  for beams in (1, 4):
    model = _model(decoding, decode_fn=decode_strategy(beams))
    abstract = nn.unbox(jax.eval_shape(
        lambda key: model.get_initial_variables(key, shapes)['params'], jax.random.PRNGKey(0)))
    tokens = {k: jax.ShapeDtypeStruct(v, np.int32) for k, v in shapes.items()}
    out[f'decode_beams{beams}'] = lower(jax.jit(model.predict_batch), abstract, tokens)
  return out


cpu_backend = jax.default_backend
jax.default_backend = lambda: 'gpu'
gpu = {name: programs(config, ('cuda',)) for name, config in CONFIGS.items()}
jax.default_backend = cpu_backend
cpu = programs(CONFIGS['v1_0_fp32'], ('cpu',))
print('RESULT ' + json.dumps(dict(gpu=gpu, cpu=cpu,
                                  attention_kernel=train_attention.unavailable_reason() is None,
                                  threefry_kernel=threefry.unavailable_reason() is None,
                                  decode_kernel=decoder_step.unavailable_reason() is None,
                                  modules=sorted(m for m in sys.modules if m.split('.')[0] in REFUSED))))
"""


def test_gpu_programs_have_no_cpu_kernels_and_need_no_tensorflow():
  root = Path(t2t.__file__).resolve().parent.parent
  run = subprocess.run([sys.executable, '-c', SCRIPT], cwd=root, capture_output=True, text=True,
                       timeout=600, check=False, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(run.stdout.split('RESULT ', 1)[1])
  assert result['modules'] == []
  for config, found in result['gpu'].items():
    assert set(found) == {'init', 'gradient', 'update', 'fused_step', 'decode_beams1',
                          'decode_beams4'}, config
    assert all(kernels == [] for kernels in found.values()), (config, found)
  # Back on the CPU the same programs call the kernels this processor can run.
  cpu = result['cpu']
  if result['attention_kernel']:
    assert cpu['gradient'] and cpu['fused_step'] and all(k.startswith('t2t_') for k in cpu['gradient'])
  if result['threefry_kernel']:
    assert cpu['init'] == ['t2t_threefry2x32']
  if result['decode_kernel']:
    assert cpu['decode_beams1'] and cpu['decode_beams4']
