"""tf2jax-compatible entry points: TF functions, Keras models, SavedModels → JAX."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax.numpy as jnp
import numpy as np
import tree

from jaxport import config as _config
from jaxport.convert import custom_gradient
from jaxport.convert.graph import FuncAttr, GraphFunction, Library, decode_nodes
from jaxport.convert.interpreter import Runtime, VariableRef, run_function
from jaxport.convert.registry import Tier, get_rule, ops_where
from jaxport.convert.tiers import GRAPH_INPUT_OPS, op_tier
from jaxport.errors import (DtypeMismatchError, MissingInputError, ShapeMismatchError,
                            SignatureError, UnsupportedOperationsError)


class Variable(np.ndarray):
  """A parameter value that remembers its TF variable's name and `trainable` flag."""

  def __new__(cls, value, *, name: str = "", trainable: bool = True):
    obj = np.asarray(value).view(cls)
    obj.name, obj.trainable = name, trainable
    return obj

  def __array_finalize__(self, obj):
    self.name = getattr(obj, "name", "")
    self.trainable = getattr(obj, "trainable", True)


@dataclasses.dataclass(frozen=True)
class InputSpec:
  path: str
  shape: tuple[int | None, ...] | None
  dtype: np.dtype


class ConvertedFunction:
  """`f(params, *args, rng=None, **kwargs) -> (outputs, new_params)`.

  Attributes: `params` holds the initial values (as `Variable`s), `trainable`
  maps each parameter to its flag, `tf_variables` to its source tf.Variable,
  `requires_rng` says whether `rng` is needed.
  """

  def __init__(self, graph: GraphFunction, library: Library, *, input_specs, static_leaves,
               input_structure, captures, output_structure, output_leaves, param_keys,
               config, requires_rng, name, custom_gradients=None):
    self._graph, self._library = graph, library
    self._custom_gradients = custom_gradients or {}
    self._input_specs = input_specs          # one per tensor leaf of (args, kwargs)
    self._static_leaves = static_leaves      # leaf index -> value kept static at trace time
    self._input_structure = input_structure
    self._captures = captures                # VariableRef or constant, per captured input
    self._output_structure = output_structure
    self._output_leaves = output_leaves      # index into graph outputs, or ("static", value)
    self.param_keys = tuple(param_keys)
    self._config = config
    self.requires_rng = requires_rng
    self.__name__ = name

  def __call__(self, params, *args, rng=None, **kwargs):
    params = dict(params) if params is not None else {}
    missing = [k for k in self.param_keys if k not in params]
    if missing:
      raise MissingInputError(f"params is missing {len(missing)} parameter(s): {', '.join(missing)}. "
                              "Pass the params returned by jaxport.convert.")
    if self.requires_rng and rng is None:
      raise MissingInputError("this function uses random ops and needs a PRNG key: pass rng=jax.random.key(seed)")
    inputs = self._flatten_inputs(args, kwargs)
    state = {k: jnp.asarray(params[k]) for k in self.param_keys}
    runtime = Runtime(self._library, self._config, state, rng, self._custom_gradients)
    outs = run_function(self._graph, inputs + list(self._captures), runtime)
    leaves = [leaf[1] if isinstance(leaf, tuple) else jnp.asarray(outs[leaf]) for leaf in self._output_leaves]
    outputs = tree.unflatten_as(self._output_structure, leaves)
    new_params = dict(params)
    new_params.update(runtime.state)
    return outputs, new_params

  def _flatten_inputs(self, args, kwargs) -> list:
    leaves = tree.flatten((args, kwargs))
    n_expected = len(self._input_specs) + len(self._static_leaves)
    if len(leaves) < n_expected:
      names = ", ".join(s.path for s in self._input_specs)
      raise MissingInputError(f"expected {n_expected} input leaves ({names}), got {len(leaves)}; "
                              "call with the same structure of arguments used for conversion.")
    try:
      tree.assert_same_structure(self._input_structure, (args, kwargs), check_types=False)
    except (ValueError, TypeError) as e:
      raise MissingInputError(f"inputs do not match the traced structure: {e}") from None
    tensors = [x for i, x in enumerate(leaves) if i not in self._static_leaves]
    out = []
    for spec, x in zip(self._input_specs, tensors):
      x = jnp.asarray(x)
      self._check_input(spec, x)
      out.append(x)
    return out

  def _check_input(self, spec: InputSpec, x) -> None:
    if self._config["strict_shape_check"] and spec.shape is not None:
      got = tuple(x.shape)
      if len(got) != len(spec.shape) or any(e is not None and e != g for e, g in zip(spec.shape, got)):
        expected = "(" + ", ".join(str(d) for d in spec.shape) + ("," if len(spec.shape) == 1 else "") + ")"
        raise ShapeMismatchError(
            f"input {spec.path}: expected shape {expected}, got {got}. Convert with a TensorSpec whose "
            "free dims are None, or disable the check with override_config('strict_shape_check', False).")
    if self._config["strict_dtype_check"] and np.dtype(x.dtype) != spec.dtype:
      raise DtypeMismatchError(f"input {spec.path}: expected dtype {spec.dtype}, got {np.dtype(x.dtype)}.")


