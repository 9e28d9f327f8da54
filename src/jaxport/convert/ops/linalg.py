"""Op rules: matrix products."""
from __future__ import annotations

import functools

import jax
import numpy as np

from jaxport import xla_options
from jaxport.convert.ops import softmax_product
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


def _product(ctx, a, b, transpose_a: bool, transpose_b: bool, conjugate: bool, out_dtype,
             fusion_boundary: bool = False):
  """op(a) @ op(b); a Softmax operand whose axis the product sums over is normalised after it.
  `fusion_boundary`: `a` goes through `xla_options.fusion_boundary` first."""
  if a.dtype == out_dtype == b.dtype:
    product = functools.partial(_matmul, out_dtype=out_dtype)
    if not transpose_a and softmax_product.factors_of(ctx, a) is not None:
      return softmax_product.matmul(ctx, a, _matrix_transpose(b, conjugate) if transpose_b else b, product)
    if transpose_b and softmax_product.factors_of(ctx, b) is not None:
      return softmax_product.matmul_transposed_b(
          ctx, _matrix_transpose(a, conjugate) if transpose_a else a, b, product)
  if fusion_boundary:
    a = xla_options.fusion_boundary(a)
  if transpose_a:
    a = _matrix_transpose(a, conjugate)
  if transpose_b:
    b = _matrix_transpose(b, conjugate)
  return _matmul(a, b, out_dtype)


@register("MatMul", size_bounded=True)
def matmul(ctx, a, b):
  """A dense layer: its input is a fusion boundary for XLA:CPU (`xla_options.fusion_boundary`)."""
  return _product(ctx, a, b, ctx.attr("transpose_a", False), ctx.attr("transpose_b", False),
                  conjugate=False, out_dtype=a.dtype, fusion_boundary=True)


@register("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", size_bounded=True)
def batch_matmul(ctx, x, y):
  """`adj_x`/`adj_y` take the conjugate transpose; V3 multiplies in (and returns) `Tout`."""
  return _product(ctx, x, y, ctx.attr("adj_x", False), ctx.attr("adj_y", False), conjugate=True,
                  out_dtype=ctx.attr("Tout", x.dtype))


@register("Einsum", size_bounded=True)
def einsum(ctx, *operands):
  equation = ctx.attr("equation")
  deferred = softmax_product.einsum(ctx, equation, operands)
  if deferred is not None:
    return _to_dtype(deferred, operands[0].dtype)
  m = xp(*operands)
  return _to_dtype(m.einsum(equation, *operands), operands[0].dtype)
