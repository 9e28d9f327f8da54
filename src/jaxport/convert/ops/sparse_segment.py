"""Op rules: sparse segment reductions (`SparseSegmentSum/Mean/SqrtN[WithNumSegments]`) and the
gradients TF writes for them (`...Grad`, dense; `...GradV2`, an `IndexedSlices`).

`tf.nn.embedding_lookup_sparse`, `safe_embedding_lookup_sparse` and feature columns' embedding
columns reduce their looked-up rows so: row `s` of the output combines `data[indices[i]]` over the
`i` where `segment_ids[i] == s`, summed, averaged or divided by the square root of the count.

Without `num_segments` the output has `segment_ids[-1] + 1` rows, so the ids must be known when
tracing (constants, or a call without jit; under jit they raise `DynamicShapeError`). With a constant
`num_segments` the ids may be traced. Known ids and indices are checked like TF's CPU kernels check
them (sorted, in range); traced out-of-range ids are dropped and traced indices clamped, as for
`UnsortedSegmentSum` and `Gather`. 16-bit floats accumulate in float32.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxport.convert import padded_rows
from jaxport.convert.ops._util import known_value, static_value, widened_for_sums, xp
from jaxport.convert.ops.array import _static_int
from jaxport.convert.ops.gather_scatter import _check_bounds, _get, _segment_reduce
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_REDUCTIONS = {"SparseSegmentSum": "sum", "SparseSegmentMean": "mean", "SparseSegmentSqrtN": "sqrtn"}
_WITH_NUM_SEGMENTS = {"SparseSegmentSumWithNumSegments": "sum", "SparseSegmentMeanWithNumSegments": "mean",
                      "SparseSegmentSqrtNWithNumSegments": "sqrtn"}
_GRADS = {"SparseSegmentSumGrad": "sum", "SparseSegmentMeanGrad": "mean", "SparseSegmentSqrtNGrad": "sqrtn"}
_SPARSE_GRADS = {"SparseSegmentSumGradV2": "sum", "SparseSegmentMeanGradV2": "mean",
                 "SparseSegmentSqrtNGradV2": "sqrtn"}
FORWARD = frozenset(_REDUCTIONS) | frozenset(_WITH_NUM_SEGMENTS)


def _vectors(ctx, indices, segment_ids) -> None:
  if np.ndim(indices) != 1 or np.shape(indices) != np.shape(segment_ids):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: indices and segment_ids must be vectors of one length, "
                           f"got shapes {np.shape(indices)} and {np.shape(segment_ids)}")


def _known_sorted_ids(ctx, segment_ids, bound: int | None):
  """Known ids checked as TF checks them (non-negative, not decreasing, under `bound`); traced ids
  with negative ones moved past the last segment, where the scatter drops them."""
  ids = known_value(segment_ids)
  if ids is None:
    return jnp.where(segment_ids < 0, bound, segment_ids)
  ids = ids.astype(np.int64)
  if ids.size and ids[0] < 0:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: segment id {ids[0]} is negative")
  if np.any(np.diff(ids) < 0):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: segment ids are not increasing: {ids}")
  if bound is not None and ids.size and ids[-1] >= bound:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: segment id {ids[-1]} is not below num_segments={bound}")
  return ids


def _segment_divisor(how: str, ids, segments: int, dtype):
  """What each segment is divided by: its count (mean) or the count's square root (sqrtn); 1 where
  it is empty. Per segment, shaped to broadcast over its rows' trailing axes by the caller."""
  m = xp(ids)
  counts = m.maximum(_segment_reduce(m.ones(np.shape(ids), dtype), ids, segments, "add"), 1)
  return counts if how == "mean" else m.sqrt(counts)


def _per_row(factor, ndim: int):
  return xp(factor).reshape(factor, (-1,) + (1,) * (ndim - 1))


