"""Op rules: the `Xla*` ops of TF's tf2xla bridge (what jax2tf's graph serialization emits).

Each maps to the matching `jax.lax` primitive. Attributes such as
`dimension_numbers` and `precision_config` are serialized XLA protos, parsed with
TF's `xla_data_pb2` (through `_tf_compat`). Rules whose computation is a library
function (reducers, comparators, scatter updates) recognise the common bodies
(a single Add/Mul/Maximum/Minimum/And/Or of the two arguments, a lexicographic
less-than) and use lax's differentiable primitives for them; other bodies run
through the general `lax.reduce`/`lax.reduce_window` (or a comparison sort).

jax2tf artifacts, each behind a config key as in tf2jax:
* `infer_cumulative_reduction_from_jax2tf`: a reduce window spanning a whole axis
  with padding (n-1, 0) or (0, n-1) becomes `lax.cumsum`/`cumprod`/`cummax`/`cummin`;
* `infer_relu_from_jax2tf`: the `Maximum` rule (`ops/math.py`) turns jax2tf's
  `Maximum(x, 0)` relu into `jax.nn.relu`.

Known differences from TF: scatters whose update body is not one of the
recognised ones, and select-and-scatter other than max/min pooling's, raise; a
sort comparator that is not a lexicographic less-than runs as an O(n^2)
comparison sort; `XlaRngBitGenerator` needs `jax_enable_x64` for 64-bit outputs
or a traced state; the SPMD shape ops only convert when the sharding has one shard.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import _tf_compat
from jaxport.convert.ops._util import is_concrete, static_ints, static_value
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

# --------------------------------------------------------------------------- protos


@functools.lru_cache(maxsize=256)
def _parse(message: str, raw: bytes):
  proto = getattr(_tf_compat.xla_data_pb2(), message)()
  proto.ParseFromString(raw)
  return proto


def _proto(ctx, key: str, message: str):
  """The attribute `key` parsed as the XLA proto `message` (empty attribute: default proto)."""
  raw = ctx.attr(key, b"") or b""
  if isinstance(raw, str):   # graph decoding keeps valid UTF-8 as text
    raw = raw.encode("utf-8")
  try:
    return _parse(message, raw)
  except Exception as e:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: attribute {key!r} is not a serialized "
                           f"xla.{message} ({e}); re-export the graph with a matching TF version") from None


def _precision(ctx):
  """`precision_config` as lax precision: None, one Precision, or one per operand."""
  config = _proto(ctx, "precision_config", "PrecisionConfig")
  if any(int(p) > 2 for p in config.operand_precision):
    raise NotImplementedError(f"{ctx.op} node {ctx.name!r}: precision {list(config.operand_precision)} "
                              "includes a packed-operand mode lax has no counterpart for; "
                              "export with DEFAULT, HIGH or HIGHEST precision.")
  levels = [lax.Precision(int(p)) for p in config.operand_precision]
  if not levels:
    return None
  return levels[0] if len(levels) == 1 else tuple(levels)


def _preferred_type(ctx):
  dtype = ctx.attr("preferred_element_type", None)
  return None if dtype is None else jax.dtypes.canonicalize_dtype(dtype)


def _common_dtype(lhs, rhs):
  """Both operands in one dtype (V2 ops allow mixed operand types; lax wants one)."""
  lhs, rhs = jnp.asarray(lhs), jnp.asarray(rhs)
  if lhs.dtype != rhs.dtype:
    dtype = jnp.promote_types(lhs.dtype, rhs.dtype)
    lhs, rhs = lhs.astype(dtype), rhs.astype(dtype)
  return lhs, rhs


# --------------------------------------------------------------------------- library-function bodies

# TF ops that are a monoid when applied to a body's two arguments.
_MONOID_OPS = {"Add": "add", "AddV2": "add", "Mul": "mul", "Maximum": "max", "Minimum": "min",
               "LogicalAnd": "and", "LogicalOr": "or", "BitwiseAnd": "and", "BitwiseOr": "or"}
_MONOID_FNS = {"add": lax.add, "mul": lax.mul, "max": lax.max, "min": lax.min,
               "and": lax.bitwise_and, "or": lax.bitwise_or}
_CUMULATIVE = {"add": lax.cumsum, "mul": lax.cumprod, "max": lax.cummax, "min": lax.cummin}


def _lowest(dtype) -> np.ndarray:
  if jnp.issubdtype(dtype, jnp.inexact):
    return np.array(-np.inf, dtype)
  if dtype == np.bool_:
    return np.array(False)
  return np.array(jnp.iinfo(dtype).min, dtype)


def _highest(dtype) -> np.ndarray:
  if jnp.issubdtype(dtype, jnp.inexact):
    return np.array(np.inf, dtype)
  if dtype == np.bool_:
    return np.array(True)
  return np.array(jnp.iinfo(dtype).max, dtype)


def _identity(monoid: str, dtype) -> np.ndarray:
  dtype = np.dtype(dtype)
  if monoid == "add" or monoid == "or":
    return np.zeros((), dtype)
  if monoid == "mul":
    return np.ones((), dtype)
  if monoid == "max":
    return _lowest(dtype)
  if monoid == "min":
    return _highest(dtype)
  return np.array(True) if dtype == np.bool_ else np.array(-1).astype(dtype)   # and: all bits set


def _is_identity(monoid: str, init) -> bool:
  if not is_concrete(init):
    return False
  init = np.asarray(init)
  return init.shape == () and bool(init == _identity(monoid, init.dtype))


def _body(ctx, fn_attr) -> tuple[str, tuple[int, ...]] | None:
  """What a one-output library function computes, when it is a single op of its arguments.

  Returns (op type, argument indices it reads), ("arg", (i,)) when it returns
  argument i, or None for anything else. Identity nodes are looked through.
  """
  library = ctx.runtime.library
  key = ("xla_body", fn_attr.name)
  if key not in library.memo:
    fn = library[fn_attr.name]
    args = {name: i for i, name in enumerate(fn.inputs)}

    def source(ref):
      name, idx = ref
      node = fn.nodes[name]
      while node.op == "Identity" and name not in args:
        name, idx = node.inputs[0]
        node = fn.nodes[name]
      return name, idx, node

    found = None
    if len(fn.outputs) == 1:
      name, idx, node = source(fn.outputs[0])
      if name in args:
        found = ("arg", (args[name],))
      elif idx == 0:
        inputs = [source(ref)[0] for ref in node.inputs]
        if inputs and all(n in args for n in inputs):
          found = (node.op, tuple(args[n] for n in inputs))
    library.memo[key] = found
  return library.memo[key]


def _monoid(ctx, fn_attr) -> str | None:
  """"add", "mul", "max", "min", "and" or "or" when the body combines its two arguments so."""
  body = _body(ctx, fn_attr)
  if body is None or body[0] not in _MONOID_OPS or sorted(body[1]) != [0, 1]:
    return None
  return _MONOID_OPS[body[0]]


def _call_body(ctx, fn_attr, dtypes) -> Callable:
  """The library function as `fn(*args) -> list of arrays`, its outputs cast to `dtypes`."""
  def call(*args):
    outs = ctx.runtime.call(fn_attr.name, args)
    return [jnp.asarray(o, d) for o, d in zip(outs, dtypes)]
  return call


# --------------------------------------------------------------------------- dot and convolution


@register("XlaDot", "XlaDotV2")
def xla_dot(ctx, lhs, rhs):
  dn = _proto(ctx, "dimension_numbers", "DotDimensionNumbers")
  dims = ((tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)),
          (tuple(dn.lhs_batch_dimensions), tuple(dn.rhs_batch_dimensions)))
  lhs, rhs = _common_dtype(lhs, rhs)
  return lax.dot_general(lhs, rhs, dims, precision=_precision(ctx),
                         preferred_element_type=_preferred_type(ctx))


@register("XlaConv", "XlaConvV2", convolution=True)
def xla_conv(ctx, lhs, rhs, strides, padding, lhs_dilation, rhs_dilation, feature_group_count):
  dn = _proto(ctx, "dimension_numbers", "ConvolutionDimensionNumbers")
  specs = lax.ConvDimensionNumbers(
      (dn.input_batch_dimension, dn.input_feature_dimension, *dn.input_spatial_dimensions),
      (dn.kernel_output_feature_dimension, dn.kernel_input_feature_dimension, *dn.kernel_spatial_dimensions),
      (dn.output_batch_dimension, dn.output_feature_dimension, *dn.output_spatial_dimensions))
  pads = static_ints(padding, "padding", ctx)
  lhs, rhs = _common_dtype(lhs, rhs)
  return lax.conv_general_dilated(
      lhs, rhs, window_strides=static_ints(strides, "window_strides", ctx),
      padding=list(zip(pads[::2], pads[1::2])),
      lhs_dilation=static_ints(lhs_dilation, "lhs_dilation", ctx),
      rhs_dilation=static_ints(rhs_dilation, "rhs_dilation", ctx),
      dimension_numbers=specs,
      feature_group_count=static_ints(feature_group_count, "feature_group_count", ctx)[0],
      batch_group_count=ctx.attr("batch_group_count", 1) or 1,
      precision=_precision(ctx), preferred_element_type=_preferred_type(ctx))


@register("XlaEinsum")
def xla_einsum(ctx, a, b):
  return jnp.einsum(ctx.attr("equation"), jnp.asarray(a), jnp.asarray(b))


# --------------------------------------------------------------------------- gather and scatter


def _index_vector_last(indices, index_vector_dim: int, batching_dims):
  """XLA allows the index vector on any axis of `indices`; lax wants it last."""
  indices = jnp.asarray(indices)
  if index_vector_dim == indices.ndim:
    return indices[..., None], tuple(batching_dims)
  moved = jnp.moveaxis(indices, index_vector_dim, -1)
  return moved, tuple(d if d < index_vector_dim else d - 1 for d in batching_dims)


@register("XlaGather")
def xla_gather(ctx, operand, start_indices, slice_sizes):
  dn = _proto(ctx, "dimension_numbers", "GatherDimensionNumbers")
  indices, batching = _index_vector_last(start_indices, dn.index_vector_dim, dn.start_indices_batching_dims)
  dims = lax.GatherDimensionNumbers(
      offset_dims=tuple(dn.offset_dims), collapsed_slice_dims=tuple(dn.collapsed_slice_dims),
      start_index_map=tuple(dn.start_index_map), operand_batching_dims=tuple(dn.operand_batching_dims),
      start_indices_batching_dims=batching)
  # XLA clamps start indices so every slice is in bounds: lax's CLIP mode.
  return lax.gather(jnp.asarray(operand), indices, dims, tuple(static_ints(slice_sizes, "slice_sizes", ctx)),
                    indices_are_sorted=bool(ctx.attr("indices_are_sorted", False)),
                    mode=lax.GatherScatterMode.CLIP)


_SCATTERS = {"add": lax.scatter_add, "mul": lax.scatter_mul, "max": lax.scatter_max, "min": lax.scatter_min}


@register("XlaScatter")
def xla_scatter(ctx, operand, scatter_indices, updates):
  dn = _proto(ctx, "dimension_numbers", "ScatterDimensionNumbers")
  indices, batching = _index_vector_last(scatter_indices, dn.index_vector_dim,
                                         dn.scatter_indices_batching_dims)
  dims = lax.ScatterDimensionNumbers(
      update_window_dims=tuple(dn.update_window_dims), inserted_window_dims=tuple(dn.inserted_window_dims),
      scatter_dims_to_operand_dims=tuple(dn.scatter_dims_to_operand_dims),
      operand_batching_dims=tuple(dn.input_batching_dims), scatter_indices_batching_dims=batching)
  operand = jnp.asarray(operand)
  computation = ctx.attr("update_computation")
  monoid = _monoid(ctx, computation)
  if operand.dtype == np.bool_ and monoid in ("and", "or"):
    monoid = "min" if monoid == "and" else "max"
  if monoid in _SCATTERS:
    scatter = _SCATTERS[monoid]
  elif _body(ctx, computation) == ("arg", (1,)):
    scatter = lax.scatter
  else:
    raise NotImplementedError(
        f"XlaScatter node {ctx.name!r}: its update computation {computation.name!r} is not a single "
        "Add/Mul/Maximum/Minimum of its two arguments nor a replacement, which is all lax.scatter* "
        "can express. Convert it through TF's XLA lowering instead: "
        "jaxport.override_config('force_tier', 'stablehlo').")
  # XLA skips out-of-bounds updates: lax's FILL_OR_DROP mode.
  return scatter(operand, indices, jnp.asarray(updates, operand.dtype), dims,
                 indices_are_sorted=bool(ctx.attr("indices_are_sorted", False)),
                 mode=lax.GatherScatterMode.FILL_OR_DROP)


# --------------------------------------------------------------------------- windows and reductions


class _Window:
  """Static window parameters of a reduce-window node."""

  def __init__(self, dims, strides, base_dilation, window_dilation, padding):
    self.dims = static_ints(dims, "window_dimensions")
    self.strides = static_ints(strides, "window_strides")
    self.base_dilation = static_ints(base_dilation, "base_dilations")
    self.window_dilation = static_ints(window_dilation, "window_dilations")
    pads = static_ints(padding, "padding")
    self.padding = list(zip(pads[::2], pads[1::2]))

  def cumulative_axis(self, shape) -> tuple[int, bool] | None:
    """(axis, reverse) when the window is a cumulative reduction along one axis, as jax2tf emits."""
    ones = [1] * len(shape)
    if self.strides != ones or self.base_dilation != ones or self.window_dilation != ones:
      return None
    axes = [i for i, k in enumerate(self.dims) if k != 1]
    if len(axes) != 1 or self.dims[axes[0]] != shape[axes[0]]:
      return None
    axis, n = axes[0], shape[axes[0]]
    pads = [(0, 0)] * len(shape)
    for reverse, pad in ((False, (n - 1, 0)), (True, (0, n - 1))):
      pads[axis] = pad
      if self.padding == pads:
        return axis, reverse
    return None


def _monoid_reduce_window(x, init, monoid: str, window: _Window):
  """A monoid's reduce window; lax's differentiable primitives see the identity as init value.

  XLA skips padding and base-dilation holes and folds `init` into each window once,
  so any other init value is combined with the result afterwards.
  """
  fn = _MONOID_FNS[monoid]
  out = lax.reduce_window(x, _identity(monoid, x.dtype), fn, window.dims, window.strides, window.padding,
                          window.base_dilation, window.window_dilation)
  return out if _is_identity(monoid, init) else fn(out, jnp.asarray(init, x.dtype))


@register("XlaReduceWindow")
def xla_reduce_window(ctx, x, init, window_dimensions, window_strides, base_dilations, window_dilations,
                      padding):
  window = _Window(window_dimensions, window_strides, base_dilations, window_dilations, padding)
  x = jnp.asarray(x)
  computation = ctx.attr("computation")
  monoid = _monoid(ctx, computation)
  if monoid is None:
    body = _call_body(ctx, computation, [x.dtype])
    return lax.reduce_window(x, jnp.asarray(init, x.dtype), lambda a, b: body(a, b)[0], window.dims,
                             window.strides, window.padding, window.base_dilation,
                             window.window_dilation)
  cumulative = window.cumulative_axis(x.shape)
  if (cumulative and monoid in _CUMULATIVE and _is_identity(monoid, init)
      and ctx.config.get("infer_cumulative_reduction_from_jax2tf", True)):
    axis, reverse = cumulative
    return _CUMULATIVE[monoid](x, axis=axis, reverse=reverse)
  return _monoid_reduce_window(x, init, monoid, window)


@register("XlaSelectAndScatter")
def xla_select_and_scatter(ctx, operand, window_dimensions, window_strides, padding, source, init):
  """Max (or min) pooling's gradient: the vjp of the matching reduce window, plus `init`."""
  select, scatter = ctx.attr("select"), ctx.attr("scatter")
  chosen = _body(ctx, select)
  pooling = {("GreaterEqual", (0, 1)): "max", ("LessEqual", (1, 0)): "max",
             ("LessEqual", (0, 1)): "min", ("GreaterEqual", (1, 0)): "min"}.get(chosen)
  if pooling is None or _monoid(ctx, scatter) != "add":
    raise NotImplementedError(
        f"XlaSelectAndScatter node {ctx.name!r}: only max/min pooling's gradient converts natively "
        f"(select {select.name!r} a GreaterEqual or LessEqual of its arguments, scatter {scatter.name!r} "
        "an Add). Convert it through TF's XLA lowering instead: "
        "jaxport.override_config('force_tier', 'stablehlo').")
  operand = jnp.asarray(operand)
  ones = np.ones((), np.int32)
  window = _Window(window_dimensions, window_strides, ones.repeat(operand.ndim),
                   ones.repeat(operand.ndim), padding)
  _, pullback = jax.vjp(lambda x: _monoid_reduce_window(x, _identity(pooling, x.dtype), pooling, window),
                        operand)
  (out,) = pullback(jnp.asarray(source, operand.dtype))
  return out if _is_identity("add", init) else out + jnp.asarray(init, operand.dtype)


