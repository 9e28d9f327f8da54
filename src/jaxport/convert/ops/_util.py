"""Helpers shared by op rules."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport import xla_options
from jaxport.errors import DynamicShapeError


def is_concrete(x) -> bool:
  """A trace-time constant: NumPy data that stays NumPy through shape arithmetic."""
  return isinstance(x, (np.ndarray, np.generic, int, float, bool))


def xp(*arrays):
  """NumPy when every input is a trace-time constant, else jax.numpy.

  Rules that compute with `xp(...)` keep constant shape arithmetic in NumPy, so
  reshapes and slices stay static under jit.
  """
  return np if all(is_concrete(a) for a in arrays) else jnp


def widened_for_sums(x):
  """A 16-bit float `x` as float32, for sums TF's kernels accumulate in float32 (other dtypes: `x`).
  On XLA:CPU the widening sits behind `xla_options.fusion_boundary`: a YNNPACK fusion folds the
  convert into the reduction after it and sums in 16 bits (bfloat16 column sums of 32 rows: 2 ulps)."""
  if np.dtype(x.dtype).itemsize != 2 or not jnp.issubdtype(x.dtype, jnp.floating):
    return x
  return xla_options.fusion_boundary(x.astype(np.float32))


def text(value) -> str:
  """A string attribute as `str` (TF's GraphDef holds them as bytes)."""
  return value.decode() if isinstance(value, bytes) else str(value)


def static_value(x, what: str = "value", ctx=None) -> np.ndarray:
  """The NumPy value of an input that decides a shape (or another trace-time property).

  NumPy constants qualify, and so do concrete jax Arrays: the converted function then runs
  without jit, op by op. A tracer (jit, vmap, a TF loop body) raises `DynamicShapeError`
  naming `ctx`'s node and the operand `what`.
  """
  value = known_value(x)
  if value is None:
    node = ctx.name if ctx is not None else None
    raise DynamicShapeError(getattr(ctx, "op", None), node, what)
  return value


def known_value(x) -> np.ndarray | None:
  """The NumPy value of `x` when it is known now (a constant, or a concrete jax Array), else None."""
  if is_concrete(x) or (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)):
    return np.asarray(x)
  return None   # a tracer, or a placeholder (e.g. control flow's unknown loop values)


def static_ints(x, what: str = "value", ctx=None) -> list[int]:
  """Ints; a symbolic dim (jax.export shape polymorphism) stays a dimension expression."""
  return [v if is_symbolic(v) else int(v) for v in np.asarray(static_value(x, what, ctx)).reshape(-1)]


def is_symbolic(d) -> bool:
  """A jax.export symbolic dimension (e.g. 'b' when jax2tf traces with polymorphic_shapes)."""
  return not isinstance(d, (int, np.integer)) and jax.export.is_symbolic_dim(d)


def shape_value(dims, dtype) -> np.ndarray:
  """A shape as a NumPy constant; symbolic dims make an object array of dimension expressions,
  which NumPy shape arithmetic (slice, stack, add, mul) keeps symbolic and jnp.asarray stages."""
  dims = tuple(dims)
  if any(is_symbolic(d) for d in dims):
    return np.asarray(dims, dtype=object)
  return np.asarray(dims, dtype=dtype)


def has_symbolic(x) -> bool:
  """An object array holding symbolic dims (a shape_value), not strings."""
  return isinstance(x, np.ndarray) and x.dtype == object and any(map(is_symbolic, x.flat))


def stage_dims(x, dtype=np.int32):
  """An object array of (symbolic) dims as a jax int array (jax.export stages the dims)."""
  return jnp.asarray(np.asarray(x).tolist(), dtype=dtype)


def cast(x, dtype):
  """`x.astype(dtype)`, keeping constants as NumPy (in TF's width: int64 stays int64)."""
  if is_concrete(x):
    if has_symbolic(x):   # symbolic dims: an int stays symbolic, else staged
      return x if np.issubdtype(np.dtype(dtype), np.integer) else stage_dims(x).astype(jax_dtype(dtype))
    return np.asarray(x).astype(dtype)
  return x.astype(jax_dtype(dtype))


def jax_dtype(dtype) -> np.dtype:
  """The dtype JAX holds `dtype` as (int64 is int32 while x64 is off); asking for that one skips JAX's
  'not available' warning on every 64-bit TF attribute."""
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def as_array(x):
  """NumPy stays NumPy; everything else goes through jnp.asarray."""
  return np.asarray(x) if is_concrete(x) else jnp.asarray(x)


# XLA rewrites `x / constant` as `x * (1 / constant)`, and its CPU backend fuses `a * b + c` into
# an FMA; TF's kernels do neither. Where one rounding decides a branch (a pixel index, a box
# inside the image, an IoU at its threshold), these keep TF's float arithmetic under jit.

def rounded_product(product):
  """`product`, rounded to its dtype before any later add: XLA cannot fuse through the select."""
  return jnp.where(product == product, product, jnp.nan)


def divide_as_written(x, constant):
  """`x / constant`, divided (not multiplied by a rounded reciprocal) under jit too."""
  return x / jax.lax.optimization_barrier(jnp.full_like(x, constant))
