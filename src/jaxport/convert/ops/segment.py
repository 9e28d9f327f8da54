"""Op rules: sorted segment reductions (Segment*), stitching (DynamicStitch), partitioning
(DynamicPartition) and SparseToDense. The unsorted segment ops are in `gather_scatter.py`.

The segment ids, stitch indices and partitions decide the output shapes, so they must be
known when tracing: constants, or any value when the converted function runs without jit
(under jit they raise `DynamicShapeError`). Being known, they are checked like TF's CPU
kernels check them. Differences from TF: `SparseToDense` checks its indices only when they
are known; traced out-of-range indices are dropped. Rows that no stitch index names are
zeros (TF: also zeros on CPU).
"""
from __future__ import annotations

import numpy as np

from jaxport.convert.ops._util import known_value, static_ints, static_value, xp
from jaxport.convert.ops.gather_scatter import _scatter, _segment_reduce, segment_prod
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_SORTED_SEGMENT = {"SegmentSum": "add", "SegmentProd": "mul", "SegmentMax": "max", "SegmentMin": "min",
                   "SegmentMean": "mean"}


def _sorted_ids(ctx, segment_ids) -> np.ndarray:
  ids = static_value(segment_ids, "segment_ids", ctx).astype(np.int64)
  if ids.ndim != 1:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: segment_ids must be a vector, got shape {ids.shape}")
  if ids.size and (ids[0] < 0 or np.any(np.diff(ids) < 0)):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: segment_ids must be sorted and non-negative, got {ids}")
  return ids


def _divide_truncating(total, counts):
  """`total / counts` for floats; integer division rounding toward zero (TF) for integers."""
  m = xp(total)
  if np.issubdtype(np.dtype(total.dtype), np.integer):
    return (m.sign(total) * (m.abs(total) // counts)).astype(total.dtype)
  return (total / counts).astype(total.dtype)


@register(*_SORTED_SEGMENT)
def sorted_segment(ctx, data, segment_ids):
  """Reduces the rows of `data` into `segment_ids[-1] + 1` rows; an empty segment gives 0 (TF)."""
  ids = _sorted_ids(ctx, segment_ids)
  n = int(ids[-1]) + 1 if ids.size else 0
  how = _SORTED_SEGMENT[ctx.op]
  m = xp(data)
  counts = np.bincount(ids, minlength=n).reshape((n,) + (1,) * (np.ndim(data) - 1))
  if how == "mul" and m is not np:
    return segment_prod(data, ids, segments=n)
  out = _segment_reduce(data, ids, n, "add" if how == "mean" else how)
  if how == "mean":
    return _divide_truncating(out, np.maximum(counts, 1).astype(out.dtype))
  if how in ("max", "min"):
    return m.where(counts > 0, out, m.zeros((), out.dtype))
  return out


@register("DynamicStitch", "ParallelDynamicStitch")
def dynamic_stitch(ctx, *inputs):
  """Row `indices[m][i]` of the output is `data[m][i]`; for a repeated index the last one wins."""
  n = len(inputs) // 2
  indices = [static_value(i, "indices", ctx).astype(np.int64) for i in inputs[:n]]
  data = inputs[n:]
  trailing = np.shape(data[0])[np.ndim(indices[0]):]
  flat_indices = np.concatenate([i.reshape(-1) for i in indices])
  if flat_indices.size and flat_indices.min() < 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: indices must be non-negative, got {flat_indices.min()}")
  size = int(flat_indices.max()) + 1 if flat_indices.size else 0
  m = xp(*data)
  rows = [m.reshape(d, (-1,) + trailing) for d in data] + [m.zeros((1,) + trailing, data[0].dtype)]
  source = np.full(size, -1, np.int64)
  np.maximum.at(source, flat_indices, np.arange(flat_indices.size))
  source[source < 0] = flat_indices.size   # unnamed rows read the zero row
  return m.concatenate(rows)[source]


@register("DynamicPartition")
def dynamic_partition(ctx, data, partitions):
  """`num_partitions` outputs; output k holds the slices of `data` whose partition is k, in order."""
  k = ctx.attr("num_partitions")
  parts = static_value(partitions, "partitions", ctx).astype(np.int64)
  if parts.size and (parts.min() < 0 or parts.max() >= k):
    raise InvalidNodeError(f"DynamicPartition node {ctx.name!r}: partitions must be in [0, {k}), got "
                     f"values in [{parts.min()}, {parts.max()}]")
  m = xp(data)
  rows = m.reshape(data, (-1,) + np.shape(data)[parts.ndim:])
  flat = parts.reshape(-1)
  return [rows[np.flatnonzero(flat == p)] for p in range(k)]


def _check_sparse_indices(ctx, indices: np.ndarray, shape: list[int]) -> None:
  """TF's validate_indices: in range, and in strictly increasing row-major order."""
  bad = np.any((indices < 0) | (indices >= np.asarray(shape)), axis=1)
  if bad.any():
    raise InvalidNodeError(f"SparseToDense node {ctx.name!r}: index {indices[bad][0].tolist()} is out of "
                           f"bounds for output_shape {shape}")
  if len(indices) > 1:
    flat = np.ravel_multi_index(tuple(indices.T), shape) if shape else np.zeros(len(indices))
    if np.any(np.diff(flat) <= 0):
      raise InvalidNodeError(f"SparseToDense node {ctx.name!r}: indices are repeated or out of order; sort "
                             "them (tf.sparse.reorder) or pass validate_indices=False")


@register("SparseToDense")
def sparse_to_dense(ctx, sparse_indices, output_shape, sparse_values, default_value):
  shape = static_ints(output_shape, "output_shape", ctx)
  m = xp(sparse_indices, sparse_values, default_value)
  indices = m.reshape(sparse_indices, (-1, len(shape)) if np.ndim(sparse_indices) < 2 else np.shape(sparse_indices))
  known = known_value(indices)
  if known is not None and ctx.attr("validate_indices", True):
    _check_sparse_indices(ctx, known.astype(np.int64), shape)
  base = xp(default_value).full(shape, default_value, dtype=default_value.dtype)
  values = xp(sparse_values).broadcast_to(sparse_values, np.shape(indices)[:1])
  return _scatter(base, indices, values, "set")
