"""Op rules: TF's stateless gamma, Poisson, binomial and truncated normal samplers and its shuffle.

Gamma, Poisson, binomial: TF's CPU kernels give each output value its own Philox stream, the
op's counter skipped by a fixed reservation (256 blocks per value; 42 for binomial inversion)
times the value's index. Values are indexed parameter-major (every sample of the first alpha,
rate or (count, prob) pair first), while the output is laid out sample-major. Each value runs
a rejection loop that reads numbers from its stream through small buffers: a block gives 2
doubles or 2 normals (Box-Muller), handed out last first. Here all values run that loop in
lock-step: one `lax.while_loop` whose step makes one attempt for every value still rejected,
reading a new block only where its buffer is empty. The arithmetic is TF's: float64 (a float32
Poisson rate included). Left: XLA's and glibc's float64 log/exp/pow/lgamma/sin may round an
ulp apart, so float64 samples can be a few ulp off, and a float32 one only when that moves an
accept test, a floor or the final rounding (never seen in the tests' draws).

The parameterized truncated normal shares one stream per shard of TF's thread pool (see
`_truncated_normal`), in T arithmetic, so its shards follow TF's cost model on this machine's
CPUs; its normal proposals are TF's float32 normals, within 2 ulp (`philox.box_muller_float32`).
The shuffle is TF's Fisher-Yates order.

Gradients: gamma samples carry TF's implicit reparameterization gradient with respect to
alpha (RandomGammaGrad, as TF's registered gradient); the other samplers have none (their
parameters are held constant). A value still rejected after `_MAX_ATTEMPTS` attempts (TF would
keep drawing; only a NaN parameter gets there) is NaN, and so are truncated normals whose
parameters TF refuses ("Invalid parameters").
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops import philox as ph
from jaxport.convert.ops.stateless_random import eigen_block_size, sample_shape, seed_words, tf_threads, v2_words
from jaxport.convert.registry import register
from jaxport.errors import ShapeMismatchError

_GAMMA_BLOCKS = 256          # blocks TF reserves per value (kReservedSamplesPerOutput)
_POISSON_BLOCKS = 256
_BTRS_BLOCKS = 256
_INVERSION_BLOCKS = 42       # binomial inversion: mean and variance <= 10
_MAX_ATTEMPTS = 4096
_STIRLING_TAIL = (0.0810614667953272, 0.0413406959554092, 0.0276779256849983, 0.02079067210376509,
                  0.0166446911898211, 0.0138761288230707, 0.0118967099458917, 0.0104112652619720,
                  0.00925546218271273, 0.00833056343336287)


# --------------------------------------------------------------------------- per-value streams


class _Stream(NamedTuple):
  """Each value's position in the op's Philox stream, in blocks after its counter."""
  base: jax.Array    # uint64: the value's first block
  used: jax.Array    # uint64: blocks read so far


class _Buffer(NamedTuple):
  """A distribution's unread numbers per value (TF's SampleBuffer / UNIFORM macro)."""
  values: jax.Array  # [..., k]
  left: jax.Array    # int32: how many of them are unread


def _empty(grid_shape, size: int, dtype) -> _Buffer:
  return _Buffer(jnp.zeros(grid_shape + (size,), dtype), jnp.zeros(grid_shape, jnp.int32))


def _block(key, counter, stream: _Stream):
  """The four words of each value's next block."""
  return ph.philox(jnp, ph.skip(jnp, counter, stream.base + stream.used), key)


def _read(key, counter, stream: _Stream, buffer: _Buffer, want, unpack):
  """One number per value where `want`: the next unread one, refilling an empty buffer from the stream."""
  refill = want & (buffer.left == 0)
  fresh = unpack(_block(key, counter, stream))
  values = jnp.where(refill[..., None], fresh, buffer.values)
  left = jnp.where(refill, fresh.shape[-1], buffer.left) - want.astype(jnp.int32)
  value = jnp.take_along_axis(values, jnp.maximum(left, 0)[..., None], axis=-1)[..., 0]
  return value, stream._replace(used=stream.used + refill.astype(jnp.uint64)), _Buffer(values, left)


