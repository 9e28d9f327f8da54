"""16-bit floats round where TF's CPU kernels round: bit for bit against TF, eager and under jit.

- `Sum` of bfloat16 accumulates in float32 and rounds once; so do `AvgPool` of bfloat16 and
  `Softmax` of both 16-bit types (bfloat16 within an ulp: XLA's float32 exp is not Eigen's).
- `Cumsum`/`Cumprod` of 16-bit floats add one element after another, rounding each partial result.
- A `Cast` from a 16-bit float keeps the rounding of the op before it: XLA would fold the widening
  convert into a bfloat16 dot or reduction and compute that in float32, and XLA:CPU's YNNPACK
  fusions would sum a widened bfloat16 in bfloat16 (`Mean`, batch norm's moments).

Where TF's kernel accumulates in the 16-bit type itself in Eigen's tree order (float16 `Sum`/`Mean`,
bfloat16 `BiasAddGrad`/`L2Loss`), jaxport accumulates in float32: within a few ulps, not bit for bit.
"""
import jax
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport

HALF = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def _converted_and_tf(fn, x):
  tf_fn = tf.function(fn)
  jax_fn, params = jaxport.convert(tf_fn, x)
  expected = tf.cast(tf_fn(x), tf.float32).numpy()
  eager = np.asarray(jax_fn(params, x)[0], np.float32)
  jitted = np.asarray(jax.jit(jax_fn)(params, x)[0], np.float32)
  return expected, eager, jitted


def _ulps(actual, expected, dtype) -> float:
  eps = float(ml_dtypes.finfo(dtype).eps)
  scale = 2.0 ** np.floor(np.log2(np.maximum(np.abs(expected.astype(np.float64)), 1e-30)))
  return float(np.max(np.abs(actual.astype(np.float64) - expected) / (scale * eps), initial=0))


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), op=st.sampled_from(["sum", "mean"]),
       data=st.data())
def test_bfloat16_sum_and_mean_round_once_like_tf(shape, op, data):
  axes = data.draw(st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True))
  x = np.random.RandomState(len(shape)).normal(0.3, 2.0, size=[n * 8 for n in shape]).astype(np.float32)
  reduce = getattr(tf, f"reduce_{op}")
  expected, eager, jitted = _converted_and_tf(lambda x: reduce(tf.cast(x, tf.bfloat16), axes), x)
  np.testing.assert_array_equal(eager, expected)
  np.testing.assert_array_equal(jitted, expected)


def test_bfloat16_average_pool_rounds_once_like_tf():
  x = np.random.RandomState(0).normal(0.3, 1.0, size=(2, 11, 9, 3)).astype(np.float32)
  for padding in ("VALID", "SAME"):
    pool = lambda x, padding=padding: tf.nn.avg_pool2d(tf.cast(x, tf.bfloat16), 3, 2, padding)  # noqa: E731
    expected, eager, jitted = _converted_and_tf(pool, x)
    np.testing.assert_array_equal(eager, expected)
    np.testing.assert_array_equal(jitted, expected)


@pytest.mark.parametrize("dtype", list(HALF))
def test_softmax_computes_in_float32_like_tf(dtype):
  """TF's float16 softmax depends on the CPU: on some it computes in float32 and rounds once, on
  others (seen: AMD EPYC with AVX-512 but no AVX512-FP16) Eigen's half packets round every step,
  up to ~5e-4 off. jaxport rounds once: bit for bit with TF's kernel where that rounds once, else
  with TF's float32 softmax rounded to float16, and never further from the exact softmax than TF."""
  x = np.random.RandomState(1).normal(0.3, 3.0, size=(16, 300)).astype(np.float32)
  expected, eager, jitted = _converted_and_tf(lambda x: tf.nn.softmax(tf.cast(x, dtype)), x)
  rounded_once = tf.cast(tf.nn.softmax(tf.cast(tf.cast(x, dtype), tf.float32)), dtype)
  rounded_once = tf.cast(rounded_once, tf.float32).numpy()
  if dtype == "float16" and not np.array_equal(expected, rounded_once):   # TF rounds every step here
    exact = tf.nn.softmax(tf.cast(tf.cast(x, dtype), tf.float64)).numpy()
    assert np.abs(jitted - exact).max() <= np.abs(expected - exact).max()
    expected = rounded_once
  bound = 0 if dtype == "float16" else 1
  assert _ulps(eager, expected, HALF[dtype]) <= bound and _ulps(jitted, expected, HALF[dtype]) <= bound
  assert np.mean(jitted != expected) < 0.01


