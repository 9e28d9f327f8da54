"""TF1 checkpoints: a graph's variable values read from a `tf.compat.v1.train.Saver` checkpoint.

`convert_graph_def("model.ckpt.meta", inputs, outputs, variables="model.ckpt")` reads the graph
from the MetaGraph and each variable from the checkpoint the way the graph's own Saver restores it:
its restore op (`RestoreV2`) names the checkpoint key and the slice (a partitioned variable's part
is a slice of the full tensor saved under the full name). A graph without a Saver reads each
variable under its own name, and the parts `v/part_<k>` of a partitioned `v` (and their slots
`v/part_<k>/Adam`) as consecutive slices of `v` (`v/Adam`), in order, along the axis where their
shapes differ from it.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

import numpy as np

from jaxport.convert import api
from jaxport.convert.graph import Node
from jaxport.errors import ModelFileError

_RESTORE_OPS = frozenset({"RestoreV2"})
SAVER_IO_OPS = frozenset({"SaveV2", "RestoreV2", "MergeV2Checkpoints"})   # replaced by variables=<prefix>
_ASSIGN_OPS = frozenset({"Assign", "AssignVariableOp"})
_PART = re.compile(r"^(?P<head>.+)/part_(?P<k>\d+)(?P<tail>/.+)?$")   # a part, or a part's slot


def is_checkpoint(variables: Any) -> bool:
  return isinstance(variables, (str, os.PathLike))


def checkpoint_values(prefix, nodes: Mapping[str, Node], variables: Mapping[str, Node]) -> dict[str, np.ndarray]:
  """The values of `variables` (params key -> variable node) from the checkpoint at `prefix`."""
  tf = api._tf()
  prefix = os.fspath(prefix)
  try:
    reader = tf.train.load_checkpoint(prefix)
  except (tf.errors.OpError, ValueError) as e:
    raise ModelFileError(f"{prefix!r} is not a TF checkpoint prefix ({str(e).splitlines()[0]}): pass the path "
                         "Saver.save returned, such as 'model.ckpt-1000', without '.index' or '.data-*'") from e
  stored = reader.get_variable_to_shape_map()
  restores = _restores(nodes)
  values = {}
  for key, node in variables.items():
    name, spec = restores.get(node.name, (None, ""))
    if name is None:
      name, spec = _by_name(node, nodes, stored)
    if name not in stored:
      raise ModelFileError(f"the checkpoint {prefix!r} holds no {name!r} for variable {node.name!r} (it holds "
                           f"{len(stored)} tensors, e.g. {sorted(stored)[:5]}); pass its value in a dict as "
                           "variables= instead, or a checkpoint written from this graph")
    values[key] = _sliced(reader.get_tensor(name), spec, node)
  return values


def _restores(nodes: Mapping[str, Node]) -> dict[str, tuple[str, str]]:
  """Variable node name -> (checkpoint key, shape-and-slice spec), from the graph's Saver."""
  found = {}
  for node in nodes.values():
    if node.op not in _ASSIGN_OPS or len(node.inputs) < 2:
      continue
    source = node.inputs[1]
    while source[0] in nodes and nodes[source[0]].op == "Identity":   # resource restores go via Identity
      source = nodes[source[0]].inputs[0]
    restore = nodes.get(source[0])
    if restore is None or restore.op not in _RESTORE_OPS:
      continue
    names, specs = (_const_strings(nodes, restore.inputs[i][0]) for i in (1, 2))
    if names is not None and specs is not None and source[1] < len(names):
      found[node.inputs[0][0]] = (names[source[1]], specs[source[1]])
  return found


def _const_strings(nodes: Mapping[str, Node], name: str) -> list[str] | None:
  node = nodes.get(name)
  if node is None or node.op != "Const":
    return None
  value = np.asarray(node.attrs.get("value"))
  return [v.decode() if isinstance(v, bytes) else str(v) for v in value.reshape(-1)]


def _by_name(node: Node, nodes: Mapping[str, Node], stored: Mapping[str, list]) -> tuple[str, str]:
  """No Saver in the graph: the variable's own name, or its place among the parts of a full one."""
  part = _PART.match(node.name)
  full = _full_name(part) if part else None
  if node.name in stored or full not in stored:
    return node.name, ""
  siblings = sorted((int(m["k"]), n) for n in nodes if (m := _PART.match(n)) and _full_name(m) == full
                    and nodes[n].op == node.op)
  full_shape = list(stored[full])
  shapes = [list(nodes[n].attrs.get("shape") or []) for _, n in siblings]
  axis = next((a for a, d in enumerate(full_shape) if any(len(s) > a and s[a] != d for s in shapes)), 0)
  offset = sum(s[axis] for (k, _), s in zip(siblings, shapes) if k < int(part["k"]))
  own = shapes[[n for _, n in siblings].index(node.name)]
  slices = ["-" if a != axis else f"{offset},{own[axis]}" for a in range(len(full_shape))]
  return full, " ".join(str(d) for d in full_shape) + " " + ":".join(slices)


def _full_name(part: re.Match) -> str:
  return part["head"] + (part["tail"] or "")


def _sliced(value: np.ndarray, spec: str, node: Node) -> np.ndarray:
  """`value[slice]` for a Saver's "d0 d1 ... start,length:-:..." spec ("" or no slices: all of it)."""
  parts = spec.split()
  if not parts:
    return value
  rank = np.ndim(value)
  if len(parts) != rank + 1:   # a full shape without slices
    return value
  index = []
  for axis, piece in enumerate(parts[-1].split(":")):
    if piece == "-":
      index.append(slice(None))
    else:
      start, length = (int(v) for v in piece.split(","))
      index.append(slice(start, start + length))
  out = value[tuple(index)]
  shape = node.attrs.get("shape")
  if shape is not None and None not in shape and tuple(out.shape) != tuple(shape):
    raise ModelFileError(f"variable {node.name!r} has shape {tuple(shape)}, its checkpoint slice {spec!r} "
                         f"{tuple(out.shape)}: the checkpoint was written from another graph")
  return out
