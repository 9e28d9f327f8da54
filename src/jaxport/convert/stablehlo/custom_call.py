"""`stablehlo.custom_call`: the targets jaxport knows, each mapped to `jax.lax`.

Targets register with `@target("name")` and are called as `fn(ctx, *operands)`.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from jaxport.convert.stablehlo.elementwise import is_const
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.errors import ShapeAssertionError, StableHLOError

_TARGETS: dict[str, Callable] = {}


def target(*names: str):
  def decorator(fn):
    for name in names:
      _TARGETS[name] = fn
    return fn
  return decorator


def handled_targets() -> frozenset[str]:
  return frozenset(_TARGETS)


@handler("stablehlo.custom_call")
def custom_call(ctx, *operands):
  name = ctx.attr("call_target_name")
  fn = _TARGETS.get(name)
  if fn is None:
    raise StableHLOError(f"custom_call @{name} in StableHLO module {ctx.call.name!r} cannot be interpreted")
  return fn(ctx, *operands)


@target("shape_assertion")
def shape_assertion(ctx, ok, *values):
  """jax.export's check that the actual input shapes satisfy the module's shape constraints."""
  if not is_const(ok):
    return []   # decided by traced values: nothing to check at trace time
  if not bool(np.asarray(ok)):
    message = ctx.attrs.get("error_message", "shape assertion failed")
    try:
      message = message.format(*[int(np.asarray(v)) for v in values])
    except (IndexError, ValueError, KeyError):
      pass
    raise ShapeAssertionError(f"the inputs do not satisfy the exported function's shape constraints: {message}")
  return []


@target("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement")
def identity(ctx, x, *_):
  return x
