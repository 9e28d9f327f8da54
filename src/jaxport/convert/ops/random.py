"""Op rules: random number generation from the `rng` key.

jaxport cannot reproduce TF's Philox streams: every random op draws from the
PRNG key passed as `rng=` to the converted function, so values follow TF's
distributions, shapes and dtypes but not its exact numbers.

* Stateful ops (RandomUniform, ...) use a key derived from `rng` and the node's
  name: distinct nodes draw independent values; the op-level `seed` attrs are ignored.
* Stateless ops fold their seed (or key and counter) into `rng`, so equal seeds
  give equal values (across nodes too, as in TF) and different seeds different
  ones. Seeds may depend on the inputs. The `alg` input is ignored.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import is_concrete, static_ints
from jaxport.convert.registry import register

_ALG_PHILOX = np.int32(1)   # what TF reports on CPU; the algorithm actually used is rng's
_ZERO_COUNTER = np.zeros(2, np.uint64)


def _dtype(dtype):
  """JAX's width for `dtype` (int64/float64 narrow to 32 bits unless x64 is enabled)."""
  return jax.dtypes.canonicalize_dtype(dtype)


def _shape(shape) -> tuple[int, ...]:
  return tuple(static_ints(shape, "shape of a random op"))


# --------------------------------------------------------------------------- keys


def _node_key(ctx):
  return ctx.runtime.rng_for(ctx.name)


def _words(x):
  """Each integer of `x` as two uint32 words (low, high), equal for equal values of any int dtype."""
  if is_concrete(x):
    v = np.asarray(x).astype(np.int64).reshape(-1)
    low, high = (v & 0xFFFFFFFF).astype(np.uint32), ((v >> 32) & 0xFFFFFFFF).astype(np.uint32)
  else:
    v = jnp.ravel(x)
    if v.dtype.itemsize == 8:
      low, high = (v & 0xFFFFFFFF).astype(jnp.uint32), (v >> 32).astype(jnp.uint32)
    else:
      signed = jnp.issubdtype(v.dtype, jnp.signedinteger)
      low = v.astype(jnp.uint32)
      high = (v >> 31).astype(jnp.uint32) if signed else jnp.zeros_like(low)
  return [w for pair in zip(low, high) for w in pair]


def _seeded_key(ctx, key, counter=_ZERO_COUNTER):
  """`rng` with a stateless op's key and counter (or seed) folded in; the node name plays no part."""
  rng = ctx.runtime.stateless_rng(ctx.name)
  for word in _words(key) + _words(counter):
    rng = jax.random.fold_in(rng, word)
  return rng


@register("StatelessRandomGetKeyCounter")
def get_key_counter(ctx, seed):
  # The seed itself serves as the key, so V1 ops on `seed` and V2 ops on its key draw the same stream.
  return seed, _ZERO_COUNTER


@register("StatelessRandomGetKeyCounterAlg")
def get_key_counter_alg(ctx, seed):
  return seed, _ZERO_COUNTER, _ALG_PHILOX


@register("StatelessRandomGetAlg")
def get_alg(ctx):
  return _ALG_PHILOX


# --------------------------------------------------------------------------- samplers


def _uniform(key, shape, dtype):
  return jax.random.uniform(key, shape, _dtype(dtype))


def _normal(key, shape, dtype):
  return jax.random.normal(key, shape, _dtype(dtype))


def _truncated_normal(key, shape, dtype):
  return jax.random.truncated_normal(key, -2.0, 2.0, shape, _dtype(dtype))


def _uniform_int(key, shape, dtype, minval, maxval):
  return jax.random.randint(key, shape, minval, maxval, _dtype(dtype))


def _uniform_full_int(key, shape, dtype):
  dtype = _dtype(dtype)
  bits = jax.random.bits(key, shape, jnp.dtype(f"uint{8 * dtype.itemsize}"))
  return jax.lax.bitcast_convert_type(bits, dtype)


def _categorical(key, logits, num_samples, dtype):
  logits = jnp.asarray(logits)
  draws = jax.random.categorical(key, logits[:, None, :], axis=-1, shape=(logits.shape[0], num_samples))
  return draws.astype(_dtype(dtype))


def _gamma(key, shape, alpha, dtype):
  alpha = jnp.asarray(alpha)
  return jax.random.gamma(key, jnp.broadcast_to(alpha, shape + alpha.shape), dtype=_dtype(dtype))


def _poisson(key, shape, rate, dtype):
  rate = jnp.asarray(rate)
  return jax.random.poisson(key, rate, shape + rate.shape).astype(_dtype(dtype))


# --------------------------------------------------------------------------- stateful ops


@register("RandomUniform", needs_rng=True)
def random_uniform(ctx, shape):
  return _uniform(_node_key(ctx), _shape(shape), ctx.attr("dtype"))


@register("RandomStandardNormal", needs_rng=True)
def random_standard_normal(ctx, shape):
  return _normal(_node_key(ctx), _shape(shape), ctx.attr("dtype"))


@register("TruncatedNormal", needs_rng=True)
def truncated_normal(ctx, shape):
  return _truncated_normal(_node_key(ctx), _shape(shape), ctx.attr("dtype"))


