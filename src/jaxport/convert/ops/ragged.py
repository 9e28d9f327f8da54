"""Op rules: the kernels behind `tf.RaggedTensor` (`RaggedTensorToTensor`, `RaggedGather`, `RaggedRange`).

A ragged tensor is its flat values and, per ragged dimension, a row partition (row splits, or value
row ids with the number of rows). `to_tensor()` with a known output shape takes traced partitions and
values, so it runs under jit; without one, the padded width is the longest row, so the partitions must
be known (constants, or a call without jit). `RaggedGather` and `RaggedRange` produce as many values as
the rows they pick or the ranges hold: their indices, splits and bounds must be known; the gathered
values may be traced (gradients flow to them). Known inputs are checked like TF's CPU kernels check them.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import jax_dtype, static_value, text, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _splits_of(ctx, kind: str, partition, nrows: int):
  """A partition as row splits (length nrows + 1), traced or known."""
  if kind == "ROW_SPLITS":
    return partition
  if kind == "VALUE_ROWIDS":   # sorted row ids: the splits are their running count
    m = xp(partition)
    if m is np:
      counts = np.zeros(nrows + 1, partition.dtype)
      np.add.at(counts, partition + 1, 1)
    else:
      counts = jnp.zeros(nrows + 1, partition.dtype).at[partition + 1].add(1)
    return m.cumsum(counts).astype(partition.dtype)
  raise NotImplementedError(f"{ctx.op} node {ctx.name!r}: row partition type {kind!r} is not supported "
                            "(ROW_SPLITS, FIRST_DIM_SIZE and VALUE_ROWIDS are)")


def _partitions(ctx, partitions) -> list:
  """The row splits of each ragged dimension, outermost first."""
  kinds = [text(k) for k in ctx.attr("row_partition_types")]
  tensors = list(partitions)
  nrows = None
  if kinds and kinds[0] == "FIRST_DIM_SIZE":
    nrows = int(static_value(tensors[0], "the first dimension's size", ctx))
    kinds, tensors = kinds[1:], tensors[1:]
  splits = []
  for kind, tensor in zip(kinds, tensors):
    if kind == "VALUE_ROWIDS" and nrows is None:   # rows of this level: the items of the one above
      nrows = int(static_value(splits[-1], "row splits", ctx)[-1])
    splits.append(_splits_of(ctx, kind, tensor, nrows))
    nrows = np.shape(tensor)[0] if kind == "VALUE_ROWIDS" else None
  return splits


def _rows_and_columns(splits, count: int):
  """For each of `count` items, its row under `splits` and its position in that row."""
  m = xp(splits)
  positions = m.arange(count, dtype=splits.dtype)
  rows = m.searchsorted(splits, positions, side="right") - 1
  return rows, positions - splits[m.clip(rows, 0, np.shape(splits)[0] - 1)]


def _coordinates(splits, count: int) -> list:
  """The dense coordinate of each of `count` flat values: its outermost row, then its position in
  its row at each ragged level (outermost first)."""
  splits = [xp(*splits).asarray(x) for x in splits]   # one of them traced: all of them
  columns, item = [], None   # item: per value, which item of the current level holds it
  for level in reversed(range(len(splits))):
    items = count if level == len(splits) - 1 else np.shape(splits[level + 1])[0] - 1
    rows, cols = _rows_and_columns(splits[level], items)
    columns.insert(0, cols if item is None else cols[item])
    item = rows if item is None else rows[item]
  return [item] + columns


@register("RaggedTensorToTensor")
def ragged_to_tensor(ctx, shape, values, default_value, *partitions):
  """The dense form: row r's k-th item at [r, k], `default_value` elsewhere; rows and items past the
  requested shape are cut off (TF)."""
  splits = _partitions(ctx, partitions)
  ragged = len(splits)
  wanted = [int(d) for d in np.asarray(static_value(shape, "shape", ctx)).reshape(-1)]
  rank = ragged + np.ndim(values)
  wanted = [-1] * rank if len(wanted) != rank or np.ndim(shape) == 0 else wanted
  dims = [wanted[0] if wanted[0] >= 0 else np.shape(splits[0])[0] - 1]
  for level, s in enumerate(splits):   # padded widths: the longest row where not requested
    if wanted[level + 1] >= 0:
      dims.append(wanted[level + 1])
    else:
      known = static_value(s, "row partition (the padded width is the longest row)", ctx)
      dims.append(int(np.max(np.diff(known), initial=0)))
  inner = list(np.shape(values)[1:])
  for k, d in enumerate(inner):
    if wanted[ragged + 1 + k] not in (-1, d):
      raise InvalidNodeError(f"RaggedTensorToTensor node {ctx.name!r}: shape {wanted} does not match the values' "
                             f"inner shape {inner}")
  coordinates = _coordinates(splits, np.shape(values)[0])
  m = xp(values, default_value, *splits)
  out_shape = tuple(dims) + tuple(inner)
  base = m.broadcast_to(m.asarray(default_value, values.dtype if m is np else jax_dtype(values.dtype)), out_shape)
  inside = m.ones(np.shape(values)[0], bool)
  for axis, c in enumerate(coordinates):
    inside = inside & (c < out_shape[axis]) & (c >= 0)
  if m is np:
    out = np.array(base, copy=True)
    keep = np.asarray(inside)
    out[tuple(np.asarray(c)[keep] for c in coordinates)] = np.asarray(values)[keep]
    return out
  index = tuple(jnp.where(inside, c, out_shape[axis]) for axis, c in enumerate(coordinates))
  return jnp.asarray(base).at[index].set(jnp.asarray(values), mode="drop")


@register("RaggedGather")
def ragged_gather(ctx, *inputs):
  """Rows of a ragged tensor picked by `indices` (any rank: its outer axes become uniform ragged ones)."""
  *nested, values, indices = inputs
  picked = static_value(indices, "indices", ctx).astype(np.int64)
  splits = [static_value(s, "params_nested_splits", ctx).astype(np.int64) for s in nested]
  rows = len(splits[0]) - 1
  if picked.size and (picked.min() < 0 or picked.max() >= rows):
    bad = picked[(picked < 0) | (picked >= rows)][0]
    raise InvalidNodeError(f"RaggedGather node {ctx.name!r}: index {bad} is not in [0, {rows})")
  split_dtype = np.dtype(nested[0].dtype)
  out = []   # the outer axes of `indices`: uniform rows of shape[k + 1] items each
  for k in range(picked.ndim - 1):
    out.append(np.arange(int(np.prod(picked.shape[:k + 1])) + 1) * picked.shape[k + 1])
  positions = picked.reshape(-1)
  for s in splits:   # each level: the picked items' rows, as new splits and the next level's items
    starts, lengths = s[positions], s[positions + 1] - s[positions]
    out.append(np.concatenate([[0], np.cumsum(lengths)]))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    positions = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
  return [o.astype(split_dtype) for o in out] + [xp(values).take(values, positions, axis=0)]


@register("RaggedRange")
def ragged_range(ctx, starts, limits, deltas):
  """Row i is range(starts[i], limits[i], deltas[i]) (scalars broadcast)."""
  start, limit, delta = np.broadcast_arrays(*(static_value(x, name, ctx) for x, name in
                                              ((starts, "starts"), (limits, "limits"), (deltas, "deltas"))))
  if np.any(delta == 0):
    raise InvalidNodeError(f"RaggedRange node {ctx.name!r}: a delta is 0")
  if np.issubdtype(start.dtype, np.integer):   # C++: ceil of an exact quotient, never negative
    span = np.abs(limit.astype(np.int64) - start)
    sizes = np.where((limit > start) == (delta > 0), (span + np.abs(delta) - 1) // np.abs(delta), 0)
  else:
    sizes = np.where((limit > start) == (delta > 0), np.ceil(np.abs((limit - start) / delta)), 0).astype(np.int64)
  sizes = sizes.reshape(-1).astype(np.int64)
  rows = np.repeat(np.arange(sizes.size), sizes)
  steps = np.arange(int(sizes.sum())) - np.repeat(np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes)
  values = (start.reshape(-1)[rows] + steps.astype(start.dtype) * delta.reshape(-1)[rows]).astype(start.dtype)
  split_dtype = ctx.attr("Tsplits", np.int64)
  return np.concatenate([[0], np.cumsum(sizes)]).astype(split_dtype), values
