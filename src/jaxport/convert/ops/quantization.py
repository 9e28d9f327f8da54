"""Op rules: TF's quantized types and ops (`tf.quantization.quantize` / `dequantize` and the TF1
quantize_graph ops: QuantizedMatMul, QuantizedConv2D, QuantizedBiasAdd, QuantizedRelu, QuantizedRelu6,
QuantizedMaxPool, QuantizedAvgPool, QuantizedConcat, QuantizedReshape, Requantize, RequantizationRange,
QuantizeDownAndShrinkRange).

Quantized values (qint8, quint8, qint16, quint16, qint32) are held as their storage integers (int8, uint8,
int16, uint16, int32; `graph.QUANTIZED_STORAGE`), and their float ranges as float32 scalars (or vectors,
per channel). The rules follow TF's reference CPU kernels (quantize_op.cc, dequantize_op.cc,
quantization_utils.h, quantized_*_op.cc, requantize.cc, requantization_range_op.cc): the same float32
operations in the same order, divisions by constants divided (not multiplied by a reciprocal), integer
arithmetic (zero points, int32 accumulation, pooling, the 16.16 fixed-point requantization in int64, as
two uint32 words without x64) exactly. QuantizedConv2D keeps TF's window origins, which differ from
Conv2D's where the padding would be negative (strides larger than the window).

Where TF's kernels compute in double (FloatToQuantized's zero points, QuantizedToFloat, Requantize's
fixed-point constants) the rules do too when the ranges are known at trace time (constants, or ranges
derived from them, as QuantizeV2's outputs from constant ranges) or JAX's x64 mode is on. Ranges that are
traced values without x64 are computed in float32: exact for 8- and 16-bit types in QuantizeV2 and
Dequantize, within a few ulps in RequantizationRange (and so possibly a step off in a Requantize using it).

Known differences: under jit, XLA:CPU contracts a product and the add after it into an FMA in some float
results (Dequantize), an ulp from TF's; float-to-int32 casts out of range (qint32's 2^31) give INT_MIN as
TF's x86 conversion does, and NaN inputs are undefined in TF. With oneDNN on, TF itself replaces some of
these kernels (QuantizeV2 for qint8/quint8 SCALED+HALF_TO_EVEN and quint8 MIN_FIRST, QuantizedAvgPool)
by ones that round differently; these rules follow the reference kernels (TF_ENABLE_ONEDNN_OPTS=0).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops._util import divide_as_written, is_concrete, rounded_product, static_ints, text, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_F32 = np.float32


def _fail(ctx, message):
  raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: {message}")


def _m(*values):
  """NumPy when every value is known at trace time, else jax.numpy."""
  return xp(*values)


def _f32(m, value):
  return np.asarray(value, _F32) if m is np else jnp.asarray(value, _F32)


def _f64(m, value):
  """`value` in double where TF computes in double: NumPy's, or JAX's with x64 on (else float32)."""
  if m is np:
    return np.asarray(value, np.float64)
  return jnp.asarray(value, jnp.float64 if jax.config.jax_enable_x64 else _F32)


def _product(m, product):
  """A product rounded before it is added (TF's kernels never fuse the two)."""
  return product if m is np else rounded_product(product)


def _divide(m, x, constant):
  """`x / constant` as TF divides (XLA would multiply by the rounded reciprocal)."""
  return x / constant if m is np else divide_as_written(jnp.asarray(x), constant)


def _first(m, x):
  """TF's `flat<float>()(0)`: the first element of a range input, as float32."""
  return _f32(m, m.reshape(m.asarray(x), (-1,))[0])


def _limits(dtype):
  info = np.iinfo(dtype)
  return int(info.min), int(info.max)


def _round_away(m, x):
  """std::round (Eigen's `.round()`): halves away from zero."""
  if m is np:
    x = np.asarray(x)
    below_half = np.nextafter(x.dtype.type(0.5), x.dtype.type(0))   # Eigen's trick, exact for every x
    return np.trunc(x + np.copysign(below_half, x)).astype(x.dtype)
  return lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO)


