"""Searches (LowerBound, UpperBound, Bucketize, InTopK, NthElement, ListDiff), space/depth layout ops,
image and volume patches, bincounts, fixed-width histograms and in-place row updates against TF."""
import math

import jax
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import example, given, settings
from hypothesis import strategies as st

import jaxport
from oracle import check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)


def normal(*shape, seed=0):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


# --------------------------------------------------------------------------- searches


def test_lower_and_upper_bound():
  sorted_rows = np.sort(rs.randint(0, 6, (2, 7)), axis=1).astype(np.int32)
  values = rs.randint(-1, 8, (2, 5)).astype(np.int32)
  check(lambda s, v: (raw.LowerBound(sorted_inputs=s, values=v), raw.UpperBound(sorted_inputs=s, values=v),
                      raw.LowerBound(sorted_inputs=s, values=v, out_type=tf.int64)), sorted_rows, values)


def test_bounds_float_rows():
  sorted_rows = np.sort(normal(3, 6), axis=1)
  check(lambda s, v: (raw.LowerBound(sorted_inputs=s, values=v), raw.UpperBound(sorted_inputs=s, values=v)),
        sorted_rows, np.concatenate([sorted_rows[:, :2], normal(3, 2, seed=1)], axis=1), grad=False,
        vmap=False)   # vmap's perturbed rows would not be sorted


def test_bucketize():
  x = np.array([-5.0, 0.0, 0.5, 1.0, 9.9, 10.0, 100.0, 1e4], np.float32)
  check(lambda x: raw.Bucketize(input=x, boundaries=[0.0, 1.0, 10.0, 100.0]), x)
  # an int input is compared with the float boundaries as float, like TF's kernel
  check(lambda x: raw.Bucketize(input=x, boundaries=[0.5, 2.0, 2.5]), np.array([0, 1, 2, 3, -1], np.int32))


def test_in_top_k():
  predictions = normal(4, 5)
  predictions[1, 3] = predictions[1, 0]   # a tie counts as in the top k
  predictions[2, 1] = np.nan              # a non-finite target prediction is never in
  targets = np.array([0, 3, 1, 7], np.int32)   # 7 is out of range: never in
  fn = lambda p, t, k: (raw.InTopKV2(predictions=p, targets=t, k=k),  # noqa: E731
                        raw.InTopK(predictions=p, targets=t, k=2))
  for k in (1, 2, 4):
    check(fn, predictions, targets, np.int32(k), grad=False, vmap=False)


def test_list_diff():
  x = np.array([1, 2, 3, 4, 5, 6, 2], np.int32)
  check(lambda x, y: raw.ListDiff(x=x, y=y), x, np.array([1, 3, 5], np.int32), jit=False, vmap=False)
  check(lambda x: raw.ListDiff(x=x, y=tf.constant([2, 9]), out_idx=tf.int64), x, jit=False, vmap=False)


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("block", [2, 3])
def test_depth_to_space_and_back(block):
  x = normal(2, 2, 3, block * block * 2)
  check(lambda x: raw.DepthToSpace(input=x, block_size=block), x)
  check(lambda x: raw.SpaceToDepth(input=x, block_size=block), normal(1, 2 * block, block, 3))


def test_depth_space_nchw_matches_nhwc():
  """TF's CPU kernels take NHWC only: NCHW is checked against NHWC between transposes."""
  x = normal(2, 8, 2, 3)   # NCHW
  for op, attrs in (("DepthToSpace", {"block_size": 2}), ("SpaceToDepth", {"block_size": 1})):
    nhwc = run_rule(op, x.transpose(0, 2, 3, 1), data_format="NHWC", **attrs)
    nchw = run_rule(op, x, data_format="NCHW", **attrs)
    np.testing.assert_array_equal(nchw, np.transpose(nhwc, (0, 3, 1, 2)))
  x = normal(1, 3, 4, 6)
  np.testing.assert_array_equal(run_rule("SpaceToDepth", x, data_format="NCHW", block_size=2),
                                np.transpose(run_rule("SpaceToDepth", x.transpose(0, 2, 3, 1), block_size=2),
                                             (0, 3, 1, 2)))
  with pytest.raises(NotImplementedError, match="NCHW_VECT_C"):
    run_rule("DepthToSpace", x, data_format="NCHW_VECT_C", block_size=2)


