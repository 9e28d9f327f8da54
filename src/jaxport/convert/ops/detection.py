"""Op rules: object detection (non-max suppression, CombinedNonMaxSuppression, CropAndResize).

Non-max suppression follows TF's CPU kernel (non_max_suppression_op.cc) with a fixed-size
`lax.while_loop`: each step takes the live candidate with the highest score (ties: the
lowest box index, as TF's priority queue), compares it with the boxes selected since it
was last looked at, then selects it, drops it, or (soft-NMS) keeps it with a decayed
score. A candidate needs a score above `score_threshold`; hard NMS drops it when its
IoU with a selected box is above `iou_threshold`. `max_output_size` must be a constant.
Padded outputs (`pad_to_max_output_size`) have a fixed shape and work under jit and vmap;
unpadded ones have as many entries as boxes were kept, known only from the values, so
they need an eager (un-jitted) call. TF defines no gradient for these ops; the rules
stop gradients.

CropAndResize follows TF's crop_and_resize_op.cc in float32; its gradients are TF's:
w.r.t. the image, the adjoint of the sampling; w.r.t. the boxes, the bilinear
sampling's, even for method="nearest" (as TF's `_CropAndResizeGrad` does).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.ops._util import divide_as_written, rounded_product, static_ints, static_value
from jaxport.convert.registry import register
from jaxport.errors import DynamicShapeError, InvalidNodeError

_F32 = np.float32


# --------------------------------------------------------------------------- non-max suppression


def _iou(box, others):
  """TF's IOU between one box [4] and boxes [K, 4] (corners in either order), in their dtype."""
  def corners(b):
    return (jnp.minimum(b[..., 0], b[..., 2]), jnp.minimum(b[..., 1], b[..., 3]),
            jnp.maximum(b[..., 0], b[..., 2]), jnp.maximum(b[..., 1], b[..., 3]))
  ymin_i, xmin_i, ymax_i, xmax_i = corners(box)
  ymin_j, xmin_j, ymax_j, xmax_j = corners(others)
  area_i = rounded_product((ymax_i - ymin_i) * (xmax_i - xmin_i))
  area_j = rounded_product((ymax_j - ymin_j) * (xmax_j - xmin_j))
  zero = jnp.zeros((), box.dtype)
  inter = rounded_product(jnp.maximum(jnp.minimum(ymax_i, ymax_j) - jnp.maximum(ymin_i, ymin_j), zero) *
                          jnp.maximum(jnp.minimum(xmax_i, xmax_j) - jnp.maximum(xmin_i, xmin_j), zero))
  union = area_i + area_j - inter
  empty = (area_i <= 0) | (area_j <= 0)
  return jnp.where(empty, zero, inter / jnp.where(empty, jnp.ones((), box.dtype), union)).astype(jnp.float32)


