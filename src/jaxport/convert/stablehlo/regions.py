"""Elementwise regions of one traced value, differentiated through their forward derivative.

`jax.export` writes some functions (erfc, so exact GELU; erf_inv, lgamma, digamma, softplus,
...) as pieces chosen by `select`. Differentiated in reverse mode op by op, the piece not
taken still sends `0 * inf` back (1/x² at a tiny x, an overflowing exp) and the gradient is
NaN where JAX's own rule for the function is finite. So a *region* (the elementwise ops that
depend on one traced value, the root, and constants, when it holds a `select`) runs as one
`jax.custom_jvp` function of the root: its tangent is `f'(x) * t`, with `f'(x)` from forward
mode on unit tangents, where each select picks its own piece's derivative and the unused
piece's inf never meets a zero. Every op of the region keeps its value; only the derivative
is computed this way. Where JAX itself gives NaN for a `where` whose unused branch is
singular, this gives the finite derivative of the branch taken.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.stablehlo import patterns
from jaxport.convert.stablehlo.elementwise import ELEMENTWISE_OPS, is_const
from jaxport.convert.stablehlo.module import Block, Module, Op, TensorType

_CONSTANT_SOURCES = {"stablehlo.constant", "stablehlo.iota"}
CALLS = ("func.call", "stablehlo.call")
# Ops that keep values constant when their operands are: elementwise ones and these layout ops.
_CONSTANT_PRESERVING = ELEMENTWISE_OPS | {"stablehlo.broadcast_in_dim", "stablehlo.reshape", "stablehlo.transpose"}


@dataclasses.dataclass
class Region:
  root: int                 # the one traced value the region depends on
  ops: list[Op]             # in block order
  constants: list[int]      # operands defined outside the region, other than the root
  outputs: list[int]        # results used after the region (or returned)
  inexact: list[int]        # indices of the floating (differentiable) outputs


def block_regions(block: Block, module: Module | None = None) -> tuple[dict[int, list[Region]], set[int]]:
  """(id(op) -> the regions to run just before it, ids of the ops regions run), cached on the block.
  Calls of `module`'s elementwise functions (jnp.where is one) count as elementwise ops."""
  plan = getattr(block, "_jaxport_regions", None)
  if plan is None:
    patterns.annotate(block)
    plan = _plan(block, _elementwise_functions(module) if module is not None else set())
    block._jaxport_regions = plan
  return plan


def _elementwise_functions(module: Module) -> set[str]:
  """Names of the functions whose ops are all elementwise (or constants, or calls of such functions); cached."""
  found = getattr(module, "_jaxport_elementwise_functions", None)
  if found is None:
    found = module._jaxport_elementwise_functions = _find_elementwise_functions(module)
  return found


def _find_elementwise_functions(module: Module) -> set[str]:
  found: set[str] = set()
  changed = True
  while changed:
    changed = False
    for name, fn in module.functions.items():
      if name in found or name == "main":
        continue
      shapes = {t.shape for t in [*fn.block.arg_types, *fn.result_types]}
      constant: set[int] = set()
      for op in fn.block.ops:
        if _makes_constant(op, constant):
          constant.update(op.results)
        elif not _is_elementwise(op, found):
          break
      else:
        if len(shapes) == 1:
          found.add(name)
          changed = True
  return found


def _makes_constant(op: Op, constant: set[int]) -> bool:
  """Whether `op`'s results are constants, given the values known to be (`constant`)."""
  return op.name in _CONSTANT_SOURCES or (op.name in _CONSTANT_PRESERVING and bool(op.operands)
                                          and all(v in constant for v in op.operands))


def _is_elementwise(op: Op, functions: set[str]) -> bool:
  if op.regions or len(op.results) != 1:
    return False
  return (op.name in ELEMENTWISE_OPS or (op.name in CALLS and op.attrs.get("callee") in functions)
          or (op.name == "stablehlo.composite" and op.attrs.get("name") in ELEMENTWISE_OPS))