def _cast(x, dtype):
  """A float-to-integer cast, truncating toward zero (C++'s); to 32 bits, values out of range become
  INT_MIN as x86's conversions make them (XLA's saturate)."""
  if np.dtype(dtype).itemsize < 4:
    return x.astype(dtype)
  m = np if is_concrete(x) else jnp
  inside = (x >= _F32(-2.0 ** 31)) & (x < _F32(2.0 ** 31))
  return m.where(inside, m.where(inside, x, _F32(0)).astype(dtype), np.iinfo(dtype).min)


def _storage(ctx, key):
  dtype = np.dtype(ctx.attr(key))
  if dtype.kind not in "iu":
    _fail(ctx, f"{key} must be a quantized type, got {dtype}")
  return dtype


# --------------------------------------------------------------------------- FloatToQuantized and back


def _float_to_quantized_unclamped(m, value, range_min, range_max, dtype):
  """quantization_utils.h FloatToQuantizedUnclamped<T>, in double (int64 result as a float)."""
  lowest, _ = _limits(dtype)
  steps = 2.0 ** (8 * dtype.itemsize)
  range_adjust = steps / (steps - 1.0)
  value, range_min, range_max = _f32(m, value), _f32(m, range_min), _f32(m, range_max)
  scale = _f64(m, steps) / (_f64(m, range_max - range_min) * _f64(m, range_adjust))
  quantized = _round_away(m, _f64(m, value) * scale) - _round_away(m, _f64(m, range_min) * scale) + lowest
  return m.where(range_min == range_max, _f64(m, lowest), quantized)


def _float_to_quantized(m, value, range_min, range_max, dtype):
  """FloatToQuantized<T>: clamped to T's range (as the storage integer)."""
  lowest, highest = _limits(dtype)
  quantized = _float_to_quantized_unclamped(m, value, range_min, range_max, dtype)
  return m.clip(quantized, lowest, highest).astype(dtype)


def _quantized_to_float(m, value, range_min, range_max, dtype):
  """QuantizedToFloat<T> (double inside, float32 result); the range's part in NumPy when it is known."""
  lowest, _ = _limits(dtype)
  steps = 2.0 ** (8 * dtype.itemsize)
  mr = _m(range_min, range_max)
  range_min, range_max = _f32(mr, range_min), _f32(mr, range_max)
  range_scale = _f64(mr, range_max - range_min) * _f64(mr, steps / (steps - 1.0)) / _f64(mr, steps)
  scale32 = range_scale.astype(_F32)
  min_rounded = _f64(mr, _product(mr, _round_away(mr, range_min / scale32) * scale32))
  if m is np or jax.config.jax_enable_x64:
    offset = _f64(m, value) - _f64(m, lowest)
    result = (_f64(m, min_rounded) + _product(m, offset * _f64(m, range_scale))).astype(_F32)
  else:   # float32, without cancelling two large terms: within a few ulps of TF's double result
    constant = (_f64(mr, min_rounded) - _f64(mr, lowest) * range_scale).astype(_F32)
    result = _product(m, jnp.asarray(value).astype(_F32) * range_scale.astype(_F32)) + constant
  return m.where(range_min == range_max, range_min, result)


def _dequantize_with_eigen(m, x, range_min, range_max, dtype):
  """DEQUANTIZE_WITH_EIGEN with a QuantizedToFloatStruct<T> (all float32)."""
  lowest, _ = _limits(dtype)
  steps = 2.0 ** (8 * dtype.itemsize)
  range_min, range_max = _f32(m, range_min), _f32(m, range_max)
  scale = _divide(m, _f64(m, range_max - range_min), steps - 1.0).astype(_F32)
  rounded = _product(m, _round_away(m, range_min / scale) * scale)
  min_rounded = m.where(range_max == range_min, range_min, rounded)
  offset = min_rounded - _product(m, _F32(lowest) * scale)
  mx = xp(x, offset)
  return _product(mx, mx.asarray(x).astype(_F32) * scale) + offset


