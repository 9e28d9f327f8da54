"""StableHLO ops of no other family: batch norm, map, and collectives on one device.

`batch_norm_*` follow the StableHLO spec with `jnp`, so `grad` and `vmap` work through
them (XLA's expander computes the variance as E[x²] − E[x]², the spec as E[(x − E[x])²];
the two agree to float rounding). `map` runs its region through `jax.vmap`.

The interpreter runs a module as one process: `partition_id` and `replica_id` are 0,
and a collective whose every group holds one process (`replica_groups` of shape
[n, 1], or empty in a module of one replica and one partition) is the identity, as
the spec defines it for one participant. Collectives across more processes raise.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.elementwise import canon
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.errors import StableHLOError


# --------------------------------------------------------------------------- batch norm

def _feature(ctx, x):
  """(reduction axes, broadcast of a feature vector to x's shape)."""
  feature = ctx.attr("feature_index")
  shape = np.shape(x)
  axes = tuple(i for i in range(len(shape)) if i != feature)
  return axes, lambda v: lax.broadcast_in_dim(canon(v), shape, (feature,))


def _epsilon(ctx, x):
  return jnp.asarray(ctx.attr("epsilon"), jnp.result_type(x))


@handler("stablehlo.batch_norm_training")
def batch_norm_training(ctx, x, scale, offset):
  x = jnp.asarray(canon(x))
  axes, bcast = _feature(ctx, x)
  mean = jnp.mean(x, axis=axes)
  centered = x - bcast(mean)
  variance = jnp.mean(centered * centered, axis=axes)
  normalized = centered / jnp.sqrt(bcast(variance) + _epsilon(ctx, x))
  return [normalized * bcast(scale) + bcast(offset), mean, variance]


@handler("stablehlo.batch_norm_inference")
def batch_norm_inference(ctx, x, scale, offset, mean, variance):
  x = jnp.asarray(canon(x))
  _, bcast = _feature(ctx, x)
  normalized = (x - bcast(mean)) / jnp.sqrt(bcast(variance) + _epsilon(ctx, x))
  return normalized * bcast(scale) + bcast(offset)


@handler("stablehlo.batch_norm_grad")
def batch_norm_grad(ctx, x, scale, mean, variance, grad_output):
  """The spec's (and XLA's batchnorm_expander's) gradient of batch_norm_training."""
  x, grad_output = jnp.asarray(canon(x)), jnp.asarray(canon(grad_output))
  axes, bcast = _feature(ctx, x)
  variance_eps = bcast(variance) + _epsilon(ctx, x)
  centered = x - bcast(mean)
  stddev = jnp.sqrt(variance_eps)
  count = jnp.asarray(x.size // max(x.shape[ctx.attr("feature_index")], 1), grad_output.dtype)
  i1 = grad_output * count
  i2 = bcast(jnp.sum(grad_output, axis=axes))
  i3 = bcast(jnp.sum(grad_output * centered, axis=axes))
  i6 = i1 - i2 - i3 * centered / variance_eps
  grad_operand = bcast(scale) / stddev / count * i6
  grad_scale = jnp.sum(grad_output * (centered / stddev), axis=axes)
  return [grad_operand, grad_scale, jnp.sum(grad_output, axis=axes)]


# --------------------------------------------------------------------------- map

@handler("stablehlo.map")
def map_(ctx, *inputs):
  """The region (a function of scalars) applied elementwise, vectorized with `jax.vmap`."""
  shape = np.shape(inputs[0])
  if list(ctx.attr("dimensions")) != list(range(len(shape))):
    raise StableHLOError(f"stablehlo.map in module {ctx.call.name!r} maps over dimensions "
                         f"{ctx.attr('dimensions')}; the spec (and jaxport) needs all of 0..{len(shape) - 1}")
  region = ctx.region(0)
  flat = [jnp.reshape(canon(x), (-1,)) for x in inputs]
  out = jax.vmap(lambda *xs: jnp.asarray(region(*xs)[0]))(*flat)
  return jnp.reshape(out, shape)


# --------------------------------------------------------------------------- one process

@handler("stablehlo.partition_id", "stablehlo.replica_id")
def process_id(ctx):
  return np.zeros((), np.uint32)


def _one_process(ctx, groups_attr: str = "replica_groups") -> None:
  """Raises unless every group of the collective holds at most this one process."""
  groups = np.asarray(ctx.attrs.get(groups_attr, np.zeros((0, 0), np.int64)))
  if groups.size == 0:   # one group of all processes
    attrs = ctx.call.module.attrs
    processes = int(attrs.get("mhlo.num_replicas", 1)) * int(attrs.get("mhlo.num_partitions", 1))
    if processes <= 1:
      return
    detail = f"all {processes} processes"
  elif groups.ndim == 2 and groups.shape[1] <= 1:
    return
  else:
    detail = f"groups {groups.tolist()}"
  raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r} exchanges data between {detail}; jaxport "
                       "runs a module as one process. Export the function for a single device "
                       "(one replica, one partition) to convert it.")


def _same_shapes(ctx, xs) -> None:
  for x, t in zip(xs, ctx.result_types):
    if tuple(np.shape(x)) != tuple(t.shape):
      raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r} changes shape {np.shape(x)} to "
                           f"{t.shape}, which one process cannot do")


@handler("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
         "stablehlo.collective_broadcast")
def one_process_collective(ctx, *xs):
  """The identity: a group of one reduces, gathers, scatters and broadcasts its own value."""
  _one_process(ctx)
  _same_shapes(ctx, xs)
  return list(xs)


@handler("stablehlo.all_to_all")
def all_to_all(ctx, *xs):
  _one_process(ctx)
  if int(ctx.attrs.get("split_count", 1)) != 1:
    raise StableHLOError(f"stablehlo.all_to_all in module {ctx.call.name!r} splits across "
                         f"{ctx.attrs.get('split_count')} processes; jaxport runs a module as one process")
  _same_shapes(ctx, xs)
  return list(xs)


@handler("stablehlo.collective_permute")
def collective_permute(ctx, x):
  """Process 0 receives its own value if a pair sends 0 → 0, else zeros (the spec's fill)."""
  pairs = np.asarray(ctx.attr("source_target_pairs")).reshape(-1, 2)
  if np.any(pairs > 0):
    raise StableHLOError(f"stablehlo.collective_permute in module {ctx.call.name!r} sends between processes "
                         f"{pairs.tolist()}; jaxport runs a module as one process")
  if len(pairs):
    return x
  return np.zeros(np.shape(x), jax.dtypes.canonicalize_dtype(ctx.result_type.dtype))
