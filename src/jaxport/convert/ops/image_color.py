"""Op rules: colour-space conversions and colour adjustments.

Each rule follows the formulas of TF's CPU kernel step by step, so results match to
rounding. The adjustments (AdjustHue, AdjustSaturation, AdjustContrastv2) compute in
float32 and cast back (TF's CPU kernels take float32 only; its GPU kernels compute half in
float32 too); RGBToHSV and HSVToRGB compute in
the image's own dtype, as TF's Eigen expressions do. The formulas are jitted: run eagerly,
op by op, each rule is then one compiled computation rather than dozens.

Gradients: TF registers none for the adjustments (JAX's here are those of the formulas)
and marks HSVToRGB not differentiable, so its rule stops gradients as TF does. RGBToHSV
uses TF's own gradient formula, which breaks ties between channels its own way.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert import export_marks
from jaxport.convert.ops._util import rounded_product
from jaxport.convert.registry import register

_HUE_RANGE = 6   # AdjustHue works with hue in [0, 6): one unit per sector of the colour hexagon


def _split_rgb(images):
  images = jnp.asarray(images)
  return images[..., 0], images[..., 1], images[..., 2]


def _pick(category, choices):
  """`choices[category]` elementwise; categories past the end take the last choice."""
  out = choices[-1]
  for k in range(len(choices) - 2, -1, -1):
    out = jnp.where(category == k, choices[k], out)
  return out


# --------------------------------------------------------------------------- RGBToHSV / HSVToRGB


@jax.jit
def _rgb_to_hsv(images):
  r, g, b = _split_rgb(images)
  dtype = r.dtype
  one = jnp.asarray(1, dtype)
  value = jnp.maximum(jnp.maximum(r, g), b)
  spread = value - jnp.minimum(jnp.minimum(r, g), b)
  saturation = jnp.where(value > 0, spread / jnp.where(value > 0, value, one), jnp.zeros_like(value))
  norm = (one / jnp.where(spread > 0, spread, one)) * (one / jnp.asarray(6, dtype))
  hue = jnp.where(r == value, norm * (g - b), jnp.where(g == value, rounded_product(norm * (b - r)) + one * 2 / 6,
                                                       rounded_product(norm * (r - g)) + one * 4 / 6))
  hue = jnp.where(spread > 0, hue, jnp.zeros_like(hue))
  hue = jnp.where(hue < 0, hue + one, hue)
  return jnp.stack([hue, saturation, value], axis=-1)


def _rgb_to_hsv_fwd(images):
  hsv = _rgb_to_hsv(images)
  return hsv, (images, hsv)


@jax.jit
def _rgb_to_hsv_bwd(residuals, grad):
  """TF's `_RGBToHSVGrad` (image_grad.py) term by term, ties broken as TF breaks them."""
  images, hsv = residuals
  r, g, b = _split_rgb(images)
  saturation, value = hsv[..., 1], hsv[..., 2]
  as_dtype = lambda mask: mask.astype(r.dtype)  # noqa: E731
  inv = lambda x: jnp.where(x == 0, 0, 1 / jnp.where(x == 0, 1, x))   # noqa: E731  (div_no_nan)
  pos = lambda x: as_dtype(x > 0)  # noqa: E731
  r_max, g_max, b_max = as_dtype((r >= b) & (r >= g)), as_dtype((g > r) & (g >= b)), as_dtype((b > r) & (b > g))
  r_min, g_min, b_min = as_dtype((r < b) & (r < g)), as_dtype((g <= r) & (g < b)), as_dtype((b <= r) & (b <= g))
  ds_dr = pos(r) * (r_max * (g_min * g + b_min * b) * inv(r * r) - r_min * inv(g_max * g + b_max * b))
  ds_dg = pos(g) * (g_max * (r_min * r + b_min * b) * inv(g * g) - g_min * inv(r_max * r + b_max * b))
  ds_db = pos(b) * (b_max * (g_min * g + r_min * r) * inv(b * b) - b_min * inv(g_max * g + r_max * r))
  flat = inv(saturation * saturation) * inv(value * value)
  dh_dr = (-pos(r) * r_max * (g - b) * flat + pos(g) * g_max * r_min * (b - g) * inv((r - g) ** 2)
           - pos(g) * g_max * b_min * inv(g - b) + pos(b) * b_max * r_min * (b - g) * inv((b - r) ** 2)
           + pos(b) * b_max * g_min * inv(b - g)) * 60 / 360
  dh_dg = (-pos(g) * g_max * (b - r) * flat + pos(r) * r_max * g_min * (r - b) * inv((r - g) ** 2)
           + pos(r) * r_max * b_min * inv(r - b) + pos(b) * b_max * g_min * (r - b) * inv((b - g) ** 2)
           - pos(b) * b_max * r_min * inv(b - r)) * 60 / 360
  dh_db = (-pos(b) * b_max * (r - g) * flat + pos(r) * r_max * b_min * (g - r) * inv((r - b) ** 2)
           - pos(r) * r_max * g_min * inv(r - g) + pos(g) * g_max * b_min * (g - r) * inv((g - b) ** 2)
           + pos(g) * g_max * r_min * inv(g - r)) * 60 / 360
  dh, ds, dv = grad[..., 0], grad[..., 1], grad[..., 2]
  return (jnp.stack([dv * d_v + ds * d_s + dh * d_h for d_v, d_s, d_h in
                     ((r_max, ds_dr, dh_dr), (g_max, ds_dg, dh_dg), (b_max, ds_db, dh_db))], axis=-1),)


