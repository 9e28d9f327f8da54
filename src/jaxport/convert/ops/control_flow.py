"""Op rules: function calls, While, If and Case.

Library functions are interpreted inline. Loop variables and branch operands
split into *static* values (NumPy constants that stay constant, variable refs),
which are closed over so shape arithmetic stays static, and *dynamic* values,
which become the lax carry. Variable assignments inside a body thread the
variable state through the carry; an `rng` key is split per iteration.
Loop variables and call outputs nothing reads are dropped; loops whose shapes
change per step run step by step (see _loops). Under jit, a cond branch that has
a value-dependent size becomes a run-time error taken only with that branch
(`_run_time_error_branch`).
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.graph import GraphFunction
from jaxport.convert.interpreter import Runtime, VariableRef, has_tracers, is_handle, run_function
from jaxport.convert.ops._loops import live_loop_vars, needs_python_loop, pruned, python_loop, used_outputs
from jaxport.convert.ops._trip_count import closed_form_trip_count
from jaxport.convert.ops._util import is_concrete, jax_dtype, known_value
from jaxport.convert.ops.random import writes_stream
from jaxport.convert.ops.tensor_list import TensorList
from jaxport.convert.registry import ops_where, register
from jaxport.errors import DynamicShapeError, RunTimeBranchWarning

# Loops whose trip count has no closed form (see _trip_count) are simulated up to this many
# iterations; past it they run as lax.while_loop (forward-mode differentiable only).
MAX_SIMULATED_TRIPS = 10_000


@register("PartitionedCall", "StatefulPartitionedCall", structural=True)
def partitioned_call(ctx, *args):
  fn = ctx.runtime.library[ctx.attr("f").name]
  used = used_outputs(ctx.fn, ctx.name)
  if used is None or len(used) >= len(fn.outputs):
    return run_function(fn, list(args), ctx.runtime)
  keep = sorted(used)   # only what the caller reads runs (a while_v2 forward's gradient accumulators do not)
  outs = dict(zip(keep, run_function(pruned(fn, keep), list(args), ctx.runtime)))
  return [outs.get(i) for i in range(len(fn.outputs))]


# --------------------------------------------------------------------------- helpers


def _writes_state(runtime: Runtime, fn_name: str) -> bool:
  return function_writes_state(runtime.library, fn_name)


def node_writes_state(library, node) -> bool:
  """Whether running `node` assigns variables (itself, or through a function it calls)."""
  return (node.op in ops_where(writes_state=True) or writes_stream(library, node)
          or any(function_writes_state(library, name) for name in library.called_by(node)))


def function_writes_state(library, fn_name: str) -> bool:
  """Whether calling `fn_name` (or anything it calls) assigns variables."""
  memo = library.memo.setdefault("writes_state", {})
  if fn_name not in memo:
    memo[fn_name] = False   # breaks recursion cycles
    memo[fn_name] = any(node_writes_state(library, node) for node in library[fn_name].nodes.values())
  return memo[fn_name]


def _is_dynamic(value) -> bool:
  """Values that must travel through a lax carry."""
  return not (is_concrete(value) or is_handle(value))


def _passthrough_indices(fn: GraphFunction) -> set[int]:
  """Outputs that return their own input unchanged (through Identity chains)."""
  positions = {name: i for i, name in enumerate(fn.inputs)}
  same = set()
  for i, (src, idx) in enumerate(fn.outputs):
    while idx == 0 and src not in positions and fn.nodes[src].op in ("Identity", "Snapshot"):
      src, idx = fn.nodes[src].inputs[0]
    if idx == 0 and positions.get(src) == i:
      same.add(i)
  return same


def _as_carry(value, like=None):
  """A value fit for a lax carry, with the dtype of `like` (its loop-entry value)."""
  if isinstance(value, TensorList):
    return value
  dtype = like.dtype if like is not None and hasattr(like, "dtype") else None
  return jnp.asarray(value, dtype)


class _Unknown:
  """Stands for a dynamic value while simulating a loop's constant part."""


def _restricted(fn: GraphFunction, outputs: list[int]) -> GraphFunction:
  """`fn` computing only the given outputs (so only the nodes they need run)."""
  memo = fn.memo.setdefault("restricted", {})
  key = tuple(outputs)
  if key not in memo:
    memo[key] = GraphFunction(f"{fn.name}{list(outputs)}", fn.nodes, fn.inputs, [fn.outputs[i] for i in outputs])
  return memo[key]


