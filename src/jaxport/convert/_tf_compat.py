"""The converter's one door to TensorFlow's private APIs, so a TF upgrade breaks one file.

Each function says which private API it reaches; tests pin them (`tests/convert/test_registry.py`,
`test_tiers.py` and `test_fuzz_ops.py::test_kernel_dtypes_pins_tf`).
"""
from __future__ import annotations


def kernel_devices(op_type: str) -> frozenset[str]:
  """Device types with a registered kernel for `op_type` (`tensorflow.python.framework.kernels`)."""
  from tensorflow.python.framework import kernels
  try:
    found = kernels.get_registered_kernels_for_op(op_type)
  except Exception:   # an op TF does not know
    return frozenset()
  return frozenset(k.device_type for k in found.kernel)


def takes_handles(op_type: str) -> bool:
  """Whether `op_type`'s OpDef has an input or output fixed to a resource or variant (a TF variable,
  table, generator state or list), which neither TF's XLA lowering of one node nor a host callback
  can pass (`tensorflow.python.framework.op_def_registry`)."""
  from tensorflow.core.framework import types_pb2
  from tensorflow.python.framework import op_def_registry
  op_def = op_def_registry.get(op_type)
  if op_def is None:
    return False
  return any(arg.type in (types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT)
             for arg in list(op_def.input_arg) + list(op_def.output_arg))


def kernel_dtypes(op_type: str, attr: str = "T", device_type: str = "CPU") -> frozenset[str] | None:
  """Names of the dtypes the `device_type` kernels of `op_type` take for the type attribute `attr`;
  None when a kernel leaves `attr` unconstrained (`tensorflow.python.framework.kernels`)."""
  import tensorflow as tf
  from tensorflow.python.framework import kernels
  names = set()
  for kernel in kernels.get_registered_kernels_for_op(op_type).kernel:
    if kernel.device_type != device_type:
      continue
    types = [c.allowed_values.list.type for c in kernel.constraint if c.name == attr]
    if not types:
      return None
    names.update(tf.as_dtype(t).name for t in types[0])
  return frozenset(names)


def function_def_to_graph_def(fdef, library=None):
  """A FunctionDef as a GraphDef plus its output-name map (`function_def_to_graph`). `library` (name ->
  FunctionDef) gives the signatures of functions its nodes call as op types (a `_Wrapper` function
  calling its body so), which TF looks up in the default graph's functions."""
  from tensorflow.python.framework import function_def_to_graph
  called = {n.op for n in fdef.node_def if library is not None and n.op in library}
  if not called:
    return function_def_to_graph.function_def_to_graph_def(fdef)
  import types

  import tensorflow as tf
  graph = tf.Graph()
  for name in called:   # what TF reads of a registered function here: its definition
    graph._functions[name] = types.SimpleNamespace(cached_definition=library[name], grad_func_name=None)  # pylint: disable=protected-access
  with graph.as_default():
    return function_def_to_graph.function_def_to_graph_def(fdef)


def function_def_to_func_graph(fdef):
  """A FunctionDef as a TF FuncGraph holding its ops (`function_def_to_graph`)."""
  from tensorflow.python.framework import function_def_to_graph
  return function_def_to_graph.function_def_to_graph(fdef)


def op_def(op_type: str):
  """The registered `OpDef` proto of `op_type`, or None when TF does not know it (`op_def_registry`)."""
  from tensorflow.python.framework import op_def_registry
  return op_def_registry.get(op_type)


NO_GRADIENT = object()   # `registered_gradient`: TF has no gradient for the op


def registered_gradient(op_type: str):
  """TF's gradient function for `op_type`; None when it is declared non-differentiable;
  `NO_GRADIENT` when none is registered (`ops.gradient_registry`)."""
  from tensorflow.python.framework import ops
  try:
    return ops.gradient_registry.lookup(op_type)
  except LookupError:
    return NO_GRADIENT


_xla_kernels_registered = False


def register_xla_kernels() -> None:
  """Makes TF register its XLA_CPU_JIT kernels, which it does lazily on the first XLA compilation.

  Until then `kernel_devices` misses every XLA device type. Compiling a one-op function once
  (about 50 ms) triggers `XlaOpRegistry::RegisterCompilationKernels`.
  """
  global _xla_kernels_registered
  if _xla_kernels_registered:
    return
  import tensorflow as tf
  fn = tf.function(lambda x: x + 1.0, jit_compile=True, autograph=False)
  fn.experimental_get_compiler_ir(tf.TensorSpec([], tf.float32))(stage="hlo")
  _xla_kernels_registered = True


def xla_data_pb2():
  """XLA's `xla_data_pb2` protos as TF ships them (`tensorflow.compiler.xla`).

  The `Xla*` ops serialize `dimension_numbers`, `precision_config` and sharding
  attributes as these protos.
  """
  from tensorflow.compiler.xla import xla_data_pb2 as protos
  return protos


def ops_with_kernels(device_type: str) -> frozenset[str]:
  """Every op type with a kernel registered for `device_type`, e.g. "XLA_CPU_JIT"
  (`tensorflow.python.framework.kernels`; call `register_xla_kernels` first for XLA devices)."""
  from tensorflow.python.framework import kernels
  return frozenset(k.op for k in kernels.get_all_registered_kernels().kernel if k.device_type == device_type)
