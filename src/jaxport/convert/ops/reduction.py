"""Op rules: reductions, arg-reductions and cumulative ops.

Axes are trace-time constants (possibly negative, a scalar or empty). Constant
inputs are reduced with NumPy so that shape arithmetic such as
`reduce_prod(shape(x))` stays static under jit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from jaxport.convert.ops._util import static_ints, widened_for_sums
from jaxport.convert.ops.math import apply, truncate_div
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _axes(ctx, x, axis) -> tuple[int, ...]:
  rank = np.ndim(x)
  axes = static_ints(axis, "axis", ctx)
  if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: invalid axes {axes} for an input of rank {rank}")
  return tuple(sorted(a % rank for a in axes))


def _reduction(*op_types):
  """Registers `fn(xp, x, axes)`; the rule adds `keep_dims`."""
  def decorator(fn):
    def rule(ctx, x, axis):
      axes = _axes(ctx, x, axis)
      out = apply(lambda xp, x: fn(xp, x, axes), (x,))
      if ctx.attr("keep_dims", False):
        out = out.reshape([1 if d in axes else n for d, n in enumerate(np.shape(x))])
      return out
    register(*op_types, size_bounded=True)(rule)
    return fn
  return decorator


def _count(x, axes) -> int:
  return int(np.prod([np.shape(x)[a] for a in axes], dtype=np.int64))


def _is_integer(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.integer)


def _is_float(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


@_reduction("Sum")
def _sum(xp, x, axes):
  if x.dtype == ml_dtypes.bfloat16:   # TF's kernel sums bfloat16 in float32 and rounds once
    return xp.sum(widened_for_sums(x), axis=axes).astype(x.dtype)
  return xp.sum(x, axis=axes, dtype=x.dtype)   # integers wrap around in their own type, like TF


@_reduction("Prod")
def _prod(xp, x, axes):
  return xp.prod(x, axis=axes, dtype=x.dtype)


def _initial_if_empty(x, axes, for_max: bool):
  """What Max/Min give over an empty axis, like TF: -inf/+inf, or the integer type's limits."""
  if _count(x, axes):
    return None
  if _is_float(x):
    return -np.inf if for_max else np.inf
  info = np.iinfo(x.dtype)   # typed: a Python int above int32's range overflows in JAX
  return x.dtype.type(info.min if for_max else info.max)


@_reduction("Max")
def _max(xp, x, axes):
  return xp.max(x, axis=axes, initial=_initial_if_empty(x, axes, for_max=True))


@_reduction("Min")
def _min(xp, x, axes):
  return xp.min(x, axis=axes, initial=_initial_if_empty(x, axes, for_max=False))


@_reduction("All")
def _all(xp, x, axes):
  return xp.all(x, axis=axes)


@_reduction("Any")
def _any(xp, x, axes):
  return xp.any(x, axis=axes)


@_reduction("Mean")
def _mean(xp, x, axes):
  if _is_integer(x):
    return _integer_mean(xp, x, axes)
  if not _count(x, axes):   # NaN, like TF (NumPy's mean would also warn)
    return xp.full_like(xp.sum(x, axis=axes), np.nan)
  total = xp.sum(widened_for_sums(x), axis=axes)   # 16-bit floats: in float32, like TF
  return _divided_by_count(xp, total, _count(x, axes)).astype(x.dtype)


def _divided_by_count(xp, total, n: int):
  """`total / n` correctly rounded, as TF divides. XLA turns a division by a broadcast scalar into
  a product with its reciprocal (an ulp off on ~60% of float32 means, and then a 16-bit mean
  rounds the other way); a divisor behind an optimization barrier is divided by."""
  if xp is np:
    return total / np.asarray(n, total.dtype)
  return total / lax.optimization_barrier(jnp.full(jnp.shape(total), n, total.dtype))


def _integer_mean(xp, x, axes):
  """TF's integer mean: the exact sum (TF accumulates in 64 bits) divided with truncation
  toward zero, and 0 over nothing."""
  n = _count(x, axes)
  if n == 0:
    return xp.zeros_like(xp.sum(x, axis=axes, dtype=x.dtype))
  wide = np.dtype(np.uint64 if jnp.issubdtype(x.dtype, jnp.unsignedinteger) else np.int64)
  if xp is jnp:
    wide = jax.dtypes.canonicalize_dtype(wide)   # 32 bits when x64 is off
  values = x.astype(wide)
  if wide.itemsize == 8 or n > _EXACT_SPLIT_LIMIT:
    return truncate_div(xp, xp.sum(values, axis=axes, dtype=wide), np.asarray(n, wide)).astype(x.dtype)
  # 32-bit accumulator: split each value as q * n + r (0 <= r < n); sum(q) + sum(r) // n is
  # the floored mean, correct modulo 2**32 (so exactly, as the mean fits) since sum(r) < n**2.
  remainders = xp.sum(xp.remainder(values, n), axis=axes, dtype=wide)
  floor = xp.sum(xp.floor_divide(values, n), axis=axes, dtype=wide) + remainders // n
  return xp.where((floor < 0) & (remainders % n != 0), floor + 1, floor).astype(x.dtype)