def _simulate(fn: GraphFunction, outputs: list[int], args, runtime: Runtime):
  """Runs the part of `fn` computing `outputs` in NumPy; None if it is not constant."""
  try:
    # a copy of the variables: a body's assignments must not land in the real state while simulating
    results = run_function(_restricted(fn, outputs), list(args), runtime.fork(rng=None, state=dict(runtime.state)))
  except Exception:  # noqa: BLE001  -- any failure means "not a trace-time constant"
    return None
  return results if all(is_concrete(r) for r in results) else None


def _static_trip_count(runtime, cond_fn, body_fn, loop_vars, passthrough) -> int | None:
  """The exact number of iterations, when it follows from trace-time constants (once per
  function and constants: later calls read it from the library's memo)."""
  key = (cond_fn.name, body_fn.name) + tuple(
      (i, np.asarray(v).dtype.str, np.asarray(v).tobytes()) if is_concrete(v) else (i, type(v).__name__)
      for i, v in enumerate(loop_vars))
  memo = runtime.library.memo.setdefault("trip_counts", {})
  if key not in memo:
    trips = closed_form_trip_count(cond_fn, body_fn, loop_vars, passthrough)
    memo[key] = trips if trips is not None else _simulated_trip_count(runtime, cond_fn, body_fn, loop_vars)
  return memo[key]


def _simulated_trip_count(runtime, cond_fn, body_fn, loop_vars) -> int | None:
  """The trip count found by running the loop's constant part in NumPy, up to MAX_SIMULATED_TRIPS."""
  known = {i for i, v in enumerate(loop_vars) if is_concrete(v)}
  refs = {i for i, v in enumerate(loop_vars) if is_handle(v)}
  while True:   # shrink `known` to the vars whose updates depend only on known vars
    args = [v if i in known | refs else _Unknown() for i, v in enumerate(loop_vars)]
    still = {i for i in known if _simulate(body_fn, [i], args, runtime) is not None}
    if still == known:
      break
    known = still
  values = [v if i in known | refs else _Unknown() for i, v in enumerate(loop_vars)]
  order = sorted(known)
  for trips in range(MAX_SIMULATED_TRIPS + 1):
    pred = _simulate(cond_fn, [0], values, runtime)
    if pred is None:
      return None
    if not bool(np.asarray(pred[0])):
      return trips
    outs = _simulate(body_fn, order, values, runtime)
    if outs is None:
      return None
    for i, o in zip(order, outs):
      values[i] = o
  return None


def materialize_lists(step, carry):
  """Allocates TensorLists in `carry` whose element shape only the loop body reveals."""
  def unresolved(x):
    return isinstance(x, TensorList) and x.items is None
  is_list = lambda x: isinstance(x, TensorList)
  if not any(unresolved(x) for x in jax.tree.leaves(carry, is_leaf=is_list)):
    return carry
  shapes = jax.eval_shape(step, carry)

  def allocate(before, after):
    if unresolved(before):
      if not isinstance(after, TensorList) or after.items is None:
        return before.with_items(before.dense())
      return before.with_items(jnp.zeros(after.items.shape, before.dtype))
    return before
  return jax.tree.map(allocate, carry, shapes, is_leaf=is_list)


# --------------------------------------------------------------------------- While


