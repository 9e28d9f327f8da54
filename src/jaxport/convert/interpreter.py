"""Runs a decoded graph with JAX, one op rule per node."""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any

import jax
import numpy as np

from jaxport import config as _config
from jaxport.convert import padded_rows, segments
from jaxport.convert.graph import GraphFunction, Library, Node
from jaxport.convert.registry import OpRule, Tier, get_rule
from jaxport.convert.tables import TableRef
from jaxport.convert.tiers import node_rule
from jaxport.errors import DynamicShapeError, MissingInputError


@dataclasses.dataclass(frozen=True)
class VariableRef:
  """What a resource handle evaluates to: the key of a variable in `params`."""
  key: str


def is_handle(value) -> bool:
  """A resource handle (a variable's or a lookup table's): passed by reference, never carried."""
  return isinstance(value, (VariableRef, TableRef))


class Runtime:
  """Per-call state shared by every node: variables, rng, library, config."""

  def __init__(self, library: Library, config: dict[str, Any], state: dict[str, Any], rng=None,
               custom_gradients=None, segmented: bool = False):
    self.library = library
    self.config = config
    self.state = state          # variable key -> current value; assigns update it
    self.rng = rng                # split per loop iteration by control flow
    self.custom_gradients = custom_gradients or {}   # id(IdentityN node) -> CustomGradient
    self.segmented = segmented   # an eager call: traceable runs of nodes as one jit each (segments.py)
    self.softmax_logits: dict[int, tuple] = {}   # id(Softmax result) -> (result, logits, keep); ops/softmax_product
    self.deferred: dict[int, tuple] = {}   # id(constant staged for its size) -> (value, thunk of its NumPy value)
    self.offsets: dict[int, tuple] = {}    # id(traced x + constant c) -> (result, x, c); ops/array's Range
    self.elements: dict[int, tuple] = {}   # id(traced Pack of scalars) -> (result, scalars); StridedSlice
    self.padded: dict[int, padded_rows.Padded] = {}   # id(value) -> how Unique padded it under jit
    self.bounds: dict[int, tuple] = {}     # id(traced int scalar) -> (value, low, high); ops/math's clamps

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
                    self.rng if rng is ... else rng, self.custom_gradients, self.segmented)
    child.deferred = self.deferred
    child.offsets = self.offsets
    child.elements = self.elements
    child.padded = self.padded
    child.bounds = self.bounds
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
  __slots__ = ("node", "runtime", "fn")

  def __init__(self, node: Node, runtime: Runtime, fn: GraphFunction | None = None):
    self.node = node
    self.runtime = runtime
    self.fn = fn   # the function the node runs in (control flow reads which outputs it uses)

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
  if runtime.segmented and not has_tracers(args, list(runtime.state.values()), runtime.rng):
    segments.run(fn, env, runtime, run_node)
  else:
    schedule, _ = fn.schedule()
    for name, frees in schedule:
      if name not in env:   # else an argument placeholder
        run_node(fn, fn.nodes[name], env, runtime)
      for src in frees:
        env.pop(src, None)
  outputs = [env[src][idx] for src, idx in fn.outputs]
  if runtime.padded:
    padded_rows.check_outputs(runtime, fn.name, outputs)
  return outputs


def run_node(fn: GraphFunction, node: Node, env: dict, runtime: Runtime) -> None:
  """Runs one node on its inputs in `env`, and puts its outputs there."""
  inputs = [env[src][idx] for src, idx in node.inputs]
  if node.op in runtime.library:   # a node whose op is a library function
    rule = _call_library_op
  else:
    rule = node_rule(node.op, runtime.config)
  if rule is None:
    from jaxport.errors import UnsupportedOperationsError
    raise UnsupportedOperationsError({node.op: [node.name]})
  try:
    padding = padded_rows.use(runtime, node, inputs) if runtime.padded else None
    out = _run_node(rule, OpContext(node, runtime, fn), inputs)
    if padding:
      padded_rows.mark_outputs(runtime, node, inputs, out, padding)
  except Exception as e:
    if not getattr(e, "_jaxport_noted", False):
      e.add_note(f"while converting {node.op} node {node.name!r} in {fn.name!r}")
      e._jaxport_noted = True
    raise
  if node.op in ("AddV2", "Add"):
    _note_offset(runtime, inputs, out)
  elif node.op == "Pack":
    _note_elements(runtime, inputs, out)
  env[node.name] = tuple(out) if isinstance(out, (tuple, list)) else (out,)