@pytest.mark.parametrize("dtype", list(HALF))
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
@pytest.mark.parametrize("exclusive, reverse", [(False, False), (True, False), (False, True), (True, True)])
def test_cumulative_ops_round_each_step_like_tf(dtype, op, exclusive, reverse):
  rs = np.random.RandomState(2)
  x = (rs.normal(0.3, 1.0, size=(400, 3)) if op == "cumsum" else rs.uniform(0.97, 1.03, size=(400, 3)))
  x = x.astype(np.float32)
  fn = lambda x: getattr(tf.math, op)(tf.cast(x, dtype), axis=0, exclusive=exclusive, reverse=reverse)  # noqa: E731
  expected, eager, jitted = _converted_and_tf(fn, x)
  np.testing.assert_array_equal(eager, expected)
  np.testing.assert_array_equal(jitted, expected)


@pytest.mark.parametrize("dtype", list(HALF))
def test_cumsum_gradient_matches_tf(dtype):
  """TF's gradient of Cumsum is a reverse Cumsum of the incoming gradient, rounded step by step."""
  x = np.random.RandomState(3).normal(size=(300, 2)).astype(np.float32)
  weights = np.random.RandomState(4).normal(size=(300, 2)).astype(HALF[dtype])

  def loss(x):
    return tf.reduce_sum(tf.cast(tf.cumsum(x, axis=0) * weights, tf.float32))

  x_half = tf.constant(x.astype(HALF[dtype]))
  with tf.GradientTape() as tape:
    tape.watch(x_half)
    value = loss(x_half)
  expected = tf.cast(tape.gradient(value, x_half), tf.float32).numpy()
  jax_fn, params = jaxport.convert(tf.function(loss), x_half)
  got = jax.jit(jax.grad(lambda x: jax_fn(params, x)[0]))(x.astype(HALF[dtype]))
  np.testing.assert_array_equal(np.asarray(got, np.float32), expected)


@pytest.mark.parametrize("dtype", list(HALF))
def test_a_widening_cast_keeps_the_rounding_of_the_op_before_it(dtype):
  """A 16-bit product, sum and batch norm, each cast to float32, as TF rounds them."""
  rs = np.random.RandomState(5)
  x = rs.normal(0.3, 1.0, size=(32, 128)).astype(np.float32)
  w = tf.constant(rs.normal(size=(128, 24)).astype(np.float32))

  def fn(x):
    half = tf.cast(x, dtype)
    product = tf.cast(tf.matmul(half, tf.cast(w, dtype)), tf.float32)
    total = tf.cast(tf.reduce_sum(half, 0), tf.float32)
    normed = tf.compat.v1.nn.fused_batch_norm(tf.reshape(half, [4, 8, 8, 16]), tf.ones([16]), tf.zeros([16]),
                                              is_training=True)[0]
    return tf.concat([tf.reshape(product, [-1]), total, tf.reshape(tf.cast(normed, tf.float32), [-1])], 0)

  expected, eager, jitted = _converted_and_tf(fn, x)
  products, sums = 32 * 24, 128
  for got in (eager, jitted):
    np.testing.assert_array_equal(got[:products], expected[:products])
    if dtype == "bfloat16":   # float16 sums: TF's Eigen tree in float16 (module docstring)
      np.testing.assert_array_equal(got[products:products + sums], expected[products:products + sums])
    assert _ulps(got[products + sums:], expected[products + sums:], HALF[dtype]) <= 1
