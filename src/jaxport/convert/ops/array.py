"""Op rules: shapes, slicing, padding, selection and other array plumbing (gathers,
scatters and segment reductions are in `gather_scatter.py`).

Shape arithmetic stays NumPy: when every input of a rule is a trace-time
constant the rule computes with NumPy and returns NumPy, so reshape targets and
slice bounds derived from `tf.shape` stay static under `jax.jit`.

Differences from TF, by design of XLA:
  * values that decide an output shape (`Range`'s bounds, `Fill`/`Reshape`/`Tile`
    operands, the data of `Where` with one input and `Unique*` (but see `unique.py`)) must be known when
    tracing (`_util.static_value`): constants always are, and so is everything when
    the converted function runs without jit; under `jax.jit`/`vmap` they raise
    `DynamicShapeError`. `jax.grad` works when the value is concrete there (e.g. a
    comparison mask).
  * a traced `Slice` begin or `StridedSlice` index is clamped into range; TF raises.
  * with JAX's x64 mode off, int64/float64 values computed by JAX come out as
    int32/float32; NumPy constants (shapes, `Where`'s coordinates) keep TF's
    dtype inside the graph and reach the caller in JAX's canonical dtype.
  * a range slice (`x[i:i + 2]`, `x[:, i, 1:]`) whose bounds arrive in a traced
    begin/end vector has no static size and raises; single-element indexing with
    a traced index (`x[i]`, `x[:, i]`) works.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops import softmax_product
from jaxport.convert.ops._util import (cast, has_symbolic, is_concrete, is_symbolic, known_value, shape_value,
                                       static_ints, static_value, xp)
from jaxport.convert.registry import register
from jaxport.errors import DynamicShapeError, InvalidNodeError, UnsupportedValueError


def _static(ctx, x, operand: str) -> list[int]:
  return static_ints(x, operand, ctx)


def _static_int(ctx, x, operand: str) -> int:
  values = _static(ctx, x, operand)
  if len(values) != 1:
    raise InvalidNodeError(f"{ctx.op} operand {operand!r} (node {ctx.name!r}) must be a scalar, got {values}")
  return values[0]


def _axis(ctx, axis: int, ndim: int) -> int:
  if not -ndim <= axis < max(ndim, 1):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: axis {axis} is out of range for rank {ndim}")
  return axis % ndim if ndim else 0


def _dtype(m, dtype) -> np.dtype:
  """The TF dtype for NumPy results; JAX results get JAX's canonical dtype (x64 may be off)."""
  return np.dtype(dtype) if m is np else jax.dtypes.canonicalize_dtype(dtype)


def _as_plain(x):
  """NumPy scalars from indexing become 0-d arrays; everything else is unchanged."""
  if is_symbolic(x):
    return np.asarray(x, dtype=object)   # a symbolic dim from a shape's object array
  return np.asarray(x) if isinstance(x, np.generic) else x


def _static_scalar(ctx, x, operand: str) -> np.ndarray:
  """An operand of any dtype that must be a trace-time constant."""
  return static_value(x, operand, ctx)


def _concrete_values(ctx, x) -> np.ndarray:
  """Input values for ops whose output shape depends on them."""
  return static_value(x, "input values", ctx)


# --------------------------------------------------------------------------- shapes


@register("Shape", size_bounded=True)
def shape(ctx, x):
  return shape_value(np.shape(x), ctx.attr("out_type"))


@register("ShapeN", size_bounded=True)
def shape_n(ctx, *xs):
  return [shape_value(np.shape(x), ctx.attr("out_type")) for x in xs]


@register("Size", size_bounded=True)
def size(ctx, x):
  n = math.prod(np.shape(x))
  if is_symbolic(n):   # a dimension expression (jax.export shape polymorphism)
    return np.asarray(n, dtype=object)
  return np.asarray(np.int64(n), dtype=ctx.attr("out_type"))


@register("Rank", size_bounded=True)
def rank(ctx, x):
  return np.asarray(np.ndim(x), dtype=np.int32)


@register("BroadcastArgs", size_bounded=True)
def broadcast_args(ctx, s0, s1):
  out = np.broadcast_shapes(tuple(_static(ctx, s0, "s0")), tuple(_static(ctx, s1, "s1")))
  return np.asarray(out, dtype=ctx.attr("T"))


@register("BroadcastGradientArgs", size_bounded=True)
def broadcast_gradient_args(ctx, s0, s1):
  """The axes each input's gradient is summed over (TF's BCast: none when shapes are equal)."""
  shapes = [_static(ctx, s0, "s0"), _static(ctx, s1, "s1")]
  np.broadcast_shapes(*map(tuple, shapes))   # raises on incompatible shapes
  dtype = ctx.attr("T")
  if shapes[0] == shapes[1]:
    return np.zeros(0, dtype), np.zeros(0, dtype)
  rank_ = max(map(len, shapes))
  padded = [[1] * (rank_ - len(s)) + s for s in shapes]
  return tuple(np.asarray([i for i, d in enumerate(p) if d == 1], dtype=dtype) for p in padded)