def _plan(block: Block, functions: set[str]) -> tuple[dict[int, list[Region]], set[int]]:
  types: dict[int, TensorType] = dict(zip(block.args, block.arg_types))
  defined_at: dict[int, int] = {}
  constant: set[int] = set()
  root_of: dict[int, int] = {}      # region value -> its root
  members: dict[int, list[tuple[int, Op]]] = {}
  for position, op in enumerate(block.ops):
    types.update(zip(op.results, op.result_types))
    defined_at.update((v, position) for v in op.results)
    if _makes_constant(op, constant):
      constant.update(op.results)
      continue
    if not _is_elementwise(op, functions):
      continue
    roots = {root_of.get(v, v) for v in op.operands if v not in constant}
    shape = op.result_types[0].shape
    if len(roots) != 1 or any(types.get(v) is None or types[v].shape != shape
                              for v in op.operands if v not in constant):
      continue
    root = roots.pop()
    if types.get(root) is None or types[root].shape != shape:
      continue
    root_of[op.results[0]] = root
    members.setdefault(root, []).append((position, op))

  readers = _readers(block)
  before: dict[int, list[Region]] = {}
  skipped: set[int] = set()
  for root, ops in members.items():
    if not _worth_wrapping(root, ops, types, constant):
      continue
    inside = {v for _, op in ops for v in op.results}
    positions = {position for position, _ in ops}
    consts = sorted({v for _, op in ops for v in op.operands if v in constant and v not in inside})
    start = max([ops[0][0]] + [defined_at.get(v, -1) + 1 for v in consts])   # every constant is defined
    reads_outside = {v: [p for p in readers.get(v, ()) if p not in positions] for v in inside}
    if any(p < start for reads in reads_outside.values() for p in reads):
      continue   # an op before `start` reads a region value: leave the ops as they are
    outputs = sorted(v for v, reads in reads_outside.items() if reads)
    skipped.update(id(op) for _, op in ops)
    inexact = [i for i, v in enumerate(outputs) if jnp.issubdtype(types[v].dtype, jnp.inexact)]
    before.setdefault(id(block.ops[start]), []).append(Region(root, [op for _, op in ops], consts, outputs, inexact))
  return before, skipped


def _worth_wrapping(root: int, ops: list[tuple[int, Op]], types, constant) -> bool:
  """A select between traced pieces, on a floating root."""
  dtype = types[root].dtype
  if isinstance(dtype, str) or not jnp.issubdtype(dtype, jnp.floating):
    return False
  return any(op.name in ("stablehlo.select", *CALLS) and any(v not in constant for v in op.operands[1:])
             for _, op in ops)


def _readers(block: Block) -> dict[int, list[int]]:
  """value -> positions of the ops of `block` that read it (inside their regions too); len(ops): returned."""
  readers: dict[int, list[int]] = {}
  for position, op in enumerate(block.ops):
    for v in set(op.operands) | {v for region in op.regions for v in _all_reads(region)}:
      readers.setdefault(v, []).append(position)
  for v in block.returns:
    readers.setdefault(v, []).append(len(block.ops))
  return readers


def _all_reads(block: Block) -> set[int]:
  values: set[int] = set(block.returns)
  for op in block.ops:
    values.update(op.operands)
    for region in op.regions:
      values.update(_all_reads(region))
  return values


def run_region(region: Region, env, run_op) -> None:
  """Runs the region's ops into `env`; through one custom_jvp when the root is traced. Constants the
  region reads that are not NumPy values (a large splat broadcast is staged as an op) are passed as
  arguments with no tangent: closing over them would hide them from the transforms."""
  x = env[region.root]
  if is_const(x):
    for op in region.ops:
      run_op(op, env)
    return
  staged = [v for v in region.constants if not is_const(env[v])]

  def values(root, *staged_values):
    inner = type(env)(env)
    inner.values[region.root] = root
    inner.values.update(zip(staged, staged_values))
    for op in region.ops:
      run_op(op, inner)
    return tuple(jnp.asarray(inner[v]) for v in region.outputs)

  wrapped = _with_forward_derivative(values, len(region.outputs), region.inexact)
  env.values.update(zip(region.outputs, wrapped(x, *(env[v] for v in staged))))


def _with_forward_derivative(fn, n: int, inexact: list[int]):
  """`fn` (a root and constants -> the region's outputs, elementwise in the root) as a custom_jvp whose
  tangent is `fn'(x) * t`, `fn'` from forward mode on unit tangents; the constants' tangents are zero by
  construction. The derivative is itself wrapped so, so higher orders stay finite too."""
  def values_and_derivatives(x, *consts):
    outs, derivatives = jax.jvp(lambda root: fn(root, *consts), (x,), (jnp.ones_like(x),))
    return tuple(outs) + tuple(derivatives[i] for i in inexact)

  wrapped = jax.custom_jvp(fn)

  @wrapped.defjvp
  def rule(primals, tangents):
    (x, *consts), t = primals, tangents[0]
    both = _with_forward_derivative(values_and_derivatives, n + len(inexact),
                                    inexact + list(range(n, n + len(inexact))))(x, *consts)
    outs, derivatives = both[:n], dict(zip(inexact, both[n:]))
    return outs, tuple(_scaled(derivatives[i], t.astype(outs[i].dtype)) if i in derivatives
                       else np.zeros(np.shape(outs[i]), jax.dtypes.float0) for i in range(n))

  return wrapped


def _scaled(derivative, t):
  """`derivative * t`, exactly 0 where the derivative is: a select that took a constant blocks the tangent
  (and in reverse mode the cotangent) as JAX's select does, even an inf or NaN one (0 * inf would be NaN)."""
  return jnp.where(derivative == 0, jnp.zeros_like(derivative), derivative * t)
