"""TF's run-time checks: Assert, CheckNumerics, EnsureShape."""
import jax
import numpy as np
import pytest
import tensorflow as tf
from jax.experimental import checkify

import jaxport
from jaxport.errors import AssertionFailedError
from oracle import check

IDS = np.array([[1, 4, 2]], np.int32)


def _embedding_lookup(ids):
  tf.debugging.assert_less(ids, tf.constant(5, tf.int32), message="token id out of range")
  return tf.gather(tf.range(5, dtype=tf.float32) * 2.0, ids)


def test_assert_is_free_by_default_and_matches_tf():
  f = jaxport.convert_functional(_embedding_lookup, IDS)
  graph = tf.function(_embedding_lookup).get_concrete_function(IDS).graph.as_graph_def()
  assert "Assert" in {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}
  np.testing.assert_array_equal(jax.jit(f)(IDS), _embedding_lookup(IDS).numpy())
  # A failing value is not checked by default (as in tf2jax): no error, and no cost.
  jax.jit(f)(np.array([[7, 0, 0]], np.int32))


def test_assert_with_checkify_reports_the_message():
  with jaxport.override_config("enable_checkify_for_asserts", True):
    f = jaxport.convert_functional(_embedding_lookup, IDS)
  checked = jax.jit(checkify.checkify(f))
  err, _ = checked(IDS)
  assert err.get() is None
  err, _ = checked(np.array([[7, 0, 0]], np.int32))
  assert "token id out of range" in err.get()


def test_assert_on_constants_fails_at_once():
  def fn(x):
    tf.debugging.assert_equal(tf.shape(x)[0], 3, message="need three rows")
    return x * 2.0

  f = jaxport.convert_functional(fn, np.zeros((2,), np.float32))
  with pytest.raises(jaxport.AssertionFailedError, match="need three rows"):
    f(np.zeros((2,), np.float32))
  with pytest.raises(AssertionError):   # also the built-in type
    f(np.zeros((2,), np.float32))


def test_check_numerics():
  fn = lambda x: tf.debugging.check_numerics(x * 2.0, message="activations {bad}")
  x = np.array([1.0, 2.0], np.float32)
  check(fn, x)
  with jaxport.override_config("enable_checkify_for_asserts", True):
    f = jaxport.convert_functional(fn, x)
  err, out = jax.jit(checkify.checkify(f))(x)
  assert err.get() is None and np.allclose(out, 2 * x)
  err, _ = jax.jit(checkify.checkify(f))(np.array([np.nan, 1.0], np.float32))
  assert "activations {bad}" in err.get() and "Found NaN values" in err.get()


def test_ensure_shape_is_checked_against_the_shapes_it_gets():
  fn = lambda x: tf.ensure_shape(x, [None, 3]) + 1.0
  f = jaxport.convert_functional(fn, tf.TensorSpec([None, None], tf.float32))
  np.testing.assert_allclose(f(np.ones((2, 3), np.float32)), 2.0)
  with pytest.raises(jaxport.ShapeMismatchError, match="not compatible with expected shape"):
    jax.jit(f)(np.ones((2, 4), np.float32))


# TF raises for out-of-range gather indices and integer division by zero (on CPU); converted, they
# raise on constants and, with enable_checkify_for_asserts, are checkify checks under jit.

def test_out_of_range_gather_indices_are_checkable():
  params = np.arange(12, dtype=np.float32).reshape(4, 3)
  with jaxport.override_config("enable_checkify_for_asserts", True):
    gather = jaxport.convert_functional(lambda p, i: tf.gather(p, i), params, np.array([0, 1], np.int32))
    gather_nd = jaxport.convert_functional(lambda p, i: tf.gather_nd(p, i), params, np.array([[0, 1]], np.int32))
  err, out = jax.jit(checkify.checkify(gather))(params, np.array([3, 1], np.int32))
  err.throw()
  np.testing.assert_array_equal(out, params[[3, 1]])
  err, _ = jax.jit(checkify.checkify(gather))(params, np.array([0, 4], np.int32))
  with pytest.raises(checkify.JaxRuntimeError, match=r"index 4 is not in \[0, 4\)"):
    err.throw()
  err, _ = jax.jit(checkify.checkify(gather_nd))(params, np.array([[1, 3]], np.int32))
  with pytest.raises(checkify.JaxRuntimeError, match="index 3 is not in"):
    err.throw()
  with pytest.raises(AssertionFailedError, match="index -1"):   # constant indices raise, as in TF
    jaxport.convert_functional(lambda p: tf.gather(p, [-1]), params)(params)


def test_integer_division_by_zero_is_checkable():
  x = np.array([6, 7], np.int32)
  with jaxport.override_config("enable_checkify_for_asserts", True):
    fns = [jaxport.convert_functional(fn, x, x) for fn in (
        tf.math.floordiv, tf.math.floormod, tf.truncatediv, tf.truncatemod,
        lambda a, b: tf.raw_ops.Div(x=a, y=b))]
  for fn in fns:
    err, _ = jax.jit(checkify.checkify(fn))(x, np.array([2, 3], np.int32))
    err.throw()
    err, _ = jax.jit(checkify.checkify(fn))(x, np.array([2, 0], np.int32))
    with pytest.raises(checkify.JaxRuntimeError, match="Integer division by zero"):
      err.throw()
  with pytest.raises(AssertionFailedError, match="Integer division by zero"):
    jaxport.convert_functional(lambda a: a // tf.constant(0), x)(x)
