"""Values that decide shapes: without jit the converted function sees concrete arrays and
matches TF; under jit it raises `DynamicShapeError` naming the op, node and operand (inside a cond's
branch, at run time and only when that branch is taken)."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import (DynamicShapeError, JaxportError, PaddedSizeError, RunTimeBranchWarning,
                            UnsupportedValueError)
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)
X = rs.normal(size=(2, 3)).astype(np.float32)
IDS = np.array([1, 1, 0, 4, 2], np.int32)


def i32(*values):
  return np.array(values, np.int32)


def eager_matches_tf_and_jit_names_node(fn, *args, op: str, operand: str, grad: bool = True):
  """`fn` converted: eager calls match TF; under jit, the op's `operand` raises DynamicShapeError."""
  check(fn, *args, jit=False, vmap=False, grad=grad)
  converted = jaxport.convert_functional(fn, *args)
  with pytest.raises(DynamicShapeError) as info:
    jax.jit(converted)(*args)
  error = info.value
  assert isinstance(error, JaxportError) and isinstance(error, ValueError)
  assert (error.op, error.operand) == (op, operand), str(error)
  assert f"{op} node {error.node!r} needs its `{operand}`" in str(error)
  assert "without jax.jit" in str(error)


CASES = {
    "Range": (lambda n: tf.range(1, n, 2), [np.int32(8)], "limit"),
    "Fill": (lambda x, d: tf.fill(d, 2.0) * tf.reduce_sum(x), [X, i32(2, 4)], "dims"),
    "Tile": (lambda x, m: tf.tile(x, m), [X, i32(2, 1)], "multiples"),
    "Reshape": (lambda x, s: tf.reshape(x, s), [X, i32(3, -1)], "shape"),
    "OneHot": (lambda i, d: tf.one_hot(i, d), [IDS, np.int32(6)], "depth"),
    "TopKV2": (lambda x, k: tf.math.top_k(x, k).values, [X, np.int32(2)], "k"),
    "Empty": (lambda x, s: raw.Empty(shape=s, dtype=tf.float32, init=True) + x[0, 0], [X, i32(2, 2)], "shape"),
    "Bincount": (lambda a, s, w: raw.Bincount(arr=a, size=s, weights=w), [IDS, np.int32(6), X.ravel()[:5]],
                 "size"),
    "DenseBincount": (lambda a, s: raw.DenseBincount(input=a, size=s, weights=tf.zeros([0], tf.int32)),
                      [IDS, np.int32(3)], "size"),
    "SparseToDense": (lambda s, v: raw.SparseToDense(sparse_indices=[[0], [2]], output_shape=s, sparse_values=v,
                                                     default_value=0.5), [i32(4), X[0, :2]], "output_shape"),
}
NO_TF_GRAD = {"Bincount"}


@pytest.mark.parametrize("op", sorted(CASES))
def test_shape_operand_from_an_input(op):
  fn, args, operand = CASES[op]
  eager_matches_tf_and_jit_names_node(fn, *args, op=op, operand=operand, grad=op not in NO_TF_GRAD)


def test_value_dependent_outputs():
  """Ops whose output shape is decided by their data: Where (also via a boolean mask), Unique, ListDiff."""
  eager_matches_tf_and_jit_names_node(lambda x: tf.boolean_mask(x, x > 0), X, op="Where",
                                      operand="input values")
  # Integer ids are padded under jit instead, where only row updates read them (test_padded_unique.py).
  eager_matches_tf_and_jit_names_node(lambda x: tf.unique(x), IDS.astype(np.float32), op="Unique",
                                      operand="input values", grad=False)
  eager_matches_tf_and_jit_names_node(lambda x, y: raw.ListDiff(x=x, y=y), IDS, i32(1, 3), op="ListDiff",
                                      operand="x")


def test_segment_ids_and_partitions_from_inputs():
  data = rs.normal(size=(5, 2)).astype(np.float32)
  sorted_ids = np.sort(IDS)
  for op in ("SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin", "SegmentProd"):
    fn = lambda x, s, op=op: getattr(raw, op)(data=x, segment_ids=s)  # noqa: E731
    eager_matches_tf_and_jit_names_node(fn, data, sorted_ids, op=op, operand="segment_ids")
  # Traced partitions pad the outputs instead (test_padded_partitions.py): returning them is refused.
  partition = lambda x, p: raw.DynamicPartition(data=x, partitions=p, num_partitions=5)  # noqa: E731
  check(partition, data, IDS, jit=False, vmap=False)
  with pytest.raises(PaddedSizeError, match="DynamicPartition node 'DynamicPartition' has outputs as long as"):
    jax.jit(jaxport.convert_functional(partition, data, IDS))(data, IDS)
  eager_matches_tf_and_jit_names_node(
      lambda x, i, j: raw.DynamicStitch(indices=[i, j], data=[x[:3], x[3:]]), data, i32(0, 5, 2), i32(1, 3),
      op="DynamicStitch", operand="indices")


