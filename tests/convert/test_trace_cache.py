"""Rules that are costly to trace are traced once per shape, and the shortcuts that make tracing cheap
give the values, dtypes and gradients the plain forms give."""
from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport import xla_options
from jaxport.convert import export_marks
from jaxport.convert.ops import conv_lowering, math as math_ops
from oracle import check


def _conv_stack(depth: int):
  rs = np.random.RandomState(0)
  filters = [tf.Variable((rs.normal(size=(3, 3, 64, 64)) / 24).astype(np.float32)) for _ in range(depth)]

  @tf.function
  def fn(x):
    for w in filters:
      x = tf.nn.relu(tf.nn.conv2d(x, w, 1, "SAME"))
    return x
  return fn


def test_same_shape_convs_trace_their_lowering_once(monkeypatch):
  calls = []

  def counting_winograd(*args, **kwargs):
    calls.append(1)
    return conv_lowering_winograd(*args, **kwargs)
  conv_lowering_winograd = conv_lowering.conv_winograd
  monkeypatch.setattr(conv_lowering, "conv_winograd", counting_winograd)
  fn = _conv_stack(4)
  x = np.random.RandomState(1).normal(size=(2, 16, 16, 64)).astype(np.float32)
  jax_fn, params = jaxport.convert(fn, x)
  with xla_options.tracing_without_ynn():   # Winograd is for XLA's own kernels (jaxport.jit)
    jaxpr = jax.make_jaxpr(jax_fn)(params, x)
  assert len(calls) == 1   # four convs of one shape: one trace of the Winograd lowering
  assert "gather" in str(jaxpr)   # the Winograd path was taken
  np.testing.assert_allclose(jax.jit(jax_fn)(params, x)[0], fn(x), rtol=1e-4, atol=1e-4)
  # Traced outside an export first, the conv keeps its export mark in a later export.
  text = jaxport.artifact.lower(jax_fn, params, x, platforms=("cpu",)).exported.mlir_module()
  assert f"@{export_marks.PREFIX}winograd_conv" in text


def test_conv_stack_gradient_matches_tf():
  fn = _conv_stack(3)
  x = np.random.RandomState(2).normal(size=(2, 16, 16, 64)).astype(np.float32)
  check(fn, x, atol=2e-4, rtol=2e-4)


def test_marked_rule_traced_outside_an_export_is_marked_in_it():
  f = tf.function(lambda x: tf.nn.relu6(x * 4.0) + tf.abs(x))
  x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
  jax_fn, params = jaxport.convert(f, x)
  jaxpr = str(jax.make_jaxpr(lambda x: jax_fn(params, x)[0])(x))
  assert export_marks.PREFIX not in jaxpr and "pjit" not in jaxpr   # inlined: no call in the way
  text = jaxport.artifact.lower(jax_fn, params, x, platforms=("cpu",)).exported.mlir_module()
  assert f"@{export_marks.PREFIX}relu_six" in text and f"@{export_marks.PREFIX}abs" in text
  check(f, x)


_DTYPES = [np.float32, np.float16, np.int32, np.uint8, np.complex64]


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    op=st.sampled_from(["add", "subtract", "multiply"]),
    shapes=st.sampled_from([((), ()), ((3,), ()), ((2, 3), (3,)), ((2, 1, 4), (3, 1)), ((1,), (2, 2)),
                            ((2, 0), (1,))]),
    dtype=st.sampled_from(_DTYPES), other_dtype=st.sampled_from(_DTYPES + [None]),
    operand_kinds=st.sampled_from(["traced", "constant", "scalar", "weak"]), swap=st.booleans())
def test_lax_binary_equals_jax_numpy(op, shapes, dtype, other_dtype, operand_kinds, swap):
  """The lax shortcut of Add/Sub/Mul gives jax.numpy's result (value, dtype, weak type), falling back to
  it for operands TF would not mix (dtypes, Python scalars, weakly typed values)."""
  rs = np.random.RandomState(0)
  a = rs.uniform(0, 9, size=shapes[0]).astype(dtype)
  b = rs.uniform(0, 9, size=shapes[1]).astype(other_dtype or dtype)
  if operand_kinds == "scalar":
    b = 2

  def both(a_traced, weak_scalar):
    other = {"traced": jnp.asarray(b), "weak": weak_scalar}.get(operand_kinds, b)
    x, y = (other, a_traced) if swap else (a_traced, other)
    return math_ops._lax_binary(op, x, y), getattr(jnp, op)(x, y)
  got, want = jax.jit(both)(a, 2)   # a Python int argument traces weakly typed
  assert got.dtype == want.dtype and got.shape == want.shape
  assert got.weak_type == want.weak_type
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", ["add", "subtract", "multiply"])
def test_lax_binary_gradients_and_vmap(op):
  x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
  c = np.array([0.5, -2.0, 3.0], np.float32)
  ours = lambda x: jnp.sum(math_ops._lax_binary(op, x, c) ** 2)
  ref = lambda x: jnp.sum(getattr(jnp, op)(x, c) ** 2)
  np.testing.assert_array_equal(jax.grad(ours)(x), jax.grad(ref)(x))
  np.testing.assert_array_equal(jax.vmap(lambda r: math_ops._lax_binary(op, r, c))(x),
                                getattr(jnp, op)(x, c))
