"""Op rules: SparseTensors cut and joined (`tf.sparse.slice`, `concat`, `split`, `maximum`, `minimum`,
the slice's gradient op) and `RaggedTensor.to_sparse()`.

How many entries these ops yield, and where, depends on the coordinates: indices, dense shapes and a
slice's start and size must be known when tracing (constants, or a call without jit; under jit they
raise `DynamicShapeError`). Values may be traced: they are gathered at positions computed in NumPy, so
jit, vmap and gradients reach them. `RaggedTensorToSparse` yields one entry per flat value, so it runs
under jit with traced row splits too. Entries come out in the order of TF's CPU kernels, and known
inputs are checked as those kernels check them (`InvalidNodeError`, with TF's message).

Differences from TF: TF registers no gradient for SparseConcat (None), SparseSplit and
SparseSparseMaximum/Minimum (an error); here gradients flow to the values. SparseConcat sorts with
std::sort: entries sharing a coordinate (a malformed SparseTensor) keep their input order here, in TF
only up to 16 entries. Traced row splits of RaggedTensorToSparse are not validated.
"""
from __future__ import annotations

import numpy as np

from jaxport.convert.ops._util import cast, known_value, static_value, xp
from jaxport.convert.ops.array import _static, _static_int
from jaxport.convert.ops.ragged import _coordinates
from jaxport.convert.ops.sparse import _merged, _picked_or_zero, _row_major_order
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _refuse(ctx, message: str):
  raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: {message}")


def _entries(ctx, indices, values, rank: int, what: str = "indices") -> np.ndarray:
  """Known coordinates as int64, checked against the rank and the values as TF's SparseTensor::Create."""
  known = static_value(indices, what, ctx).astype(np.int64)
  if known.ndim != 2:
    _refuse(ctx, f"Input {what} should be a matrix but received shape {list(known.shape)}")
  if known.shape[1] != rank:
    _refuse(ctx, f"Index rank ({known.shape[1]}) and shape rank ({rank}) do not match")
  if np.shape(values)[:1] != known.shape[:1]:
    _refuse(ctx, f"Number of elements in indices ({known.shape[0]}) and values ({np.shape(values)[0]}) "
                 "do not match")
  return known


def _check_bounds(ctx, known: np.ndarray, dims) -> None:
  bad = np.flatnonzero(np.any((known < 0) | (known >= np.asarray(dims, np.int64)), axis=1))
  if bad.size:
    _refuse(ctx, f"Sparse index tuple indices[{bad[0]}, :] = {known[bad[0]].tolist()} is out of bounds")


def _check_dims(ctx, dims, message: str) -> None:
  if any(d < 0 for d in dims):
    _refuse(ctx, message)


@register("SparseSlice")
def sparse_slice(ctx, indices, values, shape, start, size):
  """The entries in [start, start + size), moved by -start, in input order; the output shape is the
  selection's overlap with the dense shape (TF's arithmetic: a negative start counts `size` in full)."""
  dims = _static(ctx, shape, "shape")
  begin, extent = _static(ctx, start, "start"), _static(ctx, size, "size")
  for name, vector in (("start", begin), ("size", extent)):
    if len(vector) != len(dims):
      _refuse(ctx, f"Expected {name} to be a vector of length {len(dims)} but got length {len(vector)}")
  _check_dims(ctx, dims, f"Expected shape dimensions to be non-negative, got {min(dims, default=0)}")
  out_dims = [e if b < d - e else d - b if b < d else 0 for b, e, d in zip(begin, extent, dims)]
  _check_dims(ctx, out_dims, f"Expected a non-negative size, got {min(out_dims, default=0)}")
  known = _entries(ctx, indices, values, len(dims))
  begin = np.asarray(begin, np.int64)
  hit = np.flatnonzero(np.all((known >= begin) & (known < begin + np.asarray(extent, np.int64)), axis=1))
  return known[hit] - begin, values[hit], np.asarray(out_dims, np.int64)