def _quantize_with_eigen(m, x, range_min, range_max, dtype):
  """QUANTIZE_WITH_EIGEN with a FloatToQuantizedStruct<T> (float32; clamped, then cast)."""
  lowest, highest = _limits(dtype)
  steps = 2.0 ** (8 * dtype.itemsize)
  range_min, range_max = _f32(m, range_min), _f32(m, range_max)
  safe = m.where(range_max == range_min, _F32(1), range_max - range_min)
  scale = m.where(range_max == range_min, _F32(0), (_f64(m, steps - 1.0) / _f64(m, safe)).astype(_F32))
  min_scaled = _round_away(m, _product(m, range_min * scale))
  lower, upper = max(_F32(lowest), _F32(-2.147483648e9)), min(_F32(highest), _F32(2.14748352e9))
  mx = xp(x, scale)
  x = mx.asarray(x)
  shifted = _round_away(mx, _product(mx, x * scale)) - (min_scaled - _F32(lowest))
  return mx.clip(shifted, lower, upper).astype(np.int32).astype(dtype)


# --------------------------------------------------------------------------- QuantizeV2, Dequantize


def _per_slice(ctx, m, x, value, axis):
  """A range input as float32: its first element (axis -1), or one per slice along `axis`, shaped to
  broadcast against `x`."""
  if axis < 0:
    return _first(m, value)
  n = np.shape(x)[axis]
  flat = m.reshape(_f32(m, value), (-1,))
  if flat.shape[0] != n:
    _fail(ctx, f"the range inputs must have {n} elements (the size of axis {axis}), got {flat.shape[0]}")
  return m.reshape(flat, (n,) + (1,) * (np.ndim(x) - axis - 1))


def _axis(ctx, x):
  axis = int(ctx.attr("axis", -1))
  if axis < -1 or axis >= max(np.ndim(x), 1):
    _fail(ctx, f"axis must be -1 or in [0, {np.ndim(x)}), got {axis}")
  return axis


@register("QuantizeV2")
def quantize_v2(ctx, x, min_range, max_range):
  dtype = _storage(ctx, "T")
  mode = text(ctx.attr("mode", "MIN_COMBINED"))
  round_mode = text(ctx.attr("round_mode", "HALF_AWAY_FROM_ZERO"))
  narrow = bool(ctx.attr("narrow_range", False))
  ensure = _F32(ctx.attr("ensure_minimum_range", 0.01))
  axis = _axis(ctx, x)
  if mode not in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
    _fail(ctx, f"unknown mode {mode!r}")
  if round_mode == "HALF_TO_EVEN" and mode != "SCALED":
    _fail(ctx, "round mode HALF_TO_EVEN needs mode SCALED")
  if mode == "MIN_FIRST" and axis >= 0:
    _fail(ctx, "MIN_FIRST mode is not implemented for QuantizeV2 with axis != -1")
  m = _m(min_range, max_range)
  in_min, in_max = _per_slice(ctx, m, x, min_range, axis), _per_slice(ctx, m, x, max_range, axis)
  lowest, highest = _limits(dtype)
  min_r = m.minimum(_F32(0), in_min)
  epsilon = _product(m, m.maximum(_F32(1), m.maximum(m.abs(in_min), m.abs(in_max))) * ensure)
  max_r = m.maximum(_F32(0), m.maximum(in_max, min_r + epsilon))
  mx = xp(x, min_r)
  x = mx.asarray(x).astype(_F32)
  if mode == "MIN_FIRST":
    out = _quantize_with_eigen(m, x, min_r, max_r, dtype)
  elif mode == "MIN_COMBINED":
    scale = (_f64(m, float(highest) - float(lowest)) / _f64(m, max_r - min_r)).astype(_F32)
    scaled = _product(mx, (mx.clip(x, min_r, max_r) - min_r) * scale)
    if lowest < 0:
      half_range = _F32((highest - lowest + 1) / 2)
      out = _cast(_round_away(mx, scaled - half_range), dtype)
    else:
      out = _cast(scaled + _F32(0.5), dtype)
  else:   # SCALED
    min_out, max_out = _F32(lowest + (1 if narrow else 0)), _F32(highest)
    big = _F32(np.finfo(_F32).max)
    from_min = m.where(min_out * min_r > 0, min_out / m.where(min_r == 0, _F32(1), min_r), big)
    from_max = m.where(max_out * max_r > 0, max_out / m.where(max_r == 0, _F32(1), max_r), big)
    scale = m.minimum(from_min, from_max)
    min_r, max_r = min_out / scale, max_out / scale
    scaled = _product(mx, mx.clip(x, min_r, max_r) * scale)
    rounded = (mx.round(scaled) if round_mode == "HALF_TO_EVEN" else _round_away(mx, scaled))
    out = _cast(rounded, dtype)
  if axis < 0:
    return out, _f32(m, min_r), _f32(m, max_r)
  shape = np.shape(min_range)
  return out, m.reshape(min_r, shape), m.reshape(max_r, shape)


