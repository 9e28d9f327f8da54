"""Non-max suppression and CropAndResize against TF."""
import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import registry, tiers
from jaxport.errors import DynamicShapeError, InvalidNodeError
from oracle import assert_close, check

RAW = tf.raw_ops
NUM_BOXES, MAX_OUT = 12, 7


def crowded_boxes(n=NUM_BOXES, seed=0):
  """Boxes that overlap a lot (some identical, some flipped), and scores with many ties."""
  rs = np.random.RandomState(seed)
  centre, size = rs.uniform(0.3, 0.7, (n, 2)), rs.uniform(0.1, 0.5, (n, 2))
  boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
  boxes[1] = boxes[0]
  boxes[2] = boxes[3][[2, 3, 0, 1]]   # the same box, corners swapped
  boxes[4, 2] = boxes[4, 0]           # an empty box
  scores = rs.choice([0.1, 0.3, 0.5, 0.5, 0.9], n)
  return boxes.astype(np.float32), scores.astype(np.float32)


def _nms_padded(boxes, scores, iou, score_min, sigma):
  v4 = RAW.NonMaxSuppressionV4(boxes=boxes, scores=scores, max_output_size=MAX_OUT, iou_threshold=iou,
                               score_threshold=score_min, pad_to_max_output_size=True)
  v5 = RAW.NonMaxSuppressionV5(boxes=boxes, scores=scores, max_output_size=MAX_OUT, iou_threshold=iou,
                               score_threshold=score_min, soft_nms_sigma=sigma, pad_to_max_output_size=True)
  return (*v4, *v5)


@pytest.fixture(scope="module")
def converted_nms():
  """The padded NMS ops converted once, thresholds and soft-NMS sigma as inputs, jitted."""
  boxes, scores = crowded_boxes()
  args = (boxes, scores, np.float32(0.5), np.float32(0.0), np.float32(0.0))
  jax_fn, params = jaxport.convert(_nms_padded, *args)
  return jax.jit(lambda *a: jax_fn(params, *a)[0])


_COORDS = st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 0.6, 0.75, 0.9, 1.0])


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(boxes=hnp.arrays(np.float32, (NUM_BOXES, 4), elements=_COORDS),
                  scores=hnp.arrays(np.float32, NUM_BOXES, elements=st.sampled_from([0.0, 0.2, 0.4, 0.4, 0.8, 1.0])),
                  iou=st.sampled_from([0.0, 0.2, 1 / 3, 0.5, 0.7, 1.0]),
                  score_min=st.sampled_from([-np.inf, 0.0, 0.2, 0.5]),
                  sigma=st.sampled_from([0.0, 0.0, 0.1, 0.5, 2.0]))
def test_nms_padded_matches_tf(converted_nms, boxes, scores, iou, score_min, sigma):
  # Coordinates and scores from small sets: identical boxes, IoUs at the threshold, tied scores.
  args = (boxes, scores, np.float32(iou), np.float32(score_min), np.float32(sigma))
  assert_close(converted_nms(*args), _nms_padded(*args), 1e-6, 1e-6, "padded NMS")


def test_nms_v4_v5_padded_check():
  boxes, scores = crowded_boxes()

  def fn(boxes, scores):
    v4 = RAW.NonMaxSuppressionV4(boxes=boxes, scores=scores, max_output_size=20, iou_threshold=0.4,
                                 score_threshold=0.2, pad_to_max_output_size=True)   # more than NUM_BOXES
    v5 = RAW.NonMaxSuppressionV5(boxes=boxes, scores=scores, max_output_size=5, iou_threshold=0.4,
                                 score_threshold=0.05, soft_nms_sigma=0.5, pad_to_max_output_size=True)
    return (*v4, *v5)
  check(fn, boxes, scores, grad=False)


def test_nms_half():
  boxes, scores = crowded_boxes()
  boxes, scores = boxes.astype(np.float16), scores.astype(np.float16)
  fn = lambda b, s: RAW.NonMaxSuppressionV5(  # noqa: E731
      boxes=b, scores=s, max_output_size=6, iou_threshold=np.float16(0.4), score_threshold=np.float16(0.1),
      soft_nms_sigma=np.float16(0.3), pad_to_max_output_size=True)
  check(fn, boxes, scores, grad=False, vmap=False, atol=1e-3, rtol=1e-3)


