"""Op rules: fractional max and average pooling on NHWC images (FractionalMaxPool, FractionalAvgPool) and
their gradient ops (FractionalMaxPoolGrad, FractionalAvgPoolGrad).

The forward ops draw their row and column pooling sequences at random, as TF's GeneratePoolingSequence
builds them: output size floor(input / ratio) in float32, sequences that start at 0, end at the input size
and step by floor(alpha) or ceil(alpha), alpha = input / output (pseudo_random: ceil(alpha * (i + u)) - 1
for one uniform u under TF's bound; random: a shuffle of those steps). Given the sequences, pooling matches
TF's kernels exactly: a window spans [seq[i], seq[i + 1]) (`overlapping`: [seq[i], seq[i + 1]]) clipped to
the image; its maximum starts at the dtype's lowest value, which NaN never replaces; its average is one
sum in TF's scan order (rows, then columns) divided by the element count (truncated for integers); the
maximum's gradient goes to the first input holding it, the average's is accumulated in float64 (with
jax_enable_x64) in TF's order, then rounded once, as FractionalAvgPoolGrad does.
Differences from TF: the draws come from the caller's `rng` (per node), not from TF's seed, seed2 and
deterministic attrs, so the sequences follow TF's distribution but not its values. Traced sequences (in the
gradient ops, or given to `pool_by_sequences` under jit) are taken to have TF's structure (windows of at
most input // output + 1 rows, columns; known sequences may have any); FractionalMaxPoolGrad does not
compare orig_output with the recomputed maximum (TF refuses a mismatch, e.g. with NaN inputs, at run
time). Without jax_enable_x64, average gradients add up in float32.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import cast, jax_dtype, known_value, static_ints
from jaxport.convert.ops.morphology import _gather, _invalid, _lowest, _scatter_add
from jaxport.convert.registry import register

_INDEX = np.int64   # TF's dtype for the sequences (int32 in JAX unless jax_enable_x64)


# --------------------------------------------------------------------------- pooling sequences


def _output_shape(ctx, shape) -> tuple:
  """TF's checks on pooling_ratio and the input, and its output shape floor(input / ratio) (in float32)."""
  ratios = [float(r) for r in ctx.attr("pooling_ratio")]
  kind = "max" if ctx.op == "FractionalMaxPool" else "average"
  if len(ratios) != 4:
    raise _invalid(ctx, "pooling_ratio field must specify 4 dimensions")
  if ratios[0] != 1 or ratios[3] != 1:
    raise _invalid(ctx, f"Fractional {kind} pooling is not yet supported on the batch nor channel dimension.")
  if min(ratios) < 1:
    raise _invalid(ctx, f"pooling_ratio cannot be smaller than 1, got: {min(ratios)}")
  if len(shape) != 4:
    raise _invalid(ctx, "tensor_in must be 4-dimensional")
  if not ctx.attr("deterministic", False) and (ctx.attr("seed", 0) or ctx.attr("seed2", 0)):
    raise _invalid(ctx, "Both seed and seed2 should be 0 if deterministic is false.")
  out = tuple(int(np.floor(np.float32(n) / np.float32(r))) for n, r in zip(shape, ratios))
  for i, (n, r, o) in enumerate(zip(shape, ratios, out)):
    if o <= 0:
      raise _invalid(ctx, f"Pooling ratio is higher than input dimension size for dimension {i}. "
                          f"Input dim size: {n} pooling ratio: {r:g}")
  return out


