"""Lookup tables (`LookupTable*V2`, TF1's `HashTableV2`) against TF: captured `tf.lookup` tables, Keras
`IntegerLookup` in models, restored SavedModels (TF2 and TF1), frozen TF1 graphs, and artifacts of them
loaded without TF. Also `tf.math.bincount`'s clamped size, static under jit (Keras `CategoryEncoding`).
"""

import hypothesis
import hypothesis.strategies as st
import jax
import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import jaxport
from import_blocker import run_without
from jaxport.errors import UnsupportedValueError
from oracle import assert_close, check
from tf1_oracle import v1_graph

rs = np.random.RandomState(0)
IDS = np.array([[1, 2, 7], [5, 3, 0], [3, 3, 9]], np.int64)


def _static_table(keys, values, default):
  return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default)


@pytest.mark.parametrize("key_dtype,value_dtype", [(tf.int64, tf.float32), (tf.int32, tf.int32),
                                                   (tf.int64, tf.int64), (tf.int32, tf.float64)])
def test_static_hash_table(key_dtype, value_dtype):
  # LookupTableFindV2 (eager, jit, vmap; a traced default value), LookupTableSizeV2 and
  # LookupTableExportV2; TF gives find no gradient
  table = _static_table(tf.constant([5, 2, 3, -4], key_dtype), tf.constant([10, 20, 30, 40], value_dtype),
                        tf.constant(-1, value_dtype))
  ids = IDS.astype(key_dtype.as_numpy_dtype) * np.array([1, -1, 1], key_dtype.as_numpy_dtype)

  def fn(x, default):
    return (table.lookup(x), table.lookup(x[0]) + tf.cast(table.size(), value_dtype),
            tf.raw_ops.LookupTableFindV2(table_handle=table.resource_handle, keys=x, default_value=default))
  check(fn, ids, np.array(7, value_dtype.as_numpy_dtype))
  exported = lambda: [tf.sort(part) for part in table.export()]   # noqa: E731  # no gradient in TF
  check(lambda x: exported() + [table.lookup(x)], ids, grad=False)


def test_table_of_vectors_read_in_loops_and_branches():
  # a MutableHashTable read-only (a snapshot), with vector values, inside tf.while_loop and tf.cond
  table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=[0.0, -1.0])
  table.insert(tf.constant([1, 5, 9], tf.int64), tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
  empty = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int32, default_value=-3)

  def fn(x, w):
    def body(i, acc):
      return i + 1, acc + tf.ensure_shape(table.lookup(x + i), [3, 3, 2]) * w
    _, total = tf.while_loop(lambda i, _: i < 4, body, (tf.constant(0, tf.int64), tf.zeros([3, 3, 2])))
    picked = tf.cond(tf.reduce_sum(w) > 0, lambda: table.lookup(x[0]), lambda: -table.lookup(x[1]))
    return total, picked, empty.lookup(x)
  check(fn, IDS, rs.normal(size=2).astype(np.float32))


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(st.data())
def test_find_against_tf(data):
  # random tables: negative keys, 64-bit keys JAX (x64 off) cannot hold (never found)
  dtype = data.draw(st.sampled_from([np.int32, np.int64]))
  big = 2**40 if dtype == np.int64 else 2**30
  keys = data.draw(st.lists(st.one_of(st.integers(-20, 20), st.integers(-big, big)), min_size=1, max_size=12, unique=True))
  queries = data.draw(st.lists(st.one_of(st.sampled_from(keys), st.integers(-2**31, 2**31 - 1),
                                         st.integers(-25, 25)), min_size=1, max_size=10))
  values = np.arange(len(keys), dtype=np.float32) * 1.5 - 3
  table = _static_table(tf.constant(keys, dtype, shape=[len(keys)]), tf.constant(values), -7.0)
  fn = tf.function(lambda q: table.lookup(q))
  q = np.array(queries, dtype)
  jax_fn, params = jaxport.convert(fn, q)
  for call in (jax_fn, jax.jit(jax_fn)):
    np.testing.assert_array_equal(np.asarray(call(params, q)[0]), fn(q).numpy())