# --------------------------------------------------------------------------- tracing


def _tf():
  try:
    import tensorflow as tf
  except ImportError as e:
    raise ImportError("converting TensorFlow functions needs TensorFlow: pip install 'jaxport[tf]'") from e
  return tf


def _is_keras_object(fn) -> bool:
  return "keras" in type(fn).__module__ and callable(fn)


def _keras_objects(fn) -> list:
  """`fn` if it is a Keras model or layer, else the ones it closes over or names as globals."""
  if _is_keras_object(fn):
    return [fn]
  fn = getattr(fn, "python_function", fn)   # a tf.function
  found = [getattr(fn, "__self__", None)]
  for cell in getattr(fn, "__closure__", None) or ():
    try:
      found.append(cell.cell_contents)
    except ValueError:   # an empty cell
      pass
  code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
  found += [scope.get(name) for name in (code.co_names if code else ())]
  return [obj for obj in found if obj is not None and _is_keras_object(obj)]


class KerasVariable(NamedTuple):
  path: str | None   # Keras 3's variable path (`dense/kernel`); tf_keras leaves naming to TF
  trainable: bool    # Keras's flag: freezing a layer leaves the tf.Variable's own flag True


def _keras_variables(fn) -> dict[int, KerasVariable]:
  """What Keras knows about the variables of the Keras objects in `fn`, by resource handle id."""
  found = {}
  for obj in _keras_objects(fn):
    trainable = {id(h) for h in map(_handle, getattr(obj, "trainable_variables", None) or []) if h is not None}
    for v in getattr(obj, "variables", None) or []:
      handle = _handle(v)
      if handle is not None:
        found[id(handle)] = KerasVariable(getattr(v, "path", None), id(handle) in trainable)
  return found


def _handle(variable):
  """The resource handle behind a Keras 3 variable (its TF `_value`) or a tf_keras tf.Variable."""
  return getattr(getattr(variable, "_value", variable), "handle", None)


def _is_static_leaf(x) -> bool:
  """Leaves that stay Python values in the trace (e.g. `training=True`), not tensor inputs."""
  return isinstance(x, (bool, str, bytes)) or x is None


def _to_spec(x):
  tf = _tf()
  if isinstance(x, tf.TensorSpec):
    return x
  if _is_static_leaf(x):
    return x
  if isinstance(x, float):
    return tf.TensorSpec((), tf.float32)
  if isinstance(x, int):
    return tf.TensorSpec((), tf.int32)
  if isinstance(x, tf.Tensor):
    return tf.TensorSpec(x.shape, x.dtype)
  if hasattr(x, "shape") and hasattr(x, "dtype"):
    return tf.TensorSpec(tuple(x.shape), tf.as_dtype(np.dtype(x.dtype)))
  arr = np.asarray(x)
  return tf.TensorSpec(arr.shape, tf.as_dtype(arr.dtype))


