"""TF's stateless gamma, Poisson, binomial and parameterized truncated normal samplers and its shuffle.

Each sampler runs a rejection loop (ops/stateless_samplers.py); these tests compare every branch
of those loops (gamma's exponential, alpha < 1 and >= 1; Poisson's Knuth and Hormann branches and
its infinite rate; binomial inversion and BTRS, p above and below 1/2, its degenerate counts and
probabilities; the truncated normal's normal, uniform and exponential proposals, on TF's shards)
with TF, eagerly and under jit and vmap, for fixed and hypothesis-drawn seeds and parameters:
bit for bit, except the truncated normal's normal proposals (within 2 ulp, TF's glibc logf and
sincosf). Gamma samples carry TF's implicit gradient. StatelessShuffle is TF's Fisher-Yates order.
"""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.convert.ops import stateless_random, stateless_samplers
from jaxport.errors import ShapeMismatchError
from test_ops_stateless_random import assert_within_ulp

RAW = tf.raw_ops
SEEDS = np.array([[3, 7], [0, 0], [2**31 - 1, -2**31], [-5, 123456]], np.int32)
ALPHAS = np.array([0.05, 0.4, 1.0, 2.5, 30.0, 0.0], np.float32)
RATES = np.array([0.0, 0.3, 4.0, 9.999, 10.0, 55.5, 1e5, -1.0, np.inf], np.float32)
COUNTS = np.array([0.0, 5.0, 20.0, 100.0, 100.0, 1e6, 7.5, 12.0, 3.0], np.float32)
PROBS = np.array([0.5, 0.2, 0.7, 0.05, 0.95, 1e-6, 0.4, 1.0, 0.0], np.float32)


def samplers(seed, alpha, rate, counts, probs):
  key, counter, alg = RAW.StatelessRandomGetKeyCounterAlg(seed=seed)
  return (
      RAW.StatelessRandomGammaV2(shape=[40, 6], seed=seed, alpha=alpha),
      RAW.StatelessRandomGammaV3(shape=[3, 2, 6], key=key, counter=counter, alg=alg,
                                 alpha=tf.reshape(alpha, [1, 6])[0]),
      tf.random.stateless_gamma([20, 2, 3], seed, alpha=tf.reshape(alpha, [2, 3])),
      tf.random.stateless_gamma([30, 2], seed, alpha=tf.cast(alpha[1:3], tf.float16), dtype=tf.float16),
      tf.random.stateless_poisson([40, 9], seed, lam=rate),
      tf.random.stateless_poisson([40, 9], seed, lam=rate, dtype=tf.float32),
      tf.random.stateless_poisson([20, 3], seed, lam=tf.cast(rate[1:4], tf.float16), dtype=tf.float16),
      tf.random.stateless_binomial([40, 9], seed, counts=counts, probs=probs),
      tf.random.stateless_binomial([10, 2, 9], seed, counts=counts, probs=tf.stack([probs, 1 - probs]),
                                   output_dtype=tf.float32),
  )


ARGS = (ALPHAS, RATES, COUNTS, PROBS)


def convert(fn, *args):
  jax_fn, params = jaxport.convert(fn, *args)
  assert not jax_fn.requires_rng
  return lambda *a: jax_fn(params, *a)[0]  # noqa: E731


def assert_same(expected, got, label=""):
  got = np.asarray(got)
  assert got.shape == expected.shape and got.dtype == expected.dtype, (label, got.shape, got.dtype, expected.dtype)
  np.testing.assert_array_equal(got, expected, err_msg=label)


@pytest.fixture(scope="module")
def converted():
  return convert(samplers, SEEDS[0], *ARGS)


def test_samplers_match_tf_bit_for_bit_eagerly(converted):
  for seed in SEEDS[:2]:
    expected = samplers(tf.constant(seed), *ARGS)
    for i, (e, g) in enumerate(zip(expected, converted(seed, *ARGS))):
      assert_same(e.numpy(), g, f"output {i}, seed {seed}")


