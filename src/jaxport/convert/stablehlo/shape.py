"""StableHLO shape ops: broadcast, reshape, transpose, slice, concatenate, pad, iota, reverse.

The dynamic forms (`dynamic_broadcast_in_dim`, `dynamic_reshape`, `dynamic_iota`, ...)
take their output shape as an operand. Interpreted on concrete inputs, those shape
operands are NumPy constants computed from `get_dimension_size`, so the result
shape is static: a shape-polymorphic module runs at the caller's shapes.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops._util import is_symbolic, shape_value
from jaxport.convert.stablehlo.elementwise import canon, is_const, jax_dtype
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.errors import StableHLOError


def static_shape(ctx, value, what: str) -> tuple[int, ...]:
  if not is_const(value):
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: the {what} depends on traced values; "
                         "jaxport needs it known when the function is traced")
  # a symbolic dim (jax.export shape polymorphism) stays a dimension expression
  return tuple(d if is_symbolic(d) else int(d) for d in np.asarray(value).reshape(-1))


def _result_shape(ctx) -> tuple[int, ...]:
  shape = ctx.result_type.shape
  if any(d is None for d in shape):
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r} has a dynamic result shape {shape}")
  return tuple(shape)


CONST_LIMIT = 1 << 16   # constants up to this many elements stay NumPy


def broadcast_in_dim_to(x, shape, dims):
  if any(map(is_symbolic, shape)):   # NumPy has no symbolic dims
    return lax.broadcast_in_dim(canon(x), tuple(shape), tuple(int(d) for d in dims))
  dims, shape = tuple(int(d) for d in dims), tuple(int(d) for d in shape)
  if is_const(x) and int(np.prod(shape)) <= CONST_LIMIT:
    order = np.argsort(dims)
    x, ordered = np.transpose(x, order), [dims[i] for i in order]
    expanded = np.reshape(x, [np.shape(x)[ordered.index(i)] if i in ordered else 1 for i in range(len(shape))])
    return np.broadcast_to(expanded, shape).copy()
  return lax.broadcast_in_dim(canon(x), shape, dims)


@handler("stablehlo.broadcast_in_dim")
def broadcast_in_dim(ctx, x):
  return broadcast_in_dim_to(x, _result_shape(ctx), ctx.attr("broadcast_dimensions"))


@handler("stablehlo.dynamic_broadcast_in_dim")
def dynamic_broadcast_in_dim(ctx, x, shape):
  return broadcast_in_dim_to(x, static_shape(ctx, shape, "output shape"), ctx.attr("broadcast_dimensions"))


@handler("stablehlo.broadcast")
def broadcast(ctx, x):
  sizes = tuple(ctx.attr("broadcast_sizes"))
  if is_const(x):
    return np.broadcast_to(x, sizes + np.shape(x)).copy()
  return lax.broadcast(x, sizes)


def _reshape(x, shape):
  return np.reshape(x, shape) if is_const(x) else lax.reshape(x, tuple(shape))


@handler("stablehlo.reshape")
def reshape(ctx, x):
  return _reshape(x, _result_shape(ctx))


@handler("stablehlo.dynamic_reshape")
def dynamic_reshape(ctx, x, shape):
  return _reshape(x, static_shape(ctx, shape, "output shape"))


@handler("stablehlo.transpose")
def transpose(ctx, x):
  perm = tuple(ctx.attr("permutation"))
  return np.transpose(x, perm) if is_const(x) else lax.transpose(x, perm)


@handler("stablehlo.slice")
def slice_(ctx, x):
  start, limit = ctx.attr("start_indices"), ctx.attr("limit_indices")
  strides = ctx.attr("strides", None) or [1] * len(start)
  if is_const(x):
    return x[tuple(slice(a, b, s) for a, b, s in zip(start, limit, strides))]
  return lax.slice(x, tuple(start), tuple(limit), tuple(strides))


@handler("stablehlo.real_dynamic_slice")
def real_dynamic_slice(ctx, x, start, limit, strides):
  start, limit, strides = (static_shape(ctx, v, "slice bound") for v in (start, limit, strides))
  return lax.slice(canon(x), start, limit, strides) if not is_const(x) else \
      x[tuple(slice(a, b, s) for a, b, s in zip(start, limit, strides))]


@handler("stablehlo.concatenate")
def concatenate(ctx, *xs):
  axis = ctx.attr("dimension")
  if all(is_const(x) for x in xs):
    return np.concatenate(xs, axis=axis)
  return lax.concatenate([canon(x) for x in xs], axis)


def _pad(x, value, low, high, interior):
  config = list(zip(low, high, interior))
  if is_const(x) and is_const(value) and all(i == 0 and lo >= 0 and hi >= 0 for lo, hi, i in config):
    return np.pad(x, [(lo, hi) for lo, hi, _ in config], constant_values=value)
  return lax.pad(canon(x), canon(value), config)


@handler("stablehlo.pad")
def pad(ctx, x, value):
  return _pad(x, value, ctx.attr("edge_padding_low"), ctx.attr("edge_padding_high"), ctx.attr("interior_padding"))


@handler("stablehlo.dynamic_pad")
def dynamic_pad(ctx, x, value, low, high, interior):
  return _pad(x, value, *(static_shape(ctx, v, "padding") for v in (low, high, interior)))


def _iota(t_dtype, shape, dimension):
  shape = tuple(shape)
  out = np.arange(shape[dimension]).reshape([-1 if i == dimension else 1 for i in range(len(shape))])
  return np.broadcast_to(out, shape).astype(t_dtype)


@handler("stablehlo.iota")
def iota(ctx):
  shape = _result_shape(ctx)
  if int(np.prod(shape)) <= CONST_LIMIT:
    return _iota(ctx.result_type.dtype, shape, ctx.attr("iota_dimension"))
  return lax.broadcasted_iota(jax_dtype(ctx.result_type), shape, ctx.attr("iota_dimension"))


@handler("stablehlo.dynamic_iota")
def dynamic_iota(ctx, shape):
  return _iota(ctx.result_type.dtype, static_shape(ctx, shape, "output shape"), ctx.attr("iota_dimension"))


@handler("stablehlo.reverse")
def reverse(ctx, x):
  dims = tuple(ctx.attr("dimensions"))
  return np.flip(x, dims).copy() if is_const(x) else lax.rev(x, dims)


@handler("stablehlo.get_dimension_size")
def get_dimension_size(ctx, x):
  return shape_value([np.shape(x)[ctx.attr("dimension")]], ctx.result_type.dtype).reshape(())


@handler("stablehlo.set_dimension_size")
def set_dimension_size(ctx, x, size):
  return x


@handler("stablehlo.tuple")
def tuple_(ctx, *xs):
  return [tuple(xs)]


@handler("stablehlo.get_tuple_element")
def get_tuple_element(ctx, t):
  return t[ctx.attr("index")]


@handler("stablehlo.torch_index_select")
def torch_index_select(ctx, x, index):
  dim, batch_dims = ctx.attr("dim"), ctx.attr("batch_dims")
  if batch_dims:
    raise StableHLOError("stablehlo.torch_index_select with batch_dims is not supported")
  return jnp.take(canon(x), canon(index), axis=dim)