def has_tracers(*values) -> bool:
  """Whether any leaf of `values` is a JAX tracer (the call is inside jit, grad, vmap, ...)."""
  return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(values))


def _note_offset(runtime: Runtime, inputs: list, out) -> None:
  """Remembers `out = x + c` for a traced scalar x and a constant scalar c: `tf.range(x, x + c)` has the
  static length c, which Range reads back (a positional encoding starting at a frame count)."""
  if len(inputs) != 2 or not isinstance(out, jax.Array) or np.ndim(out) != 0:
    return
  for x, c in (inputs, inputs[::-1]):
    if isinstance(x, jax.Array) and isinstance(c, (np.ndarray, np.generic)) and np.ndim(c) == 0:
      runtime.offsets[id(out)] = (out, x, c)


def _note_elements(runtime: Runtime, inputs: list, out) -> None:
  """Remembers the scalars a traced vector was packed from: a StridedSlice whose end is its traced begin
  plus a constant (`x[i : i + k]`, a random crop) reads the static size k back."""
  if isinstance(out, jax.core.Tracer) and np.ndim(out) == 1 and all(np.ndim(x) == 0 for x in inputs):
    runtime.elements[id(out)] = (out, tuple(inputs))


def _call_library_op(ctx: OpContext, *args):
  return ctx.runtime.call(ctx.op, args)


# --------------------------------------------------------------------------- bounded constant folding
# A native rule whose inputs are all trace-time constants computes in NumPy, and its result becomes a
# constant of the traced function. Results over the `max_constant_bytes` config key are staged instead:
# the rule runs on the same values as concrete jax Arrays, so `static_value` still reads shapes and
# axes while the data ops (iota, broadcast, compare, select) stay in the jaxpr for XLA to fuse.

# Ops whose result has at most as many elements as the product of their inputs' sizes (the registry's
# `size_bounded`: elementwise math, shape arithmetic, slicing, products): small constant inputs bound
# the result without tracing the rule. So do the scalar inputs of any op, by their magnitudes (Range,
# OneHot, LinSpace); every other node of constants is traced abstractly first.
_BYTES_PER_ELEMENT = 8   # the bounds' itemsize (complex128 results are caught after folding)


def _is_constant(x) -> bool:
  return isinstance(x, (np.ndarray, np.generic, int, float, bool))


def _foldable(rule, op: str) -> OpRule | None:
  """The op's `OpRule` if a native rule without effects or graph structure (the rules constant
  folding applies to), else None."""
  spec = get_rule(op)
  if (spec is not None and spec.fn is rule and spec.tier == Tier.NATIVE
      and not (spec.stateful or spec.structural)):
    return spec
  return None


def _run_node(rule, ctx: OpContext, inputs: list):
  deferred = ctx.runtime.deferred
  if not inputs or not all(_is_constant(x) or id(x) in deferred for x in inputs):
    return rule(ctx, *inputs)
  spec = _foldable(rule, ctx.op)
  if spec is None:
    return rule(ctx, *inputs)
  if any(not _is_constant(x) for x in inputs):
    return _run_deferred(rule, ctx, inputs, deferred)
  limit = ctx.config.get("max_constant_bytes")
  limit = _config.get_config("max_constant_bytes") if limit is None else limit
  lifted, bound = None, _bound(spec, inputs)
  if (bound is None or bound > limit) and _abstract_bytes(rule, ctx, inputs) > limit:
    lifted = _lift(inputs)
    if lifted is not None:
      return _defer(rule(ctx, *lifted), lambda: rule(ctx, *inputs), deferred)
  out = rule(ctx, *inputs)
  if _largest(out, numpy_only=True) > limit:   # the bound missed (the rule could not be traced)
    lifted = lifted if lifted is not None else _lift(inputs)
    if lifted is not None:
      try:
        return _defer(rule(ctx, *lifted), lambda: rule(ctx, *inputs), deferred)
      except Exception:  # noqa: BLE001 -- the rule needs NumPy here: keep the folded constant
        pass
  return out


