"""The one registry of op rules: `@register("OpName", ...)` on a function.

A rule is called as `rule(ctx, *inputs)` where `ctx` is an `OpContext` (node
attributes, name, runtime) and `inputs` are the node's data inputs. It returns a
single value or a tuple/list with one entry per node output.

Everything the engine needs to know about an op is recorded on its `OpRule`:
whether it needs the caller's rng, writes variables, is stateful, and which tier
serves it. Every op list in the code is derived from here (`ops_where`).
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable, Mapping


class Tier(str, enum.Enum):
  """How a TF op is converted, in resolution order."""
  NATIVE = "native"          # a rule in jax.numpy / lax
  STABLEHLO = "stablehlo"    # TF's own XLA lowering (or an XlaCallModule), interpreted into lax
  CALLBACK = "callback"      # TF eager through jax.pure_callback, the last resort
  UNSUPPORTED = "unsupported"


@dataclasses.dataclass(frozen=True)
class OpRule:
  """What the registry knows about one op type."""
  op_type: str
  fn: Callable
  needs_rng: bool = False        # draws from the caller's `rng` (stateful random ops)
  seeded_stream: bool = False    # when TF seeded it, can draw TF's own stream instead (`tf_random_streams`)
  writes_state: bool = False     # assigns variables (threaded through loop carries)
  stateful: bool = False         # has effects beyond its outputs (asserts, prints, state)
  structural: bool = False       # works on graph structure (functions, resources, lists, gradients)
  tier: Tier = Tier.NATIVE
  check: Callable | None = None  # check(node) at conversion time: raises when the node cannot run
  # host_nodes(node) is True for the nodes of this op its native rule hands to the host callback
  # tier (e.g. `AsString` of floats): unsupported where callbacks are off, and listed as callbacks
  host_nodes: Callable | None = None
  convolution: bool = False      # a convolution (picks XLA:CPU options in jaxport.jit)
  # its result has no more elements than the product of its inputs' sizes: elementwise, shape
  # arithmetic, slicing, reductions, products; constant folding bounds its size without running it
  size_bounded: bool = False
  elementwise: bool = False      # entry by entry, inputs broadcast against each other
  # the input holding row indices into axis 0 of a variable or tensor: `scatter_indices` for
  # scatters into variables and sparse optimizer updates (rows with an out-of-range index are
  # dropped), `gather_indices` for gathers whose result's rows follow the indices' (when their
  # axis and batch_dims are 0)
  scatter_indices: int | None = None
  gather_indices: int | None = None

  def __call__(self, ctx, *inputs):
    return self.fn(ctx, *inputs)


_RULES: dict[str, OpRule] = {}


def register(*op_types: str, needs_rng: bool = False, seeded_stream: bool = False, writes_state: bool = False,
             stateful: bool = False, structural: bool = False, tier: Tier = Tier.NATIVE,
             check: Callable | None = None, host_nodes: Callable | None = None,
             convolution: bool = False, size_bounded: bool = False,
             elementwise: bool = False, scatter_indices: int | None = None,
             gather_indices: int | None = None):
  """Registers the decorated `fn(ctx, *inputs)` for each of `op_types` (literal op names).

  `check(node)`, when given, runs at conversion time for every node of these types that
  can run, and raises when the node cannot (e.g. an op inside an embedded module).
  """
  def decorator(fn: Callable) -> Callable:
    for op in op_types:   # check all first: a refused registration registers nothing
      if op in _RULES:
        old = _RULES[op].fn
        raise ValueError(f"op {op!r} already has a rule: {old.__module__}.{old.__qualname__}")
    _WHERE.clear()
    for op in op_types:
      _RULES[op] = OpRule(op, fn, needs_rng=needs_rng, seeded_stream=seeded_stream, writes_state=writes_state,
                          stateful=stateful or writes_state or needs_rng, structural=structural,
                          tier=tier, check=check, host_nodes=host_nodes, convolution=convolution,
                          size_bounded=size_bounded or elementwise, elementwise=elementwise,
                          scatter_indices=scatter_indices, gather_indices=gather_indices)
    return fn
  return decorator


def get_rule(op_type: str) -> OpRule | None:
  _load_rules()
  return _RULES.get(op_type)


def rules() -> Mapping[str, OpRule]:
  """Every registered rule by op type (read-only view)."""
  _load_rules()
  return dict(_RULES)


def ops_where(**properties) -> frozenset[str]:
  """The op types whose rule has all the given properties, e.g. `ops_where(needs_rng=True)`."""
  _load_rules()
  key = tuple(sorted(properties.items()))
  found = _WHERE.get(key)
  if found is None:
    for name in properties:
      if name not in OpRule.__dataclass_fields__ or name in ("op_type", "fn"):
        raise TypeError(f"unknown op property {name!r}")
    found = _WHERE[key] = frozenset(op for op, rule in _RULES.items()
                                    if all(getattr(rule, k) == v for k, v in properties.items()))
  return found


# ops_where's answers (it is asked per node while converting), forgotten when a rule is registered.
_WHERE: dict[tuple, frozenset[str]] = {}


def supported_ops() -> frozenset[str]:
  """Op types with a registered rule (native, or interpreted such as XlaCallModule)."""
  _load_rules()
  return frozenset(_RULES)


_loaded = False


def _load_rules() -> None:
  global _loaded
  if not _loaded:
    _loaded = True
    from jaxport.convert import ops  # noqa: F401  (registers every family)