def test_extract_image_patches():
  """Geometry is covered below on constants; here grad and vmap, for both paddings."""
  fn = lambda x: (  # noqa: E731
      raw.ExtractImagePatches(images=x, ksizes=[1, 2, 3, 1], strides=[1, 1, 2, 1], rates=[1, 1, 1, 1],
                              padding="SAME"),
      raw.ExtractImagePatches(images=x, ksizes=[1, 3, 2, 1], strides=[1, 2, 3, 1], rates=[1, 2, 1, 1],
                              padding="VALID"))
  check(fn, normal(2, 5, 6, 2))


@settings(max_examples=20, deadline=None)
@given(h=st.integers(1, 6), w=st.integers(1, 6), k=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3)), r=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       padding=st.sampled_from(["SAME", "VALID"]))
def test_extract_image_patches_geometry(h, w, k, s, r, padding):
  """The rule on NumPy images against TF eager, over window geometries (VALID may leave no patch)."""
  images = np.arange(h * w * 2, dtype=np.float32).reshape(1, h, w, 2)
  _check_patches("ExtractImagePatches", "images", images,
                 dict(ksizes=[1, *k, 1], strides=[1, *s, 1], rates=[1, *r, 1], padding=padding))


def _check_patches(op, operand, x, attrs):
  """The rule on NumPy input against TF eager; where TF refuses the geometry, the rule says why."""
  try:
    expected = getattr(raw, op)(**{operand: x}, **attrs).numpy()
  except tf.errors.InvalidArgumentError:
    with pytest.raises(ValueError, match="negative"):
      run_rule(op, x, **attrs)
    return
  np.testing.assert_array_equal(run_rule(op, x, **attrs), expected)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=5), st.lists(st.integers(-4, 4), max_size=6))
def test_search_ops_on_constants(boundaries, values):
  """LowerBound, UpperBound and Bucketize on NumPy inputs against TF eager, ties included."""
  rows, v = np.sort(np.asarray([boundaries], np.float32)), np.asarray([values], np.float32)
  for op in ("LowerBound", "UpperBound"):
    np.testing.assert_array_equal(run_rule(op, rows, v, out_type=np.int32),
                                  getattr(raw, op)(sorted_inputs=rows, values=v).numpy())
  edges = sorted(set(float(b) for b in boundaries))
  np.testing.assert_array_equal(run_rule("Bucketize", v[0].astype(np.int32), boundaries=edges),
                                raw.Bucketize(input=v[0].astype(np.int32), boundaries=edges).numpy())


def test_extract_image_patches_int_and_empty():
  images = rs.randint(0, 9, (1, 3, 3, 1)).astype(np.int32)
  check(lambda x: (raw.ExtractImagePatches(images=x, ksizes=[1, 2, 2, 1], strides=[1, 1, 1, 1],
                                           rates=[1, 1, 1, 1], padding="SAME"),
                   raw.ExtractImagePatches(images=x, ksizes=[1, 2, 2, 1], strides=[1, 1, 1, 1],
                                           rates=[1, 3, 1, 1], padding="VALID")), images)


def test_extract_volume_patches():
  """Both paddings, strided, with grad and vmap (was a host callback)."""
  fn = lambda x: (  # noqa: E731
      raw.ExtractVolumePatches(input=x, ksizes=[1, 2, 3, 2, 1], strides=[1, 1, 2, 1, 1], padding="SAME"),
      raw.ExtractVolumePatches(input=x, ksizes=[1, 3, 2, 2, 1], strides=[1, 2, 1, 3, 1], padding="VALID"))
  check(fn, normal(2, 4, 5, 6, 2))


@settings(max_examples=20, deadline=None)
@given(size=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)),
       k=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)),
       s=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)), padding=st.sampled_from(["SAME", "VALID"]))
