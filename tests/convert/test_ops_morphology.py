"""Morphology ops against TF: MaxPoolWithArgmax and its gradient ops, Dilation2D (erosion) and its backprops."""

import warnings

import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert.host_callback import HostCallbackWarning
from jaxport.errors import InvalidNodeError
from oracle import assert_close, check, run_rule, through_artifact

RAW = tf.raw_ops


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


def ties(*shape, seed=0, dtype=np.float32, levels=3):
  """Few distinct values: most windows hold their maximum more than once."""
  return np.random.RandomState(seed).randint(0, levels, size=shape).astype(dtype)


def pool_attrs(ksize, strides, padding, include_batch=False):
  return dict(ksize=[1, *ksize, 1], strides=[1, *strides, 1], padding=padding,
              include_batch_in_index=include_batch)


# --------------------------------------------------------------------------- MaxPoolWithArgmax

# input shape, ksize, strides, padding, include_batch_in_index, input values
POOL_CASES = {
    "same_2x2_s2_odd": ((2, 5, 7, 3), (2, 2), (2, 2), "SAME", False, normal),
    "same_3x3_s2_ties": ((1, 6, 6, 2), (3, 3), (2, 2), "SAME", True, ties),
    "valid_3x2_s1": ((2, 5, 4, 1), (3, 2), (1, 1), "VALID", True, normal),
    "valid_overlap_s12_ties": ((2, 7, 6, 2), (3, 3), (1, 2), "VALID", False, ties),
    "same_window_larger_than_image": ((1, 3, 2, 2), (5, 4), (1, 3), "SAME", False, normal),
}


@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool_with_argmax(case):
  """With ties, TF's argmax is the first maximum in row-major window order, and so is the gradient's tap."""
  shape, ksize, strides, padding, include_batch, values = POOL_CASES[case]
  attrs = pool_attrs(ksize, strides, padding, include_batch)
  check(lambda x: RAW.MaxPoolWithArgmax(input=x, **attrs), values(*shape), atol=1e-6, vmap=case.startswith("same"))


def test_max_pool_with_argmax_nan_and_inf():
  """A NaN at a window's first in-image tap wins (output NaN, argmax there); a later NaN never does."""
  x = normal(2, 6, 5, 2)
  x[0, 0, 0, 0] = x[0, 3, 3, 1] = x[1, 2, 1, 0] = np.nan   # first taps, and a later tap
  x[1, 4:, :, 1] = -np.inf
  x[0, 1, 1, 0] = np.inf
  check(lambda x: tf.nn.max_pool_with_argmax(x, 2, 2, "SAME", include_batch_in_index=True), x, atol=1e-6,
        vmap=False)


def test_max_pool_with_argmax_signed_zeros():
  x = np.zeros((1, 4, 4, 1), np.float32)
  x[0, ::2, ::2] = -0.0   # each window's first tap is -0.0: TF keeps it (0.0 is not greater)
  pool = lambda x: tf.nn.max_pool_with_argmax(x, 2, 2, "VALID").output
  fn, params = jaxport.convert(pool, x)
  expected = np.signbit(tf.function(pool)(x).numpy())
  assert expected.all()
  for run in (fn, jax.jit(fn)):
    np.testing.assert_array_equal(np.signbit(run(params, x)[0]), expected)


@pytest.mark.parametrize("dtype, targmax", [(np.float64, tf.int64), (np.float16, tf.int32), (np.int64, tf.int64),
                                            (np.uint8, tf.int32)])
def test_max_pool_with_argmax_dtypes(dtype, targmax):
  x = ties(2, 5, 6, 3, dtype=dtype, levels=4) if np.dtype(dtype).kind in "iu" else normal(2, 5, 6, 3, dtype=dtype)
  with jax.enable_x64(np.dtype(dtype).itemsize == 8):   # 64-bit values and argmax as TF's
    # TF's MaxPoolGradWithArgmax has kernels for int64 argmax only
    check(lambda x: RAW.MaxPoolWithArgmax(input=x, Targmax=targmax, **pool_attrs((3, 2), (2, 2), "SAME")), x,
          atol=1e-6, grad=targmax == tf.int64, grad_atol=1e-2, vmap=False)


def test_max_pool_with_argmax_depth_window_pools_rows_and_columns_only():
  """TF accepts a depth window equal to the depth stride, then pools over rows and columns with a 1x1 window
  (its gradient kernel then expects another shape: TF cannot differentiate this)."""
  x = normal(1, 5, 6, 4)
  check(lambda x: RAW.MaxPoolWithArgmax(input=x, ksize=[1, 1, 1, 2], strides=[1, 2, 2, 2], padding="VALID"), x,
        grad=False, vmap=False)


