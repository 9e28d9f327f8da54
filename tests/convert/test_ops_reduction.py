"""Reductions, arg-reductions and cumulative ops against TF."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
nan, inf = np.nan, np.inf
rs = np.random.RandomState(0)
X = rs.uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32) * np.sign(rs.normal(size=(2, 3, 4))).astype(np.float32)


def assert_exact(actual, expected):
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
  np.testing.assert_array_equal(actual, expected)


def reduce_fn(op, axis, keep_dims):
  return lambda x: getattr(raw, op)(input=x, axis=axis, keep_dims=keep_dims)


# --------------------------------------------------------------------------- reductions

AXES = [(-1, True), ([0, 2], False), ([-3, 1], True), ([], False), ([0, 1, 2], False)]


@pytest.mark.parametrize("op", ["Sum", "Prod", "Mean", "Max", "Min", "EuclideanNorm"])
@pytest.mark.parametrize("axis,keep_dims", AXES, ids=[f"{a}-{k}" for a, k in AXES])
def test_reductions(op, axis, keep_dims):
  check(reduce_fn(op, axis, keep_dims), X, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["Sum", "Prod", "Mean", "Max", "Min", "EuclideanNorm", "All", "Any"])
def test_reductions_of_constants_stay_numpy(op):
  x = (X > 0) if op in ("All", "Any") else X
  for axis, keep_dims in AXES:
    folded = run_rule(op, x, np.asarray(axis, np.int32), keep_dims=keep_dims)
    assert type(folded) is np.ndarray
    expected = reduce_fn(op, axis, keep_dims)(x).numpy()
    assert_close(folded, expected, 1e-5, 1e-5)
    assert folded.dtype == expected.dtype


def test_reduce_prod_of_shape_is_a_static_reshape_target():
  check(lambda x: tf.reshape(x, [tf.reduce_prod(tf.shape(x)[1:]), -1]), X)


@pytest.mark.parametrize("op", ["All", "Any"])
def test_boolean_reductions(op):
  b = np.array([[True, False, True], [True, True, True]])
  for axis, keep_dims in [(0, False), (-1, True), ([], False), ([0, 1], False)]:
    check(reduce_fn(op, axis, keep_dims), b)


def test_max_min_gradients_split_ties_equally():
  x = np.array([[2., 2., 1.], [3., -1., 3.]], np.float32)
  for op in ("Max", "Min"):
    check(reduce_fn(op, 1, False), x, vmap=False)
    check(reduce_fn(op, [0, 1], False), x, vmap=False)


def test_prod_gradient_with_a_zero():
  check(reduce_fn("Prod", -1, False), np.array([[2., 0., 3.], [1., 2., 4.]], np.float32), vmap=False)


def test_nan_propagates_through_max_min():
  x = np.array([[1., nan, 2.], [nan, 0., -1.]], np.float32)
  for op in ("Max", "Min"):
    check(reduce_fn(op, 1, False), x, grad=False, vmap=False)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.float16, ml_dtypes.bfloat16])
def test_reductions_keep_the_dtype(dtype):
  x = np.array([[100, 100, 100, 1], [-100, -100, -100, 2]]).astype(dtype) if dtype != np.uint8 else \
      np.array([[200, 200, 100, 1], [0, 255, 255, 2]], dtype)
  for op in ("Sum", "Prod", "Mean", "Max", "Min"):
    fn = reduce_fn(op, 1, False)
    expected = fn(x).numpy()
    tol = 1e-2 if np.dtype(dtype).kind not in "iu" else 0
    for got in (jaxport.convert_functional(fn, x)(x), run_rule(op, x, np.int32(1))):
      assert np.asarray(got).dtype == expected.dtype, (op, got.dtype)
      np.testing.assert_allclose(np.asarray(got, np.float64), expected.astype(np.float64), rtol=tol)


def test_integer_sum_wraps_and_mean_truncates_toward_zero():
  x = np.array([[-3, -4, 0], [7, 2, -1], [2**30, 2**30, 2**30]], np.int32)
  for op in ("Sum", "Mean"):
    check(reduce_fn(op, 1, False), x)
    check(reduce_fn(op, [0, 1], False), x)
  small = np.array([[-100, -100, -100, 1], [127, 127, 127, 126]], np.int8)
  check(reduce_fn("Mean", 1, False), small)


@pytest.mark.parametrize("n", [50000, 7])
def test_integer_mean_without_overflow(n):
  """TF accumulates wider; values near the limits must not wrap (exact up to 46340 elements
  per output when JAX's x64 is off, and always with it)."""
  x = np.full((n,), 2**31 - 5, np.int32)
  x[::2] = -(2**31) + 3
  x[:3] = [2**31 - 1, -(2**31), 17]
  fn = reduce_fn("Mean", 0, False)
  expected = fn(x).numpy()
  assert_exact(run_rule("Mean", x, np.int32(0)), expected)
  if n <= 46340:
    assert_exact(jaxport.convert_functional(fn, x)(x), expected)
  with jax.enable_x64(True):
    assert_exact(jaxport.convert_functional(fn, x)(x), expected)


def test_empty_reductions():
  for x in (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int32), np.zeros((2, 0), np.uint8)):
    for op in ("Sum", "Prod", "Mean", "Max", "Min"):
      fn = reduce_fn(op, [0, 1], False)
      expected = fn(x).numpy()
      assert_exact(jaxport.convert_functional(fn, x)(x), expected)
      assert_exact(run_rule(op, x, np.asarray([0, 1])), expected)


