"""A TF-free view of a GraphDef and its function library.

Protos are decoded once, at conversion time, into plain Python: dtypes become
NumPy dtypes, tensors become NumPy arrays, functions are referred to by name.
Running a converted function never touches TensorFlow.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

# Non-numeric TF dtypes keep their name; everything else is a NumPy dtype.
RESOURCE = "resource"
VARIANT = "variant"

# TF's quantized dtypes have no JAX dtype: their values are held as their storage integers.
QUANTIZED_STORAGE = {"qint8": np.dtype(np.int8), "quint8": np.dtype(np.uint8), "qint16": np.dtype(np.int16),
                     "quint16": np.dtype(np.uint16), "qint32": np.dtype(np.int32)}


def numpy_dtype(tf_dtype) -> np.dtype:
  """The NumPy dtype values of `tf_dtype` (a tf.DType, DataType enum or name) are held in: NumPy's own
  for numeric types, the storage integer for quantized ones (TF's NumPy view is a structured dtype)."""
  import tensorflow as tf
  dt = tf.dtypes.as_dtype(tf_dtype)
  return QUANTIZED_STORAGE.get(dt.name) or np.dtype(dt.as_numpy_dtype)


def storage_array(value) -> np.ndarray:
  """`value` (a NumPy array, possibly of TF's structured quantized dtype) with quantized values viewed
  as their storage integers; other arrays unchanged."""
  value = np.asarray(value)
  if value.dtype.names and len(value.dtype.names) == 1 and value.dtype.names[0] in QUANTIZED_STORAGE:
    return value.view(QUANTIZED_STORAGE[value.dtype.names[0]])
  return value


@dataclasses.dataclass(frozen=True)
class FuncAttr:
  """A function-valued attribute (`then_branch`, `body`, `f`, ...)."""
  name: str
  attrs: dict[str, Any]


@dataclasses.dataclass
class Node:
  name: str
  op: str
  inputs: list[tuple[str, int]]   # (producer node, output index)
  control_inputs: list[str]
  attrs: dict[str, Any]
  node_def: bytes = b""   # the serialized NodeDef, for tiers that hand the node back to TF

  def __hash__(self):
    return id(self)


@dataclasses.dataclass
class GraphFunction:
  """One graph (the top level or a library function) ready to interpret."""
  name: str
  nodes: dict[str, Node]
  inputs: list[str]                 # placeholder node names, in argument order
  outputs: list[tuple[str, int]]
  control_outputs: list[str] = dataclasses.field(default_factory=list)
  _schedule: Any = None
  memo: dict = dataclasses.field(default_factory=dict, repr=False)   # per-function caches

  def schedule(self):
    """Live nodes in topological order, and which values die after each node.

    Only nodes that the outputs (or control outputs) depend on are kept, so dead
    nodes never run. Values are freed after their last consumer.
    """
    if self._schedule is None:
      self._schedule = _make_schedule(self)
    return self._schedule

  def live_nodes(self):
    return [self.nodes[name] for name, _ in self.schedule()[0]]


def dependency_order(roots, deps) -> list[str]:
  """The nodes `roots` depend on (themselves included), each after its `deps(name)`; iterative DFS."""
  order: list[str] = []
  state: dict[str, int] = {}   # 1 = visiting, 2 = done
  for root in roots:
    stack = [(root, False)]
    while stack:
      name, expanded = stack.pop()
      if expanded:
        state[name] = 2
        order.append(name)
        continue
      if state.get(name):
        continue
      state[name] = 1
      stack.append((name, True))
      for dep in deps(name):
        if not state.get(dep):
          stack.append((dep, False))
  return order


def _make_schedule(fn: GraphFunction):
  roots = [n for n, _ in fn.outputs] + list(fn.control_outputs)
  order = dependency_order(roots, lambda name: [src for src, _ in fn.nodes[name].inputs]
                           + fn.nodes[name].control_inputs)
  keep = {n for n, _ in fn.outputs}
  last_use: dict[str, int] = {}
  for i, name in enumerate(order):
    for src, _ in fn.nodes[name].inputs:
      last_use[src] = i
  frees: list[list[str]] = [[] for _ in order]
  for src, i in last_use.items():
    if src not in keep:
      frees[i].append(src)
  return list(zip(order, frees)), set(order)


def parse_tensor_name(ref: str) -> tuple[str, int]:
  name, _, idx = ref.partition(":")
  return name, int(idx) if idx else 0


def _decode_dtype(enum: int):
  import tensorflow as tf
  dt = tf.dtypes.as_dtype(enum)
  if dt == tf.resource:
    return RESOURCE
  if dt == tf.variant:
    return VARIANT
  if dt == tf.string:
    return np.dtype(object)
  return numpy_dtype(dt)


def _decode_shape(proto) -> tuple[int | None, ...] | None:
  if proto.unknown_rank:
    return None
  return tuple(None if d.size < 0 else int(d.size) for d in proto.dim)


def _decode_tensor(proto) -> np.ndarray:
  import tensorflow as tf
  if proto.dtype in (tf.resource.as_datatype_enum, tf.variant.as_datatype_enum):
    raise TypeError(f"constant tensors of dtype {tf.dtypes.as_dtype(proto.dtype).name} cannot be converted")
  return storage_array(tf.make_ndarray(proto))


def _decode_str(raw: bytes):
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError:
    return raw


def decode_attr(value) -> Any:
  kind = value.WhichOneof("value")
  if kind == "list":
    lst = value.list
    for field, fn in (("s", _decode_str), ("i", int), ("f", float), ("b", bool),
                      ("type", _decode_dtype), ("shape", _decode_shape),
                      ("tensor", _decode_tensor),
                      ("func", lambda f: FuncAttr(f.name, {k: decode_attr(v) for k, v in f.attr.items()}))):
      items = getattr(lst, field)
      if len(items):
        return [fn(x) for x in items]
    return []
  if kind is None:
    return None
  raw = getattr(value, kind)
  if kind == "s":
    return _decode_str(raw)
  if kind in ("i", "f", "b"):
    return raw
  if kind == "type":
    return _decode_dtype(raw)
  if kind == "shape":
    return _decode_shape(raw)
  if kind == "tensor":
    return _decode_tensor(raw)
  if kind == "func":
    return FuncAttr(raw.name, {k: decode_attr(v) for k, v in raw.attr.items()})
  if kind == "placeholder":
    return raw
  raise TypeError(f"unknown attr kind {kind}")


def decode_nodes(node_defs) -> dict[str, Node]:
  nodes = {}
  for nd in node_defs:
    inputs, controls = [], []
    for ref in nd.input:
      if ref.startswith("^"):
        controls.append(ref[1:])
      else:
        inputs.append(parse_tensor_name(ref))
    attrs = {}
    for key, val in nd.attr.items():
      if key.startswith("_") and key != "_gradient_op_type":
        continue
      try:
        attrs[key] = decode_attr(val)
      except TypeError as e:
        attrs[key] = e  # decoded lazily: only an op rule that reads it fails
    raw = b"" if nd.op == "Const" else nd.SerializeToString()
    nodes[nd.name] = Node(nd.name, nd.op, inputs, controls, attrs, raw)
  return nodes


class Library:
  """The function library of a GraphDef: FunctionDefs decoded on first use."""

  def __init__(self, fdefs):
    self._fdefs = {f.signature.name: f for f in fdefs}
    self._decoded: dict[str, GraphFunction] = {}
    self.memo: dict = {}   # per-library caches of analyses

  def __contains__(self, name: str) -> bool:
    return name in self._fdefs

  def names(self):
    return list(self._fdefs)

  def called_by(self, node: Node) -> list[str]:
    """The functions `node` calls: its function-valued attributes, and its op when that names a function."""
    called = [f.name for value in node.attrs.values() for f in (value if isinstance(value, list) else [value])
              if isinstance(f, FuncAttr)]
    return called + [node.op] if node.op in self else called

  def add(self, fn: GraphFunction) -> None:
    """Adds a function built at conversion time (a recovered v1 loop body or cond branch)."""
    self._fdefs[fn.name] = None   # no FunctionDef behind it
    self._decoded[fn.name] = fn

  def op_types(self) -> set[str]:
    """The op types of every function's nodes."""
    ops = {n.op for fdef in self._fdefs.values() if fdef is not None for n in fdef.node_def}
    return ops.union(*({n.op for n in fn.nodes.values()} for fn in self._decoded.values()))

  def implementation(self, name: str) -> str:
    """The function TF on CPU runs for a call of `name`.

    A function marked `api_implements` (TFP's samplers, Keras' LSTM/GRU) may have siblings
    implementing the same API for a device (`api_preferred_device`); Grappler's implementation
    selector swaps in the one for the device the call runs on. TF's CPU run is the reference,
    so a call runs the CPU sibling (same signature, not a gradient's forward half), provided
    every op it can reach has a native rule; otherwise the function named.
    """
    memo = self.memo.setdefault("implementation", {})
    if name not in memo:
      memo[name] = self._cpu_sibling(name) or name
    return memo[name]

  def _cpu_sibling(self, name: str) -> str | None:
    fdef = self._fdefs.get(name)
    api = _str_attr(fdef, "api_implements") if fdef is not None else ""
    if not api or _str_attr(fdef, "api_preferred_device") == CPU_DEVICE:
      return None
    siblings = sorted(other for other, odef in self._fdefs.items()
                      if odef is not None and _str_attr(odef, "api_implements") == api
                      and _str_attr(odef, "api_preferred_device") == CPU_DEVICE
                      and not {"forward_function_name", "backward_function_name"} & set(odef.attr)
                      and _arg_types(odef) == _arg_types(fdef))
    return next((other for other in siblings if self._runs_natively(other, set())), None)

  def _runs_natively(self, name: str, seen: set[str]) -> bool:
    """Whether every op `name` can reach has a native rule (functions it calls included)."""
    from jaxport.convert.registry import Tier, get_rule
    if name in seen:
      return True
    seen.add(name)
    if self._fdefs[name] is None:
      return False
    for node_def in self._fdefs[name].node_def:
      rule = get_rule(node_def.op)
      if node_def.op in self._fdefs:
        if not self._runs_natively(node_def.op, seen):
          return False
      elif rule is None or rule.tier is not Tier.NATIVE:
        return False
      for value in node_def.attr.values():
        called = [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]
        if not all(f in self._fdefs and self._runs_natively(f, seen) for f in called):
          return False
    return True

  def function_def(self, name: str):
    """The FunctionDef proto of `name`."""
    return self._fdefs[name]

  def __getitem__(self, name: str) -> GraphFunction:
    name = self.implementation(name)
    if name not in self._decoded:
      if name not in self._fdefs:
        raise KeyError(f"function {name!r} is not in the graph's library")
      self._decoded[name] = _decode_function(self._fdefs[name], self._fdefs)
    return self._decoded[name]


CPU_DEVICE = "CPU"


def _str_attr(fdef, key: str) -> str:
  value = fdef.attr.get(key)
  return value.s.decode() if value is not None else ""


def _arg_types(fdef) -> tuple:
  signature = fdef.signature
  return tuple((arg.type, arg.type_attr, arg.number_attr, arg.type_list_attr)
               for args in (signature.input_arg, signature.output_arg) for arg in args)


def _decode_function(fdef, library: dict) -> GraphFunction:
  from jaxport.convert import _tf_compat
  graph_def, flat_names = _tf_compat.function_def_to_graph_def(fdef, library)
  nodes = decode_nodes(graph_def.node)
  inputs = [arg.name for arg in fdef.signature.input_arg]
  outputs = []
  for arg in fdef.signature.output_arg:
    ref = fdef.ret[arg.name]
    outputs.append(parse_tensor_name(flat_names.get(ref, ref)))
  controls = [fdef.control_ret[arg] for arg in fdef.signature.control_output]
  return GraphFunction(fdef.signature.name, nodes, inputs, outputs, controls)
