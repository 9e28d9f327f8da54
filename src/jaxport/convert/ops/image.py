"""Op rules: image resizing.

Every resize here is separable: sampling positions and weights are computed per
spatial axis at trace time (NumPy, in float32 like TF's kernels), then applied to
the image with gathers or small weight matrices.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops._util import static_ints, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_F32 = np.float32
_SPATIAL_AXES = (1, 2)   # images are [batch, height, width, channels]


def _resize_scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
  if align_corners and out_size > 1:
    return _F32(in_size - 1) / _F32(out_size - 1)
  return _F32(in_size) / _F32(out_size)


class _Resize:
  """A Resize* node's geometry: from `in_shape` [batch, height, width, channels] to `out_sizes`."""

  def __init__(self, ctx, in_shape, out_sizes):
    self.align_corners = ctx.attr("align_corners", False)
    self.half_pixel = ctx.attr("half_pixel_centers", False)
    _check_resize_flags(ctx.node)
    self.in_shape = tuple(in_shape)
    self.out_sizes = [int(n) for n in out_sizes]
    self.scales = [_resize_scale(in_shape[a], n, self.align_corners)
                   for a, n in zip(_SPATIAL_AXES, self.out_sizes)]

  @classmethod
  def forward(cls, ctx, images, size):
    return cls(ctx, images.shape, static_ints(size, "size"))

  @classmethod
  def backward(cls, ctx, grads, in_shape):
    """For a Resize*Grad node: `grads` has the resized shape, the result `in_shape`."""
    return cls(ctx, in_shape, grads.shape[1:3])

  def axes(self):
    """(axis, output size, scale), width first: TF interpolates along x, then y."""
    return list(zip(_SPATIAL_AXES, self.out_sizes, self.scales))[::-1]

  def transpose(self, resize, grads, dtype):
    """The gradient of `resize` (linear in the image) w.r.t. an image of `in_shape`."""
    grads = jnp.asarray(grads, jnp.float32)
    (out,) = jax.linear_transpose(lambda x: resize(x, self),
                                  jax.ShapeDtypeStruct(self.in_shape, jnp.float32))(grads)
    return out.astype(dtype)


def _along(values, axis: int, ndim: int):
  """Per-output-position `values` shaped to broadcast along `axis`."""
  shape = [1] * ndim
  shape[axis] = -1
  return values.reshape(shape)


# --------------------------------------------------------------------------- nearest


def _nearest_indices(in_size, out_size, scale, align_corners, half_pixel) -> np.ndarray:
  positions = np.arange(out_size, dtype=_F32)
  positions = (positions + _F32(0.5)) * scale if half_pixel else positions * scale
  # TF rounds with roundf (half away from zero); positions are never negative here.
  idx = np.floor(positions + _F32(0.5)) if align_corners else np.floor(positions)
  return np.clip(idx.astype(np.int64), 0, in_size - 1)


def _nearest(images, spec: _Resize):
  out = jnp.asarray(images)
  for axis, n, scale in spec.axes():
    indices = _nearest_indices(out.shape[axis], n, scale, spec.align_corners, spec.half_pixel)
    out = jnp.take(out, indices, axis=axis)
  return out


def _check_resize_flags(node) -> None:
  """TF's kernels refuse align_corners together with half_pixel_centers: so does conversion."""
  if node.attrs.get("align_corners") is True and node.attrs.get("half_pixel_centers") is True:
    raise InvalidNodeError(f"{node.op} node {node.name!r}: If half_pixel_centers is True, align_corners must "
                           "be False (got align_corners=True and half_pixel_centers=True; TF takes "
                           "align_corners=False and half_pixel_centers=True, or half_pixel_centers=False). "
                           "Set one of them to False, as TF requires.")


def _register_resize(op: str, grad_op: str, resample) -> None:
  """A resize op and the gradient op TF emits for it, both from one resampling function."""
  register(op, check=_check_resize_flags)(
      lambda ctx, images, size: resample(images, _Resize.forward(ctx, images, size)))

  @register(grad_op, check=_check_resize_flags)
  def grad(ctx, grads, original):
    if op == "ResizeNearestNeighbor":   # its second input is the original size, not the image
      shape, dtype = (grads.shape[0], *static_ints(original, "size"), grads.shape[3]), grads.dtype
    else:
      shape, dtype = original.shape, original.dtype
    return _Resize.backward(ctx, grads, shape).transpose(resample, grads, dtype)


_register_resize("ResizeNearestNeighbor", "ResizeNearestNeighborGrad", _nearest)


# --------------------------------------------------------------------------- bilinear


def _sample_positions(out_size, scale, half_pixel) -> np.ndarray:
  positions = np.arange(out_size, dtype=_F32)
  return (positions + _F32(0.5)) * scale - _F32(0.5) if half_pixel else positions * scale


