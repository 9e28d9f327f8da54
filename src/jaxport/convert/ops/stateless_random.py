"""Op rules: stateless random ops, pure functions of their seed (or key, counter and alg), as in TF.

No `rng` is needed. These reproduce TF's CPU kernels: the Philox4x32-10 stream
(`ops/philox.py`), the key and counter TF derives from a seed, the order in which the
kernels fill their outputs, and their per-element transforms.

Bit-exact with TF (CPU), any seed, shape and dtype JAX holds:
  StatelessRandomGetKeyCounter, StatelessRandomGetKeyCounterAlg, StatelessRandomGetAlg,
  StatelessRandomUniform(V2), StatelessRandomUniformInt(V2), StatelessRandomUniformFullInt(V2).
StatelessMultinomial: bit-exact too: TF's sampler (Philox doubles against a float64 CDF,
  upper_bound) and its sharding, for which jaxport replays TF's thread-pool cost model
  with this machine's CPU count (TF's default pool). TF's own values for large batches
  depend on that count; a TF run with another intra-op pool size shards differently.
Within 2 ulp of TF, the same stream and transforms, StatelessRandomNormal(V2) and
  StatelessTruncatedNormal(V2): TF's kernel calls glibc's logf and sincosf, which are not
  correctly rounded (about 1% of their float32 results are an ulp off); jaxport computes
  them in float64 and rounds correctly, so about 1-3% of float32 normals differ by 1-2 ulp
  (float16/bfloat16 results nearly always agree; float64 ones, with x64, use XLA's
  log/sin/cos against glibc's, also within an ulp or two). Reproducing glibc's table-driven
  routines (and their FMA variants, picked by CPU) was out of scope. A truncated normal
  whose |value| lies within an ulp of 2 could in principle be accepted by one and not
  the other (never seen). The truncated normals' rejection loop reads at most 24 of the
  256 words TF reserves per group of values; a group needing more has odds below 1e-13.
StatelessRandomGammaV2/V3, StatelessRandomPoisson, StatelessRandomBinomial,
  StatelessParameterizedTruncatedNormal, StatelessShuffle: TF's rejection samplers and its
  Fisher-Yates shuffle, value for value, in `ops/stateless_samplers.py` (the truncated
  normal's normal proposals within 2 ulp, as above).

Algorithms: TF's CPU kernels run Philox (1) and auto-select (3, i.e. Philox); ThreeFry (2)
  is refused on CPU by TF and here too.
Without `jax_enable_x64`, 64-bit outputs are narrowed as everywhere in JAX; a uint64 key or
  counter computed from a traced seed is then carried as a JAX key array of the same shape
  (its data are the two 32-bit words), so the V2 ops still see all 64 bits.
"""
from __future__ import annotations

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops import philox as ph
from jaxport.convert.ops._util import is_concrete, static_ints
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError, UnsupportedValueError

ALG_PHILOX, ALG_THREEFRY, ALG_AUTO = 1, 2, 3
_TRUNCATE = 2.0            # TF truncates normals to (-2, 2)
_TRUNCATED_BLOCKS = 6      # Philox blocks read per truncated-normal group (TF may read 256)


def sample_shape(shape) -> tuple[int, ...]:
  """A random op's static output shape."""
  return tuple(static_ints(shape, "shape of a random op"))


def _canonical(dtype) -> np.dtype:
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _is_64bit(dtype) -> bool:
  return np.dtype(dtype).itemsize == 8


# --------------------------------------------------------------------------- keys and counters


# Traced work runs as one jitted computation: eager calls then compile once, not per primitive.
_seed_key_counter = jax.jit(functools.partial(ph.seed_key_counter, jnp))
_v2_key_counter = jax.jit(functools.partial(ph.v2_key_counter, jnp))


def seed_words(seed):
  """The Philox (key, counter) words of a V1 op's seed: NumPy for a constant seed."""
  with ph.wide():
    return ph.seed_key_counter(np, seed) if is_concrete(seed) else _seed_key_counter(jnp.asarray(seed))


def v2_words(key, counter, alg):
  check_alg(alg)
  with ph.wide():
    if is_concrete(key) and is_concrete(counter):
      return ph.v2_key_counter(np, key, counter)
    return _v2_key_counter(jnp.asarray(key), jnp.asarray(counter))


