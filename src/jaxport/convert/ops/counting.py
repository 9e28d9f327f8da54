"""Op rules: counting values (Bincount, DenseBincount) and fixed-width histograms (HistogramFixedWidth).

`size` and `nbins` decide the output shape: they must be known when tracing (a constant, or any
value when the converted function runs without jit). Differences from TF: negative
values are ignored like values >= size (TF's CPU kernel raises on them).

HistogramFixedWidth bins as TF's kernel does: `min(((double)clamp(x, lo, hi) - (double)lo) / step,
nbins - 1)` truncated, with `step = ((double)hi - (double)lo) / nbins`. When `value_range` is known at
trace time (the usual constant), the bins come from comparisons with the smallest value of each bin,
found in float64 while converting, so they are TF's even without JAX's x64 mode. A traced `value_range`
divides in the widest float JAX has (float32 without x64: a value within rounding of a bin edge can land
in the next bin). TF raises on NaN values, which this rule does when it sees them (an eager call); under jit a NaN
counts in the first bin.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import known_value, static_value, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _size(ctx, size) -> int:
  n = int(static_value(size, "size", ctx).reshape(-1)[0])
  if n < 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: size must be non-negative, got {n}")
  return n


def _count(ids, weights, size: int, dtype, binary: bool, per_row: bool):
  """Counts (or sums `weights` of) each value in [0, size), per row of `ids` when `per_row`."""
  rows = np.shape(ids)[0] if per_row else 1
  total = rows * size
  m = xp(ids, weights) if weights is not None else xp(ids)
  offsets = np.arange(rows).reshape((rows,) + (1,) * (np.ndim(ids) - 1)) * size if per_row else 0
  flat = m.reshape(m.where((ids >= 0) & (ids < size), ids + offsets, total), (-1,))
  if binary or weights is None:
    values = np.ones((), dtype)
  else:
    values = m.reshape(weights, (-1,))
  if m is np:
    out = np.zeros(total + 1, dtype)
    np.add.at(out, flat, values)
    out = out[:total]
  else:
    out = jnp.zeros(total, jax.dtypes.canonicalize_dtype(dtype)).at[flat].add(values, mode="drop")
  if binary:
    out = (out > 0).astype(out.dtype)
  return m.reshape(out, (rows, size) if per_row else (size,))


def _weights(weights):
  return weights if weights is not None and np.size(weights) else None


@register("Bincount")
def bincount(ctx, arr, size, weights):
  return _count(arr, _weights(weights), _size(ctx, size), np.dtype(ctx.attr("T")), False, False)


@register("DenseBincount")
def dense_bincount(ctx, x, size, weights):
  """Counts per value of a 1-D input, or per row of a 2-D one; `binary_output` marks presence."""
  if np.ndim(x) not in (1, 2):
    raise InvalidNodeError(f"DenseBincount node {ctx.name!r}: input must be 1-D or 2-D, got rank {np.ndim(x)}")
  return _count(x, _weights(weights), _size(ctx, size), np.dtype(ctx.attr("T")),
                bool(ctx.attr("binary_output", False)), np.ndim(x) == 2)


@register("HistogramFixedWidth")
def histogram_fixed_width(ctx, values, value_range, nbins):
  nbins = int(static_value(nbins, "nbins", ctx).reshape(-1)[0])
  if nbins <= 0:
    raise InvalidNodeError(f"HistogramFixedWidth node {ctx.name!r}: nbins must be positive, got {nbins}")
  known_range, seen = known_value(value_range), known_value(values)
  if known_range is not None and not known_range[0] < known_range[1]:
    raise InvalidNodeError(f"HistogramFixedWidth node {ctx.name!r}: value_range must satisfy value_range[0] < "
                           f"value_range[1], got {known_range.tolist()}")
  if seen is not None and np.issubdtype(seen.dtype, np.inexact) and np.isnan(seen).any():
    raise InvalidNodeError(f"HistogramFixedWidth node {ctx.name!r}: histogram values must not contain NaN")
  m = xp(values, value_range)
  if known_range is not None:
    bins = m.searchsorted(_bin_starts(known_range, nbins), m.reshape(values, (-1,)), side="right")
  else:
    wide = jnp.promote_types(jax.dtypes.canonicalize_dtype(np.float64), jnp.float32)
    low, high = value_range[0], value_range[1]
    step = (high.astype(wide) - low.astype(wide)) / nbins
    offsets = jnp.clip(values, low, high).astype(wide) - low.astype(wide)
    bins = jnp.minimum(jnp.floor(offsets / step), nbins - 1).astype(jnp.int32).reshape(-1)
  return _count(bins, None, nbins, np.dtype(ctx.attr("dtype", np.int32)), False, False)


def _bin_starts(value_range: np.ndarray, nbins: int) -> np.ndarray:
  """The smallest value (in the values' dtype) that TF's kernel puts in bin i, for i in 1 .. nbins - 1:
  each bin's float64 boundary, stepped to the representable value where TF's division first reaches i."""
  dtype = value_range.dtype
  low = np.float64(value_range[0])
  step = (np.float64(value_range[1]) - low) / np.float64(nbins)
  reaches = lambda x, i: (np.float64(x) - low) / step >= i
  starts = []
  for i in range(1, nbins):
    x = _nearest(dtype, low + i * step)
    while reaches(_next(x, -1), i):
      x = _next(x, -1)
    while not reaches(x, i):
      x = _next(x, 1)
    starts.append(x)
  return np.array(starts, dtype)


def _nearest(dtype, value: float):
  if np.issubdtype(dtype, np.integer):
    return dtype.type(min(np.ceil(value), np.iinfo(dtype).max))
  return np.array(value).astype(dtype)[()]


def _next(x, direction: int):
  """The neighbouring representable value of `x` (integers: x +- 1)."""
  if np.issubdtype(np.asarray(x).dtype, np.integer):
    return x + direction
  return np.nextafter(x, np.inf if direction > 0 else -np.inf, dtype=np.asarray(x).dtype)
