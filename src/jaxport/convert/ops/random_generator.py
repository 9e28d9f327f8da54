"""Op rules: the state ops of `tf.random.Generator` (RngReadAndSkip, RngSkip), and the stateful
draws older Generators made (StatefulUniform, StatefulUniformInt, StatefulUniformFullInt,
StatefulStandardNormalV2, StatefulTruncatedNormal: the V2 stateless draw at the state's key and
counter, then the same skip).

A Generator (and tf_keras' random layers: RandomFlip, RandomRotation, RandomCrop, ... draw from
one) keeps its Philox state in an int64[3] variable: a 128-bit counter (two words, low first) and
a key. A draw reads the state and advances the counter by 256 per value requested (TF's kernel:
PhiloxRandom::Skip of delta * 256, the product modulo 2**64); the stateless V2 op then samples
from the (key, counter) it read, bit-exact with TF (ops/stateless_random.py). So a converted
Generator draws TF's own numbers, and its advanced state comes back in the new params.

Without `jax_enable_x64`, JAX holds the int64 state in int32 (a state that does not fit is refused
when passed in, `X64OverflowError`). The counter then wraps at 2**31, after about 8.4 million values
drawn from a generator seeded with a small seed: the stream stays random but leaves TF's. The first
such node warns once per conversion (`X64NarrowingWarning`), which also says that int64 draws (as
seeds of stateless ops: tf_keras RandomFlip, RandomContrast) are narrowed to 32 bits.
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops import philox as ph
from jaxport.convert.ops._util import is_concrete
from jaxport.convert.ops import stateless_random as stateless
from jaxport.convert.ops.stateless_random import check_alg
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError, X64NarrowingWarning

_STATE_WORDS = 3     # Philox: a 128-bit counter (two int64 words) and a 64-bit key
_SKIP_PER_VALUE = 256


@register("RngReadAndSkip", writes_state=True, structural=True)
def rng_read_and_skip(ctx, ref, alg, delta):
  """The state before the skip; the variable advanced by `delta` values."""
  old = ctx.runtime.read_variable(ref)
  ctx.runtime.assign_variable(ref, _skipped(ctx, old, alg, delta))
  return old


@register("RngSkip", writes_state=True, structural=True)
def rng_skip(ctx, ref, algorithm, delta):
  ctx.runtime.assign_variable(ref, _skipped(ctx, ctx.runtime.read_variable(ref), algorithm, delta))
  return ()


_STATEFUL_DRAWS = {"StatefulUniform": stateless.stateless_uniform_v2,
                   "StatefulStandardNormalV2": stateless.stateless_normal_v2,
                   "StatefulTruncatedNormal": stateless.stateless_truncated_normal_v2,
                   "StatefulUniformFullInt": stateless.stateless_uniform_full_int_v2,
                   "StatefulUniformInt": stateless.stateless_uniform_int_v2}


@register(*_STATEFUL_DRAWS, writes_state=True, structural=True)
def stateful_draw(ctx, ref, algorithm, shape, *bounds):
  """The stateless V2 draw at the state's counter (words 0-1) and key (word 2), then the skip."""
  state = ctx.runtime.read_variable(ref)
  out = _STATEFUL_DRAWS[ctx.op](ctx, shape, state[2:3], state[:2], algorithm, *bounds)
  count = np.uint64(np.prod(stateless.sample_shape(shape), dtype=np.uint64))
  ctx.runtime.assign_variable(ref, _skipped(ctx, state, algorithm, count))
  return out


def _skipped(ctx, state, alg, delta):
  """`state` with its counter advanced by delta * 256 (mod 2**64) as TF's PhiloxRandom::Skip does."""
  check_alg(alg)
  if np.shape(state) != (_STATE_WORDS,):
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: a Philox generator state has shape [{_STATE_WORDS}], "
                           f"got {list(np.shape(state))}")
  xp = np if is_concrete(state) and is_concrete(delta) else jnp
  with ph.wide():
    words = ph.u64(xp, xp.asarray(state))
    count = ph.u64(xp, xp.asarray(delta)) * xp.uint64(_SKIP_PER_VALUE)
    c0, c1 = ph.split64(xp, words[0])
    c2, c3 = ph.split64(xp, words[1])
    c0, c1, c2, c3 = ph.skip(xp, (c0, c1, c2, c3), count)
    new = xp.stack([ph.join64(xp, c0, c1), ph.join64(xp, c2, c3), words[2]])
    new = new.view(np.int64) if xp is np else jax.lax.bitcast_convert_type(new, jnp.int64)
    held = np.dtype(state.dtype)
    if held.itemsize == 8:
      return new
    narrowed = new.astype(held)   # the low 32 bits
  _warn_narrow(ctx)
  return narrowed


def _warn_narrow(ctx) -> None:
  warned = ctx.runtime.library.memo.setdefault("generator_state_warned", set())
  if warned:
    return
  warned.add(ctx.name)
  warnings.warn(X64NarrowingWarning(
      f"{ctx.op} node {ctx.name!r}: jax_enable_x64 is off, so JAX holds this tf.random.Generator's int64 "
      "state in int32: its draws are TF's until its counter passes 2**31 (about 8.4 million values from a "
      "small seed), after which it wraps and the stream leaves TF's; and its int64 draws (tf_keras "
      "RandomFlip and RandomContrast seed stateless ops with them) are narrowed to 32 bits, so what they "
      "seed differs from TF's. To follow TF's stream throughout, enable it before converting: "
      "jax.config.update('jax_enable_x64', True)."), stacklevel=2)