def test_empty_min_of_unsigned_without_x64():
  # Regression (fuzz): the initial value uint32/uint64 max was a Python int, which overflowed int32.
  for dtype in (np.uint32, np.uint64):
    x = np.zeros((2, 0), dtype)
    fn = reduce_fn("Min", [1], False)
    expected = fn(x).numpy()
    got = np.asarray(jaxport.convert_functional(fn, x)(x))
    np.testing.assert_array_equal(got, expected.astype(got.dtype))


def test_complex_reductions():
  z = (X + 1j * X[::-1]).astype(np.complex64)
  for op in ("Sum", "Prod", "Mean", "EuclideanNorm"):
    fn = reduce_fn(op, [0, 2], False)
    expected = fn(z).numpy()
    for got in (jaxport.convert_functional(fn, z)(z), run_rule(op, z, np.asarray([0, 2]))):
      assert np.asarray(got).dtype == expected.dtype
      np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)


def test_integer_euclidean_norm_truncates():
  check(reduce_fn("EuclideanNorm", 1, False), np.array([[3, 4, 1], [0, 5, 12]], np.int32))


def test_invalid_axes_raise():
  with pytest.raises(ValueError, match="invalid axes"):
    run_rule("Sum", X, np.asarray([1, -2]))
  with pytest.raises(ValueError, match="invalid axes"):
    run_rule("Sum", X, np.int32(3))
  np.testing.assert_allclose(run_rule("Sum", X, jnp.asarray(1)), X.sum(1), rtol=1e-6)   # eager: concrete
  with pytest.raises(ValueError, match="trace-time constant"):
    jax.jit(lambda a: run_rule("Sum", X, a))(1)


# --------------------------------------------------------------------------- arg-reductions

@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_arg_reductions(op, axis):
  x = np.array([[[3., 1., 3.], [0., 0., -2.]], [[1., 5., 5.], [2., -2., 2.]]], np.float32)   # ties
  check(lambda v: getattr(raw, op)(input=v, dimension=axis, output_type=tf.int32), x)
  ints = (x * 3).astype(np.int32)
  check(lambda v: getattr(raw, op)(input=v, dimension=axis, output_type=tf.int32), ints)


NAN_ROWS = [[nan, 1., 2.], [nan, nan, nan], [1., nan, 2.], [-inf, nan, -inf], [nan, -inf, 5.],
            [3., nan, 2.], [-inf, -inf, nan], [inf, nan, -inf], [nan, -inf, -inf]]


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reductions_skip_nan_like_tf(op):
  x = np.array(NAN_ROWS, np.float32)
  for rows in (x, -x, x.astype(np.float16)):
    fn = lambda v: getattr(raw, op)(input=v, dimension=1, output_type=tf.int32)
    expected = fn(rows).numpy()
    assert_exact(jaxport.convert_functional(fn, rows)(rows), expected)
    assert_exact(run_rule(op, rows, np.int32(1), output_type=np.dtype(np.int32)), expected)


