"""Op rules: stateful random ops, drawn from the `rng` key.

Stateful ops (RandomUniform, ...) cannot reproduce TF's values (TF's generator state
is not part of the graph): they draw from the PRNG key passed as `rng=` to the
converted function, with a key derived from `rng` and the node's name, so distinct
nodes draw independent values; values follow TF's distributions, shapes and dtypes.
The op-level `seed` attrs are ignored.

The stateless ops reproduce TF's values: `ops/stateless_random.py` (uniform, normal,
int, multinomial) and `ops/stateless_samplers.py` (gamma, Poisson, binomial,
parameterized truncated normal, shuffle).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import static_ints
from jaxport.convert.ops.stateless_random import sample_shape
from jaxport.convert.registry import register


def _dtype(dtype):
  """JAX's width for `dtype` (int64/float64 narrow to 32 bits unless x64 is enabled)."""
  return jax.dtypes.canonicalize_dtype(dtype)


# --------------------------------------------------------------------------- keys


def _node_key(ctx):
  return ctx.runtime.rng_for(ctx.name)


# --------------------------------------------------------------------------- samplers


def _uniform(key, shape, dtype):
  return jax.random.uniform(key, shape, _dtype(dtype))


def _normal(key, shape, dtype):
  return jax.random.normal(key, shape, _dtype(dtype))


def _truncated_normal(key, shape, dtype):
  return jax.random.truncated_normal(key, -2.0, 2.0, shape, _dtype(dtype))


def _uniform_int(key, shape, dtype, minval, maxval):
  return jax.random.randint(key, shape, minval, maxval, _dtype(dtype))


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
  return _uniform(_node_key(ctx), sample_shape(shape), ctx.attr("dtype"))


@register("RandomStandardNormal", needs_rng=True)
def random_standard_normal(ctx, shape):
  return _normal(_node_key(ctx), sample_shape(shape), ctx.attr("dtype"))


@register("TruncatedNormal", needs_rng=True)
def truncated_normal(ctx, shape):
  return _truncated_normal(_node_key(ctx), sample_shape(shape), ctx.attr("dtype"))


@register("RandomUniformInt", needs_rng=True)
def random_uniform_int(ctx, shape, minval, maxval):
  return _uniform_int(_node_key(ctx), sample_shape(shape), ctx.attr("Tout"), minval, maxval)


@register("RandomShuffle", needs_rng=True)
def random_shuffle(ctx, value):
  return jax.random.permutation(_node_key(ctx), jnp.asarray(value), axis=0, independent=False)


@register("Multinomial", needs_rng=True)
def multinomial(ctx, logits, num_samples):
  return _categorical(_node_key(ctx), logits, static_ints(num_samples)[0], ctx.attr("output_dtype", np.int64))


@register("RandomGamma", needs_rng=True)
def random_gamma(ctx, shape, alpha):
  return _gamma(_node_key(ctx), sample_shape(shape), alpha, ctx.attr("T"))


@register("RandomPoisson", "RandomPoissonV2", needs_rng=True)
def random_poisson(ctx, shape, rate):
  return _poisson(_node_key(ctx), sample_shape(shape), rate, ctx.attr("dtype"))
