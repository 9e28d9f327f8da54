"""Sorted segment reductions, DynamicStitch, DynamicPartition and SparseToDense against TF.

The ids/indices/partitions are constants of the TF function here, so every check also runs
under jit, grad and vmap; `test_dynamic_shapes.py` passes them in as inputs.
"""
import numpy as np
import pytest
import tensorflow as tf

from oracle import check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)
DATA = rs.normal(size=(6, 3)).astype(np.float32)
IDS = [0, 0, 2, 2, 2, 4]   # segments 1 and 3 are empty


def test_sorted_segment_reductions():
  ids = tf.constant(IDS)
  fn = lambda x: (raw.SegmentSum(data=x, segment_ids=ids), raw.SegmentMean(data=x, segment_ids=ids),  # noqa: E731
                  raw.SegmentMax(data=x, segment_ids=ids), raw.SegmentMin(data=x, segment_ids=ids),
                  raw.SegmentProd(data=x, segment_ids=ids))
  check(fn, DATA)


def test_sorted_segment_int_and_higher_rank():
  ids = tf.constant([0, 1, 1, 3], tf.int64)
  data = rs.randint(-7, 8, (4, 2, 2)).astype(np.int32)
  check(lambda x: (raw.SegmentSum(data=x, segment_ids=ids), raw.SegmentMean(data=x, segment_ids=ids),
                   raw.SegmentMax(data=x, segment_ids=ids), raw.SegmentMin(data=x, segment_ids=ids),
                   raw.SegmentProd(data=x, segment_ids=ids)), data)


def test_segment_prod_gradient_with_zeros():
  data = np.array([2.0, 0.0, 3.0, 0.0, 0.0, 5.0], np.float32)
  check(lambda x: raw.SegmentProd(data=x, segment_ids=tf.constant([0, 0, 1, 1, 1, 2])), data, vmap=False)


def test_segment_ids_must_be_sorted():
  with pytest.raises(ValueError, match="sorted"):
    run_rule("SegmentSum", DATA[:3], np.array([1, 0, 2]))


def test_dynamic_stitch():
  idx = [tf.constant([0, 2]), tf.constant([[4], [1]])]   # row 3 is not named: zeros
  fn = lambda a, b: (raw.DynamicStitch(indices=idx, data=[a, b]),  # noqa: E731
                     raw.ParallelDynamicStitch(indices=idx, data=[a, b]))
  check(fn, DATA[:2], DATA[2:4].reshape(2, 1, 3))
  # index 1 twice: the last wins. TF's gradient also flows to the overwritten entry, jaxport's does not
  dup = [tf.constant([0, 1]), tf.constant([1, 2])]
  check(lambda a, b: raw.DynamicStitch(indices=dup, data=[a, b]), DATA[:2], DATA[2:4], grad=False)


def test_dynamic_partition():
  parts = tf.constant([1, 0, 2, 1, 1, 0])
  check(lambda x: (raw.DynamicPartition(data=x, partitions=parts, num_partitions=4),
                   raw.DynamicPartition(data=tf.reshape(x, [2, 3, 3]), partitions=tf.reshape(parts, [2, 3]),
                                        num_partitions=3)), DATA)
  with pytest.raises(ValueError, match=r"partitions must be in \[0, 2\)"):
    run_rule("DynamicPartition", DATA, np.array([0, 1, 2, 0, 0, 0]), num_partitions=2)


def test_sparse_to_dense():
  indices = tf.constant([[0, 1], [1, 0], [2, 3]])
  fn = lambda v, d: (  # noqa: E731
      raw.SparseToDense(sparse_indices=indices, output_shape=[3, 4], sparse_values=v, default_value=d))
  check(fn, DATA[:3, 0], np.float32(-1.5))
  fn = lambda v, d: (  # noqa: E731   TF's gradient fails for scalar values and vector/scalar indices
      raw.SparseToDense(sparse_indices=indices, output_shape=[3, 4], sparse_values=v[2], default_value=d),
      raw.SparseToDense(sparse_indices=tf.constant([4, 0]), output_shape=[5], sparse_values=v[0],
                        default_value=d, validate_indices=False),   # unsorted, one scalar value
      raw.SparseToDense(sparse_indices=tf.constant(2), output_shape=[3], sparse_values=v[1], default_value=d))
  check(fn, DATA[:3, 0], np.float32(-1.5), grad=False)


def test_sparse_to_dense_validates_known_indices():
  args = (np.array([3, 0], np.int32), np.array([5]), np.float32(1), np.float32(0))
  with pytest.raises(ValueError, match="out of order"):
    run_rule("SparseToDense", *args, validate_indices=True, T=np.float32)
  np.testing.assert_array_equal(run_rule("SparseToDense", *args, validate_indices=False, T=np.float32),
                                [1, 0, 0, 1, 0])
  with pytest.raises(ValueError, match="out of bounds"):
    run_rule("SparseToDense", np.array([[0, 4]]), np.array([2, 4]), np.float32(1), np.float32(0), T=np.float32)
