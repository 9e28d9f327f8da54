"""While loops called eagerly (no jit) run through a jax.jit cached per node, so a second call does
not retrace and recompile the loop body; variables, inputs and rng stay arguments, never constants."""
import jax
import numpy as np
import tensorflow as tf

import jaxport
from jaxport.convert.ops import control_flow


def _converted_loop():
  w = tf.Variable(np.float32(1.5))
  counter = tf.Variable(np.float32(0.0))

  @tf.function
  def fn(x, n):
    def body(i, acc):
      counter.assign_add(1.0)
      return i + 1, acc * w + tf.cast(i, tf.float32)
    return tf.while_loop(lambda i, acc: i < n, body, [tf.constant(0), x])[1]
  x, n = np.arange(3, dtype=np.float32), np.int32(4)
  jax_fn, params = jaxport.convert(fn, x, n)
  return fn, jax_fn, params, w, counter


def test_eager_loop_is_compiled_once_and_reads_the_current_params(monkeypatch):
  fn, jax_fn, params, w, _ = _converted_loop()
  traces = []
  real = control_flow._LaxLoop.__call__
  monkeypatch.setattr(control_flow._LaxLoop, "__call__", lambda self, *a: traces.append(1) or real(self, *a))
  key = jax_fn.param_keys[[np.asarray(params[k]).item() for k in jax_fn.param_keys].index(1.5)]
  count_key = next(k for k in jax_fn.param_keys if k != key)
  for weight, x, n in [(1.5, [0., 1., 2.], 4), (0.5, [3., 1., -2.], 4), (2.0, [1., 1., 1.], 6)]:
    x, n = np.asarray(x, np.float32), np.int32(n)
    w.assign(weight)
    out, new_params = jax_fn({**params, key: np.float32(weight)}, x, n)
    np.testing.assert_allclose(np.asarray(out), fn(x, n).numpy(), rtol=1e-6)
    assert float(np.asarray(new_params[count_key])) == float(np.asarray(params[count_key])) + n
  assert len(traces) == 1   # one trace, by the cached jit; later calls (even a new trip count) reuse it


def test_eager_loop_matches_jit():
  _, jax_fn, params, _, _ = _converted_loop()
  x, n = np.arange(3, dtype=np.float32), np.int32(3)
  eager = jax_fn(params, x, n)
  jitted = jax.jit(jax_fn)(params, x, n)
  for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


def test_simulating_a_trip_count_assigns_no_variable():
  """The trip count of `i < 4` is found by running the loop's constant part; the body's assignment
  must not run then too (it did: the counter came out 7 after 4 iterations)."""
  counter = tf.Variable(np.float32(0.0))

  @tf.function
  def fn(x):
    def body(i, acc):
      counter.assign_add(1.0)
      return i + 1, acc * 2.0
    return tf.while_loop(lambda i, acc: i < 4, body, [tf.constant(0), x])[1]
  x = np.arange(3, dtype=np.float32)
  jax_fn, params = jaxport.convert(fn, x)
  counter.assign(0.0)
  expected = fn(x).numpy()
  out, new_params = jax_fn(params, x)
  np.testing.assert_allclose(np.asarray(out), expected)
  (key,) = jax_fn.param_keys
  assert float(np.asarray(new_params[key])) == float(np.asarray(params[key])) + 4 == counter.numpy() + float(
      np.asarray(params[key]))
  grad = jax.grad(lambda x: jax_fn(params, x)[0].sum())(x)
  np.testing.assert_allclose(np.asarray(grad), np.full(3, 16.0))


def test_a_loop_that_runs_in_python_is_not_traced_as_a_lax_loop_again(monkeypatch):
  """A loop whose carry grows each step (a decoder's cache) runs step by step in Python. Its eager
  calls remember that per node and carry shapes: a later call goes straight to the Python loop (the
  failed lax trace was more than half of a warm Model Garden beam-search call); new shapes try again."""
  @tf.function
  def grow(x, n):
    return tf.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, tf.concat([acc, acc[-1:] * 2.0], 0)),
                         [tf.constant(0), x], shape_invariants=[tf.TensorShape([]), tf.TensorShape([None])])[1]
  jax_fn, params = jaxport.convert(grow, tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int32))
  attempts = []
  real = control_flow._eager_loop
  monkeypatch.setattr(control_flow, "_eager_loop", lambda *a: attempts.append(1) or real(*a))
  for x, n, tried in [([1.0], 3, True), ([2.0], 5, False), ([1.0, 3.0], 2, True)]:
    x, n = np.asarray(x, np.float32), np.int32(n)
    before = len(attempts)
    out, _ = jax_fn(params, x, n)
    np.testing.assert_array_equal(np.asarray(out), grow(x, n).numpy())
    assert (len(attempts) > before) == tried   # the second call reuses the first's finding