def _reduce(ctx, operands, inits, dims):
  """XLA Reduce of one or more operands with the node's `reducer` body."""
  operands = [jnp.asarray(x) for x in operands]
  reducer = ctx.attr("reducer")
  monoid = _monoid(ctx, reducer) if len(operands) == 1 else None
  if monoid is not None:
    (x,), (init,) = operands, inits
    out = lax.reduce(x, _identity(monoid, x.dtype), _MONOID_FNS[monoid], dims)
    return [out if _is_identity(monoid, init) else _MONOID_FNS[monoid](out, jnp.asarray(init, x.dtype))]
  dtypes = [x.dtype for x in operands]
  body = _call_body(ctx, reducer, dtypes)
  inits = [jnp.asarray(v, d) for v, d in zip(inits, dtypes)]
  out = lax.reduce(operands, inits, lambda xs, ys: body(*xs, *ys), dims)
  return list(out)


@register("XlaReduce")
def xla_reduce(ctx, x, init):
  return _reduce(ctx, [x], [init], tuple(ctx.attr("dimensions_to_reduce")))[0]


@register("XlaVariadicReduce", "XlaVariadicReduceV2")
def xla_variadic_reduce(ctx, *operands_and_inits):
  n = len(operands_and_inits) // 2
  return _reduce(ctx, operands_and_inits[:n], operands_and_inits[n:], tuple(ctx.attr("dimensions_to_reduce")))


