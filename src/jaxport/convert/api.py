"""tf2jax-compatible entry points: TF functions, Keras models, SavedModels → JAX."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tree

from jaxport import composite
from jaxport import config as _config
from jaxport.call_forms import CallForms
from jaxport.convert import custom_gradient
from jaxport.convert.graph import GraphFunction, Library, decode_nodes, numpy_dtype, storage_array
from jaxport.convert.interpreter import Runtime, VariableRef, has_tracers, run_function
from jaxport.convert.tables import TableRef
from jaxport.convert.ops._util import has_symbolic, stage_dims
from jaxport.convert.registry import Tier, get_rule, ops_where
from jaxport.convert.tiers import GRAPH_INPUT_OPS, host_tier, op_tier
from jaxport.convert.signature import (InputSpec, Signature, composite_kind, check_params, is_static_leaf,
                                       path_name, plain_structure, warn_if_narrowed)
from jaxport.errors import (UnsupportedValueError, MissingInputError, SignatureError, StaticArgumentError,
                            UnsupportedOperationsError)


class Variable(np.ndarray):
  """A parameter value that remembers its TF variable's name and `trainable` flag."""

  def __new__(cls, value, *, name: str = "", trainable: bool = True):
    obj = np.asarray(value).view(cls)
    obj.name, obj.trainable = name, trainable
    return obj

  def __array_finalize__(self, obj):
    self.name = getattr(obj, "name", "")
    self.trainable = getattr(obj, "trainable", True)


