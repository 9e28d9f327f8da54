"""TF1 graphs → JAX: plain or frozen GraphDefs, and graph-level variables of TF1 SavedModels.

`convert_graph_def(graph_def, inputs, outputs)` converts the part of a GraphDef
(a proto or a `.pb`/`.pbtxt`/`.meta` path) that computes `outputs` from `inputs`. v1 control
flow and ref variables are lowered by `v1_control_flow`. Variables become params:
their initial values come from their initializers (`<var>/Assign`) when those are
constant expressions, or from `variables=` (a dict, or a Saver checkpoint's prefix); random
initializers draw from JAX's generator, so their values differ from TF's.
"""
from __future__ import annotations

import inspect
import os
import re
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxport import config as _config
from jaxport.convert import api, checkpoints
from jaxport.convert.graph import GraphFunction, Library, Node, decode_nodes, parse_tensor_name
from jaxport.convert.interpreter import Runtime, run_function
from jaxport.convert.signature import InputSpec, Signature, warn_if_narrowed
from jaxport.convert.v1_control_flow import lower_v1_graph
from jaxport.errors import MissingInputError, UnsupportedOperationsError, UnsupportedValueError

VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})
_ASSIGN_OPS = frozenset({"Assign", "AssignVariableOp"})


def load_graph_def(graph_def_or_path) -> Any:
  """A `GraphDef` proto from itself, a MetaGraphDef (a Saver's `.meta` file, or the proto), a binary
  `.pb` file or a text `.pbtxt` file."""
  tf = api._tf()
  if isinstance(graph_def_or_path, tf.compat.v1.GraphDef):
    return graph_def_or_path
  if isinstance(graph_def_or_path, tf.compat.v1.MetaGraphDef):
    return graph_def_or_path.graph_def
  path = os.fspath(graph_def_or_path)
  proto = tf.compat.v1.MetaGraphDef() if path.endswith(".meta") else tf.compat.v1.GraphDef()
  with open(path, "rb") as f:
    data = f.read()
  if path.endswith((".pbtxt", ".txt")):
    from google.protobuf import text_format
    text_format.Parse(data.decode("utf-8"), proto)
  else:
    proto.ParseFromString(data)
  return proto.graph_def if path.endswith(".meta") else proto


def variable_key(node: Node) -> str:
  """The params key of a graph-level variable node: a ref variable's node name, a `VarHandleOp`'s
  shared name (else its node name), as their op rules key them."""
  if node.op == "VarHandleOp":
    return node.attrs.get("shared_name") or node.name
  return node.name


def _graph_variables(graph: GraphFunction, library: Library) -> dict[str, Node]:
  return {variable_key(node): node for _, node in api._live_nodes(graph, library) if node.op in VARIABLE_OPS}


def _initial_values(nodes: dict[str, Node], library: Library, variables: dict[str, Node]) -> dict[str, Any]:
  """Each variable's value from its initializer, when the initializer runs without inputs."""
  found = {}
  for key, var in variables.items():
    init = nodes.get(f"{var.name}/Assign")
    if init is None or init.op not in _ASSIGN_OPS:
      init = next((n for n in nodes.values() if n.op in _ASSIGN_OPS and n.inputs and n.inputs[0][0] == var.name), None)
    if init is None:
      continue
    fn = GraphFunction(f"{var.name}/initializer", nodes, [], [init.inputs[1]])
    try:
      value, = run_function(fn, [], Runtime(library, _config.snapshot(), {}, jax.random.key(0)))
    except Exception:   # noqa: BLE001 -- an initializer that needs inputs or other variables
      continue
    found[key] = api.Variable(np.asarray(value), name=f"{var.name}:0")
  return found


