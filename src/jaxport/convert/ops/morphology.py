"""Op rules: morphology on NHWC images. Max pooling with argmax (MaxPoolWithArgmax and its gradient ops)
and grayscale dilation (Dilation2D, which tf.nn.erosion2d is built from, and its backprops).

Each output picks one window tap in the order TF's CPU kernels scan a window (rows, then columns; a
later tap wins only when strictly greater), and its value and gradient come from that tap alone, so
values, argmax indices and gradients match TF's kernels:
* MaxPoolWithArgmax starts at the first tap inside the image: a NaN there wins, later NaNs never do.
* Dilation2D starts at the dtype's lowest finite value, which only a greater sum replaces: NaN sums
  never win, and a window with no greater sum (all -inf or NaN, or all padding) gives that lowest value
  and sends its gradient where TF's backprops do (the window's first in-image input, filter tap (0, 0)).
Known differences: argmax indices out of range in MaxPoolGrad(Grad)WithArgmax are refused when known at
conversion and otherwise dropped (TF's CPU kernel aborts the process); MaxPoolGradWithArgmax runs with an
int32 argmax and MaxPoolGradGradWithArgmax on CPU, where TF has no kernel; int64 argmax is int32 unless
jax_enable_x64; float gradients that meet at one input may add up in another order than TF's.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert import export_marks
from jaxport.convert.ops._util import jax_dtype, known_value, text
from jaxport.convert.ops.nn import _window_pads
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _invalid(ctx, message: str):
  return InvalidNodeError(f"{ctx.op} node {ctx.name!r}: {message}")


def _output_size(ctx, size: int, effective: int, stride: int, padding: str) -> int:
  """TF's GetWindowedOutputSize (C division: VALID rounds a negative quotient toward zero)."""
  if padding == "SAME":
    return -(-size // stride)
  num = size - effective + stride
  out = num // stride if num >= 0 else -(-num // stride)
  if out < 0:
    raise _invalid(ctx, f"Computed output size would be negative: {out} [input_size: {size}, "
                        f"effective_filter_size: {effective}, stride: {stride}]")
  return out


@dataclasses.dataclass(frozen=True)
class _Windows:
  """Where every window tap of a 2-D NHWC pooling or dilation reads its input, in TF's scan order.
  Hashable: the jitted cores below take it as a static argument (one computation when run eagerly)."""
  shape: tuple     # the input's (batch, height, width, depth)
  window: tuple    # taps per row and column
  strides: tuple
  rates: tuple
  out_hw: tuple
  pad_begin: tuple   # (top, left)

  @classmethod
  def of(cls, ctx, shape, window, strides, rates) -> _Windows:
    if len(shape) != 4:
      raise _invalid(ctx, f"input must be 4-dimensional, got shape {list(shape)}")
    if min(strides) <= 0:
      raise _invalid(ctx, f"Stride must be > 0, but got {min(strides)}")
    padding = text(ctx.attr("padding"))
    pads = _window_pads(shape[1:3], window, strides, rates, padding, None)
    out_hw = tuple(_output_size(ctx, n, (k - 1) * r + 1, s, padding)
                   for n, k, s, r in zip(shape[1:3], window, strides, rates))
    as_ints = lambda xs: tuple(int(v) for v in xs)
    return cls(as_ints(shape), as_ints(window), as_ints(strides), as_ints(rates), out_hw,
               as_ints(lo for lo, _ in pads))

  @property
  def out_shape(self) -> tuple:
    return (self.shape[0], *self.out_hw, self.shape[3])

  def _begins(self):
    """Input row (column) of each output row's (column's) first tap; tap d reads begin + d * rate."""
    return [np.arange(n) * s - p for n, s, p in zip(self.out_hw, self.strides, self.pad_begin)]

  def _taps(self):
    """Input rows (kh, out_h) and columns (kw, out_w) of every tap, and whether they are in the image."""
    taps = []
    for k, rate, begin, size in zip(self.window, self.rates, self._begins(), self.shape[1:3]):
      at = np.arange(k)[:, None] * rate + begin
      taps.append((at, (at >= 0) & (at < size)))
    return taps

  def valid(self) -> np.ndarray:
    """(kh * kw, 1, out_h, out_w, 1): whether each tap of each window is in the image."""
    (_, row_ok), (_, col_ok) = self._taps()
    return (row_ok[:, None, :, None] & col_ok[None, :, None, :]).reshape(-1, 1, *self.out_hw, 1)

  def taps(self, x):
    """x at every tap, (kh * kw, batch, out_h, out_w, depth); taps outside the image hold any value."""
    (kh, kw), (b, height, width, c), (out_h, out_w) = self.window, self.shape, self.out_hw
    (rows, _), (cols, _) = self._taps()
    t = jnp.take(x, np.clip(rows, 0, height - 1).reshape(-1), axis=1).reshape(b, kh, out_h, width, c)
    t = jnp.take(t, np.clip(cols, 0, width - 1).reshape(-1), axis=3).reshape(b, kh, out_h, kw, out_w, c)
    return t.transpose(1, 3, 0, 2, 4, 5).reshape(kh * kw, b, out_h, out_w, c)

  def input_index(self, tap, batch: bool = True, found=None):
    """The flat input index ((b * height + y) * width + x) * depth + c of each output's `tap`; where
    `found` is False, the window's first in-image position instead (TF's Dilation2DBackpropInput)."""
    batches, height, width, depth = self.shape
    dtype = jax_dtype(np.int64)
    row_begin, col_begin = (b.astype(dtype) for b in self._begins())
    row_begin, col_begin = row_begin.reshape(-1, 1, 1), col_begin.reshape(-1, 1)
    rows = tap // self.window[1] * self.rates[0] + row_begin
    cols = tap % self.window[1] * self.rates[1] + col_begin
    if found is not None:
      rows = jnp.where(found, rows, np.maximum(row_begin, 0))
      cols = jnp.where(found, cols, np.maximum(col_begin, 0))
    index = (rows * width + cols) * depth + np.arange(depth, dtype=dtype)
    if batch:
      index = index + np.arange(batches, dtype=dtype).reshape(-1, 1, 1, 1) * (height * width * depth)
    return index


def _gather(x, index):
  return jnp.reshape(x, -1)[index]


@functools.partial(jax.jit, static_argnums=(2, 3))
def _scatter_add(values, index, shape, dtype):
  flat = jnp.zeros(int(np.prod(shape)), dtype).at[jnp.reshape(index, -1)].add(
      jnp.reshape(values, -1).astype(dtype), mode="drop")
  return flat.reshape(shape)


# --------------------------------------------------------------------------- max pooling with argmax


def _pool_windows(ctx, shape) -> _Windows:
  """MaxPoolWithArgmax's windows; its kernel pools over rows and columns only (PoolParameters' checks)."""
  ksize, strides = list(ctx.attr("ksize")), list(ctx.attr("strides"))
  if min(ksize) <= 0:
    raise _invalid(ctx, f"ksize must be a positive int32 value, got: {min(ksize)}")
  if ksize[0] != 1 or strides[0] != 1:
    raise _invalid(ctx, "Pooling is not yet supported on the batch dimension.")
  if ksize[3] != 1:   # depth pooling passes these checks, then pools rows and columns only
    if ksize[1] != 1 or ksize[2] != 1:
      raise _invalid(ctx, "MaxPooling supports exactly one of pooling across depth or pooling across "
                          "width/height.")
    if len(shape) == 4 and shape[3] % ksize[3]:
      raise _invalid(ctx, "Depthwise max pooling requires the depth window to evenly divide the input depth")
    if strides[3] != ksize[3]:
      raise _invalid(ctx, "Depthwise max pooling requires the depth window to equal the depth stride")
  return _Windows.of(ctx, shape, ksize[1:3], strides[1:3], (1, 1))


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _max_pool_with_argmax(x, windows: _Windows, include_batch: bool, argmax_dtype):
  """(output, argmax). TF's tap: the first in-image tap if it is NaN, else the first tap holding the maximum."""
  taps, valid = windows.taps(x), windows.valid()
  first = np.broadcast_to(np.argmax(valid, axis=0)[None], (1, *windows.out_shape))   # first in-image tap
  floating = jnp.issubdtype(taps.dtype, jnp.floating)
  candidate = valid & ~jnp.isnan(taps) if floating else valid
  lowest = -np.inf if floating else jnp.iinfo(taps.dtype).min
  top = jnp.where(candidate, taps, np.array(lowest, taps.dtype)).max(axis=0)
  tap = jnp.argmax(candidate & (taps == top), axis=0)   # argmax: the first True
  if floating:
    tap = jnp.where(jnp.isnan(jnp.take_along_axis(taps, first, axis=0)[0]), first[0], tap)
  argmax = windows.input_index(tap, batch=include_batch).astype(argmax_dtype)
  return _gather(x, windows.input_index(tap)), argmax


@register("MaxPoolWithArgmax")
def max_pool_with_argmax(ctx, x):
  return _max_pool_with_argmax(x, _pool_windows(ctx, np.shape(x)), bool(ctx.attr("include_batch_in_index", False)),
                               jax_dtype(ctx.attr("Targmax", np.int64)))


def _argmax_index(ctx, windows: _Windows, argmax, what: str):
  """`argmax` as flat indices into the whole input, refused when known and out of range."""
  batches, height, width, depth = windows.shape
  include_batch = bool(ctx.attr("include_batch_in_index", False))
  limit = height * width * depth * (batches if include_batch else 1)
  value = known_value(argmax)
  if value is not None and value.size and (value.min() < 0 or value.max() >= limit):
    raise _invalid(ctx, f"Invalid {what} index in argmax: every index must be in [0, {limit}) "
                        "(TF's kernel aborts on this input).")
  return _flat_argmax(argmax, windows, include_batch)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _flat_argmax(argmax, windows: _Windows, include_batch: bool):
  """TF adds the batch offset unless include_batch_in_index; indices out of range go past the end (dropped)."""
  batches, height, width, depth = windows.shape
  per_batch = height * width * depth
  limit = per_batch * (batches if include_batch else 1)
  argmax = argmax.astype(jax_dtype(np.int64))
  offset = 0 if include_batch else np.arange(batches, dtype=argmax.dtype).reshape(-1, 1, 1, 1) * per_batch
  return jnp.where((argmax >= 0) & (argmax < limit), argmax + offset, per_batch * batches)


def _check_shape(ctx, name: str, value, expected):
  if tuple(np.shape(value)) != tuple(expected):
    raise _invalid(ctx, f"Expected {name} shape to be {list(expected)}, but got {list(np.shape(value))}")


@register("MaxPoolGradWithArgmax")
def max_pool_grad_with_argmax(ctx, x, grad, argmax):
  windows = _pool_windows(ctx, np.shape(x))
  depth_window = ctx.attr("ksize")[3]
  # with a depth window, TF expects the shape of a depth pooling (which MaxPoolWithArgmax does not make)
  shape = windows.out_shape if depth_window == 1 else (*windows.shape[:3], windows.shape[3] // depth_window)
  _check_shape(ctx, "grad", grad, shape)
  _check_shape(ctx, "argmax", argmax, shape)
  index = _argmax_index(ctx, windows, argmax, "output gradient")
  return _scatter_add(grad, index, windows.shape, np.dtype(jnp.result_type(x)))


@register("MaxPoolGradGradWithArgmax")
def max_pool_grad_grad_with_argmax(ctx, x, grad, argmax):
  """TF has this kernel on GPU only: each output takes `grad` at its argmax."""
  windows = _pool_windows(ctx, np.shape(x))
  if ctx.attr("ksize")[3] != 1:
    raise _invalid(ctx, "Depthwise max pooling is currently only implemented for CPU devices.")
  _check_shape(ctx, "grad", grad, windows.shape)
  _check_shape(ctx, "argmax", argmax, windows.out_shape)
  index = _argmax_index(ctx, windows, argmax, "input gradient")
  return jnp.take(jnp.reshape(grad, -1), index, mode="fill", fill_value=0)


# --------------------------------------------------------------------------- dilation


def _dilation_windows(ctx, x, f, out_backprop=None) -> _Windows:
  strides, rates = list(ctx.attr("strides")), list(ctx.attr("rates"))
  if strides[0] != 1 or strides[3] != 1:
    raise _invalid(ctx, "Stride is only supported across spatial dimensions.")
  if rates[0] != 1 or rates[3] != 1:
    raise _invalid(ctx, "Rate is only supported across spatial dimensions.")
  if np.ndim(f) != 3:
    raise _invalid(ctx, f"filter must be 3-dimensional, got shape {list(np.shape(f))}")
  if np.ndim(x) == 4 and np.shape(x)[3] != np.shape(f)[2]:
    raise _invalid(ctx, f"input and filter must have the same depth: {np.shape(x)[3]} vs {np.shape(f)[2]}")
  windows = _Windows.of(ctx, np.shape(x), np.shape(f)[:2], strides[1:3], rates[1:3])
  if out_backprop is not None and tuple(np.shape(out_backprop)) != windows.out_shape:
    raise _invalid(ctx, f"out_backprop has incompatible size: expected {list(windows.out_shape)}, "
                        f"got {list(np.shape(out_backprop))}")
  return windows


def _lowest(dtype):
  return np.array((jnp.finfo if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo)(dtype).min, dtype)


def _dilation_pick(x, f, windows: _Windows):
  """Per output: whether a sum beat the dtype's lowest value, and the input and filter indices TF picks."""
  depth = windows.shape[3]
  sums = windows.taps(x) + jnp.reshape(f, (-1, 1, 1, 1, depth))
  lowest = _lowest(sums.dtype)
  candidate = windows.valid() & (sums > lowest)   # NaN sums are never greater
  top = jnp.where(candidate, sums, lowest).max(axis=0)
  tap = jnp.argmax(candidate & (sums == top), axis=0)   # the first maximum; tap 0 when none beat lowest
  found = candidate.any(axis=0)
  return found, windows.input_index(tap, found=found), tap * depth + np.arange(depth, dtype=tap.dtype)


@jax.custom_jvp
def _value_with_tangent_of(value, source):
  """`value`, differentiated as `source`."""
  return value


@_value_with_tangent_of.defjvp
def _value_with_tangent_of_jvp(primals, tangents):
  return primals[0], tangents[1]


# marked: `jax.export` keeps the call, so a loaded artifact differentiates it the same way
_tangent_from = export_marks.marked("dilation_default_tap_gradient")(_value_with_tangent_of)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _dilation(x, f, windows: _Windows, exporting: bool):
  del exporting   # a key only: the marked call traces differently while exporting
  found, input_index, filter_index = _dilation_pick(x, f, windows)
  picked = _gather(x, input_index) + _gather(f, filter_index)
  # a window where no sum beat the lowest value outputs it, with the gradient of TF's default taps
  return _tangent_from(jnp.where(found, picked, _lowest(picked.dtype)), picked)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _dilation_backprop(x, f, out_backprop, windows: _Windows, wrt_filter: bool):
  _, input_index, filter_index = _dilation_pick(x, f, windows)
  if wrt_filter:
    return _scatter_add(out_backprop, filter_index, jnp.shape(f), np.dtype(f.dtype))
  return _scatter_add(out_backprop, input_index, jnp.shape(x), np.dtype(x.dtype))


@register("Dilation2D")
def dilation2d(ctx, x, f):
  return _dilation(x, f, _dilation_windows(ctx, x, f), export_marks.exporting_now())


@register("Dilation2DBackpropInput")
def dilation2d_backprop_input(ctx, x, f, out_backprop):
  return _dilation_backprop(x, f, out_backprop, _dilation_windows(ctx, x, f, out_backprop), False)


@register("Dilation2DBackpropFilter")
def dilation2d_backprop_filter(ctx, x, f, out_backprop):
  return _dilation_backprop(x, f, out_backprop, _dilation_windows(ctx, x, f, out_backprop), True)
