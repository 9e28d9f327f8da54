"""Dense 2-D convolution lowerings for XLA:CPU, where dots run far faster than `conv_general_dilated`.

Each lowering is a pure function `(x, w, spec) -> y` with TF's Conv2D semantics (filter
[kh, kw, in, out], groups=1); `spec` is `nn._ConvSpec` (data_format, spatial axes, channel axis,
strides, dilations, `pads(spatial_shape, window)`). They work in NHWC internally.

  * `conv_shifted_gemm`: the sum over kernel taps of a strided input slice times that tap's
    [in, out] matrix -- one GEMM per tap, no 9x patch buffer. Any stride and dilation.
  * `conv_im2col`: the taps' slices concatenated along channels, then one GEMM.
  * `conv_winograd`: Winograd F(m x m, 3 x 3) for stride-1, undilated 3x3 convs (m = 2 or 4):
    input tile transform, one batched GEMM over the (m+2)^2 transformed positions, output
    transform. F(4,3) uses Lavin & Gray's points (0, +-1, +-2, inf). Its values come from
    constant-index gathers (two XLA:CPU fusions, where strided slices per tile position made 17 at
    ~20 ms of compile each), its derivatives from the strided slices (transposed to pads, not the
    gathers' serial scatter-adds): a `custom_jvp`, marked for export.

  * `conv_general_base_dilated`: the same conv over the input dilated by 2 (stride 2s, kernel
    dilation 2d). XLA:CPU's YNNPACK refuses base-dilated convs, so XLA's own kernel runs it: under
    XLA's default options (a plain `jax.jit`) 0.5-0.9x the time of the conv YNNPACK takes.

`choose_cpu_lowering` picks one per shape from benchmarks/conv_lowering_bench.py's measurements;
`base_dilation_pays` says where the base-dilated form computes a conv's values.
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxport import xla_options
from jaxport.convert import _jax_compat, export_marks

Array = Any
_NHWC = ("NHWC", "HWIO", "NHWC")

# Winograd transforms: y = A^T [(G g G^T) * (B^T d B)] A.
_WINOGRAD = {
    2: dict(
        BT=np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        G=np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),
        AT=np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)),
    4: dict(
        BT=np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                     [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
        G=np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                    [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
        AT=np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0],
                     [0, 1, -1, 8, -8, 1]], np.float64)),
}


# --------------------------------------------------------------------------- layout


def _to_nhwc(x: Array, spec) -> Array:
  return jnp.transpose(x, (0, 2, 3, 1)) if spec.data_format == "NCHW" else x


def _from_nhwc(y: Array, spec) -> Array:
  return jnp.transpose(y, (0, 3, 1, 2)) if spec.data_format == "NCHW" else y


def _padded_nhwc(x: Array, w: Array, spec) -> tuple[Array, list[int]]:
  """The NHWC input with TF's padding applied, and the output's spatial sizes."""
  x = _to_nhwc(jnp.asarray(x), spec)
  window = w.shape[:2]
  pads = spec.pads(x.shape[1:3], window)
  x = jnp.pad(x, [(0, 0), *pads, (0, 0)])
  return x, _out_sizes(x.shape[1:3], window, spec.strides, spec.dilations)


def _out_sizes(padded_spatial, window, strides, dilations) -> list[int]:
  """A VALID conv's output spatial sizes over an already padded input."""
  return [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(padded_spatial, window, dilations, strides)]


def _tap_slices(x: Array, window, out_sizes, strides, dilations):
  """(tap, strided slice of the padded input that tap multiplies), for each kernel tap."""
  for tap in itertools.product(*(range(k) for k in window)):
    starts = [t * d for t, d in zip(tap, dilations)]
    limits = [st + (o - 1) * s + 1 for st, o, s in zip(starts, out_sizes, strides)]
    yield tap, lax.slice(x, (0, *starts, 0), (x.shape[0], *limits, x.shape[-1]), (1, *strides, 1))


def _sum_of_tap_gemms(x: Array, w: Array, strides, dilations) -> Array:
  """The conv of a padded [N, *spatial, C] input with a [*window, C, O] filter, as one GEMM per tap."""
  window = w.shape[:-2]
  out_sizes = _out_sizes(x.shape[1:-1], window, strides, dilations)
  out = None
  for tap, patch in _tap_slices(x, window, out_sizes, strides, dilations):
    term = matmul_rows(patch, w[tap])
    out = term if out is None else out + term
  return out