def _suppress(similarity, scores, max_output: int, iou_threshold, score_threshold, soft_nms_sigma=None):
  """TF's DoNonMaxSuppressionOp. `similarity(c, selected)` gives candidate c's float32 similarity
  to each of the [max_output] selected boxes. Returns (indices, scores) padded with zeros, and
  the number of valid entries."""
  scores = export_marks.stop_gradient(jnp.asarray(scores))
  dtype, count = scores.dtype, scores.shape[0]
  iou_threshold = jnp.asarray(iou_threshold).astype(dtype)
  score_threshold = jnp.asarray(score_threshold).astype(dtype)
  if soft_nms_sigma is None:
    soft = False
  elif isinstance(soft_nms_sigma, jax.core.Tracer):   # decided per call: both paths, selected
    soft = jnp.asarray(soft_nms_sigma) > 0
  else:
    soft = bool(np.asarray(soft_nms_sigma) > 0)
  if soft is not False:
    sigma = jnp.asarray(soft_nms_sigma, dtype)
    scale = jnp.where(sigma > 0, jnp.asarray(-0.5, dtype) / jnp.where(sigma > 0, sigma, 1), 0)
  slots = jnp.arange(max_output)

  def decay(candidate_score, sims, compared):
    """Soft-NMS: the score times exp(scale * sim^2) for each compared box, newest first, as TF."""
    def body(step, score):
      j = max_output - 1 - step
      sim = sims[j].astype(dtype)
      weight = jnp.exp(scale * sim * sim)
      return jnp.where(compared[j] & (score > score_threshold), score * weight, score)
    return lax.fori_loop(0, max_output, body, candidate_score)

  def step(state):
    current, alive, first_unseen, selected, kept_scores, n_kept = state
    c = jnp.argmax(jnp.where(alive, current, -jnp.inf))   # the first of equal maxima: the lowest index
    original = current[c]
    sims = similarity(c, selected)
    compared = (slots >= first_unseen[c]) & (slots < n_kept)
    overlapping = jnp.any(compared & (sims.astype(dtype) > iou_threshold))
    if soft is True:
      score, suppressed = decay(original, sims, compared), jnp.zeros((), bool)
    elif soft is False:
      score, suppressed = original, overlapping
    else:
      score = jnp.where(soft, decay(original, sims, compared), original)
      suppressed = ~soft & overlapping
    take = ~suppressed & (score == original)
    keep_for_later = ~suppressed & ~take & (score > score_threshold)
    selected = jnp.where(take, selected.at[n_kept].set(c.astype(jnp.int32), mode="drop"), selected)
    kept_scores = jnp.where(take, kept_scores.at[n_kept].set(score, mode="drop"), kept_scores)
    return (current.at[c].set(score), alive.at[c].set(keep_for_later), first_unseen.at[c].set(n_kept),
            selected, kept_scores, n_kept + take.astype(jnp.int32))

  def running(state):
    return (state[5] < max_output) & jnp.any(state[1])

  state = (scores, scores > score_threshold, jnp.zeros(count, jnp.int32), jnp.zeros(max_output, jnp.int32),
           jnp.zeros(max_output, dtype), jnp.zeros((), jnp.int32))
  if max_output > 0 and count > 0:
    state = lax.while_loop(running, step, state)
  return state[3], state[4], state[5]


def _max_output(ctx, max_output_size) -> int:
  size = static_ints(max_output_size, "max_output_size", ctx)[0]
  if size < 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: max_output_size must be non-negative, got {size}.")
  return size


def _check_threshold(ctx, value, name: str) -> None:
  """TF's "iou_threshold must be in [0, 1]", checked when the threshold is known."""
  if not isinstance(value, jax.core.Tracer) and not 0 <= float(np.asarray(value)) <= 1:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: {name} must be in [0, 1], got {float(np.asarray(value))}.")


def _box_similarity(boxes):
  boxes = export_marks.stop_gradient(jnp.asarray(boxes))
  return lambda c, selected: _iou(boxes[c], boxes[selected])


def _unpadded(ctx, outputs, n_valid):
  """The first `n_valid` entries of each output: needs `n_valid`'s value (no jit)."""
  try:
    n = int(static_value(n_valid, "number of kept boxes", ctx))
  except DynamicShapeError as e:
    e.args = (e.args[0] + f" {ctx.op} without padding returns as many indices as boxes are kept: use "
              "NonMaxSuppressionV4 or V5 with pad_to_max_output_size=True (in TF, "
              "tf.image.non_max_suppression_padded), whose output has a fixed size, or call the converted "
              "function without jax.jit or vmap.",)
    raise
  return [o[:n] for o in outputs]


@register("NonMaxSuppression")
def non_max_suppression_v1(ctx, boxes, scores, max_output_size):
  iou = ctx.attr("iou_threshold", 0.5)
  _check_threshold(ctx, iou, "iou_threshold")
  selected, _, n_valid = _suppress(_box_similarity(boxes), scores, _max_output(ctx, max_output_size), iou,
                                   np.finfo(np.float32).min)
  return _unpadded(ctx, [selected], n_valid)[0]


@register("NonMaxSuppressionV2")
def non_max_suppression_v2(ctx, boxes, scores, max_output_size, iou_threshold):
  _check_threshold(ctx, iou_threshold, "iou_threshold")
  selected, _, n_valid = _suppress(_box_similarity(boxes), scores, _max_output(ctx, max_output_size),
                                   iou_threshold, np.finfo(np.float32).min)
  return _unpadded(ctx, [selected], n_valid)[0]