def _doubles(words):
  """UniformDistribution<double>: two doubles per block."""
  return jnp.stack([ph.unit_float64(words[0], words[1]), ph.unit_float64(words[2], words[3])], -1)


def _normals(words):
  """NormalDistribution<double>: two normals per block (Box-Muller)."""
  return jnp.stack(ph.box_muller_float64(*words), -1)


def _log1p_neg(x):
  """log(1 - x) in float64 within an ulp of glibc's log1p(-x) (XLA's log1p is up to 128 ulps off).

  `w` rounds 1 - x and the second term restores what the rounding lost; the barrier keeps XLA
  from folding `(w - 1) + x` to zero under jit.
  """
  w = jax.lax.optimization_barrier(1 - x)
  return jnp.log(w) - ((w - 1) + x) / w


def _unfused(x):
  """`x`, which XLA cannot fuse with the operation that reads it: XLA:CPU contracts a multiply and an
  add into an FMA even across converts or an optimization barrier (TF's kernels round both); a select
  stops it."""
  return jnp.where(jnp.isnan(x), jnp.nan, x)


def _until_accepted(attempt, active, state):
  """Runs `attempt(active, state) -> (accepted, state)` until no value is active."""
  def cond(carry):
    step, active, _ = carry
    return (step < _MAX_ATTEMPTS) & jnp.any(active)

  def body(carry):
    step, active, state = carry
    accepted, state = attempt(active, state)
    return step + 1, active & ~accepted, state

  _, active, state = jax.lax.while_loop(cond, body, (jnp.int32(0), active, state))
  return active, state


def _hormann_pair(key, counter, stream, uniforms, active):
  """A transformed-rejection proposal's uniforms (Hormann): u - 1/2, v and 1/2 - |u - 1/2|."""
  u, stream, uniforms = _read(key, counter, stream, uniforms, active, _doubles)
  v, stream, uniforms = _read(key, counter, stream, uniforms, active, _doubles)
  u = u - 0.5
  return u, v, 0.5 - jnp.abs(u), stream, uniforms


def _value_index(samples: int, params: int):
  """[samples, params]: each value's index in TF's parameter-major order."""
  return (jnp.arange(params, dtype=jnp.uint64)[None, :] * jnp.uint64(samples)
          + jnp.arange(samples, dtype=jnp.uint64)[:, None])


# --------------------------------------------------------------------------- gamma


def _gamma(key, counter, alpha, samples: int):
  """[samples, alphas] float64 draws (Marsaglia-Tsang; an exponential where alpha == 1)."""
  alpha = jnp.broadcast_to(alpha.astype(jnp.float64)[None, :], (samples, alpha.shape[0]))
  stream = _Stream(_value_index(*alpha.shape) * jnp.uint64(_GAMMA_BLOCKS), jnp.zeros(alpha.shape, jnp.uint64))
  exponential = -_log1p_neg(_doubles(_block(key, counter, stream))[..., 1])
  below_one = alpha < 1
  d = alpha + jnp.where(below_one, 2.0 / 3, -1.0 / 3)
  c = 1.0 / 3 / jnp.sqrt(d)

  def attempt(active, state):
    stream, normals, uniforms, result = state
    x, stream, normals = _read(key, counter, stream, normals, active, _normals)
    v = 1 + c * x
    positive = ~(v <= 0)
    v = v * v * v
    u, stream, uniforms = _read(key, counter, stream, uniforms, active & positive, _doubles)
    accepted = positive & ((u < 1 - 0.0331 * (x * x) * (x * x)) | (jnp.log(u) < 0.5 * x * x + d * (1 - v + jnp.log(v))))
    b, stream, uniforms = _read(key, counter, stream, uniforms, active & accepted & below_one, _doubles)
    value = jnp.where(below_one, d * v * jnp.power(b, 1 / alpha), d * v)
    result = jnp.where(active & accepted, value, result)
    return accepted, (stream, normals, uniforms, result)

  state = (stream, _empty(alpha.shape, 2, jnp.float64), _empty(alpha.shape, 2, jnp.float64),
           jnp.full(alpha.shape, jnp.nan))
  unresolved, (_, _, _, result) = _until_accepted(attempt, alpha != 1, state)
  return jnp.where(alpha == 1, exponential, jnp.where(unresolved, jnp.nan, result))


