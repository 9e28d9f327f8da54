"""TF's run-time checks: Assert, CheckNumerics, EnsureShape."""
import jax
import numpy as np
import pytest
import tensorflow as tf
from jax.experimental import checkify

import jaxport
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
  assert "activations {bad}" in err.get() and "NaN or Inf" in err.get()


def test_ensure_shape_is_checked_against_the_shapes_it_gets():
  fn = lambda x: tf.ensure_shape(x, [None, 3]) + 1.0
  f = jaxport.convert_functional(fn, tf.TensorSpec([None, None], tf.float32))
  np.testing.assert_allclose(f(np.ones((2, 3), np.float32)), 2.0)
  with pytest.raises(jaxport.ShapeMismatchError, match="not compatible with expected shape"):
    jax.jit(f)(np.ones((2, 4), np.float32))