def pseudo_random_sequence(key, size: int, out: int):
  """TF's pseudo-random sequence: [0, ceil(alpha * (i + u)) - 1 for 0 < i < out, size], u uniform in
  TF's range (0, min(u_max1, u_max2)). Computed in integers: alpha * i = q + r / out, and alpha * u = v /
  (out * scale) for an integer v, so every step is floor(alpha) or ceil(alpha), as TF's DCHECKs ask."""
  k = size // out
  q, r = np.divmod(size * np.arange(out + 1), out)
  span = min((k + 2) * out - size, out + size - k * out)   # out * alpha * max_u: TF's bound on alpha * u
  scale = max(1, 2 ** 24 // out)   # the resolution of u; the sums below stay within int32
  v = jax.random.randint(key, (), 1, span * scale + 1)
  up = -((-(r * scale) - v) // (out * scale))   # ceil((r + v / scale) / out)
  cum = jnp.asarray(q) + up
  return cum.at[0].set(1).at[out].set(size + 1) - 1


def random_sequence(key, size: int, out: int):
  """TF's random sequence: the steps floor(alpha) and ceil(alpha) (size % out of them) in random order."""
  k, extra = divmod(size, out)
  steps = jax.random.permutation(key, np.where(np.arange(out) < extra, k + 1, k))
  return jnp.concatenate([jnp.zeros(1, steps.dtype), jnp.cumsum(steps)])


# --------------------------------------------------------------------------- pooling given the sequences


def _structural_taps(size: int, out: int, overlapping: bool) -> int:
  """The longest window of TF's sequences: input // output + 1 (one more row when overlapping), at most all."""
  return min(size // out + 1 + overlapping, size)


def _tap_count(seq, size: int, out: int, overlapping: bool) -> int:
  """Rows (columns) to read per window: the longest window of known sequences, else TF's structural bound."""
  seq = known_value(seq)
  if seq is None:
    return _structural_taps(size, out, overlapping)
  seq = seq.reshape(-1)[:out + 1].astype(np.int64)
  ends = np.minimum(seq[1:] - (not overlapping), size - 1)
  return max(1, int((ends - seq[:-1]).max(initial=0)) + 1)


class _Pools(NamedTuple):
  index: jax.Array   # (batch, out_h, out_w, taps, depth): flat input index of each tap, in TF's scan order
  valid: jax.Array   # (1, out_h, out_w, taps, 1): whether the tap is in its window
  count: jax.Array   # (1, out_h, out_w, 1): TF's element count of each window


def _axis_windows(seq, size: int, taps: int, overlapping: bool):
  """Input positions (out, taps) of each window's first `taps` rows (columns), which are in it, and its length."""
  seq = jnp.asarray(seq).astype(jax_dtype(_INDEX))
  start = seq[:-1]
  end = jnp.minimum(seq[1:] - (0 if overlapping else 1), size - 1)
  at = start[:, None] + np.arange(taps)
  return jnp.clip(at, 0, size - 1), (at >= 0) & (at <= end[:, None]), end - start + 1


def _pools(shape, rows, cols, overlapping: bool, taps: tuple) -> _Pools:
  batch, height, width, depth = shape
  row_at, row_ok, row_len = _axis_windows(rows, height, taps[0], overlapping)
  col_at, col_ok, col_len = _axis_windows(cols, width, taps[1], overlapping)
  out_h, out_w, n = row_at.shape[0], col_at.shape[0], taps[0] * taps[1]
  at = (row_at[:, None, :, None] * width + col_at[None, :, None, :]).reshape(1, out_h, out_w, n, 1)
  batch_at = np.arange(batch, dtype=at.dtype).reshape(-1, 1, 1, 1, 1) * (height * width)
  index = (batch_at + at) * depth + np.arange(depth, dtype=at.dtype)
  valid = (row_ok[:, None, :, None] & col_ok[None, :, None, :]).reshape(1, out_h, out_w, n, 1)
  return _Pools(index, valid, (row_len[:, None] * col_len[None, :])[None, :, :, None])


def _max_pick(x, pools: _Pools):
  """Per output: the flat input index TF's max takes (its first maximum) and whether one beat the lowest."""
  taps = _gather(x, pools.index)
  candidate = pools.valid & ~jnp.isnan(taps) if jnp.issubdtype(taps.dtype, jnp.floating) else pools.valid
  lowest = _lowest(taps.dtype)
  top = jnp.maximum(jnp.where(candidate, taps, lowest).max(axis=3, keepdims=True), lowest)   # TF: from lowest
  hit = candidate & (taps == top)
  tap = jnp.argmax(hit, axis=3, keepdims=True)   # the first maximum, as FractionalMaxPoolGrad's scan
  return jnp.take_along_axis(pools.index, tap, axis=3)[:, :, :, 0], hit.any(axis=3)


def _divide(total, count):
  # full-sized behind a barrier: XLA would multiply by the reciprocal of a broadcast divisor
  count = jax.lax.optimization_barrier(jnp.broadcast_to(count.astype(total.dtype), jnp.shape(total)))
  return total / count if jnp.issubdtype(total.dtype, jnp.inexact) else jax.lax.div(total, count)


@jax.custom_jvp
def _average(x, index, valid, count):
  """One sum per window in TF's scan order (rows, then columns), divided by TF's count."""
  taps = _gather(x, index)
  total = jnp.zeros(taps.shape[:3] + taps.shape[4:], taps.dtype)
  for t in range(taps.shape[3]):   # unrolled: XLA keeps the order of the adds
    total = total + jnp.where(valid[:, :, :, t], taps[:, :, :, t], 0)
  return _divide(total, count)


@_average.defjvp
def _average_jvp(primals, tangents):
  """Linear in float64 when jax_enable_x64: its transpose is FractionalAvgPoolGrad's double accumulation
  (g / count per tap, added in output order by one scatter), rounded once to x's dtype."""
  x, index, valid, count = primals
  wide = jnp.promote_types(x.dtype, jax_dtype(np.float64))
  taps = jnp.where(valid, _gather(tangents[0].astype(wide), index), 0)
  return _average(x, index, valid, count), _divide(taps, count[:, :, :, None]).sum(axis=3).astype(x.dtype)


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _pool(x, rows, cols, overlapping: bool, average: bool, taps: tuple):
  pools = _pools(jnp.shape(x), rows, cols, overlapping, taps)
  if average:
    return _average(x, *pools)
  index, found = _max_pick(x, pools)
  return jnp.where(found, _gather(x, index), _lowest(jnp.result_type(x)))


def pool_by_sequences(x, row_pooling_sequence, col_pooling_sequence, overlapping: bool, average: bool):
  """Fractional max (or average) pooling of NHWC `x` over the windows of the given pooling sequences,
  as TF's kernels pool: len(sequence) - 1 windows per axis."""
  shape = jnp.shape(x)
  rows, cols = row_pooling_sequence, col_pooling_sequence
  taps = tuple(_tap_count(seq, shape[axis], jnp.shape(seq)[0] - 1, overlapping)
               for seq, axis in ((rows, 1), (cols, 2)))
  return _pool(x, rows, cols, bool(overlapping), bool(average), taps)


# --------------------------------------------------------------------------- forward ops


def _fractional_pool(ctx, x, average: bool):
  shape = tuple(np.shape(x))
  out = _output_shape(ctx, shape)
  draw = pseudo_random_sequence if ctx.attr("pseudo_random", False) else random_sequence
  row_key, col_key = jax.random.split(ctx.runtime.rng_for(ctx.name))
  rows, cols = draw(row_key, shape[1], out[1]), draw(col_key, shape[2], out[2])
  overlapping = bool(ctx.attr("overlapping", False))
  taps = tuple(_structural_taps(shape[i], out[i], overlapping) for i in (1, 2))
  return _pool(x, rows, cols, overlapping, average, taps), cast(rows, _INDEX), cast(cols, _INDEX)


@register("FractionalMaxPool", needs_rng=True)
def fractional_max_pool(ctx, x):
  return _fractional_pool(ctx, x, average=False)


@register("FractionalAvgPool", needs_rng=True)
def fractional_avg_pool(ctx, x):
  return _fractional_pool(ctx, x, average=True)


# --------------------------------------------------------------------------- gradient ops


def _grad_windows(ctx, shape, out_shape, rows, cols):
  """The first out + 1 entries of each sequence (TF reads no more), `overlapping` and the taps per window,
  after TF's checks."""
  if len(out_shape) != 4 or out_shape[0] != shape[0] or out_shape[3] != shape[3]:
    raise _invalid(ctx, f"the output gradient's shape {list(out_shape)} does not pool the input's {list(shape)}")
  seqs = []
  for name, seq, out in (("row", rows, out_shape[1]), ("col", cols, out_shape[2])):
    if np.ndim(seq) != 1 or np.shape(seq)[0] <= out:
      raise _invalid(ctx, f"Given out_backprop shape {list(out_shape)}, {name}_seq_tensor must have at least "
                          f"{out + 1} elements, but got {np.size(seq)}")
    known = known_value(seq)
    if known is not None and known.min() < 0:
      axis = "Row" if name == "row" else "Column"
      raise _invalid(ctx, f"{axis} sequence tensor values must not be negative, got {known.tolist()}")
    seqs.append(seq[:out + 1])
  overlapping = bool(ctx.attr("overlapping", False))
  taps = tuple(_tap_count(seq, shape[axis], out_shape[axis], overlapping) for seq, axis in zip(seqs, (1, 2)))
  return (*seqs, overlapping, taps)


@functools.partial(jax.jit, static_argnums=(4, 5))
def _max_grad(orig_input, out_backprop, rows, cols, overlapping: bool, taps: tuple):
  """TF's FractionalMaxPoolGrad: each output's gradient to the first input holding its window's maximum."""
  shape = jnp.shape(orig_input)
  index, found = _max_pick(orig_input, _pools(shape, rows, cols, overlapping, taps))
  index = jnp.where(found, index, np.prod(shape))   # no maximum (TF refuses these): dropped
  return _scatter_add(out_backprop, index, shape, np.dtype(orig_input.dtype))


@register("FractionalMaxPoolGrad")
def fractional_max_pool_grad(ctx, orig_input, orig_output, out_backprop, rows, cols):
  shape, out_shape = tuple(np.shape(orig_input)), tuple(np.shape(orig_output))
  for name, s in (("orig_input", shape), ("orig_output", out_shape)):
    if len(s) != 4 or not np.prod(s):
      raise _invalid(ctx, f"{name} should be a non-empty tensor of rank 4, got shape {list(s)}")
  if tuple(np.shape(out_backprop)) != out_shape:
    raise _invalid(ctx, f"out_backprop shape {list(np.shape(out_backprop))} != orig_output shape {list(out_shape)}")
  if np.size(rows) * np.size(cols) > np.prod(shape):
    raise _invalid(ctx, "Pooling region has more elements than the input tensor.")
  return _max_grad(orig_input, out_backprop, *_grad_windows(ctx, shape, out_shape, rows, cols))


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _average_grad(out_backprop, rows, cols, shape: tuple, overlapping: bool, taps: tuple):
  """TF's FractionalAvgPoolGrad: g / count to every tap of its window, accumulated in float64 (with x64) in
  output order, then cast."""
  pools = _pools(shape, rows, cols, overlapping, taps)
  wide = jax_dtype(np.float64)
  share = _divide(out_backprop.astype(wide)[:, :, :, None, :], pools.count[:, :, :, None])
  share = jnp.broadcast_to(jnp.where(pools.valid, share, 0), pools.index.shape)
  return _scatter_add(share, pools.index, shape, wide).astype(out_backprop.dtype)


@register("FractionalAvgPoolGrad")
def fractional_avg_pool_grad(ctx, orig_input_shape, out_backprop, rows, cols):
  shape = tuple(static_ints(orig_input_shape, "orig_input_tensor_shape", ctx))
  if np.ndim(orig_input_shape) != 1 or len(shape) != 4:
    raise _invalid(ctx, "original input tensor shape must be 1-dimensional and 4 elements")
  for name, n in zip(("Batch", "Rows", "Columns", "Depth"), shape):
    if n == 0:
      raise _invalid(ctx, f"{name} dimension of input must not be 0")
  rows, cols, overlapping, taps = _grad_windows(ctx, shape, tuple(np.shape(out_backprop)), rows, cols)
  return _average_grad(out_backprop, rows, cols, shape, overlapping, taps)