@register("While", "StatelessWhile", structural=True)
def while_loop(ctx, *loop_vars):
  runtime = ctx.runtime
  cond_fn = runtime.library[ctx.attr("cond").name]
  body_fn = runtime.library[ctx.attr("body").name]
  body_writes = _writes_state(runtime, body_fn.name)
  if _writes_state(runtime, cond_fn.name):
    raise NotImplementedError(f"While {ctx.name!r}: its condition assigns variables, which jaxport cannot convert")

  passthrough = _passthrough_indices(body_fn)
  # Dead loop variables (e.g. while_v2's gradient accumulators) stay at their entry values.
  live = live_loop_vars(runtime.library, cond_fn, body_fn, used_outputs(ctx.fn, ctx.name), len(loop_vars))
  keep = sorted(live)
  run_body = body_fn if len(keep) == len(loop_vars) else pruned(body_fn, keep)
  static = {i for i, v in enumerate(loop_vars)
            if i not in live or (not _is_dynamic(v) and (i in passthrough or is_handle(v)))}
  for i, v in enumerate(loop_vars):
    if is_handle(v) and i not in passthrough:
      raise NotImplementedError(f"While {ctx.name!r}: loop variable {i} swaps resource handles between iterations")
  dyn_idx = [i for i in range(len(loop_vars)) if i not in static]
  trips = _static_trip_count(runtime, cond_fn, body_fn, loop_vars, passthrough)
  loop = _LaxLoop(cond_fn, run_body, keep, loop_vars, dyn_idx, body_writes, trips)
  init_dyn = [_as_carry(loop_vars[i]) for i in dyn_idx]
  state0 = runtime.state if body_writes else {}
  eager_key = None if has_tracers(init_dyn, runtime.state, runtime.rng) else _eager_loop_key(ctx, loop)
  python_key = None if eager_key is None else _python_loop_key(eager_key, init_dyn)
  python_loops = runtime.library.memo.setdefault("python_loops", {})
  cause = python_loops.get(python_key) if python_key is not None else None
  if cause is None:
    try:
      dyn, state = _eager_loop(ctx, loop, init_dyn, state0, eager_key)
    except Exception as e:  # noqa: BLE001 -- shapes that change per step, or that need a loop variable's value
      if not needs_python_loop(e):
        raise
      cause = e.with_traceback(None)
      if python_key is not None:
        python_loops[python_key] = cause
  if cause is not None:
    iteration_rng = loop.iteration_rng(runtime.rng)
    return _python_while(ctx.name, runtime, cond_fn, run_body, keep, loop_vars, trips, iteration_rng, cause)
  if body_writes:
    runtime.state.update(state)
  return loop.full_args(dyn)


class _LaxLoop:
  """A While node as lax.fori_loop (known trip count) or lax.while_loop over its dynamic loop vars."""

  def __init__(self, cond_fn, run_body, keep, loop_vars, dyn_idx, body_writes, trips):
    self.cond_fn, self.run_body, self.keep, self.loop_vars = cond_fn, run_body, keep, loop_vars
    self.dyn_idx, self.body_writes, self.trips = dyn_idx, body_writes, trips

  def full_args(self, dyn):
    args = list(self.loop_vars)
    for i, v in zip(self.dyn_idx, dyn):
      args[i] = v
    return args

  @staticmethod
  def iteration_rng(key):
    return lambda i: None if key is None else jax.random.fold_in(key, i)

  def __call__(self, runtime, init_dyn, state0):
    def body(carry, sub_rng):
      dyn, state = carry
      rt = runtime.fork(state=dict(state) if self.body_writes else None, rng=sub_rng)
      outs = dict(zip(self.keep, run_function(self.run_body, self.full_args(dyn), rt)))
      new_dyn = [_as_carry(outs[i], d) for i, d in zip(self.dyn_idx, dyn)]
      return new_dyn, (rt.state if self.body_writes else state)

    def cond(carry, sub_rng):
      dyn, _ = carry
      pred, = run_function(self.cond_fn, self.full_args(dyn), runtime.fork(rng=sub_rng))
      return jnp.asarray(pred).reshape(()).astype(bool)

    iteration_rng = self.iteration_rng(runtime.rng)
    carry = materialize_lists(lambda c: body(c, iteration_rng(0)), (init_dyn, state0))
    if self.trips is not None:
      return lax.fori_loop(0, self.trips, lambda i, c: body(c, iteration_rng(i)), carry)
    _, final = lax.while_loop(lambda ic: cond(ic[1], iteration_rng(ic[0])),
                              lambda ic: (ic[0] + 1, body(ic[1], iteration_rng(ic[0]))), (jnp.int32(0), carry))
    return final


# Static loop vars up to this size key the cache of eagerly called loops; larger ones skip it.
_MAX_KEYED_BYTES = 1 << 16


def _eager_loop(ctx, loop: _LaxLoop, init_dyn, state0, key):
  """Runs `loop`. Called eagerly (`key`, from `_eager_loop_key`; None under a trace), through a jax.jit
  cached per node and static loop vars: lax loops outside jit retrace and recompile their body on every
  call, as each call's body is a new closure. Variables and the rng are arguments of the cached function,
  never its constants."""
  runtime = ctx.runtime
  if key is None:
    return loop(runtime, init_dyn, state0)
  cache = runtime.library.memo.setdefault("eager_loops", {})
  if key not in cache:
    library, config, custom = runtime.library, runtime.config, runtime.custom_gradients

    def staged(init_dyn, state, rng):
      rt = Runtime(library, config, dict(state), rng, custom)
      dyn, new_state = loop(rt, init_dyn, rt.state if loop.body_writes else {})
      return dyn, new_state
    cache[key] = jax.jit(staged)
  staged = cache[key]
  if staged is None:
    return loop(runtime, init_dyn, state0)
  try:
    return staged(init_dyn, dict(runtime.state), runtime.rng)
  except Exception:  # noqa: BLE001 -- e.g. a body needing concrete values: the loop runs as before
    cache[key] = None
    return loop(runtime, init_dyn, state0)