_rgb_to_hsv_with_tf_grad = jax.custom_vjp(_rgb_to_hsv)
_rgb_to_hsv_with_tf_grad.defvjp(_rgb_to_hsv_fwd, _rgb_to_hsv_bwd)
_rgb_to_hsv_marked = export_marks.marked("rgb_to_hsv")(_rgb_to_hsv_with_tf_grad)


@register("RGBToHSV")
def rgb_to_hsv(ctx, images):
  return _rgb_to_hsv_marked(jnp.asarray(images))


@register("HSVToRGB")
def hsv_to_rgb(ctx, images):
  return _hsv_to_rgb(export_marks.stop_gradient(jnp.asarray(images)))


@jax.jit
def _hsv_to_rgb(images):
  hue, saturation, value = _split_rgb(images)
  one, two = jnp.asarray(1, hue.dtype), jnp.asarray(2, hue.dtype)
  sector = hue * jnp.asarray(6, hue.dtype)
  red = jnp.clip(jnp.abs(sector - 3 * one) - one, 0, one)
  green = jnp.clip(two - jnp.abs(sector - two), 0, one)
  blue = jnp.clip(two - jnp.abs(sector - 4 * one), 0, one)
  grey = one - saturation
  return jnp.stack([(grey + saturation * c) * value for c in (red, green, blue)], axis=-1)


# --------------------------------------------------------------------------- AdjustSaturation


def _saturation_hsv(r, g, b):
  """TF's `rgb_to_hsv` in adjust_saturation_op.cc (float32)."""
  value = jnp.maximum(jnp.maximum(r, g), b)
  spread = value - jnp.minimum(jnp.minimum(r, g), b)
  saturation = jnp.where(value > 0, spread / jnp.where(value > 0, value, 1.0), 0.0)
  norm = 1.0 / (6.0 * jnp.where(spread > 0, spread, 1.0))
  hue = jnp.where(r == value, norm * (g - b),
                  jnp.where(g == value, norm * (b - r) + np.float32(2.0 / 6.0), norm * (r - g) + np.float32(4.0 / 6.0)))
  hue = jnp.where(spread > 0, hue, 0.0)
  return jnp.where(hue < 0, hue + 1, hue), saturation, value


def _saturation_rgb(hue, saturation, value):
  """TF's `hsv_to_rgb` in adjust_saturation_op.cc (float32); hue is in [0, 1]."""
  chroma = saturation * value
  base = value - chroma
  sector = hue * 6
  category = jnp.floor(sector)              # static_cast<int>, on a non-negative value
  within = sector - 2 * jnp.floor(sector / 2)   # TF's fmod loop, exact for sector >= 0
  mid = chroma * (1 - jnp.abs(within - 1))
  zero = jnp.zeros_like(chroma)
  # Sectors 0..5, then TF's default (all zero) for hue == 1.
  rr = _pick(category, [chroma, mid, zero, zero, mid, chroma, zero])
  gg = _pick(category, [mid, chroma, chroma, mid, zero, zero, zero])
  bb = _pick(category, [zero, zero, mid, chroma, chroma, mid, zero])
  return rr + base, gg + base, bb + base


