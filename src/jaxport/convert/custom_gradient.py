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

from jaxport.convert import _jax_compat
from jaxport.convert.graph import GraphFunction, Library, Node, decode_nodes, dependency_order
from jaxport.convert.interpreter import Runtime, VariableRef, run_function
from jaxport.convert.ops._util import is_concrete

GRADIENT_OP_TYPE = "_gradient_op_type"


@dataclasses.dataclass
class CustomGradient:
  graph: GraphFunction        # inputs: one cotangent per IdentityN output, then the captures
  library: Library
  n_inputs: int               # the IdentityN's own inputs; captured forward values follow them
  has_grad: list[bool]        # per input: False where TF's gradient is None (zero)
  constants: dict[int, np.ndarray | VariableRef]   # captures not fed by the forward graph
  n_results: int = 0          # on an XlaCallModule (jax2tf): how many IdentityN inputs are its results


def is_boundary(node: Node) -> bool:
  """A custom-gradient IdentityN (what `@tf.custom_gradient` and jax2tf emit)."""
  return node.op == "IdentityN" and bool(node.attrs.get(GRADIENT_OP_TYPE))


def prepare(tf_graph, graph: GraphFunction, variable_ref) -> dict[int, CustomGradient]:
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
  for (node, _, _), (custom, captured) in zip(entries, _trace_gradients(tf_graph, entries, variable_ref)):
    call = _wrapped_call(graph, node)
    if call is not None:   # jax2tf: the boundary is the XlaCallModule itself
      custom.n_results = len(node.inputs) - len(call.inputs)
      call.inputs = call.inputs + captured
      found[id(call)] = custom
    else:
      node.inputs = node.inputs + captured
      found[id(node)] = custom
  graph._schedule = None   # node inputs changed
  return found


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


def _is_float(x) -> bool:
  dtype = np.dtype(x.dtype)
  return bool(np.issubdtype(dtype, np.inexact)) or dtype.name == "bfloat16"


# --------------------------------------------------------------------------- run time


def apply(custom: CustomGradient, runtime: Runtime, inputs: list) -> list:
  """The IdentityN outputs (its inputs), with `custom` as their gradient."""
  primals, fed = inputs[:custom.n_inputs], inputs[custom.n_inputs:]
  backward = _Backward(custom, runtime, fed, primals)
  return differentiable(lambda xs: list(xs), backward, primals, backward.res)


def apply_to_call(custom: CustomGradient, runtime: Runtime, forward: Callable, args: list, fed: list) -> list:
  """`forward(args)` (an XlaCallModule's results), with `custom`, the gradient of the IdentityN
  that re-exports them and `args`, as their gradient."""
  k = custom.n_results
  shapes = [None] * k + list(args)   # the IdentityN's outputs: the results, then the arguments

  def bwd(res, cts):
    return backward(res, cts + [jnp.zeros(np.shape(a), a.dtype) for a in args])[k:]

  backward = _Backward(custom, runtime, fed, shapes)
  return differentiable(forward, bwd, args, backward.res)


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
    self.traced = [i for i, c in enumerate(self.captures) if not isinstance(c, VariableRef) and not is_concrete(c)]
    self.res = [runtime.read_variable(VariableRef(k)) for k in self.refs] + [self.captures[i] for i in self.traced]
    self.primals = primals   # shapes and dtypes of the gradients

  def __call__(self, res: list, dys: list) -> list:
    custom, n_refs = self.custom, len(self.refs)
    state = dict(zip(self.refs, res[:n_refs]))
    captures = list(self.captures)
    for i, value in zip(self.traced, res[n_refs:]):
      captures[i] = value
    grads = iter(run_function(custom.graph, list(dys) + captures, Runtime(custom.library, self.config, state)))
    out = []
    for p, has in zip(self.primals, custom.has_grad):
      g = next(grads) if has else None
      out.append(None if g is None or p is None else jnp.reshape(jnp.asarray(g, p.dtype), np.shape(p)))
    return out


def differentiable(forward: Callable, backward: Callable, args: list, res: list) -> list:
  """`forward(args)`, whose forward-mode derivative is `forward`'s own and whose reverse-mode
  derivative is `backward(res, cts) -> [cotangent or None per arg]`.

  `cts` holds one cotangent per result of `forward` (zeros where it has none). NumPy
  arguments stay static; only floating-point arguments and results are differentiated.
  """
  static = {i: a for i, a in enumerate(args) if is_concrete(a)}
  traced = [i for i in range(len(args)) if i not in static]

  def full(values) -> list:
    out = list(args)
    for i, v in zip(traced, values):
      out[i] = v
    return out

  if not traced:
    return forward(list(args))

  @jax.custom_jvp
  def boundary(values, res):
    return [jnp.asarray(o) for o in forward(full(values))]

  @boundary.defjvp
  def boundary_jvp(primals, tangents):
    (values, res), (t_values, _) = primals, tangents
    outs = [jnp.asarray(o) for o in forward(full(values))]
    diff_in = [j for j, v in enumerate(values) if _is_float(v)]
    diff_out = [j for j, o in enumerate(outs) if _is_float(o)]

    def tangent_map(r, lin):   # the forward computation's own derivative at `values`
      values, _ = r
      t = [jnp.zeros(np.shape(v), jax.dtypes.float0) for v in values]
      for j, x in zip(diff_in, lin):
        t[j] = x
      t_outs = jax.jvp(lambda v: [jnp.asarray(o) for o in forward(full(v))], (list(values),), (t,))[1]
      return [t_outs[j] for j in diff_out]

    def transpose(r, cts):   # the recorded gradient
      values, res = r
      dys = [jnp.zeros(o.shape, o.dtype) for o in outs]
      for j, ct in zip(diff_out, cts):
        dys[j] = ct
      grads = backward(res, dys)
      chosen = [grads[traced[j]] for j in diff_in]
      return [None if g is None else jnp.asarray(g, values[j].dtype) for g, j in zip(chosen, diff_in)]

    r, r_tree = jax.tree.flatten((list(values), list(res)))
    out_avals = [jax.typeof(outs[j]).to_tangent_aval() for j in diff_out]
    t_diff = _jax_compat.custom_linear(lambda r, lin: tangent_map(jax.tree.unflatten(r_tree, r), lin),
                                       lambda r, cts: transpose(jax.tree.unflatten(r_tree, r), cts),
                                       r, [t_values[j] for j in diff_in], out_avals)
    t_outs = [jnp.zeros(o.shape, jax.dtypes.float0) for o in outs]
    for j, t in zip(diff_out, t_diff):
      t_outs[j] = t
    return outs, t_outs

  return boundary([jnp.asarray(args[i]) for i in traced], [jnp.asarray(r) for r in res])
