"""Eager calls of graphs that cannot run as one jit: each run of nodes that traces compiles as one jit.

A graph whose shapes depend on values (a `Where`, a `Unique`, a sparse reshape) cannot be traced as a
whole; op by op, each node costs ~70 µs of dispatch. Here the interpreter runs a function as
alternating segments: a jitted run of the nodes that trace, then the node that needs its inputs'
values, op by op, then the next run. The plan is found on the first calls and kept per function: a
run is traced from its start until a node raises (that node goes op by op, the next run starts after
it), and a run that a later call's inputs break is split there.

Each run compiles once per signature of what flows into it: dynamic arrays by shape and dtype,
constants (NumPy scalars and short vectors, handles, Python numbers) by value. Sizes that change call
by call (the ids in a batch, a decoder's growing cache) make new signatures. A run compiles its first
signature at once; a new one runs op by op until the time spent running it op by op reaches the time
the run's last compile took (ski rental: never more than twice the better choice's cost, had the
future been known), so a size seen once is never compiled and one seen often is. Op by op, new sizes
compile each op's kernel too: where running a new signature op by op has cost more than compiling
it (on average), new signatures compile at once.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import numpy as np

MOST_VARIANTS = 64          # signatures a run compiles at most
_MOST_SEEN = 4096           # signatures run op by op that a run remembers
# NumPy scalars and vectors up to this size (shapes, axes, counts) are constants of a run's trace, which
# rules read; larger ones (indices found op by op) are its arguments, so that new indices reuse the jit.
_STATIC_SIZE = 16


class _OpByOp(Exception):
  """This call runs the run's nodes op by op (a new signature, not yet worth compiling)."""

  def __init__(self, seg: "_Run", signature: tuple):
    super().__init__()
    self.seg, self.signature = seg, signature


class _Break(Exception):
  """A node of a traced run needs its inputs' values (or holds what cannot leave a trace)."""

  def __init__(self, index: int):
    super().__init__(index)
    self.index = index


@dataclasses.dataclass
class _Run:
  """What flows into and out of the nodes [start, end) of a schedule."""
  start: int
  end: int
  inputs: tuple[str, ...]     # values made before the run that its nodes read
  outputs: tuple[str, ...]    # values made in the run that later nodes (or the function's outputs) read
  freed: tuple[str, ...]      # values made before the run whose last reader is in it
  made_at: dict[str, int]     # value name -> the index of the node that makes it
  compiled: dict = dataclasses.field(default_factory=dict)   # signature -> _Compiled
  op_by_op: dict = dataclasses.field(default_factory=dict)   # signature -> seconds spent running it op by op
  compile_s: float | None = None   # the last compile's seconds (trace, compile, first run)
  first_op_s: float | None = None  # seconds a new signature's first op-by-op run takes (running mean)


@dataclasses.dataclass
class _Plan:
  ends: dict[int, int] = dataclasses.field(default_factory=dict)   # start -> end; end == start: op by op
  runs: dict[tuple[int, int], _Run] = dataclasses.field(default_factory=dict)


def run(fn, env: dict, runtime, step: Callable) -> None:
  """Runs `fn`'s schedule into `env` (its arguments already there), in jitted runs where they trace.
  `step(fn, node, env, runtime)` runs one node op by op."""
  schedule, _ = fn.schedule()
  plan = fn.memo.setdefault(("segments", id(runtime.config)), _Plan())
  i, n = 0, len(schedule)
  while i < n:
    end = plan.ends.get(i, n)
    if end == i:
      name, frees = schedule[i]
      if name not in env:
        step(fn, fn.nodes[name], env, runtime)
      for src in frees:
        env.pop(src, None)
      i += 1
      continue
    try:
      _run_segment(fn, plan, _segment(fn, plan, i, end), env, runtime, step)
      i = end
    except _OpByOp as slow:
      began = time.perf_counter()
      for name, frees in schedule[i:end]:
        if name not in env:
          step(fn, fn.nodes[name], env, runtime)
        for src in frees:
          env.pop(src, None)
      _spent(slow.seg, slow.signature, time.perf_counter() - began)
      i = end
    except _Break as brk:
      k = brk.index
      if k > i:
        plan.ends[i] = k
      plan.ends[k] = k
      if k + 1 < end:
        plan.ends.setdefault(k + 1, end)


