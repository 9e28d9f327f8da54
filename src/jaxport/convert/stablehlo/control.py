"""StableHLO control flow: while, case, if, func.call, composite, optimization_barrier.

A `while` whose condition is `counter < bound` with the counter stepping by one from a
constant runs as `lax.fori_loop` with static bounds (a scan, so reverse-mode `grad`
works); other loops run as `lax.while_loop`. Loop variables that the body returns
unchanged and that are constants stay NumPy, closed over instead of carried, so
shapes computed from them stay static.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.elementwise import ELEMENTWISE_OPS, canon, is_const
from jaxport.convert.stablehlo.interpreter import handler, handler_for, run_block
from jaxport.convert.stablehlo.module import Block


def _producer(block: Block, value: int):
  for op in block.ops:
    if value in op.results:
      return op
  return None


def _const_value(ctx, block: Block, value: int, const_args: dict[int, np.ndarray]):
  """The constant behind `value` in `block` (a constant op, a constant loop argument, or an outer constant)."""
  if value in block.args:
    return const_args.get(block.args.index(value))
  op = _producer(block, value)
  if op is not None:
    return op.attrs["value"] if op.name == "stablehlo.constant" else None
  try:
    outer = ctx.env[value]
  except Exception:
    return None
  return outer if is_const(outer) else None


def static_trip_count(ctx, init: list, invariant: set[int]) -> tuple[int, int] | None:
  """(counter position, trips) for `for i in range(start, bound)`-shaped loops, else None."""
  cond, body = ctx.region_block(0), ctx.region_block(1)
  if len(cond.returns) != 1 or any(op.name not in ("stablehlo.constant", "stablehlo.compare") for op in cond.ops):
    return None
  compare = _producer(cond, cond.returns[0])
  if compare is None or compare.name != "stablehlo.compare" or compare.attrs["comparison_direction"].value != "LT":
    return None
  counter_value, bound_value = compare.operands
  if counter_value not in cond.args:
    return None
  k = cond.args.index(counter_value)
  const_args = {i: init[i] for i in invariant if is_const(init[i])}
  bound = _const_value(ctx, cond, bound_value, const_args)
  if bound is None or not is_const(init[k]) or np.dtype(np.asarray(init[k]).dtype).kind not in "iu":
    return None
  step = _producer(body, body.returns[k])
  if step is None or step.name != "stablehlo.add" or body.args[k] not in step.operands:
    return None
  other = [v for v in step.operands if v != body.args[k]]
  one = _const_value(ctx, body, other[0] if other else body.args[k], {})
  if one is None or int(np.asarray(one)) != 1:
    return None
  return k, max(0, int(np.asarray(bound)) - int(np.asarray(init[k])))


def _invariant_constants(body: Block, init: list) -> set[int]:
  """Loop variables the body returns unchanged, whose entry value is a constant."""
  return {i for i, (arg, ret) in enumerate(zip(body.args, body.returns)) if arg == ret and is_const(init[i])}


@handler("stablehlo.while")
def while_(ctx, *init):
  init = list(init)
  cond_block, body_block = ctx.region_block(0), ctx.region_block(1)
  fixed = _invariant_constants(body_block, init)
  carried = [i for i in range(len(init)) if i not in fixed]
  dtypes = {i: jnp.asarray(canon(init[i])).dtype for i in carried}

  def full(carry) -> list:
    values = list(init)
    for i, v in zip(carried, carry):
      values[i] = v
    return values

  def body(carry):
    out = run_block(body_block, full(carry), ctx.call, ctx.env)
    return tuple(jnp.asarray(canon(out[i]), dtypes[i]) for i in carried)

  def cond(carry):
    return jnp.asarray(run_block(cond_block, full(carry), ctx.call, ctx.env)[0])

  start = tuple(jnp.asarray(canon(init[i]), dtypes[i]) for i in carried)
  static = static_trip_count(ctx, init, fixed)
  if static is not None:
    _, trips = static
    final = lax.fori_loop(0, trips, lambda _, carry: body(carry), start)
  else:
    final = lax.while_loop(cond, body, start)
  return full(final)


@handler("stablehlo.case")
def case(ctx, index):
  branches = [ctx.region(i) for i in range(len(ctx.op.regions))]
  if is_const(index):
    i = int(np.asarray(index))
    return branches[i if 0 <= i < len(branches) else len(branches) - 1]()   # out of range: the last branch
  return list(lax.switch(canon(index), [lambda b=b: tuple(b()) for b in branches]))


@handler("stablehlo.if")
def if_(ctx, pred):
  on_true, on_false = ctx.region(0), ctx.region(1)
  if is_const(pred):
    return on_true() if bool(np.asarray(pred)) else on_false()
  return list(lax.cond(canon(pred), lambda: tuple(on_true()), lambda: tuple(on_false())))


@handler("func.call", "stablehlo.call")
def call(ctx, *args):
  return ctx.call.call_function(ctx.attr("callee"), args)


@handler("stablehlo.composite")
def composite(ctx, *args):
  """A composite named after an elementwise op (jax writes `chlo.erf`, `chlo.sinh`, ...) runs as that op, so
  its value and derivative are lax's own; others run their decomposition."""
  name = ctx.attrs.get("name", "")
  if name in ELEMENTWISE_OPS:
    return handler_for(name)(ctx, *args)
  return ctx.call.call_function(ctx.attr("decomposition"), args)


@handler("stablehlo.optimization_barrier")
def optimization_barrier(ctx, *args):
  if all(is_const(a) for a in args):
    return list(args)
  return list(lax.optimization_barrier(tuple(canon(a) for a in args)))


@handler("stablehlo.create_token", "stablehlo.after_all")
def token(ctx, *_):
  return np.zeros((0,), np.bool_)


@handler("sdy.sharding_constraint", "sdy.reshard")
def sharding_constraint(ctx, x):
  return x