# --------------------------------------------------------------------------- sorting


def _pairwise(compare: Callable, xs, n: int):
  """less[..., a, b] = compare(x[..., a], x[..., b]) for operands `xs` sorted along their last axis."""
  args = []
  for x in xs:
    shape = x.shape + (n,)
    args += [jnp.broadcast_to(x[..., :, None], shape).reshape(-1),
             jnp.broadcast_to(x[..., None, :], shape).reshape(-1)]
  flat = jax.vmap(lambda *scalars: jnp.asarray(compare(*scalars), bool))(*args)
  return flat.reshape(xs[0].shape + (n,))


def _probe_values(dtype, rs) -> np.ndarray:
  if dtype == np.bool_:
    values = np.array([False, True])
  elif jnp.issubdtype(dtype, jnp.unsignedinteger):
    values = np.array([0, 1, 3])
  else:
    values = np.array([-1.5, 0, 2] if jnp.issubdtype(dtype, jnp.inexact) else [-1, 0, 2])
  return values[rs.randint(len(values), size=48)].astype(dtype)


def _lexicographic_keys(compare: Callable, dtypes) -> int | None:
  """k when `compare` is an ascending lexicographic less-than over the first k operands.

  Decided by running the comparator on sample tuples (with ties) at trace time.
  """
  rs = np.random.RandomState(0)
  columns = [_probe_values(np.dtype(d), rs) for d in dtypes]
  try:
    with jax.ensure_compile_time_eval():
      less = np.asarray(_pairwise(compare, [jnp.asarray(c) for c in columns], len(columns[0])))
  except Exception:   # a body that cannot run on constants: use the general sort
    return None
  undecided = np.ones(less.shape, bool)
  expected = np.zeros(less.shape, bool)
  for k, c in enumerate(columns, start=1):
    lt, gt = c[:, None] < c[None, :], c[:, None] > c[None, :]
    expected |= undecided & lt
    undecided &= ~(lt | gt)
    if np.array_equal(less, expected):
      return k
  return None


