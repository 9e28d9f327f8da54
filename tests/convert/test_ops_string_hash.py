"""Hash buckets of integers written as text (`StringToHashBucketFast`, `StringToHashBucketStrong` of
`AsString(ids)`) against TF: every integer dtype and the extremes of each, Keras `Hashing` (with and
without salt) feeding an embedding, `StaticVocabularyTable`'s out-of-vocabulary buckets, artifacts
loaded without TF, and the strings that still need TF (other formats, other string ops) handed to the
host callback.
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
from jaxport.convert.ops import string_hash
from jaxport.errors import InvalidNodeError, UnsupportedOperationsError
from oracle import check

rs = np.random.RandomState(0)


def fast(x, buckets=1000):
  return tf.strings.to_hash_bucket_fast(tf.strings.as_string(x), buckets)


def strong(x, buckets=1000, key=(12, 34)):
  return tf.strings.to_hash_bucket_strong(tf.strings.as_string(x), buckets, list(key))


def _extremes(dtype) -> np.ndarray:
  """Every text length the dtype can write: 0, ±1, ±9, ±10, ... and the dtype's limits."""
  if dtype == np.bool_:
    return np.array([True, False, True])
  info = np.iinfo(dtype)
  powers = [10**k + d for k in range(20) for d in (-1, 0) if 10**k + d <= info.max]
  values = powers + [-p for p in powers if -p >= info.min] + [info.min, info.max, info.min + 1, info.max - 1]
  return np.array(values, dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                                   np.uint64, np.bool_])
@pytest.mark.parametrize("hash_fn", [fast, strong], ids=["fast", "strong"])
def test_every_integer_dtype_and_text_length(dtype, hash_fn):
  # 64-bit extremes under x64 (JAX holds int64 in 32 bits otherwise; those are refused at the call)
  values = _extremes(dtype)
  with jax.enable_x64(np.dtype(dtype).itemsize == 8), warnings.catch_warnings():
    warnings.simplefilter("error", host_callback.HostCallbackWarning)
    f = jaxport.convert_functional(hash_fn, tf.TensorSpec([None], tf.as_dtype(dtype)))
    expected = hash_fn(tf.constant(values)).numpy()
    for call in (f, jax.jit(f)):
      np.testing.assert_array_equal(np.asarray(call(values)), expected)
    np.testing.assert_array_equal(np.asarray(jax.vmap(f)(values[:, None]))[:, 0], expected)


def test_wide_buckets_and_keys():
  # num_buckets near 2**63 keeps every bit of the hash; negative int64 key words are two's complement
  values = np.concatenate([_extremes(np.int64), rs.randint(-2**62, 2**62, 500, dtype=np.int64)])
  with jax.enable_x64(True):
    check(lambda x: fast(x, 2**63 - 25), values, vmap=False)
    check(lambda x: strong(x, 2**63 - 25, (-5, 2**62 + 7)), values, vmap=False)
    check(lambda x: strong(x, 1, (0, 0)), values, vmap=False)


_BUCKETS_AND_KEYS = [(1, (0, 0)), (97, (1, 2)), (2**31 - 1, (-2**63, 2**63 - 1)), (1000, (12, -34))]


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(st.lists(st.integers(-2**31, 2**31 - 1), min_size=24, max_size=24),
                  st.sampled_from(_BUCKETS_AND_KEYS))
def test_against_tf(values, buckets_and_key):
  # x64 off (the default): int32 ids; eager calls (one compiled hash per bucket count and key)
  buckets, key = buckets_and_key
  x = np.array(values, np.int32)
  f = jaxport.convert_functional(lambda v: (fast(v, buckets), strong(v, buckets, key)), x)
  expected = (fast(x, buckets), strong(x, buckets, key))
  for g, e in zip(f(x), expected):
    np.testing.assert_array_equal(np.asarray(g), e.numpy())


