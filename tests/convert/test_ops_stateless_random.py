"""Stateless random ops: TF's own values (Philox on CPU), bit for bit, with no `rng`.

Exact ops are compared with `assert_array_equal`; the normals, whose TF kernel calls
glibc's logf/sincosf, within 2 ulp (and mostly equal). The gamma, Poisson, binomial and
parameterized truncated normal samplers and the shuffle are tested in
test_ops_stateless_samplers.py.
"""
import jax
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.convert.registry import ops_where

RAW = tf.raw_ops
SEEDS = np.array([[0, 0], [7, -11], [2**31 - 1, -2**31], [123456, 1]], np.int32)
LOGITS = np.log(np.array([[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]], np.float32))
LOGITS_INF = np.array([[0.0, -np.inf, 1.0, 2.0]], np.float32)


def exact_ops(s):
  key, counter, alg = RAW.StatelessRandomGetKeyCounterAlg(seed=s)
  return (
      RAW.StatelessRandomUniform(shape=[7], seed=s),
      RAW.StatelessRandomUniform(shape=[3, 5], seed=s, dtype=tf.float16),
      RAW.StatelessRandomUniform(shape=[2, 0], seed=s, dtype=tf.bfloat16),
      RAW.StatelessRandomUniform(shape=[5], seed=s, dtype=tf.float64),
      tf.random.stateless_uniform([2, 3], s, minval=-1.0, maxval=3.0),
      RAW.StatelessRandomUniformV2(shape=[6], key=key, counter=counter, alg=alg, dtype=tf.bfloat16),
      RAW.StatelessRandomUniformInt(shape=[9], seed=s, minval=-5, maxval=1000003),
      RAW.StatelessRandomUniformInt(shape=[5], seed=s, minval=tf.constant(-2**40, tf.int64),
                                    maxval=tf.constant(3**30, tf.int64)),
      tf.random.stateless_uniform([7], s, minval=3, maxval=10, dtype=tf.int32),
      RAW.StatelessRandomUniformFullInt(shape=[5], seed=s, dtype=tf.uint32),
      RAW.StatelessRandomUniformFullInt(shape=[3], seed=s, dtype=tf.int64),
      tf.random.stateless_uniform([5], s, minval=None, maxval=None, dtype=tf.uint64),
      tf.random.stateless_uniform([1], s, minval=None, maxval=None, dtype=tf.int32),
      key, counter, alg, *RAW.StatelessRandomGetKeyCounter(seed=s), RAW.StatelessRandomGetAlg(),
      tf.random.stateless_categorical(LOGITS, 13, s),
      tf.random.stateless_categorical(LOGITS_INF, 5, s, dtype=tf.int32),
  )


def normal_ops(s):
  return (
      RAW.StatelessRandomNormal(shape=[501], seed=s),
      RAW.StatelessTruncatedNormal(shape=[2, 251], seed=s),
      tf.random.stateless_normal([257], s, dtype=tf.float16),
      tf.random.stateless_truncated_normal([3, 3], s, dtype=tf.bfloat16),
      RAW.StatelessRandomNormal(shape=[9], seed=s, dtype=tf.float64),
      RAW.StatelessTruncatedNormal(shape=[9], seed=s, dtype=tf.float64),
      RAW.StatelessRandomNormal(shape=[0, 3], seed=s),
  )


def convert(fn, *args):
  jax_fn, params = jaxport.convert(fn, *args)
  assert not jax_fn.requires_rng
  return lambda *a: jax_fn(params, *a)[0]  # noqa: E731


def numpy_of(x):
  """A converted output as NumPy; a uint64 carried as a key array (no x64) back as uint64."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    data = np.asarray(jax.random.key_data(x)).astype(np.uint64)
    return data[..., 0] | (data[..., 1] << np.uint64(32))
  return np.asarray(x)


def tf_values(fn, seed):
  return [np.asarray(t) for t in fn(tf.constant(seed))]


def assert_exact(expected, got):
  got = numpy_of(got)
  assert got.shape == expected.shape, (got.shape, expected.shape)
  np.testing.assert_array_equal(got, expected.astype(got.dtype))   # TF's 64-bit values, narrowed as JAX does


def assert_within_ulp(expected, got, ulp: int):
  got = numpy_of(got)
  expected = expected.astype(got.dtype)
  wide_got, wide_expected = got.astype(np.float64), expected.astype(np.float64)
  spacing = np.spacing(np.abs(expected).astype(ml_dtypes.finfo(got.dtype).dtype)).astype(np.float64)
  assert np.all(np.abs(wide_got - wide_expected) <= ulp * spacing), (expected, got)
  if got.size > 100:
    assert (got == expected).mean() > 0.9


def check_per_seed(fn, outputs, assert_equal):
  """Each seed's TF values against row `i` of the batched outputs."""
  for row, seed in enumerate(SEEDS):
    expected = tf_values(fn, seed)
    assert len(outputs) == len(expected)
    for i, (e, g) in enumerate(zip(expected, outputs)):
      try:
        assert_equal(e, g[row])
      except AssertionError as err:
        raise AssertionError(f"output {i} for seed {seed}") from err


