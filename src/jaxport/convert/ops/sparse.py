"""Op rules: the `tf.sparse` ops on a SparseTensor's (indices, values, dense_shape).

Indices are [N, rank] int64 coordinates and values their N entries. Ops whose output has as many
entries as the input (reorder, reshape, softmax, element-wise ops with a dense tensor) and ops with a
dense output of a known shape (matmul, reductions, dense add) take traced indices and values, so they
run under jit, grad and vmap. The output size of `SparseFillEmptyRows`, `SparseAdd` and the sparse
reductions depends on which coordinates are present: their indices must be known when tracing
(constants, or a call without jit; under jit they raise `DynamicShapeError`), their values may be
traced, so gradients flow (`SparseAdd` with a traced nonzero `thresh` excepted; with thresh 0 a NaN
sum is kept, where TF drops it). Known coordinates are checked like TF's CPU kernels check them; traced
out-of-range ones are dropped from dense outputs.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import is_concrete, known_value, static_value, xp
from jaxport.convert.ops.array import _static, _static_int
from jaxport.convert.ops.gather_scatter import _get, _scatter, _segment_initial, _segment_reduce
from jaxport.convert.registry import register
from jaxport.errors import DynamicShapeError, InvalidNodeError


def _columns(indices) -> tuple:
  return tuple(indices[:, k] for k in range(np.shape(indices)[1]))


def _check_in_shape(ctx, indices, shape) -> None:
  """TF's kernels refuse a coordinate outside the dense shape (checked when both are known)."""
  known = known_value(indices)
  if known is None or not known.size:
    return
  bad = np.any((known < 0) | (known >= np.asarray(shape, np.int64)), axis=1)
  if bad.any():
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: index {known[bad][0].tolist()} is out of bounds for "
                           f"dense shape {list(shape)}")


def _dense(indices, values, shape, how: str, empty):
  """The SparseTensor as a dense array: duplicates combined by `how`, absent entries `empty`."""
  base = xp(indices, values).full(tuple(shape), empty, dtype=values.dtype)
  return _scatter(base, indices, values, how)


def _linear(indices, shape):
  """Each coordinate's row-major position in `shape` (int64 when known; the traced dtype otherwise)."""
  m = xp(indices, shape)
  return m.sum(indices * _strides(shape).astype(indices.dtype), axis=1)


def _strides(shape):
  """Row-major strides of a shape vector (NumPy or traced)."""
  m = xp(shape)
  return m.cumprod(m.concatenate([m.ones(1, m.asarray(shape).dtype), m.asarray(shape)[1:][::-1]]))[::-1]


def _row_major_order(indices):
  """A stable permutation sorting the coordinates row-major (no overflow: compared column by column)."""
  m = xp(indices)
  columns = _columns(indices)
  return m.lexsort(columns[::-1]) if columns else m.arange(np.shape(indices)[0])


@register("SparseReorder")
def sparse_reorder(ctx, indices, values, shape):
  order = _row_major_order(indices)
  return indices[order], values[order]


@register("SparseTensorDenseMatMul")
def sparse_dense_matmul(ctx, a_indices, a_values, a_shape, b):
  """op(A) @ op(B), A sparse: each entry adds values[i] * B[col] to its row (duplicates add up)."""
  shape = _static(ctx, a_shape, "a_shape")
  m = xp(a_indices, a_values, b)
  rows, cols = a_indices[:, 0], a_indices[:, 1]
  values = a_values
  if ctx.attr("adjoint_a", False):
    rows, cols, shape = cols, rows, shape[::-1]
    values = m.conj(values)
  if ctx.attr("adjoint_b", False):
    b = m.conj(m.swapaxes(b, 0, 1))
  if shape[1] != np.shape(b)[0]:
    raise InvalidNodeError(f"SparseTensorDenseMatMul node {ctx.name!r}: inner dimensions differ: A is {shape} "
                           f"(after its adjoint), B has {np.shape(b)[0]} rows")
  _check_in_shape(ctx, m.stack([rows, cols], axis=1), shape)
  if not is_concrete(rows):   # traced rows out of range: dropped by the scatter
    rows = jnp.where(rows < 0, shape[0], rows)
  picked = _get(b, (cols,), zeros_out_of_range=True)   # traced columns out of range: no contribution
  return _segment_reduce(values[:, None] * picked, rows, shape[0], "add").astype(b.dtype)