def test_keras_hashing_feeds_an_embedding():
  # Keras' Hashing layer on integer ids (with and without salt) into embeddings: values, jit and the
  # embeddings' gradients, with nothing sent to TF
  ids = keras.Input((4,), dtype="int64")
  plain = keras.layers.Embedding(64, 3)(keras.layers.Hashing(num_bins=64)(ids))
  salted = keras.layers.Embedding(32, 3)(keras.layers.Hashing(num_bins=32, salt=[7, 11])(ids))
  model = keras.Model(ids, keras.layers.Dense(2)(keras.layers.Concatenate()([plain, salted])))
  x = rs.randint(-10**6, 10**6, (5, 4)).astype(np.int64)
  with warnings.catch_warnings():
    warnings.simplefilter("error", host_callback.HostCallbackWarning)
    jax_fn, params = jaxport.convert(model, x)
    out, _ = jax.jit(jax_fn)(params, x)
  np.testing.assert_allclose(out, model(x).numpy(), rtol=1e-5, atol=1e-6)

  loss = lambda p: jax.numpy.sum(jax_fn(p, x)[0] ** 2)   # noqa: E731
  grads = jax.jit(jax.grad(loss))(params)
  trainable = [k for k in params if jax_fn.trainable[k]]
  with tf.GradientTape() as tape:
    tf_loss = tf.reduce_sum(model(x) ** 2)
  tf_grads = tape.gradient(tf_loss, [jax_fn.tf_variables[k] for k in trainable])
  assert len(trainable) == 4   # two embeddings, the dense kernel and bias
  for key, g in zip(trainable, tf_grads):
    np.testing.assert_allclose(grads[key], tf.convert_to_tensor(g).numpy(), rtol=1e-5, atol=1e-6, err_msg=key)


def test_static_vocabulary_table_oov_buckets():
  # integer keys: known ids look up, the rest hash into num_oov_buckets after the vocabulary
  keys = tf.constant([10, 20, 30, -40], tf.int64)
  table = tf.lookup.StaticVocabularyTable(
      tf.lookup.KeyValueTensorInitializer(keys, tf.constant([0, 1, 2, 3], tf.int64)), num_oov_buckets=5)
  x = np.array([[10, 11, -40, 0], [2**31 - 1, -2**31, 30, 99]], np.int64)
  with warnings.catch_warnings():
    warnings.simplefilter("error", host_callback.HostCallbackWarning)
    check(lambda v: table.lookup(v), x)


_LOAD = """
import sys, jax, numpy as np, jaxport
fn, params = jaxport.load(sys.argv[1])
ids = np.array([[5, -6, 2, 123456], [3, 3, 0, -2147483648]], np.int64)
np.save(sys.argv[2], np.asarray(jax.jit(fn)(params, ids)[0]))
assert not [m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "keras")]
"""


def test_hashing_model_exports_and_loads_without_tf(tmp_path):
  ids = keras.Input((4,), dtype="int64")
  hashed = keras.layers.Hashing(num_bins=50, salt=[3, 4])(ids)
  model = keras.Model(ids, keras.layers.Embedding(50, 2)(hashed))
  x = np.array([[5, -6, 2, 123456], [3, 3, 0, -2147483648]], np.int64)
  jax_fn, params = jaxport.convert(model, x)
  jaxport.export(jax_fn, params, x, path=str(tmp_path / "art"), platforms=("cpu",))
  run_without(_LOAD, str(tmp_path / "art"), str(tmp_path / "y.npy"))
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model(x).numpy(), rtol=1e-6)