def _comparison_sort(compare: Callable, operands, axis: int):
  """A stable sort by any strict weak order `compare`, from pairwise comparisons (O(n^2))."""
  xs = [jnp.moveaxis(jnp.asarray(x), axis, -1) for x in operands]
  n = xs[0].shape[-1]
  less = _pairwise(compare, xs, n)            # less[a, b]: x_a sorts before x_b
  later = jnp.swapaxes(less, -1, -2)          # later[a, b]: x_b sorts before x_a
  tie = ~less & ~later
  earlier_index = np.tril(np.ones((n, n), bool), k=-1)
  rank = jnp.sum(later, axis=-1) + jnp.sum(tie & earlier_index, axis=-1)
  order = jnp.argsort(rank, axis=-1)
  return [jnp.moveaxis(jnp.take_along_axis(x, order, axis=-1), -1, axis) for x in xs]


@register("XlaVariadicSort")
def xla_variadic_sort(ctx, *inputs):
  *operands, dimension = inputs
  operands = [jnp.asarray(x) for x in operands]
  axis = static_ints(dimension, "dimension", ctx)[0]
  comparator = ctx.attr("comparator")
  compare = lambda *scalars: ctx.runtime.call(comparator.name, scalars)[0]
  num_keys = _lexicographic_keys(compare, [x.dtype for x in operands])
  if num_keys is not None:
    return list(lax.sort(operands, dimension=axis, is_stable=bool(ctx.attr("is_stable", False)),
                         num_keys=num_keys))
  return _comparison_sort(compare, operands, axis % operands[0].ndim)


