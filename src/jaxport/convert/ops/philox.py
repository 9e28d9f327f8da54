"""TF's Philox4x32-10 stream and its host kernels' transforms, in integer jnp ops.

Everything here runs inside `wide()` (JAX's x64 mode, scoped), so 64-bit words and
float64 intermediates are exact whatever the caller's x64 setting; results leave it in
the caller's dtypes. A 32-bit word is held in a uint64 (value < 2**32) so that products
and carries need no tricks. Functions take `xp` (numpy or jax.numpy): seed plumbing on
constant seeds stays NumPy, so its outputs stay trace-time constants.
"""
from __future__ import annotations

import contextlib
import math

import jax
import jax.numpy as jnp
import numpy as np

MASK32 = 0xFFFFFFFF
_MUL = (0xD2511F53, 0xCD9E8D57)      # Philox4x32 round multipliers
_BUMP = (0x9E3779B9, 0xBB67AE85)     # Weyl key increments
_SEED_KEY = (0x3EC8F720, 0x02461E29)  # the fixed key that scrambles a V1 seed (GenerateKey)
# TF reserves 256 words (64 Philox blocks) per output value of a rejection sampler.
_RESERVED_BLOCKS_PER_VALUE = 256 // 4


def wide():
  """Scoped x64 mode: uint64/float64 are real inside, whatever the global setting."""
  return contextlib.nullcontext() if jax.config.jax_enable_x64 else jax.enable_x64(True)


def u64(xp, value):
  """An integer array as uint64, two's complement for negatives (int32 sign-extends)."""
  if xp is np:
    value = np.asarray(value)
    return value.astype(np.uint64) if value.dtype.kind == "u" else value.astype(np.int64).view(np.uint64)
  if jnp.issubdtype(value.dtype, jax.dtypes.prng_key):   # a 64-bit word carried without x64
    data = jax.random.key_data(value).astype(jnp.uint64)
    return data[..., 0] | (data[..., 1] << 32)
  if jnp.issubdtype(value.dtype, jnp.unsignedinteger):
    return value.astype(jnp.uint64)
  return jax.lax.bitcast_convert_type(value.astype(jnp.int64), jnp.uint64)


def split64(xp, value):
  """(low, high) 32-bit words of uint64 `value`."""
  return value & xp.uint64(MASK32), value >> xp.uint64(32)


def philox(xp, counter, key):
  """Philox4x32-10 of four counter words and two key words (uint64 arrays, broadcast)."""
  m0, m1, mask = xp.uint64(_MUL[0]), xp.uint64(_MUL[1]), xp.uint64(MASK32)

  def round_(state):
    (c0, c1, c2, c3), (k0, k1) = state
    p0, p1 = c0 * m0, c2 * m1
    counter = ((p1 >> xp.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> xp.uint64(32)) ^ c3 ^ k1, p0 & mask)
    return counter, ((k0 + xp.uint64(_BUMP[0])) & mask, (k1 + xp.uint64(_BUMP[1])) & mask)

  shape = np.broadcast_shapes(*(np.shape(w) for w in (*counter, *key)))
  state = (tuple(xp.broadcast_to(w, shape) for w in counter), tuple(xp.broadcast_to(w, shape) for w in key))
  if xp is np:
    for _ in range(10):
      state = round_(state)
  else:   # a loop, not 10 unrolled rounds: XLA compiles it several times faster
    state = jax.lax.fori_loop(0, 10, lambda _, st: round_(st), state)
  return state[0]   # the key bump after the last round is unused


def skip(xp, counter, offset):
  """The 128-bit counter (four 32-bit words, low first) advanced by uint64 `offset` as TF's
  PhiloxRandom::Skip does: a carry out of the low word into an offset high word of 0xFFFFFFFF is
  lost there (its uint32 increment wraps), so it is here."""
  mask, shift = xp.uint64(MASK32), xp.uint64(32)
  c0, c1, c2, c3 = counter
  low, high = offset & mask, offset >> shift
  t0 = c0 + low
  high = (high + (t0 >> shift)) & mask
  t1 = c1 + high
  t2 = c2 + (t1 >> shift)
  t3 = c3 + (t2 >> shift)
  return t0 & mask, t1 & mask, t2 & mask, t3 & mask


# --------------------------------------------------------------------------- keys