# What a rule raises when it needs the values of a traced input.
_NEEDS_VALUES = (DynamicShapeError, jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                 jax.errors.TracerIntegerConversionError, jax.errors.TracerBoolConversionError)


def _run_deferred(rule, ctx: OpContext, inputs: list, deferred: dict):
  """A node of constants, some of them staged for their size: staged too, unless a shape needs them."""
  def folded():
    return rule(ctx, *[deferred[id(x)][1]() if id(x) in deferred else x for x in inputs])
  try:
    out = rule(ctx, *inputs)
  except _NEEDS_VALUES:   # a shape depends on the values: fold them after all (as without the limit)
    return folded()
  return _defer(out, folded, deferred)


def _defer(out, thunk, deferred: dict):
  """Records `out`'s arrays as constants staged for their size, with the thunk folding them to NumPy."""
  several = isinstance(out, (tuple, list))
  folded = []   # the thunk's result, computed once and only if a shape needs it

  def value(i: int):
    if not folded:
      folded.append(thunk())
    return np.asarray(folded[0][i] if several else folded[0])
  for i, leaf in enumerate(out if several else [out]):
    if isinstance(leaf, jax.Array):
      deferred[id(leaf)] = (leaf, functools.partial(value, i))
  return out


def _bound(spec: OpRule, inputs) -> int | None:
  """An upper bound on the bytes of the node's result (roughly: scalars' magnitudes); None if unknown."""
  if spec.size_bounded:
    factors = [np.size(x) for x in inputs]
  elif all(np.size(x) == 1 for x in inputs):
    factors = [_magnitude(x) for x in inputs]
  else:
    return None
  bound = _BYTES_PER_ELEMENT
  for f in factors:
    bound *= max(1, f)
  return bound


def _magnitude(x) -> float:
  """|x| for a count or limit, 1/|x| for a step (Range's delta); 1 for anything else."""
  x = np.asarray(x).reshape(())
  if x.dtype.kind in "iu":
    return abs(int(x))
  if x.dtype.kind == "f" and np.isfinite(x) and x != 0:
    return max(abs(float(x)), 1 / abs(float(x)))
  return 1 if x.dtype.kind in "bf" else np.inf


def _lift(inputs) -> list | None:
  """The constants as concrete jax Arrays (outside any trace); None when one has no jax dtype."""
  if any(np.asarray(x).dtype.kind in "OSUV" for x in inputs):
    return None
  with jax.ensure_compile_time_eval():   # a transfer, not an op: no tracer even inside jit
    return [jax.device_put(x) for x in inputs]


def _abstract_bytes(rule, ctx: OpContext, inputs: list) -> int:
  """The bytes of the largest result of the rule on constant `inputs`, traced abstractly (0 when it
  cannot be). Remembered per node, inputs' shapes and dtypes and small inputs' values, so an eager
  call does not trace it again (~2 ms each): the estimate only chooses between folding and staging,
  and `_run_node` checks a folded result's size again."""
  memo = ctx.fn.memo.setdefault("abstract_bytes", {}) if ctx.fn is not None else {}
  key = (ctx.name, tuple(_signature(x) for x in inputs))
  if key not in memo:
    lifted = _lift(inputs)
    memo[key] = 0 if lifted is None else _largest(_abstract(rule, ctx, lifted))
  return memo[key]


def _signature(x) -> tuple:
  x = np.asarray(x)
  return x.shape, x.dtype.str, x.tobytes() if x.size <= 16 and x.dtype.kind not in "OV" else None


def _abstract(rule, ctx: OpContext, lifted: list):
  """The shapes and dtypes of the rule's results, traced without computing; None if it cannot be."""
  try:
    return jax.eval_shape(lambda: rule(ctx, *lifted))
  except Exception:  # noqa: BLE001 -- the rule raises or returns non-arrays: decide after folding
    return None


def _largest(out, numpy_only: bool = False) -> int:
  """The bytes of the largest array in `out` (a result or its eval_shape)."""
  leaves = out if isinstance(out, (tuple, list)) else [out]
  sizes = [0]
  for leaf in leaves:
    if numpy_only and not isinstance(leaf, np.ndarray):
      continue
    shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
    if shape is not None and dtype is not None and not isinstance(dtype, str):
      try:
        sizes.append(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
      except TypeError:   # an extended dtype (PRNG keys)
        continue
  return max(sizes)