@register("XlaSort")
def xla_sort(ctx, x):
  return lax.sort(jnp.asarray(x), dimension=-1)


@register("XlaKeyValueSort")
def xla_key_value_sort(ctx, keys, values):
  return list(lax.sort((jnp.asarray(keys), jnp.asarray(values)), dimension=-1, num_keys=1))


# --------------------------------------------------------------------------- shapes and slices


@register("XlaPad")
def xla_pad(ctx, x, padding_value, padding_low, padding_high, padding_interior):
  x = jnp.asarray(x)
  config = list(zip(static_ints(padding_low, "padding_low", ctx), static_ints(padding_high, "padding_high", ctx),
                    static_ints(padding_interior, "padding_interior", ctx)))
  return lax.pad(x, jnp.asarray(padding_value, x.dtype), config)


def _start_indices(indices) -> list:
  """Start indices as scalars: Python ints when constant, else slices of the traced vector."""
  if is_concrete(indices):
    return static_ints(indices, "start_indices")
  indices = jnp.asarray(indices)
  return [indices[i] for i in range(indices.shape[0])]


@register("XlaDynamicSlice")
def xla_dynamic_slice(ctx, x, start_indices, size_indices):
  # XLA clamps start indices into range; negative ones do not count from the end.
  return lax.dynamic_slice(jnp.asarray(x), _start_indices(start_indices),
                           static_ints(size_indices, "size_indices", ctx), allow_negative_indices=False)


