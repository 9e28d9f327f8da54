"""Op rules: allocating (Empty) and updating rows "in place" (InplaceAdd, InplaceSub,
InplaceUpdate). JAX arrays are immutable, so the in-place ops return an updated copy.

Differences from TF: `Empty` always returns zeros (TF leaves memory uninitialized
unless `init=True`); out-of-range rows are dropped (TF raises); `InplaceUpdate` with
a repeated row keeps an unspecified one of its updates (TF: the last).
"""
from __future__ import annotations

import numpy as np

from jaxport.convert.ops._util import static_ints, xp
from jaxport.convert.ops.gather_scatter import _scatter
from jaxport.convert.registry import register


@register("Empty")
def empty(ctx, shape):
  return np.zeros(static_ints(shape, "shape", ctx), dtype=ctx.attr("dtype"))


_INPLACE = {"InplaceAdd": "add", "InplaceSub": "sub", "InplaceUpdate": "set"}


@register(*_INPLACE)
def inplace(ctx, x, rows, values):
  """`x` with `values[k]` combined into row `rows[k]`, for each k."""
  m = xp(rows, values)
  indices = m.reshape(rows, (-1, 1))
  return _scatter(x, indices, m.reshape(values, (-1,) + np.shape(x)[1:]), _INPLACE[ctx.op])