def test_keras_integer_lookup_model_trains_like_tf():
  # Keras 3: IntegerLookup (OOV and mask), Embedding, a multi-hot branch through CategoryEncoding;
  # values, jit, and the embedding and dense gradients against GradientTape
  ids = keras.Input((3,), dtype="int64")
  lookup = keras.layers.IntegerLookup(vocabulary=[7, 1, 3, 5, 11], mask_token=0, num_oov_indices=1)
  index = lookup(ids)
  pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(7, 4)(index))
  multi_hot = keras.layers.CategoryEncoding(num_tokens=7, output_mode="multi_hot")(index)
  out = keras.layers.Dense(2)(keras.layers.Concatenate()([pooled, multi_hot]))
  model = keras.Model(ids, out)
  check(lambda x: model(x), IDS, vmap=False)
  check(lambda x: model(x), IDS, vmap=False, grad=False)

  @tf.function
  def loss_grads(x):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(x) ** 2)
    return [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_variables)]
  jax_fn, params = jaxport.convert(loss_grads, IDS)
  got, _ = jax.jit(jax_fn)(params, IDS)
  assert_close(got, loss_grads(IDS), 1e-5, 1e-5, "gradients")


@pytest.mark.parametrize("mode", ["int", "count", "one_hot"])
def test_tf_keras_integer_lookup(mode):
  layer = tf_keras.layers.IntegerLookup(vocabulary=[1, 2, 3, 5], output_mode=mode)
  x = IDS[:, 0] if mode == "one_hot" else IDS
  check(lambda v: layer(v), x, vmap=False)


def test_keras_integer_lookup_invert():
  layer = keras.layers.IntegerLookup(vocabulary=[12, 40, 33], invert=True)
  check(lambda i: layer(i), np.array([[0, 1], [3, 2]], np.int64))


def test_bincount_size_is_static_under_jit():
  # tf.math.bincount clamps max(x) + 1 between minlength and maxlength: equal ones fix the size
  x = rs.randint(0, 6, size=(4, 5)).astype(np.int32)
  check(lambda v: tf.math.bincount(v, minlength=6, maxlength=6, axis=-1), x)
  check(lambda v, w: tf.math.bincount(v, weights=w, minlength=8, maxlength=8), x, rs.rand(4, 5).astype(np.float32),
        grad=False)   # TF gives DenseBincount no gradient
  check(lambda v: keras.layers.CategoryEncoding(num_tokens=6, output_mode="count")(v), x)
  fn = tf.function(lambda v: tf.math.bincount(v, minlength=3))   # only a lower bound: max(x) + 1
  jax_fn, params = jaxport.convert(fn, x)
  with pytest.raises(jaxport.DynamicShapeError):
    jax.jit(jax_fn)(params, x)


def test_writes_strings_and_wide_values_are_refused():
  table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=0.0)

  @tf.function
  def insert(k):
    table.insert(k, tf.ones_like(k, tf.float32))
    return table.lookup(k)
  with pytest.raises(UnsupportedValueError, match="writes a lookup table"):   # LookupTableInsertV2
    jaxport.convert(insert, IDS[0])
  @tf.function
  def remove(k):
    table.remove(k)
    return table.lookup(k)
  with pytest.raises(UnsupportedValueError, match="LookupTableRemoveV2"):
    jaxport.convert(remove, IDS[0])

  wide = _static_table(tf.constant([1, 2], tf.int64), tf.constant([1, 2**40], tf.int64), 0)
  jax_fn, params = jaxport.convert(tf.function(lambda k: wide.lookup(k)), IDS[0])
  with pytest.raises(jaxport.X64OverflowError):   # JAX (x64 off) would wrap the values
    jax_fn(params, IDS[0])

  names = _static_table(tf.constant([1, 2], tf.int64), tf.constant(["a", "bc"]), "?")
  lengths = tf.function(lambda k: tf.strings.length(names.lookup(k)))
  with pytest.raises(UnsupportedValueError, match="strings"):
    jax_fn, params = jaxport.convert(lengths, IDS[0])
    jax_fn(params, IDS[0])


def _v1_table_graph():
  with v1_graph() as g:
    x = tf.compat.v1.placeholder(tf.int64, [None], name="x")
    w = tf.compat.v1.placeholder(tf.float32, [], name="w")
    table = tf.compat.v1.lookup.StaticHashTable(
        tf.compat.v1.lookup.KeyValueTensorInitializer(tf.constant([4, 9, 2], tf.int64), [0.5, 1.5, 2.5]), -1.0)
    y = table.lookup(x) * w + tf.cast(table.size(), tf.float32)
    init = tf.compat.v1.tables_initializer()
  return g, x, w, y, init