class ConvertedFunction(CallForms):
  """`f(params, *args, rng=None, **kwargs) -> (outputs, new_params)`.

  Attributes: `params` holds the initial values (as `Variable`s), `trainable`
  maps each parameter to its flag, `tf_variables` to its source tf.Variable,
  `requires_rng` says whether `rng` is needed.

  Arguments are matched to the traced signature by name. A static argument (`training`,
  a string mode, `None`) that differs from the traced value retraces the TF function
  for that value, as `jax.jit` does for static arguments (a function restored from a
  SavedModel signature cannot retrace: it raises `StaticArgumentError`).

  Call forms (same arguments, same outputs): `f(...)` returns every param, changed or not
  (tf2jax's form; under `jax.jit` each unchanged param is copied unless params are donated);
  `f.with_changed_params(...)` returns `(outputs, changed)`, only the params the call assigned;
  `f.outputs_only(...)` returns the outputs alone. `f.returning(form)` picks one by name.
  """

  def __init__(self, graph: GraphFunction, library: Library, *, signature: Signature, input_structure,
               captures, output_structure, output_leaves, param_specs, config, requires_rng, name,
               custom_gradients=None, retrace=None, uninitialized=None):
    self._graph, self._library = graph, library
    self._custom_gradients = custom_gradients or {}
    self._signature = signature
    self._input_structure = input_structure  # the example (args, kwargs) of the trace
    self._captures = captures                # VariableRef or constant, per captured input
    self._output_structure = output_structure
    self._output_leaves = output_leaves      # index into graph outputs, or ("static", value)
    self._param_specs = param_specs          # key -> ShapeDtypeStruct of its variable
    self.param_keys = tuple(param_specs)
    self._config = config
    self._retrace = retrace                  # (args, kwargs) -> ConvertedFunction, or None
    self._variants: dict = {}                # static values -> retraced ConvertedFunction
    self._warned_params: set[str] = set()
    self._op_by_op: set = set()                     # input shapes whose graph cannot run as one jit (_execute)
    self._uninitialized = uninitialized or {}   # param key -> "VarHandleOp `name`" with no value in TF
    self.requires_rng = requires_rng
    self.__name__ = name

  @property
  def op_types(self) -> frozenset[str]:
    """The TF op types of the converted graph and its functions."""
    if "op_types" not in self._graph.memo:
      self._graph.memo["op_types"] = frozenset({n.op for n in self._graph.nodes.values()}
                                               | self._library.op_types())
    return self._graph.memo["op_types"]

  @property
  def has_convolutions(self) -> bool:
    """Whether the graph has convolutions (`jaxport.jit` then compiles with `xla_options.CONV_NET_CPU_OPTIONS`)."""
    return not self.op_types.isdisjoint(ops_where(convolution=True))

  def _run(self, form: str, params, args, kwargs, rng):
    args, kwargs = composite.expand((tuple(args), dict(kwargs)))
    mismatches = self._signature.static_mismatches(args, kwargs)
    if mismatches:
      return self._variant(args, kwargs, mismatches)._run(form, params, args, kwargs, rng)
    # Read at the call, as tf2jax does, and at conversion: off at either skips the shape check, on at
    # either makes dtypes strict.
    strict_shape = self._config["strict_shape_check"] and _config.get_config("strict_shape_check")
    strict_dtype = self._config["strict_dtype_check"] or _config.get_config("strict_dtype_check")
    lacking = [k for k in self._uninitialized if not isinstance(params, dict) or k not in params]
    if lacking:
      raise MissingInputError(
          f"{self._uninitialized[lacking[0]]} cannot be evaluated: the graph's variable was never initialized, "
          f"so convert() has no value for it. Some parameters are missing, {lacking}; pass their values in params.")
    state = check_params(params, self._param_specs, strict_dtype=strict_dtype, warned=self._warned_params)
    new_params = dict(state)
    state = {k: state[k] for k in self.param_keys}
    if self.requires_rng and rng is None:
      raise MissingInputError("this function uses random ops and needs a PRNG key: pass rng=jax.random.key(seed)")
    inputs = self._signature.tensor_inputs(args, kwargs, strict_shape=strict_shape,
                                           strict_dtype=strict_dtype)
    outs, changed = self._execute(inputs, state, rng)
    leaves = [leaf[1] if isinstance(leaf, tuple) else self._output_array(outs, leaf) for leaf in self._output_leaves]
    outputs = tree.unflatten_as(self._output_structure, leaves)
    if form == "outputs":
      return outputs
    if form == "changed":
      return outputs, changed
    new_params.update(changed)
    return outputs, new_params

  def _execute(self, inputs: list, state: dict, rng) -> tuple[list, dict]:
    """(the graph's outputs, the params it assigned). Called outside any JAX transformation, the graph runs
    as one `jax.jit` compiled once per input shapes, with `jaxport.jit`'s XLA options: op by op, each op
    compiles apart (RetinaNet's first call: 41 s op by op, 4 s as one jit). A graph that cannot be
    traced (shapes that depend on values) runs in segments: each run of nodes that traces as one jit,
    the nodes that need values op by op (`segments.py`). `eager_jit=False`: all op by op."""
    if (self._config["eager_jit"] and _config.get_config("eager_jit") and self._worth_one_jit()
        and not has_tracers(inputs, state, rng)):
      key = _shapes_key(inputs, state, rng)
      if key not in self._op_by_op:
        try:
          return self._jitted_graph(inputs, state, rng)
        except Exception:   # pylint: disable=broad-except - the segments run it again, and raise what it raises
          self._op_by_op.add(key)
      return self._run_graph(inputs, state, rng, segmented=True)
    return self._run_graph(inputs, state, rng)

  @functools.cached_property
  def _jitted_graph(self) -> Callable:
    """The graph as one jit for eager calls, with the XLA options `jaxport.jit` picks (a conv net's)."""
    from jaxport import xla_options
    return xla_options.jit_with_options(self._run_graph, xla_options.compiler_options(self))

  def _worth_one_jit(self) -> bool:
    """Whether the graph has enough nodes that one compile beats compiling its ops apart (which JAX
    caches across functions: a small graph's ops are mostly compiled already)."""
    if "eager_jit" not in self._graph.memo:
      live = sum(len(fn.live_nodes()) for fn in _live_functions(self._graph, self._library))   # each function once
      self._graph.memo["eager_jit"] = live >= EAGER_JIT_MIN_NODES
    return self._graph.memo["eager_jit"]

  def _run_graph(self, inputs: list, state: dict, rng, segmented: bool = False) -> tuple[list, dict]:
    inputs = self._signature.with_constants(inputs)   # a sparse input's traced dense shape: static here
    runtime = Runtime(self._library, self._config, dict(state), rng, self._custom_gradients, segmented)
    outs = run_function(self._graph, inputs + list(self._captures), runtime)
    # An assign leaves a new array in the state; a read leaves the same one.
    return outs, {k: v for k, v in runtime.state.items() if state.get(k) is not v}

  def _output_array(self, outs, i: int):
    if isinstance(outs[i], VariableRef):   # a resource handle returned as a value
      src, _ = self._graph.outputs[i]
      while self._graph.nodes[src].op in ("Identity", "IdentityN") and self._graph.nodes[src].inputs:
        src = self._graph.nodes[src].inputs[0][0]
      raise UnsupportedValueError(
          f"{self._graph.nodes[src].op} `{src}` cannot be evaluated: the function returns a resource handle "
          "(a variable itself), which has no array value; return the variable's value instead "
          "(e.g. `v.read_value()` or `tf.identity(v)`).")
    if has_symbolic(outs[i]):   # a shape with symbolic dims (jax.export shape polymorphism)
      return stage_dims(outs[i])
    return jnp.asarray(outs[i])

  @property
  def signature(self) -> inspect.Signature:
    """The TF function's signature (tf2jax's `AnnotatedFunction.signature`)."""
    return self.__signature__

  def _variant(self, args, kwargs, mismatches) -> "ConvertedFunction":
    """The function retraced for this call's static values (cached per value)."""
    key = tuple((m.path, type(m.given).__name__, repr(m.given)) for m in mismatches)
    if key in self._variants:
      return self._variants[key]
    if self._retrace is None:
      m = mismatches[0]
      raise StaticArgumentError(
          f"argument {m.path} was traced as {m.traced!r} (baked into the graph) and this call gives "
          f"{m.given!r}; a function converted from a SavedModel signature cannot retrace. Convert with "
          f"jaxport.convert(restored_fn, ..., {m.path.split('[')[0]}=...) for that value.")
    with _config.override_configs(self._config):   # the settings this function was converted with
      variant = self._retrace(args, kwargs, self._signature)
    extra = sorted(set(variant.param_keys) - set(self.param_keys))
    if extra:
      raise StaticArgumentError(
          f"retraced for {', '.join(f'{m.path}={m.given!r}' for m in mismatches)}, the function uses "
          f"variables the first trace did not ({', '.join(extra[:5])}); convert again with these "
          "arguments to get params that include them.")
    self._variants[key] = variant
    return variant


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


