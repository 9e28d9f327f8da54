"""SparseTensor ops (`tf.sparse`, `tf.nn.embedding_lookup_sparse`) and sparse segment reductions against TF.

With the coordinates as constants of the TF function every check also runs under jit, grad and vmap;
ops whose output size does not depend on the coordinates are also checked with them passed in.
"""
import numpy as np
import pytest
import tensorflow as tf

import jax
import jaxport
from jaxport.errors import DynamicShapeError
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)
DATA = rs.normal(size=(6, 3)).astype(np.float32)
INDICES = tf.constant([4, 0, 0, 5, 2, 3, 1])
SEGMENTS = tf.constant([0, 0, 1, 1, 1, 3, 3])   # segment 2 is empty
COORDS = np.array([[0, 1], [0, 3], [2, 0], [2, 2], [3, 3]], np.int64)   # row 1 is empty
SHAPE = np.array([4, 5], np.int64)
VALUES = rs.normal(size=5).astype(np.float32)


def _sparse_segments(x, indices, segments, num_segments=None):
  ops = (raw.SparseSegmentSum, raw.SparseSegmentMean, raw.SparseSegmentSqrtN)
  if num_segments is None:
    return tuple(op(data=x, indices=indices, segment_ids=segments) for op in ops)
  with_n = (raw.SparseSegmentSumWithNumSegments, raw.SparseSegmentMeanWithNumSegments,
            raw.SparseSegmentSqrtNWithNumSegments)
  return tuple(op(data=x, indices=indices, segment_ids=segments, num_segments=num_segments) for op in with_n)


def test_sparse_segment_reductions():
  check(lambda x: _sparse_segments(x, INDICES, SEGMENTS) + _sparse_segments(x, INDICES, SEGMENTS, 6), DATA)
  check(lambda x: _sparse_segments(tf.reshape(x, [6, 3, 1]), INDICES[:3], tf.constant([1, 1, 1])), DATA)


def test_sparse_segment_reductions_with_traced_ids_under_jit():
  # with a constant num_segments the indices and ids may be inputs: no shape depends on them
  fn = lambda x, i, s: _sparse_segments(x, i, s, 5)  # noqa: E731
  check(fn, DATA, INDICES.numpy(), SEGMENTS.numpy(), vmap=False)


def test_sparse_segment_int_and_half_data():
  ints = rs.randint(-9, 9, (6, 2)).astype(np.int32)
  check(lambda x: raw.SparseSegmentSum(data=x, indices=INDICES, segment_ids=SEGMENTS), ints)
  halves = rs.normal(size=(6, 3)).astype(tf.bfloat16.as_numpy_dtype)
  check(lambda x: _sparse_segments(x, INDICES, SEGMENTS), halves, atol=1e-2, rtol=1e-2, grad=False)


@pytest.mark.parametrize("indices, segments, match", [
    ([0, 1, 2], [1, 0, 1], "not increasing"), ([0, 1, 2], [-1, 0, 1], "negative"),
    ([0, 7, 2], [0, 0, 1], r"index 7 is not in \[0, 6\)"), ([0, 1], [0, 1, 1], "one length")])
def test_sparse_segment_refuses_what_tf_refuses(indices, segments, match):
  with pytest.raises((ValueError, jaxport.errors.AssertionFailedError), match=match):
    run_rule("SparseSegmentSum", DATA, np.array(indices), np.array(segments))
  with pytest.raises(ValueError, match="not below num_segments"):
    run_rule("SparseSegmentMeanWithNumSegments", DATA, np.array([0, 1]), np.array([0, 4]), np.int32(3))


def test_sparse_segment_gradient_ops():
  # the dense gradients TF writes for these reductions, and the IndexedSlices form (GradV2)
  dim0 = tf.constant(6)
  ops = (raw.SparseSegmentSumGrad, raw.SparseSegmentMeanGrad, raw.SparseSegmentSqrtNGrad)
  check(lambda g: tuple(op(grad=g, indices=INDICES, segment_ids=SEGMENTS, output_dim0=dim0) for op in ops),
        DATA[:4], grad=False)
  v2 = (raw.SparseSegmentSumGradV2, raw.SparseSegmentMeanGradV2, raw.SparseSegmentSqrtNGradV2)
  check(lambda g: tuple(op(grad=g, indices=INDICES, segment_ids=SEGMENTS, dense_output_dim0=dim0) for op in v2),
        DATA[:4], grad=False)