def _concrete_function(fn, args, kwargs):
  tf = _tf()
  if isinstance(fn, tf.types.experimental.ConcreteFunction):
    return fn, {}
  keras_variables = _keras_variables(fn)
  if _is_keras_object(fn) and not hasattr(fn, "get_concrete_function"):
    model = fn
    fn = tf.function(lambda *a, **k: model(*a, **k))
  elif not hasattr(fn, "get_concrete_function"):
    fn = tf.function(fn)
  spec_args, spec_kwargs = tree.map_structure(_to_spec, (tuple(args), dict(kwargs)))
  return fn.get_concrete_function(*spec_args, **spec_kwargs), keras_variables


def _path_name(path) -> str:
  """How an error names the leaf at `path` in (args, kwargs): `args[0]['x']`, `scale`."""
  head, *rest = path
  if not rest:
    return "args" if head == 0 else "kwargs"
  name = f"args[{rest[0]}]" if head == 0 else str(rest[0])
  return name + "".join(f"[{p!r}]" for p in rest[1:])


def _live_functions(graph: GraphFunction, library: Library, missing: dict[str, list[str]] | None = None):
  """`graph` and every library function it can call (calls to functions missing from the
  library are added to `missing`: name -> callers)."""
  seen: set[str] = set()
  pending = [graph]
  while pending:
    fn = pending.pop()
    yield fn
    for node in fn.live_nodes():
      called = [f.name for value in node.attrs.values() for f in (value if isinstance(value, list) else [value])
                if isinstance(f, FuncAttr)]
      if node.op in library:   # direct function-name ops
        called.append(node.op)
      for name in called:
        if name in seen:
          continue
        seen.add(name)
        if name in library:
          pending.append(library[name])
        elif missing is not None:
          missing.setdefault(name, []).append(node.name)


def _live_nodes(graph: GraphFunction, library: Library, missing: dict[str, list[str]] | None = None):
  """Every node that can run, as `(label, node)`, across the functions `graph` calls."""
  for fn in _live_functions(graph, library, missing):
    for node in fn.live_nodes():
      yield (node.name if fn is graph else f"{fn.name}/{node.name}"), node


def _op_uses(graph: GraphFunction, library: Library) -> dict[str, list[str]]:
  """Every op type that can run, with the nodes that use it, across the functions `graph` calls.

  A call to a function missing from the library counts as the op `<missing function NAME>`.
  """
  uses: dict[str, list[str]] = {}
  missing: dict[str, list[str]] = {}
  for label, node in _live_nodes(graph, library, missing):
    uses.setdefault(node.op, []).append(label)
  for name, callers in missing.items():
    uses.setdefault(f"<missing function {name}>", []).extend(callers)
  return uses


def _check_nodes(graphs: list[tuple[GraphFunction, Library]], config) -> None:
  """Runs the conversion-time check of every live node's rule (`register(..., check=fn)`).

  `graphs` holds `(graph, library)` pairs: the function and its custom gradients.
  """
  for graph, library in graphs:
    for label, node in _live_nodes(graph, library):
      rule = get_rule(node.op)
      if rule is None or rule.check is None or node.op in library or op_tier(node.op, config) != rule.tier:
        continue
      try:
        rule.check(node)
      except Exception as e:
        e.add_note(f"while converting {node.op} node {label!r}")
        raise


def _custom_gradients(cf, graph: GraphFunction, library: Library, variable_ref) -> dict:
  """The custom gradients of every function that can run, the top level's and the library's
  (a restored SavedModel calls its function through a library function)."""
  found = {}
  for fn in list(_live_functions(graph, library)):
    if any(custom_gradient.is_boundary(node) for node in fn.nodes.values()):
      from jaxport.convert import _tf_compat
      tf_graph = cf.graph if fn is graph else _tf_compat.function_def_to_func_graph(library.function_def(fn.name))
      found.update(custom_gradient.prepare(tf_graph, fn, variable_ref))
  return found


def _unsupported(uses: dict[str, list[str]], library: Library, config) -> dict[str, list[str]]:
  """The op types of `uses` that no tier can convert."""
  return {op: nodes for op, nodes in uses.items()
          if op not in GRAPH_INPUT_OPS and op not in library and op_tier(op, config) == Tier.UNSUPPORTED}