@example(size=(3, 1, 4), k=(1, 1, 1), s=(3, 1, 3), padding="SAME")   # windows start inside: TF's negative padding
def test_extract_volume_patches_geometry(size, k, s, padding):
  volumes = np.arange(math.prod(size) * 2, dtype=np.float32).reshape(1, *size, 2)
  _check_patches("ExtractVolumePatches", "input", volumes, dict(ksizes=[1, *k, 1], strides=[1, *s, 1], padding=padding))


# --------------------------------------------------------------------------- counting


IDS = np.array([1, 1, 0, 4, 2, 4, 4, 9], np.int32)   # 9 is past `size` and not counted


def test_bincount():
  weights = normal(8)
  check(lambda a, w: (raw.Bincount(arr=a, size=6, weights=w),
                      raw.Bincount(arr=a, size=5, weights=tf.zeros([0], tf.float32))), IDS, weights,
        grad=False)   # TF has no gradient for Bincount
  check(lambda a: raw.Bincount(arr=a, size=7, weights=tf.zeros([0], tf.int32)), IDS)


def test_dense_bincount():
  rows = IDS.reshape(2, 4)
  weights = normal(2, 4)
  fn = lambda x, w: (  # noqa: E731
      raw.DenseBincount(input=x, size=6, weights=w), raw.DenseBincount(input=x, size=6, weights=w, binary_output=True),
      raw.DenseBincount(input=x, size=5, weights=tf.zeros([0], tf.float32)),
      raw.DenseBincount(input=x, size=5, weights=tf.zeros([0], tf.int32), binary_output=True),
      raw.DenseBincount(input=tf.reshape(x, [-1]), size=5, weights=tf.reshape(w, [-1])))
  check(fn, rows, weights, grad=False)   # nor for DenseBincount


# --------------------------------------------------------------------------- allocating, in-place rows


def test_empty_is_zeros():
  check(lambda x: (raw.Empty(shape=[2, 3], dtype=tf.float32, init=True) + x,
                   raw.Empty(shape=[0, 4], dtype=tf.int32), raw.Empty(shape=[2], dtype=tf.bool, init=True)),
        normal(2, 3))


def test_inplace_ops():
  x, v = normal(5, 3), normal(2, 3, seed=1)
  rows = np.array([3, 0], np.int32)
  dup = np.array([1, 1], np.int32)   # a repeated row adds (and subtracts) both updates
  # one op per function: TF's kernels write into their input's buffer, so two ops on one `x` clobber
  check(lambda x, i, v: raw.InplaceAdd(x=x, i=i, v=v), x, dup, v, grad=False)   # TF has no gradients
  check(lambda x, i, v: raw.InplaceSub(x=x, i=i, v=v), x, rows, v, grad=False, vmap=False)
  update = check(lambda x, i, v: raw.InplaceUpdate(x=x, i=i, v=v), x, rows, v, grad=False, vmap=False)
  # JAX's gradient: the overwritten rows of x get none, the updates get all of theirs
  gx, gv = jax.grad(lambda x, v: update({}, x, rows, v)[0].sum(), argnums=(0, 1))(x, v)
  np.testing.assert_array_equal(gx, np.ones_like(x) * np.isin(np.arange(5), rows, invert=True)[:, None])
  np.testing.assert_array_equal(gv, np.ones_like(v))


def test_shape_ops_of_constants_stay_numpy():
  out = run_rule("DepthToSpace", np.arange(8).reshape(1, 1, 2, 4), block_size=2)
  assert isinstance(out, np.ndarray) and out.shape == (1, 2, 4, 1)
  assert isinstance(run_rule("Bucketize", np.arange(3), boundaries=[1.0]), np.ndarray)
  assert isinstance(run_rule("Bincount", np.array([0, 2]), np.int32(3), np.zeros(0, np.int32), T=np.int32),
                    np.ndarray)


def test_in_top_k_traced_k_under_jit():
  fn = jaxport.convert_functional(lambda p, t, k: raw.InTopKV2(predictions=p, targets=t, k=k),
                                  normal(3, 4), np.int32([0, 1, 2]), np.int32(2))
  out = jax.jit(fn)(normal(3, 4), np.int32([0, 1, 2]), np.int32(2))
  expected = raw.InTopKV2(predictions=normal(3, 4), targets=np.int32([0, 1, 2]), k=2)
  np.testing.assert_array_equal(out, expected.numpy())