def _spent(seg: _Run, signature: tuple, seconds: float) -> None:
  spent = seg.op_by_op
  if signature not in spent:
    seg.first_op_s = seconds if seg.first_op_s is None else 0.75 * seg.first_op_s + 0.25 * seconds
  if len(spent) >= _MOST_SEEN:
    spent.clear()
  spent[signature] = spent.get(signature, 0.0) + seconds


def _worth_compiling(seg: _Run, signature: tuple) -> bool:
  if len(seg.compiled) >= MOST_VARIANTS:
    return False
  if seg.compile_s is None:
    return True
  if signature in seg.op_by_op:
    return seg.op_by_op[signature] >= seg.compile_s
  return seg.first_op_s is not None and seg.first_op_s >= seg.compile_s


def _segment(fn, plan: _Plan, start: int, end: int) -> _Run:
  key = (start, end)
  if key not in plan.runs:
    schedule, _ = fn.schedule()
    arguments = set(fn.inputs)
    names = [name for name, _ in schedule[start:end] if name not in arguments]
    made = set(names)
    inputs: dict[str, None] = {}
    for name in names:
      for src, _ in fn.nodes[name].inputs:
        if src not in made:
          inputs[src] = None
    later = {src for name, _ in schedule[end:] for src, _ in fn.nodes[name].inputs}
    later |= {src for src, _ in fn.outputs}
    freed = tuple(src for _, frees in schedule[start:end] for src in frees if src not in made)
    plan.runs[key] = _Run(start, end, tuple(inputs), tuple(name for name in names if name in later), freed,
                          {name: start + j for j, (name, _) in enumerate(schedule[start:end])})
  return plan.runs[key]


def _run_segment(fn, plan: _Plan, seg: _Run, env: dict, runtime, step) -> None:
  leaves, treedef = jax.tree.flatten([env[name] for name in seg.inputs])
  dynamic, signature = [], [treedef]
  for leaf in leaves:
    kind = _classify(leaf)
    signature.append(kind)
    if kind[0] == "dynamic":
      dynamic.append(leaf)
  state_keys = tuple(runtime.state)
  state = [runtime.state[k] for k in state_keys]
  signature += [state_keys, tuple(_aval(v) for v in state), None if runtime.rng is None else _aval(runtime.rng)]
  signature = tuple(signature)
  compiled = seg.compiled.get(signature)
  began = None
  if compiled is None:
    if not _worth_compiling(seg, signature):
      raise _OpByOp(seg, signature)
    began = time.perf_counter()
    compiled = seg.compiled[signature] = _Compiled(fn, seg, leaves, treedef, state_keys, runtime, step)
  try:
    outputs, changed = compiled(dynamic, state, runtime.rng)
    if began is not None:
      seg.compile_s = time.perf_counter() - began
      seg.op_by_op.pop(signature, None)
  except _Break:
    seg.compiled.pop(signature, None)
    raise
  except Exception as e:   # pylint: disable=broad-except -- a run-time error compiled into the run (a branch
    seg.compiled.pop(signature, None)   # with a value-dependent size): op by op runs it, or raises it
    for j in range(seg.start, seg.end):
      plan.ends[j] = j
    raise _Break(seg.start) from e
  for src in seg.freed:
    env.pop(src, None)
  env.update(zip(seg.outputs, outputs))
  runtime.state.update(changed)