def matmul_rows(a: Array, b: Array) -> Array:
  """[..., k] @ [k, n] as one GEMM over the rows of `a` (its leading dims flattened), accumulating in
  the inputs' precision like TF's conv. The gradient w.r.t. `b` is then a dot contracting one dim,
  which XLA:CPU runs without the transposing copy of the output gradient it makes to contract several
  (ResNet50's training step: 9-15% faster in two A/B runs)."""
  rows = lax.dot_general(a.reshape(-1, a.shape[-1]), b, (([1], [0]), ([], [])))
  return rows.reshape(*a.shape[:-1], b.shape[-1])


# --------------------------------------------------------------------------- lowerings


def conv_shifted_gemm(x: Array, w: Array, spec) -> Array:
  """Sum over kernel taps of (strided input slice) @ w[tap]."""
  w = jnp.asarray(w)
  x, _ = _padded_nhwc(x, w, spec)
  return _from_nhwc(_sum_of_tap_gemms(x, w, spec.strides, spec.dilations), spec)


def conv_general_shifted_gemm(lhs: Array, rhs: Array, *, window_strides, padding, rhs_dilation,
                              dimension_numbers: lax.ConvDimensionNumbers) -> Array:
  """`lax.conv_general_dilated` with one feature group and no lhs dilation, in any layout, as one GEMM
  per tap (transposes to [N, *spatial, C] and [*window, C, O] are no-ops for TF's NHWC/HWIO)."""
  lhs_spec, rhs_spec, out_spec = dimension_numbers
  x = jnp.transpose(lhs, (lhs_spec[0], *lhs_spec[2:], lhs_spec[1]))
  w = jnp.transpose(rhs, (*rhs_spec[2:], rhs_spec[1], rhs_spec[0]))
  x = lax.pad(x, jnp.zeros((), x.dtype), [(0, 0, 0), *[(lo, hi, 0) for lo, hi in padding], (0, 0, 0)])
  y = _sum_of_tap_gemms(x, w, window_strides, rhs_dilation)
  return jnp.transpose(y, tuple(np.argsort((out_spec[0], *out_spec[2:], out_spec[1]))))


def conv_im2col(x: Array, w: Array, spec) -> Array:
  """Patches (taps concatenated along channels, tap-major like w's reshape) @ w as one GEMM."""
  w = jnp.asarray(w)
  x, out_sizes = _padded_nhwc(x, w, spec)
  slices = _tap_slices(x, w.shape[:2], out_sizes, spec.strides, spec.dilations)
  patches = jnp.concatenate([p for _, p in slices], axis=-1)
  return _from_nhwc(matmul_rows(patches, w.reshape(-1, w.shape[-1])), spec)


def _combine(rows, matrix):
  """[sum_j matrix[i, j] * rows[j] for i]: a small constant matrix applied to a list of arrays."""
  out = []
  for coeffs in matrix:
    acc = None
    for c, r in zip(coeffs, rows):
      if c == 0:
        continue
      term = r if c == 1 else -r if c == -1 else r * np.asarray(c, r.dtype)
      acc = term if acc is None else acc + term
    out.append(acc)
  return out


def winograd_filter(w: Array, m: int) -> Array:
  """G g G^T for each (in, out) pair: [kh, kw, in, out] -> [(m+2)^2, in, out].

  One small GEMM with the constant kron(G, G) (row a*(m+2)+b, column i*3+j holds G[a,i] G[b,j]):
  as element-wise combinations XLA:CPU took ~0.4 s to compile per layer, as a dot ~0.02 s.
  """
  g = _WINOGRAD[m]["G"]
  w = jnp.asarray(w)
  flat = jnp.reshape(w, (9, -1))
  u = lax.dot_general(jnp.asarray(np.kron(g, g), w.dtype), flat, (([1], [0]), ([], [])),
                      precision=lax.Precision.HIGHEST)
  return jnp.reshape(u, (-1, *w.shape[2:]))