class _ParamCollector:
  """Names each captured tf.Variable once and collects its value into `params`."""

  def __init__(self, cf, keras_variables: dict[int, KerasVariable]):
    self._variables = {id(v.handle): v for v in cf.variables}
    self._keras_variables = keras_variables
    self._refs: dict[int, VariableRef] = {}
    self.params: dict[str, Variable] = {}
    self.tf_variables: dict = {}

  def ref(self, handle, what: str, variables=()) -> VariableRef:
    """The VariableRef of the variable behind an eager resource `handle`."""
    if id(handle) not in self._refs:
      var = self._variables.get(id(handle))
      if var is None:
        var = next((v for v in variables if v.handle is handle), None)
      if var is None:
        raise TypeError(f"{what} is not a tf.Variable (tables and iterators cannot be converted); "
                        "pass its contents as an input instead")
      keras = self._keras_variables.get(id(handle))
      key = base = (keras and keras.path) or var.name.split(":")[0]
      n = 1
      while key in self.params:
        key, n = f"{base}_{n}", n + 1
      trainable = keras.trainable if keras else var.trainable
      self.params[key] = Variable(var.numpy(), name=var.name, trainable=trainable)
      self.tf_variables[key] = var
      self._refs[id(handle)] = VariableRef(key)
    return self._refs[id(handle)]


def _decode_graph(cf):
  """The top-level graph of a concrete function, its library, and how outputs map to it."""
  tf = _tf()
  graph_def = cf.graph.as_graph_def()
  library = Library(graph_def.library.function)
  nodes = decode_nodes(graph_def.node)
  # cf.outputs holds the tensor leaves of structured_outputs in flattening order
  # (restored functions describe those leaves with TensorSpecs).
  output_refs, output_leaves = [], []
  for leaf in tree.flatten(cf.structured_outputs):
    if isinstance(leaf, (tf.Tensor, tf.TensorSpec)):
      ref = cf.outputs[len(output_refs)]
      output_leaves.append(len(output_refs))
      output_refs.append((ref.op.name, ref.value_index))
    elif hasattr(leaf, "_type_spec") or isinstance(leaf, tf.TypeSpec):
      raise TypeError(f"output {leaf!r} is a composite tensor; return dense tensors instead")
    else:
      output_leaves.append(("static", leaf))
  graph = GraphFunction("main", nodes, [t.op.name for t in cf.inputs], output_refs, [])
  return graph, library, output_leaves


def unsupported_in_concrete(cf) -> dict[str, list[str]]:
  """Unsupported op types of a concrete function, with the nodes that use them."""
  graph, library, _ = _decode_graph(cf)
  return _unsupported(_op_uses(graph, library), library, _config.snapshot())


def _from_concrete(cf, keras_variables: dict[int, KerasVariable], input_structure, static_leaves) -> tuple[ConvertedFunction, dict]:
  tf = _tf()
  conf = _config.snapshot()
  graph, library, output_leaves = _decode_graph(cf)
  n_user = len(cf.inputs) - len(cf.captured_inputs)
  user_inputs, captured_inputs = cf.inputs[:n_user], cf.inputs[n_user:]

  # Captured inputs: variables become params, captured tensors become constants.
  collector = _ParamCollector(cf, keras_variables)
  by_internal = {id(internal): external for external, internal in cf.graph.captures}
  captures = []
  for internal in captured_inputs:
    external = by_internal.get(id(internal))
    if external is None:
      raise TypeError(f"captured input {internal.name} has no external value")
    if external.dtype == tf.resource:
      captures.append(collector.ref(external, f"captured resource {internal.name}"))
    else:
      captures.append(np.asarray(external.numpy()))
  custom_gradients = _custom_gradients(cf, graph, library, collector.ref) if conf["convert_custom_gradient"] else {}
  params, tf_variables = collector.params, collector.tf_variables

  uses = _op_uses(graph, library)
  missing = _unsupported(uses, library, conf)
  if missing:
    raise UnsupportedOperationsError(missing)
  _check_nodes([(graph, library)] + [(g.graph, g.library) for g in custom_gradients.values()], conf)

  specs = []
  leaf_paths = [p for i, (p, _) in enumerate(tree.flatten_with_path(input_structure)) if i not in static_leaves]
  for path, t in zip(leaf_paths, user_inputs):
    shape = None if t.shape.rank is None else tuple(t.shape.as_list())
    specs.append(InputSpec(_path_name(path), shape, np.dtype(t.dtype.as_numpy_dtype)))

  jax_fn = ConvertedFunction(
      graph, library, input_specs=specs, static_leaves=static_leaves, input_structure=input_structure,
      captures=captures, output_structure=tree.map_structure(lambda _: 0, cf.structured_outputs),
      output_leaves=output_leaves,
      param_keys=list(params), config=conf, requires_rng=bool(ops_where(needs_rng=True).intersection(uses)),
      name=_text(getattr(cf, "name", "converted")), custom_gradients=custom_gradients)
  jax_fn.params = params
  jax_fn.tf_variables = tf_variables   # the TF variable behind each params key
  jax_fn.trainable = {k: bool(v.trainable) for k, v in params.items()}
  return jax_fn, params


