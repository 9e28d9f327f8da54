"""StableHLO control flow: while, case, if, func.call, composite, optimization_barrier.

A call to a function `jaxport.export` marked (`export_marks`) runs as the marked rule.

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

from jaxport.convert import export_marks
from jaxport.convert.stablehlo.elementwise import ELEMENTWISE_OPS, canon, is_const, jax_dtype
from jaxport.convert.stablehlo.interpreter import handler, handler_for, run_block
from jaxport.convert.stablehlo.module import Block
from jaxport.convert.stablehlo.regions import CALLS


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


@handler(*CALLS)
def call(ctx, *args):
  callee = ctx.attr("callee")
  rule, counts = export_marks.rule_for(callee), export_marks.custom_gradient_counts(callee)
  if (rule is None and counts is None) or all(is_const(a) for a in args):
    return ctx.call.call_function(callee, args)
  # A call `jaxport.export` marked: its derivative, not its ops'. JAX passes every function the module's
  # dimension sizes and platform index first (`jax.global_constant` arguments); the rule takes neither.
  attrs = ctx.call.module.functions[callee].arg_attrs or [{}] * len(args)
  shared = [a for a, at in zip(args, attrs) if "jax.global_constant" in (at or {})]
  own = [canon(a) for a, at in zip(args, attrs) if "jax.global_constant" not in (at or {})]
  if counts is not None:
    out = _recorded_gradient(ctx, callee, shared, own, counts)
  else:
    out = rule(*own)
  kept = None if out is None else _results_kept(list(out) if isinstance(out, (tuple, list)) else [out],
                                                ctx.result_types)
  return kept if kept is not None else ctx.call.call_function(callee, args)


def _recorded_gradient(ctx, callee: str, shared: list, own: list, counts) -> list | None:
  """An exported `@tf.custom_gradient` boundary run as the converted one: the forward function's value
  and forward-mode derivative, the recorded gradient function's reverse mode."""
  from jaxport.convert.custom_gradient import differentiable, is_float  # pylint: disable=import-outside-toplevel
  n_values, n_res, n_out, n_inner = counts
  functions = ctx.call.module.functions
  called = [op.attrs.get("callee", "") for op in functions[callee].block.ops if op.name in CALLS]
  # The forward is called twice: by the boundary (jit may prune results no one reads) and whole.
  forward = next((c for c in called if c.startswith(export_marks.CUSTOM_GRADIENT_FORWARD)
                  and len(functions[c].result_types) == n_out + n_inner), None)
  gradient = next((c for c in called if c.startswith(export_marks.CUSTOM_GRADIENT_BACKWARD)), None)
  if forward is None or gradient is None or len(own) != n_values + n_res:
    return None
  values, res = own[:n_values], own[n_values:]
  diff_in = [j for j, v in enumerate(values) if is_float(v)]

  def backward(r, dys):
    grads = dict(zip(diff_in, ctx.call.call_function(gradient, shared + list(r) + list(dys))))
    return [grads.get(j) for j in range(n_values)]
  return differentiable(lambda v: ctx.call.call_function(forward, shared + list(v)), backward, values, res,
                        n_inner=n_inner)


def _results_kept(outs: list, types) -> list | None:
  """The rule's results the module kept (jit drops unused ones), matched in order by shape and dtype."""
  kept, i = [], 0
  for t in types:
    while i < len(outs) and not (np.ndim(outs[i]) == len(t.shape) and outs[i].dtype == jax_dtype(t)
                                 and all(d is None or d == n for d, n in zip(t.shape, np.shape(outs[i])))):
      i += 1
    if i == len(outs):
      return None
    kept.append(outs[i])
    i += 1
  return kept


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
  """Integer and boolean constants pass as constants (shapes stay static); float constants go through the
  barrier too: hiding a constant from XLA is what a barrier on it is for (`x / barrier(c)` must stay a
  division, not become `x * (1/c)`)."""
  through = [i for i, a in enumerate(args) if not is_const(a) or np.dtype(a.dtype).kind not in "biu"]
  out = list(args)
  if not through:
    return out
  for i, v in zip(through, lax.optimization_barrier(tuple(jnp.asarray(canon(args[i])) for i in through))):
    out[i] = v
  return out


@handler("stablehlo.create_token", "stablehlo.after_all")
def token(ctx, *_):
  return np.zeros((0,), np.bool_)


@handler("sdy.sharding_constraint", "sdy.reshard")
def sharding_constraint(ctx, x):
  return x