class _Compiled:
  """One run jitted for one signature; the constants among its results are kept from the trace."""

  def __init__(self, fn, seg: _Run, leaves: list, treedef, state_keys: tuple, runtime, step):
    self._static = [None if _classify(leaf)[0] == "dynamic" else leaf for leaf in leaves]  # kept alive: ids key them
    self._out_tree = self._out_static = self._changed_keys = None
    library, config, custom_gradients = runtime.library, runtime.config, runtime.custom_gradients

    def body(dynamic, state, rng):
      from jaxport.convert.interpreter import Runtime
      it = iter(dynamic)
      values = jax.tree.unflatten(treedef, [next(it) if s is None else s for s in self._static])
      local = dict(zip(seg.inputs, values))
      state_in = dict(zip(state_keys, state))
      child = Runtime(library, config, dict(state_in), rng, custom_gradients)
      schedule, _ = fn.schedule()
      arguments = set(fn.inputs)
      for j in range(seg.start, seg.end):
        name, frees = schedule[j]
        if name in arguments:   # in `local` if the run reads it
          continue
        padded = len(child.padded)
        try:
          step(fn, fn.nodes[name], local, child)
        except Exception as e:   # pylint: disable=broad-except -- op by op runs it, and raises what it raises
          raise _Break(j) from e
        if len(child.padded) != padded:   # rows padded under jit: their true count is lost at the run's end
          raise _Break(j)
        for src in frees:
          local.pop(src, None)
      out_leaves, self._out_tree = jax.tree.flatten([local[name] for name in seg.outputs])
      self._out_static, traced = [], []
      for leaf in out_leaves:
        if isinstance(leaf, jax.core.Tracer):
          self._out_static.append(None)
          traced.append(leaf)
        elif _constant(leaf):
          self._out_static.append(leaf)
        else:   # an object that may hold tracers (a HostTensor, a TensorList): its maker runs op by op
          raise _Break(seg.made_at[_maker(seg, local, leaf)])
      changed = {k: v for k, v in child.state.items() if v is not state_in.get(k)}
      self._changed_keys = tuple(changed)
      return traced, list(changed.values())

    self._jitted = jax.jit(body)

  def __call__(self, dynamic: list, state: list, rng):
    traced, changed = self._jitted(dynamic, state, rng)
    it = iter(traced)
    leaves = [next(it) if s is None else s for s in self._out_static]
    return jax.tree.unflatten(self._out_tree, leaves), dict(zip(self._changed_keys, changed))


def _maker(seg: _Run, local: dict, leaf) -> str:
  for name in seg.outputs:
    if any(x is leaf for x in jax.tree.leaves(local[name])):
      return name
  return seg.outputs[0]


def _constant(leaf) -> bool:
  """A value that is the same whatever a run's dynamic inputs: kept from its trace."""
  from jaxport.convert.interpreter import VariableRef
  from jaxport.convert.tables import TableRef
  return (leaf is None or isinstance(leaf, (np.ndarray, np.generic, int, float, complex, str, bytes,
                                            VariableRef, TableRef))
          or (isinstance(leaf, jax.Array) and not isinstance(leaf, jax.core.Tracer)))


def _aval(x) -> tuple:
  return (np.shape(x), x.dtype, getattr(x, "weak_type", False))   # the dtype object: str() costs ~3 µs


def _classify(leaf) -> tuple:
  """How a run's input enters its trace: ("dynamic", shape, dtype) as a jit argument, or a
  constant keyed by its value (NumPy scalars and short vectors, numbers, hashable handles) or, kept
  alive by the compiled run, by its identity."""
  if isinstance(leaf, (np.ndarray, np.generic)):
    if leaf.dtype.kind in "OSUV":
      return ("id", id(leaf))
    if np.ndim(leaf) <= 1 and np.size(leaf) <= _STATIC_SIZE:
      return ("numpy", np.shape(leaf), leaf.dtype.str, np.ascontiguousarray(leaf).tobytes())
  if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
    return ("dynamic",) + _aval(leaf)
  if isinstance(leaf, (bool, int, float, complex, str, bytes)):
    return ("value", type(leaf), leaf)
  try:
    hash(leaf)
  except TypeError:
    return ("id", id(leaf))
  return ("value", type(leaf), leaf) if type(leaf).__hash__ is not object.__hash__ else ("id", id(leaf))


def summary(fn) -> dict:
  """How eager calls have run `fn` so far: its jitted runs (node counts and signatures compiled) and
  the nodes run op by op."""
  schedule, _ = fn.schedule()
  out = {"runs": [], "op_by_op": []}
  for key, plan in fn.memo.items():
    if isinstance(key, tuple) and key[0] == "segments":
      out["runs"] += [{"nodes": [name for name, _ in schedule[r.start:r.end]], "signatures": len(r.compiled),
                       "op_by_op": len(r.op_by_op)} for (start, end), r in sorted(plan.runs.items())
                      if plan.ends.get(start, len(schedule)) == end and r.compiled]
      out["op_by_op"] += [fn.nodes[schedule[i][0]].op for i, end in sorted(plan.ends.items()) if end == i]
  return out