@register("NonMaxSuppressionV3")
def non_max_suppression_v3(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold):
  _check_threshold(ctx, iou_threshold, "iou_threshold")
  selected, _, n_valid = _suppress(_box_similarity(boxes), scores, _max_output(ctx, max_output_size),
                                   iou_threshold, score_threshold)
  return _unpadded(ctx, [selected], n_valid)[0]


@register("NonMaxSuppressionV4")
def non_max_suppression_v4(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold):
  _check_threshold(ctx, iou_threshold, "iou_threshold")
  selected, _, n_valid = _suppress(_box_similarity(boxes), scores, _max_output(ctx, max_output_size),
                                   iou_threshold, score_threshold)
  if ctx.attr("pad_to_max_output_size", False):
    return selected, n_valid
  return _unpadded(ctx, [selected], n_valid)[0], n_valid


@register("NonMaxSuppressionV5")
def non_max_suppression_v5(ctx, boxes, scores, max_output_size, iou_threshold, score_threshold, soft_nms_sigma):
  _check_threshold(ctx, iou_threshold, "iou_threshold")
  if not isinstance(soft_nms_sigma, jax.core.Tracer) and float(np.asarray(soft_nms_sigma)) < 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: soft_nms_sigma must be non-negative, "
                           f"got {float(np.asarray(soft_nms_sigma))}.")
  selected, kept_scores, n_valid = _suppress(_box_similarity(boxes), scores, _max_output(ctx, max_output_size),
                                             iou_threshold, score_threshold, soft_nms_sigma)
  if ctx.attr("pad_to_max_output_size", False):
    return selected, kept_scores, n_valid
  return (*_unpadded(ctx, [selected, kept_scores], n_valid), n_valid)


@register("NonMaxSuppressionWithOverlaps")
def non_max_suppression_with_overlaps(ctx, overlaps, scores, max_output_size, overlap_threshold,
                                      score_threshold):
  overlaps = export_marks.stop_gradient(jnp.asarray(overlaps))
  selected, _, n_valid = _suppress(lambda c, chosen: overlaps[c, chosen].astype(jnp.float32), scores,
                                   _max_output(ctx, max_output_size), overlap_threshold, score_threshold)
  return _unpadded(ctx, [selected], n_valid)[0]


@register("CombinedNonMaxSuppression")
def combined_non_max_suppression(ctx, boxes, scores, max_output_size_per_class, max_total_size, iou_threshold,
                                 score_threshold):
  """TF's BatchedNonMaxSuppressionOp: per image and class, hard NMS of the boxes scoring above
  `score_threshold` (up to `max_output_size_per_class`); then each image's picks of all classes, with the
  unfilled per-class slots (score -1, class -1, box 0, as the kernel keeps them), sorted by score, of which
  the first min(number picked, output size) are returned, clipped to [0, 1] with `clip_boxes`."""
  per_class = _max_output(ctx, max_output_size_per_class)
  total = static_ints(max_total_size, "max_total_size", ctx)[0]
  if total <= 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: max_total_size must be > 0, got {total}.")
  _check_threshold(ctx, iou_threshold, "iou_threshold")
  boxes = export_marks.stop_gradient(jnp.asarray(boxes, _F32))
  scores = export_marks.stop_gradient(jnp.asarray(scores, _F32))
  batch, count, q, _ = boxes.shape
  classes = scores.shape[-1]
  if q not in (1, classes):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: the third dimension of boxes must be 1 or the number of "
                           f"classes ({classes}), got {q}.")
  size = min(per_class, count)
  out_size = min(total, per_class * classes) if ctx.attr("pad_per_class") else total

  def one_class(class_boxes, class_scores):
    index, kept, n = _suppress(_box_similarity(class_boxes), class_scores, size, iou_threshold, score_threshold)
    valid = jnp.arange(size) < n
    return jnp.where(valid[:, None], class_boxes[index], 0), jnp.where(valid, kept, -1), valid

  per_class_boxes = jnp.broadcast_to(jnp.moveaxis(boxes, 2, 1), (batch, classes, count, 4))
  picked, picked_scores, valid = jax.vmap(jax.vmap(one_class))(per_class_boxes, jnp.moveaxis(scores, 2, 1))
  labels = jnp.where(valid, jnp.arange(classes, dtype=_F32)[:, None], -1)
  slots = classes * size
  picked, picked_scores, labels = (x.reshape(batch, slots, *x.shape[3:]) for x in (picked, picked_scores, labels))
  order = jnp.argsort(-picked_scores, axis=1, stable=True)
  if slots < out_size:   # fewer slots than outputs: the rest is padding
    order = jnp.pad(order, ((0, 0), (0, out_size - slots)))
  order = order[:, :out_size]
  n_valid = jnp.minimum(jnp.sum(valid.reshape(batch, slots), axis=1), out_size).astype(jnp.int32)
  shown = jnp.arange(out_size)[None, :] < n_valid[:, None]
  out_boxes = jnp.take_along_axis(picked, order[..., None], axis=1)
  if ctx.attr("clip_boxes"):
    out_boxes = jnp.maximum(jnp.minimum(out_boxes, 1), 0)
  take = lambda x: jnp.where(shown, jnp.take_along_axis(x, order, axis=1), 0)
  return (jnp.where(shown[..., None], out_boxes, 0), take(picked_scores), take(labels), n_valid)