# --------------------------------------------------------------------------- reshaping


@register("Reshape", size_bounded=True)
def reshape(ctx, x, target):
  target = _static(ctx, target, "shape")
  if -1 in target and 0 in target:   # TF infers -1 from the non-zero sizes on both sides
    known = int(np.prod([d for d in target if d > 0]))
    target[target.index(-1)] = int(np.prod([d for d in np.shape(x) if d > 0])) // max(known, 1)
  return xp(x).reshape(x, target)


@register("Squeeze", size_bounded=True)
def squeeze(ctx, x):
  dims = ctx.attr("squeeze_dims", [])
  axes = tuple(_axis(ctx, d, np.ndim(x)) for d in dims) if dims else None
  return xp(x).squeeze(x, axis=axes)


@register("ExpandDims", size_bounded=True)
def expand_dims(ctx, x, axis):
  return xp(x).expand_dims(x, _axis(ctx, _static_int(ctx, axis, "dim"), np.ndim(x) + 1))


@register("Transpose", "ConjugateTranspose", size_bounded=True)
def transpose(ctx, x, perm):
  m = xp(x)
  out = m.transpose(x, _static(ctx, perm, "perm"))
  if ctx.op == "ConjugateTranspose" and np.iscomplexobj(out):
    out = m.conj(out)
  return out


@register("Pack", size_bounded=True)
def pack(ctx, *xs):
  m = xp(*xs)
  axis = _axis(ctx, ctx.attr("axis", 0), np.ndim(xs[0]) + 1)
  return cast(m.stack(xs, axis=axis), _dtype(m, ctx.attr("T")))   # symbolic dims stay symbolic


@register("Unpack", size_bounded=True)
def unpack(ctx, x):
  axis = _axis(ctx, ctx.attr("axis", 0), np.ndim(x))
  lead = (slice(None),) * axis
  return [_as_plain(x[lead + (i,)]) for i in range(ctx.attr("num"))]


def _concat(ctx, values, axis):
  m = xp(*values)
  axis = _axis(ctx, _static_int(ctx, axis, "axis"), np.ndim(values[0]))
  return cast(m.concatenate(values, axis=axis), _dtype(m, ctx.attr("T")))


@register("ConcatV2", size_bounded=True)
def concat_v2(ctx, *args):
  return _concat(ctx, args[:-1], args[-1])


@register("Concat", size_bounded=True)
def concat(ctx, axis, *values):
  return _concat(ctx, values, axis)


@register("ConcatOffset", size_bounded=True)
def concat_offset(ctx, axis, *shapes):
  """Where each input of a concatenation starts in the output (used by its gradient)."""
  dims = [_static(ctx, s, "shape") for s in shapes]
  axis = _axis(ctx, _static_int(ctx, axis, "concat_dim"), len(dims[0]))
  offsets, start = [], 0
  for d in dims:
    offset = np.zeros(len(d), dtype=ctx.attr("shape_type", np.int32))
    offset[axis] = start
    offsets.append(offset)
    start += d[axis]
  return offsets


@register("Split", size_bounded=True)
def split(ctx, axis, x):
  axis = _axis(ctx, _static_int(ctx, axis, "split_dim"), np.ndim(x))
  return list(xp(x).split(x, ctx.attr("num_split"), axis=axis))


@register("SplitV", size_bounded=True)
def split_v(ctx, x, size_splits, axis):
  axis = _axis(ctx, _static_int(ctx, axis, "split_dim"), np.ndim(x))
  sizes = _static(ctx, size_splits, "size_splits")
  if sizes.count(-1) > 1:
    raise InvalidNodeError(f"SplitV node {ctx.name!r}: at most one size_splits entry may be -1, got {sizes}")
  if -1 in sizes:
    sizes[sizes.index(-1)] = np.shape(x)[axis] - (sum(sizes) + 1)
  if sum(sizes) != np.shape(x)[axis] or min(sizes, default=0) < 0:
    raise InvalidNodeError(f"SplitV node {ctx.name!r}: size_splits {sizes} do not add up to dimension "
                           f"{np.shape(x)[axis]}")
  return list(xp(x).split(x, np.cumsum(sizes)[:-1].tolist(), axis=axis))


@register("Tile")
def tile(ctx, x, multiples):
  reps = _static(ctx, multiples, "multiples")
  if len(reps) != np.ndim(x):
    raise InvalidNodeError(f"Tile node {ctx.name!r}: multiples {reps} must have one entry per dimension of "
                           f"the input of shape {np.shape(x)}")
  return xp(x).tile(x, reps)


@register("BroadcastTo")
def broadcast_to(ctx, x, target):
  return xp(x).broadcast_to(x, _static(ctx, target, "shape"))


