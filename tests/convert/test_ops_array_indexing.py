"""Slicing, gathering and scattering ops against TF, including traced indices and TF's mask semantics."""
import jax
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.errors import DynamicShapeError
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)
X = rs.normal(size=(2, 3, 4)).astype(np.float32)


# --------------------------------------------------------------------------- Slice and StridedSlice


@pytest.mark.parametrize("name,fn", [
    ("slice", lambda x: tf.slice(x, [1, 0, 2], [1, -1, 2])),
    ("slice_empty", lambda x: tf.slice(x, [0, 3, 0], [2, 0, -1])),
    ("basic", lambda x: x[1:, ::-1, 1:3]),
    ("ellipsis_shrink", lambda x: x[..., 0]),
    ("new_axis", lambda x: x[:, tf.newaxis, 1, tf.newaxis]),
    ("negative_index", lambda x: x[-1, -2]),
    ("negative_stride_bounds", lambda x: x[:, 3:0:-2, -1:-5:-3]),
    ("clamped_bounds", lambda x: x[-10:10, 5:, :-7]),
    ("ellipsis_middle", lambda x: x[1, ..., tf.newaxis, ::2]),
    ("scalar_result", lambda x: x[1, 2, 3]),
])
def test_static_slices(name, fn):
  check(fn, X)


def test_strided_slice_raw_masks():
  # begin_mask/end_mask ignore the given bounds; shrink ignores begin_mask and end.
  check(lambda x: raw.StridedSlice(input=x, begin=[1, 2, 3], end=[0, 0, 0], strides=[1, -1, 1],
                                   begin_mask=0b011, end_mask=0b110, shrink_axis_mask=0b100), X)
  check(lambda x: raw.StridedSlice(input=x, begin=[0, 1], end=[0, 0], strides=[1, 1],
                                   ellipsis_mask=0b01, new_axis_mask=0b11, shrink_axis_mask=0b10), X)


SPEC = st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.lists(st.integers(-5, 5), min_size=n, max_size=n),
    st.lists(st.integers(-5, 5), min_size=n, max_size=n),
    st.lists(st.sampled_from([-3, -2, -1, 1, 2, 3]), min_size=n, max_size=n),
    st.integers(0, 2 ** n - 1), st.integers(0, 2 ** n - 1), st.sampled_from([0] + [1 << i for i in range(n)]),
    st.integers(0, 2 ** n - 1), st.integers(0, 2 ** n - 1)))


@settings(max_examples=25, deadline=None)
@given(SPEC)
def test_strided_slice_matches_tf(spec):
  begin, end, strides, begin_mask, end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask = spec
  masks = dict(begin_mask=begin_mask, end_mask=end_mask, ellipsis_mask=ellipsis_mask,
               new_axis_mask=new_axis_mask, shrink_axis_mask=shrink_axis_mask)
  vectors = [np.asarray(v, np.int32) for v in (begin, end, strides)]
  try:
    expected = raw.StridedSlice(input=X, begin=begin, end=end, strides=strides, **masks).numpy()
  except tf.errors.InvalidArgumentError:
    with pytest.raises((ValueError, IndexError)):
      run_rule("StridedSlice", X, *vectors, **masks)
    assume(False)
  got_numpy = run_rule("StridedSlice", X, *vectors, **masks)
  got_jit = jax.jit(lambda x: run_rule("StridedSlice", x, *vectors, **masks))(X)
  assert type(got_numpy) is np.ndarray
  assert_close(got_numpy, expected, 0, 0, f"numpy {spec}")
  assert_close(got_jit, expected, 0, 0, f"jit {spec}")


def test_strided_slice_grad_matches_tf():
  shape = np.asarray(X.shape, np.int32)
  check(lambda dy: raw.StridedSliceGrad(shape=shape, begin=[0, 2], end=[0, 0], strides=[1, -2], dy=dy,
                                        begin_mask=1, end_mask=3), X[:, :2])
  check(lambda dy: raw.StridedSliceGrad(shape=shape, begin=[1, 0], end=[2, 0], strides=[1, 1], dy=dy,
                                        ellipsis_mask=2, shrink_axis_mask=1, new_axis_mask=0), X[0])


