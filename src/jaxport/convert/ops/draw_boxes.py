"""Op rules: DrawBoundingBoxes and DrawBoundingBoxesV2 (`tf.image.draw_bounding_boxes`).

TF's kernel draws each box's outline in turn, later boxes over earlier ones. A box corner is
`(int64)(float32(coordinate) * (size - 1))`: float32 product, truncated toward zero. An inverted box,
or one wholly outside the image, is skipped; an edge outside the image is not drawn, and the others
are clipped to it. Box `k` takes colour `k % len(colors)`; without colours (or with an empty table)
TF's default table of ten, whose first channel is 1 for one-channel images. TF has no gradient for it.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_DEFAULT_COLORS = np.array([[1, 1, 0, 1], [0, 0, 1, 1], [1, 0, 0, 1], [0, 1, 0, 1], [0.5, 0, 0.5, 1],
                            [0.5, 0.5, 0, 1], [0.5, 0, 0, 1], [0, 0, 0.5, 1], [0, 1, 1, 1], [1, 0, 1, 1]],
                           np.float32)


@register("DrawBoundingBoxes", "DrawBoundingBoxesV2")
def draw_bounding_boxes(ctx, images, boxes, colors=None):
  _check(ctx, images, boxes)
  batch, height, width, depth = images.shape
  table = _color_table(ctx, colors, depth)
  if boxes.shape[1] == 0:
    return lax.stop_gradient(jnp.asarray(images))
  corners = jnp.asarray(boxes, jnp.float32) * jnp.asarray([height - 1, width - 1] * 2, jnp.float32)
  corners = corners.astype(jnp.int32)   # truncates toward zero; saturates where TF's int64 would only be far out
  rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]

  def draw(k, canvas):
    top, left, bottom, right = (corners[:, k, i][:, None, None] for i in range(4))
    shown = (top <= bottom) & (left <= right) & (top < height) & (bottom >= 0) & (left < width) & (right >= 0)
    in_cols = (cols >= left) & (cols <= right)   # the clamps: cols and rows only exist inside the image
    in_rows = (rows >= top) & (rows <= bottom)
    outline = (((rows == top) | (rows == bottom)) & in_cols) | (((cols == left) | (cols == right)) & in_rows)
    color = table[k % table.shape[0]].astype(images.dtype)
    return jnp.where((shown & outline)[..., None], color, canvas)
  return lax.stop_gradient(lax.fori_loop(0, boxes.shape[1], draw, jnp.asarray(images)))   # TF: no gradient


def _check(ctx, images, boxes):
  if np.ndim(images) != 4:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: the rank of the images should be 4 (TF's rule)")
  if np.ndim(boxes) != 3 or np.shape(boxes)[2] != 4:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: boxes must be [batch, num_boxes, 4] (TF's rule), "
                           f"got {np.shape(boxes)}")
  if np.shape(images)[0] != np.shape(boxes)[0]:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: the batch sizes should be the same (TF's rule)")
  if np.shape(images)[3] not in (1, 3, 4):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: channel depth should be either 1 (GRY), 3 (RGB), "
                           "or 4 (RGBA) (TF's rule)")


def _color_table(ctx, colors, depth: int):
  """The colours as TF's kernel reads them: the table's first `depth` channels, or the default table."""
  if colors is not None:
    if np.ndim(colors) != 2 or np.shape(colors)[1] < depth:
      raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: colors must be a 2-D matrix with at least as many "
                             f"channels as the image ({depth}), got {np.shape(colors)} (TF's rule)")
    if np.size(colors):
      return jnp.asarray(colors, jnp.float32)[:, :depth]
  table = _DEFAULT_COLORS[:, :depth].copy()
  if depth == 1:
    table[:, 0] = 1
  return jnp.asarray(table)