@register("Fill")
def fill(ctx, dims, value):
  dims = _static(ctx, dims, "dims")
  m = jnp if any(map(is_symbolic, dims)) else xp(value)   # NumPy has no symbolic dims
  return m.full(dims, value, dtype=_dtype(m, ctx.attr("T")))


# --------------------------------------------------------------------------- slicing


@register("Slice", size_bounded=True)
def slice_(ctx, x, begin, size_):
  sizes = _static(ctx, size_, "size")
  dims = np.shape(x)
  if known_value(begin) is None:
    # size -1 ("to the end") is static where that begin element is a constant of a packed begin
    starts = [_element(ctx, begin, i) if s == -1 else None for i, s in enumerate(sizes)]
    if any(s == -1 and not isinstance(b, int) for s, b in zip(sizes, starts)):
      raise UnsupportedValueError(f"Slice node {ctx.name!r}: with a begin that depends on the inputs, every size must "
                                  f"be known (got {sizes}); the slice size of `x[i:]` is not static")
    sizes = [d - b if s == -1 else s for s, b, d in zip(sizes, starts, dims)]
    return lax.dynamic_slice(x, [begin[i] for i in range(len(sizes))], sizes)
  starts = _static(ctx, begin, "begin")
  ends = [d if s == -1 else b + s for b, s, d in zip(starts, sizes, dims)]
  if any(not 0 <= b <= e <= d for b, e, d in zip(starts, ends, dims)):
    raise InvalidNodeError(f"Slice node {ctx.name!r}: begin {starts} and size {sizes} are out of bounds "
                           f"for shape {dims}")
  return _as_plain(x[tuple(slice(b, e) for b, e in zip(starts, ends))])


def _bits(mask: int, n: int) -> list[bool]:
  return [bool(mask >> i & 1) for i in range(n)]


class _StridedIndex:
  """A StridedSlice spec (sparse begin/end/strides and masks) as a NumPy-style index.

  `static` holds ints, slices, None (new axis) and at most one Ellipsis, which
  index exactly like TF's masks. Shrinking axes whose begin is traced are picked
  first with `lax.dynamic_index_in_dim(..., keepdims=True)` and read `0` in
  `static`. Range axes whose traced end is their traced begin plus a constant k
  (`x[i : i + k]`, known from the Pack and AddV2 that made them) are windows of
  size k, cut with `lax.dynamic_slice_in_dim`, and read `slice(None)` in
  `static`. A window that would leave the array, which TF shrinks, is moved
  inside as lax.dynamic_slice moves it (a checkify check with
  `enable_checkify_for_asserts`).
  """

  def __init__(self, ctx, begin, end, strides):
    strides = _static(ctx, strides, "strides")
    n = len(strides)
    begin_static, end_static = known_value(begin) is not None, known_value(end) is not None
    begin_v = _static(ctx, begin, "begin") if begin_static else None
    end_v = _static(ctx, end, "end") if end_static else None
    begin_mask = _bits(ctx.attr("begin_mask", 0), n)
    end_mask = _bits(ctx.attr("end_mask", 0), n)
    new_axis = _bits(ctx.attr("new_axis_mask", 0), n)
    shrink = _bits(ctx.attr("shrink_axis_mask", 0), n)
    ellipsis_mask = ctx.attr("ellipsis_mask", 0)
    if ellipsis_mask & (ellipsis_mask - 1):
      raise InvalidNodeError(f"StridedSlice node {ctx.name!r}: multiple ellipses in the slice spec are not allowed")
    ellipsis = _bits(ellipsis_mask, n)

    self.static: list = []
    self.dynamic_entries: list[tuple[int, object]] = []   # (position in `static`, traced index)
    self.windows: list[tuple[int, object, int]] = []       # (position in `static`, traced begin, size)
    for i in range(n):
      if ellipsis[i]:
        self.static.append(Ellipsis)
      elif new_axis[i]:
        self.static.append(None)
      elif shrink[i]:
        if strides[i] <= 0:
          raise InvalidNodeError(f"StridedSlice node {ctx.name!r}: a shrinking axis needs a positive stride")
        if begin_static:
          self.static.append(begin_v[i])
        else:
          self.dynamic_entries.append((len(self.static), begin[i]))
          self.static.append(0)
      else:
        start = None if begin_mask[i] else begin_v[i] if begin_static else _element(ctx, begin, i)
        stop = None if end_mask[i] else end_v[i] if end_static else _element(ctx, end, i)
        if isinstance(start, jax.Array) and isinstance(stop, jax.Array) and strides[i] == 1:
          size = _window_size(ctx, start, stop)
          if size is not None:
            self.windows.append((len(self.static), start, size))
            self.static.append(slice(None))
            continue
        if any(v is ... or isinstance(v, jax.Array) for v in (start, stop)):
          error = DynamicShapeError("StridedSlice", ctx.name, "range bounds")
          error.add_note("The bounds of a range slice decide its size; only single-element indexing (`x[i]`, "
                         "`x[:, i]`) and windows `x[i : i + k]` may use traced indices. For a range, use tf.slice "
                         "with a traced begin and a static size.")
          raise error
        self.static.append(slice(start, stop, strides[i]))

  def resolve(self, ctx, shape) -> tuple[list[tuple[int, object]], tuple]:
    """The dynamic picks as (input axis, traced index) and the static index, checked against `shape`."""
    consumed = sum(1 for s in self.static if s is not None and s is not Ellipsis)
    if consumed > len(shape):
      raise InvalidNodeError(f"StridedSlice node {ctx.name!r}: the slice spec indexes {consumed} dimensions, "
                             f"but the input has only {len(shape)}")
    axes, axis = [], 0
    for entry in self.static:
      axes.append(None if entry is None or entry is Ellipsis else axis)
      axis += len(shape) - consumed if entry is Ellipsis else int(entry is not None)
    dynamic_positions = {pos for pos, _ in self.dynamic_entries}
    for pos, (entry, axis) in enumerate(zip(self.static, axes)):
      if isinstance(entry, int) and pos not in dynamic_positions and not -shape[axis] <= entry < shape[axis]:
        raise InvalidNodeError(f"StridedSlice node {ctx.name!r}: index {entry} is out of bounds for dimension "
                               f"{axis} of size {shape[axis]}")
    for pos, start, size in self.windows:
      dim = shape[axes[pos]]
      if size > dim:
        raise InvalidNodeError(f"StridedSlice node {ctx.name!r}: a window of {size} along dimension {axes[pos]} "
                               f"of size {dim}")
      from jaxport.convert.ops.core import runtime_check
      runtime_check(ctx, (start >= 0) & (start + size <= dim),
                    f"the window of {size} from {{}} along dimension {axes[pos]} leaves its {dim} elements (TF "
                    "shrinks such a slice; a traced window keeps its size and is moved inside, as lax.dynamic_slice "
                    "moves it)", start)
    windows = [(axes[pos], start, size) for pos, start, size in self.windows]
    return [(axes[pos], index) for pos, index in self.dynamic_entries], windows, tuple(self.static)