@pytest.mark.parametrize("n,reverse", [(0, False), (2, False), (5, False), (0, True), (3, True)])
def test_nth_element(n, reverse):
  # the gradient is shared by every entry equal to the result (TF's _NthElementGrad): row 0 has ties
  x = normal(3, 4, 6, seed=n)
  x[0, :, :3] = 1.5
  x[1, 0, :] = -2.0
  check(lambda v: raw.NthElement(input=v, n=n, reverse=reverse), x)


def test_nth_element_ints_and_refusal():
  check(lambda v: raw.NthElement(input=v, n=1), rs.randint(0, 3, size=(5, 4)).astype(np.int32))
  jax_fn, params = jaxport.convert(tf.function(lambda v, k: raw.NthElement(input=v, n=k)), normal(2, 3), np.int32(1))
  with pytest.raises(jaxport.errors.InvalidNodeError, match=r"n must be in \[0, 3\)"):
    jax_fn(params, normal(2, 3), np.int32(3))


# --------------------------------------------------------------------------- HistogramFixedWidth


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_histogram_fixed_width(dtype):
  values = np.array([-5, 0, 1, 2, 3, 4, 5, 7, 8, 9, 100, 3, 6], dtype)
  for value_range, nbins in [([0, 8], 4), ([1, 6], 3), ([-3, 50], 7)]:
    check(lambda v: tf.histogram_fixed_width(v, np.array(value_range, dtype), nbins=nbins), values)
  check(lambda v: tf.histogram_fixed_width(v, np.array([0, 8], dtype), nbins=5, dtype=tf.int64), values)


def test_histogram_values_on_the_bin_edges_land_where_tf_puts_them():
  """Bins come from TF's float64 division of the float32 offset: each float32 neighbour of every edge,
  and infinities, in TF's bin, also without x64."""
  lo, hi, nbins = np.float32(-0.7), np.float32(2.3), 7
  edges = lo + (hi - lo) * np.arange(nbins + 1, dtype=np.float32) / nbins
  near = np.concatenate([np.nextafter(edges, -np.inf), edges, np.nextafter(edges, np.inf), [np.inf, -np.inf]])
  check(lambda v: tf.histogram_fixed_width(v, [lo, hi], nbins=nbins), near.astype(np.float32))
  check(lambda v, r: tf.histogram_fixed_width(v, r, nbins=3), np.float32([0.1, 0.5, 0.9]), np.float32([0, 1]))


def test_histogram_refuses_what_tf_refuses():
  """A value_range that is not increasing, and NaN values when seen (an eager call), as TF's kernel."""
  fn, params = jaxport.convert(lambda v: tf.histogram_fixed_width(v, [1.0, 0.0], nbins=3), np.float32([0.5]))
  with pytest.raises(jaxport.errors.InvalidNodeError, match=r"value_range\[0\] < value_range\[1\]"):
    fn(params, np.float32([0.5]))
  fn, params = jaxport.convert(lambda v: tf.histogram_fixed_width(v, [0.0, 1.0], nbins=3), np.float32([0.5]))
  with pytest.raises(jaxport.errors.InvalidNodeError, match="NaN"):
    fn(params, np.float32([np.nan]))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-4, 4, width=32), min_size=1, max_size=30), st.floats(-2, 1, width=32),
       st.floats(2.0 ** -10, 3, width=32), st.integers(1, 9))
def test_any_values_and_range_bin_as_tf(values, lo, width, nbins):
  values = np.array(values, np.float32)
  value_range = np.array([lo, np.float32(lo) + np.float32(width)], np.float32)
  if not value_range[0] < value_range[1]:
    return
  expected = tf.histogram_fixed_width(values, value_range, nbins=nbins).numpy()
  actual = run_rule("HistogramFixedWidth", values, value_range, np.int32(nbins), dtype=np.int32)
  np.testing.assert_array_equal(np.asarray(actual), expected)