def check_alg(alg) -> None:
  if not is_concrete(alg):
    return   # a traced alg: Philox, what TF's CPU kernels run for 1 and 3
  value = int(np.asarray(alg))
  if value == ALG_THREEFRY:
    raise UnsupportedValueError(
        "stateless random op with alg=2 (ThreeFry): TF's CPU kernels refuse it and jaxport follows "
        "them; use alg=1 (Philox) or 3 (auto-select)")
  if value not in (ALG_PHILOX, ALG_AUTO):
    raise UnsupportedValueError(f"unknown random algorithm id {value}; TF knows 1 (Philox), 2 and 3 (auto)")


def _uint64_out(lows, highs):
  """A uint64 tensor from its 32-bit words: NumPy or jnp uint64, or a key array of them without x64."""
  if all(is_concrete(w) for w in lows + highs):
    return ph.join64(np, np.stack(lows).astype(np.uint64), np.stack(highs).astype(np.uint64))
  if jax.config.jax_enable_x64:
    return ph.join64(jnp, jnp.stack(lows), jnp.stack(highs))
  with ph.wide():   # stack the words while they are still 64-bit arrays
    data = jnp.stack([jnp.stack(lows), jnp.stack(highs)], -1).astype(jnp.uint32)
  return jax.random.wrap_key_data(data, impl="threefry2x32")


@register("StatelessRandomGetKeyCounter")
def get_key_counter(ctx, seed):
  (k0, k1), (c0, c1, c2, c3) = seed_words(seed)
  return _uint64_out([k0], [k1]), _uint64_out([c0, c2], [c1, c3])


@register("StatelessRandomGetKeyCounterAlg")
def get_key_counter_alg(ctx, seed):
  return (*get_key_counter(ctx, seed), np.int32(ALG_PHILOX))


@register("StatelessRandomGetAlg")
def get_alg(ctx):
  return np.int32(ALG_PHILOX)   # what TF returns on CPU


# --------------------------------------------------------------------------- samplers


