"""The private tf.data APIs jaxport.data relies on, in one place (pinned by test_data_state.py
and test_data_resume_fast.py).

tf.data has no public way to checkpoint an iterator into a string, nor to fingerprint a pipeline:
the SerializeIterator/DeserializeIterator ops are what `tf.train.Checkpoint` uses (through
`iterator._save()`/`_restore()`), and `Dataset._as_serialized_graph()` is what tf.data's own
service and snapshot use.

Snapshots are taken as the op's variant tensor (tensors referenced, not copied) and encoded only
when a state needs them: one `serialize_tensor`, zlib, base64. `iterator._save()` instead encodes
each saved tensor with its own eager op: ~1 s and 280 KB for a `shuffle(1000)` of scalars, where
this takes ~5 ms and 9 KB (the buffer's keys compress well).
"""
import base64
import binascii
import hashlib
import zlib
from typing import Any

COMPACT = "zlib"  # the encoding of `encode_snapshot`, named in loader states


def snapshot_iterator(iterator: Any, policy: Any = ...) -> Any:
  """The iterator's state now, as a variant tensor; raises what TF raises for state it cannot
  save (e.g. "PyFunc is stateful" under ExternalStatePolicy.FAIL). `policy`: the pipeline's
  ExternalStatePolicy (None: FAIL), read from its options when not given (~0.2 ms)."""
  if policy is ...:
    policy = iterator._dataset.options().experimental_external_state_policy  # pylint: disable=protected-access
  resource = iterator._iterator_resource  # pylint: disable=protected-access
  return _dataset_ops().serialize_iterator(resource, 2 if policy is None else policy.value)  # 2: FAIL


def encode_snapshot(tf: Any, snapshot: Any) -> str:
  """A `snapshot_iterator` result as an ASCII string (`COMPACT` encoding)."""
  raw = tf.io.serialize_tensor(snapshot).numpy()
  return base64.b64encode(zlib.compress(raw, 1)).decode("ascii")


def restore_iterator(tf: Any, iterator: Any, state: str, encoding: str | None = COMPACT) -> None:
  """Restores `iterator` (fresh, of the same pipeline) from an `encode_snapshot` string, or with
  `encoding=None` from an `iterator._save()` string (states of earlier jaxport versions)."""
  if encoding is None:
    iterator._restore(tf.constant(state))  # pylint: disable=protected-access
    return
  try:
    raw = zlib.decompress(base64.b64decode(state, validate=True))
  except (binascii.Error, zlib.error, ValueError) as error:
    raise ValueError(f"not an encoded iterator snapshot ({error})") from None
  restore_snapshot(iterator, tf.io.parse_tensor(raw, tf.variant))


def restore_snapshot(iterator: Any, snapshot: Any) -> None:
  """Restores `iterator` (fresh, of the same pipeline) from a `snapshot_iterator` result."""
  resource = iterator._iterator_resource  # pylint: disable=protected-access
  _dataset_ops().deserialize_iterator(resource, snapshot)


def _dataset_ops() -> Any:
  """TF's generated dataset op wrappers (imported when first needed: TF is optional)."""
  from tensorflow.python.ops import gen_dataset_ops  # pylint: disable=import-outside-toplevel,no-name-in-module
  return gen_dataset_ops


def _serialized_graph(tf: Any, dataset: Any, **kwargs) -> bytes:
  """The pipeline's GraphDef, stateful ops included (serialized with ExternalStatePolicy.IGNORE;
  where the user's options set FAIL, which TF then honours, through an options stage that
  overrides it)."""
  ignore = tf.data.experimental.ExternalStatePolicy.IGNORE
  try:
    return dataset._as_serialized_graph(external_state_policy=ignore, **kwargs).numpy()  # pylint: disable=protected-access
  except tf.errors.FailedPreconditionError:
    options = tf.data.Options()
    options.experimental_external_state_policy = ignore
    return dataset.with_options(options)._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=ignore, **kwargs).numpy()


def pipeline_ops(tf: Any, dataset: Any) -> set[str]:
  """The op types of the pipeline's graph, its functions' bodies included."""
  from tensorflow.core.framework import graph_pb2  # pylint: disable=import-outside-toplevel
  graph = graph_pb2.GraphDef.FromString(_serialized_graph(tf, dataset))
  ops = {node.op for node in graph.node}
  for function in graph.library.function:
    ops.update(node.op for node in function.node_def)
  return ops


def pipeline_fingerprint(tf: Any, dataset: Any) -> str:
  """A digest of the pipeline's graph: its ops, their attributes and constants (shuffle seeds
  and buffer sizes, the data of from_tensor_slices, map functions' bodies), not its element
  values. Names that differ between two constructions of the same pipeline (function names,
  dataset debug names, resource handle names, py_function tokens) are left out, so that a
  pipeline rebuilt by the same code, in this or a later process, gets the same fingerprint. It
  costs one serialization of the graph (constants included)."""
  from tensorflow.core.framework import graph_pb2  # pylint: disable=import-outside-toplevel
  raw = _serialized_graph(tf, dataset, strip_device_assignment=True)
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