def convert_graph_def(graph_def, inputs: Sequence[str], outputs: str | Sequence[str], *,
                      variables: Mapping[str, Any] | str | os.PathLike | None = None) -> tuple[api.ConvertedFunction, dict]:
  """Converts the subgraph of `graph_def` from `inputs` to `outputs` (tensor names, `"x:0"` or `"x"`).

  Returns `(jax_fn, params)`; `jax_fn(params, *inputs, rng=None)` returns `(outputs, new_params)`
  (one output when `outputs` is a string, else a list; a name `"^op"` runs `op` for its effects,
  such as a train op, and returns nothing). Graph variables (`VariableV2`,
  `VarHandleOp`) are params keyed by name; `variables` sets or overrides their values: a dict, or
  the prefix of a `tf.compat.v1.train.Saver` checkpoint (`graph_def` then often its `.meta` file),
  read as the graph's Saver restores it (`convert/checkpoints.py`).
  A `PlaceholderWithDefault` that is not among `inputs` keeps its default.
  """
  graph_def = load_graph_def(graph_def)
  library = Library(graph_def.library.function)
  nodes = decode_nodes(graph_def.node)
  input_names = []
  for ref in inputs:
    name, idx = parse_tensor_name(ref)
    if name not in nodes or idx != 0:
      raise MissingInputError(f"input {ref!r} is not the first output of a node of the graph; "
                              "name a Placeholder (or any node's output 0) such as 'x:0'")
    node = nodes[name]
    if node.op != "Placeholder":   # feeding any tensor cuts the graph there
      dtype = node.attrs.get("dtype", node.attrs.get("T"))
      nodes[name] = Node(name, "Placeholder", [], [], {"dtype": dtype, "shape": node.attrs.get("shape")})
    input_names.append(name)
  single = isinstance(outputs, str)
  names = [outputs] if single else list(outputs)
  controls = [o[1:] for o in names if o.startswith("^")]   # ops run for their effects (a train op)
  output_refs = [parse_tensor_name(o) for o in names if not o.startswith("^")]
  for name in [n for n, _ in output_refs] + controls:
    if name not in nodes:
      raise MissingInputError(f"output {name!r} is not a node of the graph")
  raw_nodes = dict(nodes)
  graph = lower_v1_graph(GraphFunction("main", nodes, input_names, output_refs, controls), library)

  conf = _config.snapshot()
  uses = api._op_uses(graph, library)
  missing = api._unsupported(uses, library, conf, api._host_handed(graph, library, conf))
  if missing:
    raise UnsupportedOperationsError(missing)
  api._check_nodes([(graph, library)], conf)

  graph_vars = _graph_variables(graph, library)
  params = _initial_values(raw_nodes, library, graph_vars)
  if checkpoints.is_checkpoint(variables):   # a Saver's checkpoint prefix
    variables = checkpoints.checkpoint_values(variables, raw_nodes, graph_vars)
  for key, value in (variables or {}).items():
    params[key] = api.Variable(np.asarray(value), name=key)
  from jaxport.convert.ops import random as random_ops
  streams = random_ops.stream_params(api._live_nodes(graph, library), library, conf)
  params.update({k: api.Variable(v, name=k, trainable=False) for k, v in streams.items()})
  specs = []
  for name in input_names:
    attrs = graph.nodes[name].attrs
    shape = attrs.get("shape")
    specs.append(InputSpec(name, None if shape is None else tuple(shape), np.dtype(attrs.get("dtype") or np.float32)))
  structure = (tuple(np.zeros((), s.dtype) for s in specs), {})
  param_specs = {key: _spec(node) for key, node in graph_vars.items()}
  param_specs.update({k: jax.ShapeDtypeStruct(v.shape, jax.dtypes.canonicalize_dtype(v.dtype))
                      for k, v in params.items()})
  jax_fn = api.ConvertedFunction(
      graph, library, signature=Signature(structure, specs, {}), input_structure=structure,
      captures=[], output_structure=0 if single else [0] * len(output_refs),
      output_leaves=list(range(len(output_refs))), param_specs=param_specs, config=conf,
      requires_rng=random_ops.needs_caller_rng(uses, streams), name="graph_def")
  _annotate(jax_fn, specs, [graph.nodes[n] for n, _ in output_refs], single)
  warn_if_narrowed(specs, jax_fn.structured_outputs, params)
  jax_fn.params = params
  jax_fn.tf_variables = {}
  jax_fn.trainable = {k: k not in streams for k in params}
  return jax_fn, params


def _annotate(jax_fn, specs: list[InputSpec], output_nodes: list[Node], single: bool) -> None:
  """tf2jax's metadata, as `convert` sets it: TensorSpecs of the inputs and outputs, a signature."""
  tf = api._tf()
  jax_fn.structured_inputs = (tuple(tf.TensorSpec(s.shape, tf.as_dtype(s.dtype), name=s.path) for s in specs), {})
  outputs = []
  for node in output_nodes:   # a GraphDef records no output shapes: dtypes only, where the node says
    dtype = node.attrs.get("T", node.attrs.get("dtype"))
    dtype = tf.as_dtype(dtype) if isinstance(dtype, np.dtype) else tf.float32
    outputs.append(tf.TensorSpec(None, dtype, name=node.name))
  jax_fn.structured_outputs = outputs[0] if single else outputs
  names: list[str] = []
  for spec in specs:
    name = re.sub(r"\W", "_", spec.path)
    name = name if name and not name[0].isdigit() else f"_{name}"
    while name in names:
      name += "_"
    names.append(name)
  jax_fn.__signature__ = inspect.Signature(   # the graph's inputs, as `convert` gives the TF function's
      [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names])


def convert_functional_graph_def(graph_def, inputs: Sequence[str], outputs: str | Sequence[str]) -> Callable:
  """Like `convert_graph_def` for graphs without variables (frozen graphs): returns `f(*inputs, rng=None)`."""
  return api._functional(*convert_graph_def(graph_def, inputs, outputs))


def _spec(node: Node) -> jax.ShapeDtypeStruct:
  shape = node.attrs.get("shape")
  if shape is None or any(d is None for d in shape):
    raise UnsupportedValueError(f"variable {node.name!r} has no fully known shape; jaxport needs it to "
                                "check params. Give the variable a static shape.")
  return jax.ShapeDtypeStruct(tuple(shape), jax.dtypes.canonicalize_dtype(node.attrs["dtype"]))


def graph_level_params(cf, graph: GraphFunction, library: Library, exclude=()) -> tuple[dict, dict]:
  """Variables that live in a traced graph itself (a TF1 SavedModel's `VariableV2`, a `VarHandleOp`
  of an imported GraphDef): `(values, specs)`, with the values TF can read (an uninitialized
  variable has a spec but no value: the caller passes it in params)."""
  tf = api._tf()
  found: dict[str, Any] = {}
  specs: dict[str, jax.ShapeDtypeStruct] = {}
  for node in graph.live_nodes():   # the top level only: a library function's own variables stay unkeyed
    key = variable_key(node)
    shape = node.attrs.get("shape")
    if node.op not in VARIABLE_OPS or key in exclude or shape is None or None in shape:
      continue
    specs[key] = _spec(node)
    prune = getattr(cf, "prune", None)
    if prune is None:
      continue
    try:
      tensor = cf.graph.get_tensor_by_name(f"{node.name}:0")
      with cf.graph.as_default():
        read = (tf.raw_ops.ReadVariableOp(resource=tensor, dtype=node.attrs["dtype"])
                if node.op == "VarHandleOp" else tf.identity(tensor))
      value = prune([], [read])()[0].numpy()
    except Exception:   # noqa: BLE001 -- an uninitialized variable: the caller passes its value
      continue
    found[key] = api.Variable(value, name=f"{node.name}:0")
  return found, specs
