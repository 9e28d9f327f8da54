"""Hashed feature crosses (`SparseCross` with hashed_output) against TF: Keras `HashedCrossing` feeding an
embedding, `tf.sparse.cross_hashed` of dense and sparse integer columns (structure, order, hashes),
jit where the structure is static, string features left to the host callback.
"""
import warnings

import hypothesis
import hypothesis.strategies as st
import jax
import keras
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from import_blocker import run_without
from jaxport.convert import host_callback
from jaxport.errors import DynamicShapeError, TierError, X64OverflowError
from oracle import check

rs = np.random.RandomState(0)


def _ids(*shape, low=-10**6, high=10**6):
  return rs.randint(low, high, shape).astype(np.int64)


def _parts(sparse):
  return sparse.indices, sparse.values, sparse.dense_shape


def test_keras_hashed_crossing_feeds_an_embedding():
  # scalar features per example, crossed and embedded: values, jit, the embedding's gradient, no TF
  a, b = keras.Input((), dtype="int64"), keras.Input((), dtype="int64")
  crossed = keras.layers.HashedCrossing(num_bins=100)((a, b))
  model = keras.Model([a, b], keras.layers.Dense(2)(keras.layers.Embedding(100, 4)(crossed)))
  x = [_ids(6), _ids(6, low=0, high=50)]
  with warnings.catch_warnings():
    warnings.simplefilter("error", host_callback.HostCallbackWarning)
    jax_fn, params = jaxport.convert(model, x)
    out = jax.jit(jax_fn)(params, x)[0]
  np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-5, atol=1e-6)

  grads = jax.jit(jax.grad(lambda p: jax.numpy.sum(jax_fn(p, x)[0] ** 2)))(params)
  trainable = [k for k in params if jax_fn.trainable[k]]
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(model(x) ** 2)
  expected = tape.gradient(loss, [jax_fn.tf_variables[k] for k in trainable])
  for key, g in zip(trainable, expected):
    np.testing.assert_allclose(grads[key], tf.convert_to_tensor(g).numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("widths", [(1, 1), (2, 3), (3, 1, 2), (4,)])
@pytest.mark.parametrize("num_buckets, hash_key", [(1000, None), (0, None), (7, 12345), (2**62, -3)])
def test_dense_columns(widths, num_buckets, hash_key):
  # every cross of every row in TF's order, under jit (the structure follows the shapes); 64-bit bucket
  # ids under x64 (0 buckets: modulo int64's max)
  columns = [_ids(5, w) for w in widths]
  kwargs = {} if hash_key is None else {"hash_key": hash_key}
  with jax.enable_x64(num_buckets == 0 or num_buckets > 2**31), warnings.catch_warnings():
    warnings.simplefilter("error", host_callback.HostCallbackWarning)
    check(lambda *c: _parts(tf.sparse.cross_hashed(list(c), num_buckets, **kwargs)), *columns)


@pytest.mark.parametrize("fn", [lambda x: tf.sparse.cross_hashed([x, x], 0).values,
                                lambda x: tf.strings.to_hash_bucket_fast(tf.strings.as_string(x), 2**31 + 1)],
                         ids=["cross", "hash"])
def test_bucket_ids_beyond_int32_need_x64(fn):
  f = jaxport.convert_functional(fn, _ids(2, 1))
  with pytest.raises(X64OverflowError, match="jax_enable_x64"):
    f(_ids(2, 1))


def test_sparse_and_dense_columns_eagerly():
  # a sparse column from a dense one (Where: its indices depend on values): rows with 0, 1 or 2 features
  dense = _ids(4, 2)
  tags = np.array([[3, 0, 5], [0, 0, 0], [7, 0, 0], [1, 2, 9]], np.int64)

  def fn(tags, dense):
    return _parts(tf.sparse.cross_hashed([tf.sparse.from_dense(tags), dense], 50))
  f = jaxport.convert_functional(fn, tags, dense)
  for got, want in zip(f(tags, dense), fn(tf.constant(tags), tf.constant(dense))):
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
  with pytest.raises(DynamicShapeError, match="Where"):   # TF's from_dense sizes its output by value
    jax.jit(f)(tags, dense)

  def given(indices, values, dense):   # indices passed in: SparseCross itself needs them known
    return tf.sparse.cross_hashed([tf.SparseTensor(indices, values, [4, 3]), dense], 50).values
  indices = np.array([[0, 0], [0, 2], [2, 0], [3, 1]], np.int64)
  values = _ids(4)
  f = jaxport.convert_functional(given, indices, values, dense)
  expected = tf.function(given)(indices, values, dense).numpy()
  np.testing.assert_array_equal(f(indices, values, dense), expected)
  with pytest.raises(DynamicShapeError, match="SparseCross"):
    jax.jit(f)(indices, values, dense)


def test_constant_sparse_column_under_jit():
  # a sparse column known at conversion keeps the structure static: jit works
  sparse = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([4, 5, 6], tf.int64), [3, 2])
  dense = _ids(3, 2)
  check(lambda d: _parts(tf.sparse.cross_hashed([sparse, d, sparse], 97, hash_key=5)), dense)


@pytest.mark.filterwarnings("ignore::jaxport.convert.host_callback.HostCallbackWarning")
def test_string_features_go_to_the_host():
  words = np.array([[b"a", b"bc"], [b"d", b"e"]], object)

  def fn(ids):
    crossed = tf.sparse.cross_hashed([tf.constant(words), tf.strings.as_string(ids), ids], 1000)
    return _parts(crossed)
  check(fn, _ids(2, 1), vmap=False, jit=False)   # TF's shape function leaves the size unknown
  with pytest.raises(TierError, match="SparseCross"):
    jax.jit(jaxport.convert_functional(fn, _ids(2, 1)))(_ids(2, 1))


@hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.integers(1, 3), min_size=1, max_size=3), st.integers(1, 4),
                  st.sampled_from([1, 97, 2**31]), st.integers(-2**63, 2**63 - 1))
def test_against_tf(widths, batch, num_buckets, hash_key):
  columns = [rs.randint(-2**31, 2**31 - 1, (batch, w)).astype(np.int64) for w in widths]

  def fn(*c):
    return _parts(tf.sparse.cross_hashed(list(c), num_buckets, hash_key=hash_key))
  f = jaxport.convert_functional(fn, *columns)
  for got, want in zip(f(*columns), tf.function(fn)(*columns)):
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


_LOAD = """
import sys, jax, numpy as np, jaxport
fn, params = jaxport.load(sys.argv[1])
x = [np.array([5, -6, 2], np.int64), np.array([3, 3, 0], np.int64)]
np.save(sys.argv[2], np.asarray(jax.jit(fn)(params, x)[0]))
assert not [m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "keras")]
"""


def test_crossing_model_exports_and_loads_without_tf(tmp_path):
  a, b = keras.Input((), dtype="int64"), keras.Input((), dtype="int64")
  model = keras.Model([a, b], keras.layers.Embedding(30, 2)(keras.layers.HashedCrossing(num_bins=30)((a, b))))
  x = [np.array([5, -6, 2], np.int64), np.array([3, 3, 0], np.int64)]
  jax_fn, params = jaxport.convert(model, x)
  jaxport.export(jax_fn, params, x, path=str(tmp_path / "art"), platforms=("cpu",))
  run_without(_LOAD, str(tmp_path / "art"), str(tmp_path / "y.npy"))
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model(x).numpy(), rtol=1e-6)