def _python_loop_key(eager_key, init_dyn):
  """The key under which an eager call remembers that this loop, with these carries, runs in Python:
  later calls skip the lax loop's trace, which would fail the same way."""
  leaves = jax.tree.leaves(init_dyn)
  avals = tuple((np.shape(x), x.dtype if hasattr(x, "dtype") else np.result_type(x)) for x in leaves)
  return eager_key, jax.tree.structure(init_dyn), avals


def _eager_loop_key(ctx, loop: _LaxLoop):
  static = []
  for i, v in enumerate(loop.loop_vars):
    if i in loop.dyn_idx:
      continue
    if isinstance(v, VariableRef):
      static.append((i, v.key))
    elif is_handle(v):
      static.append((i, "table", id(v)))
    elif is_concrete(v) and np.asarray(v).nbytes <= _MAX_KEYED_BYTES:
      v = np.asarray(v)
      static.append((i, v.dtype.str, v.shape, v.tobytes()))
    else:
      return None
  return (ctx.fn.name if ctx.fn is not None else None, ctx.name, loop.cond_fn.name, loop.run_body.name,
          tuple(loop.keep), loop.trips, tuple(static))


def _python_while(node, runtime, cond_fn, run_body, keep, loop_vars, trips, iteration_rng, cause):
  """The loop run step by step in Python (unrolled under jit): loop variables keep their own shapes
  and constants stay NumPy, so `x[:, : i + 1]` is a static slice. See _loops.python_loop."""
  def cond(args, i):
    return run_function(cond_fn, list(args), runtime.fork(rng=iteration_rng(i)))[0]

  def body(args, i):   # assignments go to runtime.state directly
    outs = run_function(run_body, list(args), runtime.fork(rng=iteration_rng(i)))
    new = list(args)
    for k, o in zip(keep, outs):
      new[k] = o
    return new
  return python_loop(node, cond, body, list(loop_vars), trips, cause)


# --------------------------------------------------------------------------- If / Case


def _branch_call(runtime: Runtime, fn_names: list[str], index, args, out_dtypes, op: str, node: str,
                 one_sided: dict[int, int] | None = None):
  """Calls branch `index` (an int at trace time, or a traced int via lax.switch).

  `one_sided` maps outputs only one branch computes (a v1 cond's values that its gradient reads or a v1
  stack pushes) to that branch; the others give zeros of its shapes, which only an untaken branch of
  the gradient reads."""
  if is_concrete(index):
    taken = int(index)
    outs = runtime.call(fn_names[taken], args)
    missing = {j: k for j, k in (one_sided or {}).items() if k != taken}
    for k in set(missing.values()):   # a v1 stack may push them: zeros of the other branch's shapes
      shapes = jax.eval_shape(lambda a, name=fn_names[k]: runtime.fork(state=dict(runtime.state)).call(name, a),
                              list(args))
      outs = list(outs)
      for j in [j for j, d in missing.items() if d == k]:
        outs[j] = jnp.zeros(shapes[j].shape, shapes[j].dtype)
    return outs
  writes = any(_writes_state(runtime, n) for n in fn_names)
  dyn_idx = [i for i, a in enumerate(args) if _is_dynamic(a)]
  failed: list[tuple[int, DynamicShapeError]] = []

  def make_branch(k, name):
    def branch(operands):
      dyn, state = operands
      full = list(args)
      for i, v in zip(dyn_idx, dyn):
        full[i] = v
      rt = runtime.fork(state=dict(state) if writes else None)
      try:
        outs = run_function(runtime.library[name], full, rt)
      except DynamicShapeError as e:
        failed.append((k, e))
        raise
      outs = [o if isinstance(o, TensorList) or not isinstance(dt, np.dtype) else jnp.asarray(o, jax_dtype(dt))
              for o, dt in zip(outs, out_dtypes)]
      for j, defined_in in (one_sided or {}).items():
        if defined_in != k and j in one_sided_shapes:
          outs[j] = jnp.zeros(one_sided_shapes[j].shape, one_sided_shapes[j].dtype)
      return outs, (rt.state if writes else state)
    return branch

  operands = ([args[i] for i in dyn_idx], runtime.state if writes else {})
  branches = [make_branch(k, n) for k, n in enumerate(fn_names)]
  one_sided_shapes: dict[int, jax.ShapeDtypeStruct] = {}
  for defined_in in sorted(set((one_sided or {}).values())):
    shapes = jax.eval_shape(branches[defined_in], operands)[0]
    one_sided_shapes.update({j: shapes[j] for j, d in one_sided.items() if d == defined_in})
  stand_ins: set[int] = set()
  for _ in fn_names:
    try:
      outs, state = lax.switch(index, branches, operands)
      break
    except DynamicShapeError as error:
      if not failed or export_marks.exporting_now():
        raise
      k, cause = failed.pop()
      traceable = [j for j in range(len(branches)) if j != k and j not in stand_ins]
      if not traceable:
        raise
      try:
        shapes = jax.eval_shape(branches[traceable[0]], operands)[0]
      except DynamicShapeError:
        raise error from None
      if not all(isinstance(s, jax.ShapeDtypeStruct) for s in shapes):   # a TensorList: no stand-in
        raise
      branches[k] = _run_time_error_branch(shapes, index == k, op, node, fn_names[k], cause, runtime)
      stand_ins.add(k)
  if writes:
    runtime.state.update(state)
  return outs


