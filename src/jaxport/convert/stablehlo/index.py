"""StableHLO indexing ops: gather, scatter, dynamic_slice, dynamic_update_slice.

StableHLO clamps gather and dynamic-slice start indices so the slice fits the operand
(`GatherScatterMode.CLIP`, whose gradient also clamps), and skips scatter updates
whose window leaves the operand (`GatherScatterMode.FILL_OR_DROP`). A scatter whose
update region is `add`, `subtract`, `multiply`, `minimum`, `maximum` (and `and`/`or`
on booleans) or "take the update" maps to the matching `lax.scatter_*`; any other
region, and variadic scatters, run one index at a time in a static-length loop
(order of updates is unspecified in StableHLO, so sequential is one valid order).
Small all-constant operands are evaluated at trace time and stay NumPy.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.elementwise import canon, is_const
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.convert.stablehlo.shape import CONST_LIMIT
from jaxport.errors import StableHLOError

CLIP = lax.GatherScatterMode.CLIP
DROP = lax.GatherScatterMode.FILL_OR_DROP


def _fold(fn, *xs):
  """`fn(*xs)`, run at trace time (a NumPy result) when every input is a small constant."""
  xs = [canon(x) for x in xs]
  if all(is_const(x) for x in xs) and sum(np.size(x) for x in xs) <= CONST_LIMIT:
    with jax.ensure_compile_time_eval():
      return np.asarray(fn(*xs))
  return fn(*xs)


def _index_last(indices, index_vector_dim: int, batching_dims):
  """Indices with the index vector as their last axis, and `batching_dims` renumbered to match."""
  rank = np.ndim(indices)
  xp = np if is_const(indices) else jnp
  if index_vector_dim == rank:
    indices = xp.expand_dims(indices, -1)
  elif index_vector_dim != rank - 1:
    indices = xp.moveaxis(indices, index_vector_dim, -1)
  batching = tuple(d - 1 if d > index_vector_dim else d for d in batching_dims)
  return indices, batching


# --------------------------------------------------------------------------- gather

@handler("stablehlo.gather")
def gather(ctx, operand, start_indices):
  return _gather(ctx, operand, start_indices, ctx.attr("slice_sizes"))


@handler("stablehlo.dynamic_gather")
def dynamic_gather(ctx, operand, start_indices, slice_sizes):
  if not is_const(slice_sizes):
    raise StableHLOError(f"stablehlo.dynamic_gather in module {ctx.call.name!r}: the slice sizes depend on "
                         "traced values; jaxport needs them known when the function is traced")
  return _gather(ctx, operand, start_indices, np.reshape(slice_sizes, -1))


def _gather(ctx, operand, start_indices, slice_sizes):
  dn = ctx.attr("dimension_numbers")
  indices, idx_batching = _index_last(start_indices, dn["index_vector_dim"], dn["start_indices_batching_dims"])
  dnums = lax.GatherDimensionNumbers(
      offset_dims=tuple(dn["offset_dims"]), collapsed_slice_dims=tuple(dn["collapsed_slice_dims"]),
      start_index_map=tuple(dn["start_index_map"]), operand_batching_dims=tuple(dn["operand_batching_dims"]),
      start_indices_batching_dims=idx_batching)
  sizes = tuple(int(s) for s in slice_sizes)
  sorted_ = bool(ctx.attrs.get("indices_are_sorted", False))
  return _fold(lambda x, i: lax.gather(x, i, dnums, sizes, indices_are_sorted=sorted_, mode=CLIP),
               operand, indices)


# --------------------------------------------------------------------------- scatter

# Single-op update regions: op name -> (lax function, whether operand order matters).
_COMBINERS = {
    "stablehlo.add": (lax.scatter_add, False), "stablehlo.multiply": (lax.scatter_mul, False),
    "stablehlo.minimum": (lax.scatter_min, False), "stablehlo.maximum": (lax.scatter_max, False),
    "stablehlo.subtract": (lax.scatter_sub, True),
}
# On booleans, add and or are logical or (max); multiply and and are logical and (min).
_BOOL_COMBINERS = {"stablehlo.or": lax.scatter_max, "stablehlo.add": lax.scatter_max,
                   "stablehlo.maximum": lax.scatter_max, "stablehlo.and": lax.scatter_min,
                   "stablehlo.multiply": lax.scatter_min, "stablehlo.minimum": lax.scatter_min}


def _combiner(block, dtype):
  """The lax scatter function a one-operand update region computes, "keep", or None."""
  if len(block.args) != 2 or len(block.returns) != 1:
    return None
  a, b = block.args
  if not block.ops:
    return lax.scatter if block.returns == [b] else "keep" if block.returns == [a] else None
  if len(block.ops) != 1 or block.ops[0].results != block.returns:
    return None
  op = block.ops[0]
  if np.dtype(dtype) == np.bool_:
    return _BOOL_COMBINERS.get(op.name) if sorted(op.operands) == sorted([a, b]) else None
  if op.name in _COMBINERS:
    fn, ordered = _COMBINERS[op.name]
    if op.operands == [a, b] or (not ordered and op.operands == [b, a]):
      return fn
  return None


@handler("stablehlo.scatter")
def scatter(ctx, *args):
  n = len(args) // 2
  operands, scatter_indices, updates = list(args[:n]), args[n], list(args[n + 1:])
  dn = ctx.attr("scatter_dimension_numbers")
  indices, idx_batching = _index_last(scatter_indices, dn["index_vector_dim"],
                                      dn["scatter_indices_batching_dims"])
  dnums = lax.ScatterDimensionNumbers(
      update_window_dims=tuple(dn["update_window_dims"]), inserted_window_dims=tuple(dn["inserted_window_dims"]),
      scatter_dims_to_operand_dims=tuple(dn["scattered_dims_to_operand_dims"]),
      operand_batching_dims=tuple(dn["input_batching_dims"]), scatter_indices_batching_dims=idx_batching)
  sorted_ = bool(ctx.attrs.get("indices_are_sorted", False))
  unique = bool(ctx.attrs.get("unique_indices", False))
  fn = _combiner(ctx.region_block(0), ctx.result_types[0].dtype) if n == 1 else None
  if fn == "keep":
    return operands
  if fn is not None:
    return [_fold(lambda x, i, u: fn(x, i, u, dnums, indices_are_sorted=sorted_, unique_indices=unique,
                                     mode=DROP), operands[0], indices, updates[0])]
  return _scatter_loop(ctx, operands, canon(indices), [canon(u) for u in updates], dnums)


def _scatter_loop(ctx, operands, indices, updates, dnums):
  """A scatter with any update region, one index vector at a time."""
  region = ctx.region(0)
  # Batching dims become explicit index components (an iota along the paired indices axis).
  batch_shape = np.shape(indices)[:-1]
  extra = [lax.broadcasted_iota(jnp.asarray(indices).dtype, batch_shape + (1,), d)
           for d in dnums.scatter_indices_batching_dims]
  if extra:
    indices = lax.concatenate([jnp.asarray(indices)] + extra, len(batch_shape))
  inserted = tuple(sorted(dnums.inserted_window_dims + dnums.operand_batching_dims))
  index_map = tuple(dnums.scatter_dims_to_operand_dims) + tuple(dnums.operand_batching_dims)
  count = int(np.prod(batch_shape))
  if count == 0:
    return list(operands)
  indices = jnp.reshape(jnp.asarray(indices), (count, np.shape(indices)[-1]))
  # Updates: the scatter dims first (flattened), then the window dims.
  window = tuple(dnums.update_window_dims)
  scatter_dims = [d for d in range(np.ndim(updates[0])) if d not in window]
  updates = [jnp.reshape(jnp.transpose(u, scatter_dims + list(window)),
                         (count,) + tuple(np.shape(u)[d] for d in window)) for u in updates]
  window_shape = tuple(np.shape(updates[0])[1:])
  rank = np.ndim(operands[0])
  sizes, it = [], iter(window_shape)
  for d in range(rank):
    sizes.append(1 if d in inserted else next(it))
  offset = tuple(range(1, 1 + len(window_shape)))
  g_dnums = lax.GatherDimensionNumbers(offset_dims=offset, collapsed_slice_dims=inserted, start_index_map=index_map)
  s_dnums = lax.ScatterDimensionNumbers(update_window_dims=offset, inserted_window_dims=inserted,
                                        scatter_dims_to_operand_dims=index_map)
  combine = jax.vmap(lambda *xs: tuple(jnp.asarray(canon(r)) for r in region(*xs)))

  def step(i, values):
    index = lax.dynamic_slice_in_dim(indices, i, 1)
    current = [lax.gather(v, index, g_dnums, tuple(sizes), mode=CLIP) for v in values]
    update = [lax.dynamic_slice_in_dim(u, i, 1) for u in updates]
    flat = [jnp.reshape(x, (-1,)) for x in current + update]
    new = combine(*flat)
    return tuple(lax.scatter(v, index, jnp.reshape(x, np.shape(u)).astype(v.dtype), s_dnums, mode=DROP)
                 for v, x, u in zip(values, new, update))

  values = tuple(jnp.asarray(canon(v)) for v in operands)
  return list(lax.fori_loop(0, count, step, values))


# --------------------------------------------------------------------------- dynamic slices

def _starts(operand_shape, sizes, starts):
  """Start indices clamped into [0, dim - size] as StableHLO does, as int32 (NumPy where constant)."""
  out = []
  for start, dim, size in zip(starts, operand_shape, sizes):
    hi = dim - size
    if is_const(start):
      out.append(np.int32(min(max(int(np.asarray(start)), 0), hi)))
    else:
      start = canon(start)
      dtype = jnp.asarray(start).dtype
      if jnp.issubdtype(dtype, jnp.unsignedinteger):
        start = lax.min(start, jnp.asarray(hi, dtype))
      else:
        start = lax.clamp(jnp.asarray(0, dtype), start, jnp.asarray(hi, dtype))
      out.append(lax.convert_element_type(start, np.int32))
  if not all(is_const(s) for s in out):
    out = [jnp.asarray(s, np.int32) for s in out]
  return out


@handler("stablehlo.dynamic_slice")
def dynamic_slice(ctx, operand, *starts):
  sizes = tuple(int(s) for s in ctx.attr("slice_sizes"))
  starts = _starts(np.shape(operand), sizes, starts)
  if is_const(operand) and all(is_const(s) for s in starts):
    return operand[tuple(slice(int(s), int(s) + n) for s, n in zip(starts, sizes))]
  return lax.dynamic_slice(canon(operand), starts, sizes, allow_negative_indices=False)


@handler("stablehlo.dynamic_update_slice")
def dynamic_update_slice(ctx, operand, update, *starts):
  starts = _starts(np.shape(operand), np.shape(update), starts)
  if is_const(operand) and is_const(update) and all(is_const(s) for s in starts):
    out = np.array(operand)
    out[tuple(slice(int(s), int(s) + n) for s, n in zip(starts, np.shape(update)))] = update
    return out
  operand = canon(operand)
  update = jnp.asarray(canon(update), jnp.asarray(operand).dtype)
  return lax.dynamic_update_slice(operand, update, starts, allow_negative_indices=False)