def conv_winograd(x: Array, w: Array, spec, m: int = 2) -> Array:
  """Winograd F(m x m, 3 x 3); stride 1, dilation 1, 3x3 filter."""
  w = jnp.asarray(w)
  assert w.shape[:2] == (3, 3) and list(spec.strides) == [1, 1] and list(spec.dilations) == [1, 1]
  x, (oh, ow) = _padded_nhwc(x, w, spec)
  th, tw = -(-oh // m), -(-ow // m)
  # Pad so every tile is whole: tiles start at multiples of m and span m + 2.
  x = jnp.pad(x, [(0, 0), (0, th * m + 2 - x.shape[1]), (0, tw * m + 2 - x.shape[2]), (0, 0)])
  y = _winograd_marked(x, w, m=m)
  return _from_nhwc(y[:, :oh, :ow], spec)


def _winograd_read(x, w, *, m):
  """What a loaded artifact runs for a Winograd conv: the conv the converter picks for the trace in
  progress (`choose_cpu_lowering`), over the same whole tiles."""
  if _under_ynn():
    return conv_general_tapped(x, w, window_strides=(1, 1), padding=((0, 0), (0, 0)), rhs_dilation=(1, 1),
                               dimension_numbers=lax.conv_dimension_numbers(x.shape, w.shape, _NHWC))
  return _winograd(x, w, m)


@export_marks.marked("winograd_conv", static=True, reader=_winograd_read)
def _winograd_marked(x, w, *, m):
  return _winograd(x, w, m)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _winograd(x, w, m):
  """The tiled conv of a padded NHWC input (whole tiles): its values by `_winograd_gathered` (2-3x cheaper
  for XLA:CPU to compile), its derivatives those of `_winograd_sliced`, whose transpose is pads, not the
  gathers' scatter-adds."""
  if all(_uniform_rows(_WINOGRAD[m][k]) for k in ("BT", "AT")):
    return _winograd_gathered(x, w, m)
  return _winograd_sliced(x, w, m)


@functools.partial(_winograd.defjvp, symbolic_zeros=True)
def _winograd_jvp(m, primals, tangents):
  (x, w), (dx, dw) = primals, tangents
  sliced = lambda x, w: _winograd_sliced(x, w, m)
  if isinstance(dx, SymbolicZero) and isinstance(dw, SymbolicZero):
    y = sliced(x, w)
    return y, jnp.zeros_like(y)
  if isinstance(dw, SymbolicZero):
    return jax.jvp(lambda x: sliced(x, w), (x,), (dx,))
  if isinstance(dx, SymbolicZero):
    return jax.jvp(lambda w: sliced(x, w), (w,), (dw,))
  return jax.jvp(sliced, (x, w), (dx, dw))


def _tiles(x, m: int):
  """The tile counts (th, tw) of a padded input whose tiles start at multiples of m and span m + 2."""
  return (x.shape[1] - 2) // m, (x.shape[2] - 2) // m


def _winograd_sliced(x, w, m):
  """Each of the (m+2)^2 tile positions as a strided slice, transformed by element-wise combinations."""
  t = m + 2
  bt, at = _WINOGRAD[m]["BT"], _WINOGRAD[m]["AT"]
  (th, tw), n, c = _tiles(x, m), x.shape[0], x.shape[-1]

  def tile_slice(i, j):  # element (i, j) of every tile: [n, th, tw, c]
    return lax.slice(x, (0, i, j, 0), (n, i + (th - 1) * m + 1, j + (tw - 1) * m + 1, c), (1, m, m, 1))

  # V = B^T d B, separably: rows first, then columns.
  cols = [_combine([tile_slice(i, j) for i in range(t)], bt) for j in range(t)]  # cols[j][a]
  v = [_combine([cols[j][a] for j in range(t)], bt) for a in range(t)]  # v[a][b]
  v = jnp.stack([vb for va in v for vb in va]).reshape(t * t, n * th * tw, c)
  prod = _winograd_products(v, w, m).reshape(t, t, n, th, tw, -1)
  # Y = A^T M A.
  rows = _combine([prod[a] for a in range(t)], at)  # rows[p]: [t, n, th, tw, out]
  y = [_combine([r[b] for b in range(t)], at) for r in rows]  # y[p][q]: [n, th, tw, out]
  y = jnp.stack([jnp.stack(yp, axis=3) for yp in y], axis=2)  # [n, th, p, tw, q, out]
  return y.reshape(n, th * m, tw * m, -1)


def _winograd_gathered(x, w, m):
  """The same values with the tiles and both transforms as constant-index gathers: XLA:CPU fuses each
  transform into one loop (the sliced form compiles one fusion per tile position, ~20 ms each)."""
  t = m + 2
  bt, at = _WINOGRAD[m]["BT"], _WINOGRAD[m]["AT"]
  (th, tw), n, c = _tiles(x, m), x.shape[0], x.shape[-1]
  rows = (np.arange(t)[:, None] + m * np.arange(th)).reshape(-1)   # [a, i] -> input row
  cols = (np.arange(t)[:, None] + m * np.arange(tw)).reshape(-1)   # [b, j] -> input column
  d = jnp.take(x, rows, axis=1, mode="clip").reshape(n, t, th, x.shape[2], c)
  d = jnp.take(d, cols, axis=3, mode="clip").reshape(n, t, th, t, tw, c)   # [n, a, i, b, j, c]
  v = _apply_along(_apply_along(d, bt, 1), bt, 3)
  v = v.transpose(1, 3, 0, 2, 4, 5).reshape(t * t, n * th * tw, c)
  prod = _winograd_products(v, w, m).reshape(t, t, n, th, tw, -1)
  y = _apply_along(_apply_along(prod, at, 0), at, 1)   # [p, q, n, th, tw, out]
  return y.transpose(2, 3, 0, 4, 1, 5).reshape(n, th * m, tw * m, -1)


def _winograd_products(v, w, m):
  """[t*t, tiles, in] x the transformed filter [t*t, in, out]: one batched GEMM."""
  u = winograd_filter(w, m).astype(v.dtype)
  return lax.dot_general(v, u, (([2], [1]), ([0], [0])))


def _uniform_rows(matrix) -> bool:
  """Whether every row of `matrix` has the same number of nonzero coefficients (`_apply_along` needs it:
  padding a row with 0 * x would turn an inf into NaN)."""
  return len({int(np.count_nonzero(r)) for r in matrix}) == 1


def _apply_along(v, matrix, axis: int):
  """`matrix @ v` along `axis` (a small constant matrix): per term, a constant-index `take` times a
  per-row coefficient (1 needs no product), summed in column order like `_combine`."""
  shape = [1] * v.ndim
  shape[axis] = len(matrix)
  nonzero = [np.flatnonzero(row) for row in matrix]
  out = None
  for k in range(len(nonzero[0])):
    idx = np.array([cols[k] for cols in nonzero])
    coef = np.array([row[cols[k]] for row, cols in zip(matrix, nonzero)])
    term = jnp.take(v, idx, axis=axis, mode="clip")
    if not np.all(coef == 1):
      term = term * np.asarray(coef, v.dtype).reshape(shape)
    out = term if out is None else out + term
  return out


def conv_winograd4(x: Array, w: Array, spec) -> Array:
  return conv_winograd(x, w, spec, m=4)


def conv_xla(x: Array, w: Array, spec, groups: int = 1) -> Array:
  """XLA's (grouped) convolution with TF's padding: the fallback, and what GPUs run (cuDNN)."""
  x, w = jnp.asarray(x), jnp.asarray(w)
  pads = spec.pads([x.shape[i] for i in spec.spatial], w.shape[:-2])
  return lax.conv_general_dilated(x, w, window_strides=spec.strides, padding=pads, rhs_dilation=spec.dilations,
                                  dimension_numbers=spec.dimension_numbers(), feature_group_count=groups)


def conv_general_base_dilated(lhs: Array, rhs: Array, *, window_strides, padding, rhs_dilation,
                              dimension_numbers) -> Array:
  """`lax.conv_general_dilated` (no lhs dilation, one group) over the input dilated by 2: with stride
  2s, kernel dilation 2d and pads doubled, output i's tap k reads dilated position 2(s*i + d*k - lo),
  i.e. input s*i + d*k - lo, as the plain conv does; the output sizes agree too."""
  n = len(window_strides)
  return lax.conv_general_dilated(lhs, rhs, window_strides=[2 * s for s in window_strides],
                                  padding=[(2 * lo, 2 * hi) for lo, hi in padding], lhs_dilation=(2,) * n,
                                  rhs_dilation=[2 * d for d in rhs_dilation], dimension_numbers=dimension_numbers)


def conv_base_dilated(x: Array, w: Array, spec) -> Array:
  """`conv_xla` (one group) as `conv_general_base_dilated`."""
  x, w = jnp.asarray(x), jnp.asarray(w)
  pads = spec.pads([x.shape[i] for i in spec.spatial], w.shape[:-2])
  return conv_general_base_dilated(x, w, window_strides=spec.strides, padding=pads, rhs_dilation=spec.dilations,
                                   dimension_numbers=spec.dimension_numbers())


# Under XLA's default options the base-dilated form ran 0.55-0.95x YNNPACK's conv at batch 2 and 32 on
# inputs up to 147x147x32 per example, and 1.05-1.6x on wider ones (224x224x64, 112x112x128) and on
# 3-channel stems (benchmarks/README.md).
_BASE_DILATED_MIN_CHANNELS = 16
_BASE_DILATED_MAX_EXAMPLE = 2**20


def base_dilation_pays(dtype, in_channels, example_size) -> bool:
  """Whether a float32 2-D conv with this many input channels and input elements per example computes
  its values faster as `conv_general_base_dilated` on CPU. Only under YNNPACK (XLA's default options):
  never in a computation `jaxport.jit` compiles with YNNPACK off, where XLA's kernel takes the plain
  conv, nor while exporting (an artifact keeps the plain conv; its reader picks again)."""
  if jnp.dtype(dtype) != jnp.float32 or not _under_ynn():
    return False
  if not all(isinstance(d, (int, np.integer)) for d in (in_channels, example_size)):
    return False
  return in_channels >= _BASE_DILATED_MIN_CHANNELS and example_size <= _BASE_DILATED_MAX_EXAMPLE


def on_cpu(cpu: Callable, default: Callable) -> Callable:
  """`f(x, w)` that runs `cpu` on CPU and `default` elsewhere."""
  return lambda x, w: lax.platform_dependent(x, w, cpu=cpu, default=default)


# Measured up to 7x7 (49 taps: 80.7 vs 74.9 ms at 17x17x128); the trace grows with the taps, so larger
# windows keep XLA's filter-gradient conv.
_TAP_FILTER_GRAD_MAX_TAPS = 49


def tap_filter_grad_pays(window) -> bool:
  """Whether a conv with this kernel window takes its filter gradient by taps (`with_tap_filter_grad`)."""
  return int(np.prod(window)) <= _TAP_FILTER_GRAD_MAX_TAPS


def with_tap_filter_grad(conv: Callable, taps: Callable, values: Callable | None = None) -> Callable:
  """`conv(x, w)` whose tangent w.r.t. the filter is `taps(x, w)` (the same conv as one GEMM per tap)
  on XLA:CPU: the filter's gradient is then one dot per tap contracting the output rows, where
  XLA:CPU's own filter-gradient conv (through YNNPACK) ran 1.1-2.8x slower (ResNet50's 7x7 stride-2
  stem at batch 8: 315 -> 113 ms). Every other tangent is `conv`'s; the values are `values(x, w)`
  (another form of the same conv, default `conv`)."""
  values = values or conv

  @jax.custom_jvp
  def tapped(x, w):
    return values(x, w)

  def tapped_jvp(primals, tangents):
    (x, w), (dx, dw) = primals, tangents
    terms = []
    if not isinstance(dx, SymbolicZero):
      terms.append(conv(dx, w))
    if not isinstance(dw, SymbolicZero):
      terms.append(lax.platform_dependent(x, dw, cpu=taps, default=conv))
    y = values(x, w)
    return y, functools.reduce(lax.add, terms) if terms else jnp.zeros_like(y)

  tapped.defjvp(tapped_jvp, symbolic_zeros=True)
  return tapped


def conv_general_tapped(lhs: Array, rhs: Array, *, window_strides, padding, rhs_dilation, dimension_numbers,
                        conv: Callable | None = None, base_dilated: bool | None = None) -> Array:
  """A forward 2-D conv (one group, no lhs dilation; `conv`, default XLA's) with the filter gradient
  of `with_tap_filter_grad`, and its values on CPU by `conv_general_base_dilated` where `base_dilated`
  (default: where `base_dilation_pays`)."""
  geometry = dict(window_strides=window_strides, padding=padding, rhs_dilation=rhs_dilation,
                  dimension_numbers=dimension_numbers)
  conv = conv or functools.partial(lax.conv_general_dilated, **geometry)
  if base_dilated is None:
    batch_axis, channel_axis = dimension_numbers.lhs_spec[:2]
    example = math.prod(d for i, d in enumerate(lhs.shape) if i != batch_axis)
    base_dilated = base_dilation_pays(lhs.dtype, lhs.shape[channel_axis], example)
  values = on_cpu(functools.partial(conv_general_base_dilated, **geometry), conv) if base_dilated else None
  return with_tap_filter_grad(conv, functools.partial(conv_general_shifted_gemm, **geometry), values)(lhs, rhs)


def conv_xla_tap_filter_grad(x: Array, w: Array, spec, base_dilated: bool = False) -> Array:
  """`conv_xla` (groups 1) as `conv_general_tapped`."""
  x, w = jnp.asarray(x), jnp.asarray(w)
  return conv_general_tapped(
      x, w, window_strides=tuple(spec.strides), padding=spec.pads([x.shape[i] for i in spec.spatial], w.shape[:-2]),
      rhs_dilation=tuple(spec.dilations), base_dilated=base_dilated,
      dimension_numbers=lax.conv_dimension_numbers(x.shape, w.shape, spec.dimension_numbers()))


def depthwise_taps(x: Array, w: Array, window, strides, dilations) -> Array:
  """The depthwise conv of a padded [N, *spatial, C] input with per-tap weights `w` [taps, C] (taps in
  row-major window order): the sum over taps of a strided slice times its row, in `w`'s dtype.

  Its filter gradient reduces the taps' `slice * dy` products together, in variadic reduces: XLA:CPU's
  YNNPACK pass takes each tap's own `reduce(slice * dy)` and writes every slice out (recomputing the
  ops that produce the input, e.g. BatchNorm and ReLU6, once per tap); a variadic reduce it does not
  take, so XLA fuses all taps into one pass (3x3 at 8x56x56x144 after BatchNorm: 115 -> 40 ms). Values
  and the input's tangent are the plain sum's. Marked for export, so loaded artifacts keep the rule."""
  return _depthwise_taps_marked(x, w, window=[int(k) for k in window], strides=[int(s) for s in strides],
                                dilations=[int(d) for d in dilations])


@export_marks.marked("depthwise_taps", static=True)
def _depthwise_taps_marked(x, w, *, window, strides, dilations):
  return _depthwise_taps(x, w, tuple(window), tuple(strides), tuple(dilations))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def _depthwise_taps(x, w, window, strides, dilations):
  return _tap_sum(x, w, window, strides, dilations)


def _tap_sum(x, w, window, strides, dilations):
  out_sizes = _out_sizes(x.shape[1:-1], window, strides, dilations)
  rows = lax.split(w, [1] * w.shape[0], axis=0)
  out = None
  # Four lax ops per tap (no jnp indexing or promotion): tracing stays cheap for models with
  # hundreds of 5x5/7x7 depthwise convs (NASNet).
  for (_, patch), row in zip(_tap_slices(x, window, out_sizes, strides, dilations), rows):
    if patch.dtype != w.dtype:
      patch = lax.convert_element_type(patch, w.dtype)
    term = lax.mul(patch, lax.broadcast_in_dim(row, patch.shape, (0, x.ndim - 1)))
    out = term if out is None else lax.add(out, term)
  return out


def depthwise_filter_grad(x: Array, dy: Array, window, strides, dilations) -> Array:
  """The gradient of `depthwise_taps(x, w, ...)` in `w` [taps, C], given the output's cotangent `dy`."""
  return _tap_filter_grad(x, dy, tuple(window), tuple(strides), tuple(dilations))


def _tap_filter_grad(x, dy, window, strides, dilations):
  """[taps, C]: per tap, the sum over batch and positions of its input slice times `dy`."""
  products = []
  for _, patch in _tap_slices(x, window, dy.shape[1:-1], strides, dilations):
    if patch.dtype != dy.dtype:
      patch = lax.convert_element_type(patch, dy.dtype)
    products.append(lax.mul(patch, dy))
  zeros = [np.zeros((), dy.dtype)] * len(products)
  add = lambda a, b: [lax.add(p, q) for p, q in zip(a, b)]
  # The innermost positions first, then the rest: XLA:CPU accumulates a reduce in order, so one pass
  # over all N*H*W terms erred 3.6e-6 (relative, after BatchNorm's cancellation, 8x56x56x144) where
  # TF's kernel errs 9.4e-7; in two passes 5.3e-7, and faster (7.4 vs 9.2 ms).
  sums = lax.reduce(products, zeros, add, (dy.ndim - 2,))
  sums = lax.reduce(sums, zeros, add, tuple(range(dy.ndim - 2)))
  return lax.concatenate([lax.broadcast_in_dim(s, (1, *s.shape), (1,)) for s in sums], 0)


@functools.partial(_depthwise_taps.defjvp, symbolic_zeros=True)
def _depthwise_taps_jvp(window, strides, dilations, primals, tangents):
  (x, w), (dx, dw) = primals, tangents
  geometry = (window, strides, dilations)
  y = _tap_sum(x, w, *geometry)
  terms = []
  if not isinstance(dx, SymbolicZero):
    terms.append(_tap_sum(dx, w, *geometry))
  if not isinstance(dw, SymbolicZero):
    terms.append(_jax_compat.custom_linear(
        lambda res, lin: [_tap_sum(res[0], lin[0], *geometry)],
        lambda res, cts: [_tap_filter_grad(res[0], cts[0], *geometry)],
        [x], [dw], [jax.typeof(y).to_tangent_aval()])[0])
  return y, functools.reduce(lax.add, terms) if terms else jnp.zeros_like(y)


LOWERINGS: dict[str, Callable] = {
    "xla": conv_xla, "shifted": conv_shifted_gemm, "im2col": conv_im2col,
    "winograd2": conv_winograd, "winograd4": conv_winograd4, "base_dilated": conv_base_dilated,
}


# Winograd F(2x2, 3x3) wins (0.55-0.75x XLA's conv CPU time, batch 2) from 64 output tiles and 64
# input channels up to ~4M input elements; beyond that its transforms are memory-bound and lose.
_WINOGRAD_MIN_TILES = 64
_WINOGRAD_MIN_CHANNELS = 64
_WINOGRAD_MAX_INPUT = 4 * 2**20


def _under_ynn() -> bool:
  """Whether the trace in progress compiles under XLA's default options (YNNPACK on) and is not an export."""
  return not (xla_options.compiling_without_ynn() or export_marks.exporting_now())


def choose_cpu_lowering(x: Array, w: Array, spec) -> Callable | None:
  """The fastest measured lowering for this conv on XLA:CPU, or None to keep `conv_general_dilated`.

  Only float32 stride-1 undilated 3x3 convs change (to `conv_winograd`, m=2): in
  benchmarks/conv_lowering_bench.py the GEMM lowerings (shifted, im2col) never beat XLA's conv
  by more than noise, and F(4x4, 3x3) is faster still but 10x less accurate (2e-5 relative at 256
  channels). Only where YNNPACK is off (`jaxport.jit`) or exporting: under XLA's defaults the
  base-dilated conv is faster (`base_dilation_pays`). x and w may be arrays or `jax.ShapeDtypeStruct`s.
  """
  if len(w.shape) != 4 or jnp.dtype(x.dtype) != jnp.float32 or jnp.dtype(w.dtype) != jnp.float32:
    return None
  if tuple(w.shape[:2]) != (3, 3) or list(spec.strides) != [1, 1] or list(spec.dilations) != [1, 1]:
    return None
  batch_axis = spec.data_format.index("N")
  if not all(isinstance(d, (int, np.integer)) for i, d in enumerate(x.shape) if i != batch_axis):
    return None   # symbolic spatial/channel dims: the size rules cannot be decided
  # A symbolic batch (a batch-polymorphic export) is judged per example.
  batch = x.shape[batch_axis] if isinstance(x.shape[batch_axis], (int, np.integer)) else 1
  spatial = [x.shape[i] for i in spec.spatial]
  pads = spec.pads(spatial, (3, 3))
  out = [n + lo + hi - 2 for n, (lo, hi) in zip(spatial, pads)]
  tiles = batch * (-(-out[0] // 2)) * (-(-out[1] // 2))
  per_example = int(np.prod([d for i, d in enumerate(x.shape) if i != batch_axis]))
  if not (tiles >= _WINOGRAD_MIN_TILES and w.shape[2] >= _WINOGRAD_MIN_CHANNELS
          and batch * per_example <= _WINOGRAD_MAX_INPUT):
    return None
  if _under_ynn():
    # Under YNNPACK, Winograd's GEMMs (and its filter transform, a YNNPACK GEMM per call) lost to the
    # base-dilated conv on every measured shape but VGG16's 28x28x512, where its transform lost it back.
    return None
  return conv_winograd