@register(*_REDUCTIONS, *_WITH_NUM_SEGMENTS)
def sparse_segment(ctx, data, indices, segment_ids, num_segments=None):
  how = _REDUCTIONS.get(ctx.op) or _WITH_NUM_SEGMENTS[ctx.op]
  _vectors(ctx, indices, segment_ids)
  if num_segments is None:
    ids = _known_sorted_ids(ctx, static_value(segment_ids, "segment_ids", ctx), None)
    segments = int(ids[-1]) + 1 if ids.size else 0
  else:
    segments = _static_int(ctx, num_segments, "num_segments")
    ids = _known_sorted_ids(ctx, segment_ids, segments)
  _check_bounds(ctx, indices, np.shape(data)[0])
  rows = widened_for_sums(_get(data, (indices,), zeros_out_of_range=False))
  total = _segment_reduce(rows, ids, segments, "add")
  if how != "sum":   # TF's forward kernels divide; their gradients multiply by the reciprocal
    total = total / _per_row(_segment_divisor(how, ids, segments, total.dtype), np.ndim(total))
  return total.astype(data.dtype)


def _scaled_rows_per_entry(ctx, how: str, grad, segment_ids):
  """grad[segment_ids[i]] times segment i's factor: what entry i's row of `data` receives."""
  segments = np.shape(grad)[0]
  ids = known_value(segment_ids)
  if ids is not None and ids.size and (ids.min() < 0 or ids.max() >= segments):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: segment ids must be in [0, {segments}) (the gradient's "
                           f"rows), got values in [{ids.min()}, {ids.max()}]")
  if ids is None:   # traced negative ids: past the last segment, so they count nowhere and read zeros
    segment_ids = jnp.where(segment_ids < 0, segments, segment_ids)
  grad = widened_for_sums(grad)
  if how != "sum":
    grad = grad * _per_row(1 / _segment_divisor(how, segment_ids, segments, grad.dtype), np.ndim(grad))
  return _get(grad, (segment_ids,), zeros_out_of_range=True)


@register(*_GRADS)
def sparse_segment_grad(ctx, grad, indices, segment_ids, output_dim0):
  """The dense gradient of `data`: output_dim0 rows, row indices[i] summing entry i's share."""
  _vectors(ctx, indices, segment_ids)
  rows = _static_int(ctx, output_dim0, "output_dim0")
  _check_bounds(ctx, indices, rows)
  per_entry = _scaled_rows_per_entry(ctx, _GRADS[ctx.op], grad, segment_ids)
  return _segment_reduce(per_entry, indices, rows, "add").astype(grad.dtype)


@register(*_SPARSE_GRADS)
def sparse_segment_grad_v2(ctx, grad, indices, segment_ids, dense_output_dim0):
  """The gradient as an IndexedSlices: a row per distinct index, and the sorted distinct indices.

  Their number is known only at run time: under jit both outputs are padded to len(indices) like a
  padded `Unique` (padding index: the dtype's largest value, rows of zeros; `padded_rows`)."""
  _vectors(ctx, indices, segment_ids)
  _check_bounds(ctx, indices, _static_int(ctx, dense_output_dim0, "dense_output_dim0"))
  per_entry = _scaled_rows_per_entry(ctx, _SPARSE_GRADS[ctx.op], grad, segment_ids)
  known = known_value(indices)
  if known is not None:
    unique, group = np.unique(known, return_inverse=True)
    values = _segment_reduce(per_entry, group.reshape(-1), len(unique), "add")
    return values.astype(grad.dtype), unique.astype(known.dtype)
  n = np.shape(indices)[0]
  order = jnp.argsort(indices)
  in_order = indices[order]
  starts = jnp.concatenate([jnp.ones(min(n, 1), bool), in_order[1:] != in_order[:-1]])
  group = jnp.cumsum(starts, dtype=jnp.int32) - 1
  unique = jnp.full(n, jnp.iinfo(indices.dtype).max, indices.dtype).at[group].set(in_order)
  values = _segment_reduce(per_entry[order], group, n, "add").astype(grad.dtype)
  padded_rows.mark(ctx.runtime, unique, padded_rows.INDEX, ctx.name, n)
  padded_rows.mark(ctx.runtime, values, padded_rows.ROWS, ctx.name, n)
  return values, unique