# --------------------------------------------------------------------------- CropAndResize


def _sample_positions(low, high, in_size: int, out_size: int):
  """[boxes, out_size] sampling positions along one axis, and which fall inside the image."""
  if out_size > 1:
    scale = divide_as_written((high - low) * _F32(in_size - 1), _F32(out_size - 1))
    positions = (rounded_product(low[:, None] * _F32(in_size - 1)) +
                 rounded_product(np.arange(out_size, dtype=_F32) * scale[:, None]))
  else:
    positions = (_F32(0.5) * (low + high) * _F32(in_size - 1))[:, None]
  return positions, (positions >= 0) & (positions <= in_size - 1)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))   # one computation when run eagerly
def _crop(image, boxes, box_ind, crop_size, extrapolation_value, method: str):
  """TF's CropAndResize: [boxes, crop_h, crop_w, channels] float32 crops of `image`."""
  image = jnp.asarray(image).astype(jnp.float32)
  boxes = jnp.asarray(boxes).astype(jnp.float32)
  height, width = image.shape[1:3]
  in_y, inside_y = _sample_positions(boxes[:, 0], boxes[:, 2], height, crop_size[0])
  in_x, inside_x = _sample_positions(boxes[:, 1], boxes[:, 3], width, crop_size[1])
  batch = jnp.asarray(box_ind, jnp.int32)[:, None, None]

  def at(ys, xs):
    """image[box_ind, ys, xs] for [boxes, h, k] row and [boxes, w, l] column indices: [boxes, h, k, w, l, C]."""
    ys, xs = jnp.clip(ys, 0, height - 1).astype(jnp.int32), jnp.clip(xs, 0, width - 1).astype(jnp.int32)
    return image[batch[..., None, None], ys[:, :, :, None, None], xs[:, None, None, :, :]]

  if method == "nearest":
    nearest = lambda p: lax.round(p, lax.RoundingMethod.AWAY_FROM_ZERO)[..., None]  # noqa: E731  (roundf)
    crops = at(nearest(in_y), nearest(in_x))[:, :, 0, :, 0]
  else:
    top, left = jnp.floor(in_y), jnp.floor(in_x)
    y_lerp, x_lerp = (in_y - top)[:, :, None, None], (in_x - left)[:, None, :, None]
    # One gather of each sample's 2x2 neighbourhood (a single scatter in the gradient).
    corners = at(jnp.stack([top, jnp.ceil(in_y)], -1), jnp.stack([left, jnp.ceil(in_x)], -1))
    top_left, top_right = corners[:, :, 0, :, 0], corners[:, :, 0, :, 1]
    bottom_left, bottom_right = corners[:, :, 1, :, 0], corners[:, :, 1, :, 1]
    upper = top_left + rounded_product((top_right - top_left) * x_lerp)
    lower = bottom_left + rounded_product((bottom_right - bottom_left) * x_lerp)
    crops = upper + rounded_product((lower - upper) * y_lerp)
  inside = inside_y[:, :, None, None] & inside_x[:, None, :, None]
  return jnp.where(inside, crops, jnp.asarray(extrapolation_value, jnp.float32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _crop_nearest(image, boxes, box_ind, crop_size, extrapolation_value):
  return _crop(image, boxes, box_ind, crop_size, extrapolation_value, "nearest")


def _crop_nearest_fwd(image, boxes, box_ind, crop_size, extrapolation_value):
  return _crop_nearest(image, boxes, box_ind, crop_size, extrapolation_value), (image, boxes, box_ind)


def _crop_nearest_bwd(crop_size, extrapolation_value, residuals, grads):
  """Image: the nearest sampling's adjoint. Boxes: the bilinear sampling's gradient, as TF."""
  image, boxes, box_ind = residuals
  _, image_vjp = jax.vjp(lambda im: _crop(im, boxes, box_ind, crop_size, extrapolation_value, "nearest"), image)
  _, boxes_vjp = jax.vjp(lambda bx: _crop(image, bx, box_ind, crop_size, extrapolation_value, "bilinear"), boxes)
  return image_vjp(grads)[0], boxes_vjp(grads)[0], np.zeros(np.shape(box_ind), jax.dtypes.float0)


_crop_nearest.defvjp(_crop_nearest_fwd, _crop_nearest_bwd)


@export_marks.marked("crop_nearest", static=True)
def _crop_nearest_marked(image, boxes, box_ind, *, crop_size, extrapolation_value):
  """`_crop_nearest`, whose TF gradient (bilinear for the boxes) an exported artifact keeps."""
  return _crop_nearest(image, boxes, box_ind, tuple(crop_size), float(extrapolation_value))


def _crop_spec(ctx, box_ind, crop_size, batch: int):
  crop = tuple(static_ints(crop_size, "crop_size", ctx))
  if len(crop) != 2 or min(crop) <= 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: crop_size must hold two positive sizes, got {list(crop)}.")
  if not isinstance(box_ind, jax.core.Tracer):   # known values: TF's check (under jit, indices clamp)
    known = np.asarray(box_ind)
    if known.size and (known.min() < 0 or known.max() >= batch):
      raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: box_index has values outside [0, {batch}).")
  method = ctx.attr("method", "bilinear")
  method = method.decode() if isinstance(method, bytes) else method
  if method not in ("bilinear", "nearest"):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: method must be 'bilinear' or 'nearest', got {method!r}.")
  return crop, method


@register("CropAndResize")
def crop_and_resize(ctx, image, boxes, box_ind, crop_size):
  crop, method = _crop_spec(ctx, box_ind, crop_size, image.shape[0])
  extrapolation = float(ctx.attr("extrapolation_value", 0.0))
  if method == "nearest":
    return _crop_nearest_marked(jnp.asarray(image), jnp.asarray(boxes), jnp.asarray(box_ind), crop_size=list(crop),
                                extrapolation_value=extrapolation)
  return _crop(image, boxes, box_ind, crop, extrapolation, "bilinear")


@register("CropAndResizeGradImage")
def crop_and_resize_grad_image(ctx, grads, boxes, box_ind, image_size):
  shape = tuple(static_ints(image_size, "image_size", ctx))
  crop, method = _crop_spec(ctx, box_ind, np.asarray(grads.shape[1:3]), shape[0])
  dtype = jax.dtypes.canonicalize_dtype(ctx.attr("T", np.float32))
  _, image_vjp = jax.vjp(lambda im: _crop(im, boxes, box_ind, crop, 0.0, method), jnp.zeros(shape, jnp.float32))
  return image_vjp(jnp.asarray(grads, jnp.float32))[0].astype(dtype)


@register("CropAndResizeGradBoxes")
def crop_and_resize_grad_boxes(ctx, grads, image, boxes, box_ind):
  crop, _ = _crop_spec(ctx, box_ind, np.asarray(grads.shape[1:3]), image.shape[0])
  _, boxes_vjp = jax.vjp(lambda bx: _crop(image, bx, box_ind, crop, 0.0, "bilinear"), jnp.asarray(boxes, jnp.float32))
  return boxes_vjp(jnp.asarray(grads, jnp.float32))[0]
