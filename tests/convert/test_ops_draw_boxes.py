"""DrawBoundingBoxes / DrawBoundingBoxesV2 against TF, bit for bit: box geometry (truncated corners,
inverted boxes, boxes partly or wholly outside), colour tables, dtypes, jit and vmap."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport

SHAPES = [(1, 5, 7, 3), (2, 4, 4, 1), (1, 6, 3, 4)]   # few shapes: each compiles once


def _draw(images, boxes, colors=None):
  if colors is None:
    return tf.raw_ops.DrawBoundingBoxes(images=images, boxes=boxes)
  return tf.raw_ops.DrawBoundingBoxesV2(images=images, boxes=boxes, colors=colors)


def _check(images, boxes, colors=None):
  args = (images, boxes) if colors is None else (images, boxes, colors)
  traced = tf.function(_draw)   # the oracle is the graph: eager raw ops reuse a cached dtype (float16 gave float32)
  expected = traced(*args).numpy()
  jax_fn, params = jaxport.convert(traced, *args)
  for run in (jax_fn, jax.jit(jax_fn)):
    got = np.asarray(run(params, *args)[0])
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
  return jax_fn, params


coordinate = st.one_of(st.floats(-0.75, 1.75, width=32), st.sampled_from([0.0, 0.25, 0.5, 1.0, -0.01, 1.01]))


@settings(max_examples=40, deadline=None)
@given(shape=st.sampled_from(SHAPES), seed=st.integers(0, 2**31 - 1), num_boxes=st.sampled_from([1, 4]),
       corners=st.lists(coordinate, min_size=4 * 2 * 4, max_size=4 * 2 * 4),
       table=st.sampled_from(["default", "custom", "empty"]))
def test_any_boxes_match_tf(shape, seed, num_boxes, corners, table):
  images = np.random.RandomState(seed).uniform(size=shape).astype(np.float32)
  boxes = np.asarray(corners[:shape[0] * num_boxes * 4], np.float32).reshape(shape[0], num_boxes, 4)
  colors = {"default": None, "empty": np.zeros((0, 4), np.float32),
            "custom": np.random.RandomState(seed + 1).uniform(size=(3, 4)).astype(np.float32)}[table]
  _check(images, boxes, colors)


def test_overlapping_boxes_draw_in_order_and_colours_cycle():
  images = np.zeros((1, 8, 8, 3), np.float32)
  boxes = np.array([[[0.0, 0.0, 1.0, 1.0], [0.25, 0.25, 0.75, 0.75], [0.0, 0.5, 0.5, 1.0],
                     [0.5, -0.5, 2.0, 0.5]]], np.float32)   # the fourth reuses colour 0, drawn last
  colors = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.5]], np.float32)
  _check(images, boxes, colors)
  _check(images, boxes)   # TF's default table


def test_half_images_wide_colour_tables_and_one_channel_defaults():
  boxes = np.array([[[0.1, 0.2, 0.8, 0.9], [0.0, 0.0, 0.3, 0.3]]], np.float32)
  _check(np.random.RandomState(0).uniform(size=(1, 6, 6, 3)).astype(np.float16), boxes,
         np.array([[0.3, 0.6, 0.9, 1.0, 7.0]], np.float32))   # more channels than the image: the first 3
  _check(np.random.RandomState(1).uniform(size=(1, 6, 6, 1)).astype(np.float32), boxes)   # default: white


def test_no_boxes_and_vmap_over_image_batches():
  images = np.random.RandomState(2).uniform(size=(1, 5, 7, 3)).astype(np.float32)
  _check(images, np.zeros((1, 0, 4), np.float32))
  boxes = np.array([[[0.1, 0.1, 0.9, 0.6]]], np.float32)
  jax_fn, params = _check(images, boxes)
  stacked = np.stack([images, images * 0.5])
  got = jax.vmap(lambda im: jax_fn(params, im, boxes)[0])(stacked)
  for i in range(2):
    np.testing.assert_array_equal(got[i], _draw(stacked[i], boxes).numpy())


def test_no_gradient_as_in_tf():
  images = np.random.RandomState(3).uniform(size=(1, 5, 7, 3)).astype(np.float32)
  boxes = np.array([[[0.0, 0.0, 0.5, 0.5]]], np.float32)
  jax_fn, params = jaxport.convert(tf.function(_draw), images, boxes)
  grad = jax.grad(lambda im: jnp.sum(jax_fn(params, im, boxes)[0]))(images)
  np.testing.assert_array_equal(grad, np.zeros_like(images))   # TF's tape gives None
  x = tf.constant(images)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.reduce_sum(_draw(x, boxes))
  assert tape.gradient(y, x) is None


def test_tf_refusals_are_kept():
  two_channels = np.zeros((1, 4, 4, 2), np.float32)
  with pytest.raises(ValueError, match="Channel depth"):   # TF refuses a known depth while tracing
    tf.function(lambda im: _draw(im, tf.zeros((1, 1, 4)))).get_concrete_function(two_channels)
  jax_fn, params = jaxport.convert(lambda im: _draw(im, tf.zeros((1, 1, 4))),
                                   tf.TensorSpec([1, 4, 4, None], tf.float32))
  with pytest.raises(jaxport.errors.InvalidNodeError, match="channel depth"):   # a depth known only when called
    jax_fn(params, two_channels)
  narrow = np.zeros((2, 2), np.float32)
  fn = tf.function(lambda im: tf.raw_ops.DrawBoundingBoxesV2(images=im, boxes=tf.zeros((1, 1, 4)), colors=narrow))
  rgb = np.zeros((1, 4, 4, 3), np.float32)
  with pytest.raises(tf.errors.InvalidArgumentError, match="colors must have equal or more channels"):
    fn(rgb)   # TF refuses when it runs
  jax_fn, params = jaxport.convert(fn, rgb)
  with pytest.raises(jaxport.errors.InvalidNodeError, match="colors must be a 2-D matrix"):
    jax_fn(params, rgb)