def _element(ctx, vector, i: int):
  """Element i of a traced vector packed from scalars in this trace: an int where it was a constant,
  the traced scalar otherwise; `...` when the vector's elements are not known."""
  record = ctx.runtime.elements.get(id(vector))
  if record is None or record[0] is not vector:
    return ...
  value = record[1][i]
  return int(np.asarray(value)) if is_concrete(value) else value


def _window_size(ctx, start, stop) -> int | None:
  """k when traced `start` and `stop` are one traced scalar plus constants that differ by k >= 0
  (`x[j + 1 : j + 3]`), else None."""
  def base(value):   # (x, c) for value = x + c noted by the interpreter, else (value, 0)
    offset = ctx.runtime.offsets.get(id(value))
    return (offset[1], int(np.asarray(offset[2]))) if offset is not None and offset[0] is value else (value, 0)
  (x, low), (y, high) = base(start), base(stop)
  return high - low if x is y and high >= low else None


def _normalized_index(index, dim: int):
  index = jnp.asarray(index)
  return jnp.where(index < 0, index + dim, index)


@register("StridedSlice", size_bounded=True)
def strided_slice(ctx, x, begin, end, strides):
  dynamic, windows, index = _StridedIndex(ctx, begin, end, strides).resolve(ctx, np.shape(x))
  for axis, i in dynamic:
    x = lax.dynamic_index_in_dim(x, _normalized_index(i, np.shape(x)[axis]), axis, keepdims=True)
  for axis, start, size in windows:
    x = lax.dynamic_slice_in_dim(x, start, size, axis)
  return _as_plain(x[index])


@register("StridedSliceGrad")
def strided_slice_grad(ctx, shape_, begin, end, strides, dy):
  """The gradient of StridedSlice: `dy` written into zeros of the input's shape."""
  full_shape = _static(ctx, shape_, "shape")
  starts, inner_shape, index = _traced_windows(ctx, begin, end, strides, full_shape)
  if is_concrete(dy) and not starts:
    out = np.zeros(inner_shape, dtype=np.asarray(dy).dtype)
    out[index] = dy
    return out
  inner = jnp.zeros(inner_shape, dtype=dy.dtype).at[index].set(dy)
  if not starts:
    return inner
  return lax.dynamic_update_slice(jnp.zeros(full_shape, dtype=dy.dtype), inner, starts)


def _traced_windows(ctx, begin, end, strides, shape):
  """A StridedSlice spec on `shape` as (the start of the window its traced picks and windows cut, or
  [] when there are none; that window's shape; the static index into it)."""
  dynamic, windows, index = _StridedIndex(ctx, begin, end, strides).resolve(ctx, shape)
  if not dynamic and not windows:
    return [], list(shape), index
  starts, window = [jnp.zeros((), jnp.int32)] * len(shape), list(shape)
  for axis, i in dynamic:
    starts[axis], window[axis] = _normalized_index(i, shape[axis]).astype(jnp.int32), 1
  for axis, start, size in windows:
    starts[axis], window[axis] = jnp.asarray(start).astype(jnp.int32), size
  return starts, window, index


