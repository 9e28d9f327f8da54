"""`tf.random.Generator` (RngReadAndSkip, RngSkip) and the tf_keras random layers that draw from one:
TF's own numbers, bit for bit (normals within 2 ulp, as the stateless ops), with the generator's
advanced state in the new params, eager and under jit, call after call."""
import jax
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.errors import UnsupportedOperationsError, UnsupportedValueError, X64NarrowingWarning, X64OverflowError
from test_ops_stateless_random import assert_within_ulp

RAW = tf.raw_ops
X = np.random.RandomState(0).uniform(0, 1, (2, 16, 16, 3)).astype(np.float32)


def _draws(g):
  return lambda x: (x + g.uniform(tf.shape(x)), g.normal([5, 7]), g.truncated_normal([9]),
                    g.uniform([4], minval=-3, maxval=1000, dtype=tf.int32), g.uniform_full_int([3], tf.uint32),
                    g.uniform([2], 2.0, 5.0, dtype=tf.float64))


def _state(params) -> np.ndarray:
  (key,) = [k for k in params if k.endswith("StateVar")]
  return np.asarray(params[key]).astype(np.int64)


def _check_calls(fn, state_var, jax_fn, params, calls=2, normals=(1, 2)):
  """`calls` calls of TF and of the converted function from the same state: equal draws, equal states."""
  for _ in range(calls):
    want = [np.asarray(t) for t in fn(X)]
    got, params = jax_fn(params, X)
    for i, (w, g) in enumerate(zip(want, got)):
      if i in normals:
        assert_within_ulp(w, g, 2)
      else:
        np.testing.assert_array_equal(np.asarray(g), w.astype(np.asarray(g).dtype), err_msg=f"output {i}")
    np.testing.assert_array_equal(_state(params), state_var.numpy())
  return params


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_generator_draws_are_tfs_call_after_call(jit):
  g = tf.random.Generator.from_seed(1234)
  fn = tf.function(_draws(g))
  jax_fn, params = jaxport.convert(fn, X)   # the state as it is now: TF's next call starts from it
  _check_calls(fn, g.state, jax.jit(jax_fn) if jit else jax_fn, params)


def test_skip_and_split_generators():
  g = tf.random.Generator.from_seed(7)
  child = g.split(1)[0]   # a generator seeded from its parent's draw: a 64-bit state, so x64

  @tf.function
  def fn(x):
    g.skip(1000)
    return x * child.uniform([1]), g.normal([3])

  with jax.enable_x64(True):
    jax_fn, params = jaxport.convert(fn, X)
    assert len(params) == 2
    for _ in range(2):
      want = [np.asarray(t) for t in fn(X)]
      got, params = jax_fn(params, X)
      np.testing.assert_array_equal(np.asarray(got[0]), want[0])
      assert_within_ulp(want[1], got[1], 2)
      assert {tuple(np.asarray(v)) for v in params.values()} == {tuple(g.state.numpy()), tuple(child.state.numpy())}


@pytest.mark.parametrize("delta", [0, 1, 10, 2**24 - 1, 2**55, 2**56, 2**57 + 3, 2**63, 2**64 - 1])
def test_the_counter_advances_as_tfs_kernel_for_any_delta(delta):
  """delta * 256 modulo 2**64, added with the carries of TF's PhiloxRandom::Skip (one dropped where the
  offset's high word is 0xFFFFFFFF); 64-bit states need x64."""
  start = np.array([-(2**20), 7, 9], np.int64)
  v = tf.Variable(start)

  @tf.function
  def skip(d):
    return RAW.RngReadAndSkip(resource=v.handle, alg=1, delta=d)

  with jax.enable_x64(True):
    jax_fn, params = jaxport.convert(skip, tf.constant(delta, tf.uint64))
    old, params = jax_fn({"Variable": start}, np.uint64(delta))
    np.testing.assert_array_equal(old, skip(tf.constant(delta, tf.uint64)))
    np.testing.assert_array_equal(params["Variable"], v.numpy())
    v.assign([-1, -1, 9])   # the carry through both words: [255, 0]
    _, params = jax.jit(jax_fn)({"Variable": v.numpy()}, np.uint64(1))
    skip(tf.constant(1, tf.uint64))
    np.testing.assert_array_equal(params["Variable"], v.numpy())


_WORD = st.integers(-2**63, 2**63 - 1)


@settings(max_examples=60, deadline=None)
@given(state=st.tuples(_WORD, _WORD, _WORD), delta=st.integers(0, 2**64 - 1))
def test_any_state_and_delta_skip_as_in_tf(state, delta):
  v = tf.Variable(np.array(state, np.int64))
  read = RAW.RngReadAndSkip(resource=v.handle, alg=1, delta=tf.constant(delta, tf.uint64)).numpy()
  with jax.enable_x64(True):
    old, params = _SKIP_FN(np.array(state, np.int64), np.uint64(delta))
  np.testing.assert_array_equal(old, read)
  np.testing.assert_array_equal(params["Variable"], v.numpy())


def _skip_fn():
  v = tf.Variable(np.zeros(3, np.int64))
  fn = tf.function(lambda d: RAW.RngReadAndSkip(resource=v.handle, alg=1, delta=d))
  with jax.enable_x64(True):
    jax_fn, _ = jaxport.convert(fn, tf.constant(0, tf.uint64))
  return jax.jit(lambda state, d: jax_fn({"Variable": state}, d))


