"""Op rules: stateful random ops, drawn from the `rng` key or from TF's own seeded streams.

By default stateful ops (RandomUniform, ...) draw from the PRNG key passed as `rng=` to the
converted function, with a key derived from `rng` and the node's name, so distinct nodes draw
independent values; values follow TF's distributions, shapes and dtypes.

With the `tf_random_streams` config on, a node TF seeded (`tf.random.set_seed`, or an op-level
seed: its `seed`/`seed2` attrs are not both 0) draws TF's own numbers instead. TF's kernel keeps a
Philox generator keyed by `seed`, its counter starting at (0, 0, seed2): each call fills the output
as the stateless V2 ops do from that key and counter, then advances the counter past the blocks it
reserved (256 per value; a shuffle one per four steps).
The converted node's counter is a param (`random_stream/<node>`, uint32[4], not trainable), read
and advanced on each call as TF's kernel does, so call after call, loop step after loop step, the
draws are TF's (every stateful op of this module: RandomUniform, RandomUniformInt, RandomStandardNormal,
TruncatedNormal, Multinomial, RandomShuffle, RandomGamma, RandomPoisson; normals within 2 ulp, see
`ops/stateless_random.py`). Unseeded nodes still draw from `rng`, as do the candidate samplers and
fractional pools.

The stateless ops reproduce TF's values: `ops/stateless_random.py` (uniform, normal,
int, multinomial) and `ops/stateless_samplers.py` (gamma, Poisson, binomial,
parameterized truncated normal, shuffle).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.interpreter import VariableRef
from jaxport.convert.ops import philox as ph
from jaxport.convert.ops import stateless_random as stateless
from jaxport.convert.ops import stateless_samplers
from jaxport.convert.ops._util import static_ints
from jaxport.convert.ops.stateless_random import sample_shape
from jaxport.convert.registry import ops_where, register


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


# --------------------------------------------------------------------------- TF's seeded streams

_STREAMS = "random_streams"   # library memo: node -> its counter's params key
_BLOCKS_PER_VALUE = 256       # TF's samplers reserve 256 Philox blocks per value they draw


def _seeds(node) -> tuple[int, int]:
  return int(node.attrs.get("seed", 0) or 0), int(node.attrs.get("seed2", 0) or 0)


def stream_params(labelled_nodes, library, config) -> dict[str, np.ndarray]:
  """With `tf_random_streams` on, the initial counter of each seeded stateful draw among
  `labelled_nodes` ((label, node) pairs of every node that can run), by params key; the library
  remembers each node's key for its rule."""
  streams = library.memo.setdefault(_STREAMS, {})
  if not config.get("tf_random_streams"):
    return {}
  found = {}
  for label, node in labelled_nodes:
    if node.op in ops_where(seeded_stream=True) and _seeds(node) != (0, 0):
      seed2 = np.uint64(_seeds(node)[1] & 0xFFFFFFFFFFFFFFFF)
      key = streams[node] = f"random_stream/{label}"
      found[key] = np.array([0, 0, seed2 & np.uint64(0xFFFFFFFF), seed2 >> np.uint64(32)], np.uint32)
  if found:
    library.memo.pop("writes_state", None)   # analysed before the streams were known: loops now carry them
  return found


def needs_caller_rng(uses: dict[str, list[str]], streams: dict[str, np.ndarray]) -> bool:
  """Whether a node that runs (`uses`: op -> node labels) draws from the caller's `rng`."""
  return any(f"random_stream/{label}" not in streams
             for op in ops_where(needs_rng=True).intersection(uses) for label in uses[op])


def writes_stream(library, node) -> bool:
  """Whether `node` advances a seeded stream's counter (a param): loops carry it as state."""
  return node in library.memo.get(_STREAMS, ())


def _stream_draw(ctx, blocks: int, draw):
  """`draw(words)` from the node's seeded stream (the Philox key and counter words), its counter then
  advanced past the `blocks` Philox blocks TF's kernel reserves; None where the node has no stream."""
  key = ctx.runtime.library.memo.get(_STREAMS, {}).get(ctx.node)
  if key is None:
    return None
  ref = VariableRef(key)
  seed = np.uint64(_seeds(ctx.node)[0] & 0xFFFFFFFFFFFFFFFF)
  with ph.wide():
    state = jnp.asarray(ctx.runtime.read_variable(ref)).astype(jnp.uint64)
    counter = tuple(state[i] for i in range(4))
    advanced = ph.skip(jnp, counter, jnp.uint64(blocks))
    new = jnp.stack(advanced).astype(jnp.uint32)
  out = draw((ph.split64(np, seed), counter))
  ctx.runtime.assign_variable(ref, new)
  return out


