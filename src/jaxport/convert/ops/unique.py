"""Op rules: `Unique*`, the distinct values of a tensor in order of first occurrence.

Their output size is the number of distinct values. With concrete inputs (constants, or a call
without jit) the outputs have TF's shapes. Under jit, a vector of integer ids is deduplicated
into outputs padded to its length (`convert/padded_rows.py` says which uses that allows:
optimizers summing a sparse gradient per id, then scattering it into a variable, or a lookup
deduplicated first); other traced inputs raise `DynamicShapeError`.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxport.convert import padded_rows
from jaxport.convert.ops._util import known_value, static_value
from jaxport.convert.ops.array import _axis, _static
from jaxport.convert.registry import register


def _unique(ctx, x, axis: int | None):
  """Unique slices in order of first occurrence (TF), their inverse index and counts."""
  out_idx = ctx.attr("out_idx", np.int32)
  if known_value(x) is None and np.ndim(x) == 1 and axis in (None, 0) and jnp.issubdtype(x.dtype, jnp.integer):
    return _padded_unique(ctx, x, out_idx)
  values = static_value(x, "input values", ctx)
  _, first, inverse, counts = np.unique(values, return_index=True, return_inverse=True,
                                        return_counts=True, axis=axis)
  order = np.argsort(first, kind="stable")
  rank_ = np.empty_like(order)
  rank_[order] = np.arange(len(order))
  unique = np.take(values, first[order], axis=0 if axis is None else axis)
  return unique, rank_[inverse.reshape(-1)].astype(out_idx), counts[order].astype(out_idx)


def _padded_unique(ctx, ids, out_idx):
  """`_unique` of traced integer ids, its outputs padded to len(ids): the padding ids are the
  dtype's largest value (out of range of any variable), their counts zero."""
  source = padded_rows.padding_of(ctx.runtime, ids)   # ids padded before (a partition's)
  n = ids.shape[0]
  fill = jnp.iinfo(ids.dtype).max
  if n == 0:
    unique, idx, counts = jnp.zeros(0, ids.dtype), jnp.zeros(0, out_idx), jnp.zeros(0, out_idx)
  else:
    positions = jnp.arange(n, dtype=jnp.int32)
    by_value = jnp.argsort(ids, stable=True)
    sorted_ids = ids[by_value]
    starts = jnp.concatenate([jnp.ones(1, bool), sorted_ids[1:] != sorted_ids[:-1]])
    group = jnp.zeros(n, jnp.int32).at[by_value].set(jnp.cumsum(starts, dtype=jnp.int32) - 1)
    # each group's first position; the unused groups (past the count) keep int32's max, so last
    first = jnp.full(n, jnp.iinfo(jnp.int32).max, jnp.int32).at[group].min(positions)
    by_first = jnp.argsort(first, stable=True)
    rank = jnp.zeros(n, jnp.int32).at[by_first].set(positions)
    used = first[by_first] < n
    unique = jnp.where(used, ids[jnp.minimum(first[by_first], n - 1)], fill)
    idx = rank[group].astype(out_idx)
    counts = jnp.zeros(n, out_idx).at[rank[group]].add(1)
  padded_rows.mark(ctx.runtime, unique, padded_rows.INDEX, ctx.name, n)
  padded_rows.mark(ctx.runtime, counts, padded_rows.ROWS, ctx.name, n)
  if source is not None:   # `idx` lines up with the padded ids' rows
    padded_rows.mark_like(ctx.runtime, idx, padded_rows.ROWS, source)
  return unique, idx, counts


@register("Unique", size_bounded=True)
def unique(ctx, x):
  return _unique(ctx, x, None)[:2]


@register("UniqueWithCounts")
def unique_with_counts(ctx, x):
  return _unique(ctx, x, None)


def _unique_axis(ctx, x, axis) -> int | None:
  axes = _static(ctx, axis, "axis")
  if not axes:
    return None
  return _axis(ctx, axes[0], np.ndim(x))


@register("UniqueV2")
def unique_v2(ctx, x, axis):
  return _unique(ctx, x, _unique_axis(ctx, x, axis))[:2]


@register("UniqueWithCountsV2")
def unique_with_counts_v2(ctx, x, axis):
  return _unique(ctx, x, _unique_axis(ctx, x, axis))
