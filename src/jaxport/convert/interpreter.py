"""Runs a decoded graph with JAX, one op rule per node."""
from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import jax

from jaxport.convert.graph import GraphFunction, Library, Node
from jaxport.convert.tiers import node_rule
from jaxport.errors import MissingInputError


@dataclasses.dataclass(frozen=True)
class VariableRef:
  """What a resource handle evaluates to: the key of a variable in `params`."""
  key: str


class Runtime:
  """Per-call state shared by every node: variables, rng, library, config."""

  def __init__(self, library: Library, config: dict[str, Any], state: dict[str, Any], rng=None,
               custom_gradients=None):
    self.library = library
    self.config = config
    self.state = state          # variable key -> current value; assigns update it
    self.rng = rng                # split per loop iteration by control flow
    self.custom_gradients = custom_gradients or {}   # id(IdentityN node) -> CustomGradient
    self.softmax_logits: dict[int, tuple] = {}   # id(Softmax result) -> (result, logits, keep); ops/softmax_product

  def read_variable(self, ref: VariableRef):
    try:
      return self.state[ref.key]
    except KeyError:
      raise MissingInputError(f"parameter {ref.key!r} is missing from params") from None

  def assign_variable(self, ref: VariableRef, value) -> None:
    self.read_variable(ref)
    self.state[ref.key] = value

  def fork(self, *, state=None, rng=...):
    """A runtime for a nested trace (a loop body or cond branch)."""
    child = Runtime(self.library, self.config, self.state if state is None else state,
                    self.rng if rng is ... else rng, self.custom_gradients)
    return child

  def call(self, fn_name: str, args) -> list:
    """Interprets a library function inline (trace-time inlining)."""
    return run_function(self.library[fn_name], list(args), self)

  def rng_for(self, node_name: str):
    """A key for one stateful random node, distinct per node name (and per loop iteration)."""
    self._require_rng(node_name)
    return jax.random.fold_in(self.rng, zlib.crc32(node_name.encode()) & 0x7FFFFFFF)

  def _require_rng(self, node_name: str) -> None:
    if self.rng is None:
      raise MissingInputError(
          f"random op {node_name!r} needs a PRNG key: call the converted function with rng=jax.random.key(...)")


class OpContext:
  """What a rule sees of its node."""
  __slots__ = ("node", "runtime")

  def __init__(self, node: Node, runtime: Runtime):
    self.node = node
    self.runtime = runtime

  @property
  def name(self) -> str:
    return self.node.name

  @property
  def op(self) -> str:
    return self.node.op

  @property
  def config(self):
    return self.runtime.config

  def attr(self, key: str, default: Any = ...):
    value = self.node.attrs.get(key, default)
    if value is ...:
      raise KeyError(f"{self.op} node {self.name!r} has no attribute {key!r}")
    if isinstance(value, Exception):
      raise value
    return value


def run_function(fn: GraphFunction, args: list, runtime: Runtime) -> list:
  if len(args) != len(fn.inputs):
    raise ValueError(f"function {fn.name!r} takes {len(fn.inputs)} inputs, got {len(args)}")
  env: dict[str, tuple] = {name: (value,) for name, value in zip(fn.inputs, args)}
  schedule, _ = fn.schedule()
  for name, frees in schedule:
    if name in env:   # an argument placeholder
      continue
    node = fn.nodes[name]
    inputs = [env[src][idx] for src, idx in node.inputs]
    if node.op in runtime.library:   # a node whose op is a library function
      rule = _call_library_op
    else:
      rule = node_rule(node.op, runtime.config)
    if rule is None:
      from jaxport.errors import UnsupportedOperationsError
      raise UnsupportedOperationsError({node.op: [node.name]})
    try:
      out = rule(OpContext(node, runtime), *inputs)
    except Exception as e:
      if not getattr(e, "_jaxport_noted", False):
        e.add_note(f"while converting {node.op} node {node.name!r} in {fn.name!r}")
        e._jaxport_noted = True
      raise
    env[name] = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    for src in frees:
      env.pop(src, None)
  return [env[src][idx] for src, idx in fn.outputs]


def _call_library_op(ctx: OpContext, *args):
  return ctx.runtime.call(ctx.op, args)