def _bilinear(images, spec: _Resize):
  out = jnp.asarray(images).astype(jnp.float32)
  for axis, n, scale in spec.axes():
    positions = _sample_positions(n, scale, spec.half_pixel)
    floor = np.floor(positions)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(positions).astype(np.int64), out.shape[axis] - 1)
    lerp = _along(positions - floor, axis, out.ndim)
    low, high = jnp.take(out, lower, axis=axis), jnp.take(out, upper, axis=axis)
    out = low + (high - low) * lerp
  return out


_register_resize("ResizeBilinear", "ResizeBilinearGrad", _bilinear)


# --------------------------------------------------------------------------- bicubic

_TABLE_SIZE = 1024


def _cubic_table(a: float) -> np.ndarray:
  """TF's tabulated cubic convolution kernel: column 0 for |x| in [0, 1], column 1 for [1, 2]."""
  x = (np.arange(_TABLE_SIZE + 1) / _TABLE_SIZE).astype(_F32).astype(np.float64)
  near = ((a + 2) * x - (a + 3)) * x * x + 1
  x = x + 1
  far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
  return np.stack([near, far], axis=1).astype(_F32)


def _bicubic_taps(in_size, out_size, scale, half_pixel):
  """Four source indices and weights per output position, as TF's ResizeBicubic computes them.

  With half-pixel centers TF uses Keys' kernel (a = -0.5) and drops taps outside the
  image, renormalising the rest; the legacy mode uses a = -0.75 and repeats edge pixels.
  """
  table = _cubic_table(-0.5 if half_pixel else -0.75)
  positions = _sample_positions(out_size, scale, half_pixel)
  start = np.floor(positions).astype(np.int64)
  offset = np.rint((positions - start.astype(_F32)) * _F32(_TABLE_SIZE)).astype(np.int64)
  weights = np.stack([table[offset, 1], table[offset, 0],
                      table[_TABLE_SIZE - offset, 0], table[_TABLE_SIZE - offset, 1]], axis=1)
  wanted = start[:, None] + np.arange(-1, 3)
  indices = np.clip(wanted, 0, in_size - 1)
  if half_pixel:
    weights = np.where(indices == wanted, weights, _F32(0))
    total = weights.sum(axis=1, keepdims=True)
    weights = np.where(np.abs(total) >= 1000 * np.finfo(_F32).tiny, weights / total, weights)
  return indices, weights.astype(_F32)


def _bicubic(images, spec: _Resize):
  out = jnp.asarray(images).astype(jnp.float32)
  for axis, n, scale in spec.axes():
    indices, weights = _bicubic_taps(out.shape[axis], n, scale, spec.half_pixel)
    out = sum(jnp.take(out, indices[:, t], axis=axis) * _along(weights[:, t], axis, out.ndim) for t in range(4))
  return out


_register_resize("ResizeBicubic", "ResizeBicubicGrad", _bicubic)


# --------------------------------------------------------------------------- area


def _area_weights(in_size, out_size, scale) -> np.ndarray:
  """[out, in] overlap of each output cell [x*scale, (x+1)*scale) with the input pixels, over the cell size."""
  weights = np.zeros((out_size, in_size), _F32)
  if scale == 0:   # align_corners from a side of 1: every cell is that one pixel, as in TF
    weights[:, 0] = 1
    return weights
  for x in range(out_size):
    start, end = _F32(x) * scale, _F32(x + 1) * scale
    for i in range(int(np.floor(start)), int(np.ceil(end))):
      overlap = min(_F32(i + 1), end) - max(_F32(i), start)
      weights[x, min(max(i, 0), in_size - 1)] += overlap
  return weights / scale


def _apply_weight_matrices(ctx, images, matrices, transpose=False):
  """Contracts the height and width axes with [out, in] matrices (or their transposes: the gradient),
  at the precision of the `resize_bilinear_precision` config key (tf2jax's name; TF: highest)."""
  out = jnp.asarray(images).astype(jnp.float32)
  equation = "byxc,yh,xw->bhwc" if transpose else "bhwc,yh,xw->byxc"
  precision = lax.Precision(ctx.config["resize_bilinear_precision"])
  return jnp.einsum(equation, out, matrices[0], matrices[1], precision=precision)


@register("ResizeArea")
def resize_area(ctx, images, size):
  out_sizes = static_ints(size, "size")
  align_corners = ctx.attr("align_corners", False)
  matrices = [_area_weights(images.shape[a], n, _resize_scale(images.shape[a], n, align_corners))
              for a, n in zip(_SPATIAL_AXES, out_sizes)]
  return _apply_weight_matrices(ctx, images, matrices)


# --------------------------------------------------------------------------- scale and translate