_REDUCE = {"SparseReduceSum": "add", "SparseReduceMax": "max"}
_REDUCE_SPARSE = {"SparseReduceSumSparse": "add", "SparseReduceMaxSparse": "max"}


def _reduction_axes(ctx, axes, rank: int) -> tuple[int, ...]:
  return tuple(sorted({int(a) % rank for a in _static(ctx, axes, "reduction_axes")}))


def _reduce_present(ctx, indices, values, shape, axes, how):
  """Reduces the present entries over `axes`: a group with none gives 0 (TF), not the identity."""
  m = xp(indices, values)
  kept = [k for k in range(len(shape)) if k not in axes]
  out_shape = [shape[k] for k in kept]
  if not kept:
    indices_kept = xp(indices).zeros((np.shape(indices)[0], 1), indices.dtype)
    out_shape = [1]
  else:
    indices_kept = m.stack([indices[:, k] for k in kept], axis=1)
  initial = _segment_initial(how, np.dtype(values.dtype))
  out = _dense(indices_kept, values, out_shape, how, initial)
  if how == "max":   # groups with no entry hold the initial value: TF writes 0 there
    present = _dense(indices_kept, m.ones(np.shape(values), bool), out_shape, "set", False)
    out = m.where(present, out, m.zeros((), values.dtype))
  return out if kept else m.reshape(out, ())


@register(*_REDUCE)
def sparse_reduce(ctx, indices, values, shape, axes):
  dims = _static(ctx, shape, "input_shape")
  axes = _reduction_axes(ctx, axes, len(dims))
  _check_in_shape(ctx, indices, dims)
  out = _reduce_present(ctx, indices, values, dims, axes, _REDUCE[ctx.op])
  if ctx.attr("keep_dims", False):
    out = xp(out).reshape(out, [1 if k in axes else d for k, d in enumerate(dims)])
  return out


@register(*_REDUCE_SPARSE)
def sparse_reduce_sparse(ctx, indices, values, shape, axes):
  """The reduction as a SparseTensor: an entry per group that has one (known indices)."""
  dims = _static(ctx, shape, "input_shape")
  axes = _reduction_axes(ctx, axes, len(dims))
  known = static_value(indices, "input_indices", ctx)
  _check_in_shape(ctx, known, dims)
  out_dims = [1 if k in axes else d for k, d in enumerate(dims)] if ctx.attr("keep_dims", False) else \
      [d for k, d in enumerate(dims) if k not in axes]
  grouped = known.copy()
  grouped[:, list(axes)] = 0
  present = np.unique(grouped, axis=0) if len(grouped) else grouped
  dense = _reduce_present(ctx, indices, values, dims, axes, _REDUCE_SPARSE[ctx.op])
  kept = [k for k in range(len(dims)) if k not in axes]
  flat_present = present[:, kept]
  out_values = dense[tuple(flat_present.T)] if kept else xp(dense).reshape(dense, (1,))[:len(present)]
  out_indices = present if ctx.attr("keep_dims", False) else flat_present
  return out_indices.astype(np.int64), out_values, np.asarray(out_dims, np.int64)