# --------------------------------------------------------------------------- Poisson


def _poisson(key, counter, rate, samples: int):
  """[samples, rates] float64 draws: Knuth's products below rate 10, Hormann's transformed rejection above."""
  rate = jnp.broadcast_to(rate.astype(jnp.float64)[None, :], (samples, rate.shape[0]))
  stream = _Stream(_value_index(*rate.shape) * jnp.uint64(_POISSON_BLOCKS), jnp.zeros(rate.shape, jnp.uint64))
  knuth = rate < 10
  infinite = jnp.isinf(rate) & (rate > 0)
  exp_neg_rate = jnp.exp(-rate)

  def knuth_attempt(active, state):
    stream, uniforms, prod, x, result = state
    u, stream, uniforms = _read(key, counter, stream, uniforms, active, _doubles)
    prod = jnp.where(active, prod * u, prod)
    accepted = prod <= exp_neg_rate
    result = jnp.where(active & accepted, x, result)
    return accepted, (stream, uniforms, prod, jnp.where(active & ~accepted, x + 1, x), result)

  log_rate = jnp.log(rate)
  b = 0.931 + 2.53 * jnp.sqrt(rate)
  a = -0.059 + 0.02483 * b
  inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
  box_v = 0.9277 - 3.6224 / (b - 2)

  def hormann_attempt(active, state):
    stream, uniforms, result = state
    u, v, u_shifted, stream, uniforms = _hormann_pair(key, counter, stream, uniforms, active)
    k = jnp.floor((2 * a / u_shifted + b) * u + rate + 0.43)
    boxed = (u_shifted >= 0.07) & (v <= box_v)
    rejected = (k < 0) | ((u_shifted < 0.013) & (v > u_shifted))
    s = jnp.log(v * inv_alpha / (a / (u_shifted * u_shifted) + b))
    t = -rate + k * log_rate - jax.lax.lgamma(k + 1)
    accepted = boxed | (~rejected & (s <= t))
    return accepted, (stream, uniforms, jnp.where(active & accepted, k, result))

  buffer, nan = _empty(rate.shape, 2, jnp.float64), jnp.full(rate.shape, jnp.nan)
  left_small, (*_, small) = _until_accepted(
      knuth_attempt, knuth, (stream, buffer, jnp.ones(rate.shape), jnp.zeros(rate.shape), nan))
  left_large, (*_, large) = _until_accepted(hormann_attempt, ~knuth & ~infinite, (stream, buffer, nan))
  result = jnp.where(knuth, jnp.where(left_small, jnp.nan, small), jnp.where(left_large, jnp.nan, large))
  return jnp.where(infinite, jnp.inf, result)   # TF writes U's infinity: 0 for an integer U


# --------------------------------------------------------------------------- binomial


def _stirling_tail(k):
  """log k! minus its Stirling approximation (TF's table below 10)."""
  table = jnp.asarray(_STIRLING_TAIL)[jnp.clip(k, 0, 9).astype(jnp.int32)]
  kp1sq = (k + 1) * (k + 1)
  return jnp.where(k <= 9, table, (1.0 / 12 - (1.0 / 360 - 1.0 / 1260 / kp1sq) / kp1sq) / (k + 1))