def seed_key_counter(xp, seed):
  """TF's GenerateKey: a V1 op's [2] int seed -> Philox (key, counter) words."""
  seed = u64(xp, seed)
  lo0, hi0 = split64(xp, seed[..., 0])
  lo1, hi1 = split64(xp, seed[..., 1])
  key = (xp.full_like(lo0, _SEED_KEY[0]), xp.full_like(lo0, _SEED_KEY[1]))
  mix = philox(xp, (lo0, hi0, lo1, hi1), key)
  zero = xp.zeros_like(mix[0])
  return (mix[0], mix[1]), (zero, zero, mix[2], mix[3])


def v2_key_counter(xp, key, counter):
  """The Philox words of a V2 op's uint64 key [1] and counter [>= 2]."""
  key, counter = u64(xp, key), u64(xp, counter)
  return split64(xp, key[..., 0]), split64(xp, counter[..., 0]) + split64(xp, counter[..., 1])


def join64(xp, low, high):
  return low | (high << xp.uint64(32))


# --------------------------------------------------------------------------- streams


def blocks(key, counter, n_blocks: int):
  """[n_blocks, 4] words: the blocks at counter, counter + 1, ... (the fixed-count fill)."""
  index = jnp.arange(n_blocks, dtype=jnp.uint64)
  words = philox(jnp, skip(jnp, counter, index), key)
  return jnp.stack(jnp.broadcast_arrays(*words), -1)


def group_streams(key, counter, n_groups: int, group_size: int, n_blocks: int):
  """[n_groups, 4 * n_blocks] words: each output group's own stream, as a rejection sampler reads it.

  Group g starts `group_size * 64` blocks after group g-1 (TF reserves 256 words per value).
  """
  stride = group_size * _RESERVED_BLOCKS_PER_VALUE
  index = (jnp.arange(n_groups, dtype=jnp.uint64)[:, None] * jnp.uint64(stride)
           + jnp.arange(n_blocks, dtype=jnp.uint64)[None, :])
  words = philox(jnp, skip(jnp, counter, index), key)
  return jnp.stack(jnp.broadcast_arrays(*words), -1).reshape(words[0].shape[:-2] + (n_groups, 4 * n_blocks))


# --------------------------------------------------------------------------- transforms


def unit_float32(word):
  """[0, 1) from the low 23 bits (Uint32ToFloat)."""
  bits = ((word & 0x7FFFFF) | 0x3F800000).astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(bits, jnp.float32) - jnp.float32(1)


def unit_half(word, dtype):
  """[0, 1) in float16 (low 10 bits) or bfloat16 (low 7 bits)."""
  if jnp.dtype(dtype) == jnp.float16:
    bits = (word & 0x3FF) | 0x3C00
  else:
    bits = (word & 0x7F) | 0x3F80
  return jax.lax.bitcast_convert_type(bits.astype(jnp.uint16), dtype) - jnp.asarray(1, dtype)


def unit_float64(word0, word1):
  """[0, 1) from 52 bits of two words (Uint64ToDouble)."""
  bits = (jnp.uint64(0x3FF) << 52) | ((word0 & 0xFFFFF) << 32) | word1
  return jax.lax.bitcast_convert_type(bits, jnp.float64) - 1.0


def box_muller_float32(word0, word1):
  """TF's BoxMullerFloat: two float32 normals (sincosf taken as correctly rounded float64)."""
  u1 = jnp.maximum(unit_float32(word0), jnp.float32(1e-7))
  angle = (2.0 * math.pi * unit_float32(word1).astype(jnp.float64)).astype(jnp.float32)
  log_u1 = jnp.log(u1.astype(jnp.float64)).astype(jnp.float32)
  radius = jnp.sqrt(jnp.float32(-2) * log_u1)
  angle = angle.astype(jnp.float64)
  return jnp.sin(angle).astype(jnp.float32) * radius, jnp.cos(angle).astype(jnp.float32) * radius


def box_muller_float64(w0, w1, w2, w3):
  """TF's BoxMullerDouble: two float64 normals from four words."""
  u1 = jnp.maximum(unit_float64(w0, w1), 1e-7)
  angle = 2.0 * math.pi * unit_float64(w2, w3)
  radius = jnp.sqrt(-2.0 * jnp.log(u1))
  return jnp.sin(angle) * radius, jnp.cos(angle) * radius
