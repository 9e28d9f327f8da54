"""SparseTensors cut and joined (SparseSlice and its SparseSliceGrad, SparseConcat, SparseSplit,
SparseSparseMaximum, SparseSparseMinimum) and RaggedTensorToSparse, against TF.

The coordinates are constants of the TF function and the values its inputs, so every check also runs
under jit and vmap; gradients are compared with TF's where TF has one, else with TF's gradient of the
same computation on dense tensors. Every op here runs natively (host callbacks are off).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import DynamicShapeError, InvalidNodeError
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)
COORDS = np.array([[0, 1], [0, 3], [2, 0], [2, 2], [3, 3]], np.int64)   # row 1 is empty
SHAPE = np.array([4, 5], np.int64)
SHUFFLED = COORDS[[3, 0, 4, 2, 1]]
VALUES = rs.normal(size=5).astype(np.float32)
COORDS3 = np.array([[0, 0, 1], [0, 2, 0], [1, 1, 1], [1, 2, 2], [2, 0, 0], [2, 1, 2]], np.int64)
SHAPE3 = np.array([3, 3, 3], np.int64)
VALUES3 = rs.normal(size=6).astype(np.float32)
COORDS1 = np.array([[3], [0], [4], [1], [2]], np.int64)   # 1-D, unordered


@pytest.fixture(autouse=True)
def _native_only():
  with jaxport.override_config("allow_host_callback", False):
    yield


def _st(indices, values, shape=SHAPE):
  return tf.SparseTensor(indices, values, shape)


def _parts(*sparse):
  return [t for s in sparse for t in (s.indices, s.values, s.dense_shape)]


def _check_grad_against_dense(sparse_fn, dense_fn, *args):
  """TF has no gradient for the op: the converted sparse program's `jax.grad` against TF's gradient of
  the same computation written with dense tensors (both give one dense output)."""
  jax_fn, params = jaxport.convert(sparse_fn, *args)
  xs = [tf.constant(a) for a in args]
  with tf.GradientTape() as tape:
    tape.watch(xs)
    expected = dense_fn(*xs)
    weights = rs.normal(size=tuple(expected.shape)).astype(np.float32)
    loss = tf.reduce_sum(expected * weights)
  assert_close(jax_fn(params, *args)[0], expected, 1e-6, 1e-6, "forward")
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(jax_fn(params, *a)[0] * weights), argnums=tuple(range(len(args)))))
  assert_close(list(grads(*args)), tape.gradient(loss, xs), 1e-5, 1e-5, "grad")


# --------------------------------------------------------------------------- SparseSlice


def test_sparse_slice():
  # in-range, overhanging, negative-start and empty selections; unordered entries keep their order
  def fn(v, v3):
    outs = [tf.sparse.slice(_st(COORDS, v), [0, 1], [3, 3]), tf.sparse.slice(_st(SHUFFLED, v), [1, 2], [9, 9]),
            tf.sparse.slice(_st(COORDS, v), [-1, -2], [2, 4]), tf.sparse.slice(_st(COORDS, v), [1, 0], [1, 5]),
            tf.sparse.slice(_st(COORDS, v), [7, 0], [2, 2]),
            tf.sparse.slice(_st(COORDS3, v3, SHAPE3), [1, 0, 1], [2, 2, 2]),
            tf.sparse.slice(_st(COORDS1, v, [5]), [2], [2])]
    return _parts(*outs)
  check(fn, VALUES, VALUES3)   # the gradient: TF's SparseSliceGrad
  ints = rs.randint(-9, 9, 5).astype(np.int32)
  check(lambda v: _parts(tf.sparse.slice(_st(SHUFFLED, v), [0, 2], [3, 2])), ints)


def test_sparse_slice_gradient_op():
  def fn(v):   # the tape writes SparseSliceGrad
    with tf.GradientTape() as tape:
      tape.watch(v)
      part = tf.sparse.slice(_st(SHUFFLED, v), [0, 1], [3, 4])
      loss = tf.reduce_sum(part.values * tf.range(1.0, 1.0 + tf.cast(tf.size(part.values), tf.float32)))
    return tape.gradient(loss, v)
  check(fn, VALUES, grad=False)
  g = np.array([1.5, -2.0], np.float32)
  check(lambda g: raw.SparseSliceGrad(backprop_val_grad=g, input_indices=SHUFFLED, input_start=[0, 1],
                                      output_indices=np.array([[2, 1], [0, 0]])), g, grad=False)


# --------------------------------------------------------------------------- SparseConcat


def test_sparse_concat_along_each_dim():
  # TF sorts the output row-major whatever the inputs' order; three inputs, negative concat_dim, 1-D/3-D
  other = np.array([[3, 0], [0, 4], [1, 1]], np.int64)

  def fn(v, w, v3):
    a, b = _st(SHUFFLED, v), _st(other, w, [4, 6])
    outs = [tf.sparse.concat(1, [a, b]), tf.sparse.concat(-1, [b, a, b]),
            tf.sparse.concat(0, [a, _st(other, w, [4, 5])]),
            tf.sparse.concat(0, [_st(COORDS1, v, [5]), _st(other[:, 1:], w, [5])])]
    for axis in range(3):
      outs.append(tf.sparse.concat(axis, [_st(COORDS3, v3, SHAPE3), _st(COORDS3[::-1], v3 * 2, SHAPE3)]))
    return _parts(*outs)
  check(fn, VALUES, rs.normal(size=3).astype(np.float32), VALUES3, grad=False)   # TF: no gradient
  ints = rs.randint(-9, 9, 5).astype(np.int64)
  check(lambda v: list(raw.SparseConcat(indices=[SHUFFLED, COORDS[:0]], values=[v, v[:0]], shapes=[SHAPE, SHAPE],
                                        concat_dim=0)), ints)
  # no entries at all: an empty [0, rank] result
  check(lambda v: _parts(tf.sparse.concat(1, [_st(COORDS[:0], v[:0]), _st(COORDS[:0], v[:0])])), VALUES)


def test_sparse_concat_gradient_and_to_dense():
  other = np.array([[3, 0], [0, 4]], np.int64)
  _check_grad_against_dense(
      lambda v, w: tf.sparse.to_dense(tf.sparse.concat(1, [_st(SHUFFLED, v), _st(other, w)])),
      lambda v, w: tf.concat([tf.scatter_nd(SHUFFLED, v, SHAPE), tf.scatter_nd(other, w, SHAPE)], 1),
      VALUES, np.array([0.5, -1.0], np.float32))


# --------------------------------------------------------------------------- SparseSplit


def test_sparse_split():
  # uneven splits give the first (size % num_split) pieces one more; entries keep their input order
  def fn(v, v3):
    outs = tf.sparse.split(sp_input=_st(SHUFFLED, v), num_split=3, axis=1)   # widths 2, 2, 1
    outs += tf.sparse.split(sp_input=_st(SHUFFLED, v), num_split=4, axis=0)
    outs += tf.sparse.split(sp_input=_st(COORDS, v), num_split=2, axis=-1)
    outs += tf.sparse.split(sp_input=_st(COORDS1, v, [5]), num_split=5, axis=0)
    outs += tf.sparse.split(sp_input=_st(COORDS3, v3, SHAPE3), num_split=2, axis=2)
    return _parts(*outs)
  check(fn, VALUES, VALUES3, grad=False)   # TF: no gradient
  ints = rs.randint(-9, 9, 5).astype(np.int32)
  check(lambda v: _parts(*tf.sparse.split(sp_input=_st(COORDS, v), num_split=2, axis=0)), ints)
  _check_grad_against_dense(
      lambda v: tf.concat([tf.sparse.to_dense(s) * k for k, s in
                           enumerate(tf.sparse.split(sp_input=_st(COORDS, v), num_split=2, axis=1), 1)], 1),
      lambda v: tf.concat([s * k for k, s in enumerate(tf.split(tf.scatter_nd(COORDS, v, SHAPE), [3, 2], 1), 1)], 1),
      VALUES)


# --------------------------------------------------------------------------- SparseSparseMaximum/Minimum


def test_sparse_maximum_and_minimum():
  other = np.array([[0, 0], [0, 3], [2, 2], [3, 4]], np.int64)

  def fn(v, w, v3):
    outs = []
    for op in (tf.sparse.maximum, tf.sparse.minimum):
      outs += [op(_st(COORDS, v), _st(other, w)), op(_st(COORDS[:0], v[:0]), _st(other, w)),
               op(_st(COORDS3, v3, SHAPE3), _st(COORDS3[1::2], v3[:3], SHAPE3)),
               op(_st(np.sort(COORDS1, 0), v, [5]), _st(np.array([[0], [2], [4]]), w[:3], [5]))]
    # unordered operands: TF accepts them and merges as if ordered (unsorted, repeated coordinates)
    outs += [raw.SparseSparseMaximum(a_indices=SHUFFLED, a_values=v, a_shape=SHAPE, b_indices=other, b_values=w,
                                     b_shape=SHAPE),
             raw.SparseSparseMinimum(a_indices=COORDS, a_values=v, a_shape=SHAPE, b_indices=other[::-1], b_values=w,
                                     b_shape=SHAPE)]
    return [t for o in outs for t in (o if isinstance(o, (list, tuple)) else (o.indices, o.values))]
  w = np.array([0.3, -0.8, 1.2, -0.4], np.float32)
  check(fn, VALUES, w, VALUES3, grad=False)   # TF: no gradient
  ints = rs.randint(-9, 9, 5).astype(np.int32)
  check(lambda v: tf.sparse.maximum(_st(COORDS, v), _st(other, v[:4] * 2)).values, ints)
  _check_grad_against_dense(   # no ties: every pair of values differs, none is 0
      lambda v, w: tf.sparse.to_dense(tf.sparse.maximum(_st(COORDS, v), _st(other, w))) +
      2 * tf.sparse.to_dense(tf.sparse.minimum(_st(COORDS, v), _st(other, w))),
      lambda v, w: (tf.maximum(tf.scatter_nd(COORDS, v, SHAPE), tf.scatter_nd(other, w, SHAPE)) +
                    2 * tf.minimum(tf.scatter_nd(COORDS, v, SHAPE), tf.scatter_nd(other, w, SHAPE))),
      VALUES, w)


# --------------------------------------------------------------------------- RaggedTensorToSparse


def test_ragged_to_sparse():
  # one and two ragged levels, empty rows, uniform inner dims (the sparse rank grows by them)
  def fn(v):
    flat = tf.RaggedTensor.from_row_lengths(v[:, 0], [2, 0, 3, 1, 0, 0])
    nested = tf.RaggedTensor.from_row_lengths(flat, [3, 0, 2, 1])
    inner = tf.RaggedTensor.from_row_splits(tf.reshape(v, [6, 2, 2]), tf.constant([0, 4, 4, 6], tf.int32))
    return _parts(flat.to_sparse(), nested.to_sparse(), inner.to_sparse(), inner[1:2].to_sparse())
  check(fn, rs.normal(size=(6, 4)).astype(np.float32))
  ints = np.arange(6, dtype=np.int32)
  check(lambda v: _parts(tf.RaggedTensor.from_row_lengths(v, [1, 0, 5]).to_sparse()), ints)


def test_ragged_to_sparse_with_traced_splits_under_jit():
  # one entry per flat value: with the splits passed in (traced under jit) the sizes are still known
  def fn(v, lengths, outer):
    rt = tf.RaggedTensor.from_row_lengths(v, lengths, validate=False)
    return _parts(rt.to_sparse(), tf.RaggedTensor.from_row_lengths(rt, outer, validate=False).to_sparse())
  check(fn, rs.normal(size=(7, 2)).astype(np.float32), np.array([2, 0, 4, 1], np.int64),
        np.array([3, 1], np.int64), vmap=False)


# --------------------------------------------------------------------------- coordinates passed in


def test_coordinates_passed_in_run_eagerly_and_are_refused_under_jit():
  other = np.array([[3, 0], [0, 4]], np.int64)

  def fn(i, v, j, w):
    a, b = _st(i, v), _st(j, w)
    return _parts(tf.sparse.slice(a, [1, 1], [3, 3]), tf.sparse.concat(1, [a, b]), tf.sparse.maximum(a, b),
                  *tf.sparse.split(sp_input=a, num_split=2, axis=1))
  args = (COORDS, VALUES, other, np.array([0.5, -1.0], np.float32))
  check(fn, *args, jit=False, vmap=False, grad=False)
  for op, call in (("SparseSlice", lambda i: tf.sparse.slice(_st(i, VALUES), [1, 1], [3, 3]).values),
                   ("SparseConcat", lambda i: tf.sparse.concat(0, [_st(i, VALUES), _st(i, VALUES)]).values),
                   ("SparseSplit", lambda i: tf.sparse.split(sp_input=_st(i, VALUES), num_split=2, axis=0)[0].values),
                   ("SparseSparseMinimum", lambda i: tf.sparse.minimum(_st(i, VALUES), _st(i, VALUES)).values)):
    jax_fn, params = jaxport.convert(call, COORDS)
    assert_close(jax_fn(params, COORDS)[0], tf.function(call)(COORDS), 1e-6, 1e-6, op)
    with pytest.raises(DynamicShapeError, match=op):
      jax.jit(jax_fn)(params, COORDS)


# --------------------------------------------------------------------------- refusals

V2, V3 = VALUES[:2], VALUES[:3]
REFUSED = [
    ("SparseSlice", (COORDS, VALUES, SHAPE, np.array([0, 0]), np.array([-1, 2])), {}, "non-negative size"),
    ("SparseSlice", (COORDS, VALUES, SHAPE, np.array([0]), np.array([2])), {}, "start to be a vector of length 2"),
    ("SparseSlice", (COORDS3, VALUES3, SHAPE, np.array([0, 0]), np.array([2, 2])), {}, r"Index rank \(3\) and shape"),
    ("SparseSliceGrad", (V2, COORDS, np.array([0, 0]), COORDS[[1, 0]]), {}, "aren't all propagated"),
    ("SparseConcat", (COORDS, COORDS3, VALUES, VALUES3, SHAPE, SHAPE3), {"concat_dim": 0}, "Ranks of all input"),
    ("SparseConcat", (COORDS, COORDS, VALUES, VALUES, SHAPE, np.array([4, 6])), {"concat_dim": 0},
     "Input shapes must match"),
    ("SparseConcat", (COORDS, COORDS, VALUES, VALUES, SHAPE, SHAPE), {"concat_dim": 2}, "Concat dimension"),
    ("SparseSplit", (np.int64(1), COORDS, VALUES, SHAPE), {"num_split": 6}, "num_split should be between"),
    ("SparseSplit", (np.int64(2), COORDS, VALUES, SHAPE), {"num_split": 2}, "axis should be in range"),
    ("SparseSplit", (np.int64(0), np.array([[0, 1], [0, 5]]), V2, SHAPE), {"num_split": 2}, "out of bounds"),
    ("SparseSparseMaximum", (COORDS, VALUES, SHAPE, COORDS3, VALUES3, SHAPE3), {}, "same ranks"),
    ("SparseSparseMinimum", (COORDS, VALUES, SHAPE, COORDS, VALUES, np.array([4, 6])), {}, "shapes do not match"),
    ("SparseSparseMaximum", (COORDS, VALUES, SHAPE, np.array([[-1, 0]]), V2[:1], SHAPE), {}, "out of bounds"),
    ("RaggedTensorToSparse", (np.array([0, 2, 1, 3]), V3), {}, "non decreasing"),
    ("RaggedTensorToSparse", (np.array([1, 3]), V3), {}, "First value"),
    ("RaggedTensorToSparse", (np.array([0, 2]), np.array([0, 1, 2]), V3), {}, "Final value"),
]


@pytest.mark.parametrize("op, inputs, attrs, match", REFUSED, ids=[f"{r[0]}-{r[3]}" for r in REFUSED])
def test_refuses_what_tf_refuses(op, inputs, attrs, match):
  with pytest.raises(InvalidNodeError, match=match):
    run_rule(op, *inputs, **attrs)
  # TF's kernel refuses the same inputs
  names = {"SparseSlice": ["indices", "values", "shape", "start", "size"],
           "SparseSliceGrad": ["backprop_val_grad", "input_indices", "input_start", "output_indices"],
           "SparseSplit": ["split_dim", "indices", "values", "shape"],
           "SparseSparseMaximum": ["a_indices", "a_values", "a_shape", "b_indices", "b_values", "b_shape"]}
  names["SparseSparseMinimum"] = names["SparseSparseMaximum"]
  if op == "SparseConcat":
    kwargs = dict(indices=list(inputs[:2]), values=list(inputs[2:4]), shapes=list(inputs[4:]))
  elif op == "RaggedTensorToSparse":
    kwargs = dict(rt_nested_splits=list(inputs[:-1]), rt_dense_values=inputs[-1])
  else:
    kwargs = dict(zip(names[op], inputs))
  with pytest.raises((tf.errors.InvalidArgumentError, tf.errors.InternalError)):
    getattr(raw, op)(**kwargs, **attrs)


# --------------------------------------------------------------------------- a program


def test_feature_batch_pipeline():
  """Two sparse feature batches (rows: examples, columns: feature ids) joined into one batch, a window of
  examples sliced out, a second feature group concatenated beside it, its columns split in two halves
  combined by an element-wise maximum, then a linear layer (`sparse_dense_matmul`)."""
  first = np.array([[0, 2], [0, 5], [1, 0], [2, 3], [2, 5]], np.int64)
  second = np.array([[1, 4], [0, 1], [2, 2], [1, 1]], np.int64)   # unordered
  extra = np.array([[0, 0], [2, 1], [3, 2], [4, 0]], np.int64)

  def pipeline(v1, v2, v3, w):
    batch = tf.sparse.concat(0, [_st(first, v1, [3, 6]), _st(second, v2, [3, 6])])   # 6 examples
    window = tf.sparse.slice(batch, [1, 0], [5, 6])
    features = tf.sparse.concat(1, [window, _st(extra, v3, [5, 3])])   # 9 columns
    left, right = tf.sparse.split(sp_input=tf.sparse.slice(features, [0, 0], [5, 8]), num_split=2, axis=1)
    pooled = tf.sparse.maximum(left, right)
    return tf.sparse.sparse_dense_matmul(pooled, w), pooled.indices, tf.sparse.to_dense(features)
  args = (rs.normal(size=5).astype(np.float32), rs.normal(size=4).astype(np.float32),
          rs.normal(size=4).astype(np.float32), rs.normal(size=(4, 2)).astype(np.float32))
  check(pipeline, *args, grad=False)   # TF: no gradient through SparseConcat (None) or SparseSplit

  def dense(v1, v2, v3, w):
    batch = tf.concat([tf.scatter_nd(first, v1, [3, 6]), tf.scatter_nd(second, v2, [3, 6])], 0)
    features = tf.concat([batch[1:], tf.scatter_nd(extra, v3, [5, 3])], 1)
    return tf.matmul(tf.maximum(features[:, :4], features[:, 4:8]), w)
  _check_grad_against_dense(lambda *a: pipeline(*a)[0], dense, *args)