@register("Dequantize")
def dequantize(ctx, x, min_range, max_range):
  dtype = np.dtype(x.dtype)
  out_dtype = np.dtype(ctx.attr("dtype", np.dtype(_F32)))
  mode = text(ctx.attr("mode", "MIN_COMBINED"))
  narrow = bool(ctx.attr("narrow_range", False))
  axis = _axis(ctx, x)
  if mode not in ("MIN_COMBINED", "MIN_FIRST", "SCALED"):
    _fail(ctx, f"unknown mode {mode!r}")
  if out_dtype != _F32 and mode != "MIN_COMBINED":
    _fail(ctx, f"mode must be MIN_COMBINED when the output type is {out_dtype}, got {mode}")
  if mode == "MIN_FIRST" and axis >= 0:
    _fail(ctx, "MIN_FIRST mode is not implemented for Dequantize with axis != -1")
  m = _m(min_range, max_range)
  min_r, max_r = _per_slice(ctx, m, x, min_range, axis), _per_slice(ctx, m, x, max_range, axis)
  lowest, highest = _limits(dtype)
  mx = xp(x, min_r)
  values = mx.asarray(x).astype(_F32)
  if mode == "MIN_COMBINED":
    half_range = _F32(0) if lowest == 0 else _F32((float(_F32(highest)) - lowest + 1) / 2)
    scale = _divide(m, max_r - min_r, _F32(highest) - _F32(lowest))
    out = _product(mx, (values + half_range) * scale) + min_r
  elif mode == "MIN_FIRST":
    out = _dequantize_with_eigen(m, x, min_r, max_r, dtype)
  else:
    min_out = _F32(lowest + (1 if narrow else 0))
    from_max = _divide(m, max_r, _F32(highest))
    scale = from_max if lowest == 0 else m.maximum(_divide(m, min_r, min_out), from_max)
    out = values * scale
  return xp(out).asarray(out).astype(out_dtype)


# --------------------------------------------------------------------------- shape ops and activations


def _range_outputs(m, range_min, range_max):
  return _first(m, range_min), _first(m, range_max)


@register("QuantizedReshape", size_bounded=True)
def quantized_reshape(ctx, x, shape, input_min, input_max):
  target = static_ints(shape, "shape", ctx)
  if -1 in target:
    known = int(np.prod([d for d in target if d != -1]))
    target[target.index(-1)] = int(np.prod(np.shape(x))) // max(known, 1)
  return (xp(x).reshape(x, target),) + _range_outputs(_m(input_min, input_max), input_min, input_max)


def _relu(ctx, x, min_features, max_features, top):
  dtype = _storage(ctx, "Tinput")
  m = _m(min_features, max_features)
  range_min, range_max = _range_outputs(m, min_features, max_features)
  low = _float_to_quantized(m, 0.0, range_min, range_max, dtype)
  mx = xp(x, low)
  out = mx.maximum(mx.asarray(x), low)
  if top is not None:
    out = mx.minimum(out, _float_to_quantized(m, top, range_min, range_max, dtype))
  return out.astype(dtype), range_min, range_max


@register("QuantizedRelu")
def quantized_relu(ctx, x, min_features, max_features):
  return _relu(ctx, x, min_features, max_features, None)


@register("QuantizedRelu6")
def quantized_relu6(ctx, x, min_features, max_features):
  return _relu(ctx, x, min_features, max_features, 6.0)