def _run_time_error_branch(shapes, taken, op: str, node: str, name: str, cause: DynamicShapeError, runtime):
  """A stand-in for a branch with a value-dependent size, which jit cannot trace: zeros shaped like
  the other branches' outputs, and an error at run time if the predicate takes it. Keras 3 divides a
  sparse gradient so: a rare branch (a zero or NaN denominator) grows the rows with `tf.where`."""
  warned = runtime.library.memo.setdefault("run_time_error_branches", set())
  if node not in warned:
    warned.add(node)
    warnings.warn(RunTimeBranchWarning(
        f"{op} node {node!r}: its branch `{name}` has a value-dependent size ({cause.op} node {cause.node!r}), "
        "which jax.jit cannot trace. Under jit it is compiled as a run-time error, raised only if the "
        "predicate takes it; the other branches run as usual. Called without jit, the function computes it."),
        stacklevel=2)

  def fail(is_taken):
    if np.any(is_taken):
      raise DynamicShapeError(op, node, "predicate" if op.endswith("If") else "branch_index")
    return np.zeros(np.shape(is_taken), np.bool_)

  def stand_in(operands):
    _, state = operands
    # a pure callback (io_callback has no vmap of cond), kept alive by the outputs and the variables
    # reading its result (false unless it raises)
    flag = jax.pure_callback(fail, jax.ShapeDtypeStruct((), np.bool_), lax.stop_gradient(taken),
                             vmap_method="broadcast_all")
    outs = [jnp.broadcast_to(flag.astype(s.dtype), s.shape) for s in shapes]
    return outs, {key: jnp.where(flag, jnp.zeros_like(value), value) for key, value in state.items()}
  return stand_in


@register("If", "StatelessIf", structural=True)
def if_(ctx, pred, *args):
  names = [ctx.attr("else_branch").name, ctx.attr("then_branch").name]
  known = known_value(pred)   # a constant, or any value of an eager call: only the taken branch runs, as in TF
  if known is not None:   # TF: a scalar is truthy by value, other shapes by being non-empty
    index = int(bool(known)) if known.ndim == 0 else int(known.size > 0)
  else:
    index = jnp.asarray(pred).reshape(()).astype(jnp.int32) != 0
    index = index.astype(jnp.int32)
  return _branch_call(ctx.runtime, names, index, args, ctx.attr("Tout", []), ctx.op, ctx.name,
                      ctx.attr("_one_sided", None))


@register("Case", "StatelessCase", structural=True)
def case(ctx, branch_index, *args):
  names = [f.name for f in ctx.attr("branches")]
  n = len(names)
  known = known_value(branch_index)
  if known is not None:
    i = int(known)
    index = i if 0 <= i < n else n - 1   # TF runs the last branch when out of range
  else:
    i = jnp.asarray(branch_index, jnp.int32)
    index = jnp.where((i < 0) | (i >= n), n - 1, i)
  return _branch_call(ctx.runtime, names, index, args, ctx.attr("Tout", []), ctx.op, ctx.name)
