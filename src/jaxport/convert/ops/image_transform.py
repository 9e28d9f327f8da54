"""Op rules: projective image transforms (`ImageProjectiveTransformV2/V3`), behind Keras' RandomRotation,
RandomTranslation, RandomZoom and RandomShear layers and `keras.ops.image.affine_transform`.

Output pixel (x, y) reads the input at ((a0 x + a1 y + a2) / k, (b0 x + b1 y + b2) / k), k = c0 x + c1 y + 1,
after the fill mode maps that point into the image (REFLECT, WRAP, NEAREST; CONSTANT leaves it), by
nearest (rounding half away from zero) or bilinear interpolation in float32; taps outside the image read
`fill_value`, and k = 0 gives it. As TF defines the gradient, only the images have one, and it is TF's:
the output gradient warped back through the inverted transforms (reverse mode); forward mode
differentiates the warp itself.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import _jax_compat
from jaxport.convert.ops._util import text
from jaxport.convert.ops.array import _static
from jaxport.convert.registry import register

_F32 = jnp.float32


def _map_coordinate(c, length: int, mode: str):
  """TF's MapCoordinate: a sampling coordinate mapped into [0, length - 1] by the fill mode."""
  top = _F32(length - 1)
  if mode == "CONSTANT":
    return c
  if mode == "NEAREST":
    return jnp.clip(c, 0, top)
  if length <= 1:   # reflecting or wrapping a single row: every point maps onto it
    return jnp.zeros_like(c)
  if mode == "REFLECT":   # [abcd] -> [dcba|abcd|dcba]
    span = _F32(2 * length)
    low = span * jnp.trunc(-c / span) + c
    low = jnp.where(low < -length, low + span, -low - 1)
    high = c - span * jnp.trunc(c / span)
    high = jnp.where(high >= length, span - high - 1, high)
  elif mode == "WRAP":    # [abcd] -> [abcd|abcd|abcd]
    size = _F32(length - 1)
    low = c + length * (jnp.trunc(-c / size) + 1)
    high = c - length * jnp.trunc(c / size)
  else:
    raise NotImplementedError(f"fill_mode {mode!r} is not one of REFLECT, WRAP, CONSTANT, NEAREST")
  return jnp.clip(jnp.where(c < 0, low, jnp.where(c > top, high, c)), 0, top)


def _taps(transforms, batch: int, in_hw, out_hw, interpolation: str, mode: str):
  """Per output pixel: the input rows, columns and weights it reads (1 tap or 4), each tap's
  in-image flag, and where the projection is 0 (the pixel is the fill value)."""
  t = jnp.broadcast_to(transforms.astype(_F32), (batch, 8))[:, :, None, None]
  y, x = jnp.meshgrid(jnp.arange(out_hw[0], dtype=_F32), jnp.arange(out_hw[1], dtype=_F32), indexing="ij")
  projection = t[:, 6] * x + t[:, 7] * y + 1
  at_infinity = projection == 0
  safe = jnp.where(at_infinity, 1, projection)
  in_x = _map_coordinate((t[:, 0] * x + t[:, 1] * y + t[:, 2]) / safe, in_hw[1], mode)
  in_y = _map_coordinate((t[:, 3] * x + t[:, 4] * y + t[:, 5]) / safe, in_hw[0], mode)
  if interpolation == "NEAREST":
    rounded = lambda v: jnp.sign(v) * jnp.floor(jnp.abs(v) + 0.5)  # noqa: E731  std::round
    taps = [(rounded(in_y), rounded(in_x), jnp.ones_like(in_x))]
  elif interpolation == "BILINEAR":
    y0, x0 = jnp.floor(in_y), jnp.floor(in_x)
    y1, x1 = y0 + 1, x0 + 1
    taps = [(y0, x0, (y1 - in_y) * (x1 - in_x)), (y0, x1, (y1 - in_y) * (in_x - x0)),
            (y1, x0, (in_y - y0) * (x1 - in_x)), (y1, x1, (in_y - y0) * (in_x - x0))]
  else:
    raise NotImplementedError(f"interpolation {interpolation!r} is not NEAREST or BILINEAR")
  inside = [(r >= 0) & (r < in_hw[0]) & (c >= 0) & (c < in_hw[1]) & ~at_infinity for r, c, _ in taps]
  return taps, inside, at_infinity


def _warp(images, transforms, out_hw, interpolation: str, mode: str):
  """The transform with a fill value of 0, in float32 (images [batch, height, width, channels])."""
  batch, height, width, _ = images.shape
  taps, inside, _ = _taps(transforms, batch, (height, width), out_hw, interpolation, mode)
  b = jnp.arange(batch)[:, None, None]
  out = 0
  for (r, c, w), ok in zip(taps, inside):
    rows = jnp.clip(r, 0, height - 1).astype(jnp.int32)
    cols = jnp.clip(c, 0, width - 1).astype(jnp.int32)
    out = out + jnp.where(ok, w, 0)[..., None] * images[b, rows, cols].astype(_F32)
  return out


def _fill_weight(transforms, batch: int, in_hw, out_hw, interpolation: str, mode: str):
  """How much of each output pixel is the fill value: its taps' weights outside the image (1 at k = 0)."""
  taps, inside, at_infinity = _taps(transforms, batch, in_hw, out_hw, interpolation, mode)
  weight = sum(jnp.where(ok, 0, w) for (_, _, w), ok in zip(taps, inside))
  return jnp.where(at_infinity, 1, weight)[..., None]


def _inverted(transforms):
  """TF's gradient transform: the flat 8-vector of each 3x3 projective matrix's inverse."""
  matrices = jnp.concatenate([transforms.astype(_F32), jnp.ones(transforms.shape[:1] + (1,), _F32)], 1)
  inverse = jnp.linalg.inv(matrices.reshape(-1, 3, 3)).reshape(-1, 9)
  return (inverse / inverse[:, 8:9])[:, :8]


@register("ImageProjectiveTransformV2", "ImageProjectiveTransformV3")
def image_projective_transform(ctx, images, transforms, output_shape, fill_value=0.0):
  out_hw = tuple(_static(ctx, output_shape, "output_shape"))
  interpolation = text(ctx.attr("interpolation")).upper()
  mode = text(ctx.attr("fill_mode", "CONSTANT")).upper()
  images = jnp.asarray(images)
  transforms = lax.stop_gradient(jnp.asarray(transforms).reshape(-1, 8))   # TF: no gradient for them
  fill = lax.stop_gradient(jnp.asarray(fill_value).astype(images.dtype).astype(_F32))   # TF: a T
  batch, height, width, channels = images.shape
  in_hw = (height, width)
  fill_part = fill * _fill_weight(transforms, batch, in_hw, out_hw, interpolation, mode)
  if not jnp.issubdtype(images.dtype, jnp.inexact):
    return (_warp(images, transforms, out_hw, interpolation, mode) + fill_part).astype(images.dtype)
  out_aval = jax.typeof(jax.ShapeDtypeStruct((batch,) + out_hw + (channels,), _F32))

  def forward(res, lin):
    return [_warp(lin[0], res[0], out_hw, interpolation, mode)]

  def backward(res, cts):   # TF's registered gradient: the cotangent warped by the inverse, fill 0
    grad = _warp(cts[0], _inverted(res[0]), in_hw, interpolation, mode)
    return [grad.astype(images.dtype)]

  warped, = _jax_compat.custom_linear(forward, backward, [transforms], [images], [out_aval])
  return (warped + fill_part).astype(images.dtype)
