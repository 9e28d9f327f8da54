"""Op rules: moving data between space and depth (DepthToSpace, SpaceToDepth) and
image patches (ExtractImagePatches).

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
  _, kr, kc, _ = ctx.attr("ksizes")
  _, sr, sc, _ = ctx.attr("strides")
  _, rr, rc, _ = ctx.attr("rates")
  padding = text(ctx.attr("padding"))
  b, h, w, c = np.shape(images)
  rows, top, bottom = _window_geometry(h, kr, sr, rr, padding)
  cols, left, right = _window_geometry(w, kc, sc, rc, padding)
  m = xp(images)
  padded = m.pad(images, ((0, 0), (top, bottom), (left, right), (0, 0)))
  if rows == 0 or cols == 0:
    return m.zeros((b, rows, cols, kr * kc * c), dtype=padded.dtype)
  taps = [padded[:, i * rr:i * rr + (rows - 1) * sr + 1:sr, j * rc:j * rc + (cols - 1) * sc + 1:sc, :]
          for i in range(kr) for j in range(kc)]
  return m.reshape(m.stack(taps, axis=3), (b, rows, cols, kr * kc * c))