def _to_spec(x):
  tf = _tf()
  if isinstance(x, tf.TensorSpec):
    return x
  if is_static_leaf(x):
    return x
  if composite.is_composite(x):   # a sparse or ragged example traces as its TF type spec
    return _composite_spec(x)
  kind = composite_kind(x)
  if kind:
    raise UnsupportedValueError(f"example input {x!r:.60} is a tf.{kind}; jaxport converts dense, sparse and "
                                "ragged tensors. Pass a dense tensor (e.g. `.to_tensor()`), or convert a function "
                                "that builds the composite tensor inside TF from dense inputs.")
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


def _composite_spec(x):
  """The TF type spec a sparse or ragged example traces with (a BCOO or SparseTensorValue as a SparseTensor's)."""
  tf = _tf()
  if isinstance(x, tf.TypeSpec):
    return x
  if type(x).__name__ in ("BCOO", "SparseTensorValue"):
    parts = composite.components(x)
    return tf.SparseTensorSpec(np.asarray(parts.dense_shape).tolist(), tf.as_dtype(np.dtype(parts.values.dtype)))
  return tf.type_spec_from_value(x)


def _concrete_function(fn, args, kwargs):
  tf = _tf()
  if isinstance(fn, tf.types.experimental.ConcreteFunction):
    return fn, {}
  keras_variables = _keras_variables(fn)
  if _is_keras_object(fn) and not hasattr(fn, "get_concrete_function"):
    model = fn   # a bare model converts for inference unless `training=True` is passed

    def inference(*a, **k):   # a def, not a lambda: AutoGraph parses a lambda's whole source file (~0.3 s)
      return model(*a, **{"training": False, **k})
    fn = tf.function(inference)
  elif not hasattr(fn, "get_concrete_function"):
    fn = tf.function(fn)
  as_specs = tree.traverse(lambda x: _composite_spec(x) if composite.is_composite(x) else None,
                           (tuple(args), dict(kwargs)), top_down=True)
  spec_args, spec_kwargs = tree.map_structure(_to_spec, as_specs)
  return fn.get_concrete_function(*spec_args, **spec_kwargs), keras_variables