@register("SparseReshape")
def sparse_reshape(ctx, indices, shape, new_shape):
  """The same entries at their row-major positions in `new_shape` (one -1 is inferred)."""
  m = xp(indices, shape, new_shape)
  known_shape, known_new = known_value(shape), known_value(new_shape)
  if known_shape is not None and known_new is not None:
    size, target = int(np.prod(known_shape)), known_new.astype(np.int64)
    rest = int(np.prod(target[target != -1]))
    if (target == -1).sum() > 1 or (rest and size % rest) or (not rest and size and (target == -1).any()):
      raise InvalidNodeError(f"SparseReshape node {ctx.name!r}: cannot reshape a SparseTensor of shape "
                             f"{known_shape.tolist()} into {known_new.tolist()}")
    if -1 in target:
      target[target == -1] = size // rest if rest else 0
    elif int(np.prod(target)) != size:
      raise InvalidNodeError(f"SparseReshape node {ctx.name!r}: shape {known_shape.tolist()} has {size} values, "
                             f"{known_new.tolist()} has {int(np.prod(target))}")
    new_shape = target
  else:   # traced shapes: infer the -1 arithmetically
    size = m.prod(shape)
    rest = m.prod(m.where(new_shape == -1, 1, new_shape))
    new_shape = m.where(new_shape == -1, size // m.maximum(rest, 1), new_shape)
  linear = _linear(indices, shape)
  k = xp(new_shape)
  out = (linear[:, None] // _strides(new_shape).astype(linear.dtype)) % k.maximum(new_shape, 1).astype(linear.dtype)
  return out.astype(indices.dtype), new_shape


@register("SparseFillEmptyRows")
def sparse_fill_empty_rows(ctx, indices, values, dense_shape, default_value):
  """Adds (row, 0, ...) = default for each row with no entry; entries come out sorted by row (stable)."""
  known = static_value(indices, "indices", ctx).astype(np.int64)
  rows = _static(ctx, dense_shape, "dense_shape")[0] if np.size(dense_shape) else 0
  if known.size and (known[:, 0].min() < 0 or known[:, 0].max() >= rows):
    bad = known[(known[:, 0] < 0) | (known[:, 0] >= rows)][0]
    raise InvalidNodeError(f"SparseFillEmptyRows node {ctx.name!r}: index {bad.tolist()} is outside the "
                           f"{rows} rows of dense_shape")
  n, rank = known.shape
  empty = np.ones(rows, bool)
  empty[known[:, 0]] = False
  filler = np.zeros((int(empty.sum()), rank), np.int64)
  filler[:, 0] = np.flatnonzero(empty)
  all_indices = np.concatenate([known, filler])
  order = np.argsort(all_indices[:, 0], kind="stable")
  position = np.empty(len(order), np.int64)
  position[order] = np.arange(len(order))
  m = xp(values, default_value)
  all_values = m.concatenate([values, m.broadcast_to(m.asarray(default_value, values.dtype), (len(filler),))])
  return (all_indices[order].astype(np.int64), m.take(all_values, order, axis=0), empty, position[:n])


@register("SparseFillEmptyRowsGrad")
def sparse_fill_empty_rows_grad(ctx, reverse_index_map, grad_values):
  """Each input entry's gradient is its output's; the default's is the sum over the filled rows."""
  m = xp(reverse_index_map, grad_values)
  picked = _get(grad_values, (reverse_index_map,), zeros_out_of_range=True)
  taken = _dense(reverse_index_map[:, None], m.ones(np.shape(reverse_index_map), bool), np.shape(grad_values)[:1],
                 "set", False)
  return picked, m.sum(m.where(taken, m.zeros((), grad_values.dtype), grad_values))


_CWISE = {"SparseDenseCwiseAdd": "add", "SparseDenseCwiseMul": "mul", "SparseDenseCwiseDiv": "div"}


@register(*_CWISE)
def sparse_dense_cwise(ctx, sp_indices, sp_values, sp_shape, dense):
  """Each entry combined with the dense value at its coordinate (dense broadcast to the sparse shape)."""
  rank, dense_shape = np.shape(sp_indices)[1], np.shape(dense)
  known_shape = known_value(sp_shape)
  if len(dense_shape) > rank or (known_shape is not None and any(
      d not in (1, s) for d, s in zip(dense_shape[::-1], known_shape[::-1].tolist()))):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: a dense operand of shape {list(dense_shape)} does not "
                           f"broadcast to the sparse shape {None if known_shape is None else known_shape.tolist()}")
  m = xp(sp_indices, sp_values, dense)
  lead = rank - len(dense_shape)
  at = tuple(m.zeros_like(sp_indices[:, 0]) if d == 1 else sp_indices[:, lead + k]
             for k, d in enumerate(dense_shape))
  picked = _get(dense, at, zeros_out_of_range=False) if at else m.broadcast_to(dense, np.shape(sp_values))
  how = _CWISE[ctx.op]
  if how == "add":
    return sp_values + picked
  if how == "mul":
    return sp_values * picked
  if is_concrete(dense) and np.any(np.asarray(dense) == 0):
    raise InvalidNodeError(f"SparseDenseCwiseDiv node {ctx.name!r}: the dense tensor contains a zero (TF refuses "
                           "to divide by it)")
  if np.issubdtype(np.dtype(sp_values.dtype), np.integer):   # C++ division: truncated toward zero
    return (m.sign(sp_values) * m.sign(picked) * (m.abs(sp_values) // m.abs(picked))).astype(sp_values.dtype)
  return sp_values / picked


@register("SparseTensorDenseAdd")
def sparse_tensor_dense_add(ctx, a_indices, a_values, a_shape, b):
  _check_in_shape(ctx, a_indices, np.shape(b))
  return _scatter(b, a_indices, a_values, "add")


@register("SparseSoftmax")
def sparse_softmax(ctx, sp_indices, sp_values, sp_shape):
  """Softmax over the entries of each innermost row, in row-major order (TF sorts the entries first)."""
  m = xp(sp_indices, sp_values)
  n = np.shape(sp_values)[0]
  if n == 0:
    return sp_values
  order = _row_major_order(sp_indices)
  outer = sp_indices[order][:, :-1]
  starts = m.concatenate([m.ones(1, bool), m.any(outer[1:] != outer[:-1], axis=1)])
  group = m.cumsum(starts) - 1
  values = sp_values[order]
  high = _segment_reduce(values, group, n, "max")
  shifted = m.exp(values - high[group])
  return shifted / _segment_reduce(shifted, group, n, "add")[group]


def _merged(a, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """TF's two-pointer merge of two coordinate lists (each assumed row-major sorted): the output
  coordinates and, per output entry, the a and b entry it sums (-1: none)."""
  out, from_a, from_b = [], [], []
  rank = np.shape(a)[1]
  a, b = [tuple(c) for c in a.tolist()], [tuple(c) for c in b.tolist()]
  i = j = 0
  while i < len(a) or j < len(b):
    order = 1 if i == len(a) else -1 if j == len(b) else (a[i] > b[j]) - (a[i] < b[j])
    out.append(a[i] if order <= 0 else b[j])
    from_a.append(i if order <= 0 else -1)
    from_b.append(j if order >= 0 else -1)
    i, j = i + (order <= 0), j + (order >= 0)
  return np.asarray(out, np.int64).reshape(len(out), rank), np.asarray(from_a, np.int64), np.asarray(from_b, np.int64)


def _picked_or_zero(values, at: np.ndarray):
  m = xp(values)
  padded = m.concatenate([values, m.zeros(1, values.dtype)])
  return padded[np.where(at < 0, np.shape(values)[0], at)]


@register("SparseAdd")
def sparse_add(ctx, a_indices, a_values, a_shape, b_indices, b_values, b_shape, thresh):
  """The union of the entries; where both have one, their sum, dropped when below `thresh` in magnitude."""
  a = static_value(a_indices, "a_indices", ctx).astype(np.int64)
  b = static_value(b_indices, "b_indices", ctx).astype(np.int64)
  shape_a, shape_b = _static(ctx, a_shape, "a_shape"), _static(ctx, b_shape, "b_shape")
  if shape_a != shape_b:
    raise InvalidNodeError(f"SparseAdd node {ctx.name!r}: the operands' shapes differ: {shape_a} vs {shape_b}")
  out, from_a, from_b = _merged(a, b)
  sums = _picked_or_zero(a_values, from_a) + _picked_or_zero(b_values, from_b)
  limit, known_sums = known_value(thresh), known_value(sums)
  both = (from_a >= 0) & (from_b >= 0)   # TF compares only the sums of entries both operands have
  if known_sums is not None:
    kept = ~both | (np.abs(known_sums) >= (0 if limit is None else limit))
    out, sums = out[kept], sums[kept]
  elif both.any() and (limit is None or np.any(limit > 0)):   # which sums fall below it: value-dependent
    raise DynamicShapeError(ctx.op, ctx.name, "values (their sums are compared with a nonzero thresh)")
  return out, sums, np.asarray(shape_a, np.int64)


@register("SparseAddGrad")
def sparse_add_grad(ctx, backprop_val_grad, a_indices, b_indices, sum_indices):
  """Each operand entry's gradient is that of the sum entry at its coordinate (0 if it was dropped)."""
  total = {tuple(c): k for k, c in enumerate(static_value(sum_indices, "sum_indices", ctx).tolist())}
  def at(indices, what):
    coords = static_value(indices, what, ctx).tolist()
    return _picked_or_zero(backprop_val_grad, np.asarray([total.get(tuple(c), -1) for c in coords], np.int64))
  return at(a_indices, "a_indices"), at(b_indices, "b_indices")