# --------------------------------------------------------------------------- padding


def _paddings(ctx, paddings, x) -> list[tuple[int, int]]:
  flat = _static(ctx, paddings, "paddings")
  if len(flat) != 2 * np.ndim(x):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: paddings must have shape [{np.ndim(x)}, 2]")
  pairs = list(zip(flat[::2], flat[1::2]))
  if any(p < 0 for pair in pairs for p in pair):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: paddings must be non-negative, got {pairs}")
  return pairs


@register("Pad")
def pad(ctx, x, paddings):
  pairs = _paddings(ctx, paddings, x)
  return xp(x).pad(x, pairs) if pairs else xp(x).asarray(x)   # a 0-d input has nothing to pad


@register("PadV2")
def pad_v2(ctx, x, paddings, constant_value):
  pairs = _paddings(ctx, paddings, x)
  m = xp(x, constant_value)
  return m.pad(x, pairs, constant_values=constant_value) if pairs else m.asarray(x)


def _mirror_mode(ctx) -> str:
  """TF's MirrorPad mode as NumPy's `np.pad` mode."""
  mode = ctx.attr("mode")
  mode = mode.decode() if isinstance(mode, bytes) else mode
  if mode not in ("REFLECT", "SYMMETRIC"):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: unknown mode {mode!r}")
  return mode.lower()


@register("MirrorPad")
def mirror_pad(ctx, x, paddings):
  mode = _mirror_mode(ctx)
  pairs = _paddings(ctx, paddings, x)
  limit = 0 if mode == "reflect" else 1
  for (lo, hi), d in zip(pairs, np.shape(x)):
    if max(lo, hi) > d - 1 + limit:
      raise InvalidNodeError(f"MirrorPad node {ctx.name!r}: {mode} paddings {pairs} are too large for shape "
                             f"{np.shape(x)}")
  return xp(x).pad(x, pairs, mode=mode) if pairs else xp(x).asarray(x)


@register("MirrorPadGrad")
def mirror_pad_grad(ctx, grad, paddings):
  """The gradient of MirrorPad: padded entries folded back onto the ones they mirror."""
  pairs = _paddings(ctx, paddings, grad)
  shape = [d - lo - hi for d, (lo, hi) in zip(np.shape(grad), pairs)]
  mode = _mirror_mode(ctx)
  _, pullback = jax.vjp(lambda x: jnp.pad(x, pairs, mode=mode), jnp.zeros(shape, grad.dtype))
  return pullback(jnp.asarray(grad))[0]


# --------------------------------------------------------------------------- selection


@register("Where")
def where(ctx, condition):
  """Coordinates of the true (non-zero) elements, int64 [num_true, rank]."""
  return np.argwhere(_concrete_values(ctx, condition)).astype(np.int64)


@register("UnravelIndex", size_bounded=True)
def unravel_index(ctx, indices, dims):
  """The coordinates in an array of shape `dims` of flat `indices` (0-D or 1-D): [len(dims), ...].
  As TF's kernel: C++ (truncating) division and remainder; empty indices and indices >= the size refused."""
  if np.size(indices) == 0:
    raise InvalidNodeError(f"UnravelIndex node {ctx.name!r}: received empty tensor indices (TF refuses them)")
  known_indices, known_dims = known_value(indices), known_value(dims)
  if known_indices is not None and known_dims is not None:
    size = int(np.prod(known_dims))
    if np.any(known_indices >= size):
      raise InvalidNodeError(f"UnravelIndex node {ctx.name!r}: index is out of bound as with dims: indices "
                             f"{known_indices.tolist()} for dims {known_dims.tolist()} (size {size})")
  m = xp(indices, dims)
  strides = m.flip(m.cumprod(m.flip(dims), dtype=dims.dtype))   # the size of each dim's trailing block, outermost first
  trailing = m.concatenate([strides[1:], m.ones(1, strides.dtype)]).reshape((-1,) + (1,) * np.ndim(indices))
  quotient = _truncated_div(m, indices, trailing)
  dims = m.reshape(dims, trailing.shape)
  return (quotient - _truncated_div(m, quotient, dims) * dims).astype(indices.dtype)


