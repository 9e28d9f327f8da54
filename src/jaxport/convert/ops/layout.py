"""Op rules: moving data between space and depth (DepthToSpace, SpaceToDepth) and
image and volume patches (ExtractImagePatches, ExtractVolumePatches).

All rules are reshapes, transposes and strided slices, so they keep NumPy constants
NumPy and work for every dtype. Differences from TF: `data_format="NCHW_VECT_C"` is
not supported (it raises); TF's CPU kernels take NHWC only, jaxport also takes NCHW.
"""
from __future__ import annotations

import math

import numpy as np

from jaxport.convert.ops._util import text, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _to_nhwc(ctx, x):
  """`x` in NHWC, and the function that puts a result back in the node's data_format."""
  data_format = text(ctx.attr("data_format", "NHWC"))
  m = xp(x)
  if data_format == "NHWC":
    return x, lambda y: y
  if data_format == "NCHW":
    return m.transpose(x, (0, 2, 3, 1)), lambda y: xp(y).transpose(y, (0, 3, 1, 2))
  raise NotImplementedError(f"{ctx.op} node {ctx.name!r}: data_format {data_format!r} is not supported; "
                            "use NHWC or NCHW")


@register("DepthToSpace")
def depth_to_space(ctx, x):
  """[N, H, W, b*b*C] -> [N, H*b, W*b, C]: depth index (i*b + j)*C + c goes to row i, column j."""
  b = ctx.attr("block_size")
  x, back = _to_nhwc(ctx, x)
  n, h, w, depth = np.shape(x)
  if depth % (b * b):
    raise InvalidNodeError(f"DepthToSpace node {ctx.name!r}: depth {depth} is not divisible by block_size^2 = {b * b}")
  m, c = xp(x), depth // (b * b)
  y = m.reshape(x, (n, h, w, b, b, c)).transpose(0, 1, 3, 2, 4, 5)
  return back(m.reshape(y, (n, h * b, w * b, c)))


@register("SpaceToDepth")
def space_to_depth(ctx, x):
  """[N, H*b, W*b, C] -> [N, H, W, b*b*C], the inverse of DepthToSpace."""
  b = ctx.attr("block_size")
  x, back = _to_nhwc(ctx, x)
  n, h, w, c = np.shape(x)
  if h % b or w % b:
    raise InvalidNodeError(f"SpaceToDepth node {ctx.name!r}: height {h} and width {w} must be divisible by "
                           f"block_size {b}")
  m = xp(x)
  y = m.reshape(x, (n, h // b, b, w // b, b, c)).transpose(0, 1, 3, 2, 4, 5)
  return back(m.reshape(y, (n, h // b, w // b, b * b * c)))


def _window_geometry(size: int, k: int, stride: int, rate: int, padding: str) -> tuple[int, int, int]:
  """(output size, padding before, padding after) of one spatial dim, as TF computes them."""
  span = (k - 1) * rate + 1
  if padding == "VALID":
    out = int((size - span + stride) / stride)   # C++ division, as TF's GetWindowedOutputSize
    if out < 0:
      raise InvalidNodeError(f"the window spans {span} > input size {size} with VALID padding: the output "
                             "size would be negative (TF raises too)")
    return out, 0, 0
  out = math.ceil(size / stride)
  total = max((out - 1) * stride + span - size, 0)
  return out, total // 2, total - total // 2


@register("ExtractImagePatches")
def extract_image_patches(ctx, images):
  """[B, H, W, C] -> [B, rows, cols, kr*kc*C]: each patch flattened row, column, then channel."""
  return _patches(ctx, images, ctx.attr("ksizes")[1:-1], ctx.attr("strides")[1:-1], ctx.attr("rates")[1:-1])


@register("ExtractVolumePatches")
def extract_volume_patches(ctx, volumes):
  """[B, P, H, W, C] -> [B, planes, rows, cols, kp*kr*kc*C]: each patch flattened plane, row, column,
  then channel. Unlike ExtractImagePatches, TF's SAME padding here may be negative (Eigen's volume
  patches): where the windows span less than the input, they start half the span left over in."""
  return _patches(ctx, volumes, ctx.attr("ksizes")[1:-1], ctx.attr("strides")[1:-1], (1, 1, 1), centred=True)


def _patches(ctx, x, sizes, strides, rates, centred=False):
  """The patches of `x` [B, *spatial, C], one output position per window, flattened window-major."""
  padding = text(ctx.attr("padding"))
  spatial = np.shape(x)[1:-1]
  geometry = [_window_geometry(n, k, s, r, padding) for n, k, s, r in zip(spatial, sizes, strides, rates)]
  outs = [out for out, _, _ in geometry]
  shifts = [max((n - (out - 1) * s - (k - 1) * r - 1) // 2, 0) if centred and padding == "SAME" and out else 0
            for n, out, k, s, r in zip(spatial, outs, sizes, strides, rates)]
  m = xp(x)
  padded = m.pad(x, ((0, 0), *((before, after) for _, before, after in geometry), (0, 0)))
  b, c = np.shape(x)[0], np.shape(x)[-1]
  if 0 in outs:
    return m.zeros((b, *outs, math.prod(sizes) * c), dtype=padded.dtype)
  taps = [padded[(slice(None), *(slice(h + o * r, h + o * r + (n - 1) * s + 1, s)
                                 for h, o, r, n, s in zip(shifts, offsets, rates, outs, strides)), slice(None))]
          for offsets in np.ndindex(*sizes)]
  return m.reshape(m.stack(taps, axis=-2), (b, *outs, math.prod(sizes) * c))