@pytest.mark.slow   # one XLA compile of every sampler's loops
def test_samplers_match_tf_under_jit_and_vmap(converted):
  batched = jax.jit(jax.vmap(converted, in_axes=(0, None, None, None, None)))(SEEDS, *ARGS)
  for row, seed in enumerate(SEEDS):
    expected = samplers(tf.constant(seed), *ARGS)
    for i, (e, g) in enumerate(zip(expected, batched)):
      assert_same(e.numpy(), g[row], f"output {i}, seed {seed}")


def one_of_each(seed, alpha, rate, counts, probs):
  return (tf.random.stateless_gamma([25, 4], seed, alpha=alpha),
          tf.random.stateless_poisson([25, 4], seed, lam=rate, dtype=tf.float32),
          tf.random.stateless_binomial([25, 4], seed, counts=counts, probs=probs, output_dtype=tf.float32))


@pytest.mark.slow   # a jit compile, then 25 drawn cases
@settings(max_examples=25, deadline=None)
@given(seed=st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1)),
       alpha=st.lists(st.floats(2.0**-10, 50.0, width=32), min_size=4, max_size=4),
       rate=st.lists(st.floats(0.0, 200.0, width=32), min_size=4, max_size=4),
       counts=st.lists(st.integers(0, 500), min_size=4, max_size=4),
       probs=st.lists(st.floats(0.0, 1.0, width=32), min_size=4, max_size=4))
def test_any_seed_and_parameters_match_tf(one_of_each_jitted, seed, alpha, rate, counts, probs):
  args = [np.asarray(seed, np.int32)] + [np.asarray(v, np.float32) for v in (alpha, rate, counts, probs)]
  expected = one_of_each(*(tf.constant(a) for a in args))
  for i, (e, g) in enumerate(zip(expected, one_of_each_jitted(*args))):
    assert_same(e.numpy(), g, f"output {i}")


@pytest.fixture(scope="module")
def one_of_each_jitted():
  example = (SEEDS[0], np.ones(4, np.float32), np.ones(4, np.float32), np.ones(4, np.float32),
             np.full(4, 0.5, np.float32))
  return jax.jit(convert(one_of_each, *example))


def test_float64_samples_with_x64_match_tf_to_the_ulp():
  """float64 draws: XLA's and glibc's log, pow and sincos may round an ulp apart (a subprocess: x64 on)."""
  code = """
import jax; jax.config.update("jax_enable_x64", True)
import numpy as np, tensorflow as tf, jaxport
fn = lambda s: (tf.random.stateless_gamma([300, 3], s, alpha=tf.constant([0.3, 1.0, 4.5], tf.float64),
                                          dtype=tf.float64),
                tf.random.stateless_poisson([300, 2], s, lam=tf.constant([3.5, 40.0], tf.float64), dtype=tf.int64),
                tf.random.stateless_parameterized_truncated_normal(
                    [300, 3], s, tf.constant([0.0, 1.0, 0.0], tf.float64), tf.constant([1.0, 0.5, 2.0], tf.float64),
                    tf.constant([-0.3, 2.0, -9.0], tf.float64), tf.constant([0.3, 9.0, 9.0], tf.float64)),
                tf.random.stateless_binomial([300, 2], s, counts=tf.constant([8.0, 90.0], tf.float64),
                                             probs=tf.constant([0.3, 0.6], tf.float64), output_dtype=tf.int64))
seed = np.array([3, 7], np.int32)
jax_fn, params = jaxport.convert(fn, seed)
gamma, poisson, truncated, binomial = (np.asarray(x) for x in jax_fn(params, seed)[0])
e_gamma, e_poisson, e_truncated, e_binomial = (x.numpy() for x in fn(tf.constant(seed)))
np.testing.assert_array_equal(truncated, e_truncated)   # no float32 logf/sincosf here: all exact
assert gamma.dtype == np.float64 and poisson.dtype == np.int64
ulps = np.abs(gamma - e_gamma) / np.spacing(e_gamma)
assert ulps.max() <= 16 and (ulps == 0).mean() > 0.75, (ulps.max(), (ulps == 0).mean())
np.testing.assert_array_equal(poisson, e_poisson)
np.testing.assert_array_equal(binomial, e_binomial)
print("ok")
"""
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]