def _truncated_div(m, a, b):
  """C++ integer division (toward zero)."""
  if m is jnp:
    return lax.div(*jnp.broadcast_arrays(a, b))
  return (a // b + ((a % b != 0) & ((a < 0) != (b < 0)))).astype(np.result_type(a, b))   # floor, then toward 0


@register("Select", size_bounded=True)
def select(ctx, condition, t, e):
  """Select v1: a vector condition picks rows of higher-rank `t`/`e`."""
  if np.ndim(condition) == 1 and np.ndim(t) > 1:
    condition = condition.reshape((-1,) + (1,) * (np.ndim(t) - 1))
  return xp(condition, t, e).where(condition, t, e)


@register("SelectV2", size_bounded=True)
def select_v2(ctx, condition, t, e):
  return softmax_product.remember_masked(ctx, xp(condition, t, e).where(condition, t, e), condition, t, e)


@register("OneHot")
def one_hot(ctx, indices, depth, on_value, off_value):
  depth = _static_int(ctx, depth, "depth")
  m = xp(indices, on_value, off_value)
  axis = _axis(ctx, ctx.attr("axis", -1), np.ndim(indices) + 1)
  positions = np.arange(depth).reshape([depth if d == axis else 1 for d in range(np.ndim(indices) + 1)])
  hit = m.expand_dims(indices, axis) == positions
  return m.where(hit, on_value, off_value).astype(_dtype(m, ctx.attr("T")))


# --------------------------------------------------------------------------- reordering


@register("ReverseV2", size_bounded=True)
def reverse_v2(ctx, x, axis):
  axes = tuple(_axis(ctx, a, np.ndim(x)) for a in _static(ctx, axis, "axis"))
  return xp(x).flip(x, axis=axes) if axes else x


@register("Reverse")
def reverse(ctx, x, dims):
  axes = tuple(i for i, flag in enumerate(_static(ctx, dims, "dims")) if flag)
  return xp(x).flip(x, axis=axes) if axes else x


@register("ReverseSequence")
def reverse_sequence(ctx, x, seq_lengths):
  """Reverses the first `seq_lengths[b]` entries along `seq_dim` of each batch entry `b`."""
  ndim = np.ndim(x)
  seq_dim = _axis(ctx, ctx.attr("seq_dim"), ndim)
  batch_dim = _axis(ctx, ctx.attr("batch_dim", 0), ndim)
  m = xp(x, seq_lengths)
  steps = np.arange(np.shape(x)[seq_dim]).reshape([-1 if d == seq_dim else 1 for d in range(ndim)])
  lengths = m.reshape(seq_lengths, [-1 if d == batch_dim else 1 for d in range(ndim)])
  source = m.where(steps < lengths, lengths - 1 - steps, steps)
  return m.take_along_axis(x, m.broadcast_to(source, np.shape(x)), axis=seq_dim)


@register("Roll", size_bounded=True)
def roll(ctx, x, shift, axis):
  axes = [_axis(ctx, a, np.ndim(x)) for a in _static(ctx, axis, "axis")]
  if is_concrete(shift):
    shifts = _static(ctx, shift, "shift")
    if len(shifts) != len(axes):
      raise InvalidNodeError(f"Roll node {ctx.name!r}: shift {shifts} and axis {axes} must have the same length")
    return xp(x).roll(x, shifts, axis=axes)
  return jnp.roll(x, shift, axis=tuple(axes))


@register("InvertPermutation")
def invert_permutation(ctx, x):
  m = xp(x)
  return m.argsort(x).astype(_dtype(m, ctx.attr("T")))


# --------------------------------------------------------------------------- sequences


@register("Range")
def range_(ctx, start, limit, delta):
  """TF's Range, computed in `Tidx` like its kernel: the length, then `start + i * delta`."""
  dtype = np.dtype(ctx.attr("Tidx"))
  offset = ctx.runtime.offsets.get(id(limit))
  if (offset is not None and offset[0] is limit and offset[1] is start and is_concrete(delta)
      and np.issubdtype(dtype, np.integer)):
    return _range_from(ctx, start, offset[2], delta, dtype)
  if any(has_symbolic(v) for v in (start, limit, delta)):
    return _symbolic_range(ctx, start, limit, delta, dtype)
  m = xp(start, limit, delta)   # jax Arrays (a result over max_constant_bytes): a staged iota
  start, limit, delta = (np.asarray(_static_scalar(ctx, v, n), dtype=dtype)[()]
                         for v, n in ((start, "start"), (limit, "limit"), (delta, "delta")))
  if delta == 0:
    raise InvalidNodeError(f"Range node {ctx.name!r}: delta must not be 0")
  if (delta > 0 and start > limit) or (delta < 0 and start < limit):
    raise InvalidNodeError(f"Range node {ctx.name!r}: start {start} cannot reach limit {limit} with delta {delta}")
  if np.issubdtype(dtype, np.integer):
    return m.arange(start, limit, delta, dtype=_dtype(m, dtype))
  n = int(np.ceil(np.abs((limit - start) / delta)))
  return start + m.arange(n).astype(_dtype(m, dtype)) * delta


def _symbolic_range(ctx, start, limit, delta, dtype):
  """Range whose start or limit is a symbolic dim (`tf.range(tf.shape(x)[0])` in a batch-polymorphic
  export): an iota of the symbolic length. TF refuses bounds the step cannot reach; a symbolic bound is
  assumed to be reachable."""
  start, limit, delta = (np.asarray(v).reshape(()).item() if is_concrete(v) else None for v in (start, limit, delta))
  if start is None or limit is None or delta is None or is_symbolic(delta) or not np.issubdtype(dtype, np.integer):
    error = DynamicShapeError("Range", ctx.name, "bounds")
    error.add_note("A symbolic bound needs the other bound and the step known at trace time, and an integer "
                   "type; export with a fixed batch (batch_polymorphic=False) instead.")
    raise error
  delta = int(delta)
  if delta == 0:
    raise InvalidNodeError(f"Range node {ctx.name!r}: delta must not be 0")
  span = limit - start if delta > 0 else start - limit
  length = (span + abs(delta) - 1) // abs(delta)
  values = lax.iota(dtype, length)
  values = values if delta == 1 else values * np.asarray(delta, dtype)
  return values if not is_symbolic(start) and int(start) == 0 else jnp.asarray(start, dtype) + values


def _range_from(ctx, start, length, delta, dtype):
  """`tf.range(start, start + length, delta)` (integers) for a traced start: its length is static."""
  length, delta = (int(np.asarray(v, dtype=dtype)) for v in (length, delta))
  if delta == 0:
    raise InvalidNodeError(f"Range node {ctx.name!r}: delta must not be 0")
  if length * delta < 0:
    raise InvalidNodeError(f"Range node {ctx.name!r}: start cannot reach start + {length} with delta {delta}")
  n = -(-abs(length) // abs(delta))
  return jnp.asarray(start, dtype) + jnp.arange(n, dtype=dtype) * delta


@register("LinSpace")
def lin_space(ctx, start, stop, num):
  """`start + i * step`, the last value exactly `stop`, as TF's kernel computes it."""
  num = _static_int(ctx, num, "num")
  if num <= 0:
    raise InvalidNodeError(f"LinSpace node {ctx.name!r}: num must be positive, got {num}")
  m = xp(start, stop)
  dtype = _dtype(m, ctx.attr("T"))
  if num == 1:
    return m.reshape(m.asarray(start, dtype), (1,))
  step = (stop - start) / (num - 1)
  head = start + step * np.arange(num - 1).astype(dtype)
  return m.concatenate([head, m.reshape(stop, (1,))]).astype(dtype)


# --------------------------------------------------------------------------- matrix bands and diagonals


@register("MatrixBandPart")
def matrix_band_part(ctx, x, num_lower, num_upper):
  """Keeps the band `-num_lower <= col - row <= num_upper` (negative means unbounded), zeroes the rest."""
  rows, cols = np.shape(x)[-2:]
  m = xp(x, num_lower, num_upper)
  below = np.arange(rows)[:, None] - np.arange(cols)[None, :]
  in_band = (((num_lower < 0) | (below <= num_lower)) & ((num_upper < 0) | (-below <= num_upper)))
  return m.where(in_band, x, m.zeros((), dtype=x.dtype))


def _diag_range(ctx, k) -> tuple[int, int]:
  ks = _static(ctx, k, "k")
  if not 1 <= len(ks) <= 2 or ks[0] > ks[-1]:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: k must be a scalar or a pair lo <= hi, got {ks}")
  return ks[0], ks[-1]


def _diag_len(d, rows: int, cols: int):
  return np.minimum(rows + np.minimum(d, 0), cols - np.maximum(d, 0))


def _diag_offset(d, max_len: int, rows: int, cols: int, align: str):
  """Left padding of diagonal(s) `d` in the packed layout (TF's `align`: superdiagonals_subdiagonals)."""
  super_align, sub_align = align.split("_")
  right = ((d >= 0) & (super_align == "RIGHT")) | ((d <= 0) & (sub_align == "RIGHT"))
  return np.where(right, max_len - _diag_len(d, rows, cols), 0)


def _align(ctx) -> str:
  align = ctx.attr("align", "LEFT_LEFT")   # v1/v2 ops have no attribute; v2 packs left-aligned
  return align.decode() if isinstance(align, bytes) else align


def _packed_positions(k0: int, k1: int, rows: int, cols: int, max_len: int, align: str):
  """For each matrix entry: its packed diagonal, its position there, and whether it is in the band."""
  r = np.arange(rows)[:, None]
  c = np.arange(cols)[None, :]
  d = c - r
  position = np.minimum(r, c) + _diag_offset(d, max_len, rows, cols, align)
  in_band = (d >= k0) & (d <= k1) & (position < max_len)
  return np.where(in_band, k1 - d, 0), np.where(in_band, position, 0), in_band


def _packed_diagonals(diagonal, k0: int, k1: int):
  """Diagonals as [..., num_diags, max_len] (a single diagonal comes without the num_diags axis)."""
  return xp(diagonal).expand_dims(diagonal, -2) if k0 == k1 else diagonal


def _padding(ctx, m, padding_value):
  return m.asarray(padding_value).astype(_dtype(m, ctx.attr("T")))


@register("MatrixDiag", "MatrixDiagV2", "MatrixDiagV3")
def matrix_diag(ctx, diagonal, k=0, num_rows=-1, num_cols=-1, padding_value=0):
  k0, k1 = _diag_range(ctx, k) if ctx.op != "MatrixDiag" else (0, 0)
  max_len = np.shape(diagonal)[-1]
  rows, cols = _static_int(ctx, num_rows, "num_rows"), _static_int(ctx, num_cols, "num_cols")
  min_rows, min_cols = max_len - min(k1, 0), max_len + max(k0, 0)
  if rows == -1 and cols == -1:
    rows = cols = max(min_rows, min_cols)
  rows = min_rows if rows == -1 else rows
  cols = min_cols if cols == -1 else cols
  which, position, in_band = _packed_positions(k0, k1, rows, cols, max_len, _align(ctx))
  m = xp(diagonal, padding_value)
  values = _packed_diagonals(diagonal, k0, k1)[..., which, position]
  return m.where(in_band, values, _padding(ctx, m, padding_value))


@register("MatrixSetDiag", "MatrixSetDiagV2", "MatrixSetDiagV3")
def matrix_set_diag(ctx, x, diagonal, k=0):
  k0, k1 = _diag_range(ctx, k) if ctx.op != "MatrixSetDiag" else (0, 0)
  rows, cols = np.shape(x)[-2:]
  max_len = np.shape(diagonal)[-1]
  which, position, in_band = _packed_positions(k0, k1, rows, cols, max_len, _align(ctx))
  values = _packed_diagonals(diagonal, k0, k1)[..., which, position]
  return xp(x, diagonal).where(in_band, values, x)


@register("MatrixDiagPart", "MatrixDiagPartV2", "MatrixDiagPartV3")
def matrix_diag_part(ctx, x, k=0, padding_value=0):
  k0, k1 = _diag_range(ctx, k) if ctx.op != "MatrixDiagPart" else (0, 0)
  rows, cols = np.shape(x)[-2:]
  max_len = max(min(rows + min(k1, 0), cols - max(k0, 0)), 0)
  d = k1 - np.arange(k1 - k0 + 1)[:, None]           # the diagonal of each packed row
  i = np.arange(max_len)[None, :] - _diag_offset(d, max_len, rows, cols, _align(ctx))
  valid = (i >= 0) & (i < _diag_len(d, rows, cols))  # i: the position along the diagonal
  r = np.where(valid, i - np.minimum(d, 0), 0)
  c = np.where(valid, i + np.maximum(d, 0), 0)
  m = xp(x, padding_value)
  out = m.where(valid, x[..., r, c], _padding(ctx, m, padding_value))
  return out[..., 0, :] if k0 == k1 else out


# --------------------------------------------------------------------------- space <-> batch


def _block_args(ctx, block_shape, pairs, what):
  block = _static(ctx, block_shape, "block_shape")
  flat = _static(ctx, pairs, what)
  return block, [tuple(flat[2 * i:2 * i + 2]) for i in range(len(block))]


@register("SpaceToBatchND")
def space_to_batch_nd(ctx, x, block_shape, paddings):
  """Pads the M spatial dims, then moves each block offset into the batch (what dilated convs emit)."""
  block, pads = _block_args(ctx, block_shape, paddings, "paddings")
  m, shape = len(block), np.shape(x)
  module = xp(x)
  x = module.pad(x, [(0, 0)] + pads + [(0, 0)] * (len(shape) - 1 - m))
  padded = np.shape(x)
  if any(padded[1 + i] % b for i, b in enumerate(block)):
    raise InvalidNodeError(f"SpaceToBatchND node {ctx.name!r}: padded spatial shape {padded[1:1 + m]} is not "
                           f"divisible by block_shape {block}")
  split = [padded[0]] + [d for i, b in enumerate(block) for d in (padded[1 + i] // b, b)] + list(padded[1 + m:])
  x = x.reshape(split)
  perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] + list(range(1 + 2 * m, len(split)))
  x = module.transpose(x, perm)
  return x.reshape([padded[0] * int(np.prod(block))] + [padded[1 + i] // b for i, b in enumerate(block)]
                   + list(padded[1 + m:]))


@register("BatchToSpaceND")
def batch_to_space_nd(ctx, x, block_shape, crops):
  """The inverse of SpaceToBatchND: block offsets move back from the batch into space, then crop."""
  block, crop = _block_args(ctx, block_shape, crops, "crops")
  m, shape = len(block), np.shape(x)
  module = xp(x)
  batch = shape[0] // int(np.prod(block))
  x = x.reshape(list(block) + [batch] + list(shape[1:]))
  perm = [m] + [d for i in range(m) for d in (m + 1 + i, i)] + list(range(2 * m + 1, len(shape) + m))
  x = module.transpose(x, perm)
  x = x.reshape([batch] + [shape[1 + i] * b for i, b in enumerate(block)] + list(shape[1 + m:]))
  index = (slice(None),) + tuple(slice(lo, x.shape[1 + i] - hi) for i, (lo, hi) in enumerate(crop))
  return x[index]