def _live_functions(graph: GraphFunction, library: Library, missing: dict[str, list[str]] | None = None):
  """`graph` and every library function it can call (calls to functions missing from the
  library are added to `missing`: name -> callers)."""
  seen: set[str] = set()
  pending = [graph]
  while pending:
    fn = pending.pop()
    yield fn
    for node in fn.live_nodes():
      for name in library.called_by(node):
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
      found.update(custom_gradient.prepare(tf_graph, fn, variable_ref, library))
  return found


def _host_handed(graph: GraphFunction, library: Library, config) -> dict[str, list[str]]:
  """The nodes (by op type) whose op's native rule hands them to the host callback tier
  (`register(host_nodes=...)`, e.g. `AsString` of floats)."""
  handed: dict[str, list[str]] = {}
  for label, node in _live_nodes(graph, library):
    rule = get_rule(node.op)
    if (rule is not None and rule.host_nodes is not None and node.op not in library
        and op_tier(node.op, config) == Tier.NATIVE and rule.host_nodes(node)):
      handed.setdefault(node.op, []).append(label)
  return handed


def _unsupported(uses: dict[str, list[str]], library: Library, config,
                 host_handed: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
  """The op types of `uses` that no tier can convert, with their nodes; of `host_handed`, the
  nodes the host cannot take either."""
  missing = {op: nodes for op, nodes in uses.items()
             if op not in GRAPH_INPUT_OPS and op not in library and op_tier(op, config) == Tier.UNSUPPORTED}
  for op, nodes in (host_handed or {}).items():
    if host_tier(op, config) == Tier.UNSUPPORTED:
      missing[op] = nodes
  return missing


def _shared_value(var) -> np.ndarray:
  """A CPU variable's value without a copy: its buffer through DLPack as a CPU jax.Array, seen as a
  read-only NumPy array (a later assign in TF writes a new buffer, so this value stays). A call with it
  hands JAX the same buffer (no device copy either). Others, and dtypes JAX would change: `var.numpy()`."""
  dtype = numpy_dtype(var.dtype)
  if "GPU" not in (var.device or "").upper() and dtype.kind in "biuf" and \
      np.dtype(jax.dtypes.canonicalize_dtype(dtype)) == dtype:
    try:
      from jaxport.interop import to_jax
      return np.asarray(to_jax(var.read_value(), device="cpu"))
    except Exception:  # pylint: disable=broad-except  # no shared buffer: the copy below
      pass
  return storage_array(var.numpy())


class _ParamCollector:
  """Names each captured tf.Variable once and collects its value into `params`."""

  def __init__(self, cf, keras_variables: dict[int, KerasVariable]):
    self._variables = {id(v.handle): v for v in cf.variables}
    self._keras_variables = keras_variables
    self._refs: dict[int, VariableRef] = {}
    self.params: dict[str, Variable] = {}
    self.tf_variables: dict = {}

  @staticmethod
  def _value(var):
    """The variable's value; zeros of its shape inside a TF trace (where it cannot be read) or with
    `skip_variables_evaluation_inside_tf_tracing` set: the caller then passes params itself."""
    tf = _tf()
    if _config.get_config("skip_variables_evaluation_inside_tf_tracing") or not tf.executing_eagerly():
      return np.zeros(var.shape, numpy_dtype(var.dtype))
    return _shared_value(var)

  def is_table(self, handle) -> bool:
    """Whether a captured resource is a lookup table: not a variable, and TF can size it as a table."""
    from jaxport.convert.handle_owners import owning_variable
    if id(handle) in self._variables or owning_variable(handle) is not None:
      return False
    tf = _tf()
    try:
      tf.raw_ops.LookupTableSizeV2(table_handle=handle)   # another resource: a clean InvalidArgumentError
    except tf.errors.OpError:
      return False
    return True

  def ref(self, handle, what: str, variables=()) -> VariableRef:
    """The VariableRef of the variable behind an eager resource `handle`."""
    if id(handle) not in self._refs:
      var = self._variables.get(id(handle))
      if var is None:
        var = next((v for v in variables if v.handle is handle), None)
      if var is None:   # captured by a raw op on `v.handle` (optimizer slots)
        from jaxport.convert.handle_owners import owning_variable
        var = owning_variable(handle)
      if var is None:
        raise UnsupportedValueError(f"{what} is not a tf.Variable or a lookup table (iterators and other "
                                    "resources cannot be converted); pass its contents as an input instead")
      keras = self._keras_variables.get(id(handle))
      key = base = (keras and keras.path) or var.name.split(":")[0]
      n = 1
      while key in self.params:
        key, n = f"{base}_{n}", n + 1
      trainable = keras.trainable if keras else var.trainable
      self.params[key] = Variable(self._value(var), name=var.name, trainable=trainable)
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
  for leaf in tree.flatten(composite.expand(cf.structured_outputs)):
    if isinstance(leaf, (tf.Tensor, tf.TensorSpec)):
      ref = cf.outputs[len(output_refs)]
      output_leaves.append(len(output_refs))
      output_refs.append((ref.op.name, ref.value_index))
    elif hasattr(leaf, "_type_spec") or isinstance(leaf, tf.TypeSpec):
      raise UnsupportedValueError(f"output {leaf!r:.80} is a composite tensor ({type(leaf).__name__}); "
                                  "return dense tensors instead (e.g. `.to_tensor()`).")
    else:
      output_leaves.append(("static", leaf))
  # Control outputs that assign variables run (an update with no data consumer is not lost);
  # other side effects (prints, summaries) are left out, as before.
  from jaxport.convert.ops.control_flow import node_writes_state
  controls = [op.name for op in cf.graph.control_outputs
              if op.name in nodes and node_writes_state(library, nodes[op.name])]
  graph = GraphFunction("main", nodes, [t.op.name for t in cf.inputs], output_refs, controls)
  from jaxport.convert.v1_control_flow import lower_v1_graph
  return lower_v1_graph(graph, library), library, output_leaves   # TF1 graphs: v1 loops/conds, ref variables


def unsupported_in_concrete(cf) -> dict[str, list[str]]:
  """Unsupported op types of a concrete function, with the nodes that use them."""
  graph, library, _ = _decode_graph(cf)
  conf = _config.snapshot()
  return _unsupported(_op_uses(graph, library), library, conf, _host_handed(graph, library, conf))


def _python_signature(cf, fn=None) -> inspect.Signature:
  """The TF function's own signature: its Python function's, else named from the traced specs."""
  python_fn = getattr(fn, "python_function", None) or (getattr(fn, "call", None) if _is_keras_object(fn) else fn)
  if python_fn is not None:
    try:
      return inspect.signature(python_fn)
    except (TypeError, ValueError):
      pass
  args, kwargs = cf.structured_input_signature
  named = [inspect.Parameter(getattr(a, "name", None) or f"arg{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD)
           for i, a in enumerate(args)]
  return inspect.Signature(named + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in kwargs])


def _annotate(jax_fn, cf, signature_of) -> None:
  """tf2jax's metadata: `structured_inputs`/`structured_outputs` (TensorSpecs) and the TF
  function's `signature` (also what `inspect.signature` reports)."""
  tf = _tf()
  jax_fn.structured_inputs = cf.structured_input_signature
  jax_fn.structured_outputs = tree.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype, name=t.op.name) if isinstance(t, tf.Tensor) else t,
      composite.expand(cf.structured_outputs))
  jax_fn.__signature__ = signature_of(cf)