def test_embedding_lookup_sparse_forward_and_gradient():
  """`tf.nn.embedding_lookup_sparse` and the safe variant, every combiner, weighted or not, and the
  gradient TF writes for them (its dense and IndexedSlices forms) inside one tf.function."""
  table = tf.Variable(rs.normal(size=(8, 3)).astype(np.float32))
  ids = tf.SparseTensor(COORDS, tf.constant([3, 5, 7, 7, 1], tf.int64), SHAPE)

  def lookups(weights):
    sp_weights = tf.SparseTensor(COORDS, weights, SHAPE)
    outs = []
    for combiner in ("sum", "mean", "sqrtn"):
      outs += [tf.nn.embedding_lookup_sparse(table, ids, None, combiner=combiner),
               tf.nn.embedding_lookup_sparse(table, ids, sp_weights, combiner=combiner),
               tf.nn.embedding_lookup_sparse(table, ids, None, combiner=combiner, allow_fast_lookup=True),
               tf.nn.safe_embedding_lookup_sparse(table, ids, None, combiner=combiner),
               tf.nn.safe_embedding_lookup_sparse(table, ids, sp_weights, combiner=combiner)]
    return outs

  def with_gradient(weights):
    with tf.GradientTape() as tape:
      outs = lookups(weights)
      loss = sum(tf.reduce_sum(o * o) for o in outs)
    return outs, tf.convert_to_tensor(tape.gradient(loss, table))

  with jaxport.override_config("allow_host_callback", False):   # every op native
    check(lookups, VALUES, vmap=False, jit=False)
    check(with_gradient, VALUES, grad=False, vmap=False, jit=False)
    # under jit: lookups of constant ids (weights as inputs are value-dependent: those <= 0 are dropped)
    check(lambda v: [v[0] * tf.nn.embedding_lookup_sparse(table, ids, None, combiner=c)
                     for c in ("sum", "mean", "sqrtn")], VALUES, vmap=False)


def test_sparse_tensor_dense_matmul():
  fn = lambda v, b, bt: (  # noqa: E731
      tf.sparse.sparse_dense_matmul(tf.SparseTensor(COORDS, v, SHAPE), b),
      raw.SparseTensorDenseMatMul(a_indices=COORDS, a_values=v, a_shape=SHAPE, b=bt, adjoint_b=True),
      raw.SparseTensorDenseMatMul(a_indices=COORDS, a_values=v, a_shape=SHAPE, b=b[:4], adjoint_a=True))
  b = rs.normal(size=(5, 2)).astype(np.float32)
  check(fn, VALUES, b, b.T.copy())
  # the coordinates as an input: the output shape is the (constant) dense shape's
  check(lambda i, v, b: tf.sparse.sparse_dense_matmul(tf.SparseTensor(i, v, SHAPE), b), COORDS, VALUES, b,
        vmap=False)


def test_sparse_reductions():
  st = lambda v: tf.SparseTensor(COORDS, v, SHAPE)  # noqa: E731
  # SparseReduceSum and SparseReduceMax
  check(lambda v: (tf.sparse.reduce_sum(st(v), axis=1), tf.sparse.reduce_sum(st(v), axis=0, keepdims=True),
                   tf.sparse.reduce_sum(st(v))), VALUES)
  check(lambda v: (tf.sparse.reduce_max(st(v), axis=1), tf.sparse.reduce_max(st(-tf.abs(v)), axis=-1, keepdims=True),
                   tf.sparse.reduce_max(st(v))), VALUES, grad=False)   # TF has no gradient for it

  def as_sparse(v):
    out = []
    for op in (raw.SparseReduceSumSparse, raw.SparseReduceMaxSparse):
      for axes, keep in (([1], False), ([0], True), ([0, 1], False)):
        out += list(op(input_indices=COORDS, input_values=v, input_shape=SHAPE, reduction_axes=axes,
                       keep_dims=keep))
    return out
  check(as_sparse, VALUES, grad=False)


