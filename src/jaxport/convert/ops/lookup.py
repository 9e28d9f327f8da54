"""Op rules: lookup tables (`LookupTable*V2`), read-only, as the constants a `TableRef` holds.

A find is a binary search over the sorted keys: `Tin` keys that JAX cannot hold (64-bit keys while
jax_enable_x64 is off) can never equal an input and are left out. Keys and defaults may be traced;
TF gives the lookup no gradient. Ops that write a table are refused at conversion.
"""
from __future__ import annotations

import numpy as np
from jax import lax

from jaxport.convert.ops._util import text, xp
from jaxport.convert.registry import register
from jaxport.convert.tables import TableRef
from jaxport.errors import UnsupportedValueError


def _table(ctx, table) -> TableRef:
  if not isinstance(table, TableRef):
    raise UnsupportedValueError(f"{ctx.op} node {ctx.name!r} reads a resource that is not a lookup table")
  return table


_INITIALIZERS = ("InitializeTableV2", "LookupTableImportV2")


@register("HashTableV2", structural=True)
def _graph_table(ctx):
  """A table created in the graph (TF1), made once per node: its contents are the constants its
  initializer imports, or, with no initializer in the graph (a loaded TF1 SavedModel ran it), the live
  TF table of its name."""
  made = ctx.runtime.library.memo.setdefault("graph_tables", {})
  key = (ctx.fn.name, ctx.name)
  if key not in made:
    made[key] = _new_graph_table(ctx)
  return made[key]


def _new_graph_table(ctx) -> TableRef:
  inits = [n for n in ctx.fn.nodes.values() if n.op in _INITIALIZERS and n.inputs[0][0] == ctx.name]
  if len(inits) == 1:
    sources = [ctx.fn.nodes[src] for src, _ in inits[0].inputs[1:3]]
    if all(src.op == "Const" for src in sources):
      return TableRef.constant(ctx.name, *(src.attrs["value"] for src in sources))
  elif not inits:
    table = _live_table(ctx)
    if table is not None:
      return table
  how = ", ".join(f"{n.op} {n.name!r}" for n in inits) or "no initializer in the graph and no initialized TF table"
  raise UnsupportedValueError(
      f"{ctx.op} node {ctx.name!r}: jaxport reads a graph's table from one initializer that imports "
      f"constant keys and values, and this table has {how}. Freeze the table's contents into constants, "
      "or convert a function that captures the initialized table (a loaded SavedModel's signature)")


def _live_table(ctx) -> TableRef | None:
  """The initialized table TF holds under the node's shared name (a TF1 SavedModel's loader ran its
  initializer), or None when there is none or it is empty."""
  shared_name = text(ctx.attr("shared_name", b""))
  if not shared_name:
    return None
  import tensorflow as tf
  with tf.init_scope():
    handle = tf.raw_ops.HashTableV2(
        key_dtype=ctx.attr("key_dtype"), value_dtype=ctx.attr("value_dtype"), shared_name=shared_name,
        container=text(ctx.attr("container", b"")),
        use_node_name_sharing=bool(ctx.attr("use_node_name_sharing", False)))
  table = TableRef(handle, ctx.name)
  return table if table.size() > 0 else None


@register("LookupTableFindV2")
def _find(ctx, table, keys, default):
  table_keys, table_values = _table(ctx, table).sorted_for(ctx.attr("Tin"), ctx.attr("Tout"), keys.dtype)
  np_ = xp(keys, default)
  value_shape = table_values.shape[1:]
  out_shape = tuple(np.shape(keys)) + value_shape
  default = np_.asarray(default, table_values.dtype)
  table_keys, table_values = np_.asarray(table_keys), np_.asarray(table_values)
  if not np.size(table_keys):
    return lax.stop_gradient(np_.broadcast_to(default, out_shape))
  position = np_.minimum(np_.searchsorted(table_keys, keys), np.size(table_keys) - 1)
  found = (table_keys[position] == keys).reshape(np.shape(keys) + (1,) * len(value_shape))
  out = np_.where(found, table_values[position], default)
  return out if np_ is np else lax.stop_gradient(out)


@register("LookupTableSizeV2")
def _size(ctx, table):
  return _table(ctx, table).size()


@register("LookupTableExportV2")
def _export(ctx, table):
  return _table(ctx, table).contents(ctx.attr("Tkeys"), ctx.attr("Tvalues"))


def _refuse_writes(node) -> None:
  raise UnsupportedValueError(
      f"{node.op} node {node.name!r} writes a lookup table, and jaxport converts tables read-only (as "
      "constants). Fill the table before converting, or keep keys and values in tf.Variables and look "
      "them up with tf.searchsorted and tf.gather")


@register("LookupTableInsertV2", "LookupTableRemoveV2", "LookupTableImportV2", stateful=True,
          check=_refuse_writes)
def _write(ctx, *_):
  _refuse_writes(ctx.node)