def _from_concrete(cf, keras_variables: dict[int, KerasVariable], input_structure, static_leaves,
                   retrace=None, signature_of=_python_signature) -> tuple[ConvertedFunction, dict]:
  tf = _tf()
  conf = _config.snapshot()
  graph, library, output_leaves = _decode_graph(cf)
  n_user = len(cf.inputs) - len(cf.captured_inputs)
  user_inputs, captured_inputs = cf.inputs[:n_user], cf.inputs[n_user:]

  # Captured inputs: variables become params, captured tensors become constants.
  collector = _ParamCollector(cf, keras_variables)
  by_internal = {id(internal): external for external, internal in cf.graph.captures}
  captures = []
  uses = _op_uses(graph, library)
  from jaxport.convert.ops import random as random_ops
  streams = random_ops.stream_params(_live_nodes(graph, library), library, conf)
  reads_tables = any(op.startswith("LookupTable") for op in uses)
  for internal in captured_inputs:
    external = by_internal.get(id(internal))
    if external is None:
      raise TypeError(f"captured input {internal.name} has no external value")
    if external.dtype == tf.resource and reads_tables and collector.is_table(external):
      captures.append(TableRef(external, internal.name))
    elif external.dtype == tf.resource:
      captures.append(collector.ref(external, f"captured resource {internal.name}"))
    else:
      captures.append(np.asarray(external.numpy()))
  custom_gradients = _custom_gradients(cf, graph, library, collector.ref) if conf["convert_custom_gradient"] else {}
  params, tf_variables = collector.params, collector.tf_variables
  from jaxport.convert.graph_def import graph_level_params   # TF1 graphs: variables in the graph itself
  graph_values, graph_specs = graph_level_params(cf, graph, library, exclude=params)
  params.update(graph_values)
  params.update({k: Variable(v, name=k, trainable=False) for k, v in streams.items()})
  from jaxport.convert.graph_def import variable_key
  uninitialized = {variable_key(n): f"{n.op} `{n.name}`" for n in graph.live_nodes()
                   if n.op in ("VariableV2", "Variable", "VarHandleOp")
                   and variable_key(n) in graph_specs and variable_key(n) not in params}

  missing = _unsupported(uses, library, conf, _host_handed(graph, library, conf))
  if missing:
    raise UnsupportedOperationsError(missing)
  _check_nodes([(graph, library)] + [(g.graph, g.library) for g in custom_gradients.values()], conf)

  specs = []
  leaf_paths = [p for i, (p, _) in enumerate(tree.flatten_with_path(input_structure)) if i not in static_leaves]
  fixed = composite.known_dense_shapes(input_structure)
  for path, t in zip(leaf_paths, user_inputs):
    shape = None if t.shape.rank is None else tuple(t.shape.as_list())
    specs.append(InputSpec(path_name(path), shape, numpy_dtype(t.dtype), fixed.get(tuple(path))))
  param_specs = {k: jax.ShapeDtypeStruct(v.shape, jax.dtypes.canonicalize_dtype(v.dtype)) for k, v in params.items()}
  param_specs.update({k: v for k, v in graph_specs.items() if k not in param_specs})

  jax_fn = ConvertedFunction(
      graph, library, signature=Signature(input_structure, specs, static_leaves), input_structure=input_structure,
      captures=captures,
      output_structure=plain_structure(tree.map_structure(lambda _: 0, composite.expand(cf.structured_outputs))),
      output_leaves=output_leaves, param_specs=param_specs, config=conf,
      requires_rng=random_ops.needs_caller_rng(uses, streams),
      name=_text(getattr(cf, "name", "converted")), custom_gradients=custom_gradients, retrace=retrace,
      uninitialized=uninitialized)
  jax_fn.params = params
  jax_fn.tf_variables = tf_variables   # the TF variable behind each params key
  _annotate(jax_fn, cf, signature_of)
  warn_if_narrowed(specs, jax_fn.structured_outputs, params)
  jax_fn.trainable = {k: bool(v.trainable) for k, v in params.items()}
  return jax_fn, params


