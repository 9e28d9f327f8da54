"""The private tf.data APIs jaxport.data relies on, in one place (pinned by test_data_state.py).

tf.data has no public way to checkpoint an iterator into a string, nor to fingerprint a pipeline:
`iterator._save()`/`_restore()` are what `tf.train.Checkpoint` uses, and
`Dataset._as_serialized_graph()` is what tf.data's own service and snapshot use.
"""
import hashlib
from typing import Any


def save_iterator(iterator: Any) -> str:
  """The iterator's state, as an ASCII (base64) string."""
  return iterator._save().numpy().decode("ascii")  # pylint: disable=protected-access


def restore_iterator(tf: Any, iterator: Any, state: str) -> None:
  iterator._restore(tf.constant(state))  # pylint: disable=protected-access


def pipeline_fingerprint(tf: Any, dataset: Any) -> str:
  """A digest of the pipeline's graph: its ops, their attributes and constants (shuffle seeds
  and buffer sizes, the data of from_tensor_slices, map functions' bodies), not its element
  values. Names that differ between two constructions of the same pipeline (function names,
  dataset debug names, resource handle names, py_function tokens) are left out, so that a
  pipeline rebuilt by the same code, in this or a later process, gets the same fingerprint. It
  costs one serialization of the graph (constants included)."""
  from tensorflow.core.framework import graph_pb2  # pylint: disable=import-outside-toplevel
  raw = dataset._as_serialized_graph(  # pylint: disable=protected-access
      external_state_policy=tf.data.experimental.ExternalStatePolicy.IGNORE,
      strip_device_assignment=True).numpy()
  graph = graph_pb2.GraphDef.FromString(raw)
  functions = {function.signature.name: function for function in graph.library.function}
  canonical: dict[str, str] = {}

  def name_of(name: str, calling: tuple = ()) -> str:
    """A function's name: the digest of its body, its callees named likewise."""
    if name not in functions:
      return name
    if name in calling:
      return "recursion"
    if name not in canonical:
      body = type(functions[name])()
      body.CopyFrom(functions[name])
      body.signature.name = "self"
      _canonicalize(body.node_def, lambda callee: name_of(callee, calling + (name,)))
      canonical[name] = hashlib.sha256(body.SerializeToString(deterministic=True)).hexdigest()
    return canonical[name]

  _canonicalize(graph.node, name_of)
  del graph.library.function[:]
  return hashlib.sha256(graph.SerializeToString(deterministic=True)).hexdigest()


def _canonicalize(nodes: Any, rename: Any) -> None:
  """Clears the names that differ between constructions of a pipeline, in place (whatever their
  length: names are replaced in the protos, not in their bytes, whose length prefixes they set)."""
  for node in nodes:
    node.attr.pop("metadata", None)  # "MapDataset:12": a per-process counter
    for key, value in node.attr.items():
      if key == "token" and value.s.startswith(b"pyfunc_"):
        value.s = b"pyfunc"  # the py_function registry's per-process counter
      for handle in value.tensor.resource_handle_val:
        handle.name = handle.container = ""  # "SeedGenerator_3": a per-process counter
      _rename_functions(value, rename)


def _rename_functions(value: Any, rename: Any) -> None:
  if value.HasField("func"):
    value.func.name = rename(value.func.name)
    for inner in value.func.attr.values():
      _rename_functions(inner, rename)
  if value.HasField("list"):
    for func in value.list.func:
      func.name = rename(func.name)
      for inner in func.attr.values():
        _rename_functions(inner, rename)