def test_gamma_gradient_matches_tf():
  alpha = np.array([0.3, 1.0, 2.5, 8.0], np.float32)
  weights = np.linspace(-1.0, 2.0, 120, dtype=np.float32).reshape(30, 4)
  fn = lambda a: tf.random.stateless_gamma([30, 4], [5, 6], alpha=a)  # noqa: E731
  draw = convert(fn, alpha)
  tf_alpha = tf.constant(alpha)
  with tf.GradientTape() as tape:
    tape.watch(tf_alpha)
    loss = tf.reduce_sum(fn(tf_alpha) * weights)
  expected = tape.gradient(loss, tf_alpha).numpy()
  loss_fn = lambda a: jnp.sum(draw(a) * weights)  # noqa: E731
  np.testing.assert_allclose(jax.grad(loss_fn)(alpha), expected, rtol=2e-5)
  np.testing.assert_allclose(jax.jit(jax.grad(loss_fn))(alpha), expected, rtol=2e-5)
  _, tangent = jax.jvp(draw, (alpha,), (np.ones(4, np.float32),))
  np.testing.assert_allclose(jnp.sum(tangent * weights), expected.sum(), rtol=2e-5)
  per_alpha = jax.vmap(draw)(np.stack([alpha, alpha + 1]))
  assert_same(fn(tf.constant(alpha + 1)).numpy(), per_alpha[1])


def test_poisson_and_binomial_parameters_get_zero_gradients_as_constants():
  rate, probs = np.array([3.0, 30.0], np.float32), np.array([0.3, 0.8], np.float32)
  draw = convert(lambda r, p: (tf.random.stateless_poisson([8, 2], [1, 2], lam=r, dtype=tf.float32),
                               tf.random.stateless_binomial([8, 2], [1, 2], counts=[4.0, 40.0], probs=p,
                                                            output_dtype=tf.float32)), rate, probs)
  grads = jax.grad(lambda r, p: sum(jnp.sum(x) for x in draw(r, p)), argnums=(0, 1))(rate, probs)
  for g in grads:
    np.testing.assert_array_equal(g, 0.0)


def test_nan_parameters_end_as_nan_where_tf_would_loop_forever():
  """TF's Poisson kernel never accepts a NaN rate (its loop does not end); here the value is NaN."""
  draw = jax.jit(convert(lambda r, a: (tf.random.stateless_poisson([3, 2], [1, 2], lam=r, dtype=tf.float32),
                                       tf.random.stateless_gamma([3, 2], [1, 2], alpha=a)),
                         np.ones(2, np.float32), np.ones(2, np.float32)))
  poisson, gamma = draw(np.array([np.nan, 2.0], np.float32), np.array([np.nan, 2.0], np.float32))
  assert np.isnan(poisson[:, 0]).all() and np.isfinite(poisson[:, 1]).all()
  assert np.isnan(gamma[:, 0]).all() and np.isfinite(gamma[:, 1]).all()


def test_a_shape_that_does_not_end_with_the_parameters_shape_is_a_typed_error():
  fn = lambda a: RAW.StatelessRandomGammaV2(shape=[4, 5], seed=[1, 2], alpha=a)  # noqa: E731
  with pytest.raises(tf.errors.InvalidArgumentError):
    fn(tf.ones([3]))
  with pytest.raises(ShapeMismatchError, match=r"must end with its alpha's shape \[3\]"):
    convert(fn, np.ones(3, np.float32))(np.ones(3, np.float32))


# --------------------------------------------------------------------------- parameterized truncated normal