def _text(name) -> str:
  return name.decode() if isinstance(name, bytes) else str(name)


def _static_leaf_indices(args, kwargs) -> dict[int, Any]:
  return {i: x for i, x in enumerate(tree.flatten((tuple(args), dict(kwargs)))) if is_static_leaf(x)}


def _retracer(fn):
  """Retraces `fn` for a call's static values, with the traced specs for its tensor arguments."""
  def retrace(args, kwargs, signature: Signature) -> ConvertedFunction:
    tf = _tf()
    specs = {s.path: tf.TensorSpec(s.shape, tf.as_dtype(s.dtype)) for s in signature.specs}
    spec_args = tree.map_structure_with_path(lambda p, x: x if is_static_leaf(x) else specs[path_name((0,) + p)],
                                             tuple(args))
    spec_kwargs = tree.map_structure_with_path(lambda p, x: x if is_static_leaf(x) else specs[path_name((1,) + p)],
                                               dict(kwargs))
    return convert(fn, *spec_args, **spec_kwargs)[0]
  return retrace


# --------------------------------------------------------------------------- public API


def convert(fn: Callable, *args, **kwargs) -> tuple[ConvertedFunction, dict[str, Variable]]:
  """Converts `fn` (tf.function, Python callable of TF ops, Keras model, restored
  SavedModel function) traced with example `args`/`kwargs` (arrays or TensorSpecs).

  Returns `(jax_fn, params)` where `jax_fn(params, *args, rng=None, **kwargs)`
  returns `(outputs, new_params)`.
  """
  if fn is None or not callable(fn):
    raise UnsupportedValueError(f"jaxport.convert takes a tf.function, a Python function of TF ops, a Keras model or a "
                     f"restored SavedModel function; got {type(fn).__name__}.")
  cf, keras_variables = _concrete_function(fn, args, kwargs)
  structure = composite.expand((tuple(args), dict(kwargs)))
  return _from_concrete(cf, keras_variables, structure, _static_leaf_indices(*structure), _retracer(fn),
                        signature_of=lambda cf: _python_signature(cf, fn))