def _drawn(ctx, sampler, jax_sampler, shape, dtype, *args):
  """TF's values from the node's seeded stream if it has one, else a draw from the caller's rng."""
  out = _stream_draw(ctx, math.prod(shape) * _BLOCKS_PER_VALUE,
                     lambda words: stateless.sample(sampler, words, shape, dtype, *args))
  return jax_sampler(_node_key(ctx), shape, dtype, *args) if out is None else out


# --------------------------------------------------------------------------- stateful ops


@register("RandomUniform", needs_rng=True, seeded_stream=True)
def random_uniform(ctx, shape):
  return _drawn(ctx, stateless.uniform_values, _uniform, sample_shape(shape), ctx.attr("dtype"))


@register("RandomStandardNormal", needs_rng=True, seeded_stream=True)
def random_standard_normal(ctx, shape):
  return _drawn(ctx, stateless.normal_values, _normal, sample_shape(shape), ctx.attr("dtype"))


@register("TruncatedNormal", needs_rng=True, seeded_stream=True)
def truncated_normal(ctx, shape):
  return _drawn(ctx, stateless.truncated_normal_values, _truncated_normal, sample_shape(shape), ctx.attr("dtype"))


@register("RandomUniformInt", needs_rng=True, seeded_stream=True)
def random_uniform_int(ctx, shape, minval, maxval):
  stateless.check_range(minval, maxval)   # TF's kernel refuses minval >= maxval
  return _drawn(ctx, stateless.uniform_int_values, _uniform_int, sample_shape(shape), ctx.attr("Tout"), minval, maxval)


@register("RandomShuffle", needs_rng=True, seeded_stream=True)
def random_shuffle(ctx, value):
  value = jnp.asarray(value)
  if stateless_samplers.shuffles_nothing(value):
    return value   # TF's kernel returns its input and reserves nothing
  # TF's Fisher-Yates reads one 32-bit word per step: size - 1 words, in blocks of four
  out = _stream_draw(ctx, -(-(value.shape[0] - 1) // 4), lambda words: stateless_samplers.shuffle(words, value))
  return jax.random.permutation(_node_key(ctx), value, axis=0, independent=False) if out is None else out


@register("Multinomial", needs_rng=True, seeded_stream=True)
def multinomial(ctx, logits, num_samples):
  num_samples, dtype = static_ints(num_samples)[0], ctx.attr("output_dtype", np.int64)
  # TF's CPU kernel reserves two values per sample, samples rounded up to a multiple of 4, per row
  blocks = np.shape(logits)[0] * -(-num_samples // 4) * 4 * 2 * _BLOCKS_PER_VALUE
  out = _stream_draw(ctx, blocks, lambda words: stateless.multinomial(words, jnp.asarray(logits), num_samples, dtype))
  return _categorical(_node_key(ctx), logits, num_samples, dtype) if out is None else out


@register("RandomGamma", needs_rng=True, seeded_stream=True)
def random_gamma(ctx, shape, alpha):
  shape, dtype = sample_shape(shape), ctx.attr("T")
  full = shape + np.shape(alpha)
  out = _stream_draw(ctx, math.prod(full) * _BLOCKS_PER_VALUE,
                     lambda words: stateless_samplers.gamma(words, full, dtype, alpha))
  return _gamma(_node_key(ctx), shape, alpha, dtype) if out is None else out


@register("RandomPoisson", "RandomPoissonV2", needs_rng=True, seeded_stream=True)
def random_poisson(ctx, shape, rate):
  shape, dtype = sample_shape(shape), ctx.attr("dtype")
  full = shape + np.shape(rate)
  out = _stream_draw(ctx, math.prod(full) * _BLOCKS_PER_VALUE,
                     lambda words: stateless_samplers.poisson(words, full, dtype, rate))
  return _poisson(_node_key(ctx), shape, rate, dtype) if out is None else out