_SKIP_FN = _skip_fn()


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_stateful_draws_of_older_generators(jit):
  """The ops older Generators drew with: the V2 stateless draw at the state, then a skip of 256 per value."""
  v = tf.Variable(np.array([123, 7, 999], np.int64))
  alg = tf.constant(1, tf.int64)

  @tf.function
  def fn():
    return (RAW.StatefulUniform(resource=v.handle, algorithm=alg, shape=[5]),
            RAW.StatefulStandardNormalV2(resource=v.handle, algorithm=alg, shape=[2, 3]),
            RAW.StatefulTruncatedNormal(resource=v.handle, algorithm=alg, shape=[4]),
            RAW.StatefulUniformFullInt(resource=v.handle, algorithm=alg, shape=[3], dtype=tf.uint32),
            RAW.StatefulUniformInt(resource=v.handle, algorithm=alg, shape=[6], minval=-3, maxval=100))

  jax_fn, params = jaxport.convert(fn)
  call = jax.jit(jax_fn) if jit else jax_fn
  for _ in range(2):
    want = [t.numpy() for t in fn()]
    got, params = call(params)
    for i, (w, g) in enumerate(zip(want, got)):
      if i in (1, 2):
        assert_within_ulp(w, g, 2)
      else:
        np.testing.assert_array_equal(np.asarray(g), w)
    np.testing.assert_array_equal(params["Variable"], v.numpy())


def test_rng_skip_and_auto_select():
  v = tf.Variable(np.array([5, 0, 3], np.int64))

  @tf.function
  def fn():
    RAW.RngSkip(resource=v.handle, algorithm=tf.constant(1, tf.int64), delta=tf.constant(3, tf.int64))
    return RAW.RngReadAndSkip(resource=v.handle, alg=3, delta=tf.constant(2, tf.uint64))

  jax_fn, params = jaxport.convert(fn)
  out, params = jax_fn(params)
  np.testing.assert_array_equal(out, fn())
  np.testing.assert_array_equal(params["Variable"], v.numpy())


def test_threefry_is_refused_as_tf_refuses_it_on_cpu():
  v = tf.Variable(np.array([5, 0, 3], np.int64))
  fn = tf.function(lambda: RAW.RngReadAndSkip(resource=v.handle, alg=2, delta=tf.constant(1, tf.uint64)))
  with pytest.raises(tf.errors.UnimplementedError):
    fn()
  jax_fn, params = jaxport.convert(fn)
  with pytest.raises(UnsupportedValueError, match="ThreeFry"):
    jax_fn(params)


def test_without_x64_the_state_is_int32_and_says_so():
  g = tf.random.Generator.from_state([2**31 - 600, 0, 5], alg="philox")
  fn = tf.function(lambda: g.uniform([2]))
  jax_fn, params = jaxport.convert(fn)
  with pytest.warns(X64NarrowingWarning, match="2\\*\\*31"):
    got, params = jax_fn(params)
  np.testing.assert_array_equal(got, fn())   # 2**31 - 600 + 512 still fits
  got, params = jax_fn(params)
  assert np.asarray(params["StateVar"]).dtype == np.int32
  assert int(params["StateVar"][0]) == np.int32(np.int64(2**31 - 600 + 1024) - 2**32)   # wrapped
  too_big = {"StateVar": np.array([2**31, 0, 5], np.int64)}
  with pytest.raises(X64OverflowError, match="jax_enable_x64"):   # a state that does not fit: refused
    jax_fn(too_big)


def _augmentation(exact_without_x64=False):
  """tf_keras' random preprocessing layers: each draws from its own tf.random.Generator (RngReadAndSkip).
  RandomFlip and RandomContrast seed a stateless op with an int64 draw, whose high bits need x64."""
  layers = tf_keras.layers
  model = [layers.RandomRotation(0.1, seed=2), layers.RandomZoom(0.2, seed=3), layers.RandomTranslation(0.1, 0.1, seed=4),
           layers.RandomBrightness(0.2, value_range=(0, 1), seed=6), layers.RandomCrop(12, 12, seed=7)]
  if not exact_without_x64:
    model[:0] = [layers.RandomFlip(seed=1), layers.RandomContrast(0.3, seed=5)]
  augment = tf_keras.Sequential(model)
  augment.build((None,) + X.shape[1:])
  return tf.function(lambda x: augment(x, training=True)), len(model)


def _check_augmentation(fn, layers):
  """Two calls, the second jitted from the first's new params: TF's images both times (so the states
  advanced as TF's)."""
  jax_fn, params = jaxport.convert(fn, X)
  assert len(params) == layers   # a generator state per layer
  for call in range(2):
    want = fn(X)
    got, params = (jax.jit(jax_fn) if call else jax_fn)(params, X)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"call {call}")


def test_keras_random_layers_in_training_mode_draw_tfs_numbers():
  with jax.enable_x64(True):
    _check_augmentation(*_augmentation())


def test_keras_random_layers_without_x64():
  _check_augmentation(*_augmentation(exact_without_x64=True))
  fn, layers = _augmentation()
  jax_fn, params = jaxport.convert(fn, X)
  got, new_params = jax.jit(jax_fn)(params, X)
  assert got.shape == (2, 12, 12, 3) and np.all(np.isfinite(got))
  want_states = [np.asarray(v) for v in params.values()]
  fn(X)
  assert [tuple(np.asarray(v)) for v in new_params.values()] != [tuple(v) for v in want_states]


def test_ops_that_take_a_generator_state_without_a_rule_are_refused_at_conversion():
  g = tf.random.Generator.from_seed(3)
  fn = tf.function(lambda: g.binomial([4], counts=[10.0], probs=[0.5]))   # StatefulRandomBinomial
  with pytest.raises(UnsupportedOperationsError, match="StatefulRandomBinomial"):
    jaxport.convert(fn)