@pytest.mark.parametrize("ksize, strides, match", [
    ([2, 2, 2, 1], [1, 1, 1, 1], "batch dimension"),
    ([1, 2, 2, 1], [2, 1, 1, 1], "batch dimension"),
    ([1, 2, 2, 2], [1, 1, 1, 2], "exactly one of pooling across depth"),
    ([1, 1, 1, 3], [1, 1, 1, 3], "evenly divide the input depth"),
    ([1, 1, 1, 2], [1, 1, 1, 1], "equal the depth stride"),
    ([1, 6, 2, 1], [1, 1, 1, 1], "output size would be negative"),
    ([1, 2, 2, 1], [1, 0, 1, 1], "Stride must be > 0"),
])
def test_max_pool_with_argmax_refuses_what_tf_refuses(ksize, strides, match):
  with pytest.raises(InvalidNodeError, match=match):
    run_rule("MaxPoolWithArgmax", normal(1, 4, 4, 4), ksize=ksize, strides=strides, padding="VALID")


def test_morphology_ops_run_natively():
  """No host callback into TF: each op has a native rule, eager and under jit."""
  x, f = normal(2, 5, 7, 3), normal(2, 2, 3, seed=1)
  fn = lambda x, f: (tf.nn.max_pool_with_argmax(x, 2, 2, "SAME"),
                     tf.nn.dilation2d(x, f, [1] * 4, "SAME", "NHWC", [1] * 4))
  with warnings.catch_warnings():
    warnings.simplefilter("error", HostCallbackWarning)
    converted, params = jaxport.convert(tf.function(fn), x, f)
    converted(params, x, f)
    jax.jit(converted)(params, x, f)


# --------------------------------------------------------------------------- MaxPoolGradWithArgmax


def _tf_argmax(x, attrs):
  return RAW.MaxPoolWithArgmax(input=x, **attrs).argmax.numpy()


@pytest.mark.parametrize("case", ["same_3x3_s2_ties", "valid_overlap_s12_ties"])
def test_max_pool_grad_with_argmax_raw(case):
  """Overlapping windows with ties: several outputs share an argmax, and their gradients add up."""
  shape, ksize, strides, padding, include_batch, values = POOL_CASES[case]
  attrs = pool_attrs(ksize, strides, padding, include_batch)
  x = values(*shape)
  argmax = _tf_argmax(x, attrs)
  g = normal(*argmax.shape, seed=1)
  # no gradient check: TF's second derivative (MaxPoolGradGradWithArgmax) has no CPU kernel
  check(lambda x, g, a: RAW.MaxPoolGradWithArgmax(input=x, grad=g, argmax=a, **attrs), x, g, argmax,
        grad=False, atol=1e-6, vmap=include_batch)


def test_max_pool_grad_with_argmax_from_a_tf_gradient():
  def fn(x, g):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y, _ = tf.nn.max_pool_with_argmax(x, 3, [1, 2], "VALID")
    return tape.gradient(y, x, output_gradients=g)

  x = ties(2, 7, 6, 2, levels=5)
  g = normal(*tf.nn.max_pool_with_argmax(x, 3, [1, 2], "VALID").output.shape, seed=1)
  jax_fn = check(fn, x, g, grad=False, atol=1e-6)
  assert "MaxPoolGradWithArgmax" in jax_fn.op_types


def test_max_pool_grad_with_argmax_depth_window_takes_tf_shapes():
  """With a depth window TF's kernel wants grad and argmax shaped (batch, height, width, depth / window)."""
  x, g = normal(1, 5, 6, 4), normal(1, 5, 6, 2, seed=1)
  argmax = np.random.RandomState(2).randint(0, x.size, size=g.shape)
  attrs = dict(ksize=[1, 1, 1, 2], strides=[1, 2, 2, 2], padding="VALID")
  check(lambda x, g, a: RAW.MaxPoolGradWithArgmax(input=x, grad=g, argmax=a, **attrs), x, g, argmax,
        grad=False, vmap=False)
  with pytest.raises(InvalidNodeError, match=r"Expected grad shape to be \[1, 5, 6, 2\]"):
    run_rule("MaxPoolGradWithArgmax", x, normal(1, 3, 3, 4), argmax, **attrs)


def test_max_pool_grad_with_argmax_refuses_an_index_out_of_range():
  x, g = normal(1, 2, 2, 1), normal(1, 1, 1, 1)
  attrs = pool_attrs((2, 2), (2, 2), "VALID")
  for op in ("MaxPoolGradWithArgmax", "MaxPoolGradGradWithArgmax"):
    grad = g if op == "MaxPoolGradWithArgmax" else x
    with pytest.raises(InvalidNodeError, match=r"\[0, 4\)"):   # TF's kernel aborts the process here
      run_rule(op, x, grad, np.array([7]).reshape(1, 1, 1, 1), **attrs)