def _binomial(key, counter, count, prob, samples: int):
  """[samples, batch] float64 draws; `count` and `prob` ([batch]) keep their dtype, as TF's tests do."""
  grid = (samples, count.shape[0])
  count, prob = jnp.broadcast_to(count[None, :], grid), jnp.broadcast_to(prob[None, :], grid)
  n = count.astype(jnp.float64)
  zero = (n <= 0) | (prob <= 0)
  one = ~zero & (prob >= 1)
  lower = prob <= 0.5
  valid = ~zero & ~one & (lower | (prob > 0.5))
  p_low = jnp.where(lower, prob, jnp.asarray(1, prob.dtype) - prob)   # the smaller of p and q, in T
  use_btrs = count * p_low >= 10
  p = p_low.astype(jnp.float64)
  reserved = jnp.where(use_btrs, jnp.uint64(_BTRS_BLOCKS), jnp.uint64(_INVERSION_BLOCKS))
  stream = _Stream(_value_index(*grid) * reserved, jnp.zeros(grid, jnp.uint64))
  nan = jnp.full(grid, jnp.nan)

  log1p_neg_p = _log1p_neg(p)

  def inversion_attempt(active, state):
    stream, uniforms, geom_sum, geoms, result = state
    u, stream, uniforms = _read(key, counter, stream, uniforms, active, _doubles)
    geom_sum = jnp.where(active, geom_sum + jnp.ceil(jnp.log(u) / log1p_neg_p), geom_sum)
    accepted = geom_sum > n
    result = jnp.where(active & accepted, geoms, result)
    return accepted, (stream, uniforms, geom_sum, jnp.where(active & ~accepted, geoms + 1, geoms), result)

  stddev = jnp.sqrt(n * p * (1 - p))
  b = 1.15 + 2.53 * stddev
  a = -0.0873 + 0.0248 * b + 0.01 * p
  c = n * p + 0.5
  v_r = 0.92 - 4.2 / b
  r = p / (1 - p)
  alpha = (2.83 + 5.1 / b) * stddev
  m = jnp.floor((n + 1) * p)

  def btrs_attempt(active, state):
    stream, uniforms, result = state
    u, v, us, stream, uniforms = _hormann_pair(key, counter, stream, uniforms, active)
    k = jnp.floor((2 * a / us + b) * u + c)
    boxed = (us >= 0.07) & (v <= v_r)
    rejected = (k < 0) | (k > n)
    v = jnp.log(v * alpha / (a / (us * us) + b))
    bound = ((m + 0.5) * jnp.log((m + 1) / (r * (n - m + 1))) + (n + 1) * jnp.log((n - m + 1) / (n - k + 1))
             + (k + 0.5) * jnp.log(r * (n - k + 1) / (k + 1)) + _stirling_tail(m) + _stirling_tail(n - m)
             - _stirling_tail(k) - _stirling_tail(n - k))
    accepted = boxed | (~rejected & (v <= bound))
    return accepted, (stream, uniforms, jnp.where(active & accepted, k, result))

  buffer = _empty(grid, 2, jnp.float64)
  left_inv, (*_, by_inversion) = _until_accepted(
      inversion_attempt, valid & ~use_btrs, (stream, buffer, jnp.zeros(grid), jnp.zeros(grid), nan))
  left_btrs, (*_, by_btrs) = _until_accepted(btrs_attempt, valid & use_btrs, (stream, buffer, nan))
  draw = jnp.where(use_btrs, jnp.where(left_btrs, jnp.nan, by_btrs), jnp.where(left_inv, jnp.nan, by_inversion))
  draw = jnp.where(lower, draw, n - draw)
  return jnp.where(zero, 0.0, jnp.where(one, n, jnp.where(valid, draw, jnp.nan)))


# --------------------------------------------------------------------------- parameterized truncated normal


_TRUNCATED_MAX_ITERATIONS = 1000   # TF's kMaxIterations: its stream reservation per value is 2x this
_RANDN_INSIDE = 1.3                # stddevs inside the bounds for TF to sample normals and reject


