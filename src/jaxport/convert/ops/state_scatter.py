"""Op rules: scatters and slice assignments into resource variables (`ResourceScatter*`,
`ResourceScatterNd*`, `ResourceStridedSliceAssign`); the results reach the caller in `new_params`.

Differences from TF are those of the scatters in `gather_scatter.py`: out-of-range
indices are dropped (TF raises on CPU), negative ones wrap, and
`ResourceScatterUpdate` with duplicate indices keeps an unspecified one of them (TF too).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops.array import _traced_windows
from jaxport.convert.ops.gather_scatter import _scatter
from jaxport.convert.registry import register


def _combined(var, index_nd, updates, how: str):
  """`var` with `updates` combined in at `index_nd` ([..., K] indices)."""
  if how == "div":   # `_scatter` has no division
    index = tuple(index_nd[..., k] for k in range(np.shape(index_nd)[-1]))
    return jnp.asarray(var).at[index].divide(jnp.asarray(updates).astype(var.dtype))
  return _scatter(var, index_nd, updates, how)


_RESOURCE_SCATTER = {"ResourceScatterUpdate": "set", "ResourceScatterAdd": "add", "ResourceScatterSub": "sub",
                     "ResourceScatterMul": "mul", "ResourceScatterDiv": "div", "ResourceScatterMax": "max",
                     "ResourceScatterMin": "min"}


@register(*_RESOURCE_SCATTER, writes_state=True, structural=True, scatter_indices=1)
def resource_scatter(ctx, ref, indices, updates):
  """Rows of the variable (axis 0) at `indices`; a scalar `updates` applies to every picked row."""
  var = ctx.runtime.read_variable(ref)
  rows_shape = np.shape(indices) + np.shape(var)[1:]
  updates = jnp.broadcast_to(updates, rows_shape) if np.shape(updates) != rows_shape else updates
  new = _combined(var, indices[..., None], updates, _RESOURCE_SCATTER[ctx.op])
  ctx.runtime.assign_variable(ref, new.astype(var.dtype))
  return ()


_RESOURCE_SCATTER_ND = {"ResourceScatterNdUpdate": "set", "ResourceScatterNdAdd": "add",
                        "ResourceScatterNdSub": "sub", "ResourceScatterNdMax": "max", "ResourceScatterNdMin": "min"}


@register(*_RESOURCE_SCATTER_ND, writes_state=True, structural=True)
def resource_scatter_nd(ctx, ref, indices, updates):
  var = ctx.runtime.read_variable(ref)
  new = _combined(var, indices, updates, _RESOURCE_SCATTER_ND[ctx.op])
  ctx.runtime.assign_variable(ref, new.astype(var.dtype))
  return ()


@register("ResourceStridedSliceAssign", writes_state=True, structural=True)
def resource_strided_slice_assign(ctx, ref, begin, end, strides, value):
  """`var[spec] = value` for a StridedSlice spec (every mask; traced single-element indices too)."""
  var = jnp.asarray(ctx.runtime.read_variable(ref))
  starts, sizes, index = _traced_windows(ctx, begin, end, strides, var.shape)
  value = jnp.asarray(value).astype(var.dtype)
  if not starts:
    ctx.runtime.assign_variable(ref, var.at[index].set(value))
    return ()
  # Traced indices and windows: cut out the window they pick, assign inside it, put it back.
  window = lax.dynamic_slice(var, starts, sizes).at[index].set(value)
  ctx.runtime.assign_variable(ref, lax.dynamic_update_slice(var, window, starts))
  return ()