def _pool_args(ctx, x):
  ksize, strides = list(ctx.attr("ksize")), list(ctx.attr("strides"))
  if np.ndim(x) != 4 or len(ksize) != 4 or len(strides) != 4:
    _fail(ctx, "input, ksize and strides must be 4-D (NHWC)")
  if ksize[0] != 1 or strides[0] != 1 or ksize[3] != 1 or strides[3] != 1:
    _fail(ctx, "pooling over the batch or depth dimension is not supported")
  pads = lax.padtype_to_pads(np.shape(x), ksize, strides, text(ctx.attr("padding")))
  return ksize, strides, pads


@register("QuantizedMaxPool")
def quantized_max_pool(ctx, x, min_input, max_input):
  ksize, strides, pads = _pool_args(ctx, x)
  x = jnp.asarray(x)
  out = lax.reduce_window(x, np.array(np.iinfo(x.dtype).min, x.dtype), lax.max, ksize, strides, pads)
  return (out,) + _range_outputs(_m(min_input, max_input), min_input, max_input)


@register("QuantizedAvgPool")
def quantized_avg_pool(ctx, x, min_input, max_input):
  """The int32 average of each window's unpadded values, truncated (SpatialAvgPool on int32)."""
  ksize, strides, pads = _pool_args(ctx, x)
  x = jnp.asarray(x)
  total = lax.reduce_window(x.astype(np.int32), np.int32(0), lax.add, ksize, strides, pads)
  counts = lax.reduce_window(jnp.ones(x.shape[1:3], np.int32), np.int32(0), lax.add, ksize[1:3], strides[1:3],
                             pads[1:3])[None, :, :, None]
  lowest, highest = _limits(x.dtype)
  out = jnp.clip(lax.div(total, counts), lowest, highest).astype(x.dtype)
  return (out,) + _range_outputs(_m(min_input, max_input), min_input, max_input)


@register("QuantizedConcat")
def quantized_concat(ctx, concat_dim, *rest):
  """Every input requantized into the overall range (symmetric around 0 for signed types), unless its
  range is that one already; then concatenated."""
  n = len(rest) // 3
  values, mins, maxes = rest[:n], rest[n:2 * n], rest[2 * n:]
  axis = int(static_ints(concat_dim, "concat_dim", ctx)[0])
  dtype = np.dtype(values[0].dtype)
  m = _m(*mins, *maxes)
  ranges = [_range_outputs(m, lo, hi) for lo, hi in zip(mins, maxes)]
  overall_min = _F32(np.finfo(_F32).max) if m is np else jnp.asarray(np.finfo(_F32).max)
  overall_max = -overall_min
  for lo, hi in ranges:
    overall_min, overall_max = m.minimum(overall_min, lo), m.maximum(overall_max, hi)
  if dtype.kind == "i":
    largest = m.maximum(m.abs(overall_min), m.abs(overall_max))
    overall_min, overall_max = -largest, largest
  parts = []
  for x, (lo, hi) in zip(values, ranges):
    same = (lo == overall_min) & (hi == overall_max)
    as_float = _dequantize_with_eigen(m, x, lo, hi, dtype)
    moved = _quantize_with_eigen(m, as_float, overall_min, overall_max, dtype)
    mx = xp(x, moved, same)
    parts.append(mx.where(same, mx.asarray(x), moved))
  mx = xp(*parts)
  return mx.concatenate(parts, axis=axis), _f32(m, overall_min), _f32(m, overall_max)


# --------------------------------------------------------------------------- products and sums


def _zero_point(m, range_min, range_max, dtype):
  """The quantized value of 0.0 (FloatToQuantizedUnclamped), as an int32."""
  return _float_to_quantized_unclamped(m, 0.0, range_min, range_max, dtype).astype(np.int32)


def _product_range(m, ranges_a, ranges_b, type_a, type_b, type_c):
  """QuantizationRangeForMultiplication: the float value of one step of the product, times C's limits."""
  def level(range_min, range_max, dtype):
    lowest, highest = _limits(dtype)
    return _divide(m, range_max - range_min, _F32(highest - lowest))
  c_level = level(*ranges_a, type_a) * level(*ranges_b, type_b)
  lowest, highest = _limits(type_c)
  return _f32(m, c_level * _F32(lowest)), _f32(m, c_level * _F32(highest))


