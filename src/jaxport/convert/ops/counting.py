"""Op rules: counting values (Bincount, DenseBincount).

`size` decides the output shape: it must be known when tracing (a constant, or any
value when the converted function runs without jit). Differences from TF: negative
values are ignored like values >= size (TF's CPU kernel raises on them).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import static_value, xp
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