def test_arg_reduction_default_int64_output():
  x = np.array([[1., 4., 2.], [7., 0., 7.]], np.float32)
  fn = lambda v: (tf.argmax(v, axis=1), tf.argmin(v, axis=0))
  with jax.enable_x64(True):
    check(fn, x)
  got = jaxport.convert_functional(fn, x)(x)   # x64 off: the same indices as int32
  for g, e in zip(got, fn(x)):
    np.testing.assert_array_equal(g, e.numpy())
  folded = run_rule("ArgMax", x, np.int64(1), output_type=np.dtype(np.int64))
  assert type(folded) is np.ndarray and folded.dtype == np.int64


def test_arg_reduction_of_bool_and_empty_axis():
  b = np.array([[False, True, True], [False, False, False]])
  check(lambda v: raw.ArgMax(input=v, dimension=1, output_type=tf.int32), b)
  with pytest.raises(ValueError, match="empty"):
    run_rule("ArgMax", np.zeros((2, 0), np.float32), np.int32(1))


# --------------------------------------------------------------------------- cumulative ops

FLAGS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("op", ["Cumsum", "Cumprod", "CumulativeLogsumexp"])
@pytest.mark.parametrize("exclusive,reverse", FLAGS, ids=[f"excl{e}-rev{r}" for e, r in FLAGS])
def test_cumulative(op, exclusive, reverse):
  for axis in (0, -1):
    check(lambda x: getattr(raw, op)(x=x, axis=axis, exclusive=exclusive, reverse=reverse), X,
          atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["Cumsum", "Cumprod"])
@pytest.mark.parametrize("exclusive,reverse", FLAGS, ids=[f"excl{e}-rev{r}" for e, r in FLAGS])
def test_cumulative_of_integer_constants_stays_numpy(op, exclusive, reverse):
  x = np.array([[3, -1, 4, 1], [5, 9, -2, 6]], np.int32)
  fn = lambda v: getattr(raw, op)(x=v, axis=1, exclusive=exclusive, reverse=reverse)
  expected = fn(x).numpy()
  folded = run_rule(op, x, np.int32(1), exclusive=exclusive, reverse=reverse)
  assert type(folded) is np.ndarray
  assert_exact(folded, expected)
  check(fn, x)


def test_cumsum_wraps_in_small_integer_types():
  x = np.array([100, 100, 100, -100], np.int8)
  check(lambda v: tf.cumsum(v), x)
  assert_exact(run_rule("Cumsum", x, np.int32(0)), tf.cumsum(x).numpy())


def test_cumulative_logsumexp_is_stable():
  """exp(1000) overflows float32: a naive log(cumsum(exp(x))) would give inf."""
  x = np.array([[1000., 1001., -1000., 999.], [-1000., -1000., 0., 88.]], np.float32)
  for exclusive, reverse in FLAGS:
    check(lambda v: raw.CumulativeLogsumexp(x=v, axis=1, exclusive=exclusive, reverse=reverse), x,
          rtol=1e-4, vmap=False)   # float32 spacing at 1000 is 6e-5


def test_cumulative_over_an_empty_axis():
  x = np.zeros((2, 0), np.float32)
  for op in ("Cumsum", "Cumprod", "CumulativeLogsumexp"):
    fn = lambda v: getattr(raw, op)(x=v, axis=1, exclusive=True)
    assert jaxport.convert_functional(fn, x)(x).shape == (2, 0)



@pytest.mark.parametrize("axes", [(1,), (0, 2), (0, 1, 2)])
def test_float32_mean_divides_its_sum_like_tf(axes):
  """TF divides a mean's sum by its count; XLA would multiply by the reciprocal (an ulp off on
  ~60% of means). The mean is the converted sum divided by the count, correctly rounded, eagerly
  and under jit (the sums themselves follow XLA's order, not Eigen's: close to TF's, not equal)."""
  x = np.random.RandomState(0).normal(size=(24, 56, 7)).astype(np.float32)
  count = np.float32(np.prod([x.shape[a] for a in axes]))
  mean_fn, params = jaxport.convert(tf.function(lambda x: tf.reduce_mean(x, axes)), x)
  sum_fn, _ = jaxport.convert(tf.function(lambda x: tf.reduce_sum(x, axes)), x)
  for label, run_mean, run_sum in (("eager", mean_fn, sum_fn), ("jit", jax.jit(mean_fn), jax.jit(sum_fn))):
    total = np.asarray(run_sum(params, x)[0])
    np.testing.assert_array_equal(run_mean(params, x)[0], total / count, err_msg=label)
    assert_close(run_mean(params, x)[0], tf.reduce_mean(x, axes).numpy(), 1e-6, 1e-5, label)