# --------------------------------------------------------------------------- MaxPoolGradGradWithArgmax


@pytest.mark.parametrize("include_batch", [False, True])
def test_max_pool_grad_grad_with_argmax(include_batch):
  """TF has no CPU kernel for MaxPoolGradGradWithArgmax (and no gradient that emits it), so the reference is
  TF's gather of the gradient at the argmax positions, which its GPU kernel computes."""
  attrs = pool_attrs((3, 3), (1, 2), "VALID", include_batch)
  x, g = ties(2, 7, 6, 2), normal(2, 7, 6, 2, seed=2)

  def grad_grad(x, g):
    return RAW.MaxPoolGradGradWithArgmax(input=x, grad=g, argmax=RAW.MaxPoolWithArgmax(input=x, **attrs).argmax,
                                         **attrs)

  argmax = _tf_argmax(x, attrs)
  flat = argmax if include_batch else argmax + np.arange(2).reshape(-1, 1, 1, 1) * (x.size // 2)
  expected = tf.gather(tf.reshape(g, [-1]), flat).numpy()
  fn, params = jaxport.convert(grad_grad, x, g)
  assert_close(fn(params, x, g)[0], expected, 0, 0, "eager")
  assert_close(jax.jit(lambda *a: fn(params, *a)[0])(x, g), expected, 0, 0, "jit")
  # the converted MaxPoolGradWithArgmax differentiates into the same gather
  scatter_fn = lambda x, g: RAW.MaxPoolGradWithArgmax(input=x, grad=g, argmax=argmax, **attrs)
  scatter, params = jaxport.convert(scatter_fn, x, expected)
  _, pullback = jax.vjp(lambda dy: scatter(params, x, dy)[0], expected)
  assert_close(pullback(g)[0], expected, 0, 0, "vjp")


# --------------------------------------------------------------------------- Dilation2D

# input shape, filter rows and columns, strides, rates, padding, input values
DILATION_CASES = {
    "same": ((2, 5, 6, 3), (3, 3), (1, 1), (1, 1), "SAME", normal),
    "valid_strided_odd_ties": ((1, 7, 8, 2), (2, 3), (2, 3), (1, 1), "VALID", ties),
    "same_rates_ties": ((2, 7, 6, 2), (3, 2), (1, 2), (2, 3), "SAME", ties),
    "valid_rates_strides": ((1, 9, 8, 1), (2, 2), (2, 1), (3, 2), "VALID", normal),
    # windows entirely outside the image: TF outputs the lowest float, its gradient goes to default taps
    "same_padding_only_windows": ((1, 2, 3, 2), (2, 1), (1, 1), (3, 1), "SAME", normal),
}


def dilation(x, f, strides, rates, padding):
  return RAW.Dilation2D(input=x, filter=f, strides=[1, *strides, 1], rates=[1, *rates, 1], padding=padding)


def dilation_case(case, levels=2):
  shape, window, strides, rates, padding, values = DILATION_CASES[case]
  return values(*shape), values(*window, shape[3], seed=1, **({"levels": levels} if values is ties else {})), \
      (strides, rates, padding)


@pytest.mark.parametrize("case", DILATION_CASES)
def test_dilation2d(case):
  """With ties (repeated sums), TF's gradient goes to the first maximum in row-major filter order."""
  x, f, attrs = dilation_case(case)
  check(lambda x, f: dilation(x, f, *attrs), x, f, atol=1e-6, vmap=case.startswith("same"))


def test_dilation2d_nan_and_inf():
  """NaN sums never win; a window of only -inf or NaN gives the lowest finite float (TF starts its scan there)."""
  x, f = normal(2, 6, 5, 2), normal(2, 2, 2, seed=1)
  x[0, :3, :3, 0] = -np.inf
  x[1, 1:4, 1:4, 1] = np.nan
  x[1, 4, 4, 0] = np.nan
  x[0, 5, :, 1] = np.inf
  check(lambda x, f: dilation(x, f, (1, 1), (1, 1), "SAME"), x, f, atol=1e-6, vmap=False)


def test_dilation2d_gradient_survives_export():
  """`jax.export` drops custom_jvp rules: a loaded artifact still sends the gradient of a window with no sum
  above the lowest float to TF's default taps."""
  x, f = normal(1, 4, 4, 1), normal(2, 2, 1, seed=1)
  x[0, :3, :3, 0] = -np.inf
  fn = lambda x, f: dilation(x, f, (1, 1), (1, 1), "SAME")
  loaded, params = through_artifact(*jaxport.convert(fn, x, f), (x, f))
  grads = jax.grad(lambda x, f: loaded(params, x, f)[0].sum(), (0, 1))(x, f)
  xs, fs = tf.constant(x), tf.constant(f)
  with tf.GradientTape() as tape:
    tape.watch([xs, fs])
    y = tf.reduce_sum(fn(xs, fs))
  assert_close(grads, tape.gradient(y, [xs, fs]), 0, 0, "grad")


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32, np.uint8])
def test_dilation2d_dtypes(dtype):
  if np.dtype(dtype).kind in "iu":   # sums that wrap around, as TF's do
    x, f = ties(2, 5, 6, 2, dtype=dtype, levels=200), ties(3, 2, 2, seed=1, dtype=dtype, levels=100)
  else:
    x, f = normal(2, 5, 6, 2, dtype=dtype), normal(3, 2, 2, seed=1, dtype=dtype)
  with jax.enable_x64(dtype == np.float64):
    check(lambda x, f: dilation(x, f, (2, 1), (1, 2), "SAME"), x, f, atol=1e-6, grad_atol=1e-2, vmap=False)


