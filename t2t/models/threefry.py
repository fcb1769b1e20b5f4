"""The Threefry-2x32 hash of parameter initialisers as one FFI call, to cut XLA:CPU's compile.

`Trainer.init_params` jits every initialiser of the model into one program. Each draw hashes its
key and counters with Threefry-2x32 (JAX's default PRNG; Salmon et al., SC 2011, 20 rounds), and
XLA:CPU compiles JAX's lowering of each hash into a loop and several fusions: T5-small's 131
parameters make ~200 hashes (the draws and each key's `fold_in`), 1302 fusions and 199 loops, and
the program took ~13 s to compile on a 2-core Zen 3, ~8 s of it for the hashes (a program whose
hash was a stand-in compiled in ~5 s; benchmarks/EXPERIMENTS.md, "Initialisers' Threefry in a
kernel").

Inside `for_initialisers()` the `threefry2x32` primitive lowers instead to `t2t_threefry2x32`
(`threefry.cc`, compiled on first use like the other kernels, `small_dots.THREEFRY`): a custom
call that XLA does not compile. The hash is integer arithmetic, so the bits, and with them every
parameter, are the same as with JAX's lowering (`tests/models/test_threefry.py` checks both and
the published known-answer vector). Everything outside the context, dropout keys included,
lowers as JAX does.

The kernel applies on a single-device CPU backend (a custom call would make XLA's SPMD
partitioner gather a sharded draw onto every device) whose processor has AVX2, to operands that
each have one element or the results' element count (JAX's draws: a scalar key against its
counters); anything else lowers as JAX does. `T2T_THREEFRY=0` turns it off alone;
`T2T_SMALL_DOTS=0` turns off every t2t kernel, this one too.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax.extend.random import threefry2x32_p
from jax.interpreters import mlir

from t2t.models import small_dots

TARGET = 't2t_threefry2x32'
SWITCH = 'T2T_THREEFRY'

_ACTIVE = contextvars.ContextVar('t2t_threefry_for_initialisers', default=False)


def _jax_cpu_rule():
  """JAX's own CPU lowering of `threefry2x32` (private to JAX; None if it has moved)."""
  try:
    from jax._src.random import threefry2x32 as jax_threefry
    return jax_threefry._threefry2x32_cpu_lowering_rule
  except (ImportError, AttributeError):
    return None


_JAX_CPU_RULE = _jax_cpu_rule()


def fits(avals_in: Sequence[jax.core.ShapedArray], avals_out: Sequence[jax.core.ShapedArray]
         ) -> bool:
  """Whether the kernel takes these operands: uint32, each one element or the results' count."""
  out = avals_out[0]
  return out.size > 0 and all(a.dtype == np.uint32 and (a.size == 1 or a.shape == out.shape)
                              for a in avals_in)


def _lowering(ctx, k1, k2, x1, x2):
  if _ACTIVE.get() and fits(ctx.avals_in, ctx.avals_out):
    return jax.ffi.ffi_lowering(TARGET)(ctx, k1, k2, x1, x2)
  return _JAX_CPU_RULE(ctx, k1, k2, x1, x2)


if _JAX_CPU_RULE is not None:
  mlir.register_lowering(threefry2x32_p, _lowering, platform='cpu')


def unavailable_reason() -> str | None:
  """Why initialisers hash with JAX's lowering in this process (None when the kernel applies)."""
  if os.environ.get(SWITCH, '1') == '0':
    return f'{SWITCH}=0'
  if _JAX_CPU_RULE is None:
    return "this JAX's threefry2x32 CPU lowering is not where t2t looks for it"
  if not small_dots.single_cpu_device():
    return 'not a single-device CPU backend'
  return small_dots.unavailable_reason(small_dots.THREEFRY)


@contextlib.contextmanager
def for_initialisers() -> Iterator[bool]:
  """Programs lowered inside hash with the kernel where it applies; yields whether it does.

  Lowering happens when a jitted function is first called (or `.lower()`ed), so the call must be
  inside the context; a program already compiled keeps the lowering it was compiled with.
  """
  use = unavailable_reason() is None and small_dots.loaded(small_dots.THREEFRY) is not None
  token = _ACTIVE.set(use)
  try:
    yield use
  finally:
    _ACTIVE.reset(token)