def _text(name) -> str:
  return name.decode() if isinstance(name, bytes) else str(name)


def _static_leaf_indices(args, kwargs) -> dict[int, Any]:
  return {i: x for i, x in enumerate(tree.flatten((tuple(args), dict(kwargs)))) if _is_static_leaf(x)}


# --------------------------------------------------------------------------- public API


def convert(fn: Callable, *args, **kwargs) -> tuple[ConvertedFunction, dict[str, Variable]]:
  """Converts `fn` (tf.function, Python callable of TF ops, Keras model, restored
  SavedModel function) traced with example `args`/`kwargs` (arrays or TensorSpecs).

  Returns `(jax_fn, params)` where `jax_fn(params, *args, rng=None, **kwargs)`
  returns `(outputs, new_params)`.
  """
  cf, keras_variables = _concrete_function(fn, args, kwargs)
  structure = (tuple(args), dict(kwargs))
  return _from_concrete(cf, keras_variables, structure, _static_leaf_indices(args, kwargs))


def _functional(jax_fn: ConvertedFunction, params: dict):
  if params:
    raise ValueError(f"the function captures {len(params)} variable(s) ({', '.join(list(params)[:5])}"
                     f"{', ...' if len(params) > 5 else ''}); use jaxport.convert, which returns them as params.")

  def functional(*args, rng=None, **kwargs):
    return jax_fn({}, *args, rng=rng, **kwargs)[0]

  functional.__name__ = jax_fn.__name__
  functional.requires_rng = jax_fn.requires_rng
  return functional


def convert_functional(fn: Callable, *args, **kwargs) -> Callable:
  """Like `convert` for functions that capture no variables: returns `f(*args, rng=None, **kwargs)`."""
  return _functional(*convert(fn, *args, **kwargs))


def _single_concrete(restored_fn):
  tf = _tf()
  if isinstance(restored_fn, tf.types.experimental.ConcreteFunction):
    return restored_fn
  concrete = list(getattr(restored_fn, "concrete_functions", None) or [])
  if not concrete and hasattr(restored_fn, "_list_all_concrete_functions_for_serialization"):
    concrete = restored_fn._list_all_concrete_functions_for_serialization()
  if len(concrete) != 1:
    sigs = "\n".join(f"  {cf.structured_input_signature}" for cf in concrete) or "  (none)"
    raise SignatureError(f"expected exactly one concrete signature, found {len(concrete)}:\n{sigs}\n"
                         "Use jaxport.convert(restored_fn, *example_args) to pick one by tracing.")
  return concrete[0]


def convert_from_restored(restored_fn) -> tuple[ConvertedFunction, dict[str, Variable]]:
  """Converts a restored SavedModel function with a single concrete signature, without retracing."""
  cf = _single_concrete(restored_fn)
  args, kwargs = cf.structured_input_signature
  return _from_concrete(cf, {}, (tuple(args), dict(kwargs)), _static_leaf_indices(args, kwargs))


def convert_functional_from_restored(restored_fn) -> Callable:
  return _functional(*convert_from_restored(restored_fn))


def get_unsupported_operations(op_names) -> set[str]:
  """The op names in `op_names` that no conversion tier can take (with the current config)."""
  conf = _config.snapshot()
  return {op for op in op_names if op not in GRAPH_INPUT_OPS and op_tier(op, conf) == Tier.UNSUPPORTED}
