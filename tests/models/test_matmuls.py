"""Tests for t2t.models.matmuls: the direct two-operand einsum and the mixed-precision matmul."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models import matmuls

_ROUNDS_AWAY = 1.0 + 2.0 ** -8   # in float32, but between two bfloat16 values: rounds to 1.0


def _equations(fn, *args):
  """(primitive, params) of each equation `fn(*args)` traces to."""
  return [(e.primitive.name, dict(e.params)) for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns]


@pytest.mark.parametrize('spec,x_shape,y_shape', [
    ('bqhd,bkhd->bhqk', (2, 3, 4, 5), (2, 6, 4, 5)),   # attention logits
    ('bhqk,bkhd->bqhd', (2, 4, 3, 6), (2, 6, 4, 5)),   # weights x values: a transposed result
    ('bhqd,bhdk->bhqk', (2, 4, 1, 5), (2, 4, 5, 6)),   # the encoder cache's layout, one query
    ('bqhd,bhqk->bkhd', (2, 3, 4, 5), (2, 4, 3, 6)),   # a gradient's form
    ('abcd,cde->abe', (2, 3, 4, 5), (4, 5, 6)),        # a DenseGeneral over two axes
    ('ij,jk->ki', (3, 4), (4, 5)),
])
@pytest.mark.parametrize('dtype,preferred', [(jnp.float32, None), (jnp.bfloat16, jnp.float32)])
def test_einsum2_traces_to_the_equations_of_jnp_einsum(spec, x_shape, y_shape, dtype, preferred):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=x_shape), dtype)
  y = jnp.asarray(rng.normal(size=y_shape), dtype)
  ours = lambda x, y: matmuls.einsum2(spec, x, y, preferred_element_type=preferred)
  reference = lambda x, y: jnp.einsum(spec, x, y, preferred_element_type=preferred)
  assert _equations(ours, x, y) == _equations(reference, x, y)
  assert 'dot_general' in [name for name, _ in _equations(ours, x, y)]
  result = ours(x, y)
  assert result.dtype == reference(x, y).dtype
  np.testing.assert_array_equal(result, reference(x, y))


@pytest.mark.parametrize('spec,x_shape,y_shape', [
    ('...d,de->...e', (2, 3, 4), (4, 5)),   # an ellipsis
    ('bd,bd->b', (1, 4), (3, 4)),           # a size-1 index broadcast against 3
    ('ii,ij->j', (3, 3), (3, 4)),           # an index repeated in one operand
    ('ab,bc->a', (2, 3), (3, 4)),           # c summed out of one operand alone
])
def test_einsum2_hands_other_specs_to_jnp_einsum(spec, x_shape, y_shape):
  rng = np.random.default_rng(1)
  x, y = rng.normal(size=x_shape).astype(np.float32), rng.normal(size=y_shape).astype(np.float32)
  np.testing.assert_allclose(matmuls.einsum2(spec, x, y), np.einsum(spec, x, y), rtol=1e-5)


def test_matmul_mixed_rounds_operands_and_accumulates_in_float32():
  a = jnp.array([[_ROUNDS_AWAY, 3.0]], jnp.float32)
  b = jnp.array([[1.0], [_ROUNDS_AWAY]], jnp.float32)
  exact = matmuls.matmul('ij,jk->ik', a, b, jnp.float32)
  assert exact.dtype == jnp.float32 and float(exact[0, 0]) == 4.0 + 4 * 2.0 ** -8
  mixed = matmuls.matmul('ij,jk->ik', a, b, jnp.float32, jnp.bfloat16)
  assert mixed.dtype == jnp.float32 and float(mixed[0, 0]) == 4.0   # 1*1 + 3*1 after rounding
  # 257 ones: a bfloat16 accumulator stops at 256 (its spacing there is 2); float32 does not.
  ones = jnp.ones((1, 257), jnp.float32)
  assert float(matmuls.matmul('ij,jk->ik', ones, ones.T, jnp.float32, jnp.bfloat16)[0, 0]) == 257.0
  # Result dtype follows `dtype`, whatever the operands' dtype.
  assert matmuls.matmul('ij,jk->ik', a, b, jnp.bfloat16, jnp.bfloat16).dtype == jnp.bfloat16


def test_matmul_mixed_gradients_use_the_rounded_operands():
  """d sum(a @ b) / da = 1 @ round(b)^T and / db = round(a)^T @ 1, returned in float32."""
  a = jnp.array([[_ROUNDS_AWAY, 3.0]], jnp.float32)
  b = jnp.array([[1.0], [_ROUNDS_AWAY]], jnp.float32)
  loss = lambda a, b: jnp.sum(matmuls.matmul('ij,jk->ik', a, b, jnp.float32, jnp.bfloat16))
  da, db = jax.grad(loss, argnums=(0, 1))(a, b)
  assert da.dtype == db.dtype == jnp.float32
  np.testing.assert_array_equal(da, [[1.0, 1.0]])           # float32 would give [1, 1 + 2^-8]
  np.testing.assert_array_equal(db, [[1.0], [3.0]])         # float32 would give [1 + 2^-8, 3]
  exact_da, _ = jax.grad(lambda a, b: jnp.sum(a @ b), argnums=(0, 1))(a, b)
  np.testing.assert_array_equal(exact_da, [[1.0, _ROUNDS_AWAY]])