_EXACT_SPLIT_LIMIT = 46340   # n * n < 2**31


@_reduction("EuclideanNorm")
def _euclidean_norm(xp, x, axes):
  squares = xp.sum(x * xp.conj(x), axis=axes, dtype=x.dtype)
  if _is_integer(x):   # TF: the integer part of the root
    return xp.floor(xp.sqrt(squares.astype(np.float64 if xp is np else jnp.float32))).astype(x.dtype)
  return xp.sqrt(squares)


# --------------------------------------------------------------------------- arg-reductions


def _arg_reduction(op_type, largest: bool):
  def rule(ctx, x, dimension):
    axis, = _axes(ctx, x, dimension)
    if np.shape(x)[axis] == 0:
      raise InvalidNodeError(f"{op_type} node {ctx.name!r}: reduction axis {axis} is empty in shape {np.shape(x)}")
    out_type = np.dtype(ctx.attr("output_type", np.dtype(np.int64)))
    def fn(xp, x):
      index = _first_extreme(xp, x, axis, largest)
      return index.astype(out_type if xp is np else jax.dtypes.canonicalize_dtype(out_type))
    return apply(fn, (x,))
  register(op_type, size_bounded=True)(rule)


def _first_extreme(xp, x, axis, largest):
  """Index of the first largest (smallest) element.

  For floats TF starts from (index 0, lowest finite value) and moves only to strictly
  better elements, so NaNs are skipped, and it answers 0 when nothing beats the start
  (all NaN, or all -inf for ArgMax)."""
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return xp.argmax(x, axis=axis) if largest else xp.argmin(x, axis=axis)
  info = ml_dtypes.finfo(x.dtype)
  start = np.asarray(info.min if largest else info.max, x.dtype)
  beats_start = x > start if largest else x < start
  candidates = xp.where(beats_start, x, start)
  best = (xp.max if largest else xp.min)(candidates, axis=axis, keepdims=True)
  return xp.argmax(beats_start & (x == best), axis=axis)   # first True, or 0 when none


_arg_reduction("ArgMax", largest=True)
_arg_reduction("ArgMin", largest=False)

# --------------------------------------------------------------------------- cumulative ops


def _cumulative(op_type, jax_scan, numpy_scan, identity, sequential=None):
  """`*_scan(x, axis)` are inclusive forward scans; the rule adds `reverse` and `exclusive`.
  `numpy_scan=None` computes constants with JAX too. `sequential(carry, x)`: the step TF's kernel
  takes for 16-bit floats, rounding each partial result (NumPy's scans of them do too)."""
  def rule(ctx, x, axis):
    axis, = _axes(ctx, x, axis)
    reverse, exclusive = ctx.attr("reverse", False), ctx.attr("exclusive", False)
    def fn(xp, x):
      if xp is np:
        scanned = np.flip(numpy_scan(np.flip(x, axis), axis), axis) if reverse else numpy_scan(x, axis)
      elif sequential is not None and np.dtype(x.dtype).itemsize == 2 and _is_float(x):
        scanned = _sequential_scan(sequential, x, axis, reverse)
      else:
        scanned = jax_scan(x, axis=axis, reverse=reverse)
      return _shift_in_identity(xp, scanned, axis, reverse, identity) if exclusive else scanned
    return apply(fn, (x,)) if numpy_scan is not None else fn(jnp, jnp.asarray(x))
  register(op_type, size_bounded=True)(rule)


def _shift_in_identity(xp, scanned, axis, reverse, identity):
  """The exclusive scan from the inclusive one: shift by one, the identity entering first."""
  if scanned.shape[axis] == 0:
    return scanned
  pad_shape = list(scanned.shape)
  pad_shape[axis] = 1
  pad = xp.full(pad_shape, identity, scanned.dtype)
  kept = [slice(None)] * scanned.ndim
  kept[axis] = slice(1, None) if reverse else slice(0, -1)
  parts = [scanned[tuple(kept)], pad] if reverse else [pad, scanned[tuple(kept)]]
  return xp.concatenate(parts, axis=axis)


def _sequential_scan(step, x, axis, reverse):
  """The inclusive scan of `x` along `axis`, one element after another, in `x`'s dtype."""
  def body(carry, row):
    carry = step(carry, row)
    return carry, carry
  rows = jnp.moveaxis(x, axis, 0)
  if rows.shape[0] == 0:
    return x
  _, scanned = lax.scan(body, jnp.zeros_like(rows[0]) if step is jnp.add else jnp.ones_like(rows[0]),
                        rows, reverse=reverse)
  return jnp.moveaxis(scanned, 0, axis)


_cumulative("Cumsum", lax.cumsum, lambda x, axis: np.cumsum(x, axis, dtype=x.dtype), 0, sequential=jnp.add)
_cumulative("Cumprod", lax.cumprod, lambda x, axis: np.cumprod(x, axis, dtype=x.dtype), 1,
            sequential=jnp.multiply)
_cumulative("CumulativeLogsumexp", lax.cumlogsumexp, None, -np.inf)