def test_reshape_reorder_fill_empty_rows():
  shuffled = COORDS[[3, 0, 4, 2, 1]]

  def fn(v):
    reordered = tf.sparse.reorder(tf.SparseTensor(shuffled, v, SHAPE))
    reshaped = tf.sparse.reshape(tf.SparseTensor(COORDS, v, SHAPE), [2, -1, 5])
    filled, empty = tf.sparse.fill_empty_rows(tf.SparseTensor(COORDS, v, SHAPE), -1.0)
    return (reordered.indices, reordered.values, reshaped.indices, reshaped.dense_shape,
            filled.indices, filled.values, empty)
  check(fn, VALUES)
  # reorder and reshape keep the number of entries: their coordinates may be traced
  check(lambda i, v: (raw.SparseReorder(input_indices=i, input_values=v, input_shape=SHAPE)[1],
                      raw.SparseReshape(input_indices=i, input_shape=SHAPE, new_shape=[-1])[0]), shuffled, VALUES,
        vmap=False)


def test_fill_empty_rows_gradient_op():
  def fn(v, d):   # the tape writes SparseFillEmptyRowsGrad
    with tf.GradientTape() as tape:
      tape.watch([v, d])
      filled, _ = tf.sparse.fill_empty_rows(tf.SparseTensor(COORDS, v, SHAPE), d)
      loss = tf.reduce_sum(filled.values * tf.range(1.0, 7.0))
    return tape.gradient(loss, [v, d])
  check(fn, VALUES, np.float32(0.5), grad=False)


def test_elementwise_with_dense_and_softmax():
  st = lambda v: tf.SparseTensor(COORDS, v, SHAPE)  # noqa: E731
  dense = rs.uniform(1, 2, size=(4, 5)).astype(np.float32)

  check(lambda v, d: raw.SparseDenseCwiseAdd(sp_indices=COORDS, sp_values=v, sp_shape=SHAPE, dense=d[0]),
        VALUES, dense, grad=False)   # TF has no gradient for it

  def fn(v, d):
    return (raw.SparseDenseCwiseMul(sp_indices=COORDS, sp_values=v, sp_shape=SHAPE, dense=d[:, :1]),
            raw.SparseDenseCwiseDiv(sp_indices=COORDS, sp_values=v, sp_shape=SHAPE, dense=d),
            tf.sparse.softmax(st(v)).values, tf.sparse.add(st(v), d))   # the last: SparseTensorDenseAdd
  check(fn, VALUES, dense)
  # entries out of order: TF sorts them first and returns the values in sorted order (its gradient
  # then pairs them with the unsorted coordinates: not compared)
  check(lambda v: raw.SparseSoftmax(sp_indices=COORDS[[2, 0, 4, 1, 3]], sp_values=v, sp_shape=SHAPE), VALUES,
        grad=False)
  check(lambda i, v, d: (raw.SparseDenseCwiseMul(sp_indices=i, sp_values=v, sp_shape=SHAPE, dense=d),
                         tf.sparse.softmax(tf.SparseTensor(i, v, SHAPE)).values), COORDS, VALUES, dense, vmap=False)


def test_sparse_add_and_its_gradient():
  other = np.array([[0, 1], [1, 1], [3, 3], [3, 4]], np.int64)

  def fn(a, b):   # SparseAdd, and SparseAddGrad in the tape's gradient
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      total = tf.sparse.add(tf.SparseTensor(COORDS, a, SHAPE), tf.SparseTensor(other, b, SHAPE))
      kept = tf.sparse.add(tf.SparseTensor(COORDS, a, SHAPE), tf.SparseTensor(other, b, SHAPE), threshold=0.3)
      loss = tf.reduce_sum(total.values ** 2)
    return total.indices, total.values, kept.indices, kept.values, tape.gradient(loss, [a, b])
  b = np.array([-VALUES[0], 0.2, 1.5, -0.1], np.float32)   # cancels an entry; small sums below 0.3
  check(fn, VALUES, b, grad=False, vmap=False, jit=False)


