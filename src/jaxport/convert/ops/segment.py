"""Op rules: sorted segment reductions (Segment*), stitching (DynamicStitch), partitioning
(DynamicPartition) and SparseToDense. The unsorted segment ops are in `gather_scatter.py`.

The segment ids, stitch indices and partitions decide the output shapes, so they must be
known when tracing: constants, or any value when the converted function runs without jit
(under jit they raise `DynamicShapeError`). Being known, they are checked like TF's CPU
kernels check them. One exception: traced partitions pad DynamicPartition's outputs to their
bound, and a stitch of one partitioning of known positions takes them back (TF's lookup into
partitioned variables; `convert/padded_rows.py`). Differences from TF: traced partitions outside
[0, num_partitions) put their rows in no output (TF raises); `SparseToDense` checks its indices
only when they are known, and drops traced out-of-range ones. Rows that no stitch index names
are zeros (TF: also zeros on CPU).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxport.convert import padded_rows
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
  data = inputs[n:]
  if any(padded_rows.padding_of(ctx.runtime, i) is not None for i in inputs[:n]):
    return _padded_stitch(ctx, inputs[:n], data)
  indices = [static_value(i, "indices", ctx).astype(np.int64) for i in inputs[:n]]
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


def _padded_stitch(ctx, indices, data):
  """The stitch of one padded partitioning of known positions (TF's partitioned lookup): its
  size is one past the largest position, the padding positions (out of range) are dropped."""
  records = [padded_rows.padding_of(ctx.runtime, i) for i in indices]
  if None in records:   # some positions padded, some not: they cannot line up
    raise padded_rows.refuse(next(r for r in records if r is not None), ctx.op, ctx.name)
  partitions = {r.partition for r in records}
  origins = {p[0] for p in partitions if p is not None}
  whole = (None not in partitions and len(origins) == 1 and len(partitions) == len(records)
           and sorted(p[1] for p in partitions) == list(range(records[0].partition[2])))
  if not whole or len({r.bound for r in records}) != 1 or records[0].bound is None:
    raise padded_rows.refuse(records[0], ctx.op, ctx.name)
  size, trailing = records[0].bound, np.shape(data[0])[1:]
  flat = jnp.concatenate([jnp.reshape(i, (-1,)) for i in indices])
  positions = jnp.arange(flat.shape[0], dtype=jnp.int32)
  source = jnp.full(size, -1, jnp.int32).at[flat].max(positions, mode="drop")   # the last one wins
  rows = jnp.concatenate([jnp.reshape(d, (-1,) + trailing) for d in data] + [jnp.zeros((1,) + trailing, data[0].dtype)])
  return rows[jnp.where(source < 0, flat.shape[0], source)]


@register("DynamicPartition")
def dynamic_partition(ctx, data, partitions):
  """`num_partitions` outputs; output k holds the slices of `data` whose partition is k, in order."""
  k = ctx.attr("num_partitions")
  if known_value(partitions) is None:
    return _padded_partition(ctx, data, partitions, k)
  parts = static_value(partitions, "partitions", ctx).astype(np.int64)
  if parts.size and (parts.min() < 0 or parts.max() >= k):
    raise InvalidNodeError(f"DynamicPartition node {ctx.name!r}: partitions must be in [0, {k}), got "
                     f"values in [{parts.min()}, {parts.max()}]")
  m = xp(data)
  rows = m.reshape(data, (-1,) + np.shape(data)[parts.ndim:])
  flat = parts.reshape(-1)
  return [rows[np.flatnonzero(flat == p)] for p in range(k)]


def _padded_partition(ctx, data, partitions, k: int) -> list:
  """Traced partitions: output p holds the rows of partition p in order, padded to all the rows
  (with the dtype's largest value for a vector of ints, so that a gather or scatter at them
  reads a clamped row and writes none; zeros otherwise)."""
  flat = jnp.reshape(partitions, (-1,))
  n = flat.shape[0]
  rows = jnp.reshape(jnp.asarray(data), (n,) + np.shape(data)[np.ndim(partitions):])
  ids = rows.ndim == 1 and jnp.issubdtype(rows.dtype, jnp.integer)
  known = known_value(data)
  bound = None   # a stitch's size: one past the largest known position
  if ids and known is not None and (known.size == 0 or known.min() >= 0):
    bound = int(known.max()) + 1 if known.size else 0
  src, index = ctx.node.inputs[1]
  outputs = []
  for p in range(k):
    taken = flat == p
    at = jnp.where(taken, jnp.cumsum(taken, dtype=jnp.int32) - 1, n)   # n: out of range, dropped
    out = jnp.full(rows.shape, jnp.iinfo(rows.dtype).max if ids else 0, rows.dtype).at[at].set(rows, mode="drop")
    padded_rows.mark(ctx.runtime, out, padded_rows.INDEX if ids else padded_rows.ROWS, ctx.name, n,
                     key=f"{src}:{index}#{p}", maker="DynamicPartition", partition=(ctx.name, p, k), bound=bound)
    outputs.append(out)
  return outputs


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
