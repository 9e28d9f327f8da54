"""`@tf.custom_gradient` (and jax2tf's recorded VJPs) → JAX reverse mode, keeping forward mode.

TF marks a custom gradient with an `IdentityN` node carrying `_gradient_op_type`;
its inputs are the function's results followed by its arguments, and the
registered gradient function returns one gradient per input (None for results).
At conversion we trace that gradient function inside the forward graph, so it
refers to forward tensors as captures, and convert it like any graph.

At run time the boundary is a `jax.custom_jvp` whose tangent is a linear map with a
custom transpose (`_jax_compat.custom_linear`):

* reverse mode (`grad`, `vjp`) transposes that map, which runs the converted gradient
  function: the recorded gradient, exactly;
* forward mode (`jvp`, `jacfwd`) differentiates the forward computation itself;
* `vmap` batches both; `jit` stages both; second derivatives differentiate the
  converted gradient function.

The forward computation (the nodes between the IdentityN's arguments and its results)
runs inside the boundary when it is pure (`_take_forward`): reverse mode then never
linearizes it, so it may hold what JAX cannot transpose, such as the data-dependent
`while` loop of TFP's Bessel functions.

jax2tf (`with_gradient=True`) wraps each `XlaCallModule` in such an IdentityN, which
re-exports the module's results and arguments. There the boundary covers the module
call itself (`apply_to_call`): reverse mode never differentiates the interpreted
module, so it needs nothing of it (dynamic `while` loops included) and gets JAX's own
VJP. Forward mode differentiates the interpreted module, which can differ from JAX's:
StableHLO has no `stop_gradient`, so a `jax.lax.stop_gradient` (or a `custom_jvp`
rule) in the original is invisible to `jax.jvp` of the converted function, while
`jax.grad` still honours it through the recorded VJP.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert import _jax_compat, export_marks
from jaxport.convert.graph import GraphFunction, Library, Node, decode_nodes, dependency_order
from jaxport.convert.interpreter import Runtime, VariableRef, is_handle, run_function
from jaxport.convert.ops._util import is_concrete

GRADIENT_OP_TYPE = "_gradient_op_type"


@dataclasses.dataclass
class ForwardCall:
  """The forward computation of a `@tf.custom_gradient` boundary, run inside it (`apply`): reverse mode
  then never linearizes it, so it may hold what JAX cannot transpose (a data-dependent `while` loop)."""
  graph: GraphFunction   # inputs: the boundary's arguments, then outside tensors; outputs: results, then captures
  n_results: int         # the IdentityN inputs it computes (TF puts the function's results first)
  n_outside: int         # tensors it reads that do not depend on the arguments (variable reads, constants)
  inner: list[int]       # per fed capture: its index among the graph's capture outputs, or -1 (fed from outside)


@dataclasses.dataclass
class CustomGradient:
  graph: GraphFunction        # inputs: one cotangent per IdentityN output, then the captures
  library: Library
  n_inputs: int               # the IdentityN's own inputs; captured forward values follow them
  has_grad: list[bool]        # per input: False where TF's gradient is None (zero)
  constants: dict[int, np.ndarray | VariableRef]   # captures not fed by the forward graph
  n_results: int = 0          # on an XlaCallModule (jax2tf): how many IdentityN inputs are its results
  forward: ForwardCall | None = None   # the forward computation, when it runs inside the boundary


def is_boundary(node: Node) -> bool:
  """A custom-gradient IdentityN (what `@tf.custom_gradient` and jax2tf emit)."""
  return node.op == "IdentityN" and bool(node.attrs.get(GRADIENT_OP_TYPE))


def prepare(tf_graph, graph: GraphFunction, variable_ref, library: Library | None = None) -> dict[int, CustomGradient]:
  """Converts the gradient function of each custom-gradient IdentityN in `graph`, whose TF
  graph (with the ops the gradient functions take) is `tf_graph`.

  Adds the forward tensors each gradient function captures to the inputs of the node
  that applies it, so they stay alive until it runs; `variable_ref(handle, what,
  variables)` names variables only the gradient reads. Returns the gradients keyed by
  `id(node)`: the IdentityN's, or the XlaCallModule's it wraps (jax2tf).
  """
  from tensorflow.python.framework import ops

  entries = []   # (node, op, gradient function)
  for node in list(graph.nodes.values()):
    if not is_boundary(node):
      continue
    op_type = node.attrs[GRADIENT_OP_TYPE]
    try:
      grad_fn = ops.gradient_registry.lookup(op_type)
    except LookupError:
      warnings.warn(f"custom gradient {op_type!r} of {node.name!r} is not registered in this process "
                    "(e.g. a SavedModel saved without experimental_custom_gradients); "
                    "its gradient is computed by differentiating the forward pass.", stacklevel=3)
      continue
    entries.append((node, tf_graph.get_operation_by_name(node.name), grad_fn))
  found = {}
  plain = []
  for (node, _, _), (custom, captured) in zip(entries, _trace_gradients(tf_graph, entries, variable_ref)):
    call = _wrapped_call(graph, node)
    if call is not None:   # jax2tf: the boundary is the XlaCallModule itself
      custom.n_results = len(node.inputs) - len(call.inputs)
      call.inputs = call.inputs + captured
      found[id(call)] = custom
    else:
      node.inputs = node.inputs + captured
      found[id(node)] = custom
      plain.append(node.name)
  if library is not None:   # inner boundaries first: an outer one's forward graph copies them
    boundaries = set(plain)
    order = dependency_order(plain, lambda n: [src for src, _ in graph.nodes[n].inputs])
    # Rewiring a boundary to read its arguments keeps this order topological.
    position = {name: i for i, name in enumerate(order)}
    for name in (n for n in order if n in boundaries):
      _take_forward(graph, graph.nodes[name], found, library, position)
  graph._schedule = None   # node inputs changed
  return found


def _take_forward(graph: GraphFunction, node: Node, found: dict, library: Library, position: dict[str, int]) -> None:
  """Moves the computation of boundary `node`'s results from its arguments into its `forward` when that
  is pure (no variable writes, no rng), and rewires `node` to read the arguments, the outside tensors
  that computation reads, then the captures the forward graph does not compute. Boundaries inside
  (already taken) keep their gradients: `found` gets their copies too."""
  custom = found[id(node)]
  k = next((i for i, has in enumerate(custom.has_grad) if has), len(custom.has_grad))   # TF: results first
  results, args = node.inputs[:k], node.inputs[k:custom.n_inputs]
  captured = node.inputs[custom.n_inputs:]
  arg_refs = set(args)
  # Nodes before every argument in topological order cannot read one: the walk stops there (else each
  # boundary walked the whole graph above it: EfficientNetB0's 49 boundaries, quadratic).
  first_arg = min((position.get(src, -1) for src, _ in args), default=-1)
  after_args = lambda n: [src for src, _ in graph.nodes[n].inputs if position.get(src, len(position)) >= first_arg]
  depends: dict[str, bool] = {}   # per node the results need: whether it reads an argument
  for name in dependency_order([src for src, _ in results], after_args):
    depends[name] = any(ref in arg_refs or depends.get(ref[0], False) for ref in graph.nodes[name].inputs)

  def computed_from_args(refs) -> list[str]:
    return [ref[0] for ref in refs if ref not in arg_refs and depends.get(ref[0], False)]

  inside = dependency_order(computed_from_args(results), lambda n: computed_from_args(graph.nodes[n].inputs))
  if not inside or not _pure(library, [graph.nodes[name] for name in inside]):
    return
  inside_set = set(inside)
  placeholders: dict[tuple[str, int], str] = {}

  def placeholder(ref) -> str:
    if ref not in placeholders:
      placeholders[ref] = f"{node.name}/forward/input_{len(placeholders)}"
    return placeholders[ref]

  for ref in args:
    placeholder(ref)
  outside: list[tuple[str, int]] = []

  def remap(ref):
    if ref[0] in inside_set and ref not in arg_refs:
      return ref
    if ref not in arg_refs and ref not in placeholders:
      outside.append(ref)
    return (placeholder(ref), 0)

  nodes = {name: dataclasses.replace(graph.nodes[name], inputs=[remap(r) for r in graph.nodes[name].inputs],
                                     control_inputs=[c for c in graph.nodes[name].control_inputs if c in inside_set])
           for name in inside}
  for name in inside:
    if id(graph.nodes[name]) in found:
      found[id(nodes[name])] = found[id(graph.nodes[name])]
  result_refs = [remap(ref) for ref in results]
  inner = [ref for ref in captured if ref[0] in inside_set]
  for ref in placeholders:
    nodes[placeholders[ref]] = Node(placeholders[ref], "Placeholder", [], [], {})
  forward = GraphFunction(f"{node.name}/forward", nodes, [placeholders[ref] for ref in args + outside],
                          result_refs + inner)
  custom.forward = ForwardCall(forward, k, len(outside),
                               [inner.index(ref) if ref in inner else -1 for ref in captured])
  node.inputs = args + outside + [ref for ref in captured if ref not in inner]


def _pure(library: Library, nodes: list[Node]) -> bool:
  """Whether running `nodes` has no effect but their outputs: no variable writes, no rng (checked through
  the functions they call)."""
  from jaxport.convert.ops.control_flow import node_writes_state
  from jaxport.convert.registry import ops_where
  rng_ops = ops_where(needs_rng=True)
  seen: set[str] = set()

  def clean(node: Node, library) -> bool:
    if node.op in rng_ops:
      return False
    if node_writes_state(library, node):
      return False
    for fn_name in library.called_by(node):
      if fn_name in seen:
        continue
      seen.add(fn_name)
      if fn_name not in library or not all(clean(n, library) for n in library[fn_name].nodes.values()):
        return False
    return True

  return all(clean(n, library) for n in nodes)


def _trace_gradients(tf_graph, entries, variable_ref) -> list[tuple[CustomGradient, list]]:
  """Traces every gradient function of `entries` in one `tf.function` (a trace costs ~20 ms of
  fixed overhead: EfficientNetB0 has 49 swish boundaries) and splits the graph per boundary."""
  import tensorflow as tf

  if not entries:
    return []
  specs = [[tf.TensorSpec(o.shape, o.dtype) for o in op.outputs] for _, op, _ in entries]

  def all_gradients(*flat_dys):
    grads, start = [], 0
    for (_, op, grad_fn), spec in zip(entries, specs):
      result = grad_fn(op, *flat_dys[start:start + len(spec)])
      grads.append(list(result) if isinstance(result, (list, tuple)) else [result])
      start += len(spec)
    return grads

  with tf_graph.as_default():
    grad_cf = tf.function(all_gradients, autograph=False).get_concrete_function(*[s for spec in specs for s in spec])
  graph_def = grad_cf.graph.as_graph_def()
  nodes = decode_nodes(graph_def.node)
  library = Library(graph_def.library.function)
  captures = _gradient_captures(grad_cf, tf_graph, variable_ref)
  outputs = iter(grad_cf.outputs)
  traced, start = [], 0
  for (node, _, _), spec, structured in zip(entries, specs, grad_cf.structured_outputs):
    refs = [None if grad is None else _ref(next(outputs)) for grad in structured]
    dy_names = [t.op.name for t in grad_cf.inputs[start:start + len(spec)]]
    start += len(spec)
    traced.append(_one_gradient(node, nodes, library, dy_names, refs, captures))
  return traced


def _gradient_captures(grad_cf, tf_graph, variable_ref) -> dict[str, tuple]:
  """Per placeholder of a captured tensor: ("fed", forward tensor ref) or ("constant", value)."""
  by_internal = {id(internal): external for external, internal in grad_cf.graph.captures}
  forward_captures = {id(external): internal for external, internal in tf_graph.captures}
  n_dys = len(grad_cf.inputs) - len(grad_cf.captured_inputs)
  captures = {}
  for t in grad_cf.inputs[n_dys:]:
    external = by_internal[id(t)]
    if not _is_eager(external):
      captures[t.op.name] = ("fed", _ref(external))
    elif (internal := forward_captures.get(id(external))) is not None:
      captures[t.op.name] = ("fed", _ref(internal))   # e.g. a variable the forward pass captured too
    elif external.dtype.name == "resource":
      captures[t.op.name] = ("constant", variable_ref(external, "a resource captured by a custom gradient",
                                                      grad_cf.variables))
    else:
      captures[t.op.name] = ("constant", external.numpy())
  return captures


def _one_gradient(node: Node, nodes: dict, library: Library, dy_names: list[str], refs: list,
                  captures: dict[str, tuple]) -> tuple[CustomGradient, list]:
  """The gradient function of boundary `node`: the nodes its gradients need, its cotangent
  placeholders and the captured placeholders it reads."""
  roots = [name for name, _ in (r for r in refs if r is not None)]
  needed = dependency_order(roots, lambda name: [src for src, _ in nodes[name].inputs] + nodes[name].control_inputs)
  read = [name for name in needed if name in captures]
  own = {name: nodes[name] for name in needed}
  for name in dy_names:   # a cotangent no gradient reads is still an input
    own.setdefault(name, nodes[name])
  graph = GraphFunction(f"{node.name}/custom_gradient", own, dy_names + read, [r for r in refs if r is not None])
  constants = {i: captures[name][1] for i, name in enumerate(read) if captures[name][0] == "constant"}
  captured = [captures[name][1] for name in read if captures[name][0] == "fed"]
  custom = CustomGradient(graph, library, len(node.inputs), [r is not None for r in refs], constants)
  return custom, captured


def _wrapped_call(graph: GraphFunction, node: Node) -> Node | None:
  """The XlaCallModule whose results and arguments `node` re-exports, as jax2tf builds it, or None."""
  if not node.inputs:
    return None
  call = graph.nodes.get(node.inputs[0][0])
  if call is None or call.op != "XlaCallModule":
    return None
  n_results = len(call.attrs.get("Tout") or [])
  if node.inputs != [(call.name, i) for i in range(n_results)] + call.inputs:
    return None
  return call


def _is_eager(tensor) -> bool:
  try:
    tensor.name
  except AttributeError:
    return True
  return False


def _ref(tensor) -> tuple[str, int]:
  return tensor.op.name, tensor.value_index


def is_float(x) -> bool:
  dtype = np.dtype(x.dtype)
  return bool(np.issubdtype(dtype, np.inexact)) or dtype.name == "bfloat16"


# --------------------------------------------------------------------------- run time


def apply(custom: CustomGradient, runtime: Runtime, inputs: list) -> list:
  """The IdentityN outputs (its inputs), with `custom` as their gradient."""
  if custom.forward is not None:
    return _apply_with_forward(custom, runtime, inputs)
  primals, fed = inputs[:custom.n_inputs], inputs[custom.n_inputs:]
  backward = _Backward(custom, runtime, fed, primals)
  return differentiable(lambda xs: list(xs), backward, primals, backward.res)


def _apply_with_forward(custom: CustomGradient, runtime: Runtime, inputs: list) -> list:
  """The IdentityN outputs, its results computed by `custom.forward` inside the boundary. `inputs`: the
  arguments, the outside tensors the forward graph reads, then the captures it does not compute."""
  f = custom.forward
  n_args = custom.n_inputs - f.n_results
  args, outside, outer = inputs[:n_args], inputs[n_args:n_args + f.n_outside], iter(inputs[n_args + f.n_outside:])
  keys = sorted({v.key for v in outside if isinstance(v, VariableRef)})   # variables it reads by handle
  fed = [_Inner(j) if j >= 0 else next(outer) for j in f.inner]
  backward = _Backward(custom, runtime, fed, [None] * f.n_results + args)
  arrays = [i for i, v in enumerate(outside) if isinstance(v, jax.Array) or is_concrete(v)]   # handles stay static
  n_out = len(arrays)

  def forward(values):
    a, o, state = values[:n_args], list(outside), values[n_args + n_out:]
    for i, v in zip(arrays, values[n_args:n_args + n_out]):
      o[i] = v
    outs = run_function(f.graph, list(a) + o, runtime.fork(state=dict(zip(keys, state)), rng=None))
    return outs[:f.n_results] + list(a) + outs[f.n_results:]

  def bwd(res, cts):
    return backward(res, cts)[f.n_results:] + [None] * (n_out + len(keys))

  state = [runtime.read_variable(VariableRef(k)) for k in keys]
  return differentiable(forward, bwd, list(args) + [outside[i] for i in arrays] + state, backward.res,
                        n_inner=len(f.graph.outputs) - f.n_results)


def apply_to_call(custom: CustomGradient, runtime: Runtime, forward: Callable, args: list, fed: list) -> list:
  """`forward(args)` (an XlaCallModule's results), with `custom`, the gradient of the IdentityN
  that re-exports them and `args`, as their gradient."""
  k = custom.n_results
  shapes = [None] * k + list(args)   # the IdentityN's outputs: the results, then the arguments

  def bwd(res, cts):
    return backward(res, cts + [jnp.zeros(np.shape(a), a.dtype) for a in args])[k:]

  backward = _Backward(custom, runtime, fed, shapes)
  return differentiable(forward, bwd, args, backward.res)


@dataclasses.dataclass(frozen=True)
class _Inner:
  """A capture the boundary's forward graph computes: its `index` among that graph's capture outputs."""
  index: int


class _Backward:
  """Runs the converted gradient function: `self(res, dys) -> [gradient or None per IdentityN input]`.

  `res` holds the traced values it reads (captured forward tensors, variables); NumPy
  captures and constants stay static, closed over.
  """

  def __init__(self, custom: CustomGradient, runtime: Runtime, fed: list, primals: list):
    self.custom, self.config = custom, runtime.config
    fed = iter(fed)
    n_captures = len(custom.graph.inputs) - len(custom.has_grad)
    self.captures = [custom.constants[i] if i in custom.constants else next(fed) for i in range(n_captures)]
    self.refs = sorted({c.key for c in self.captures if isinstance(c, VariableRef)})
    self.inner = [(i, c.index) for i, c in enumerate(self.captures) if isinstance(c, _Inner)]
    self.traced = [i for i, c in enumerate(self.captures)
                   if not isinstance(c, _Inner) and not is_handle(c) and not is_concrete(c)]
    self.res = [runtime.read_variable(VariableRef(k)) for k in self.refs] + [self.captures[i] for i in self.traced]
    self.primals = primals   # shapes and dtypes of the gradients

  def __call__(self, res: list, dys: list) -> list:
    custom, n_refs = self.custom, len(self.refs)
    state = dict(zip(self.refs, res[:n_refs]))
    captures = list(self.captures)
    for i, value in zip(self.traced, res[n_refs:]):
      captures[i] = value
    for i, j in self.inner:   # computed by the forward graph inside the boundary, after `self.res`
      captures[i] = res[len(self.res) + j]
    grads = iter(run_function(custom.graph, list(dys) + captures, Runtime(custom.library, self.config, state)))
    out = []
    for p, has in zip(self.primals, custom.has_grad):
      g = next(grads) if has else None
      out.append(None if g is None or p is None else jnp.reshape(jnp.asarray(g, p.dtype), np.shape(p)))
    return out


def differentiable(forward: Callable, backward: Callable, args: list, res: list, n_inner: int = 0) -> list:
  """`forward(args)`, whose forward-mode derivative is `forward`'s own and whose reverse-mode
  derivative is `backward(res, cts) -> [cotangent or None per arg]`.

  `cts` holds one cotangent per result of `forward` (zeros where it has none). NumPy
  arguments stay static; only floating-point arguments and results are differentiated.
  `forward`'s last `n_inner` results are no outputs: residuals `backward` reads after `res`.
  """
  static = {i: a for i, a in enumerate(args) if is_concrete(a)}
  traced = [i for i in range(len(args)) if i not in static]

  def full(values) -> list:
    out = list(args)
    for i, v in zip(traced, values):
      out[i] = v
    return out

  def forward_values(values) -> list:   # outputs, then inner residuals
    return [jnp.asarray(o) for o in forward(full(values))]

  if not traced:
    flat = forward_values([])
    return flat[:len(flat) - n_inner]
  values, res = [jnp.asarray(args[i]) for i in traced], [jnp.asarray(r) for r in res]
  # Exporting: the forward as a named function, traced once (see _exportable).
  forward_call = (export_marks.named_jit(export_marks.CUSTOM_GRADIENT_FORWARD,
                                         lambda *v: _kept(v, forward_values(list(v))))
                  if export_marks.active(*values, *res) else None)

  def run(values) -> tuple[list, list]:   # (outputs, inner residuals)
    flat = list(forward_call(*values)) if forward_call is not None else forward_values(values)
    return flat[:len(flat) - n_inner], flat[len(flat) - n_inner:]

  @jax.custom_jvp
  def boundary(values, res):
    return run(values)[0]

  @boundary.defjvp
  def boundary_jvp(primals, tangents):
    (values, res), (t_values, _) = primals, tangents
    outs, inner = run(values)
    diff_in = [j for j, v in enumerate(values) if is_float(v)]
    diff_out = [j for j, o in enumerate(outs) if is_float(o)]

    def tangent_map(r, lin):   # the forward computation's own derivative at `values`
      values, _ = r
      t = [jnp.zeros(np.shape(v), jax.dtypes.float0) for v in values]
      for j, x in zip(diff_in, lin):
        t[j] = x
      t_outs = jax.jvp(lambda v: run(v)[0], (list(values),), (t,))[1]
      return [t_outs[j] for j in diff_out]

    def transpose(r, cts):   # the recorded gradient
      values, res = r
      dys = [jnp.zeros(o.shape, o.dtype) for o in outs]
      for j, ct in zip(diff_out, cts):
        dys[j] = ct
      grads = backward(res, dys)
      chosen = [grads[traced[j]] for j in diff_in]
      return [None if g is None else jnp.asarray(g, values[j].dtype) for g, j in zip(chosen, diff_in)]

    r, r_tree = jax.tree.flatten((list(values), list(res) + inner))
    out_avals = [jax.typeof(outs[j]).to_tangent_aval() for j in diff_out]
    t_diff = _jax_compat.custom_linear(lambda r, lin: tangent_map(jax.tree.unflatten(r_tree, r), lin),
                                       lambda r, cts: transpose(jax.tree.unflatten(r_tree, r), cts),
                                       r, [t_values[j] for j in diff_in], out_avals)
    t_outs = [jnp.zeros(o.shape, jax.dtypes.float0) for o in outs]
    for j, t in zip(diff_out, t_diff):
      t_outs[j] = t
    return outs, t_outs

  if forward_call is not None:
    exported = _exportable(boundary, forward_call, backward, values, res, traced, n_inner)
    if exported is not None:
      return exported
  return boundary(values, res)


def _kept(inputs, outputs) -> tuple:
  """`outputs` through an optimization barrier with `inputs`: jit neither prunes nor forwards them."""
  return jax.lax.optimization_barrier((tuple(inputs), tuple(outputs)))[1]


def _exportable(boundary, forward_call, backward, values: list, res: list, positions: list[int],
                n_inner: int) -> list | None:
  """`boundary(values, res)` as `jax.export` keeps it: the forward and the recorded gradient as named
  functions the interpreter reads back (`export_marks.CUSTOM_GRADIENT`). `values[j]` is argument
  `positions[j]` of `backward`'s gradients. None (the plain boundary, whose loaded artifact differentiates
  the forward ops) where the gradient function cannot be traced alone."""
  flat = jax.eval_shape(forward_call, *values)   # traced once: every call below reuses it
  outs, inner = flat[:len(flat) - n_inner], flat[len(flat) - n_inner:]
  diff_in = [j for j, v in enumerate(values) if is_float(v)]

  def recorded_gradient(*flat):   # residuals, inner residuals, one cotangent per output
    grads = backward(list(flat[:len(res) + len(inner)]), list(flat[len(res) + len(inner):]))
    return _kept(flat, [jnp.zeros(values[j].shape, values[j].dtype) if grads[positions[j]] is None
                        else jnp.asarray(grads[positions[j]], values[j].dtype) for j in diff_in])

  gradient_call = export_marks.named_jit(export_marks.CUSTOM_GRADIENT_BACKWARD, recorded_gradient)
  try:
    jax.eval_shape(gradient_call, *res, *inner, *outs)
  except Exception as e:   # pylint: disable=broad-except - the export still runs, without the gradient
    warnings.warn(f"a @tf.custom_gradient's gradient function cannot run alone ({type(e).__name__}: {e}); the "
                  "exported artifact differentiates its forward ops instead.", stacklevel=2)
    return None

  def marked(*flat):
    v, r = list(flat[:len(values)]), list(flat[len(values):])
    results = boundary(v, r)
    forward = forward_call(*v)
    probe = gradient_call(*r, *forward[len(outs):], *[jnp.zeros(o.shape, o.dtype) for o in outs])
    return _kept((forward, probe), results)   # the gradient function stays in the module

  name = export_marks.custom_gradient_name(len(values), len(res), len(outs), len(inner))
  return list(_kept((), export_marks.named_jit(name, marked)(*values, *res)))   # every output kept