@register("AdjustSaturation")
def adjust_saturation(ctx, images, scale):
  return _adjust_saturation(jnp.asarray(images), jnp.asarray(scale, jnp.float32))


@jax.jit
def _adjust_saturation(images, scale):
  hue, saturation, value = _saturation_hsv(*_split_rgb(images.astype(jnp.float32)))
  saturation = jnp.minimum(1.0, jnp.maximum(0.0, saturation * scale))
  return jnp.stack(_saturation_rgb(hue, saturation, value), axis=-1).astype(images.dtype)


# --------------------------------------------------------------------------- AdjustHue


def _hue_ranges(r, g, b):
  """TF's `rgb_to_hv_range`: hue in [0, 6) and each pixel's smallest and largest channel."""
  r_below_g = r < g
  category = jnp.where(r_below_g, jnp.where(b < r, 1, jnp.where(b > g, 3, 2)),
                       jnp.where(b < g, 0, jnp.where(b > r, 4, 5)))
  high = _pick(category, [r, g, g, b, b, r])
  mid = _pick(category, [g, r, b, g, r, b])
  low = _pick(category, [b, b, r, r, g, g])
  flat = high == low
  ratio = (mid - low) / jnp.where(flat, 1.0, high - low)
  rising = category % 2 == 0
  hue = category.astype(jnp.float32) + jnp.where(rising, ratio, 1 - ratio)
  return jnp.where(flat, 0.0, hue), low, high


def _hue_rgb(hue, low, high):
  """TF's `hv_range_to_rgb`."""
  category = jnp.floor(hue)
  ratio = hue - category
  ratio = jnp.where(category % 2 == 0, ratio, 1 - ratio)
  mid = low + ratio * (high - low)
  # Sectors 0..5; TF's switch sends anything else to sector 5.
  red = _pick(category, [high, mid, low, low, mid, high])
  green = _pick(category, [mid, high, high, mid, low, low])
  blue = _pick(category, [low, low, mid, high, high, mid])
  return red, green, blue


def _wrap_hue(hue):
  """TF's `while (h < 0) h += 6; while (h >= 6) h -= 6;`, step by step for |delta| <= 1."""
  far = (hue < -_HUE_RANGE) | (hue >= 2 * _HUE_RANGE)   # only for |delta| > 1: one fmod-like step
  hue = jnp.where(far, hue - _HUE_RANGE * jnp.floor(hue / _HUE_RANGE), hue)
  for _ in range(2):
    hue = jnp.where(hue < 0, hue + _HUE_RANGE, hue)
  for _ in range(2):
    hue = jnp.where(hue >= _HUE_RANGE, hue - _HUE_RANGE, hue)
  return hue


@register("AdjustHue")
def adjust_hue(ctx, images, delta):
  return _adjust_hue(jnp.asarray(images), jnp.asarray(delta, jnp.float32))


@jax.jit
def _adjust_hue(images, delta):
  hue, low, high = _hue_ranges(*_split_rgb(images.astype(jnp.float32)))
  hue = _wrap_hue(hue + rounded_product(delta * _HUE_RANGE))
  return jnp.stack(_hue_rgb(hue, low, high), axis=-1).astype(images.dtype)


# --------------------------------------------------------------------------- AdjustContrastv2


@register("AdjustContrastv2")
def adjust_contrast_v2(ctx, images, contrast_factor):
  """Per image and channel: mean + (x - mean) * factor, the mean over height and width."""
  images = jnp.asarray(images)
  x = images.astype(jnp.float32)
  pixels = x.shape[-3] * x.shape[-2]
  mean = jnp.sum(x, axis=(-3, -2), keepdims=True) * np.float32(1.0 / max(pixels, 1))   # 0 pixels: empty out
  out = mean + rounded_product((x - mean) * jnp.asarray(contrast_factor, jnp.float32))
  return out.astype(images.dtype)