def test_constant_operands_still_work_under_jit():
  """Closing over the value (a constant of the TF function) is the way out under jit."""
  check(lambda x: (tf.reshape(x, [3, -1]), tf.range(1, 8, 2), raw.Bincount(arr=tf.constant(IDS), size=6,
                                                                           weights=tf.zeros([0], tf.int32))), X)


def test_static_value_helpers():
  from jaxport.convert.ops._util import known_value, static_ints
  assert static_ints(jax.numpy.asarray([2, 3])) == [2, 3]   # a concrete jax Array: an eager call
  assert known_value(np.int32(4)) == 4
  seen = []
  jax.jit(lambda a: seen.append(known_value(a)) or a)(1)
  assert seen == [None]
  with pytest.raises(DynamicShapeError, match="`size` is needed as a trace-time constant"):
    jax.jit(lambda a: static_ints(a, "size"))(1)
  with pytest.raises(DynamicShapeError, match="Empty node 'node' needs its `shape`"):
    jax.jit(lambda s: run_rule("Empty", s, dtype=np.float32))(i32(2))


def test_slices_with_bounds_from_inputs():
  """Range slices whose bounds are inputs: eager calls match TF. Under jit a window `x[i : i + k]` and a
  slice whose traced begin elements have static sizes run; a size that depends on the input keeps its
  clear error."""
  fn = lambda x, i: (x[:, i:i + 2], tf.slice(x, [0, i], [-1, 1]))  # noqa: E731
  check(fn, X, np.int32(1), vmap=False)
  for sized_by_input, error, message in (
      (lambda x, i: x[:, i:], DynamicShapeError, "StridedSlice node .* needs its `range bounds`"),
      (lambda x, i: tf.slice(x, [0, i], [-1, -1]), UnsupportedValueError, "Slice node .* every size must be known")):
    check(sized_by_input, X, np.int32(1), jit=False, vmap=False)
    with pytest.raises(error, match=message):
      jax.jit(jaxport.convert_functional(sized_by_input, X, np.int32(1)))(X, np.int32(1))


def _first_rows_sum(x, m):   # a shape from values: tf.range(sum(m)), as Longformer's global attention indices
  return lambda: tf.reduce_sum(tf.gather(x, tf.range(tf.reduce_sum(m))), axis=0)


@pytest.mark.parametrize("m", [i32(1, 1), i32(0, 0)], ids=["then", "else"])
def test_value_dependent_shape_in_a_branch_picked_by_an_input(m):
  """If/Case with an input-dependent predicate: an eager call runs only the taken branch, on concrete
  values as TF does, so a shape inside it may depend on values. Under jit that branch is a run-time
  error, warned about (naming the node) and raised only when taken; the other branch runs."""
  if_fn = lambda x, m: tf.cond(tf.reduce_any(m > 0), _first_rows_sum(x, m), lambda: tf.zeros([3]))  # noqa: E731
  case_fn = lambda x, m: tf.switch_case(  # noqa: E731
      tf.reduce_sum(m), [lambda: tf.zeros([3]), _first_rows_sum(x, m), _first_rows_sum(x, m)])
  for fn, op, operand in ((if_fn, "StatelessIf", "predicate"), (case_fn, "StatelessCase", "branch_index")):
    check(fn, X, m, jit=False, vmap=False)
    converted = jax.jit(jaxport.convert_functional(fn, X, m))
    with pytest.warns(RunTimeBranchWarning, match=rf"{op} node .*\(Range node"):
      converted.lower(X, m)
    if m.sum() > 0:
      with pytest.raises(Exception, match=rf"{op} node .* needs its `{operand}`.*without jax.jit"):
        jax.block_until_ready(converted(X, m))
    else:
      assert_close(converted(X, m), fn(X, m), 0, 0, "the traceable branch")