def _truncated_cost(dtype) -> int:
  """TF's Shard cost per value (TruncatedNormalFunctorV2's batchCost, Eigen's AVX costs, no FMA)."""
  exp, sqrt = {8: (51, 28), 4: (34, 8), 2: (43, 8)}[np.dtype(dtype).itemsize]
  init = 4 + 2 + sqrt + 4 + exp + 1
  uniform_round = 13 + 1 + 1 + 2 + 1 + 13 + exp + 1 + 1
  return init + 2 * uniform_round


def _unit(words, dtype):
  """UniformDistribution<T>: 4 values per block (2 for double), as float64."""
  if np.dtype(dtype) == np.float64:
    return _doubles(words)
  if np.dtype(dtype) == np.float32:
    return jnp.stack([ph.unit_float32(w) for w in words], -1).astype(jnp.float64)
  return jnp.stack([ph.unit_half(w, dtype) for w in words], -1).astype(jnp.float64)


def _normal_block(words, dtype):
  """NormalDistribution<T>: 4 normals per block (2 for double), as float64."""
  if np.dtype(dtype) == np.float64:
    return _normals(words)
  pairs = ph.box_muller_float32(words[0], words[1]) + ph.box_muller_float32(words[2], words[3])
  return jnp.stack(pairs, -1).astype(dtype).astype(jnp.float64)


