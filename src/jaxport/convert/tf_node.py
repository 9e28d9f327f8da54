"""One graph node as a one-node TF function, for the tiers that hand a node back to TF.

`node_function(node, inputs, tier=...)` rebuilds the node from its serialized NodeDef:
inputs that are trace-time constants (NumPy, `ops._util.is_concrete`) are baked in as
`Const` nodes (XLA needs some, such as shapes, at compile time); every other input
becomes an argument with its static shape and TF's dtype. The node and its Consts form
a small GraphDef imported inside a `tf.function`, the arguments wired in by `input_map`.
Built functions are cached by (NodeDef without name and inputs, input shapes/dtypes,
constant values), so equal nodes share one function across graphs and conversions.

Ops with function attributes or resource/variant/ref inputs or outputs are not for these
tiers: they need the graph's library or state, and raise `TierError`.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import threading
from typing import Any, Sequence

import jax
import numpy as np

from jaxport.convert.graph import Node, numpy_dtype
from jaxport.convert.ops._util import is_concrete
from jaxport.errors import TierError

_CACHE_SIZE = 4096
_cache: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


class NodeFunction:
  """A TF function computing one node. Arguments are the node's non-constant inputs, in order."""

  def __init__(self, op: str, node_name: str, graph_def, arg_positions: tuple[int, ...],
               input_dtypes: tuple, arg_shapes: tuple, stateful: bool, shape_hints: tuple | None = None):
    self.op = op
    self.node_name = node_name            # the first node it was built for (for messages)
    self.graph_def = graph_def            # the Consts and the node; arguments come by input_map
    self.arg_positions = arg_positions    # node input index of each argument
    self.input_dtypes = input_dtypes      # TF's dtype (tf.DType) of every node input
    self.arg_shapes = arg_shapes          # static shape of each argument
    self.stateful = stateful
    self.shape_hints = shape_hints        # the graph's `_output_shapes`, where it recorded them
    self.memo: dict[str, Any] = {}        # per-tier caches (the lowered module, ...)
    self._functions: dict[tuple, Any] = {}
    self._concrete = None

  @property
  def arg_dtypes(self) -> tuple:
    return tuple(self.input_dtypes[i] for i in self.arg_positions)

  def arg_specs(self) -> list:
    import tensorflow as tf
    return [tf.TensorSpec(shape, dtype) for shape, dtype in zip(self.arg_shapes, self.arg_dtypes)]

  def _body(self, *args):
    import tensorflow as tf
    input_map = {f"arg_{k}:0": a for k, a in enumerate(args)}
    op, = tf.graph_util.import_graph_def(self.graph_def, input_map=input_map, return_elements=["node"],
                                         name="import")
    return list(op.outputs)

  def tf_function(self, jit_compile: bool = False):
    """The `tf.function` (jit-compiled or not) taking the arguments."""
    key = ("forward", jit_compile)
    if key not in self._functions:
      import tensorflow as tf
      self._functions[key] = tf.function(self._body, autograph=False, jit_compile=jit_compile,
                                         reduce_retracing=False)
    return self._functions[key]

  @property
  def concrete(self):
    """The ConcreteFunction for the argument specs (TF's graph runtime)."""
    if self._concrete is None:
      self._concrete = self.tf_function(False).get_concrete_function(*self.arg_specs())
    return self._concrete

  def output_specs(self) -> list:
    """`(shape or None, tf.DType)` per node output, as TF infers them from the argument shapes.

    Dims TF cannot infer (a py_function's outputs) come from the graph's `_output_shapes`
    when it has them (a `set_shape` in the traced function).
    """
    if "output_specs" not in self.memo:
      specs = []
      for k, t in enumerate(self.concrete.outputs):
        shape = None if t.shape.rank is None else tuple(t.shape.as_list())
        hint = self.shape_hints[k] if self.shape_hints and k < len(self.shape_hints) else None
        if hint is not None and (shape is None or len(shape) == len(hint)):
          shape = hint if shape is None else tuple(h if d is None else d for d, h in zip(shape, hint))
        specs.append((shape, t.dtype))
      self.memo["output_specs"] = specs
    return self.memo["output_specs"]

  def fold(self) -> list[np.ndarray]:
    """Runs a node with no arguments (all inputs constant) in TF now: its outputs as NumPy."""
    if self.arg_positions:
      raise ValueError(f"{self.op} has {len(self.arg_positions)} non-constant inputs; it cannot be folded")
    return [np.asarray(t.numpy()) for t in (self.concrete() or [])]

  def stablehlo(self) -> bytes:
    """TF's XLA lowering of the node as StableHLO bytecode (raises TF's error when it cannot)."""
    fn = self.tf_function(True)
    return fn.experimental_get_compiler_ir(*self.arg_specs())(stage="stablehlo_serialized")

  # The node's VJP by TF's registered gradient: `vjp(*args, *cotangents) -> gradients`,
  # one cotangent per output in `outs`, one gradient per argument in `wrt`.

  def vjp_function(self, wrt: tuple[int, ...], outs: tuple[int, ...], jit_compile: bool = False):
    key = ("vjp", wrt, outs, jit_compile)
    if key not in self._functions:
      import tensorflow as tf
      n = len(self.arg_positions)

      def vjp(*values):   # graph gradients: a tape does not see ops made by import_graph_def
        args, cotangents = values[:n], values[n:]
        results = self._body(*args)
        grads = tf.gradients([results[k] for k in outs], [args[j] for j in wrt], grad_ys=list(cotangents),
                             unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

      self._functions[key] = tf.function(vjp, autograph=False, jit_compile=jit_compile, reduce_retracing=False)
    return self._functions[key]

  def vjp_specs(self, outs: tuple[int, ...]) -> list:
    import tensorflow as tf
    specs = self.output_specs()
    return self.arg_specs() + [tf.TensorSpec(specs[k][0], specs[k][1]) for k in outs]

  def vjp_concrete(self, wrt: tuple[int, ...], outs: tuple[int, ...]):
    """The VJP as a ConcreteFunction (TF's graph runtime)."""
    key = ("vjp_concrete", wrt, outs)
    if key not in self.memo:
      self.memo[key] = self.vjp_function(wrt, outs).get_concrete_function(*self.vjp_specs(outs))
    return self.memo[key]

  def differentiable(self, output_dtypes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(arguments, outputs) with real floating dtypes: where TF's gradient flows.

    Complex dtypes are left out: TF's and JAX's conventions for complex gradients differ.
    """
    wrt = tuple(j for j, d in enumerate(self.arg_dtypes) if _real_float(d))
    outs = tuple(k for k, d in enumerate(output_dtypes) if _real_float(d))
    return wrt, outs

  def gradient_kind(self) -> str:
    """"tf": TF registers a gradient; "zero": TF declares the op non-differentiable; "none": no gradient."""
    from jaxport.convert import _tf_compat
    grad = _tf_compat.registered_gradient(self.op)
    return "zero" if grad is None else "none" if grad is _tf_compat.NO_GRADIENT else "tf"

  def vjp_stablehlo(self, wrt: tuple[int, ...], outs: tuple[int, ...]) -> bytes:
    """TF's XLA lowering of the VJP as StableHLO bytecode."""
    fn = self.vjp_function(wrt, outs, jit_compile=True)
    return fn.experimental_get_compiler_ir(*self.vjp_specs(outs))(stage="stablehlo_serialized")


def _real_float(dtype) -> bool:
  """A real floating dtype: a tf.DType or a NumPy dtype (bfloat16 included)."""
  if hasattr(dtype, "is_floating"):
    return dtype.is_floating
  return not isinstance(dtype, str) and jax.dtypes.issubdtype(dtype, np.floating)


# --------------------------------------------------------------------------- NodeDef analysis


@functools.lru_cache(maxsize=1024)
def _analyse(node_def: bytes) -> tuple:
  """`analyse`'s tuple for a serialized NodeDef and None, or None and why it cannot run."""
  import tensorflow as tf
  from jaxport.convert import _tf_compat

  nd = tf.compat.v1.NodeDef.FromString(node_def)
  op_def = _tf_compat.op_def(nd.op)
  if op_def is None:
    return None, f"TensorFlow does not know the op {nd.op!r} (a custom op whose library is not loaded?)"
  clean = tf.compat.v1.NodeDef(name="node", op=nd.op)
  for key, value in nd.attr.items():
    if not key.startswith("_"):
      clean.attr[key].CopyFrom(value)
  for attr in op_def.attr:   # FunctionDefs drop attrs that have defaults
    if attr.name not in clean.attr and attr.HasField("default_value"):
      clean.attr[attr.name].CopyFrom(attr.default_value)
  funcs = sorted(k for k, v in clean.attr.items() if v.HasField("func") or len(v.list.func))
  if funcs:
    return None, (f"it has function attributes ({', '.join(funcs)}), which need the graph's function "
                  "library")
  if any(arg.is_ref for arg in list(op_def.input_arg) + list(op_def.output_arg)):
    return None, "it takes or returns reference tensors (TF1 variables), which hold TF state"
  try:
    inputs = _arg_dtypes(op_def.input_arg, clean.attr)
    outputs = _arg_dtypes(op_def.output_arg, clean.attr)
  except KeyError as e:
    return None, f"its NodeDef lacks the attribute {e} that sets an input or output dtype"
  bad = sorted({d.name for d in inputs + outputs if d in (tf.resource, tf.variant)})
  if bad:
    return None, f"it takes or returns {'/'.join(bad)} tensors, which hold TF state or structure"
  hints = None
  if "_output_shapes" in nd.attr:
    hints = tuple(None if p.unknown_rank else tuple(d.size if d.size >= 0 else None for d in p.dim)
                  for p in nd.attr["_output_shapes"].list.shape)
  return (clean, nd.op, tuple(inputs), bool(op_def.is_stateful), hints), None


def _arg_dtypes(args, attrs) -> list:
  """The dtype of each flattened input (or output) of an op, from its OpDef args and attrs."""
  import tensorflow as tf
  out = []
  for arg in args:
    if arg.type_list_attr:
      out += [tf.dtypes.as_dtype(t) for t in attrs[arg.type_list_attr].list.type]
      continue
    dtype = tf.dtypes.as_dtype(arg.type if arg.type else attrs[arg.type_attr].type)
    out += [dtype] * (attrs[arg.number_attr].i if arg.number_attr else 1)
  return out


def analyse(node: Node, tier: str) -> tuple:
  """(cleaned NodeDef, op, input dtypes, stateful, output shape hints) of `node`.

  Raises `TierError` if the tier cannot take it.
  """
  if not node.node_def:
    raise TierError(node.op, node.name, tier, "the node carries no NodeDef")
  info, why = _analyse(node.node_def)
  if info is None:
    raise TierError(node.op, node.name, tier, why,
                    "Give the op a native rule (jaxport.convert.registry.register) or avoid it.")
  return info


# --------------------------------------------------------------------------- building and caching


def _const_key(value: np.ndarray) -> tuple:
  if value.dtype == object:
    data = b"\0".join(v if isinstance(v, bytes) else str(v).encode() for v in value.reshape(-1))
  else:
    data = np.ascontiguousarray(value).tobytes()
  return (value.shape, hashlib.blake2b(data, digest_size=16).digest())


def _as_const(value, dtype) -> np.ndarray:
  """A constant input as a NumPy array of TF's dtype."""
  import tensorflow as tf
  if dtype == tf.string:
    return np.asarray(value, dtype=object)
  return np.asarray(value).astype(numpy_dtype(dtype))


def node_function(node: Node, inputs: Sequence[Any], tier: str) -> NodeFunction:
  """The (cached) one-node TF function of `node` for these `inputs`.

  Inputs for which `is_concrete` holds are baked in as Consts; the others need a static
  `.shape` and become arguments. `tier` names the caller in error messages.
  """
  clean, op, dtypes, stateful, hints = analyse(node, tier)
  if len(inputs) != len(dtypes):
    raise TierError(op, node.name, tier, f"it has {len(inputs)} data inputs but its OpDef expects {len(dtypes)}")
  consts: dict[int, np.ndarray] = {}
  shapes: dict[int, tuple] = {}
  for i, x in enumerate(inputs):
    if is_concrete(x):
      consts[i] = _as_const(x, dtypes[i])
    else:
      shapes[i] = tuple(None if d is None else int(d) for d in x.shape)
  key = (clean.SerializeToString(deterministic=True),
         tuple(("c", _const_key(consts[i])) if i in consts else ("a", shapes[i]) for i in range(len(inputs))),
         hints)
  with _lock:
    found = _cache.get(key)
    if found is not None:
      _cache.move_to_end(key)
      return found
  built = _build(node.name, clean, op, dtypes, stateful, hints, consts, shapes)
  with _lock:
    _cache[key] = built
    while len(_cache) > _CACHE_SIZE:
      _cache.popitem(last=False)
  return built


def _build(node_name, clean, op, dtypes, stateful, hints, consts, shapes) -> NodeFunction:
  import tensorflow as tf
  graph_def = tf.compat.v1.GraphDef()
  graph_def.versions.producer = tf.version.GRAPH_DEF_VERSION
  nd = graph_def.node.add()
  nd.CopyFrom(clean)
  positions = []
  for i in range(len(dtypes)):
    if i in consts:
      c = graph_def.node.add(name=f"const_{i}", op="Const")
      c.attr["dtype"].type = dtypes[i].as_datatype_enum
      c.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(consts[i], dtype=dtypes[i]))
      nd.input.append(c.name)
    else:   # not in graph_def: `input_map` feeds it (a dead Placeholder would break XLA)
      nd.input.append(f"arg_{len(positions)}")
      positions.append(i)
  return NodeFunction(op, node_name, graph_def, tuple(positions), dtypes,
                      tuple(shapes[i] for i in positions), stateful, hints)


def no_gradient_error(node: Node) -> LookupError:
  return LookupError(f"TensorFlow has no gradient for {node.op} (node {node.name!r}), so jax.grad cannot "
                     "differentiate through it. Wrap its inputs in tf.stop_gradient, or give the op a "
                     "native rule.")


def clear_cache() -> None:
  """Forgets every built function (tests, or to free TF graphs)."""
  with _lock:
    _cache.clear()