def _functional(jax_fn: ConvertedFunction, params: dict):
  if params:
    raise ValueError(f"the function captures {len(params)} variable(s) ({', '.join(list(params)[:5])}"
                     f"{', ...' if len(params) > 5 else ''}); use jaxport.convert, which returns them as params.")

  def functional(*args, rng=None, **kwargs):
    return jax_fn({}, *args, rng=rng, **kwargs)[0]

  functional.__name__ = jax_fn.__name__
  functional.requires_rng = jax_fn.requires_rng
  functional.structured_inputs = jax_fn.structured_inputs
  functional.structured_outputs = jax_fn.structured_outputs
  functional.signature = functional.__signature__ = jax_fn.__signature__
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
    raise SignatureError(f"Found {len(concrete)} concrete functions; expected exactly one:\n{sigs}\n"
                         "Use jaxport.convert(restored_fn, *example_args) to pick one by tracing.")
  return concrete[0]


def convert_from_restored(restored_fn) -> tuple[ConvertedFunction, dict[str, Variable]]:
  """Converts a restored SavedModel function with a single concrete signature, without retracing."""
  cf = _single_concrete(restored_fn)
  structure = composite.expand(tuple(cf.structured_input_signature))
  return _from_concrete(cf, {}, (tuple(structure[0]), dict(structure[1])), _static_leaf_indices(*structure))


def convert_functional_from_restored(restored_fn) -> Callable:
  return _functional(*convert_from_restored(restored_fn))


def get_unsupported_operations(op_names) -> set[str]:
  """The op names in `op_names` that no conversion tier can take (with the current config)."""
  conf = _config.snapshot()
  return {op for op in op_names if op not in GRAPH_INPUT_OPS and op_tier(op, conf) == Tier.UNSUPPORTED}


EAGER_JIT_MIN_NODES = 32   # live nodes (with the functions they call) from which an eager call runs as one jit


def _shapes_key(*values) -> tuple:
  # the dtype object, not its name: str() costs ~3 µs a leaf, every eager call
  return tuple((np.shape(leaf), getattr(leaf, "dtype", type(leaf))) for leaf in jax.tree.leaves(values))
