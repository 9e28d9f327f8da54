"""StableHLO random ops: rng_bit_generator (bit-exact) and the keyless rng (not reproducible).

`rng_bit_generator` with a two-word `ui64` state (what `jax.random` with the rbg
implementations and TF's stateless threefry emit) runs as `lax.rng_bit_generator`
with the matching `lax.RandomAlgorithm`, so XLA computes the very same bits. A
three-word state (TF's stateless Philox: key, 128-bit counter) is beyond
`lax.rng_bit_generator`; it runs as XLA's Philox-4x32-10 written in `lax` integer ops,
bit for bit what XLA's CPU and GPU compilers expand it to. DEFAULT is Philox there
(TPUs have another default: their bits differ).

The op runs in scoped x64 mode (its state is ui64; see the interpreter), so its 64-bit values are
exact without `jax_enable_x64`. A caller without x64 may also pass a state as the `(n, 2)` ui32 word
pairs that JAX leaves where it narrows ui64 (jax's rbg keys do this); it gets pairs back.

`stablehlo.rng` (TF's keyless RandomUniform / RandomStandardNormal under XLA) takes
fresh keys from the call's rng (`ctx.call.next_rng()`) and draws with
`jax.random.uniform` / `randint` / `normal`: same distributions, never XLA's values
(XLA seeds it from hidden per-execution state; no two runs of the original agree
either).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.custom_call import target
from jaxport.convert.stablehlo.elementwise import canon, is_const
from jaxport.convert.stablehlo.interpreter import caller_x64, handler
from jaxport.convert.stablehlo.shape import static_shape
from jaxport.errors import StableHLOError

_ALGORITHMS = {"DEFAULT": lax.RandomAlgorithm.RNG_DEFAULT, "THREE_FRY": lax.RandomAlgorithm.RNG_THREE_FRY,
               "PHILOX": lax.RandomAlgorithm.RNG_PHILOX}


def _state_words(ctx, state) -> tuple[jax.Array | np.ndarray, bool]:
  """The ui64[n] state as ui32 `(n, 2)` [low, high] word pairs, and whether it came as real ui64."""
  n = ctx.op.result_types[0].shape[0]
  if is_const(state):
    words = np.ascontiguousarray(state, np.uint64).view(np.uint32).reshape(n, 2)   # little-endian: low first
    return (words if np.little_endian else words[:, ::-1]), False
  dtype = jnp.asarray(state).dtype
  if dtype == jnp.uint64:
    return lax.bitcast_convert_type(state, jnp.uint32), True
  if dtype in (jnp.uint32, jnp.int32) and np.shape(state) == (n, 2):
    return lax.bitcast_convert_type(state, jnp.uint32), False
  raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: its ui64[{n}] state arrived as a "
                       f"{dtype}{list(np.shape(state))}; expected ui64[{n}] or ({n}, 2) ui32 word pairs")


def _state_value(words, as_u64: bool):
  """Word pairs back as ui64: NumPy for constants; traced pairs stay pairs without x64."""
  if is_const(words):
    words = np.ascontiguousarray(words if np.little_endian else words[:, ::-1], np.uint32)
    return words.view(np.uint64).reshape(-1)
  return lax.bitcast_convert_type(words, jnp.uint64) if as_u64 else words


@handler("stablehlo.rng_bit_generator")
def rng_bit_generator(ctx, state):
  algorithm = getattr(ctx.attr("rng_algorithm"), "value", ctx.attr("rng_algorithm"))
  if algorithm not in _ALGORITHMS:
    raise StableHLOError(f"stablehlo.rng_bit_generator in module {ctx.call.name!r}: unknown algorithm "
                         f"{algorithm!r}")
  state_type, out_type = ctx.result_types
  return _generate(ctx, state, algorithm, tuple(out_type.shape), np.dtype(out_type.dtype), state_type)


@target("stablehlo.dynamic_rng_bit_generator")
def dynamic_rng_bit_generator(ctx, state, shape):
  algorithm = getattr(ctx.attr("rng_algorithm"), "value", ctx.attr("rng_algorithm"))
  state_type, out_type = ctx.result_types
  return _generate(ctx, state, algorithm, static_shape(ctx, shape, "output shape"), np.dtype(out_type.dtype),
                   state_type)


def _generate(ctx, state, algorithm, shape, dtype, state_type):
  if np.dtype(state_type.dtype) != np.uint64 or len(state_type.shape) != 1:
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: a {state_type} state is not supported "
                         "(expected ui64[2] or ui64[3])")
  bits = dtype.itemsize * 8
  if bits not in (8, 16, 32, 64) or dtype == np.bool_:
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: {dtype} random bits are not supported")
  unsigned = np.dtype(f"uint{bits}")
  words, as_u64 = _state_words(ctx, state)
  n = state_type.shape[0]
  if n == 2:
    key, out = lax.rng_bit_generator(jnp.reshape(jnp.asarray(words, jnp.uint32), (4,)), shape, unsigned,
                                     algorithm=_ALGORITHMS[algorithm])
    new_words = jnp.reshape(key, (2, 2))
  elif n == 3 and algorithm in ("PHILOX", "DEFAULT"):
    out, new_words = _philox(words, shape, bits)
    out = out.astype(unsigned)
  else:
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: algorithm {algorithm} with a ui64[{n}] "
                         "state is not supported (XLA takes ui64[2], or ui64[3] for PHILOX)")
  if unsigned != dtype:
    out = out.view(dtype) if is_const(out) else lax.bitcast_convert_type(out, dtype)
  return [_state_value(new_words, as_u64 or caller_x64()), out]


# --------------------------------------------------------------------------- Philox-4x32-10

_M0, _M1 = np.uint32(0xD2511F53), np.uint32(0xCD9E8D57)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)


def _mul_hi_lo(x, k: np.uint32):
  """High and low 32 bits of the 64-bit product `x * k`, in ui32 arithmetic only."""
  lo16 = np.uint32(0xFFFF)
  s16 = np.uint32(16)
  kl, kh = k & lo16, k >> s16
  xl, xh = x & lo16, x >> s16
  ll, lh, hl, hh = xl * kl, xl * kh, xh * kl, xh * kh
  mid = (ll >> s16) + (lh & lo16) + (hl & lo16)
  return hh + (lh >> s16) + (hl >> s16) + (mid >> s16), x * k


def _philox_rounds(c, k):
  c0, c1, c2, c3 = c
  k0, k1 = k
  for _ in range(10):
    hi0, lo0 = _mul_hi_lo(c0, _M0)
    hi1, lo1 = _mul_hi_lo(c2, _M1)
    c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    k0, k1 = k0 + _W0, k1 + _W1
  return c0, c1, c2, c3


def _add_u128(words, n, xp):
  """A 128-bit counter (four ui32 words, low first) plus `n` (ui32 array), with carries."""
  w0, w1, w2, w3 = words
  s0 = w0 + n
  carry = (s0 < w0).astype(xp.uint32)
  s1 = w1 + carry
  carry = (s1 < carry).astype(xp.uint32)
  s2 = w2 + carry
  carry = (s2 < carry).astype(xp.uint32)
  return s0, s1, s2, w3 + carry


def _philox(words, shape, bits):
  """XLA's PhiloxBitGenerator for a [key, counter_low, counter_high] state (as ui32 word pairs).

  In NumPy when the state is a constant (the bits are then constants too), else jitted `lax`."""
  if is_const(words):
    with np.errstate(over="ignore"):
      return _philox_impl(np.asarray(words, np.uint32), shape, bits, np)
  return _philox_jit(jnp.asarray(words, jnp.uint32), shape, bits, jnp)


def _philox_impl(words, shape, bits, xp):
  count = int(np.prod(shape, dtype=np.int64))
  per_block = 2 if bits == 64 else 4     # outputs per 128-bit block
  blocks = -(-count // per_block)
  key = (words[0, 0], words[0, 1])
  counter = (words[1, 0], words[1, 1], words[2, 0], words[2, 1])
  iota = xp.arange(blocks, dtype=xp.uint32)
  out = _philox_rounds(_add_u128([xp.broadcast_to(w, (blocks,)) for w in counter], iota, xp), key)
  if bits == 64:
    wide = [o.astype(xp.uint64) for o in out]
    s32 = xp.uint64(32)
    out = (wide[0] | (wide[1] << s32), wide[2] | (wide[3] << s32))
  values = xp.reshape(xp.stack(out, axis=1), (-1,))[:count].reshape(shape)
  new = _add_u128(counter, xp.uint32(blocks), xp)
  new_words = xp.stack([xp.stack(key), xp.stack(new[:2]), xp.stack(new[2:])]).astype(xp.uint32)
  return values, new_words


_philox_jit = jax.jit(_philox_impl, static_argnums=(1, 2, 3))


# --------------------------------------------------------------------------- keyless rng

@handler("stablehlo.rng")
def rng(ctx, a, b, shape):
  distribution = getattr(ctx.attr("rng_distribution"), "value", ctx.attr("rng_distribution"))
  shape = static_shape(ctx, shape, "output shape")
  dtype = jax.dtypes.canonicalize_dtype(ctx.result_type.dtype)
  key = ctx.call.next_rng()
  a, b = canon(a), canon(b)
  if distribution == "UNIFORM":
    if jnp.issubdtype(dtype, jnp.integer):
      return jax.random.randint(key, shape, a, b, dtype)
    return jax.random.uniform(key, shape, dtype, minval=a, maxval=b)
  if distribution == "NORMAL":
    return jnp.asarray(a, dtype) + jnp.asarray(b, dtype) * jax.random.normal(key, shape, dtype)
  raise StableHLOError(f"stablehlo.rng in module {ctx.call.name!r}: unknown distribution {distribution!r}")
