"""Op rules: TF1 TensorArrays (`TensorArrayV3` and its ops), on the TensorList representation.

A v1 TensorArray is a resource `handle` plus a float `flow` that every op takes
and returns to order the writes. Here the flow carries the data: it is a
`TensorList` (see `ops/tensor_list.py`), so it travels through loop carries and
cond branches like a v2 list, and the handle is a constant marker that loops close
over. Differences from TF: `clear_after_read` is not enforced (a second read
returns the value again); a write past the end of a `dynamic_size` array grows it
only when the index is a trace-time constant; ragged `Split`s are refused.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import is_concrete, static_ints
from jaxport.convert.ops.tensor_list import TensorList, _merge_shape, _resized, read_item, write_item
from jaxport.convert.registry import register
from jaxport.errors import UnsupportedValueError

_GRAD = ":grad"   # suffix of a gradient array's handle: its writes accumulate, as in TF


def _handle(name: str):
  return np.asarray(name, dtype=object)


def _is_grad(handle) -> bool:
  return str(np.asarray(handle).reshape(()).item()).endswith(_GRAD)


def _with_shape(lst: TensorList, shape) -> TensorList:
  if lst.items is None and lst.known_element_shape() is None and shape is not None:
    return TensorList(None, lst.dtype, _merge_shape(lst.element_shape, tuple(shape)), lst.size)
  return lst


def _flow(ctx, flow: TensorList) -> TensorList:
  """The array an op works on: zeros when it writes a gradient array first (see v1_control_flow)."""
  if not ctx.attr("_fresh_gradient", False):
    return flow
  if flow.items is None:
    return TensorList(None, flow.dtype, flow.element_shape, flow.size)
  return flow.with_items(jnp.zeros_like(flow.items))


def _index(i):
  return int(np.asarray(i)) if is_concrete(i) else jnp.asarray(i)


@register("TensorArrayV3", structural=True)
def tensor_array(ctx, size):
  n, = static_ints(size, "TensorArrayV3 size")
  lst = TensorList(None, ctx.attr("dtype"), ctx.attr("element_shape", None), n)
  if lst.known_element_shape() is not None:
    lst = lst.with_items(lst.dense())
  return _handle(ctx.name), lst


@register("TensorArrayWriteV3", structural=True)
def tensor_array_write(ctx, handle, index, value, flow):
  flow = _flow(ctx, flow)
  i = _index(index)
  value = jnp.asarray(value, flow.dtype)
  if isinstance(i, int) and i >= flow.size:
    flow = _resized(flow, i + 1, tuple(value.shape))
  flow = _with_shape(flow, value.shape)
  items = flow.dense()
  return flow.with_items(write_item(items, i, value, accumulate=_is_grad(handle)))


@register("TensorArrayReadV3", structural=True)
def tensor_array_read(ctx, handle, index, flow):
  flow = _flow(ctx, flow)
  items = flow.dense()
  i = _index(index)
  return read_item(items, i)


@register("TensorArrayGatherV3", structural=True)
def tensor_array_gather(ctx, handle, indices, flow):
  flow = _flow(ctx, flow)
  items = _with_shape(flow, ctx.attr("element_shape", None)).dense()
  return jnp.take(items, jnp.asarray(indices), axis=0)


@register("TensorArrayScatterV3", structural=True)
def tensor_array_scatter(ctx, handle, indices, value, flow):
  flow = _flow(ctx, flow)
  value = jnp.asarray(value, flow.dtype)
  if is_concrete(indices):
    top = max(static_ints(indices, "TensorArrayScatterV3 indices"), default=-1) + 1
    if top > flow.size:
      flow = _resized(flow, top, tuple(value.shape[1:]))
  items = _with_shape(flow, value.shape[1:]).dense()
  idx = jnp.asarray(indices)
  updated = items.at[idx].add(value) if _is_grad(handle) else items.at[idx].set(value)
  return flow.with_items(updated)


@register("TensorArrayConcatV3", structural=True)
def tensor_array_concat(ctx, handle, flow):
  flow = _flow(ctx, flow)
  items = flow.dense()
  lengths = np.full((items.shape[0],), items.shape[1] if items.ndim > 1 else 1, np.int64)
  return items.reshape((-1, *items.shape[2:])), lengths


@register("TensorArraySplitV3", structural=True)
def tensor_array_split(ctx, handle, value, lengths, flow):
  flow = _flow(ctx, flow)
  lens = static_ints(lengths, "TensorArraySplitV3 lengths")
  if len(set(lens)) > 1:
    raise UnsupportedValueError("TensorArraySplitV3 with unequal lengths makes a ragged array, which jaxport does not "
                                "support; split into equal lengths")
  n = len(lens)
  value = jnp.asarray(value, flow.dtype)
  return flow.with_items(value.reshape((n, lens[0] if n else 0, *value.shape[1:])))


@register("TensorArraySizeV3", structural=True)
def tensor_array_size(ctx, handle, flow):
  return np.int32(flow.size)


@register("TensorArrayCloseV3", structural=True)
def tensor_array_close(ctx, handle):
  return ()


@register("TensorArrayGradV3", structural=True)
def tensor_array_grad(ctx, handle, flow):
  """The gradient array's handle; its first op starts from zeros and its writes accumulate."""
  return _handle(f"{np.asarray(handle).reshape(()).item()}/{ctx.attr('source', '')}{_GRAD}"), flow


@register("_TensorArrayFlowAddN", structural=True)
def tensor_array_flow_add_n(ctx, *flows):
  """TF sums the flows of a gradient array's writes; here the flows hold the writes, so sum them. A
  gradient loop's sum starts from a scalar zero (its accumulator's start), which adds nothing."""
  flows = [f for f in flows if isinstance(f, TensorList)] or list(flows)
  dense = [f.dense() for f in flows if f.items is not None or f.known_element_shape() is not None]
  if not dense:
    return flows[0]
  return flows[0].with_items(sum(dense[1:], dense[0]))