def _groups(n: int, size: int) -> int:
  return -(-n // size)


def _flat(x):
  """Merges the last two axes."""
  return x.reshape(x.shape[:-2] + (x.shape[-2] * x.shape[-1],))


def uniform_values(key, counter, n, dtype):
  if _is_64bit(dtype):
    w = ph.blocks(key, counter, _groups(n, 2))
    values = jnp.stack([ph.unit_float64(w[..., 0], w[..., 1]), ph.unit_float64(w[..., 2], w[..., 3])], -1)
  else:
    w = ph.blocks(key, counter, _groups(n, 4))
    values = ph.unit_float32(w) if dtype == np.float32 else ph.unit_half(w, dtype)
  return _flat(values)[..., :n]


def normal_values(key, counter, n, dtype):
  w = ph.blocks(key, counter, _groups(n, 4 if not _is_64bit(dtype) else 2))
  if _is_64bit(dtype):
    values = jnp.stack(ph.box_muller_float64(*(w[..., i] for i in range(4))), -1)
  else:
    f0, f1 = ph.box_muller_float32(w[..., 0], w[..., 1])
    f2, f3 = ph.box_muller_float32(w[..., 2], w[..., 3])
    values = jnp.stack([f0, f1, f2, f3], -1).astype(dtype)
  return _flat(values)[..., :n]


def _first_accepted(candidates, count: int):
  """Per row, the first `count` candidates with |x| < 2, in order (TF's rejection loop)."""
  accepted = jnp.abs(candidates) < _TRUNCATE
  rank = jnp.cumsum(accepted.astype(jnp.int32), axis=-1)
  # int32 indices: the wide (x64) trace may sit inside a caller's 32-bit jit.
  picks = [jax.lax.argmax(accepted & (rank == i + 1), accepted.ndim - 1, jnp.int32) for i in range(count)]
  return jnp.take_along_axis(candidates, jnp.stack(picks, -1), axis=-1)


def truncated_normal_values(key, counter, n, dtype):
  size = 2 if _is_64bit(dtype) else 4
  w = ph.group_streams(key, counter, _groups(n, size), size, _TRUNCATED_BLOCKS)
  if _is_64bit(dtype):
    w = w.reshape(w.shape[:-1] + (w.shape[-1] // 4, 4))
    candidates = jnp.stack(ph.box_muller_float64(*(w[..., i] for i in range(4))), -1)
  else:
    w = w.reshape(w.shape[:-1] + (w.shape[-1] // 2, 2))
    candidates = jnp.stack(ph.box_muller_float32(w[..., 0], w[..., 1]), -1)
  values = _first_accepted(_flat(candidates), size).astype(dtype)
  return _flat(values)[..., :n]


def _int_words(key, counter, n, dtype):
  """One uint64 word per value: a Philox word, or two joined for 64-bit types (low first)."""
  if _is_64bit(dtype):
    w = ph.blocks(key, counter, _groups(n, 2))
    words = jnp.stack([ph.join64(jnp, w[..., 0], w[..., 1]), ph.join64(jnp, w[..., 2], w[..., 3])], -1)
  else:
    words = ph.blocks(key, counter, _groups(n, 4))
  return _flat(words)[..., :n]


def _as_int(words, dtype):
  """Low bits of uint64 `words` as `dtype` (two's complement)."""
  dtype = np.dtype(dtype)
  unsigned = np.dtype(f"uint{8 * dtype.itemsize}")
  return jax.lax.bitcast_convert_type((words & np.uint64((1 << 8 * dtype.itemsize) - 1)).astype(unsigned), dtype)


def uniform_full_int_values(key, counter, n, dtype):
  return _as_int(_int_words(key, counter, n, dtype), dtype)


def uniform_int_values(key, counter, n, dtype, minval, maxval):
  bits = 8 * np.dtype(dtype).itemsize
  mask = np.uint64((1 << bits) - 1)
  low = ph.u64(jnp, jnp.asarray(minval, dtype))
  span = (ph.u64(jnp, jnp.asarray(maxval, dtype)) - low) & mask
  return _as_int(low + _int_words(key, counter, n, dtype) % jnp.where(span == 0, 1, span)[..., None], dtype)


def check_range(minval, maxval) -> None:
  if is_concrete(minval) and is_concrete(maxval) and not np.all(np.asarray(minval) < np.asarray(maxval)):
    raise InvalidNodeError(f"uniform int needs minval < maxval, got {np.asarray(minval)} and {np.asarray(maxval)}")


def sample(sampler, words, shape, dtype, *args):
  """Runs `sampler(key, counter, n, dtype, *args)` wide and shapes its values."""
  (key, counter), dtype = words, np.dtype(dtype)
  out_dtype = _canonical(dtype)   # the caller's: float64 is float32 without x64 (not inside wide())
  with ph.wide():
    return _run_sampler(sampler, shape, dtype, out_dtype, key, counter, *args)


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _run_sampler(sampler, shape, dtype, out_dtype, key, counter, *args):
  values = sampler(key, counter, math.prod(shape), dtype, *args)
  return values.reshape(values.shape[:-1] + shape).astype(out_dtype)


# --------------------------------------------------------------------------- V1 ops (seed)


@register("StatelessRandomUniform")
def stateless_uniform(ctx, shape, seed):
  return sample(uniform_values, seed_words(seed), sample_shape(shape), ctx.attr("dtype"))


@register("StatelessRandomNormal")
def stateless_normal(ctx, shape, seed):
  return sample(normal_values, seed_words(seed), sample_shape(shape), ctx.attr("dtype"))


@register("StatelessTruncatedNormal")
def stateless_truncated_normal(ctx, shape, seed):
  return sample(truncated_normal_values, seed_words(seed), sample_shape(shape), ctx.attr("dtype"))


@register("StatelessRandomUniformInt")
def stateless_uniform_int(ctx, shape, seed, minval, maxval):
  check_range(minval, maxval)
  return sample(uniform_int_values, seed_words(seed), sample_shape(shape), ctx.attr("dtype"), minval, maxval)


@register("StatelessRandomUniformFullInt")
def stateless_uniform_full_int(ctx, shape, seed):
  return sample(uniform_full_int_values, seed_words(seed), sample_shape(shape), ctx.attr("dtype"))


# --------------------------------------------------------------------------- V2 ops (key, counter, alg)


@register("StatelessRandomUniformV2")
def stateless_uniform_v2(ctx, shape, key, counter, alg):
  return sample(uniform_values, v2_words(key, counter, alg), sample_shape(shape), ctx.attr("dtype"))


@register("StatelessRandomNormalV2")
def stateless_normal_v2(ctx, shape, key, counter, alg):
  return sample(normal_values, v2_words(key, counter, alg), sample_shape(shape), ctx.attr("dtype"))


@register("StatelessTruncatedNormalV2")
def stateless_truncated_normal_v2(ctx, shape, key, counter, alg):
  return sample(truncated_normal_values, v2_words(key, counter, alg), sample_shape(shape), ctx.attr("dtype"))


@register("StatelessRandomUniformIntV2")
def stateless_uniform_int_v2(ctx, shape, key, counter, alg, minval, maxval):
  check_range(minval, maxval)
  return sample(uniform_int_values, v2_words(key, counter, alg), sample_shape(shape), ctx.attr("dtype"), minval, maxval)


@register("StatelessRandomUniformFullIntV2")
def stateless_uniform_full_int_v2(ctx, shape, key, counter, alg):
  return sample(uniform_full_int_values, v2_words(key, counter, alg), sample_shape(shape), ctx.attr("dtype"))


# --------------------------------------------------------------------------- multinomial

def tf_threads() -> int:
  """The size of TF's intra-op thread pool by default: the CPUs this process may run on."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def eigen_block_size(n: int, cost_per_unit: int, threads: int) -> int:
  """Rows per shard of TF's Shard (Eigen's ThreadPoolDevice::parallelFor and its cost model)."""
  total = n * float(cost_per_unit)
  if n <= 1 or threads <= 1 or min(threads, max(1, int((total - 100_000) / 100_000 + 0.9))) == 1:
    return max(n, 1)
  block = min(n, max(-(-n // (4 * threads)), int(40_000 / cost_per_unit) if cost_per_unit else n))
  max_block, count = min(n, 2 * block), -(-n // block)
  best = count / (-(-count // threads) * threads)
  previous = count
  while best < 1.0 and previous > 1:
    coarser = -(-n // (previous - 1))
    if coarser > max_block:
      break
    coarser_count = previous = -(-n // coarser)
    efficiency = coarser_count / (-(-coarser_count // threads) * threads)
    if efficiency + 0.01 >= best:
      block, best = coarser, max(best, efficiency)
  return block


def _multinomial_rows_start(batch: int, num_samples: int, num_classes: int) -> list[int]:
  """The word of the Philox stream at which each row's draws start in TF's kernel.

  TF shards the rows over its thread pool; a shard restarts the stream at
  Skip(first_row * (num_samples + 3) / 4) blocks and its rows then read 2 words a draw.
  """
  cost = int(50 * (num_samples * math.log(max(num_classes, 1)) / math.log(2) + num_classes))
  block = eigen_block_size(batch, cost, tf_threads())
  starts = []
  for row in range(batch):
    first = row - row % block
    starts.append(4 * (first * (num_samples + 3) // 4) + 2 * num_samples * (row - first))
  return starts


def _multinomial(key, counter, logits, num_samples: int):
  """[batch, num_samples] class indices: upper_bound of a float64 draw in each row's CDF."""
  batch, num_classes = logits.shape
  starts = _multinomial_rows_start(batch, num_samples, num_classes)
  words_per_row = 2 * num_samples
  offsets = np.asarray(starts, np.uint64)[:, None] + np.arange(words_per_row, dtype=np.uint64)[None, :]
  shift, lane = offsets // 4, offsets % 4   # the block and the word in it
  blocks = ph.philox(jnp, ph.skip(jnp, counter, jnp.asarray(shift)), key)
  words = jnp.choose(jnp.asarray(lane.astype(np.int32)), jnp.broadcast_arrays(*blocks), mode="clip")
  draws = ph.unit_float64(words[..., 0::2], words[..., 1::2])
  finite = jnp.isfinite(logits)
  top = jnp.max(jnp.where(finite, logits, jnp.finfo(logits.dtype).min), axis=-1, keepdims=True)
  weights = jnp.where(finite, jnp.exp(logits.astype(jnp.float64) - top.astype(jnp.float64)), 0.0)
  cdf = jnp.cumsum(weights, axis=-1)
  targets = draws * cdf[..., -1:]
  return jnp.sum(cdf[..., None, :] <= targets[..., :, None], axis=-1, dtype=jnp.int32)


@register("StatelessMultinomial")
def stateless_multinomial(ctx, logits, num_samples, seed):
  return multinomial(seed_words(seed), logits, static_ints(num_samples, "num_samples")[0],
                     ctx.attr("output_dtype", np.int64))


def multinomial(words, logits, num_samples: int, dtype):
  """TF's multinomial draws from the Philox (key, counter) `words`."""
  (key, counter), out_dtype = words, _canonical(dtype)
  with ph.wide():
    return _run_multinomial(num_samples, out_dtype, key, counter, logits)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _run_multinomial(num_samples, out_dtype, key, counter, logits):
  return _multinomial(key, counter, logits, num_samples).astype(out_dtype)