@pytest.mark.filterwarnings("ignore::jaxport.convert.host_callback.HostCallbackWarning")
def test_other_strings_go_to_the_host():
  # a formatted AsString (width, floats) and other string ops on decimal text: the host callback
  # computes them, and the text it reads is TF's
  def fn(i, v):
    padded = tf.strings.to_hash_bucket_fast(tf.strings.as_string(i, width=6, fill="0"), 97)
    floats = tf.strings.to_hash_bucket_strong(tf.strings.as_string(v), 97, [1, 2])
    lengths = tf.strings.length(tf.strings.as_string(i)) + tf.strings.length(tf.strings.as_string(i > 0))
    return padded, floats, lengths, fast(i)
  i = np.array([0, -7, 123, 2**31 - 1], np.int32)
  v = np.array([0.5, -2.0, 1e10, 3.25], np.float32)
  check(fn, i, v, grad=False)


def test_conversion_refuses_only_what_needs_the_host_when_callbacks_are_off():
  def fn(i, v):
    return fast(i) + tf.strings.to_hash_bucket_fast(tf.strings.as_string(v), 1000)
  i, v = np.array([1, 2], np.int32), np.array([0.5, 1.5], np.float32)
  with jaxport.override_config("allow_host_callback", False):
    with pytest.raises(UnsupportedOperationsError) as info:
      jaxport.convert(fn, i, v)
    assert set(info.value.ops) == {"AsString"}
    assert len(info.value.ops["AsString"]) == 1   # the float's node only
    f = jaxport.convert_functional(fast, i)       # integers need no host
    np.testing.assert_array_equal(jax.jit(f)(i), fast(i).numpy())


def test_inspect_lists_host_handed_nodes_as_callbacks():
  def fn(i, v):
    return fast(i) + tf.strings.to_hash_bucket_fast(tf.strings.as_string(v), 1000)
  report = jaxport.inspect(fn, np.array([1, 2], np.int32), np.array([0.5, 1.5], np.float32))
  tiers = sorted((row.op, row.tier.value, row.nodes) for row in report.rows if row.op == "AsString")
  assert tiers == [("AsString", "callback", 1), ("AsString", "native", 1)]


def test_zero_buckets_is_refused():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.int32, [3], name="x")
    tf.raw_ops.StringToHashBucketFast(input=tf.strings.as_string(x), num_buckets=1, name="h")
  graph_def = graph.as_graph_def()
  for node in graph_def.node:
    if node.name == "h":
      node.attr["num_buckets"].i = 0   # TF's op builder refuses 0; a hand-edited graph may hold it
  f, params = jaxport.convert_graph_def(graph_def, ["x"], "h:0")
  with pytest.raises(InvalidNodeError, match="num_buckets"):
    f(params, np.array([1, 2, 3], np.int32))


def test_decimal_bytes_are_the_text():
  # the bytes the hashes read are Python's str() of each number
  values = np.concatenate([_extremes(np.int64), rs.randint(-2**63, 2**63 - 1, 200, dtype=np.int64)])
  with jax.enable_x64(True):
    words, length = string_hash.decimal_text(jax.numpy.asarray(values))
  words = np.stack([np.asarray(w) for w in words], -1)
  for row, n, value in zip(words, np.asarray(length), values):
    text = b"".join(int(w).to_bytes(8, "little") for w in row)
    assert text == str(int(value)).encode().ljust(len(text), b"\0")


@pytest.mark.parametrize("n, expected", [(0, 0x726FDB47DD0E0E31), (1, 0x74F839C593DC67FD),
                                         (8, 0x93F5F5799A932462), (15, 0xA129CA6149BE45E5)])
def test_siphash_reference_vectors(n, expected):
  # SipHash-2-4's published vectors: key 00..0f, message 00..(n-1)
  key = (int.from_bytes(bytes(range(8)), "little"), int.from_bytes(bytes(range(8, 16)), "little"))
  text = bytes(range(n)).ljust(32, b"\0")
  with jax.enable_x64(True):
    words = [jax.numpy.asarray([int.from_bytes(text[8 * i:8 * i + 8], "little")], np.uint64) for i in range(4)]
    got = string_hash.siphash(words, jax.numpy.asarray([n], np.uint64), key)
  assert int(got[0]) == expected