def data_service_jobs(dataset: Any) -> list[tuple[str, int]]:
  """(job_name, sharding policy) of each tf.data service read (`distribute`, `from_dataset_id`)
  in the pipeline, found by walking `Dataset._inputs()` (no graph serialization: constants stay
  unread). A service read hidden inside a function (a `flat_map` body) is not found."""
  from tensorflow.core.protobuf import data_service_pb2  # pylint: disable=import-outside-toplevel
  jobs, pending, seen = [], [dataset], set()
  while pending:
    node = pending.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    if type(node).__name__.startswith("_DataServiceDataset"):
      node = getattr(node, "_dataset", node)  # the V1 adapter wraps the V2 dataset
      mode = data_service_pb2.ProcessingModeDef.FromString(node._processing_mode.numpy())  # pylint: disable=protected-access
      jobs.append((node._job_name.numpy().decode(), int(mode.sharding_policy)))  # pylint: disable=protected-access
      continue
    pending.extend(node._inputs())  # pylint: disable=protected-access
  return jobs


# tf.data stages whose fresh iterators yield the same elements in the same order, given inputs and
# functions that do (checked apart): no shuffle, sampling or random source, no nondeterministic
# parallelism (a parallel interleave keeps its choice in the op, out of Python's sight).
_REPLAYABLE_STAGES = frozenset({
    "_TensorSliceDataset", "_TensorDataset", "_SparseTensorSliceDataset", "_RangeDataset",
    "TFRecordDatasetV2", "_TFRecordDataset", "TextLineDatasetV2", "_TextLineDataset",
    "FixedLengthRecordDatasetV2", "_FixedLengthRecordDataset", "_BatchDataset",
    "_PaddedBatchDataset", "_UnbatchDataset", "_ShardDataset", "_TakeDataset", "_SkipDataset",
    "_RepeatDataset", "_PrefetchDataset", "_OptionsDataset", "_RestructuredDataset", "_ZipDataset",
    "_ConcatenateDataset", "_MapDataset", "_FilterDataset", "_FlatMapDataset", "_InterleaveDataset",
    "_ParallelMapDataset", "_ParallelBatchDataset", "CacheDataset"})


def _stages(dataset: Any) -> Any:
  """Each stage of the pipeline once, from its last (`Dataset._inputs()`, no graph serialization:
  constants stay unread)."""
  pending, seen = [dataset], set()
  while pending:
    node = pending.pop()
    if id(node) not in seen:
      seen.add(id(node))
      yield node
      pending.extend(node._inputs())  # pylint: disable=protected-access


def replays_from_start(dataset: Any) -> bool:
  """Whether every fresh iterator of `dataset` yields the same elements in the same order, so that
  a position in it is resumed by reading that many elements from a fresh iterator. Found over a
  list of known stages, whose functions must be stateless; anything else (a shuffle, a random op,
  deterministic=False, an unknown stage) is taken as not replayable."""
  if dataset.options().deterministic is False:
    return False
  for node in _stages(dataset):
    name = type(node).__name__
    if name not in _REPLAYABLE_STAGES:
      return False
    if str(getattr(node, "_deterministic", "default")).lower() not in ("default", "true"):
      return False
    if name == "CacheDataset" and _cache_file(node):
      return False  # a file cache: its first iterator writes what later ones read
    if not all(_stateless(wrapper.function.graph) for wrapper in node._functions()):  # pylint: disable=protected-access
      return False
  return True


def caches_a_changing_stream(dataset: Any) -> bool:
  """Whether the pipeline caches in memory a stream that a fresh iterator would not repeat (a
  shuffle or random op below `cache()`). tf.data saves a memory cache in an iterator's state only
  once it is complete: restored during its first pass, it is filled anew, in another order."""
  return any(type(node).__name__ == "CacheDataset" and not _cache_file(node)
             and not replays_from_start(node._input_dataset)  # pylint: disable=protected-access
             for node in _stages(dataset))


def draws_shuffle_seeds_apart(dataset: Any) -> bool:
  """Whether the pipeline draws shuffle seeds more than once per pass: a shuffle that reshuffles
  on each iteration under a `repeat()`, or more than one such shuffle. tf.data's iterator state
  does not bring those seed generators back to where an uninterrupted run has them."""
  def reshuffles(node: Any) -> bool:
    return type(node).__name__ == "_ShuffleDataset" and bool(node._reshuffle_each_iteration)  # pylint: disable=protected-access
  if sum(map(reshuffles, _stages(dataset))) > 1:
    return True
  return any(type(node).__name__ == "_RepeatDataset"
             and any(map(reshuffles, _stages(node._input_dataset)))  # pylint: disable=protected-access
             for node in _stages(dataset))


def _cache_file(node: Any) -> bytes:
  return node._filename.numpy()  # pylint: disable=protected-access


# Dataset ops a dataset function may build (tf.data marks every dataset op stateful): those of the
# stages above.
_REPLAYABLE_DATASET_OPS = frozenset({
    "TensorSliceDataset", "TensorDataset", "RangeDataset", "TFRecordDatasetV2", "TextLineDataset",
    "FixedLengthRecordDatasetV2", "BatchDatasetV2", "PaddedBatchDatasetV2", "UnbatchDataset",
    "ShardDataset", "TakeDataset", "SkipDataset", "RepeatDataset", "ZipDataset",
    "ConcatenateDataset", "MapDataset", "FilterDataset", "FlatMapDataset", "InterleaveDataset"})


def _stateless(graph: Any) -> bool:
  """Whether a dataset function's graph, and the functions it calls, run no stateful op (but the
  dataset ops above)."""
  from tensorflow.python.framework import op_def_registry  # pylint: disable=import-outside-toplevel
  ops = {op.type for op in graph.get_operations()}
  for function in getattr(graph, "_functions", {}).values():
    ops.update(node.op for node in function.definition.node_def)
  for op in ops - _REPLAYABLE_DATASET_OPS:
    op_def = op_def_registry.get(op)
    if op_def is None or op_def.is_stateful:
      return False
  return True
