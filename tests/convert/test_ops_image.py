"""Image resizing against TF."""
import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import InvalidNodeError
from oracle import assert_close, check

RAW = tf.raw_ops
FLAGS = {"legacy": dict(), "align_corners": dict(align_corners=True),
         "half_pixel": dict(half_pixel_centers=True)}
SIZES = {"up": [7, 9], "down_mixed": [3, 8]}   # arbitrary sizes: test_resize_index_arithmetic


def image(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).uniform(0, 1, size=shape).astype(dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("op", ["ResizeNearestNeighbor", "ResizeBilinear", "ResizeBicubic"])
def test_resize(op, flags, size):
  kw, out_size = FLAGS[flags], SIZES[size]
  check(lambda x: getattr(RAW, op)(images=x, size=out_size, **kw), image(2, 5, 6, 3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op", ["ResizeNearestNeighbor", "ResizeBilinear", "ResizeBicubic"])
def test_resize_integer_images(op):
  # Nearest keeps the dtype; the interpolating resizes return float32.
  x = (image(1, 4, 5, 2) * 255).astype(np.uint8)
  check(lambda x: getattr(RAW, op)(images=x, size=[7, 3], half_pixel_centers=True), x)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(in_h=st.integers(1, 9), in_w=st.integers(1, 9), out_h=st.integers(1, 12),
                  out_w=st.integers(1, 12), flags=st.sampled_from(sorted(FLAGS)),
                  op=st.sampled_from(["ResizeNearestNeighbor", "ResizeBilinear", "ResizeBicubic"]))
def test_resize_index_arithmetic(in_h, in_w, out_h, out_w, flags, op):
  x = image(1, in_h, in_w, 1)
  fn = lambda x: getattr(RAW, op)(images=x, size=[out_h, out_w], **FLAGS[flags])  # noqa: E731
  jax_fn, params = jaxport.convert(fn, x)
  assert_close(jax_fn(params, x)[0], fn(x), 1e-5, 1e-5, what=op)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_resize_area(align_corners, size):
  check(lambda x: RAW.ResizeArea(images=x, size=SIZES[size], align_corners=align_corners), image(2, 5, 6, 3),
        grad=False)   # TF registers no gradient for ResizeArea


def test_resize_area_align_corners_from_one_pixel():
  # Regression (fuzz): align_corners from a side of 1 gives a zero scale; the rule returned NaN.
  check(lambda x: RAW.ResizeArea(images=x, size=[3, 4], align_corners=True), image(2, 1, 3, 2),
        grad=False)
  check(lambda x: RAW.ResizeArea(images=x, size=[5, 1], align_corners=True), image(1, 1, 1, 2),
        grad=False)


KERNELS = ["lanczos1", "lanczos3", "lanczos5", "gaussian", "box", "triangle", "keyscubic", "mitchellcubic"]


@pytest.mark.parametrize("kernel_type", KERNELS)
def test_scale_and_translate_kernels(kernel_type):
  def fn(x):
    return RAW.ScaleAndTranslate(images=x, size=[4, 9], scale=[0.6, 1.7], translation=[0.3, -0.8],
                                 kernel_type=kernel_type, antialias=True)
  check(fn, image(2, 6, 5, 2), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("antialias", [False, True])
def test_scale_and_translate_downsample_antialias(antialias):
  def fn(x):
    return RAW.ScaleAndTranslate(images=x, size=[3, 4], scale=[0.3, 0.5], translation=[0.0, 0.0],
                                 kernel_type="lanczos3", antialias=antialias)
  check(fn, image(1, 10, 8, 2), atol=1e-5, rtol=1e-5)


def test_scale_and_translate_traced_scale():
  # Scale and translation that depend on the inputs: weights are computed with jax.numpy.
  def fn(x, scale, translation):
    return RAW.ScaleAndTranslate(images=x, size=[4, 7], scale=scale, translation=translation,
                                 kernel_type="keyscubic", antialias=True)
  x, scale, translation = image(1, 6, 5, 2), np.array([0.7, 1.3], np.float32), np.array([0.2, -0.4], np.float32)
  jax_fn, params = jaxport.convert(fn, x, scale, translation)
  assert_close(jax_fn(params, x, scale, translation)[0], fn(x, scale, translation), 1e-5, 1e-5)


@pytest.mark.parametrize("method", ["bilinear", "nearest", "bicubic", "area", "lanczos3", "lanczos5",
                                    "gaussian", "mitchellcubic"])
@pytest.mark.parametrize("antialias", [False, True])
def test_tf_image_resize(method, antialias):
  def fn(x):
    return tf.image.resize(x, [4, 7], method=method, antialias=antialias)
  check(fn, image(2, 6, 5, 3), atol=1e-5, rtol=1e-5, grad=method != "area")


@pytest.mark.parametrize("flags", FLAGS)
@pytest.mark.parametrize("op", ["ResizeNearestNeighbor", "ResizeBilinear", "ResizeBicubic"])
def test_resize_grad(op, flags):
  x, kw = image(2, 5, 6, 3), FLAGS[flags]
  dy = image(2, 7, 4, 3, seed=1) - 0.5
  if op == "ResizeNearestNeighbor":
    fn = lambda dy: RAW.ResizeNearestNeighborGrad(grads=dy, size=[5, 6], **kw)  # noqa: E731
  else:
    fn = lambda dy: getattr(RAW, op + "Grad")(grads=dy, original_image=x, **kw)  # noqa: E731
  check(fn, dy, atol=1e-5, rtol=1e-5, grad=False)


@pytest.mark.parametrize("op,grad_op", [("ResizeNearestNeighbor", "ResizeNearestNeighborGrad"),
                                         ("ResizeBilinear", "ResizeBilinearGrad"),
                                         ("ResizeBicubic", "ResizeBicubicGrad")])
def test_resize_gradient_emits_its_grad_op(op, grad_op):
  x, dy = image(2, 5, 6, 3), image(2, 7, 4, 3, seed=1) - 0.5

  def fn(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = getattr(RAW, op)(images=x, size=[7, 4], half_pixel_centers=True)
    return tape.gradient(y, x, output_gradients=dy)

  graph = tf.function(fn).get_concrete_function(x).graph
  assert grad_op in {o.type for o in graph.get_operations()}
  check(fn, x, atol=1e-5, rtol=1e-5, grad=False)


@pytest.mark.parametrize("kernel_type", ["lanczos3", "keyscubic"])
def test_scale_and_translate_grad(kernel_type):
  x, dy = image(2, 6, 5, 2), image(2, 4, 9, 2, seed=1) - 0.5

  def fn(dy):
    return RAW.ScaleAndTranslateGrad(grads=dy, original_image=x, scale=[0.6, 1.7], translation=[0.3, -0.8],
                                     kernel_type=kernel_type, antialias=True)
  check(fn, dy, atol=1e-5, rtol=1e-5, grad=False)


@pytest.mark.parametrize("op", ["ResizeNearestNeighbor", "ResizeBilinear", "ResizeBicubic"])
def test_resize_rejects_align_corners_with_half_pixel_centers(op):
  # TF's kernels refuse the pair at run time; jaxport refuses it when converting.
  fn = lambda x: getattr(RAW, op)(images=x, size=[3, 4], align_corners=True, half_pixel_centers=True)  # noqa: E731
  with pytest.raises(InvalidNodeError, match="If half_pixel_centers is True, align_corners must be False."):
    jaxport.convert(fn, image(1, 5, 6, 1))
