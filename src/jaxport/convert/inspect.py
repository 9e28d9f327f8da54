"""`jaxport.inspect`: which tier converts each op of a TF function, before anything runs.

`inspect(fn, *args, **kwargs)` traces `fn` as `jaxport.convert` does, walks every op
the conversion would run (library functions included) and classifies each op type
with `tiers.op_tier` under the current config. It runs nothing: no rule is called,
no TF kernel executes. `inspect_saved_model` and `inspect_keras_file` do the same for
every function of a file (what `jaxport inspect PATH` prints).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, Callable

from jaxport import config as _config
from jaxport.convert import api
from jaxport.convert.graph import GraphFunction, Library, Node, decode_nodes
from jaxport.convert.registry import Tier
from jaxport.convert.tiers import GRAPH_INPUT_OPS, host_tier, op_tier
from jaxport.errors import ModelFileError

# Rows are listed problems first.
TIER_ORDER = (Tier.UNSUPPORTED, Tier.CALLBACK, Tier.STABLEHLO, Tier.NATIVE)
_TIER_STYLE = {Tier.NATIVE: "green", Tier.STABLEHLO: "cyan", Tier.CALLBACK: "yellow",
               Tier.UNSUPPORTED: "bold red"}
_EXAMPLES = 3


@dataclasses.dataclass(frozen=True)
class OpRow:
  """One op type of an inspected function."""
  op: str
  tier: Tier
  nodes: int
  examples: tuple[str, ...]                    # the first node names that use it
  stablehlo_ops: tuple[str, ...] = ()          # XlaCallModule: the StableHLO ops inside
  stablehlo_unsupported: tuple[str, ...] = ()  # XlaCallModule: the ones no handler takes
  note: str = ""

  def to_dict(self) -> dict[str, Any]:
    out = {"op": self.op, "tier": self.tier.value, "nodes": self.nodes, "examples": list(self.examples)}
    if self.op == "XlaCallModule":
      out["stablehlo_ops"] = list(self.stablehlo_ops)
      out["stablehlo_unsupported"] = list(self.stablehlo_unsupported)
    if self.note:
      out["note"] = self.note
    return out


@dataclasses.dataclass(frozen=True)
class InspectReport:
  """The op types of one traced function, each with the tier that converts it."""
  name: str
  rows: tuple[OpRow, ...]

  @property
  def converts(self) -> bool:
    """Every op has a tier (and every XlaCallModule's StableHLO ops have a handler)."""
    return not any(r.tier == Tier.UNSUPPORTED or r.stablehlo_unsupported for r in self.rows)

  @property
  def nodes(self) -> int:
    return sum(r.nodes for r in self.rows)

  def tier_counts(self) -> dict[str, dict[str, int]]:
    """Per tier: how many op types and nodes it converts."""
    counts = {t.value: {"op_types": 0, "nodes": 0} for t in reversed(TIER_ORDER)}
    for r in self.rows:
      counts[r.tier.value]["op_types"] += 1
      counts[r.tier.value]["nodes"] += r.nodes
    return counts

  def unsupported(self) -> dict[str, tuple[str, ...]]:
    """The unsupported op types (and StableHLO ops inside XlaCallModules) with example nodes."""
    out = {r.op: r.examples for r in self.rows if r.tier == Tier.UNSUPPORTED}
    for r in self.rows:
      for op in r.stablehlo_unsupported:
        out[op] = r.examples
    return out

  def to_dict(self) -> dict[str, Any]:
    return {"name": self.name, "converts": self.converts,
            "total": {"op_types": len(self.rows), "nodes": self.nodes, "tiers": self.tier_counts()},
            "rows": [r.to_dict() for r in self.rows]}

  def to_json(self, **kwargs) -> str:
    return json.dumps(self.to_dict(), **kwargs)

  def summary(self) -> str:
    """`14 op types, 52 nodes: native 13 (50), stablehlo 1 (2), callback 0, unsupported 0`."""
    parts = [f"{tier} {c['op_types']}" + (f" ({c['nodes']})" if c["op_types"] else "")
             for tier, c in self.tier_counts().items()]
    return f"{_plural(len(self.rows), 'op type')}, {_plural(self.nodes, 'node')}: " + ", ".join(parts)

  def __rich__(self):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    title = Text.assemble(f"{self.name}: ", ("converts", "green") if self.converts
                          else ("does not convert", "bold red"))
    table = Table(title=title, title_justify="left")
    table.add_column("op type")
    table.add_column("tier")
    table.add_column("nodes", justify="right")
    table.add_column("example nodes")
    for r in self.rows:
      more = ", ..." if r.nodes > len(r.examples) else ""
      detail = [Text(", ".join(r.examples) + more, no_wrap=True, overflow="ellipsis")]
      if r.stablehlo_ops:
        detail.append(Text("StableHLO: " + ", ".join(op.removeprefix("stablehlo.") for op in r.stablehlo_ops)))
      if r.stablehlo_unsupported:
        detail.append(Text.assemble(("no handler: ", "bold red"), ", ".join(r.stablehlo_unsupported)))
      if r.note:
        detail.append(Text(r.note, style="dim"))
      table.add_row(Text(r.op), Text(r.tier.value, style=_TIER_STYLE[r.tier]), str(r.nodes), Group(*detail))
    table.add_section()
    tiers = ", ".join(f"{t} {c['op_types']} ({_plural(c['nodes'], 'node')})"
                      for t, c in self.tier_counts().items() if c["op_types"])
    table.add_row("total", _plural(len(self.rows), "op type"), str(self.nodes), Text(tiers))
    return table

  def print(self, console=None) -> None:
    """Prints the table (to `console`, a `rich.console.Console`, or stdout)."""
    from rich.console import Console
    (console or Console()).print(self)

  def __str__(self) -> str:
    return f"{self.name}: {self.summary()}"


# --------------------------------------------------------------------------- functions


def inspect(fn: Callable, *args, **kwargs) -> InspectReport:
  """Which tier converts each op of `fn`, traced like `jaxport.convert(fn, *args, **kwargs)`.

  Without `args`, a concrete function, or a restored SavedModel function with a
  single concrete signature, is inspected as `convert_from_restored` would take it.
  """
  tf = api._tf()
  if isinstance(fn, tf.types.experimental.ConcreteFunction):
    return inspect_concrete(fn)
  if not args and not kwargs and hasattr(fn, "concrete_functions"):   # a restored function
    return inspect_concrete(api._single_concrete(fn))
  cf, _ = api._concrete_function(fn, args, kwargs)
  name = getattr(fn, "name", None) if api._is_keras_object(fn) else getattr(fn, "__name__", None)
  return inspect_concrete(cf, name if isinstance(name, str) else None)


def inspect_concrete(cf, name: str | None = None) -> InspectReport:
  """The report of a traced concrete function."""
  graph, library, _ = api._decode_graph(cf)
  return _report(graph, library, name or api._text(getattr(cf, "name", "function")))


def _report(graph: GraphFunction, library: Library, name: str, conf=None) -> InspectReport:
  """The rows of every op type `graph` can run, classified under `conf` (default: the current config)."""
  conf = _config.snapshot() if conf is None else conf
  modules = [node for _, node in api._live_nodes(graph, library) if node.op == "XlaCallModule"]
  handed = api._host_handed(graph, library, conf)
  rows = []
  for op, labels in api._op_uses(graph, library).items():
    if op in GRAPH_INPUT_OPS:
      continue
    if op in library:
      rows.append(OpRow(op, Tier.NATIVE, len(labels), tuple(labels[:_EXAMPLES]), note="function call, inlined"))
    elif op.startswith("<missing function"):
      rows.append(OpRow(op, Tier.UNSUPPORTED, len(labels), tuple(labels[:_EXAMPLES])))
    elif op == "XlaCallModule":
      rows.append(_xla_call_module_row(op_tier(op, conf), labels, modules))
    else:
      on_host = handed.get(op, [])
      handed_labels = set(on_host)
      native = [label for label in labels if label not in handed_labels]
      if native:
        rows.append(OpRow(op, op_tier(op, conf), len(native), tuple(native[:_EXAMPLES])))
      if on_host:
        rows.append(OpRow(op, host_tier(op, conf), len(on_host), tuple(on_host[:_EXAMPLES]),
                          note="nodes its native rule cannot take"))
  rows.sort(key=lambda r: (TIER_ORDER.index(r.tier), r.op))
  return InspectReport(name, tuple(rows))


def _xla_call_module_row(tier: Tier, labels: list[str], nodes: list[Node]) -> OpRow:
  """An XlaCallModule row, with the StableHLO ops its modules use and those no handler takes."""
  from jaxport.convert import stablehlo
  from jaxport.convert.ops import xla_call_module
  names: set[str] = set()
  missing: set[str] = set()
  note = ""
  for node in nodes:
    try:
      module = xla_call_module.load(node).module
      names |= module.op_names()
      missing |= set(stablehlo.unsupported_ops(module))
    except Exception as e:
      note = f"{node.name}: module not read ({type(e).__name__}: {_first_line(e)})"
  return OpRow("XlaCallModule", tier, len(labels), tuple(labels[:_EXAMPLES]),
               stablehlo_ops=tuple(sorted(names)), stablehlo_unsupported=tuple(sorted(missing)), note=note)


def _plural(n: int, word: str) -> str:
  return f"{n} {word}" + ("" if n == 1 else "s")


def _first_line(error: BaseException, limit: int = 160) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  return text if len(text) <= limit else text[:limit - 3] + "..."


# --------------------------------------------------------------------------- files


def inspect_path(path: str, signature: str | None = None) -> list[InspectReport]:
  """Reports for a SavedModel directory (each signature) or a `.keras` / `.h5` Keras file.

  A SavedModel saved without signatures is inspected through the concrete functions
  of its restored tf.functions. `signature` picks one signature or function by name.
  Raises `ModelFileError` when `path` cannot be read as a model.
  """
  kind = check_model_path(path)
  if kind == "saved_model":
    return inspect_saved_model(path, signature)
  if signature is not None:
    raise ModelFileError(f"{path} is a {'GraphDef' if kind == 'graph_def' else 'Keras'} file with one graph; "
                         "--signature applies to SavedModels.")
  return [inspect_graph_def_file(path) if kind == "graph_def" else inspect_keras_file(path)]


def inspect_graph_def_file(path: str) -> InspectReport:
  """The report of every op in a frozen or plain GraphDef file (`.pb` / `.pbtxt`, or a Saver's `.meta`;
  TF1 control flow included): all of its nodes, since the file names no outputs."""
  from jaxport.convert.graph_def import load_graph_def
  try:
    graph_def = load_graph_def(path)
  except Exception as e:   # noqa: BLE001 -- protobuf's decode errors have no common base
    raise ModelFileError(f"{path} is not a readable GraphDef ({type(e).__name__}: {_first_line(e)}); pass a "
                         "binary .pb or text .pbtxt GraphDef (tf.io.write_graph writes both).") from None
  if not graph_def.node:
    raise ModelFileError(f"{path} holds no graph nodes; pass the GraphDef of a model.")
  from jaxport.convert.checkpoints import SAVER_IO_OPS
  from jaxport.convert.v1_control_flow import lower_v1_graph
  nodes = decode_nodes(graph_def.node)
  graph, library = GraphFunction("main", nodes, [], [], list(nodes)), Library(graph_def.library.function)
  report = _report(graph, library, os.path.basename(path))
  # a Saver's file I/O is not converted: convert_graph_def reads its checkpoint (variables=)
  report = InspectReport(report.name, tuple(row for row in report.rows if row.op not in SAVER_IO_OPS))
  try:   # v1 loops and conds convert only when their structure is recovered
    lower_v1_graph(graph, library)
  except Exception as e:   # noqa: BLE001 -- reported as a row, like an unsupported op
    row = OpRow("<v1 control flow>", Tier.UNSUPPORTED, 1, (), note=_first_line(e))
    report = InspectReport(report.name, report.rows + (row,))
  return report


def check_model_path(path: str) -> str:
  """"saved_model" or "keras" by what `path` looks like, without importing TensorFlow;
  raises `ModelFileError` for a missing path, an empty directory or another kind of file."""
  if not os.path.exists(path):
    raise ModelFileError(f"{path} does not exist; pass a SavedModel directory or a .keras / .h5 file.")
  if os.path.isdir(path):
    if not any(os.path.exists(os.path.join(path, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
      contents = "it is empty" if not os.listdir(path) else "it has no saved_model.pb"
      raise ModelFileError(f"{path} is not a SavedModel directory ({contents}); pass the directory "
                           "that tf.saved_model.save or model.export wrote.")
    return "saved_model"
  if path.endswith((".keras", ".h5", ".hdf5")):
    return "keras"
  if path.endswith((".pb", ".pbtxt", ".meta")):   # .meta: a Saver's MetaGraph
    if os.path.basename(path) in ("saved_model.pb", "saved_model.pbtxt"):
      raise ModelFileError(f"{path} is a SavedModel's own file; pass its directory, {os.path.dirname(path) or '.'}.")
    return "graph_def"
  raise ModelFileError(f"{path} is not a model file; pass a SavedModel directory, a .keras / .h5 file, a "
                       ".pb / .pbtxt GraphDef or a Saver's .meta file.")


def inspect_saved_model(path: str, signature: str | None = None) -> list[InspectReport]:
  restored, functions = load_saved_model(path)   # noqa: F841  (keeps the functions' variables alive)
  functions = pick_functions(path, functions, signature)
  return [inspect_concrete(cf, name if "#" not in name else f"{name} ({_inputs_text(cf)})")
          for name, cf in functions.items()]


def _inputs_text(cf) -> str:
  """`float32[?,3], int32[]`: the tensor inputs of a concrete function."""
  import tree
  tf = api._tf()
  specs = [s for s in tree.flatten(cf.structured_input_signature) if isinstance(s, tf.TensorSpec)]
  return ", ".join(f"{s.dtype.name}[{','.join('?' if d is None else str(d) for d in s.shape)}]"
                   if s.shape.rank is not None else f"{s.dtype.name}[...]" for s in specs)


def load_saved_model(path: str) -> tuple[Any, dict[str, Any]]:
  """The restored SavedModel and its functions by name: each signature, or without signatures each
  concrete function of its restored tf.functions (`f`, `encoder.g`, `g#1`). Keep the restored object
  while using the functions: their variables live as long as it does."""
  check_model_path(path)
  _check_saved_model_proto(path)
  tf = api._tf()
  try:
    restored = tf.saved_model.load(path)
  except Exception as e:
    raise ModelFileError(f"{path}: TensorFlow cannot load this SavedModel ({type(e).__name__}: "
                         f"{_first_line(e)}); re-export it with tf.saved_model.save, or load it where "
                         "the TensorFlow version and custom ops that wrote it are installed.") from e
  functions = dict(getattr(restored, "signatures", {}) or {})
  if not functions:
    for name, fn in _restored_functions(restored):
      concrete = list(getattr(fn, "concrete_functions", None) or [])
      functions.update({(name if len(concrete) == 1 else f"{name}#{i}"): cf for i, cf in enumerate(concrete)})
  if not functions:
    raise ModelFileError(f"{path} has no signatures and no traced tf.functions; save it with signatures= or "
                         "call its tf.functions once before saving.")
  return restored, functions


def pick_functions(path: str, functions: dict[str, Any], signature: str | None) -> dict[str, Any]:
  """The functions `signature` names (`g` also picks `g#0`, `g#1`), or all when it is None."""
  if signature is None:
    return functions
  picked = {k: cf for k, cf in functions.items() if signature in (k, k.partition("#")[0])}
  if not picked:
    raise ModelFileError(f"{path} has no signature or function {signature!r}; "
                         f"pick one of: {', '.join(functions) or '(none)'}.")
  return picked


def _check_saved_model_proto(path: str) -> None:
  """Parse saved_model.pb in Python first, so a truncated or corrupt file is a clear error
  and never reaches TF's C++ loader."""
  pb = os.path.join(path, "saved_model.pb")
  if not os.path.exists(pb):
    return
  from tensorflow.core.protobuf import saved_model_pb2
  proto = saved_model_pb2.SavedModel()
  try:
    with open(pb, "rb") as f:
      proto.ParseFromString(f.read())
  except Exception as e:
    raise ModelFileError(f"{pb} is truncated or corrupt ({type(e).__name__}: {_first_line(e)}); "
                         "re-export the model with tf.saved_model.save.") from e
  if not proto.meta_graphs:
    raise ModelFileError(f"{pb} holds no MetaGraph (it is empty or not a SavedModel); "
                         "re-export the model with tf.saved_model.save.")


def _restored_functions(root, prefix: str = "", seen: set[int] | None = None):
  """(dotted name, restored tf.function) reachable through public attributes of `root`."""
  tf = api._tf()
  seen = set() if seen is None else seen
  for key, value in sorted(vars(root).items()):
    if key.startswith("_") or key == "signatures" or id(value) in seen:
      continue
    seen.add(id(value))
    if isinstance(value, tf.types.experimental.PolymorphicFunction):
      yield prefix + key, value
    elif isinstance(value, tf.__internal__.tracking.Trackable) and hasattr(value, "__dict__"):
      yield from _restored_functions(value, f"{prefix}{key}.", seen)


def inspect_keras_file(path: str) -> InspectReport:
  """The report of a `.keras` (Keras 3 or tf_keras) or `.h5` (tf_keras) model, traced with
  its input specs (batch dim None) as `jaxport.convert(model, specs)` would trace it."""
  model = load_keras_file(path)
  specs = keras_input_specs(model)
  if specs is None:
    raise ModelFileError(f"{path}: the model has no input specs (a subclassed model that was never "
                         "built); save it after calling it once, or inspect it in Python with example inputs.")
  report = inspect(model, specs)
  return dataclasses.replace(report, name=f"{os.path.basename(path)} ({type(model).__name__} {model.name!r})")


def load_keras_file(path: str):
  """The model in a Keras file: `.keras` with Keras 3 (then tf_keras), `.h5` with tf_keras
  (then Keras 3). Loaded without compiling."""
  loaders = ["keras", "tf_keras"] if path.endswith(".keras") else ["tf_keras", "keras"]
  errors = []
  for name in loaders:
    try:
      module = importlib.import_module(name)
    except ImportError:
      continue
    try:
      return module.models.load_model(path, compile=False)
    except Exception as e:
      errors.append(f"{name}: {type(e).__name__}: {_first_line(e, 120)}")
  raise ModelFileError(f"{path} cannot be loaded as a Keras model ({'; '.join(errors) or 'install keras or tf_keras'}); "
                       "check that the file is complete, and that custom layers are importable.")


def keras_input_specs(model):
  """A nest of `tf.TensorSpec`s for the model's inputs, batch dim None; None when unknown."""
  import tree
  tf = api._tf()
  try:
    inputs = model.input   # the user's nest: one tensor, a list or a dict
  except (AttributeError, ValueError):   # a subclassed model that was never built
    return None

  def spec(t):
    shape = [None, *list(t.shape)[1:]] if len(t.shape) else []
    return tf.TensorSpec(shape, tf.as_dtype(getattr(t.dtype, "name", t.dtype)))
  return tree.map_structure(spec, inputs)
