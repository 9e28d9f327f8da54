"""Trip counts of While loops from their structure, without running them.

A loop whose condition is a conjunction of comparisons of integer counters against
constants, each counter stepping by a constant (`i < n` with `i = i + 1`; while_v2's
`loop_counter < maximum_iterations`), has its trip count in closed form: reading it
costs time proportional to the graph, not to the number of iterations.
"""
from __future__ import annotations

import math

import numpy as np

from jaxport.convert.graph import GraphFunction

_PASS = ("Identity", "Snapshot", "StopGradient")
_COMPARE = {"Less": "<", "LessEqual": "<=", "Greater": ">", "GreaterEqual": ">=", "NotEqual": "!="}
_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "!=": "!="}


def _source(fn: GraphFunction, ref):
  """Follows identity-like nodes back from the tensor `ref = (node, index)`."""
  src, idx = ref
  while idx == 0 and src in fn.nodes and fn.nodes[src].op in _PASS:
    src, idx = fn.nodes[src].inputs[0]
  return src, idx


def _operand(fn: GraphFunction, ref, constants: dict[int, np.ndarray]):
  """('var', i) for loop input i, ('const', value) for a constant, else None."""
  src, idx = _source(fn, ref)
  if src in fn.inputs and idx == 0:
    i = fn.inputs.index(src)
    return ("const", constants[i]) if i in constants else ("var", i)
  node = fn.nodes.get(src)
  if node is not None and node.op == "Const":
    return ("const", np.asarray(node.attrs["value"]))
  return None


def _step(body: GraphFunction, i: int) -> int | None:
  """The constant integer step of loop var `i` (`i + c`, `c + i`, `i - c`), or None."""
  src, idx = _source(body, body.outputs[i])
  node = body.nodes.get(src)
  if node is None or idx != 0 or node.op not in ("AddV2", "Add", "Sub") or len(node.inputs) != 2:
    return None
  a, b = (_operand(body, r, {}) for r in node.inputs)
  if a == ("var", i) and b is not None and b[0] == "const":
    step = b[1]
    sign = -1 if node.op == "Sub" else 1
  elif b == ("var", i) and a is not None and a[0] == "const" and node.op != "Sub":
    step, sign = a[1], 1
  else:
    return None
  step = np.asarray(step)
  if step.size != 1 or step.dtype.kind not in "iu":
    return None
  return sign * int(step.reshape(()))


def _count(start: int, step: int, op: str, bound: int) -> int | None:
  """How many k >= 0 in a row satisfy `start + k*step <op> bound` (None: unbounded or irregular)."""
  if op in (">", ">="):
    start, step, bound, op = -start, -step, -bound, "<" if op == ">" else "<="
  if op == "!=":
    if step == 0 or (bound - start) % step or (bound - start) // step < 0:
      return None if start != bound else 0
    return (bound - start) // step
  limit = bound if op == "<" else bound + 1   # x < limit
  if start >= limit:
    return 0
  if step <= 0:
    return None
  return math.ceil((limit - start) / step)


def _conjuncts(cond: GraphFunction, ref) -> list | None:
  """The comparison nodes whose conjunction is the condition, or None."""
  src, idx = _source(cond, ref)
  node = cond.nodes.get(src)
  if node is None or idx != 0:
    return None
  if node.op == "LogicalAnd":
    parts = [_conjuncts(cond, r) for r in node.inputs]
    return None if any(p is None for p in parts) else [c for p in parts for c in p]
  if node.op in _COMPARE:
    return [node]
  return None


def closed_form_trip_count(cond: GraphFunction, body: GraphFunction, loop_vars,
                           passthrough: set[int]) -> int | None:
  """The loop's trip count when it follows from affine integer counters, else None."""
  constants = {i: np.asarray(v) for i, v in enumerate(loop_vars)
               if i in passthrough and isinstance(v, (np.ndarray, np.generic, int))}
  comparisons = _conjuncts(cond, cond.outputs[0])
  if not comparisons:
    return None
  trips = None
  for node in comparisons:
    lhs, rhs = (_operand(cond, r, constants) for r in node.inputs)
    op = _COMPARE[node.op]
    if lhs is None or rhs is None:
      return None
    if lhs[0] == "const" and rhs[0] == "var":
      lhs, rhs, op = rhs, lhs, _FLIP[op]
    if lhs[0] != "var" or rhs[0] != "const":
      return None
    i, bound = lhs[1], np.asarray(rhs[1])
    start = loop_vars[i]
    if not isinstance(start, (np.ndarray, np.generic)) or np.asarray(start).dtype.kind not in "iu" \
        or bound.size != 1 or bound.dtype.kind not in "iu" or np.asarray(start).size != 1:
      return None
    step = _step(body, i)
    if step is None:
      return None
    n = _count(int(np.asarray(start).reshape(())), step, op, int(bound.reshape(())))
    if n is None:
      return None
    trips = n if trips is None else min(trips, n)
  return trips
