"""Op rules: matrix products."""
from __future__ import annotations

import jax
import numpy as np

from jaxport.convert.ops._util import is_concrete, xp
from jaxport.convert.registry import register


def _to_dtype(x, dtype):
  """`x` as `dtype` (JAX's canonical width for traced values), without a copy when it already is."""
  if not is_concrete(x):
    dtype = jax.dtypes.canonicalize_dtype(dtype)
  return x if x.dtype == dtype else x.astype(dtype)


def _matrix_transpose(x, conjugate: bool):
  m = xp(x)
  x = m.swapaxes(x, -1, -2)
  return m.conj(x) if conjugate and np.issubdtype(x.dtype, np.complexfloating) else x


def _matmul(a, b, out_dtype):
  """`a @ b` with batch broadcasting; constants stay NumPy."""
  m = xp(a, b)
  return _to_dtype(m.matmul(_to_dtype(a, out_dtype), _to_dtype(b, out_dtype)), out_dtype)


@register("MatMul")
def matmul(ctx, a, b):
  if ctx.attr("transpose_a", False):
    a = _matrix_transpose(a, conjugate=False)
  if ctx.attr("transpose_b", False):
    b = _matrix_transpose(b, conjugate=False)
  return _matmul(a, b, a.dtype)


@register("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
def batch_matmul(ctx, x, y):
  """`adj_x`/`adj_y` take the conjugate transpose; V3 multiplies in (and returns) `Tout`."""
  if ctx.attr("adj_x", False):
    x = _matrix_transpose(x, conjugate=True)
  if ctx.attr("adj_y", False):
    y = _matrix_transpose(y, conjugate=True)
  return _matmul(x, y, ctx.attr("Tout", x.dtype))


@register("Einsum")
def einsum(ctx, *operands):
  m = xp(*operands)
  return _to_dtype(m.einsum(ctx.attr("equation"), *operands), operands[0].dtype)
