"""The kernels behind `tf.RaggedTensor` (RaggedTensorToTensor, RaggedGather, RaggedRange) against TF.

With the row partitions as constants every check also runs under jit, grad and vmap; `to_tensor` with
a requested shape is also checked with its partitions passed in (traced under jit).
"""
import numpy as np
import pytest
import tensorflow as tf

import jax
import jaxport
from jaxport.errors import DynamicShapeError
from oracle import check, run_rule

rs = np.random.RandomState(0)
VALUES = rs.normal(size=(7, 3)).astype(np.float32)
LENGTHS = np.array([2, 0, 4, 1], np.int64)   # row 1 is empty
ROWIDS = tf.constant([0, 0, 2, 2, 2, 3, 3], tf.int64)


def _ragged(v, lengths=LENGTHS):
  return tf.RaggedTensor.from_row_lengths(v, lengths)


def test_to_tensor():
  # RaggedTensorToTensor: row splits, value row ids (FIRST_DIM_SIZE, VALUE_ROWIDS), two ragged levels,
  # a default value, and requested shapes that cut rows and columns off or pad them
  def fn(v, d):
    nested = tf.RaggedTensor.from_row_lengths(_ragged(v[:, 0]), [1, 2, 1])
    return (_ragged(v).to_tensor(), _ragged(v).to_tensor(default_value=d),
            _ragged(v).to_tensor(shape=[3, 2, 3]), _ragged(v).to_tensor(shape=[5, 6, None]),
            tf.RaggedTensor.from_value_rowids(v, ROWIDS, nrows=5).to_tensor(default_value=d[1]),
            nested.to_tensor(), nested.to_tensor(default_value=d[0], shape=[3, 2, 3]))
  check(fn, VALUES, rs.normal(size=3).astype(np.float32))


def test_to_tensor_with_traced_partitions_under_jit():
  # a requested shape fixes every size, so the row lengths may be traced
  check(lambda v, lengths: _ragged(v, lengths).to_tensor(shape=[4, 5, 3]), VALUES, LENGTHS, vmap=False)
  nested = lambda v, lengths: tf.RaggedTensor.from_row_lengths(_ragged(v[:, 0], lengths), [1, 2, 1])  # noqa: E731
  check(lambda v, lengths: nested(v, lengths).to_tensor(shape=[3, 2, 3]), VALUES, LENGTHS, vmap=False)


def test_to_tensor_without_a_shape_needs_known_partitions():
  @tf.function
  def fn(v, lengths):
    return _ragged(v, lengths).to_tensor()
  jax_fn, params = jaxport.convert(fn, VALUES, LENGTHS)
  np.testing.assert_array_equal(jax_fn(params, VALUES, LENGTHS)[0], fn(VALUES, LENGTHS))
  with pytest.raises(DynamicShapeError, match="RaggedTensorToTensor"):
    jax.jit(jax_fn)(params, VALUES, LENGTHS)


def test_ragged_gather():
  # RaggedGather: 1-d and 2-d indices, one and two ragged levels; gradients reach the picked values
  def fn(v):
    nested = tf.RaggedTensor.from_row_lengths(_ragged(v), [1, 2, 1])
    return (tf.gather(_ragged(v), [2, 0, 2, 1]).to_tensor(), tf.gather(_ragged(v), [[3, 0], [2, 2]]).to_tensor(),
            tf.gather(nested, [2, 1]).to_tensor(), tf.gather(nested, [1]).flat_values)
  check(fn, VALUES)
  with pytest.raises(ValueError, match=r"index 4 is not in \[0, 4\)"):
    run_rule("RaggedGather", np.array([0, 2, 2, 6, 7]), VALUES, np.array([1, 4]), PARAMS_RAGGED_RANK=1,
             OUTPUT_RAGGED_RANK=1)


def test_ragged_range():
  # RaggedRange: broadcast scalars, negative and fractional steps, empty rows, int and float
  check(lambda x: (tf.ragged.range([0, 5, 3, 2], [4, 1, 3, 9], [1, -2, 1, 3]).flat_values,
                   tf.ragged.range([0, 5, 3, 2], [4, 1, 3, 9], [1, -2, 1, 3]).row_splits,
                   x * tf.ragged.range([0.0, 1.5], 2.25, 0.25).flat_values,
                   tf.ragged.range(tf.constant([3, 7], tf.int64)).row_splits,
                   tf.ragged.range(-1.0, [2.0, -3.0], [0.7, -0.4], row_splits_dtype=tf.int32).flat_values),
        np.float32(2.0))
  with pytest.raises(ValueError, match="delta is 0"):
    run_rule("RaggedRange", np.array([0]), np.array([3]), np.array([0]), Tsplits=np.int64)


def test_bag_of_words_model():
  """Ids and row lengths in, a ragged bag per example, averaged embeddings, a dense layer: its forward
  pass, its gradient and a jitted call (the widths come from a requested shape) all match TF."""
  table = tf.Variable(rs.normal(size=(12, 4)).astype(np.float32))
  dense = tf.Variable(rs.normal(size=(4, 2)).astype(np.float32))
  ids = np.array([3, 1, 1, 7, 0, 11, 5], np.int32)

  def fn(scale):
    bags = tf.RaggedTensor.from_row_lengths(ids, LENGTHS)
    embedded = tf.ragged.map_flat_values(tf.nn.embedding_lookup, table, bags) * scale
    padded = embedded.to_tensor(shape=[4, 4, 4])
    mask = tf.sequence_mask(bags.row_lengths(), 4, dtype=tf.float32)[..., None]
    pooled = tf.reduce_sum(padded * mask, 1) / tf.maximum(tf.reduce_sum(mask, 1), 1.0)
    return tf.matmul(pooled, dense), tf.reduce_mean(embedded, axis=1)
  with jaxport.override_config("allow_host_callback", False):
    check(fn, np.float32(1.5), vmap=False)