@register("XlaDynamicUpdateSlice")
def xla_dynamic_update_slice(ctx, x, update, indices):
  x = jnp.asarray(x)
  return lax.dynamic_update_slice(x, jnp.asarray(update, x.dtype), _start_indices(indices),
                                  allow_negative_indices=False)


# --------------------------------------------------------------------------- numerics, barriers, sharding


@register("XlaReducePrecision")
def xla_reduce_precision(ctx, x):
  return lax.reduce_precision(jnp.asarray(x), ctx.attr("exponent_bits"), ctx.attr("mantissa_bits"))


@register("XlaOptimizationBarrier")
def xla_optimization_barrier(ctx, *inputs):
  return list(lax.optimization_barrier(tuple(jnp.asarray(x) for x in inputs)))


@register("XlaSharding")
def xla_sharding(ctx, x):
  # A sharding annotation never changes values; on one device it has nothing to place.
  return x


def _shard_count(ctx) -> list[int] | None:
  """Tiles per dimension of `manual_sharding`, or None when it is not tiled."""
  sharding = _proto(ctx, "manual_sharding", "OpSharding")
  tiles = list(sharding.tile_assignment_dimensions)
  if not tiles:
    return None
  if sharding.replicate_on_last_tile_dim:
    tiles = tiles[:-1]
  return tiles[:len(tiles) - len(sharding.last_tile_dims)]


def _single_shard(ctx, shape, full_shape) -> None:
  if tuple(shape) != tuple(full_shape):
    raise NotImplementedError(
        f"{ctx.op} node {ctx.name!r} maps shape {tuple(full_shape)} to shards of another shape, "
        "which needs several devices; jaxport converts SPMD graphs for one device only. "
        "Export the model without manual sharding (one shard).")