def truncated(shape, mean, stddev, low, high, dtype=tf.float32):
  """A StatelessParameterizedTruncatedNormal draw."""
  return lambda s: tf.random.stateless_parameterized_truncated_normal(
      shape, s, tf.constant(mean, dtype), tf.constant(stddev, dtype), tf.constant(low, dtype),
      tf.constant(high, dtype))


# normal proposals (bounds wide about the mean), uniform (narrow), exponential (one tail), the
# upper tail mirrored, several batches, half precision, and one output split into TF's shards
TRUNCATED = {
    "normal": truncated([40], 0.0, 1.0, -2.0, 2.0),
    "uniform": truncated([40], 0.5, 2.0, 0.0, 1.0),
    "exponential": truncated([40], 0.0, 1.5, 3.0, 10.0),
    "upper_tail": truncated([40], 0.0, 1.0, -10.0, -2.0),
    "batches": truncated([30, 4], [0.0, 1.0, -1.0, 5.0], [1.0, 0.5, 2.0, 1.0], [-2.0, 1.1, 0.5, -np.inf],
                         [2.0, 1.3, 10.0, 4.0]),
    "half": truncated([50, 2], [0.0, 1.0], [1.0, 0.5], [-0.3, 2.0], [0.3, 9.0], tf.float16),
    "sharded": truncated([4000, 3], [0.0, 1.0, 0.0], [1.0, 0.5, 3.0], [-1.0, 2.0, -0.5], [3.0, 9.0, 0.5]),
}


@pytest.mark.parametrize("name", list(TRUNCATED))
def test_truncated_normal_matches_tf(name):
  fn = TRUNCATED[name]
  expected = fn(tf.constant(SEEDS[0])).numpy()
  got = np.asarray(jax.jit(convert(fn, SEEDS[0]))(SEEDS[0]))
  assert got.shape == expected.shape and got.dtype == expected.dtype
  ulps = np.abs(got.astype(np.float64) - expected) / np.spacing(np.abs(expected)).astype(np.float64)
  assert ulps.max() <= 2, (name, ulps.max())
  assert (ulps == 0).mean() >= (0.95 if name in ("normal", "batches", "sharded") else 1.0), (ulps == 0).mean()


def test_the_sharded_case_spans_several_of_tfs_shards():
  """TF splits a large draw over its thread pool by its cost model, each shard reading its own stream:
  the "sharded" case above must span several (on one CPU, TF runs one shard, and so does jaxport)."""
  threads = stateless_random.tf_threads()
  shard = stateless_random.eigen_block_size(12000, stateless_samplers._truncated_cost(np.float32), threads)
  assert shard < 12000 if threads > 1 else shard == 12000


@pytest.mark.slow   # a jit compile, then 25 drawn cases
@settings(max_examples=25, deadline=None)
@given(seed=st.tuples(st.integers(-2**31, 2**31 - 1), st.integers(-2**31, 2**31 - 1)),
       mean=st.lists(st.floats(-3.0, 3.0, width=32), min_size=3, max_size=3),
       stddev=st.lists(st.floats(0.125, 4.0, width=32), min_size=3, max_size=3),
       low=st.lists(st.floats(-6.0, 6.0, width=32), min_size=3, max_size=3),
       width=st.lists(st.floats(0.015625, 8.0, width=32), min_size=3, max_size=3))
def test_truncated_normal_with_any_seed_and_parameters_matches_tf(truncated_jitted, seed, mean, stddev, low, width):
  args = [np.asarray(seed, np.int32)] + [np.asarray(v, np.float32) for v in (mean, stddev, low)]
  args.append(args[3] + np.asarray(width, np.float32))
  expected = truncated_by_args(*(tf.constant(a) for a in args)).numpy()
  got = np.asarray(truncated_jitted(*args)).astype(np.float64)
  # a normal proposal n may be 2 ulp off; TF's own `n * stddev + mean` carries that into the value
  normal = ((expected - args[1]) / args[2]).astype(np.float32)
  slack = 2 * np.spacing(np.abs(normal)) * args[2] + 2 * np.spacing(np.abs(expected).astype(np.float32))
  assert np.all(np.abs(got - expected) <= slack), np.abs(got - expected).max()
  assert (got == expected).mean() > 0.9


