"""While-loop helpers: dead loop variables, and loops that cannot be one lax loop.

Dead loop variables: once a tf.function holding a `tf.while_loop` has been differentiated,
TF's while_v2 rewrites the forward While in place to carry TensorList accumulators (an
EmptyTensorList in, a TensorListPushBack per step) for the gradient. The list grows each
step, so no fixed-shape lax carry holds it; the converted function never reads it. Loop
variables that neither the used outputs nor the condition depend on (through the body) are
dropped from the loop, and the body runs only the nodes its live outputs need.

Python loops: a loop whose variables change shape between iterations, or whose body needs a
loop variable as a trace-time constant (`x[:, : i + 1]`), runs step by step in Python when its
trip count is static (unrolled under jit) or its condition is concrete (an eager call).
"""
from __future__ import annotations

from jaxport.convert.graph import GraphFunction, dependency_order
from jaxport.convert.interpreter import _NEEDS_VALUES
from jaxport.convert.ops._util import known_value
from jaxport.errors import DynamicLoopError, JaxportError, UnwrittenListError


def used_outputs(fn: GraphFunction | None, node: str) -> set[int] | None:
  """The output indices of `node` that `fn` reads (None: unknown, assume all)."""
  if fn is None:
    return None
  memo = fn.memo.get("used_outputs")
  if memo is None:
    memo = {}
    for name, _ in fn.schedule()[0]:
      for src, idx in fn.nodes[name].inputs:
        memo.setdefault(src, set()).add(idx)
    for src, idx in fn.outputs:
      memo.setdefault(src, set()).add(idx)
    fn.memo["used_outputs"] = memo
  return memo.get(node, set())


def pruned(fn: GraphFunction, keep: list[int]) -> GraphFunction:
  """`fn` computing only the outputs `keep` (and its control outputs: its effects still run)."""
  memo = fn.memo.setdefault("pruned", {})
  key = tuple(keep)
  if key not in memo:
    memo[key] = GraphFunction(f"{fn.name}{list(keep)}", fn.nodes, fn.inputs,
                              [fn.outputs[i] for i in keep], list(fn.control_outputs))
  return memo[key]


def _reaching_inputs(fn: GraphFunction, refs, controls=()) -> set[int]:
  """The inputs of `fn` that the tensors `refs` (and nodes `controls`) depend on."""
  roots = [src for src, _ in refs] + list(controls)
  reached = set(dependency_order(
      roots, lambda n: [src for src, _ in fn.nodes[n].inputs] + fn.nodes[n].control_inputs))
  return {i for i, name in enumerate(fn.inputs) if name in reached}


def live_loop_vars(library, cond_fn: GraphFunction, body_fn: GraphFunction, used: set[int] | None,
                   n: int) -> set[int]:
  """The loop variables that the used outputs, the condition or the body's effects depend on."""
  if used is None or len(used) >= n:
    return set(range(n))
  key = (cond_fn.name, body_fn.name, frozenset(used))
  memo = library.memo.setdefault("live_loop_vars", {})
  if key not in memo:
    live = set(used) | _reaching_inputs(cond_fn, cond_fn.outputs, cond_fn.control_outputs)
    live |= _reaching_inputs(body_fn, [], body_fn.control_outputs)
    while True:
      more = live | _reaching_inputs(body_fn, [body_fn.outputs[i] for i in sorted(live)])
      if more == live:
        break
      live = more
    memo[key] = live
  return memo[key]


def needs_python_loop(error: BaseException) -> bool:
  """Whether a lax loop failed for its shapes: carries that change shape (a TypeError from lax), or
  a shape that needs a loop variable's value (a rule's ValueError, or a tracer used as a constant), or
  a list the body reads that only an earlier loop's steps would have written."""
  if isinstance(error, (*_NEEDS_VALUES, UnwrittenListError)):
    return True
  return isinstance(error, (TypeError, ValueError)) and not isinstance(error, JaxportError)


def python_loop(node: str, cond, body, args, trips: int | None, cause: BaseException):
  """Runs the loop step by step: `trips` times when static, else while `cond(args, i)` is concrete
  and true. `body(args, i)` returns the next args; `cause` is why the lax loop failed."""
  i = 0
  while True:
    if trips is not None:
      if i >= trips:
        return args
    else:
      pred = known_value(cond(args, i))
      if pred is None:
        raise DynamicLoopError(node, cause) from cause
      if not bool(pred.reshape(())):
        return args
    args = body(args, i)
    i += 1
