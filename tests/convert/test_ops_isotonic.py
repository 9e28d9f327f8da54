"""IsotonicRegression against TF (it ran in TF through a host callback before): fits and segments
bit for bit, ties and integer inputs included, under jit and vmap, and TF's gradient."""
import jax
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from oracle import check, run_rule, through_artifact

raw = tf.raw_ops
rs = np.random.RandomState(0)


@pytest.mark.parametrize("decreasing", [True, False])
def test_isotonic_regression(decreasing):
  """Rows of 2-D inputs with TF's gradient; 3-D inputs (and an axis other than the last) without:
  TF's gradient of a rank-3 input fails its own shape check."""
  x = rs.normal(size=(4, 9)).astype(np.float32)
  check(lambda x: tf.nn.isotonic_regression(x, decreasing=decreasing), x, atol=0, rtol=0, grad_atol=1e-6)
  x = rs.normal(size=(3, 2, 9)).astype(np.float32)
  check(lambda x: tf.nn.isotonic_regression(x, decreasing=decreasing), x, atol=0, rtol=0, grad=False)
  check(lambda x: tf.nn.isotonic_regression(x, decreasing=decreasing, axis=0)[0], x, atol=0, rtol=0, grad=False)


def test_isotonic_regression_ties_runs_and_integers():
  ties = np.array([[1, 1, 1, 2, 2, 0, 5, 5, -1], [3, 2, 1, 0, 0, 0, 1, 2, 3]], np.float32)
  check(lambda x: tf.nn.isotonic_regression(x), ties, atol=0, rtol=0)
  check(lambda x: raw.IsotonicRegression(input=x), ties.astype(np.int16), atol=0, rtol=0)   # float32 out
  with jax.enable_x64(True):
    check(lambda x: raw.IsotonicRegression(input=x, output_dtype=tf.float64), ties.astype(np.float64), atol=0,
          rtol=0)


def test_isotonic_regression_empty_and_single():
  for shape in [(2, 0), (0, 3), (4, 1)]:
    x = rs.normal(size=shape).astype(np.float32)
    expected = raw.IsotonicRegression(input=x)
    out, segments = run_rule("IsotonicRegression", x, output_dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(out), expected.output.numpy())
    np.testing.assert_array_equal(np.asarray(segments), expected.segments.numpy())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]) | st.floats(-3, 3, width=32), min_size=12, max_size=12))
def test_any_row_fits_as_tf(values):
  x = np.array(values, np.float32).reshape(2, 6)
  expected = raw.IsotonicRegression(input=x)
  out, segments = run_rule("IsotonicRegression", x, output_dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(out), expected.output.numpy())
  np.testing.assert_array_equal(np.asarray(segments), expected.segments.numpy())


def test_isotonic_regression_gradient_survives_export():
  """The derivative is marked for export: the loaded artifact's gradient is TF's, not a failure to
  differentiate the loops."""
  x = rs.normal(size=(3, 7)).astype(np.float32)
  weights = rs.normal(size=(3, 7)).astype(np.float32)
  fn = lambda x: tf.nn.isotonic_regression(x)[0]  # noqa: E731
  jax_fn, params = jaxport.convert(fn, x)
  loaded, loaded_params = through_artifact(jax_fn, params, (x,))
  grad = jax.grad(lambda v: (loaded(loaded_params, v)[0] * weights).sum())(x)
  xt = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(xt)
    loss = tf.reduce_sum(fn(xt) * weights)
  np.testing.assert_allclose(np.asarray(grad), tape.gradient(loss, xt).numpy(), rtol=1e-6, atol=1e-7)
