"""Op rules: gathers, scatters and segment reductions.

Gather indices outside [0, dim) raise as in TF (on CPU) when they are constants; traced
ones cannot raise in plain JAX: they are clamped (negative ones wrap like NumPy; TF on GPU
returns zeros), unless `enable_checkify_for_asserts` makes them a checkify check. With
`bad_indices_policy="IGNORE"` they give zeros as in TF. Negative scatter indices wrap. Out-of-range scatter indices are dropped (TF raises on CPU).
`TensorScatterUpdate` with duplicate indices keeps an unspecified one of the updates
(TF: also unspecified).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxport.convert import export_marks, padded_rows
from jaxport.convert.ops._util import is_concrete, xp
from jaxport.convert.ops.array import _axis, _dtype, _static, _static_int
from jaxport.convert.ops.core import runtime_check
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _bad_indices_ignored(ctx) -> bool:
  policy = ctx.attr("bad_indices_policy", "")
  return (policy.decode() if isinstance(policy, bytes) else policy) == "IGNORE"


def _get(x, index, zeros_out_of_range: bool):
  """`x[index]`; NumPy raises on out-of-range indices, JAX clamps (or fills zeros)."""
  if is_concrete(x) and all(is_concrete(i) for i in index if not isinstance(i, slice)):
    return np.asarray(x[index])
  structure = tuple((i.start, i.stop, i.step) if isinstance(i, slice) else None for i in index)
  return _indexer(structure, zeros_out_of_range)(x, *[i for i in index if not isinstance(i, slice)])


@functools.lru_cache(maxsize=None)
def _indexer(structure: tuple, zeros_out_of_range: bool):
  """`get(x, *index_arrays)` for an index of arrays and slices (`structure`: None for an array, a
  slice's (start, stop, step)), jitted: called eagerly, `.at[...].get` spends ~0.3 ms normalizing the
  index, the compiled gather ~10 us."""
  def get(x, *arrays):
    rest = iter(arrays)
    index = tuple(next(rest) if part is None else slice(*part) for part in structure)
    if zeros_out_of_range:
      return jnp.asarray(x).at[index].get(mode="fill", fill_value=0)
    return jnp.asarray(x).at[index].get(mode="clip")
  return jax.jit(get)


def _check_bounds(ctx, indices, dims) -> None:
  """TF (on CPU) raises for an index outside [0, dim): raise on constants, checkify when enabled.
  `dims` bounds the last axis of `indices` component-wise (GatherNd) or all of it (one int)."""
  if _bad_indices_ignored(ctx) or (not is_concrete(indices) and not ctx.config["enable_checkify_for_asserts"]):
    return
  m = xp(indices)
  bound = m.asarray(dims, dtype=np.asarray(indices).dtype if is_concrete(indices) else indices.dtype)
  ok = (indices >= 0) & (indices < bound)
  if padded_rows.is_padding_index(ctx.runtime, indices):   # Unique's padding ids, dropped later
    ok = ok | (indices == m.iinfo(indices.dtype).max)
  first_bad = m.reshape(indices, (-1,))[m.argmin(m.reshape(ok, (-1,)))] if np.size(indices) else 0
  runtime_check(ctx, ok, f"index {{}} is not in [0, {dims}) (indices of shape {np.shape(indices)})", first_bad)


def _batch_grids(batch_shape, n_trailing: int) -> tuple:
  """Aranges that pick, for each batch position, the same position in `params`."""
  b = len(batch_shape)
  return tuple(np.arange(d).reshape((1,) * k + (d,) + (1,) * (b - 1 - k + n_trailing))
               for k, d in enumerate(batch_shape))


def _gather_axis(ctx, params, indices, axis: int, batch_dims: int):
  """`params` gathered along `axis` by `indices`, the first `batch_dims` dims shared."""
  _check_bounds(ctx, indices, int(np.shape(params)[axis]))
  ndim_i = np.ndim(indices)
  grids = _batch_grids(np.shape(indices)[:batch_dims], ndim_i - batch_dims)
  middle = (slice(None),) * (axis - batch_dims)
  out = _get(params, grids + middle + (indices,), _bad_indices_ignored(ctx))
  if batch_dims and axis > batch_dims:
    # advanced indices separated by slices move to the front: B + I + middle + rest
    n_i, n_mid = ndim_i - batch_dims, axis - batch_dims
    order = (list(range(batch_dims)) + list(range(batch_dims + n_i, batch_dims + n_i + n_mid))
             + list(range(batch_dims, batch_dims + n_i)))
    order += list(range(len(order), np.ndim(out)))
    out = xp(out).transpose(out, order)
  return out


@register("Gather", size_bounded=True, gather_indices=1)
def gather(ctx, params, indices):
  return _gather_axis(ctx, params, indices, 0, 0)


@register("GatherV2", size_bounded=True, gather_indices=1)
def gather_v2(ctx, params, indices, axis):
  batch_dims = ctx.attr("batch_dims", 0)
  if batch_dims < 0:
    batch_dims += np.ndim(indices)
  axis = _axis(ctx, _static_int(ctx, axis, "axis"), np.ndim(params))
  if not 0 <= batch_dims <= min(axis, np.ndim(indices)):
    raise InvalidNodeError(f"GatherV2 node {ctx.name!r}: batch_dims {batch_dims} must be in [0, min(axis, "
                           f"rank(indices))] = [0, {min(axis, np.ndim(indices))}]")
  return _gather_axis(ctx, params, indices, axis, batch_dims)


def _nd_index(indices, batch_dims: int) -> tuple:
  """GatherNd/ScatterNd indices [..., K] as a NumPy-style index of K arrays (after the batch grids)."""
  n_trailing = np.ndim(indices) - 1 - batch_dims
  grids = _batch_grids(np.shape(indices)[:batch_dims], n_trailing)
  return grids + tuple(indices[..., k] for k in range(np.shape(indices)[-1]))


@register("GatherNd", size_bounded=True)
def gather_nd(ctx, params, indices):
  batch_dims = ctx.attr("batch_dims", 0)
  if np.shape(indices)[-1] == 0:   # whole slices: broadcast params over the index dims
    lead = np.shape(indices)[batch_dims:-1]
    m = xp(params)
    p_shape = np.shape(params)
    expanded = m.reshape(params, p_shape[:batch_dims] + (1,) * len(lead) + p_shape[batch_dims:])
    return m.broadcast_to(expanded, p_shape[:batch_dims] + lead + p_shape[batch_dims:])
  depth = np.shape(indices)[-1]
  _check_bounds(ctx, indices, [int(d) for d in np.shape(params)[batch_dims:batch_dims + depth]])
  return _get(params, _nd_index(indices, batch_dims), _bad_indices_ignored(ctx))


_SCATTER_NUMPY = {"add": np.add.at, "sub": np.subtract.at, "mul": np.multiply.at, "max": np.maximum.at,
                  "min": np.minimum.at}


def _scatter(base, indices, updates, how: str):
  """`base` with `updates` combined in at `indices` ([..., K]); duplicates combine like TF."""
  index = _nd_index(indices, 0)
  if all(is_concrete(a) for a in (base, indices, updates)):
    out = np.array(base, copy=True)
    if how == "set":
      out[index] = updates
    else:
      _SCATTER_NUMPY[how](out, index, updates)
    return out
  return _scatterer(how)(base, updates, *index)


@functools.lru_cache(maxsize=None)
def _scatterer(how: str):
  """`scatter(base, updates, *index_arrays)`, jitted (as `_indexer`, for eager calls)."""
  def scatter(base, updates, *index):
    base = jnp.asarray(base)
    at, updates = base.at[index], jnp.asarray(updates).astype(base.dtype)
    combine = {"set": at.set, "add": at.add, "sub": at.subtract, "mul": at.multiply, "max": at.max, "min": at.min}
    return combine[how](updates)
  return jax.jit(scatter)


@register("ScatterNd")
def scatter_nd(ctx, indices, updates, shape_):
  m = xp(indices, updates)
  zeros = m.zeros(_static(ctx, shape_, "shape"), dtype=_dtype(m, ctx.attr("T")))
  return _scatter(zeros, indices, updates, "add")


_TENSOR_SCATTER = {"TensorScatterUpdate": "set", "TensorScatterAdd": "add", "TensorScatterSub": "sub",
                   "TensorScatterMax": "max", "TensorScatterMin": "min"}


@register(*_TENSOR_SCATTER)
def tensor_scatter(ctx, tensor, indices, updates):
  return _scatter(tensor, indices, updates, _TENSOR_SCATTER[ctx.op])


def _segment_initial(how: str, dtype) -> object:
  """TF's value for an empty segment: the identity, or the dtype's extreme finite value."""
  if how in ("add", "mul"):
    return 0 if how == "add" else 1
  info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else ml_dtypes.finfo(dtype)
  return info.min if how == "max" else info.max


_SEGMENT_REDUCTIONS = {"UnsortedSegmentSum": "add", "UnsortedSegmentProd": "mul",
                       "UnsortedSegmentMax": "max", "UnsortedSegmentMin": "min"}


@register(*_SEGMENT_REDUCTIONS)
def unsorted_segment(ctx, data, segment_ids, num_segments):
  """Reduces the slices of `data` into `num_segments` rows; negative ids are dropped like TF."""
  how = _SEGMENT_REDUCTIONS[ctx.op]
  n = _static_int(ctx, num_segments, "num_segments")
  if is_concrete(data) and is_concrete(segment_ids):
    kept = (segment_ids >= 0) & (segment_ids < n)
    return _segment_reduce(np.asarray(data)[kept], np.asarray(segment_ids)[kept], n, how)
  ids = jnp.where(segment_ids < 0, n, segment_ids)   # out of range: dropped by the scatter
  if how == "mul":
    return segment_prod(jnp.asarray(data), ids, segments=n)
  return _segment_reduce(jnp.asarray(data), ids, n, how)


def _segment_reduce(data, ids, n: int, how: str):
  base = xp(data, ids).full((n,) + np.shape(data)[np.ndim(ids):], _segment_initial(how, data.dtype),
                            dtype=data.dtype)
  return _scatter(base, ids[..., None], data, how)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _segment_prod(data, ids, n: int):
  """Segment products; JAX cannot differentiate a multiplying scatter with repeated indices."""
  return _segment_reduce(data, ids, n, "mul")


@_segment_prod.defjvp
def _segment_prod_jvp(n, primals, tangents):
  """d out[s] / d data[i] = product of the other entries of segment s (zeros handled like TF)."""
  data, ids = primals
  out = _segment_prod(data, ids, n)
  is_zero = data == 0
  zeros_in_segment = _segment_reduce(is_zero.astype(jnp.int32), ids, n, "add")
  nonzero_product = _segment_reduce(jnp.where(is_zero, 1, data), ids, n, "mul")
  per_entry = lambda v: jnp.take(v, ids, axis=0, mode="fill", fill_value=0)
  zeros = per_entry(zeros_in_segment)
  partial = jnp.where(zeros == 0, per_entry(out) / jnp.where(is_zero, 1, data),
                      jnp.where((zeros == 1) & is_zero, per_entry(nonzero_product), 0))
  return out, _segment_reduce(partial * tangents[0], ids, n, "add")


@export_marks.marked("segment_prod", static=True)
def segment_prod(data, ids, *, segments: int):
  """`_segment_prod`, whose derivative an exported artifact keeps (a multiplying scatter has none in JAX)."""
  return _segment_prod(data, ids, int(segments))