def test_nms_unpadded_eager():
  # As many indices as boxes are kept: exact when called without jit.
  boxes, scores = crowded_boxes(seed=1)
  overlaps = np.random.RandomState(2).uniform(0, 1, (NUM_BOXES, NUM_BOXES)).astype(np.float32)

  def fn(boxes, scores, overlaps):
    return (RAW.NonMaxSuppressionV3(boxes=boxes, scores=scores, max_output_size=MAX_OUT, iou_threshold=0.3,
                                    score_threshold=0.2),
            *RAW.NonMaxSuppressionV4(boxes=boxes, scores=scores, max_output_size=3, iou_threshold=0.6,
                                     score_threshold=0.0),
            *RAW.NonMaxSuppressionV5(boxes=boxes, scores=scores, max_output_size=MAX_OUT, iou_threshold=0.3,
                                     score_threshold=0.2, soft_nms_sigma=0.4),
            RAW.NonMaxSuppressionWithOverlaps(overlaps=overlaps, scores=scores, max_output_size=MAX_OUT,
                                              overlap_threshold=0.5, score_threshold=0.1),
            RAW.NonMaxSuppressionV2(boxes=boxes, scores=scores, max_output_size=4, iou_threshold=0.5),
            RAW.NonMaxSuppression(boxes=boxes, scores=scores, max_output_size=4, iou_threshold=0.2))
  check(fn, boxes, scores, overlaps, jit=False, vmap=False, grad=False)


def test_nms_unpadded_under_jit_names_the_fix():
  boxes, scores = crowded_boxes()
  fn = jaxport.convert_functional(lambda b, s: tf.image.non_max_suppression(b, s, 5, 0.5), boxes, scores)
  with pytest.raises(DynamicShapeError, match="pad_to_max_output_size=True"):
    jax.jit(fn)(boxes, scores)


def test_nms_rejects_what_tf_rejects():
  boxes, scores = crowded_boxes()
  fn = jaxport.convert_functional(lambda b, s: RAW.NonMaxSuppressionV3(
      boxes=b, scores=s, max_output_size=3, iou_threshold=1.5, score_threshold=0.0), boxes, scores)
  with pytest.raises(InvalidNodeError, match=r"iou_threshold must be in \[0, 1\]"):
    fn(boxes, scores)


# --------------------------------------------------------------------------- CombinedNonMaxSuppression


def _detections(batch=2, n=16, classes=3, q=1, low=0.0, seed=0):
  """Overlapping boxes (some shared across classes, some clipped by [0, 1]) and distinct scores."""
  rs = np.random.RandomState(seed)
  centre, size = rs.uniform(0.1, 0.9, (batch, n, q, 2)), rs.uniform(0.1, 0.6, (batch, n, q, 2))
  boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=-1).astype(np.float32)
  scores = rs.permutation(batch * n * classes).reshape(batch, n, classes) / (batch * n * classes)
  return boxes, (low + (1 - low) * scores).astype(np.float32)


@pytest.mark.parametrize("q,pad_per_class,clip_boxes,score_min,low,total", [
    (1, False, True, 0.3, 0.0, 10),
    (3, False, False, 0.3, 0.0, 10),
    (1, True, True, 0.0, 0.0, 100),     # pad_per_class: outputs min(total, per class * classes)
    (3, True, False, -np.inf, 0.0, 5),
    (1, False, True, -np.inf, -3.0, 40),   # picks scoring below -1 sort after the kernel's empty slots
    (1, False, True, 0.99, 0.0, 8),     # hardly anything passes the threshold
])
def test_combined_nms_matches_tf(q, pad_per_class, clip_boxes, score_min, low, total):
  boxes, scores = _detections(q=q, low=low)

  def fn(boxes, scores):
    return RAW.CombinedNonMaxSuppression(boxes=boxes, scores=scores, max_output_size_per_class=4,
                                         max_total_size=total, iou_threshold=0.4, score_threshold=score_min,
                                         pad_per_class=pad_per_class, clip_boxes=clip_boxes)
  check(fn, boxes, scores, grad=False, vmap=False, atol=0, rtol=0)