def test_gradient_inside_tf_function_uses_strided_slice_grad():
  def fn(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = x[:, 1:, ::2] * x[:, 1:, ::2]
    return tape.gradient(y, x)
  check(fn, X)


# --------------------------------------------------------------------------- traced indices


@pytest.mark.parametrize("i", [1, -1])
def test_traced_index(i):
  i = np.int32(i)
  check(lambda x, i: x[i], X, i)
  check(lambda x, i: x[:, i, :], X, i)
  check(lambda x, i: x[..., i, tf.newaxis], X, i)


def test_slice_with_traced_begin():
  check(lambda x, j: tf.slice(x, tf.stack([0, j, 1]), [2, 2, 3]), X, np.int32(1))


def test_traced_index_gradient_in_graph():
  def fn(x, i):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = x[:, i] * x[:, i]
    return tape.gradient(y, x)
  check(fn, X, np.int32(2))


def test_traced_index_in_while_loop():
  def fn(x):
    total = tf.zeros_like(x[0])
    for i in tf.range(tf.shape(x)[0]):
      total += x[i] * tf.cast(i + 1, x.dtype)
    return total
  check(fn, X, vmap=False, grad=False)   # JAX cannot differentiate a while loop with traced bounds


WINDOWS = [lambda x, i: x[i:i + 1], lambda x, i: x[:, i:i + 2, 1:], lambda x, i: x[i:i + 1, i + 1:2 + i]]


@pytest.mark.parametrize("fn", WINDOWS)
def test_traced_windows_have_a_static_size(fn):
  """`x[i : i + k]` with a traced i (a random crop's offsets): the end is the begin plus a constant,
  so the window's size k is static and it runs under jit, its gradient too."""
  for i in (0, 1):
    check(fn, X, np.int32(i), vmap=False)


def test_a_traced_window_past_the_end_is_moved_inside_or_checked():
  """TF shrinks x[i : i + 2] when i + 2 passes the end; a traced window keeps its size, moved inside
  as lax.dynamic_slice moves it, and `enable_checkify_for_asserts` makes that an error."""
  fn = lambda x, i: x[i:i + 2]  # noqa: E731
  jax_fn = jaxport.convert_functional(fn, X, np.int32(0))
  np.testing.assert_array_equal(jax.jit(jax_fn)(X, np.int32(1)), X[0:2])
  with jaxport.override_config("enable_checkify_for_asserts", True):
    checked = jaxport.convert_functional(fn, X, np.int32(0))
    from jax.experimental import checkify
    err, _ = checkify.checkify(jax.jit(checked))(X, np.int32(1))
    with pytest.raises(Exception, match="window of 2 from 1 along dimension 0 leaves its 2 elements"):
      err.throw()
    err, _ = checkify.checkify(jax.jit(checked))(X, np.int32(0))
    err.throw()   # inside: no error


def test_traced_windows_in_tf_gradient_graphs_and_assigns():
  v = tf.Variable(np.zeros_like(X))

  @tf.function
  def fn(x, i):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(x[i:i + 1, i:i + 2] ** 2)
    v[:, i:i + 2].assign(x[:, :2] * 3.0)   # ResourceStridedSliceAssign with a window
    return tape.gradient(y, x), v.read_value()   # StridedSliceGrad with windows

  i = np.int32(1)
  jax_fn, params = jaxport.convert(fn, X, i)
  got, _ = jax.jit(jax_fn)(params, X, i)
  v.assign(np.zeros_like(X))
  for g, w in zip(got, fn(X, i)):
    np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("fn", [lambda x, i: x[:i], lambda x, i: x[:, i, 1:i * 2 + 1]])
def test_traced_range_bounds_raise_clearly(fn):
  """A range whose size depends on a traced begin or end has no static size."""
  converted_fn = jaxport.convert_functional(fn, X, np.int32(0))
  with pytest.raises(DynamicShapeError, match="StridedSlice node .* needs its `range bounds`") as raised:
    jax.jit(converted_fn)(X, np.int32(0))
  assert any("use tf.slice with a traced begin" in note for note in raised.value.__notes__)


def test_reshape_target_from_shape_arithmetic_is_static_under_jit():
  def fn(x):
    s = tf.shape(x)
    flat = tf.reshape(x, tf.stack([s[0] * s[1], -1]))
    return tf.reshape(flat[:, ::2], tf.concat([s[:2], [-1]], 0))

  jax_fn, params = jaxport.convert(fn, tf.TensorSpec([None, 3, 4], tf.float32))
  for batch in (2, 5):
    x = rs.normal(size=(batch, 3, 4)).astype(np.float32)
    assert_close(jax.jit(lambda x: jax_fn(params, x)[0])(x), fn(tf.constant(x)), 0, 0, "jit")


# --------------------------------------------------------------------------- gather

P = rs.normal(size=(3, 4, 5)).astype(np.float32)
IDX = np.array([[2, 0], [1, 1], [3, 2]], np.int32)


@pytest.mark.parametrize("name,fn", [
    ("gather_v1", lambda p, i: raw.Gather(params=p, indices=i % 3)),
    ("axis0", lambda p, i: tf.gather(p, i[:, :1] % 3)),
    ("axis1", lambda p, i: tf.gather(p, i, axis=1)),
    ("axis_neg", lambda p, i: tf.gather(p, i[0], axis=-1)),
    ("scalar_index", lambda p, i: tf.gather(p, i[0, 0], axis=2)),
    ("batch_dims1_axis1", lambda p, i: tf.gather(p, i, axis=1, batch_dims=1)),
    ("batch_dims1_axis2", lambda p, i: tf.gather(p, i, axis=2, batch_dims=1)),
    ("batch_dims2_axis2", lambda p, i: tf.gather(p[:, :2], i[:, :2], axis=2, batch_dims=2)),
    ("batch_dims_neg", lambda p, i: tf.gather(p, i, axis=2, batch_dims=-1)),
    ("gather_nd_full", lambda p, i: tf.gather_nd(p, tf.stack([i[:, 1], i[:, 0], i[:, 1]], -1))),
    ("gather_nd_partial", lambda p, i: tf.gather_nd(p, i[:, :, None] % 3)),
    ("gather_nd_rows", lambda p, i: tf.gather_nd(p, i[:, 1:] % 3)),
    ("gather_nd_batch_dims", lambda p, i: tf.gather_nd(p, i[:, :1], batch_dims=1)),
])
def test_gather(name, fn):
  check(fn, P, IDX)


def test_gather_nd_empty_index_takes_whole_tensor():
  check(lambda p: tf.gather_nd(p, tf.zeros([2, 0], tf.int32)), P, grad=False)   # TF's gradient fails here


def test_gather_constant_folds_to_numpy():
  out = run_rule("GatherNd", np.arange(6).reshape(2, 3), np.asarray([[1, 2], [0, 0]]))
  assert type(out) is np.ndarray
  np.testing.assert_array_equal(out, [5, 0])


def test_out_of_range_gather_clamps():
  """Documented difference: TF raises on CPU; JAX clamps to the last valid index."""
  fn = jaxport.convert_functional(lambda p, i: tf.gather(p, i, axis=1), P, IDX)
  too_big = np.array([[9, 0], [1, 1], [3, 2]], np.int32)
  np.testing.assert_array_equal(fn(P, too_big), tf.gather(P, [[3, 0], [1, 1], [3, 2]], axis=1))


def test_gather_nd_ignore_policy_gives_zeros():
  indices = np.array([[0, 1], [7, 0], [2, 3]], np.int32)
  check(lambda p, i: raw.GatherNd(params=p, indices=i, bad_indices_policy="IGNORE"), P, indices, grad=False)


# --------------------------------------------------------------------------- scatter

DUPLICATES = np.array([[1], [3], [1], [0], [1]], np.int32)
UPDATES = rs.normal(size=(5, 4)).astype(np.float32)
BASE = rs.normal(size=(4, 4)).astype(np.float32)


def test_scatter_nd_sums_duplicates():
  check(lambda i, u: tf.scatter_nd(i, u, [5, 4]), DUPLICATES, UPDATES)
  check(lambda i, u: tf.scatter_nd(i, u, [4, 4]), DUPLICATES, UPDATES.astype(np.int32))
  check(lambda u: tf.scatter_nd([[0, 1], [2, 2], [0, 1]], u, [3, 3]), UPDATES[0, :3])


@pytest.mark.parametrize("op,grad", [("TensorScatterAdd", True), ("TensorScatterSub", True),
                                     ("TensorScatterMax", False), ("TensorScatterMin", False)])
def test_tensor_scatter_with_duplicates(op, grad):
  check(lambda t, i, u: getattr(raw, op)(tensor=t, indices=i, updates=u), BASE, DUPLICATES, UPDATES, grad=grad)


def test_tensor_scatter_update_unique_indices():
  indices = np.array([[0, 3], [2, 1], [3, 3]], np.int32)
  check(lambda t, i, u: tf.tensor_scatter_nd_update(t, i, u), BASE, indices, UPDATES[:3, 0])
  check(lambda t, u: raw.TensorScatterUpdate(tensor=t, indices=[[3], [0]], updates=u), BASE, UPDATES[:2])


def test_scatter_constant_folds_to_numpy():
  out = run_rule("ScatterNd", np.asarray([[1], [1]]), np.asarray([2, 5], np.int32), np.asarray([3]),
                 T=np.int32)
  assert type(out) is np.ndarray and out.dtype == np.int32
  np.testing.assert_array_equal(out, [0, 7, 0])


def test_scatter_traced_updates_into_constant_tensor():
  def scatter_into_zeros(u):
    return tf.tensor_scatter_nd_max(tf.zeros([3, 2]), [[1], [1]], u)

  fn = jaxport.convert_functional(scatter_into_zeros, UPDATES[:2, :2])
  assert_close(jax.jit(fn)(UPDATES[:2, :2]), scatter_into_zeros(UPDATES[:2, :2]), 0, 0)


SEGMENT_DATA = rs.normal(size=(5, 3)).astype(np.float32)
SEGMENT_IDS = np.array([0, 2, -1, 0, 2], np.int32)   # segments 1 and 3 stay empty; -1 is dropped


@pytest.mark.parametrize("op", ["UnsortedSegmentSum", "UnsortedSegmentProd", "UnsortedSegmentMax",
                                "UnsortedSegmentMin"])
def test_unsorted_segment_reductions(op):
  def reduce(d, i):
    return getattr(raw, op)(data=d, segment_ids=i, num_segments=4)
  check(reduce, SEGMENT_DATA, SEGMENT_IDS)
  check(reduce, (SEGMENT_DATA * 4).astype(np.int32), SEGMENT_IDS)
  check(lambda d, i: getattr(raw, op)(data=d, segment_ids=i, num_segments=3), SEGMENT_DATA[:4].reshape(2, 2, 3),
        SEGMENT_IDS[:4].reshape(2, 2))


def test_unsorted_segment_prod_gradient_with_zeros():
  data = np.array([[0, 2], [3, 0], [0, 7], [4, 1], [6, 5]], np.float32)   # segment 0: two zeros, one zero
  check(lambda d: tf.math.unsorted_segment_prod(d, [0, 0, 0, 1, 1], 3), data)


def test_segment_reduction_constant_folds_to_numpy():
  out = run_rule("UnsortedSegmentMax", np.asarray([3, 1, 4], np.int32), np.asarray([1, 1, -1]), np.int32(2))
  assert type(out) is np.ndarray and out.dtype == np.int32
  np.testing.assert_array_equal(out, [np.iinfo(np.int32).min, 3])


def test_gradient_ops_inside_tf_function():
  """A tape inside the converted function emits MirrorPadGrad, ConcatOffset, UnsortedSegmentSum, ..."""
  def fn(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      outs = [tf.pad(x, [[1, 1], [2, 0], [0, 0]], mode="SYMMETRIC") * 2.0,
              tf.pad(x, [[1, 0], [1, 1], [0, 3]], mode="REFLECT"),
              tf.gather(x, [1, 0, 1]), tf.concat([x, x[:, :1]], 1), tf.tile(x, [2, 1, 1]),
              tf.reverse_sequence(x, [1, 3], 1, 0), tf.transpose(x, [2, 0, 1]), tf.stack([x, x], 1)]
    return tape.gradient(outs, x)
  check(fn, X)


def test_keras_random_crop_in_training_mode_runs_under_jit():
  """Keras 3's RandomCrop slices at random offsets with a static size: TF's crops, under jit too."""
  import keras
  images = np.random.RandomState(1).uniform(0, 1, (2, 16, 16, 3)).astype(np.float32)
  layer = keras.layers.RandomCrop(12, 12, seed=1)
  fn = tf.function(lambda v: layer(v, training=True))
  jax_fn, params = jaxport.convert(fn, images)
  want = fn(images)   # the layer's seed state advances: the converted calls start from the params' copy
  for call in (jax_fn, jax.jit(jax_fn)):
    got, _ = call(params, images)
    np.testing.assert_array_equal(got, want)