def truncated_by_args(seed, mean, stddev, low, high):
  return tf.random.stateless_parameterized_truncated_normal([20, 3], seed, mean, stddev, low, high)


@pytest.fixture(scope="module")
def truncated_jitted():
  ones = np.ones(3, np.float32)
  return jax.jit(convert(truncated_by_args, SEEDS[0], 0 * ones, ones, -ones, ones))


def test_truncated_normal_with_invalid_parameters_is_nan_where_tf_raises():
  fn = lambda s, sd: tf.random.stateless_parameterized_truncated_normal([5, 2], s, 0.0, sd, -1.0, 1.0)  # noqa: E731
  with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid parameters"):
    fn(tf.constant(SEEDS[0]), tf.constant([1.0, 0.0]))
  draw = jax.jit(convert(fn, SEEDS[0], np.ones(2, np.float32)))
  out = np.asarray(draw(SEEDS[0], np.array([1.0, 0.0], np.float32)))
  assert np.isfinite(out[:, 0]).all() and np.isnan(out[:, 1]).all()


# --------------------------------------------------------------------------- shuffle


def shuffled(seed, value):
  key, counter, alg = RAW.StatelessRandomGetKeyCounterAlg(seed=seed)
  return RAW.StatelessShuffle(value=value, key=key, counter=counter, alg=alg)


@pytest.mark.parametrize("value", [np.arange(2000, dtype=np.int32), np.arange(30, dtype=np.float32).reshape(10, 3),
                                   np.arange(2, dtype=np.int32), np.ones(1, np.float32), np.zeros((0, 3), np.int32)],
                         ids=["1d", "rows", "two", "one", "empty"])
def test_stateless_shuffle_is_tfs_permutation(value):
  draw = jax.jit(convert(shuffled, SEEDS[0], value))
  for seed in SEEDS:
    assert_same(shuffled(tf.constant(seed), tf.constant(value)).numpy(), draw(seed, value), f"seed {seed}")
  per_seed = jax.vmap(lambda s: draw(s, value))(SEEDS)
  assert_same(shuffled(tf.constant(SEEDS[2]), tf.constant(value)).numpy(), per_seed[2])


def test_stateless_shuffle_of_many_sizes_is_tfs_permutation():
  """The permutation is computed without TF's sequential swaps (ops/stateless_samplers._permutation);
  every size's swap chains must still end where TF's do."""
  for size in (3, 4, 5, 17, 64, 257, 4099):
    value = np.arange(size, dtype=np.int32)
    draw = jax.jit(convert(shuffled, SEEDS[0], value))
    for seed in SEEDS:
      assert_same(shuffled(tf.constant(seed), tf.constant(value)).numpy(), draw(seed, value), f"{size}, {seed}")


def test_float64_samples_without_x64_are_float32():
  """Without x64 a float64 sampler's values come out as float32 (its work stays 64-bit inside),
  TF's values rounded, and mix with the function's other float32 values."""
  def fn(x):
    bounded = RAW.StatelessParameterizedTruncatedNormal(
        shape=[64], seed=[1, 2], means=tf.constant(0.5, tf.float64), stddevs=tf.constant(2.0, tf.float64),
        minvals=tf.constant(-1.0, tf.float64), maxvals=tf.constant(1.5, tf.float64))
    uniform = tf.random.stateless_uniform([64], [3, 4], dtype=tf.float64)
    return x + tf.cast(bounded, tf.float32), x * tf.cast(uniform, tf.float32)
  x = np.ones(64, np.float32)
  jax_fn, params = jaxport.convert(fn, x)
  for call in (jax_fn, jax.jit(jax_fn)):
    got = call(params, x)[0]
    for g, w in zip(got, fn(x)):
      assert np.asarray(g).dtype == np.float32
      assert_within_ulp(w.numpy(), g, 2)
