"""Colour-space conversions and colour adjustments against TF."""
import hypothesis
import hypothesis.strategies as st
import jax
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from oracle import assert_close, check, run_rule

RAW = tf.raw_ops


def rgb(*shape, seed=0, dtype=np.float32):
  """Random colours with the cases TF's formulas branch on: greys, black, and tied channels."""
  x = np.random.RandomState(seed).uniform(0, 1, size=(*shape, 3)).astype(np.float32)
  flat = x.reshape(-1, 3)
  specials = [[0.5, 0.5, 0.5], [0, 0, 0], [0.2, 0.2, 0.7], [0.7, 0.7, 0.1], [0.3, 0.6, 0.6], [0.9, 0.1, 0.9],
              [0.6, 0.3, 0.6], [0.1, 0.8, 0.1], [1, 0, 0], [0, 0, 1]]
  flat[:len(specials)] = specials
  return x.astype(dtype)


def test_rgb_to_hsv_and_back():
  # TF's own gradient for RGBToHSV (ties broken its way); HSVToRGB is not differentiable in TF.
  def fn(x):
    return RAW.RGBToHSV(images=x), RAW.HSVToRGB(images=x * 0.9)
  check(fn, rgb(2, 4, 5), atol=1e-6, rtol=1e-6)


def test_hsv_to_rgb_hue_out_of_range():
  hsv = np.random.RandomState(1).uniform(-0.5, 1.5, size=(4, 6, 3)).astype(np.float32)
  check(lambda x: RAW.HSVToRGB(images=x), hsv, atol=1e-6, rtol=1e-6, grad=False)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_colour_space_dtypes(dtype):
  # TF computes these in the image's dtype; XLA may keep half intermediates in float32.
  tol = {np.float16: 4e-3, ml_dtypes.bfloat16: 3e-2, np.float64: 1e-6}[dtype]   # float64 runs in float32 without x64
  check(lambda x: (RAW.RGBToHSV(images=x), RAW.HSVToRGB(images=x)), rgb(3, 4, dtype=dtype),
        atol=tol, rtol=tol, grad=False, vmap=False)


def test_adjustments():
  # TF registers no gradient for the adjustments; its CPU kernels take float32 only.
  def fn(x, delta, scale, factor):
    return (RAW.AdjustHue(images=x, delta=delta), RAW.AdjustSaturation(images=x, scale=scale),
            RAW.AdjustContrastv2(images=x, contrast_factor=factor))
  check(fn, rgb(2, 4, 5), np.float32(0.3), np.float32(1.7), np.float32(1.6), atol=1e-6, rtol=1e-6, grad=False)


def test_adjust_contrast_any_leading_dims():
  fn = lambda x, f: RAW.AdjustContrastv2(images=x, contrast_factor=f)  # noqa: E731
  check(fn, rgb(4, 5), np.float32(-0.5), atol=1e-6, rtol=1e-6, grad=False, vmap=False)
  check(fn, rgb(2, 2, 3, 4), np.float32(2.5), atol=1e-6, rtol=1e-6, grad=False, vmap=False)


def test_adjust_contrast_empty_image():
  # Regression (fuzz): a 0-size image divided by its pixel count, 0, on the NumPy path.
  x = np.zeros((0, 2, 3), np.float32)
  expected = RAW.AdjustContrastv2(images=x, contrast_factor=np.float32(0.5)).numpy()
  assert np.asarray(run_rule("AdjustContrastv2", x, np.float32(0.5))).shape == expected.shape


_ADJUST_IMAGE = rgb(6, 7, seed=3)


@pytest.fixture(scope="module")
def converted_adjustments():
  def fn(x, delta, scale):
    return RAW.AdjustHue(images=x, delta=delta), RAW.AdjustSaturation(images=x, scale=scale)
  delta, scale = np.float32(0), np.float32(1)
  jax_fn, params = jaxport.convert(fn, _ADJUST_IMAGE, delta, scale)
  return fn, jax.jit(lambda *a: jax_fn(params, *a)[0])


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(delta=st.one_of(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0, 1 / 6, -1 / 3, 2.3, -3.5]),
                                  st.floats(-1, 1, width=32)),
                  scale=st.one_of(st.sampled_from([0.0, 1.0, 10.0]), st.floats(0, 4, width=32)))
def test_adjustments_any_delta_and_scale(converted_adjustments, delta, scale):
  # Hue shifts wrap around the colour wheel (more than once past |delta| = 1); saturations clip at 0 and 1.
  fn, jitted = converted_adjustments
  args = (_ADJUST_IMAGE, np.float32(delta), np.float32(scale))
  assert_close(jitted(*args), fn(*args), 1e-6, 1e-6, f"delta={delta}, scale={scale}")