def test_output_size_that_depends_on_traced_coordinates_is_refused_under_jit():
  @tf.function
  def fn(i, v):
    return tf.sparse.fill_empty_rows(tf.SparseTensor(i, v, SHAPE), 0.0)[0].values
  jax_fn, params = jaxport.convert(fn, COORDS, VALUES)
  assert_close(jax_fn(params, COORDS, VALUES)[0], fn(COORDS, VALUES), 1e-6, 1e-6)
  with pytest.raises(DynamicShapeError, match="SparseFillEmptyRows"):
    jax.jit(jax_fn)(params, COORDS, VALUES)


def test_tf1_feature_column_model():
  """A `tf.compat.v1` wide model on feature columns (TF's own code): embedding columns over sparse ids
  (plain and weighted), an indicator column and a numeric one, then two dense layers, fed through
  sparse placeholders. Converted from the GraphDef, it matches the Session eagerly, and `jax.grad`
  matches `tf.gradients` for the price and every variable (embedding tables included)."""
  from tf1_oracle import v1_graph
  fc = tf.compat.v1.feature_column
  feeds = {"item": (np.array([[0, 0], [0, 1], [1, 0], [3, 0], [3, 1], [3, 2]]), np.array([4, 9, 4, 0, 29, 9])),
           "tag": (np.array([[0, 0], [2, 0], [2, 1]]), np.array([3, 1, 3])),
           "tag_weight": (np.array([[0, 0], [2, 0], [2, 1]]), np.array([0.5, 2.0, 1.0], np.float32)),
           "bucket": (np.array([[1, 0], [2, 0], [3, 0]]), np.array([4, 0, 2]))}   # rows without ids: 1, 2, 0
  price = rs.normal(size=(4, 1)).astype(np.float32)
  with v1_graph() as graph:
    columns = [fc.embedding_column(fc.categorical_column_with_identity("item", 30), 4, combiner="sqrtn"),
               fc.embedding_column(fc.weighted_categorical_column(
                   fc.categorical_column_with_identity("tag", 20), "tag_weight"), 3, combiner="mean"),
               fc.indicator_column(fc.categorical_column_with_identity("bucket", 5)),
               fc.numeric_column("price")]
    placeholders = {name: tf.compat.v1.sparse_placeholder(tf.float32 if name == "tag_weight" else tf.int64,
                                                          name=name) for name in feeds}
    price_in = tf.compat.v1.placeholder(tf.float32, [None, 1], name="price")
    net = fc.input_layer({**placeholders, "price": price_in}, columns)
    w1 = tf.compat.v1.get_variable("w1", [net.shape[1], 8])
    w2 = tf.compat.v1.get_variable("w2", [8, 1])
    out = tf.matmul(tf.nn.relu(tf.matmul(net, w1)), w2)
    variables = tf.compat.v1.global_variables()
    grads = [tf.convert_to_tensor(g) for g in tf.gradients(tf.reduce_sum(out * out), [price_in] + variables)]
    feed = {price_in: price}
    for name, (indices, values) in feeds.items():
      feed[placeholders[name]] = tf.compat.v1.SparseTensorValue(indices, values, [4, 3])
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      var_values = sess.run(variables)
      expected, expected_grads = sess.run([out, grads], feed)
  inputs = [t for name in feeds for t in (placeholders[name].indices, placeholders[name].values,
                                          placeholders[name].dense_shape)] + [price_in]
  args = [a for name in feeds for a in (*feeds[name], np.array([4, 3]))] + [price]
  keys = [v.op.name for v in variables]
  with jaxport.override_config("allow_host_callback", False):
    jax_fn, params = jaxport.convert_graph_def(graph.as_graph_def(), [t.name for t in inputs], [out.name],
                                               variables=dict(zip(keys, var_values)))
  got, _ = jax_fn(params, *args)
  assert_close(got[0], expected, 1e-5, 1e-5, "eager")

  def loss(p, x):
    return jax.numpy.sum(jax_fn({**params, **p}, *args[:-1], x)[0][0] ** 2)
  d_params, d_price = jax.grad(loss, argnums=(0, 1))(dict(zip(keys, var_values)), price)
  assert_close([d_price] + [d_params[k] for k in keys], expected_grads, 1e-4, 1e-5, "grad")