@register("RandomUniformInt", needs_rng=True)
def random_uniform_int(ctx, shape, minval, maxval):
  return _uniform_int(_node_key(ctx), _shape(shape), ctx.attr("Tout"), minval, maxval)


@register("RandomShuffle", needs_rng=True)
def random_shuffle(ctx, value):
  return jax.random.permutation(_node_key(ctx), jnp.asarray(value), axis=0, independent=False)


@register("Multinomial", needs_rng=True)
def multinomial(ctx, logits, num_samples):
  return _categorical(_node_key(ctx), logits, static_ints(num_samples)[0], ctx.attr("output_dtype", np.int64))


@register("RandomGamma", needs_rng=True)
def random_gamma(ctx, shape, alpha):
  return _gamma(_node_key(ctx), _shape(shape), alpha, ctx.attr("T"))


@register("RandomPoisson", "RandomPoissonV2", needs_rng=True)
def random_poisson(ctx, shape, rate):
  return _poisson(_node_key(ctx), _shape(shape), rate, ctx.attr("dtype"))


# --------------------------------------------------------------------------- stateless ops


@register("StatelessRandomUniform", needs_rng=True)
def stateless_uniform(ctx, shape, seed):
  return _uniform(_seeded_key(ctx, seed), _shape(shape), ctx.attr("dtype"))


@register("StatelessRandomNormal", needs_rng=True)
def stateless_normal(ctx, shape, seed):
  return _normal(_seeded_key(ctx, seed), _shape(shape), ctx.attr("dtype"))


@register("StatelessTruncatedNormal", needs_rng=True)
def stateless_truncated_normal(ctx, shape, seed):
  return _truncated_normal(_seeded_key(ctx, seed), _shape(shape), ctx.attr("dtype"))


@register("StatelessRandomUniformInt", needs_rng=True)
def stateless_uniform_int(ctx, shape, seed, minval, maxval):
  return _uniform_int(_seeded_key(ctx, seed), _shape(shape), ctx.attr("dtype"), minval, maxval)


@register("StatelessRandomUniformFullInt", needs_rng=True)
def stateless_uniform_full_int(ctx, shape, seed):
  return _uniform_full_int(_seeded_key(ctx, seed), _shape(shape), ctx.attr("dtype"))


@register("StatelessRandomUniformV2", needs_rng=True)
def stateless_uniform_v2(ctx, shape, key, counter, alg):
  return _uniform(_seeded_key(ctx, key, counter), _shape(shape), ctx.attr("dtype"))


@register("StatelessRandomNormalV2", needs_rng=True)
def stateless_normal_v2(ctx, shape, key, counter, alg):
  return _normal(_seeded_key(ctx, key, counter), _shape(shape), ctx.attr("dtype"))


@register("StatelessTruncatedNormalV2", needs_rng=True)
def stateless_truncated_normal_v2(ctx, shape, key, counter, alg):
  return _truncated_normal(_seeded_key(ctx, key, counter), _shape(shape), ctx.attr("dtype"))


@register("StatelessRandomUniformIntV2", needs_rng=True)
def stateless_uniform_int_v2(ctx, shape, key, counter, alg, minval, maxval):
  return _uniform_int(_seeded_key(ctx, key, counter), _shape(shape), ctx.attr("dtype"), minval, maxval)


@register("StatelessRandomUniformFullIntV2", needs_rng=True)
def stateless_uniform_full_int_v2(ctx, shape, key, counter, alg):
  return _uniform_full_int(_seeded_key(ctx, key, counter), _shape(shape), ctx.attr("dtype"))


@register("StatelessMultinomial", needs_rng=True)
def stateless_multinomial(ctx, logits, num_samples, seed):
  return _categorical(_seeded_key(ctx, seed), logits, static_ints(num_samples)[0],
                      ctx.attr("output_dtype", np.int64))


@register("StatelessRandomGammaV2", needs_rng=True)
def stateless_gamma_v2(ctx, shape, seed, alpha):
  return _gamma(_seeded_key(ctx, seed), _shape(shape), alpha, ctx.attr("dtype"))


@register("StatelessRandomGammaV3", needs_rng=True)
def stateless_gamma_v3(ctx, shape, key, counter, alg, alpha):
  return _gamma(_seeded_key(ctx, key, counter), _shape(shape), alpha, ctx.attr("dtype"))


@register("StatelessRandomPoisson", needs_rng=True)
def stateless_poisson(ctx, shape, seed, lam):
  return _poisson(_seeded_key(ctx, seed), _shape(shape), lam, ctx.attr("dtype"))


@register("StatelessRandomBinomial", needs_rng=True)
def stateless_binomial(ctx, shape, seed, counts, probs):
  shape = _shape(shape)
  counts = jnp.broadcast_to(jnp.asarray(counts, jnp.float32), shape)
  probs = jnp.broadcast_to(jnp.asarray(probs, jnp.float32), shape)
  return jax.random.binomial(_seeded_key(ctx, seed), counts, probs, shape).astype(_dtype(ctx.attr("dtype")))