def _offsets(ctx, a, b, min_a, max_a, min_b, max_b, type_b_key):
  type_a, type_b = np.dtype(a.dtype), _storage(ctx, type_b_key)
  m = _m(min_a, max_a, min_b, max_b)
  ranges_a, ranges_b = _range_outputs(m, min_a, max_a), _range_outputs(m, min_b, max_b)
  out_type = _storage(ctx, "Toutput" if ctx.op == "QuantizedMatMul" else "out_type")
  out_range = _product_range(m, ranges_a, ranges_b, type_a, type_b, out_type)
  a = jnp.asarray(a).astype(np.int32) - _zero_point(m, *ranges_a, type_a)
  b = jnp.asarray(b).astype(np.int32) - _zero_point(m, *ranges_b, type_b)
  return a, b, out_type, out_range


@register("QuantizedMatMul")
def quantized_matmul(ctx, a, b, min_a, max_a, min_b, max_b):
  """sum_k (a - zero_a) (b - zero_b) in int32 (gemmlowp's and the reference GEMM's exact result)."""
  a, b, out_type, (out_min, out_max) = _offsets(ctx, a, b, min_a, max_a, min_b, max_b, "T2")
  if ctx.attr("transpose_a", False):
    a = a.T
  if ctx.attr("transpose_b", False):
    b = b.T
  out = lax.dot(a, b, preferred_element_type=np.int32)
  return out.astype(out_type), out_min, out_max


