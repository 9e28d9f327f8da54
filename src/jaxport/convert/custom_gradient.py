"""`@tf.custom_gradient` → `jax.custom_vjp`.

TF marks a custom gradient with an `IdentityN` node carrying `_gradient_op_type`;
its inputs are the function's results followed by its arguments, and the
registered gradient function returns one gradient per input (None for results).
At conversion we trace that gradient function inside the forward graph, so it
refers to forward tensors as captures, and convert it like any graph. At run
time the IdentityN becomes an identity whose VJP is the converted gradient
function, fed with the captured forward values.
"""
from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.graph import GraphFunction, Library, Node, decode_nodes
from jaxport.convert.interpreter import Runtime, VariableRef, run_function

GRADIENT_OP_TYPE = "_gradient_op_type"


@dataclasses.dataclass
class CustomGradient:
  graph: GraphFunction        # inputs: one cotangent per IdentityN output, then the captures
  library: Library
  n_inputs: int               # the IdentityN's own inputs; captured forward values follow them
  has_grad: list[bool]        # per input: False where TF's gradient is None (zero)
  constants: dict[int, np.ndarray | VariableRef]   # captures not fed by the forward graph


def prepare(cf, graph: GraphFunction, variable_ref) -> dict[int, CustomGradient]:
  """Converts the gradient function of each custom-gradient IdentityN in `graph`.

  Adds the forward tensors each gradient function captures to the node's inputs,
  so they stay alive until it runs; `variable_ref(handle, what, variables)` names
  variables only the gradient reads. Returns the gradients keyed by `id(node)`.
  """
  import tensorflow as tf
  from tensorflow.python.framework import ops

  found = {}
  for node in graph.nodes.values():
    op_type = node.attrs.get(GRADIENT_OP_TYPE)
    if node.op != "IdentityN" or not op_type:
      continue
    try:
      grad_fn = ops.gradient_registry.lookup(op_type)
    except LookupError:
      warnings.warn(f"custom gradient {op_type!r} of {node.name!r} is not registered in this process "
                    "(e.g. a SavedModel saved without experimental_custom_gradients); "
                    "its gradient is computed by differentiating the forward pass.", stacklevel=3)
      continue
    op = cf.graph.get_operation_by_name(node.name)
    specs = [tf.TensorSpec(o.shape, o.dtype) for o in op.outputs]
    with cf.graph.as_default():
      grad_cf = tf.function(lambda *dys: grad_fn(op, *dys), autograph=False).get_concrete_function(*specs)
    found[id(node)] = _decode_gradient(grad_cf, node, cf, variable_ref)
  graph._schedule = None   # node inputs changed
  return found


def _decode_gradient(grad_cf, node: Node, cf, variable_ref) -> CustomGradient:
  graph_def = grad_cf.graph.as_graph_def()
  nodes = decode_nodes(graph_def.node)
  outputs = iter(grad_cf.outputs)
  refs = [None if grad is None else _ref(next(outputs)) for grad in grad_cf.structured_outputs]
  n_dys = len(grad_cf.inputs) - len(grad_cf.captured_inputs)
  by_internal = {id(internal): external for external, internal in grad_cf.graph.captures}
  forward_captures = {id(external): internal for external, internal in cf.graph.captures}
  captured, constants = [], {}
  for i, t in enumerate(grad_cf.inputs[n_dys:]):
    external = by_internal[id(t)]
    if _is_eager(external):
      internal = forward_captures.get(id(external))   # e.g. a variable the forward pass captured too
      if internal is not None:
        captured.append(_ref(internal))
      elif external.dtype.name == "resource":
        constants[i] = variable_ref(external, f"a resource captured by the custom gradient of {node.name!r}",
                                    grad_cf.variables)
      else:
        constants[i] = external.numpy()
    else:
      captured.append(_ref(external))
  n_inputs = len(node.inputs)
  node.inputs = node.inputs + captured
  graph = GraphFunction(f"{node.name}/custom_gradient", nodes, [t.op.name for t in grad_cf.inputs],
                        [r for r in refs if r is not None])
  return CustomGradient(graph, Library(graph_def.library.function), n_inputs, [r is not None for r in refs], constants)


def _is_eager(tensor) -> bool:
  try:
    tensor.name
  except AttributeError:
    return True
  return False


def _ref(tensor) -> tuple[str, int]:
  return tensor.op.name, tensor.value_index


def _zero_cotangent(x):
  dtype = np.dtype(x.dtype)
  if np.issubdtype(dtype, np.inexact) or dtype.name == "bfloat16":
    return jnp.zeros(x.shape, dtype)
  return np.zeros(x.shape, jax.dtypes.float0)


def apply(custom: CustomGradient, runtime: Runtime, inputs: list):
  """The IdentityN outputs, with `custom` as their VJP."""
  primals, fed = inputs[:custom.n_inputs], iter(inputs[custom.n_inputs:])
  n_captures = len(custom.graph.inputs) - len(custom.has_grad)
  captures = [custom.constants[i] if i in custom.constants else next(fed) for i in range(n_captures)]
  # Variables the gradient reads travel as values; refs and constants stay static.
  refs = {i: c for i, c in enumerate(captures) if isinstance(c, VariableRef)}
  var_values = {c.key: runtime.read_variable(c) for c in refs.values()}
  arrays = {i: c for i, c in enumerate(captures) if i not in refs}

  @jax.custom_vjp
  def identity(primals, arrays, var_values):
    return list(primals)

  def fwd(primals, arrays, var_values):
    return list(primals), (primals, arrays, var_values)

  def bwd(res, dys):
    primals, arrays, var_values = res
    dys = [jnp.zeros(p.shape, p.dtype) if dy.dtype == jax.dtypes.float0 else dy for p, dy in zip(primals, dys)]
    args = dys + [refs[i] if i in refs else arrays[i] for i in range(len(captures))]
    grad_runtime = Runtime(custom.library, runtime.config, dict(var_values))
    grads = iter(run_function(custom.graph, args, grad_runtime))
    d_primals = [jnp.asarray(next(grads), p.dtype) if has else _zero_cotangent(p)
                 for p, has in zip(primals, custom.has_grad)]
    return (d_primals, jax.tree.map(_zero_cotangent, arrays), jax.tree.map(_zero_cotangent, var_values))

  identity.defvjp(fwd, bwd)
  return identity([jnp.asarray(p) for p in primals], {i: jnp.asarray(a) for i, a in arrays.items()}, var_values)