def _lanczos(radius):
  def kernel(m, x):
    safe = m.where(x <= 1e-3, _F32(1), x)
    value = radius * m.sin(np.pi * safe) * m.sin(np.pi * safe / radius) / (np.pi * np.pi * safe * safe)
    return m.where(x > radius, _F32(0), m.where(x <= 1e-3, _F32(1), value))
  return kernel, float(radius)


def _gaussian(m, x):
  radius, sigma = 1.5, 0.5
  return m.where(x >= radius, _F32(0), m.exp(-x * x / (2 * sigma * sigma)))


def _box(m, x):
  return m.where(x < 0.5, _F32(1), m.where(x == 0.5, _F32(0.5), _F32(0)))


def _triangle(m, x):
  return m.where(x < 1, 1 - x, _F32(0))


def _keys_cubic(m, x):
  far = ((-0.5 * x + 2.5) * x - 4.0) * x + 2.0
  near = ((1.5 * x - 2.5) * x) * x + 1.0
  return m.where(x >= 2, _F32(0), m.where(x >= 1, far, near))


def _mitchell_cubic(m, x):
  far = (((-7.0 / 18.0) * x + 2.0) * x - 10.0 / 3.0) * x + 16.0 / 9.0
  near = (((7.0 / 6.0) * x - 2.0) * x) * x + 8.0 / 9.0
  return m.where(x >= 2, _F32(0), m.where(x >= 1, far, near))


_SAMPLING_KERNELS = {  # kernel_type -> (kernel(module, |x|), radius)
    "lanczos1": _lanczos(1), "lanczos3": _lanczos(3), "lanczos5": _lanczos(5),
    "gaussian": (_gaussian, 1.5), "box": (_box, 1.0), "triangle": (_triangle, 1.0),
    "keyscubic": (_keys_cubic, 2.0), "mitchellcubic": (_mitchell_cubic, 2.0),
}


def _scale_translate_weights(in_size, out_size, scale, translation, kernel_type, antialias):
  """[out, in] sampling weights of TF's ScaleAndTranslate along one axis.

  Output pixel x samples the input at (x + 0.5) / scale - translation / scale; the
  kernel is stretched by 1/scale when antialiasing a downsample. Weights are
  renormalised over the kernel's span, and positions outside the input get none.
  NumPy when scale and translation are constants, jax.numpy otherwise.
  """
  m = xp(scale, translation)
  kernel, radius = _SAMPLING_KERNELS[kernel_type]
  inv_scale = _F32(1) / m.asarray(scale, _F32)
  kernel_scale = m.maximum(inv_scale, _F32(1)) if antialias else _F32(1)
  sample = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * inv_scale - inv_scale * m.asarray(translation, _F32)
  reach = _F32(radius) * kernel_scale
  span_start = m.clip(m.ceil(sample - reach - _F32(0.5)), 0, in_size - 1)
  span_end = m.clip(m.floor(sample + reach - _F32(0.5)), 0, in_size - 1) + 1
  source = np.arange(in_size, dtype=_F32)[None, :]
  in_span = (source >= span_start[:, None]) & (source < span_end[:, None])
  weights = m.where(in_span, kernel(m, m.abs(source + _F32(0.5) - sample[:, None]) / kernel_scale), _F32(0))
  total = weights.sum(axis=1, keepdims=True)
  normalisable = m.abs(total) >= 1000 * np.finfo(_F32).tiny
  weights = m.where(normalisable, weights / m.where(normalisable, total, _F32(1)), weights)
  inside = (sample >= 0) & (sample <= in_size)
  return m.where(inside[:, None], weights, _F32(0)).astype(_F32)


def _scale_translate_matrices(ctx, in_shape, out_sizes, scale, translation):
  kernel_type = ctx.attr("kernel_type", "lanczos3")
  if kernel_type not in _SAMPLING_KERNELS:
    raise InvalidNodeError(f"{ctx.op}: unknown kernel_type {kernel_type!r}")
  antialias = ctx.attr("antialias", True)
  return [_scale_translate_weights(in_shape[a], n, scale[i], translation[i], kernel_type, antialias)
          for i, (a, n) in enumerate(zip(_SPATIAL_AXES, out_sizes))]


@register("ScaleAndTranslate")
def scale_and_translate(ctx, images, size, scale, translation):
  matrices = _scale_translate_matrices(ctx, images.shape, static_ints(size, "size"), scale, translation)
  return _apply_weight_matrices(ctx, images, matrices)


@register("ScaleAndTranslateGrad")
def scale_and_translate_grad(ctx, grads, original_image, scale, translation):
  matrices = _scale_translate_matrices(ctx, original_image.shape, grads.shape[1:3], scale, translation)
  return _apply_weight_matrices(ctx, grads, matrices, transpose=True).astype(original_image.dtype)