def test_combined_nms_from_tf_image_under_jit_and_vmap():
  boxes, scores = _detections(batch=3, q=3, seed=4)

  def fn(boxes, scores):
    return tf.image.combined_non_max_suppression(boxes, scores, 5, 12, iou_threshold=0.5, score_threshold=0.1)
  check(fn, boxes, scores, grad=False, vmap=False, atol=0, rtol=0)
  # The batch axis mapped by vmap: each image alone, then stacked.
  f = jaxport.convert_functional(fn, boxes[:1], scores[:1])
  mapped = jax.jit(jax.vmap(lambda b, s: [o[0] for o in f(b[None], s[None])]))(boxes, scores)
  for k in range(3):
    assert_close([m[k] for m in mapped], [o[0] for o in fn(boxes[k:k + 1], scores[k:k + 1])], 0, 0, "vmap")


def test_combined_nms_rejects_what_tf_rejects():
  boxes, scores = _detections()
  fn = lambda b, s: RAW.CombinedNonMaxSuppression(boxes=b, scores=s, max_output_size_per_class=3,  # noqa: E731
                                                  max_total_size=5, iou_threshold=1.5, score_threshold=0.0)
  with pytest.raises(tf.errors.InvalidArgumentError):
    fn(boxes, scores)
  with pytest.raises(InvalidNodeError, match=r"iou_threshold must be in \[0, 1\]"):
    jaxport.convert_functional(fn, boxes, scores)(boxes, scores)


# --------------------------------------------------------------------------- CropAndResize

IMAGE = np.random.RandomState(3).uniform(0, 1, (2, 6, 7, 3)).astype(np.float32)
CROP_BOXES = np.array([[0.1, 0.2, 0.8, 0.9],     # inside
                       [-0.2, 0.3, 0.5, 1.3],    # partly outside: extrapolated
                       [0.9, 0.6, 0.2, 0.1],     # flipped
                       [0.0, 0.0, 1.0, 1.0],     # the whole image: samples land on pixel centres
                       [0.4, 0.25, 0.4, 0.75]],  # zero height
                      np.float32)
BOX_IND = np.array([0, 1, 1, 0, 1], np.int32)


@pytest.mark.slow   # ~45 s on a loaded 2-core machine: four crops, each with grad and vmap
def test_crop_and_resize():
  # Gradients w.r.t. image and boxes: TF's CropAndResizeGradImage/GradBoxes (bilinear boxes for both).
  def fn(image, boxes):
    return [RAW.CropAndResize(image=image, boxes=boxes, box_ind=BOX_IND, crop_size=size, method=method,
                              extrapolation_value=extrapolation)
            for method in ("bilinear", "nearest") for size, extrapolation in (([4, 5], -1.5), ([1, 3], 0.0))]
  check(fn, IMAGE, CROP_BOXES)


def test_crop_and_resize_integer_and_half_images():
  def fn(image, image16):
    return (tf.image.crop_and_resize(image, CROP_BOXES, BOX_IND, [3, 4]),
            tf.image.crop_and_resize(image16, CROP_BOXES, BOX_IND, [3, 4], method="nearest"))
  # TF sums half gradients in half precision.
  check(fn, (IMAGE * 255).astype(np.uint8), IMAGE.astype(np.float16), atol=1e-3, rtol=1e-3, vmap=False)


def test_crop_and_resize_gradient_ops():
  grads = np.random.RandomState(4).normal(size=(5, 4, 3, 3)).astype(np.float32)

  def fn(grads, image):
    return (RAW.CropAndResizeGradImage(grads=grads, boxes=CROP_BOXES, box_ind=BOX_IND, image_size=[2, 6, 7, 3],
                                       T=tf.float32, method="bilinear"),
            RAW.CropAndResizeGradImage(grads=grads, boxes=CROP_BOXES, box_ind=BOX_IND, image_size=[2, 6, 7, 3],
                                       T=tf.float16, method="nearest"),
            RAW.CropAndResizeGradBoxes(grads=grads, image=image, boxes=CROP_BOXES, box_ind=BOX_IND))
  check(fn, grads, IMAGE, atol=1e-3, rtol=1e-3, grad=False, vmap=False)   # TF sums half gradients in half


def test_crop_and_resize_is_native():
  assert tiers.op_tier("CropAndResize", jaxport.config.snapshot()) == registry.Tier.NATIVE


def test_crop_and_resize_rejects_bad_box_index():
  fn = jaxport.convert_functional(lambda im: tf.image.crop_and_resize(im, CROP_BOXES[:1], [2], [2, 2]), IMAGE)
  with pytest.raises(InvalidNodeError, match=r"box_index has values outside \[0, 2\)"):
    fn(IMAGE)