@register("SparseSliceGrad")
def sparse_slice_grad(ctx, backprop_val_grad, input_indices, input_start, output_indices):
  """Each input entry's gradient is that of the output entry it became, 0 if it was cut: TF pairs them
  in one pass (input entry i takes output entry j when it sits at j's coordinate + start)."""
  inputs = static_value(input_indices, "input_indices", ctx).astype(np.int64)
  outputs = static_value(output_indices, "output_indices", ctx).astype(np.int64)
  begin = np.asarray(_static(ctx, input_start, "input_start"), np.int64)
  if inputs.ndim != 2 or outputs.ndim != 2 or inputs.shape[1] != outputs.shape[1]:
    _refuse(ctx, "The input and output should have the same ndims")
  if outputs.shape[0] > inputs.shape[0]:
    _refuse(ctx, f"# rows of output_indices should be not greater than of input_indices, got "
                 f"{outputs.shape[0]} and {inputs.shape[0]}")
  if np.shape(backprop_val_grad)[0] != outputs.shape[0]:
    _refuse(ctx, "# elements of backprop_val_grad and # rows of output_indices should match")
  if begin.size != inputs.shape[1]:
    _refuse(ctx, f"Expected input_start to be a vector of length {inputs.shape[1]} but got length {begin.size}")
  wanted = [tuple(c) for c in outputs.tolist()]
  source = np.full(inputs.shape[0], -1, np.int64)
  j = 0
  for i, coordinate in enumerate(map(tuple, (inputs - begin).tolist())):
    if j < len(wanted) and coordinate == wanted[j]:
      source[i], j = j, j + 1
  if j != len(wanted):
    _refuse(ctx, f"Elements of backprop_val_grad aren't all propagated. Num elements:{len(wanted)}, used: {j}")
  return _picked_or_zero(backprop_val_grad, source)


@register("SparseConcat")
def sparse_concat(ctx, *inputs):
  """The inputs side by side along `concat_dim`. TF's kernel sorts by the concat dim, concatenates and
  sorts back row-major: the output is always row-major ordered, whatever the inputs' order."""
  n = len(inputs) // 3
  index_list, value_list = inputs[:n], inputs[n:2 * n]
  dims = [_static(ctx, s, f"shapes[{k}]") for k, s in enumerate(inputs[2 * n:])]
  if any(d < 0 for s in dims for d in s) or any(np.prod(s, dtype=object) >= 2 ** 63 for s in dims):
    _refuse(ctx, "Encountered overflow from large input shape.")
  rank, axis = len(dims[0]), ctx.attr("concat_dim")
  if not -rank <= axis < rank:
    _refuse(ctx, f"Concat dimension must be in range [{-rank}, {rank}), got {axis}")
  axis %= rank
  for k, s in enumerate(dims[1:], 1):
    if len(s) != rank:
      _refuse(ctx, f"Ranks of all input tensors must match: expected {rank} but got {len(s)} at position {k}")
    for j, (want, got) in enumerate(zip(dims[0], s)):
      if j != axis and want != got:
        _refuse(ctx, f"Input shapes must match: expected {want} for dimension {j} but got {got} at position {k}")
  out_shape = list(dims[0])
  out_shape[axis] = sum(s[axis] for s in dims)
  all_values = xp(*value_list).concatenate(value_list)
  if not sum(np.shape(i)[0] for i in index_list):   # TF returns before reading any entry
    return np.zeros((0, rank), np.int64), all_values[:0], np.asarray(out_shape, np.int64)
  known = [_entries(ctx, i, v, rank, f"indices[{k}]") for k, (i, v) in enumerate(zip(index_list, value_list))]
  offsets = np.cumsum([0] + [s[axis] for s in dims[:-1]])
  for part, offset in zip(known, offsets):
    part[:, axis] += offset
  all_indices = np.concatenate(known)
  order = _row_major_order(all_indices)   # stable
  return all_indices[order], all_values[order], np.asarray(out_shape, np.int64)


@register("SparseSplit")
def sparse_split(ctx, split_dim, indices, values, shape):
  """`num_split` pieces along `split_dim`, the first (size % num_split) one longer; each keeps its
  entries in input order, moved to the piece's start."""
  dims = _static(ctx, shape, "shape")
  rank, axis, count = len(dims), _static_int(ctx, split_dim, "split_dim"), ctx.attr("num_split")
  if not -rank <= axis < rank:
    _refuse(ctx, f"Input axis should be in range [{-rank}, {rank}), got {axis}")
  axis %= rank
  if not 1 <= count <= dims[axis]:
    _refuse(ctx, f"Input num_split should be between 1 and the splitting dimension size ({dims[axis]}), "
                 f"got {count}")
  known = _entries(ctx, indices, values, rank)
  _check_bounds(ctx, known, dims)
  size, extra = divmod(dims[axis], count)
  sizes = [size + (k < extra) for k in range(count)]
  starts = np.cumsum([0] + sizes)
  piece = np.searchsorted(starts, known[:, axis], side="right") - 1
  out_indices, out_values, out_shapes = [], [], []
  for k in range(count):
    at = np.flatnonzero(piece == k)
    part = known[at]
    part[:, axis] -= starts[k]
    out_indices.append(part)
    out_values.append(values[at])
    out_shapes.append(np.asarray(dims[:axis] + [sizes[k]] + dims[axis + 1:], np.int64))
  return out_indices + out_values + out_shapes