def _conv_offsets(ctx, in_sizes, window, strides, padding, reference_valid):
  """TF's quantized-conv window origins: output i reads from i * stride - offset, where offset is
  ((out - 1) * stride + window - in) / 2 truncated toward zero, for SAME and VALID alike (Im2ColConvFunctor;
  its reference fallback adds 1 for VALID). A negative offset shifts the windows inward, where Conv2D's
  SAME would start at 0. Returns lax.pad's (low, high) per spatial dim."""
  pads = []
  for size, k, stride in zip(in_sizes, window, strides):
    out = -(-size // stride) if padding == "SAME" else -(-(size - k + 1) // stride)
    if out <= 0:
      _fail(ctx, f"the window ({k}) does not fit the input ({size}) with {padding} padding")
    total = (out - 1) * stride + k - size
    shifted = total + (1 if reference_valid else 0)
    low = int(shifted / 2)   # C++'s division: toward zero
    pads.append((low, total - low))
  return pads


@register("QuantizedConv2D", convolution=True)
def quantized_conv2d(ctx, x, w, min_input, max_input, min_filter, max_filter):
  """The convolution of (x - zero_x) and (w - zero_w) in int32, padded with zeros (TF pads with the
  input's zero point), with TF's window origins (`_conv_offsets`)."""
  zero_x = _zero_point(_m(min_input, max_input), *_range_outputs(_m(min_input, max_input), min_input, max_input),
                       np.dtype(x.dtype))
  x, w, out_type, (out_min, out_max) = _offsets(ctx, x, w, min_input, max_input, min_filter, max_filter, "Tfilter")
  strides = list(ctx.attr("strides"))
  dilations = list(ctx.attr("dilations", None) or [1, 1, 1, 1])
  if strides[0] != 1 or strides[3] != 1 or strides[1] != strides[2] or any(d != 1 for d in dilations):
    _fail(ctx, "only equal row and column strides and no dilations are supported (as TF's kernel)")
  padding = text(ctx.attr("padding"))
  # zero not representable in the input's range: TF's reference functor, whose VALID windows start 1 later
  reference_valid = padding == "VALID" and is_concrete(zero_x) and int(zero_x) < 0
  pads = _conv_offsets(ctx, x.shape[1:3], w.shape[:2], strides[1:3], padding, reference_valid)
  x = lax.pad(x, np.int32(0), [(0, 0, 0)] + [(lo, hi, 0) for lo, hi in pads] + [(0, 0, 0)])
  out = lax.conv_general_dilated(x, w, strides[1:3], "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                 preferred_element_type=np.int32)
  return out.astype(out_type), out_min, out_max


@register("QuantizedBiasAdd")
def quantized_bias_add(ctx, x, bias, min_input, max_input, min_bias, max_bias):
  """QuantizedAddUsingEigen: both operands requantized into +-max(|ranges|) * 2^17 and added, with the
  output's zero point added once more."""
  out_type = _storage(ctx, "out_type")
  m = _m(min_input, max_input, min_bias, max_bias)
  in_min, in_max = _range_outputs(m, min_input, max_input)
  bias_min, bias_max = _range_outputs(m, min_bias, max_bias)
  largest = m.maximum(in_max, m.maximum(-in_min, m.maximum(bias_max, -bias_min)))
  out_max = _f32(m, largest * _F32(1 << 17))
  out_min = -out_max
  zero = _float_to_quantized(m, 0.0, out_min, out_max, out_type)
  # TF's kernel dequantizes each operand with the other's type (both quint8 in its one registration)
  bias_total = _quantize_with_eigen(m, _dequantize_with_eigen(m, bias, bias_min, bias_max, np.dtype(x.dtype)),
                                    out_min, out_max, out_type)
  x_total = _quantize_with_eigen(m, _dequantize_with_eigen(m, x, in_min, in_max, np.dtype(bias.dtype)),
                                 out_min, out_max, out_type)
  return (x_total + (bias_total + zero)).astype(out_type), out_min, out_max


# --------------------------------------------------------------------------- requantizing qint32 to quint8


def _mul_wide(a, b):
  """The 64-bit product of uint32 arrays as (high, low) uint32 words, from 16-bit limbs."""
  mask = np.uint32(0xFFFF)
  a0, a1, b0, b1 = a & mask, a >> 16, b & mask, b >> 16
  p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
  mid = (p00 >> 16) + (p01 & mask) + (p10 & mask)
  return p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16), (mid << 16) | (p00 & mask)


def _add_wide(x, y):
  high, low = x[0] + y[0], x[1] + y[1]
  return high + (low < x[1]).astype(np.uint32), low


def _words(value: int):
  value %= 1 << 64
  return jnp.uint32(value >> 32), jnp.uint32(value & 0xFFFFFFFF)


def _fixed_point_requantize(x, range_scale_fp: int, offset_fp: int):
  """clamp(((x * range_scale_fp) >> 32) + offset_fp) >> 16, 0, 255) in int64 (TF's), for int32 x and
  Python-int constants; with two uint32 words per int64 where JAX's x64 mode is off."""
  x = jnp.asarray(x).astype(np.int32)
  if jax.config.jax_enable_x64:
    fp = ((x.astype(np.int64) * np.int64(range_scale_fp)) >> 32) + np.int64(offset_fp)
    return jnp.clip(fp >> 16, 0, 255).astype(np.uint8)
  if not 0 <= range_scale_fp < 1 << 62:
    raise InvalidNodeError(f"requantization scale {range_scale_fp} out of range")
  negative = x < 0
  magnitude = lax.bitcast_convert_type(jnp.where(negative, -x, x), np.uint32)   # |INT_MIN| wraps to 2^31
  s1, s0 = _words(range_scale_fp)
  over, rest = _mul_wide(magnitude, jnp.broadcast_to(s0, x.shape))
  q = _add_wide(_mul_wide(magnitude, jnp.broadcast_to(s1, x.shape)), (jnp.zeros_like(over), over))
  # floor(-m / 2^32) = -q - 1 (= ~q) when the division left a remainder, else -q (= ~q + 1)
  inverted = (~q[0], ~q[1])
  plus_one = _add_wide(inverted, (jnp.uint32(0), jnp.uint32(1)))
  exact = rest == 0
  q = tuple(jnp.where(negative, jnp.where(exact, p, i), w) for p, i, w in zip(plus_one, inverted, q))
  high, low = _add_wide(q, _words(offset_fp))
  high = lax.bitcast_convert_type(high, np.int32)
  return jnp.where(high < 0, 0, jnp.where(high > 0, 255, jnp.minimum(low >> 16, 255))).astype(np.uint8)


def _requantize_to_uint8(x, in_min, in_max, out_min, out_max):
  """RequantizeManyInNewRangeUsingEigen<qint32, quint8>: TF's 16.16 fixed-point path."""
  m = _m(in_min, in_max, out_min, out_max)
  input_range, output_range = in_max - in_min, out_max - out_min
  zero_range = output_range == 0
  safe_range = m.where(zero_range, _F32(1), output_range)
  recip = m.where(zero_range, _F32(0), (_f64(m, 255.0) / _f64(m, safe_range)).astype(_F32))
  rezero = ((in_min + in_max) / _F32(2))
  shift = float(1 << 16)
  scale_fp = m.where(zero_range, 0.0, m.trunc(_f64(m, 255.0 * shift) * _f64(m, input_range) / _f64(m, safe_range)))
  input_offset_fp = m.trunc(_product(m, rezero * recip) * _F32(shift))
  output_offset_fp = m.where(zero_range, 0.0,
                             m.trunc(_f64(m, shift) * (_f64(m, out_min) * 255.0) / _f64(m, safe_range)))
  if m is np:
    offset = int(input_offset_fp) - int(output_offset_fp) + (1 << 15)
    return _fixed_point_requantize(x, int(scale_fp), offset)
  if jax.config.jax_enable_x64:
    fp = ((jnp.asarray(x).astype(np.int64) * scale_fp.astype(np.int64)) >> 32) + (
        input_offset_fp.astype(np.int64) - output_offset_fp.astype(np.int64) + (1 << 15))
    return jnp.clip(fp >> 16, 0, 255).astype(np.uint8)
  # Ranges traced without x64: the same arithmetic in float32 (within a step of TF's)
  fp = jnp.floor(jnp.asarray(x).astype(_F32) * (scale_fp / _F32(2.0 ** 32))) + (
      input_offset_fp - output_offset_fp + _F32(1 << 15))
  return jnp.clip(jnp.floor(fp / _F32(shift)), 0, 255).astype(np.uint8)


def _used_range(ctx, x, input_min, input_max):
  """The float range the values of `x` use (min no larger than 0), as RequantizationRange finds it."""
  dtype = _storage(ctx, "Tinput")
  lowest, highest = _limits(dtype)
  m = _m(input_min, input_max)
  in_min, in_max = _range_outputs(m, input_min, input_max)
  mx = xp(x)
  x = mx.asarray(x)
  used_min = mx.min(x, initial=highest) if mx is np else jnp.min(x, initial=highest)
  used_max = mx.max(x, initial=lowest) if mx is np else jnp.max(x, initial=lowest)
  mr = xp(x, in_min)
  low = _quantized_to_float(mr, used_min, in_min, in_max, dtype)
  return mr.minimum(_F32(0), low), _quantized_to_float(mr, used_max, in_min, in_max, dtype)


@register("RequantizationRange")
def requantization_range(ctx, x, input_min, input_max):
  low, high = _used_range(ctx, x, input_min, input_max)
  return _f32(xp(low), low), _f32(xp(high), high)


@register("Requantize")
def requantize(ctx, x, input_min, input_max, requested_min, requested_max):
  if _storage(ctx, "Tinput") != np.int32 or _storage(ctx, "out_type") != np.uint8:
    _fail(ctx, "only qint32 to quint8 is supported (TF's one kernel)")
  m = _m(input_min, input_max, requested_min, requested_max)
  in_min, in_max = _range_outputs(m, input_min, input_max)
  out_min, out_max = _range_outputs(m, requested_min, requested_max)
  return _requantize_to_uint8(x, in_min, in_max, out_min, out_max), out_min, out_max


@register("QuantizeDownAndShrinkRange")
def quantize_down_and_shrink_range(ctx, x, input_min, input_max):
  if _storage(ctx, "Tinput") != np.int32 or _storage(ctx, "out_type") != np.uint8:
    _fail(ctx, "only qint32 to quint8 is supported (TF's one kernel)")
  low, high = _used_range(ctx, x, input_min, input_max)
  m = _m(input_min, input_max)
  in_min, in_max = _range_outputs(m, input_min, input_max)
  return _requantize_to_uint8(x, in_min, in_max, low, high), _f32(xp(low), low), _f32(xp(high), high)
