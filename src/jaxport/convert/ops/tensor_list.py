"""Op rules: TensorList (the TensorArray of TF2).

A list is a stacked array `items` of shape `(size, *element_shape)`, so it can
be a loop carry. A list reserved with an unknown element shape has `items=None`
until its first write fixes the shape; loops resolve that before they start
(see control_flow.materialize_lists).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops._util import is_concrete, known_value, static_ints, static_value, xp
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError, UnsupportedValueError, UnwrittenListError


@jax.tree_util.register_pytree_node_class
class TensorList:
  __slots__ = ("items", "dtype", "element_shape", "_size")

  def __init__(self, items, dtype, element_shape, size=None):
    self.items = items
    self.dtype = np.dtype(dtype)
    self.element_shape = element_shape   # tuple with None for unknown dims, or None
    self._size = size

  @property
  def size(self) -> int:
    return int(self.items.shape[0]) if self.items is not None else int(self._size)

  def tree_flatten(self):
    return (self.items,), (self.dtype, self.element_shape, self._size)

  @classmethod
  def tree_unflatten(cls, aux, children):
    return cls(children[0], *aux)

  def with_items(self, items) -> "TensorList":
    return TensorList(items, self.dtype, tuple(items.shape[1:]), None)

  def known_element_shape(self) -> tuple[int, ...] | None:
    if self.element_shape is None or any(d is None for d in self.element_shape):
      return None
    return tuple(self.element_shape)

  def dense(self):
    """`items`, allocating zeros when the element shape is fully known."""
    if self.items is not None:
      return self.items
    shape = self.known_element_shape()
    if shape is None:
      raise UnwrittenListError("reading a TensorList whose element shape is unknown and that was never written; "
                                  "give the TensorArray an element_shape")
    return jnp.zeros((self.size, *shape), self.dtype)

  def __repr__(self):
    return f"TensorList(size={self.size}, dtype={self.dtype}, element_shape={self.element_shape})"


def add_lists(lists) -> TensorList:
  """Element-wise sum of equally long lists, as TF adds TensorLists (AddN of a list's gradients); a
  list never written adds nothing."""
  written = [lst.dense() for lst in lists if lst.items is not None]
  if len({lst.size for lst in lists}) > 1:
    raise InvalidNodeError(f"adding TensorLists of sizes {[lst.size for lst in lists]}; TF adds equally long lists")
  if not written:
    return lists[0]
  return lists[0].with_items(functools.reduce(jnp.add, written))


def _shape_arg(shape) -> tuple | None:
  """A TF element_shape operand: -1 means unknown rank, -1 entries are unknown dims."""
  arr = np.asarray(shape)
  if arr.ndim == 0:
    return None if int(arr) == -1 else ()
  return tuple(None if int(d) < 0 else int(d) for d in arr)


def _merge_shape(a, b):
  if a is None:
    return b
  if b is None:
    return a
  return tuple(x if x is not None else y for x, y in zip(a, b))


def _index(i):
  return int(i) if is_concrete(i) else i


def read_item(items, i):
  """Element `i` of `items`. A traced index takes one dynamic-slice with no negative-index wrap:
  TF raises on an index outside [0, size), and the wrap is a kernel per loop step."""
  if isinstance(i, int):
    return items[i]
  return lax.dynamic_index_in_dim(items, i, keepdims=False, allow_negative_indices=False)


def write_item(items, i, value, *, accumulate: bool = False):
  """`items` with element `i` set to (or, accumulating, increased by) `value`.

  A traced index takes one dynamic-update-slice (clamped like `read_item`); jnp's `.at[i]` would
  add a negative-index wrap and an in-bounds select, 3 extra kernels per step of an LSTM. TF
  raises on an index outside [0, size), so no valid program sees the difference.
  """
  value = jnp.asarray(value, items.dtype)
  if isinstance(i, int):
    return items.at[i].add(value) if accumulate else items.at[i].set(value)
  if accumulate:
    value = value + read_item(items, i)
  return lax.dynamic_update_index_in_dim(items, value, i, 0, allow_negative_indices=False)


@register("EmptyTensorList", structural=True)
def empty_tensor_list(ctx, element_shape, max_num_elements):
  return TensorList(None, ctx.attr("element_dtype"), _shape_arg(element_shape), 0)


@register("TensorListReserve", structural=True)
def tensor_list_reserve(ctx, element_shape, num_elements):
  size, = static_ints(num_elements, "num_elements", ctx)
  lst = TensorList(None, ctx.attr("element_dtype"), _shape_arg(element_shape), size)
  return lst.with_items(lst.dense()) if lst.known_element_shape() is not None else lst


@register("TensorListFromTensor", structural=True)
def tensor_list_from_tensor(ctx, tensor, element_shape):
  return TensorList(None, tensor.dtype, None).with_items(tensor)


@register("TensorListSetItem", structural=True)
def tensor_list_set_item(ctx, lst, index, item):
  i = _index(index)
  if isinstance(i, int) and i >= lst.size:
    if not ctx.attr("resize_if_index_out_of_bounds", False):
      raise IndexError(f"TensorListSetItem index {i} is out of range for a list of size {lst.size}")
    lst = _resized(lst, i + 1, tuple(item.shape))
  if lst.items is None:
    lst = TensorList(None, lst.dtype, _merge_shape(lst.element_shape, tuple(item.shape)), lst.size)
    lst = lst.with_items(lst.dense())
  return lst.with_items(write_item(lst.items, i, item))


def _resized(lst: TensorList, size: int, element_shape=None) -> TensorList:
  """`lst` grown with zeros (or cut) to `size` elements."""
  if lst.items is None:
    shape = _merge_shape(lst.element_shape, element_shape)
    return TensorList(None, lst.dtype, shape, size) if size == 0 or shape is None or None in shape \
        else TensorList(None, lst.dtype, shape, size).with_items(jnp.zeros((size, *shape), lst.dtype))
  items = lst.items
  if size <= items.shape[0]:
    return lst.with_items(items[:size])
  return lst.with_items(jnp.concatenate([items, jnp.zeros((size - items.shape[0], *items.shape[1:]), items.dtype)]))


@register("TensorListGetItem", structural=True)
def tensor_list_get_item(ctx, lst, index, element_shape):
  wanted = np.dtype(ctx.attr("element_dtype", lst.dtype))
  if wanted != lst.dtype and not ctx.config["disable_assert_in_tensor_list_get_item"]:
    raise TypeError(f"TensorListGetItem {ctx.name!r} reads {wanted} elements from a list of {lst.dtype}; "
                    "TF raises here too. To read anyway (as tf2jax allows), set the config key "
                    "'disable_assert_in_tensor_list_get_item' to True.")
  if lst.items is None and lst.known_element_shape() is None:
    lst = TensorList(None, lst.dtype, _merge_shape(lst.element_shape, _shape_arg(element_shape)), lst.size)
  items = lst.dense()
  return read_item(items, _index(index))


@register("TensorListStack", structural=True)
def tensor_list_stack(ctx, lst, element_shape):
  if lst.items is None:
    lst = TensorList(None, lst.dtype, _merge_shape(lst.element_shape, _shape_arg(element_shape)), lst.size)
  return lst.dense()


@register("TensorListLength", structural=True)
def tensor_list_length(ctx, lst):
  return np.int32(lst.size)


@register("TensorListElementShape", structural=True)
def tensor_list_element_shape(ctx, lst):
  shape = lst.element_shape
  dtype = ctx.attr("shape_type", np.dtype(np.int32))
  if shape is None:
    return np.asarray(-1, dtype)
  return np.asarray([-1 if d is None else d for d in shape], dtype)


@register("TensorListPushBack", structural=True)
def tensor_list_push_back(ctx, lst, item):
  # constants pushed onto constants stay NumPy: a gradient loop pops sizes it needs at trace time
  before = [] if lst.size == 0 and lst.items is None else [lst.dense()]
  array = xp(item, *before)
  return lst.with_items(array.concatenate([*before, array.asarray(item, lst.dtype)[None]]))


@register("TensorListPopBack", structural=True)
def tensor_list_pop_back(ctx, lst, element_shape):
  items = lst.dense()
  if items.shape[0] == 0:
    raise InvalidNodeError("TensorListPopBack on an empty list")
  return lst.with_items(items[:-1]), items[-1]


@register("TensorListGather", structural=True)
def tensor_list_gather(ctx, lst, indices, element_shape):
  return jnp.take(lst.dense(), jnp.asarray(indices), axis=0)


@register("TensorListScatterIntoExistingList", structural=True)
def tensor_list_scatter_into_existing(ctx, lst, tensor, indices):
  # As TF does, a list shorter than the largest index + 1 grows to it. Traced indices cannot size
  # it, so they must fit a list of at least one element per scattered row.
  idx = known_value(indices)
  if idx is None and lst.size < tensor.shape[0]:
    static_value(indices, "indices", ctx)   # raises DynamicShapeError naming the node
  if lst.items is None:
    lst = TensorList(None, lst.dtype, tuple(tensor.shape[1:]), lst.size)
  needed = int(np.max(idx)) + 1 if idx is not None and idx.size else 0
  if needed > lst.size:
    lst = _resized(lst, needed, tuple(tensor.shape[1:]))
  return lst.with_items(lst.dense().at[jnp.asarray(indices)].set(jnp.asarray(tensor, lst.dtype)))


@register("TensorListScatter", "TensorListScatterV2", structural=True)
def tensor_list_scatter(ctx, tensor, indices, element_shape, *num_elements):
  idx = static_ints(indices, f"{ctx.op} indices") if is_concrete(indices) else None
  if num_elements and int(np.asarray(num_elements[0])) >= 0:
    size = int(np.asarray(num_elements[0]))
  elif idx is not None:
    size = max(idx, default=-1) + 1
  else:
    size = tensor.shape[0]
  base = jnp.zeros((size, *tensor.shape[1:]), tensor.dtype)
  return TensorList(None, tensor.dtype, None).with_items(base.at[jnp.asarray(indices)].set(tensor))


@register("TensorListConcatV2", "TensorListConcat", structural=True)
def tensor_list_concat(ctx, lst, *_):
  items = lst.dense()
  lengths = np.full((items.shape[0],), items.shape[1] if items.ndim > 1 else 1, np.int64)
  return items.reshape((-1, *items.shape[2:])), lengths


@register("TensorListSplit", structural=True)
def tensor_list_split(ctx, tensor, element_shape, lengths):
  lens = static_ints(lengths, "lengths", ctx)
  if len(set(lens)) > 1:
    raise UnsupportedValueError("TensorListSplit with unequal lengths makes a ragged list, which jaxport does "
                                "not support")
  n = len(lens)
  return TensorList(None, tensor.dtype, None).with_items(tensor.reshape((n, lens[0] if n else 0, *tensor.shape[1:])))


@register("TensorListResize", structural=True)
def tensor_list_resize(ctx, lst, size):
  n, = static_ints(size, "size", ctx)
  return _resized(lst, n)
