"""Eager calls (outside any JAX transformation) of a graph of EAGER_JIT_MIN_NODES nodes or more run as one
cached jax.jit (config `eager_jit`), in segments where the graph cannot trace (test_segments.py), with the
same results."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import api

X = np.random.RandomState(0).normal(size=(4, 8)).astype(np.float32)


def _deep(x, depth=api.EAGER_JIT_MIN_NODES):
  for i in range(depth):
    x = tf.tanh(x * (1.0 + 0.01 * i)) + 0.1
  return x


def _compiles(jax_fn) -> int:
  return jax_fn._jitted_graph._cache_size()   # pylint: disable=protected-access


def test_a_deep_graph_called_eagerly_compiles_once_and_matches_op_by_op():
  jax_fn, params = jaxport.convert(tf.function(_deep), X)
  out = jax_fn(params, X)[0]
  np.testing.assert_allclose(out, _deep(X), rtol=1e-6)
  jax_fn(params, X + 1.0)
  assert _compiles(jax_fn) == 1
  with jaxport.override_config("eager_jit", False):
    np.testing.assert_allclose(jax_fn(params, X)[0], out, rtol=1e-6)
  assert _compiles(jax_fn) == 1


def test_a_small_graph_runs_op_by_op():
  jax_fn, params = jaxport.convert(tf.function(lambda x: _deep(x, 3)), X)
  np.testing.assert_allclose(jax_fn(params, X)[0], _deep(X, 3), rtol=1e-6)
  assert _compiles(jax_fn) == 0


def test_assigned_params_are_the_only_changed_ones_under_the_eager_jit():
  counter = tf.Variable(0.0, name="counter")
  scale = tf.Variable(2.0, name="scale")

  @tf.function
  def step(x):
    counter.assign_add(1.0)
    return _deep(x) * scale

  jax_fn, params = jaxport.convert(step, X)
  out, changed = jax_fn.with_changed_params(params, X)
  assert set(changed) == {"counter"} and float(changed["counter"]) == 1.0
  np.testing.assert_allclose(out, _deep(X) * 2.0, rtol=1e-6)
  _, new_params = jax_fn(params, X)
  assert float(new_params["counter"]) == 1.0 and float(new_params["scale"]) == 2.0
  assert _compiles(jax_fn) == 1


def test_a_graph_with_value_dependent_shapes_falls_back_to_op_by_op():
  @tf.function
  def positives(x):
    kept = tf.boolean_mask(x, x > 0)   # its length depends on the values
    return _deep(kept)

  jax_fn, params = jaxport.convert(positives, X)
  np.testing.assert_allclose(jax_fn(params, X)[0], _deep(X[X > 0]), rtol=1e-6)
  np.testing.assert_allclose(jax_fn(params, -X)[0], _deep(-X[-X > 0]), rtol=1e-6)   # op by op again
  assert len(jax_fn._op_by_op) == 1   # pylint: disable=protected-access - one failed trace, remembered


def test_random_ops_draw_the_same_under_the_eager_jit():
  @tf.function
  def noisy(x):
    return _deep(x + tf.random.normal(tf.shape(x)))

  jax_fn, params = jaxport.convert(noisy, X)
  key = jax.random.key(3)
  out = jax_fn(params, X, rng=key)[0]
  with jaxport.override_config("eager_jit", False):
    np.testing.assert_allclose(jax_fn(params, X, rng=key)[0], out, rtol=1e-6)
  with pytest.raises(jaxport.errors.MissingInputError, match="PRNG key"):
    jax_fn(params, X)


def test_calls_inside_transformations_are_staged_as_before():
  jax_fn, params = jaxport.convert(tf.function(lambda x: tf.reduce_sum(_deep(x))), X)
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.reduce_sum(_deep(x))
  np.testing.assert_allclose(jax.grad(lambda v: jax_fn(params, v)[0])(X), tape.gradient(y, x), rtol=1e-5,
                             atol=1e-12)
  xs = np.stack([X, X * 0.5])
  np.testing.assert_allclose(jax.vmap(lambda v: jax_fn(params, v)[0])(xs), [np.sum(_deep(v)) for v in xs],
                             rtol=1e-5)
  assert _compiles(jax_fn) == 0   # grad and vmap trace the graph themselves