@register("XlaSpmdFullToShardShape")
def xla_spmd_full_to_shard_shape(ctx, x):
  tiles = _shard_count(ctx)
  shape = np.shape(x)
  if tiles:
    dim = ctx.attr("dim", -1)
    if dim >= 0:
      tiles = [tiles[dim] if i == dim else 1 for i in range(len(shape))]
    _single_shard(ctx, [-(-n // t) for n, t in zip(shape, tiles)], shape)
  return x


@register("XlaSpmdShardToFullShape")
def xla_spmd_shard_to_full_shape(ctx, x):
  _single_shard(ctx, np.shape(x), ctx.attr("full_shape"))
  return x


# --------------------------------------------------------------------------- linear algebra


@register("XlaSelfAdjointEig")
def xla_self_adjoint_eig(ctx, a):
  """Eigenvalues in ascending order and eigenvectors (columns); reads one triangle of `a`."""
  w, v = jnp.linalg.eigh(jnp.asarray(a), UPLO="L" if ctx.attr("lower") else "U", symmetrize_input=False)
  return w, v


@register("XlaSvd")
def xla_svd(ctx, a):
  """Singular values (descending), full U and V with a = U diag(s) V^H."""
  u, s, vh = jnp.linalg.svd(jnp.asarray(a), full_matrices=True)
  return s, u, jnp.conj(jnp.swapaxes(vh, -1, -2))


# --------------------------------------------------------------------------- random bits

# tf.random.Algorithm (PHILOX=1, THREEFRY=2, AUTO_SELECT=3) -> XLA's RandomAlgorithm.
_RNG_ALGORITHMS = {1: lax.RandomAlgorithm.RNG_PHILOX, 2: lax.RandomAlgorithm.RNG_THREE_FRY,
                   3: lax.RandomAlgorithm.RNG_DEFAULT}


def _x64() -> bool:
  return jax.dtypes.canonicalize_dtype(np.uint64) == np.uint64


def _state_words(ctx, state):
  """TF's u64[2] state as the u32[4] key lax takes (the same bits, low word first)."""
  if is_concrete(state):
    words = np.asarray(state).astype("<u8").reshape(-1).view("<u4")
  elif jnp.asarray(state).dtype == np.uint64:
    words = lax.bitcast_convert_type(jnp.asarray(state), jnp.uint32).reshape(-1)
  else:
    raise TypeError(f"XlaRngBitGenerator node {ctx.name!r}: its uint64 state depends on the inputs, "
                    "which JAX holds in 32 bits unless 64-bit mode is on: "
                    "jax.config.update('jax_enable_x64', True).")
  if words.shape != (4,):
    raise NotImplementedError(f"XlaRngBitGenerator node {ctx.name!r}: a state of {words.shape[0] // 2} "
                              "uint64 words; lax.rng_bit_generator takes 2. Export with a 2-word state.")
  return words


@register("XlaRngBitGenerator")
def xla_rng_bit_generator(ctx, algorithm, state, shape):
  """Bit-exact with TF's XLA kernel on the same backend (both run XLA's RngBitGenerator)."""
  dtype = np.dtype(ctx.attr("dtype", np.uint64))
  if dtype.itemsize == 8 and not _x64():
    raise TypeError(f"XlaRngBitGenerator node {ctx.name!r} draws {dtype} bits, which JAX holds in 32 bits: "
                    "turn on 64-bit mode with jax.config.update('jax_enable_x64', True).")
  alg = int(static_value(algorithm, "algorithm", ctx))
  if alg not in _RNG_ALGORITHMS:
    raise InvalidNodeError(f"XlaRngBitGenerator node {ctx.name!r}: unknown algorithm {alg}; "
                           "expected tf.random.Algorithm PHILOX (1), THREEFRY (2) or AUTO_SELECT (3).")
  key, bits = lax.rng_bit_generator(_state_words(ctx, state), tuple(static_ints(shape, "shape", ctx)),
                                    dtype=dtype, algorithm=_RNG_ALGORITHMS[alg])
  pairs = key.reshape(2, 2)
  # Without 64-bit mode TF's uint64 state comes back as its low 32 bits, like every 64-bit value.
  new_state = lax.bitcast_convert_type(pairs, jnp.uint64) if _x64() else pairs[:, 0]
  return new_state, bits
