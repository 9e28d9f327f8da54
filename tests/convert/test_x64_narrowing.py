"""64-bit values while jax_enable_x64 is off: JAX holds them in 32 bits, and jaxport says so.

A conversion that declares float64/complex128 inputs, outputs or params warns once; 64-bit integer inputs
and params whose values do not fit 32 bits are refused at the call instead of wrapping (an int64 id of
2**40 would otherwise gather row 0). With x64 on, the same functions match TF in 64 bits.
"""
import warnings

import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport


def _narrowing_warnings(convert, *args):
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = convert(*args)
  return result, [str(w.message) for w in caught if issubclass(w.category, jaxport.X64NarrowingWarning)]


def test_float64_signature_warns_once_naming_each_leaf():
  scale = tf.Variable(np.full(3, 1.5), dtype=tf.float64)

  @tf.function
  def fn(x, n):
    return {"y": x * scale, "count": n + 1}

  x, n = np.arange(3.0), np.arange(3, dtype=np.int32)
  (jax_fn, params), messages = _narrowing_warnings(jaxport.convert, fn, x, n)
  assert len(messages) == 1
  message = messages[0]
  assert "input args[0] (float64 -> float32)" in message
  assert "output['y'] (float64 -> float32)" in message
  assert "(float64 -> float32)" in message.split("param ")[1]
  assert "args[1]" not in message and "count" not in message   # int32 leaves are held as they are
  assert "jax_enable_x64', True" in message
  outputs, _ = jax_fn(params, x, n)
  assert outputs["y"].dtype == np.float32
  np.testing.assert_allclose(outputs["y"], fn(x, n)["y"].numpy(), rtol=1e-7)


def test_32_bit_and_int64_signatures_do_not_warn():
  @tf.function
  def fn(x):
    return tf.argmax(x, axis=-1), tf.cast(x, tf.int64)   # argmax's default output is int64

  _, messages = _narrowing_warnings(jaxport.convert, fn, np.ones((2, 3), np.float32))
  assert messages == []


def test_graph_def_float64_placeholder_warns():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float64, [2], name="x")
    tf.identity(x * 2.0, name="y")
  (jax_fn, params), messages = _narrowing_warnings(jaxport.convert_graph_def, graph.as_graph_def(), ["x:0"], "y:0")
  assert len(messages) == 1 and "input x (float64 -> float32)" in messages[0]
  np.testing.assert_allclose(jax_fn(params, np.array([1.0, 2.0]))[0], [2.0, 4.0])


def _lookup():
  table = tf.Variable(np.arange(10.0, dtype=np.float32)[:, None])

  @tf.function
  def fn(ids):
    return tf.gather(table, ids % 10)

  return fn


def test_int64_input_that_would_wrap_is_refused():
  fn = _lookup()
  jax_fn, params = jaxport.convert(fn, np.zeros(2, np.int64))
  fitting = np.array([3, 2**31 - 1], np.int64)
  np.testing.assert_allclose(jax_fn(params, fitting)[0], fn(fitting).numpy())
  wrapping = np.array([3, 2**40 + 7], np.int64)   # TF gathers row 7; JAX's int32 would see 7 - 2**40 % 2**32
  with pytest.raises(jaxport.X64OverflowError, match=r"input args\[0\] holds int64 values in \[3, 1099511627783\]"):
    jax_fn(params, wrapping)
  with pytest.raises(OverflowError, match="jax_enable_x64"):   # also a builtin OverflowError
    jax_fn(params, -wrapping)


def test_int64_param_that_would_wrap_is_refused():
  offset = tf.Variable(np.int64(5))

  @tf.function
  def fn(x):
    return x + offset

  jax_fn, params = jaxport.convert(fn, np.int64(1))
  assert int(jax_fn(params, np.int64(1))[0]) == 6
  with pytest.raises(jaxport.X64OverflowError, match=f"param {list(params)[0]!r} holds int64"):
    jax_fn({**params, list(params)[0]: np.int64(2**33)}, np.int64(1))


def test_with_x64_on_float64_and_large_int64_match_tf():
  fn = _lookup()
  ids = np.array([3, 2**40 + 7], np.int64)

  @tf.function
  def precise(x):
    return tf.math.log1p(x) * 3.0

  x = np.array([1e-12, 0.25, 3.0])
  with jax.enable_x64(True):
    (jax_fn, params), messages = _narrowing_warnings(jaxport.convert, fn, ids)
    np.testing.assert_array_equal(jax_fn(params, ids)[0], fn(ids).numpy())
    (precise_fn, precise_params), more = _narrowing_warnings(jaxport.convert, precise, x)
    out = precise_fn(precise_params, x)[0]
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, precise(x).numpy(), rtol=1e-15)
  assert messages == more == []


def test_exported_artifact_refuses_int64_that_would_wrap(tmp_path):
  fn = _lookup()
  jax_fn, params = jaxport.convert(fn, np.zeros(2, np.int64))
  jaxport.export(jax_fn, params, np.zeros(2, np.int64), path=tmp_path / "lookup")
  loaded, loaded_params = jaxport.load(tmp_path / "lookup")
  fitting = np.array([3, 2**31 - 1], np.int64)
  np.testing.assert_allclose(loaded(loaded_params, fitting)[0], fn(fitting).numpy())
  with pytest.raises(jaxport.X64OverflowError, match=r"input args\[0\] holds int64"):
    loaded(loaded_params, np.array([3, 2**40 + 7], np.int64))


def test_64_bit_attributes_raise_no_jax_dtype_warnings_under_jit():
  """Rules ask JAX for the dtype it holds (int32 for int64): JAX's 'not available' warning per node is noise."""
  @tf.function
  def fn(x, edges):
    n = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.size(x, out_type=tf.int64), lambda: tf.constant(0, tf.int64))
    return n, tf.searchsorted(edges, x, out_type=tf.int64), tf.cast(x, tf.int64)

  x, edges = np.array([[0.5, 2.5]], np.float32), np.array([[0.0, 1.0, 2.0, 3.0]], np.float32)
  jax_fn, params = jaxport.convert(fn, x, edges)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    outs, _ = jax.jit(jax_fn)(params, x, edges)
  assert [str(w.message) for w in caught if "requested dtype" in str(w.message)] == []
  for got, want in zip(outs, fn(x, edges)):
    np.testing.assert_array_equal(got, want.numpy())