_EXTREMUM = {"SparseSparseMaximum": "maximum", "SparseSparseMinimum": "minimum"}


@register(*_EXTREMUM)
def sparse_sparse_extremum(ctx, a_indices, a_values, a_shape, b_indices, b_values, b_shape):
  """Element-wise max/min over the union of the coordinates, a missing entry counting as 0. TF merges
  the two lists in one pass as if both were row-major ordered, without checking: unordered operands
  give its unsorted (possibly repeated) coordinates, reproduced here."""
  shape_a, shape_b = _static(ctx, a_shape, "a_shape"), _static(ctx, b_shape, "b_shape")
  if not shape_a:
    _refuse(ctx, "Tensors must not be empty")
  if len(shape_a) != len(shape_b):
    _refuse(ctx, f"Operands do not have the same ranks; got shapes: {' '.join(map(str, shape_a))} and "
                 f"{' '.join(map(str, shape_b))}")
  for k, (x, y) in enumerate(zip(shape_a, shape_b)):
    if x != y:
      _refuse(ctx, f"Operands' shapes do not match: got {x} and {y} for dimension {k}")
  a = _entries(ctx, a_indices, a_values, len(shape_a), "a_indices")
  b = _entries(ctx, b_indices, b_values, len(shape_b), "b_indices")
  _check_bounds(ctx, a, shape_a)
  _check_bounds(ctx, b, shape_b)
  out, from_a, from_b = _merged(a, b)
  extremum = getattr(xp(a_values, b_values), _EXTREMUM[ctx.op])
  return out, extremum(_picked_or_zero(a_values, from_a), _picked_or_zero(b_values, from_b))


def _check_splits(ctx, splits, count: int) -> None:
  """TF's checks of the row splits, on those known now."""
  message = "Final value of ragged splits must match the length the corresponding ragged values."
  above = None   # the last split of the level above, when known
  for s in splits:
    if not np.shape(s)[0]:
      _refuse(ctx, "ragged splits may not be empty.")
    if above is not None and np.shape(s)[0] != above + 1:
      _refuse(ctx, message)
    known = known_value(s)
    above = None if known is None else int(known[-1])
    if known is None:
      continue
    if known[0] != 0:
      _refuse(ctx, "First value of ragged splits must be 0.")
    falls = np.flatnonzero(np.diff(known) < 0)
    if falls.size:
      _refuse(ctx, f"Ragged splits should be non decreasing, but we got {known[falls[0]]} followed by "
                   f"{known[falls[0] + 1]}")
  if above is not None and above != count:
    _refuse(ctx, message)


@register("RaggedTensorToSparse")
def ragged_tensor_to_sparse(ctx, *inputs):
  """Each flat value's coordinate: its row, its position at each ragged level, then its position in
  the uniform inner dims, in row-major order; the ragged dims of the dense shape are the longest rows."""
  *splits, values = inputs
  count, inner = np.shape(values)[0], list(np.shape(values)[1:])
  _check_splits(ctx, splits, count)
  m = xp(*splits)
  prefix = m.stack([cast(c, np.int64) for c in _coordinates(splits, count)], axis=1)
  per_value = int(np.prod(inner, dtype=np.int64))
  suffix = np.indices(inner, dtype=np.int64).reshape(len(inner), per_value).T
  indices = m.concatenate([m.repeat(prefix, per_value, axis=0),
                           np.tile(suffix, (count, 1)).astype(prefix.dtype)], axis=1)
  widths = [m.max(m.diff(s), initial=0) for s in splits]
  dense_shape = m.stack([cast(d, np.int64) for d in [np.shape(splits[0])[0] - 1] + widths + inner])
  return indices, xp(values).reshape(values, (-1,)), dense_shape