def test_tf1_graph_table():
  # a frozen TF1 graph: HashTableV2 takes its contents from its (constant) initializer in the graph
  g, x, w, y, init = _v1_table_graph()
  with g.as_default(), tf.compat.v1.Session(graph=g) as sess:
    sess.run(init)
    expected = sess.run(y, {x: [9, 3, 2, 4], w: 2.0})
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "w"], [y.name])
  for call in (jax_fn, jax.jit(jax_fn)):
    np.testing.assert_allclose(call(params, np.array([9, 3, 2, 4]), np.float32(2.0))[0][0], expected)
  grad = jax.grad(lambda s: jax_fn(params, np.array([9, 3, 2, 4]), s)[0][0].sum())(np.float32(2.0))
  np.testing.assert_allclose(grad, 0.5 + 1.5 + 2.5 - 1.0)


def test_tf1_graph_table_without_initializer_is_refused():
  g, x, w, y, init = _v1_table_graph()
  graph_def = tf.compat.v1.GraphDef()
  graph_def.node.extend(n for n in g.as_graph_def().node if n.op != "LookupTableImportV2")
  jax_fn, params = jaxport.convert_graph_def(graph_def, ["x", "w"], [y.name])
  with pytest.raises(UnsupportedValueError, match="initializer"):
    jax_fn(params, np.array([9]), np.float32(1.0))


def test_tf1_saved_model_table(tmp_path):
  # a TF1 SavedModel whose loader ran the table's initializer: the signature reads the live table
  g, x, w, y, init = _v1_table_graph()
  with g.as_default(), tf.compat.v1.Session(graph=g) as sess:
    sess.run(init)
    builder = tf.compat.v1.saved_model.Builder(str(tmp_path / "sm"))
    builder.add_meta_graph_and_variables(
        sess, ["serve"], main_op=tf.compat.v1.tables_initializer(),
        signature_def_map={"serving_default": tf.compat.v1.saved_model.predict_signature_def(
            {"x": x, "w": w}, {"y": y})})
    builder.save()
  signature = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
  ids, scale = np.array([9, 3, 2]), np.float32(3.0)
  jax_fn, params = jaxport.convert(signature, x=ids, w=scale)
  expected = signature(x=tf.constant(ids), w=tf.constant(scale))["y"].numpy()
  np.testing.assert_allclose(jax.jit(jax_fn)(params, x=ids, w=scale)[0]["y"], expected)


_LOAD = """
import sys, jax, numpy as np, jaxport
fn, params = jaxport.load(sys.argv[1])
ids = np.array([[5, 6, 2], [3, 3, 0]], np.int64)
np.save(sys.argv[2], np.asarray(jax.jit(fn)(params, ids)[0]))
assert not [m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "keras")]
"""


def test_restored_table_exports_and_loads_without_tf(tmp_path):
  # a TF2 SavedModel's restored table (it does not know its dtypes: the reading op gives them),
  # converted, exported and loaded in a process that cannot import TF
  class Scorer(tf.Module):
    def __init__(self):
      self.table = _static_table(tf.constant([5, 2, 3], tf.int64), tf.constant([1.0, 2.0, 3.0]), 0.5)
      self.scale = tf.Variable(2.0)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def __call__(self, ids):
      return tf.reduce_sum(self.table.lookup(ids), axis=-1) * self.scale

  tf.saved_model.save(Scorer(), str(tmp_path / "sm"))
  restored = tf.saved_model.load(str(tmp_path / "sm"))
  ids = np.array([[5, 6, 2], [3, 3, 0]], np.int64)
  jax_fn, params = jaxport.convert(restored.__call__, ids)
  expected = restored(ids).numpy()
  np.testing.assert_allclose(jax.jit(jax_fn)(params, ids)[0], expected)
  jaxport.export(jax_fn, params, ids, path=str(tmp_path / "art"), platforms=("cpu",))
  run_without(_LOAD, str(tmp_path / "art"), str(tmp_path / "y.npy"))
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected)


def test_an_iterator_beside_a_table_is_still_refused():
  # only resources TF can size as tables become tables; an iterator keeps its clear refusal
  table = _static_table(tf.constant([1, 2], tf.int64), tf.constant([3.0, 4.0]), 0.0)
  iterator = iter(tf.data.Dataset.from_tensors(tf.constant(2.0)).repeat())

  @tf.function
  def fn(k):
    return table.lookup(k) * next(iterator)
  with pytest.raises(TypeError, match="iterators and other resources cannot be converted"):
    jaxport.convert(fn, IDS[0])