def _truncated_normal(key, counter, params, samples: int, dtype, shard: int):
  """[samples, batches] draws of TF's CPU kernel; `params` (mean, stddev, minval, maxval) are [batches].

  TF shards the values (parameter-major) over its thread pool; a shard reads one stream from
  Skip(first value * 2000 / values per block) and its values, in order, take from it what their
  sampler needs (normals with rejection, uniform proposals, or exponential proposals), a block at a
  time; what a value's last block leaves is dropped. Shards run in lock-step here, values in a shard
  one after another.
  """
  def r(x):   # TF's arithmetic in T: each result rounded to T, and kept apart from the next operation
    return _unfused(x.astype(dtype).astype(jnp.float64))

  per_block = 2 if np.dtype(dtype) == np.float64 else 4
  mean, stddev, minval, maxval = (p.astype(jnp.float64) for p in params)
  batches = mean.shape[0]
  total = batches * samples
  invalid = ~((stddev > 0) & (minval < maxval) & (jnp.isfinite(minval) | jnp.isfinite(maxval)))
  swap = (jnp.isinf(minval) & (minval < 0)) | (maxval < mean)
  minval, maxval = jnp.where(swap, maxval, minval), jnp.where(swap, minval, maxval)
  stddev = jnp.where(swap, -stddev, stddev)
  norm_min, norm_max = r(r(minval - mean) / stddev), r(r(maxval - mean) / stddev)
  sqrt_factor = r(jnp.sqrt(r(r(norm_min * norm_min) + 4)))
  cutoff = r(r(2 * r(jnp.exp(r(0.5 + r(r(norm_min * r(norm_min - sqrt_factor)) / 4))))) / r(norm_min + sqrt_factor))
  diff = r(norm_max - norm_min)
  inside = r(jnp.float64(_RANDN_INSIDE))
  randn = ((norm_min < -inside) & (norm_max >= 0)) | ((norm_max > inside) & (norm_min <= 0))
  uniform = ~randn & (diff < cutoff)
  plus_factor = jnp.where(norm_min < 0, 0.0, r(norm_min * norm_min))
  alpha = r(r(norm_min + sqrt_factor) / 2)

  starts = np.arange(0, total, shard, dtype=np.int64)
  limits = jnp.asarray(np.minimum(starts + shard, total))
  skips = jnp.asarray(((starts * 2 * _TRUNCATED_MAX_ITERATIONS + per_block - 1) // per_block).astype(np.uint64))

  def step(state):
    step_count, pos, used, out = state
    active = pos < limits
    b = jnp.clip(pos // samples, 0, batches - 1)
    at = lambda v: v[b][:, None]  # noqa: E731  (the current batch's parameter, per shard)
    first = ph.philox(jnp, ph.skip(jnp, counter, skips + used), key)
    second = ph.philox(jnp, ph.skip(jnp, counter, skips + used + 1), key)
    scale, shift, low, high = at(stddev), at(mean), at(norm_min), at(norm_max)
    normals = _normal_block(first, dtype)
    randn_ok, randn_value = (normals >= low) & (normals <= high), r(r(normals * scale) + shift)
    rand, u = _unit(first, dtype), _unit(second, dtype)
    z = r(r(rand * at(diff)) + low)
    uniform_ok = u <= r(jnp.exp(r(r(at(plus_factor) - r(z * z)) / 2)))
    uniform_value = r(r(z * scale) + shift)
    ze = r(r(-r(jnp.log(rand[:, 0::2])) / at(alpha)) + low)
    x = jnp.where(low < at(alpha), r(at(alpha) - ze), r(low - at(alpha)))
    exp_ok = (rand[:, 1::2] <= r(jnp.exp(r(r(-x * x) / 2)))) & (ze < high)
    exp_ok = jnp.pad(exp_ok, ((0, 0), (0, per_block - exp_ok.shape[1])))
    exp_value = jnp.pad(r(r(ze * scale) + shift), ((0, 0), (0, per_block - ze.shape[1])))
    method_randn, method_uniform = at(randn), at(uniform)
    ok = jnp.where(method_randn, randn_ok, jnp.where(method_uniform, uniform_ok, exp_ok))
    value = jnp.where(method_randn, randn_value, jnp.where(method_uniform, uniform_value, exp_value))
    room = jnp.minimum((b + 1) * samples, limits) - pos
    ok = jnp.where(at(invalid), True, ok)   # TF raises "Invalid parameters"; here the batch is NaN
    value = jnp.where(at(invalid), jnp.nan, value)
    rank = jnp.cumsum(ok, axis=1)
    take = ok & (rank <= room[:, None]) & active[:, None]
    out = out.at[jnp.where(take, pos[:, None] + rank - 1, total)].set(value, mode="drop")
    pos = pos + jnp.where(active, jnp.minimum(rank[:, -1], room), 0)
    blocks = jnp.where(invalid[b], 0, jnp.where(uniform[b], 2, 1))
    return step_count + 1, pos, used + jnp.where(active, blocks, 0).astype(jnp.uint64), out

  max_steps = min(_TRUNCATED_MAX_ITERATIONS * shard, 2**31 - 1)
  state = (jnp.int32(0), jnp.asarray(starts), jnp.zeros(starts.shape, jnp.uint64), jnp.full(total, jnp.nan))
  _, _, _, out = jax.lax.while_loop(lambda st: (st[0] < max_steps) & jnp.any(st[1] < limits), step, state)
  return out.reshape(batches, samples).T


# --------------------------------------------------------------------------- op rules


def _layout(shape: tuple[int, ...], param_shape: tuple[int, ...], what: str) -> tuple[int, int]:
  """(samples per parameter, parameters) of an output `shape` that ends with `param_shape`."""
  if len(param_shape) > len(shape) or tuple(shape[len(shape) - len(param_shape):]) != tuple(param_shape):
    raise ShapeMismatchError(f"a stateless sampler's shape {list(shape)} must end with its {what}'s shape "
                             f"{list(param_shape)} (TF's rule); pass shape = sample shape + {list(param_shape)}")
  params = math.prod(param_shape)
  return math.prod(shape) // max(params, 1), params


def _out_dtype(dtype) -> np.dtype:
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _as_output(values, shape, dtype, infinity=None):
  """float64 draws in TF's output layout and type. An integer type takes TF's x86 conversion: a value
  it cannot hold (NaN, inf, out of range) becomes its minimum, and `infinity` (if given) stands for inf."""
  values = values.reshape(shape)
  if not jnp.issubdtype(dtype, jnp.integer):
    return values.astype(dtype)
  info = jnp.iinfo(dtype)
  out = jnp.where((values >= info.min) & (values < -float(info.min)), values, info.min).astype(dtype)
  return out if infinity is None else jnp.where(jnp.isposinf(values), jnp.asarray(infinity, dtype), out)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _run_gamma(shape, out_dtype, samples, key, counter, alpha):
  return _as_output(_gamma(key, counter, alpha, samples), shape, out_dtype)


def gamma(words, shape, dtype, alpha):
  """TF's gamma draws of `shape` (ending with alpha's shape) from the Philox (key, counter) `words`."""
  alpha, out_dtype = jnp.asarray(alpha), _out_dtype(dtype)
  samples, params = _layout(shape, alpha.shape, "alpha")
  if samples * params == 0:
    return jnp.zeros(shape, out_dtype)
  key, counter = words

  @jax.custom_jvp
  def draw(alpha):
    with ph.wide():
      return _run_gamma(shape, out_dtype, samples, key, counter, alpha.reshape(-1))

  @draw.defjvp
  def draw_jvp(primals, tangents):   # TF's gradient: d sample / d alpha by implicit differentiation
    (alpha,), (d_alpha,) = primals, tangents
    sample = draw(alpha)
    wide = jnp.promote_types(sample.dtype, jnp.float32)
    partial = jax.lax.random_gamma_grad(jnp.broadcast_to(alpha, shape).astype(wide), sample.astype(wide))
    return sample, (partial * jnp.broadcast_to(d_alpha, shape).astype(wide)).astype(sample.dtype)

  return draw(alpha)


@register("StatelessRandomGammaV2")
def stateless_gamma_v2(ctx, shape, seed, alpha):
  return gamma(seed_words(seed), sample_shape(shape), ctx.attr("dtype"), alpha)


@register("StatelessRandomGammaV3")
def stateless_gamma_v3(ctx, shape, key, counter, alg, alpha):
  return gamma(v2_words(key, counter, alg), sample_shape(shape), ctx.attr("dtype"), alpha)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _run_poisson(shape, out_dtype, samples, key, counter, rate):
  return _as_output(_poisson(key, counter, rate, samples), shape, out_dtype, infinity=0)


@register("StatelessRandomPoisson")
def stateless_poisson(ctx, shape, seed, lam):
  return poisson(seed_words(seed), sample_shape(shape), ctx.attr("dtype"), lam)


def poisson(words, shape, dtype, lam):
  """TF's Poisson draws of `shape` (ending with lam's shape) from the Philox (key, counter) `words`."""
  rate, out_dtype = jax.lax.stop_gradient(jnp.asarray(lam)), _out_dtype(dtype)
  samples, params = _layout(shape, rate.shape, "rate")
  if samples * params == 0:
    return jnp.zeros(shape, out_dtype)
  key, counter = words
  with ph.wide():
    return _run_poisson(shape, out_dtype, samples, key, counter, rate.reshape(-1))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _run_binomial(shape, out_dtype, samples, key, counter, count, prob):
  return _as_output(_binomial(key, counter, count, prob, samples), shape, out_dtype)


@register("StatelessRandomBinomial")
def stateless_binomial(ctx, shape, seed, counts, probs):
  shape, out_dtype = sample_shape(shape), _out_dtype(ctx.attr("dtype"))
  counts, probs = (jax.lax.stop_gradient(jnp.asarray(v)) for v in (counts, probs))
  batch = np.broadcast_shapes(counts.shape, probs.shape)
  samples, params = _layout(shape, batch, "broadcast counts' and probs'")
  if samples * params == 0:
    return jnp.zeros(shape, out_dtype)
  key, counter = seed_words(seed)
  counts, probs = (jnp.broadcast_to(v, batch).reshape(-1) for v in (counts, probs))
  with ph.wide():
    return _run_binomial(shape, out_dtype, samples, key, counter, counts, probs)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3, 4))
def _run_truncated_normal(shape, dtype, out_dtype, samples, shard, key, counter, *params):
  values = _truncated_normal(key, counter, params, samples, dtype, shard)
  return values.reshape(shape).astype(out_dtype)


@register("StatelessParameterizedTruncatedNormal")
def stateless_parameterized_truncated_normal(ctx, shape, seed, means, stddevs, minvals, maxvals):
  shape, dtype = sample_shape(shape), np.dtype(ctx.attr("dtype"))
  params = [jax.lax.stop_gradient(jnp.asarray(v)) for v in (means, stddevs, minvals, maxvals)]
  batch = np.broadcast_shapes(*(p.shape for p in params))
  samples, batches = _layout(shape, batch, "broadcast parameters'")
  if samples * batches == 0:
    return jnp.zeros(shape, _out_dtype(dtype))
  shard = eigen_block_size(samples * batches, _truncated_cost(dtype), tf_threads())
  key, counter = seed_words(seed)
  params = [jnp.broadcast_to(p, batch).reshape(-1) for p in params]
  with ph.wide():
    return _run_truncated_normal(shape, dtype, _out_dtype(dtype), samples, shard, key, counter, *params)


# --------------------------------------------------------------------------- shuffle


@functools.partial(jax.jit, static_argnums=(0,))
def _permutation(size: int, key, counter):
  """TF's Fisher-Yates order: step i swaps positions i and j_i = i + word_i % (size - i), words read in
  stream order. Computed without the sequential loop (which XLA:CPU runs at ~20 us a step):

  position i is final after step i, and holds what position j_i held then: the value step m moved
  there, D[m], for the last m < i with j_m == j_i, or else the original j_i. D[m], what position m
  held at step m, is D of the last earlier step that swapped into position m, or the original m: a
  chain resolved by pointer jumping.
  """
  words = ph.blocks(key, counter, -(-(size - 1) // 4)).reshape(-1)[:size - 1]
  step = jnp.arange(size - 1, dtype=jnp.uint64)
  partner = (step + words % (jnp.uint64(size) - step)).astype(jnp.int32)
  step = step.astype(jnp.int32)
  order = jnp.argsort(partner, stable=True)          # steps grouped by partner, in step order
  grouped = partner[order]
  same = jnp.concatenate([jnp.zeros(1, bool), grouped[1:] == grouped[:-1]])
  earlier = jnp.full(size - 1, -1, jnp.int32).at[order].set(
      jnp.where(same, jnp.roll(order, 1), -1).astype(jnp.int32))   # last earlier step, same partner
  swapped_in = jnp.full(size, -1, jnp.int32).at[jnp.where(step < partner, partner, size)].max(step, mode="drop")
  held = jnp.where(swapped_in < 0, jnp.arange(size, dtype=jnp.int32), swapped_in)
  for _ in range(max(size - 1, 1).bit_length() + 1):
    held = held[held]
  final = jnp.where(earlier >= 0, held[jnp.maximum(earlier, 0)], partner)
  return jnp.concatenate([final, held[size - 1:]])


@register("StatelessShuffle")
def stateless_shuffle(ctx, value, key, counter, alg):
  value = jnp.asarray(value)
  if shuffles_nothing(value):
    return value
  return shuffle(v2_words(key, counter, alg), value)


def shuffles_nothing(value) -> bool:
  """Whether TF's shuffle kernels return `value` as is (a scalar, or at most one row or element)."""
  return value.ndim == 0 or value.shape[0] <= 1 or value.size <= 1


def shuffle(words, value):
  """`value`'s rows in TF's Fisher-Yates order drawn from the Philox (key, counter) `words`."""
  key, counter = words
  with ph.wide():
    perm = _permutation(value.shape[0], key, counter)
  return jnp.take(value, perm, axis=0)