def test_erosion2d():
  x, f = ties(2, 6, 7, 2, levels=4), normal(3, 2, 2, seed=1)
  check(lambda x, f: tf.nn.erosion2d(x, f, [1, 2, 1, 1], "SAME", "NHWC", [1, 1, 2, 1]), x, f, atol=1e-6,
        vmap=False)


@pytest.mark.parametrize("attrs, filter_shape, match", [
    (dict(strides=[2, 1, 1, 1], rates=[1, 1, 1, 1]), (2, 2, 2), "Stride is only supported across spatial"),
    (dict(strides=[1, 1, 1, 1], rates=[1, 1, 1, 2]), (2, 2, 2), "Rate is only supported across spatial"),
    (dict(strides=[1, 0, 1, 1], rates=[1, 1, 1, 1]), (2, 2, 2), "Stride must be > 0"),
    (dict(strides=[1, 1, 1, 1], rates=[1, 1, 1, 1]), (2, 2, 3), "same depth: 2 vs 3"),
    (dict(strides=[1, 1, 1, 1], rates=[1, 1, 1, 1]), (5, 2, 2), "output size would be negative"),
])
def test_dilation2d_refuses_what_tf_refuses(attrs, filter_shape, match):
  with pytest.raises(InvalidNodeError, match=match):
    run_rule("Dilation2D", normal(1, 3, 3, 2), normal(*filter_shape), padding="VALID", **attrs)


# --------------------------------------------------------------------------- Dilation2D backprops


@pytest.mark.parametrize("case", ["same", "same_rates_ties", "same_padding_only_windows"])
def test_dilation2d_backprops_raw(case):
  x, f, (strides, rates, padding) = dilation_case(case)
  if case == "same":
    x[0, :3, :3, 0] = -np.inf   # windows with no sum above the lowest float: TF's default taps
  g = normal(*dilation(x, f, strides, rates, padding).shape, seed=2)
  attrs = dict(strides=[1, *strides, 1], rates=[1, *rates, 1], padding=padding)
  # no gradient check: TF has no gradient for the backprops
  check(lambda x, f, g: (RAW.Dilation2DBackpropInput(input=x, filter=f, out_backprop=g, **attrs),
                         RAW.Dilation2DBackpropFilter(input=x, filter=f, out_backprop=g, **attrs)),
        x, f, g, grad=False, atol=1e-5, vmap=case == "same")


def test_dilation2d_backprops_from_a_tf_gradient():
  x, f, attrs = dilation_case("valid_strided_odd_ties", levels=4)

  def fn(x, f, g):
    with tf.GradientTape() as tape:
      tape.watch([x, f])
      y = dilation(x, f, *attrs)
    return tape.gradient(y, [x, f], output_gradients=g)

  g = normal(*dilation(x, f, *attrs).shape, seed=2)
  jax_fn = check(fn, x, f, g, grad=False, atol=1e-5)
  assert {"Dilation2DBackpropInput", "Dilation2DBackpropFilter"} <= jax_fn.op_types


def test_dilation2d_backprop_refuses_a_mismatched_out_backprop():
  for op in ("Dilation2DBackpropInput", "Dilation2DBackpropFilter"):
    with pytest.raises(InvalidNodeError, match="out_backprop has incompatible size"):
      run_rule(op, normal(1, 3, 3, 2), normal(2, 2, 2), normal(1, 3, 2, 2),
               strides=[1, 1, 1, 1], rates=[1, 1, 1, 1], padding="SAME")