@pytest.mark.slow   # one XLA compile of many samplers
def test_exact_ops_match_tf_under_jit_and_vmap():
  batched = jax.jit(jax.vmap(convert(exact_ops, SEEDS[0])))(SEEDS)
  check_per_seed(exact_ops, batched, assert_exact)


@pytest.mark.slow   # one XLA compile of many samplers
def test_normals_match_tf_to_the_ulp_under_jit_and_vmap():
  batched = jax.jit(jax.vmap(convert(normal_ops, SEEDS[0])))(SEEDS)
  check_per_seed(normal_ops, batched, lambda e, g: assert_within_ulp(e, g, ulp=2))
  truncated = numpy_of(batched[1]).astype(np.float64)
  assert np.abs(truncated).max() < 2


def small_ops(s):
  key, counter = RAW.StatelessRandomGetKeyCounter(seed=s)
  return (RAW.StatelessRandomUniform(shape=[5], seed=s),
          RAW.StatelessRandomUniformInt(shape=[3], seed=s, minval=-7, maxval=2**31 - 1),
          RAW.StatelessRandomNormal(shape=[6], seed=s),
          RAW.StatelessTruncatedNormalV2(shape=[1, 3], key=key, counter=counter, alg=3),
          key, counter)


@pytest.fixture(scope="module")
def small_fn():
  return convert(small_ops, SEEDS[0])


@pytest.fixture(scope="module")
def small_jitted(small_fn):
  return jax.jit(small_fn)


def test_eager(small_fn):
  """Unjitted: constant shapes, traced seed, a uint64 key carried as a key array."""
  for seed in SEEDS[:2]:
    expected, got = tf_values(small_ops, seed), small_fn(seed)
    for i, (e, g) in enumerate(zip(expected, got)):
      (assert_within_ulp(e, g, ulp=2) if e.dtype == np.float32 and i >= 2 else assert_exact(e, g))


@settings(max_examples=12, deadline=None)
@given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=2, max_size=2))
def test_any_seed(small_jitted, seed):
  seed = np.array(seed, np.int32)
  got = small_jitted(seed)
  for i, (e, g) in enumerate(zip(tf_values(small_ops, seed), got)):
    (assert_within_ulp(e, g, ulp=2) if e.dtype == np.float32 and i >= 2 else assert_exact(e, g))


def test_constant_int64_seed_uses_all_64_bits():
  seeds = tf.constant([[2**40 + 3, -5], [3, -5]], tf.int64)
  fn = lambda: (tf.random.stateless_uniform([4], seeds[0]), tf.random.stateless_uniform([4], seeds[1]),  # noqa: E731
                *RAW.StatelessRandomGetKeyCounter(seed=seeds[0]))
  for e, g in zip(fn(), convert(fn)()):
    assert_exact(np.asarray(e), g)


def test_uniform_full_int64_with_x64():
  fn = lambda s: (tf.random.stateless_uniform([5], s, minval=None, maxval=None, dtype=tf.uint64),  # noqa: E731
                  tf.random.stateless_uniform([5], s, minval=-2**62, maxval=2**62, dtype=tf.int64),
                  tf.random.stateless_uniform([3], s, dtype=tf.float64),
                  *RAW.StatelessRandomGetKeyCounter(seed=s))
  with jax.enable_x64(True):
    got = convert(fn, SEEDS[1])(SEEDS[1])
    for e, g in zip(tf_values(fn, SEEDS[1]), got):
      assert np.asarray(g).dtype == e.dtype
      np.testing.assert_array_equal(np.asarray(g), e)


def test_alg_auto_is_philox_and_threefry_is_refused_as_in_tf():
  key, counter = RAW.StatelessRandomGetKeyCounter(seed=SEEDS[1])
  key, counter = key.numpy(), counter.numpy()
  fn = lambda alg: RAW.StatelessRandomUniformV2(shape=[5], key=key, counter=counter, alg=alg)  # noqa: E731
  np.testing.assert_array_equal(convert(lambda: fn(3))(), fn(1))
  np.testing.assert_array_equal(convert(lambda: fn(1))(), fn(3))
  with pytest.raises(tf.errors.InvalidArgumentError):
    fn(2)
  with pytest.raises(jaxport.errors.UnsupportedValueError, match="ThreeFry"):
    convert(lambda: fn(2))()


def test_stateless_ops_need_no_rng():
  assert not {op for op in ops_where(needs_rng=True) if op.startswith("Stateless")}


# --------------------------------------------------------------------------- not exact

