"""Op rules: searches in sorted sequences (LowerBound, UpperBound, Bucketize), InTopK, NthElement,
and ListDiff (the values of one vector missing from another; its output shape depends on them).

Differences from TF: none known (NaN inputs to NthElement order as in a sort: TF leaves it undefined).
`LowerBound`/`UpperBound` assume sorted rows, as TF does (unsorted rows give unspecified results in
both).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import cast, static_value, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _search_rows(sorted_inputs, values, side: str):
  """`searchsorted` of each row of `values` in the same row of `sorted_inputs` ([B, N], [B, M])."""
  if xp(sorted_inputs, values) is np:
    return np.stack([np.searchsorted(s, v, side=side) for s, v in zip(sorted_inputs, values)])
  search = functools.partial(jnp.searchsorted, side=side, method="compare_all")
  return jax.vmap(search)(jnp.asarray(sorted_inputs), jnp.asarray(values))


@register("LowerBound", "UpperBound")
def bound(ctx, sorted_inputs, values):
  side = "left" if ctx.op == "LowerBound" else "right"
  out = _search_rows(sorted_inputs, values, side)
  return cast(out, ctx.attr("out_type", np.int32))


@register("Bucketize")
def bucketize(ctx, x):
  """The index of the bucket `[boundaries[i-1], boundaries[i])` holding each value (int32)."""
  # TF compares `value < boundary` in C++: in double for double inputs, else in float
  compare = np.float64 if np.dtype(x.dtype) == np.float64 else np.float32
  boundaries = np.asarray(ctx.attr("boundaries"), dtype=np.float32).astype(compare)
  m = xp(x)
  return m.searchsorted(boundaries, x.astype(compare), side="right").astype(np.int32)


def _in_top_k(ctx, predictions, targets, k):
  """Whether each row's target class is among its `k` largest predictions (ties count as in).

  As in TF: an out-of-range target or a non-finite target prediction gives False.
  """
  m = xp(predictions, targets, k)
  num_classes = np.shape(predictions)[-1]
  in_range = (targets >= 0) & (targets < num_classes)
  safe = m.where(in_range, targets, 0)
  target_pred = m.take_along_axis(predictions, m.reshape(safe, (-1, 1)).astype(np.int32), axis=1)
  more_probable = m.sum(predictions > target_pred, axis=1)
  return in_range & m.isfinite(target_pred[:, 0]) & (more_probable < k)


@register("InTopKV2")
def in_top_k_v2(ctx, predictions, targets, k):
  return _in_top_k(ctx, predictions, targets, k)


@register("InTopK")
def in_top_k(ctx, predictions, targets):
  return _in_top_k(ctx, predictions, targets, ctx.attr("k"))


@register("ListDiff")
def list_diff(ctx, x, y):
  """The values of `x` not in `y`, in order, and their positions in `x` (`out_idx`)."""
  xs, ys = static_value(x, "x", ctx), static_value(y, "y", ctx)
  keep = ~np.isin(xs, ys)
  return xs[keep], np.flatnonzero(keep).astype(ctx.attr("out_idx", np.int32))


@register("NthElement")
def nth_element(ctx, x, n):
  """The `n`-th smallest (`reverse`: largest) value of each last-axis vector; as in TF, its gradient
  is shared equally by the entries equal to it."""
  n = int(static_value(n, "n", ctx))
  size = np.shape(x)[-1] if np.ndim(x) else 0
  if not 0 <= n < size:
    raise InvalidNodeError(f"NthElement node {ctx.name!r}: n must be in [0, {size}) (the last dimension), got {n}")
  return _nth(x, n, bool(ctx.attr("reverse", False)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2))
def _nth(x, n: int, reverse: bool):
  return jnp.sort(x, axis=-1)[..., -1 - n if reverse else n]


@_nth.defjvp
def _nth_jvp(n, reverse, primals, tangents):
  (x,), (dx,) = primals, tangents
  out = _nth(x, n, reverse)
  ties = (x == out[..., None]).astype(dx.dtype)
  return out, jnp.sum(ties * dx, axis=-1) / jnp.sum(ties, axis=-1)
