"""Values padded to a static bound under jit, and the uses that keep the padding harmless.

`tf.unique(ids)` returns as many values as there are distinct ids, known only at run time. TF's
optimizers call it to sum a sparse gradient per id (`UnsortedSegmentSum` into as many rows as
`tf.shape(unique)[0]`) before scattering the sums into a variable's rows. Under jit, Unique pads its
outputs to len(ids) instead: the padding ids are out of range and their sums are zeros, and the
scatter drops out-of-range rows, so the variable ends up as in TF.

That holds only while every use of a padded value works row by row and ends in such a scatter.
The interpreter asks `use` before each node that reads a padded value and `mark_outputs` after it.
Gathers at the padded ids may come in between (the new tf_keras optimizers read their slots' rows):
their padding rows are clamped reads, later dropped. A gather from padded rows at other indices ends
the padding too (`tf.gather(tf.gather(table, unique), idx)`, a lookup deduplicated first): Unique's
`idx` reads real rows only, and so does a sparse segment reduction picking the rows at `idx`
(`tf.nn.embedding_lookup_sparse`). So does a segment reduction of padded rows at the padded ids into a fixed
number of segments: TF densifying a deduplicated `IndexedSlices` (tf_keras' Nadam, Adadelta, Adafactor
and Ftrl square or scale the gradient so). Any other use (a reduction, a function output, a loop)
raises `PaddedSizeError` before it runs.

`tf.nn.compute_accidental_hits` pads its hits the same way, and `SparseToDense` at their
coordinates drops the padding (`sampled_softmax_loss`). `tf.dynamic_partition(data, partitions, k)`
pads too: output p holds the rows whose partition is p, in order, then padding (out-of-range ids
for a vector of ints, zeros otherwise).
The outputs of partitions with the same `partitions` tensor line up row by row, whichever
DynamicPartition made them. TF's partitioned-variable lookup partitions the ids and their positions,
gathers from each part and stitches the rows back (`ParallelDynamicStitch`): the stitch drops
the padding positions, and its size is one past the largest position, known when the positions
are (a `tf.range`). Its gradient gathers at the padded positions and scatters into each part.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from jaxport.convert.registry import get_rule
from jaxport.errors import PaddedSizeError

INDEX = "row indices"   # the unique ids, padded with out-of-range ids
COUNT = "row count"     # their number: the padded length
ROWS = "rows"           # axis 0 aligned with the unique ids, padded rows beyond the count
SHAPE = "shape"         # a shape vector whose first entry is the row count
COORDS = "coordinates"  # [rows, k] coordinates whose first column is row indices (padding: out of range)


@dataclasses.dataclass(frozen=True)
class Padded:
  value: Any    # held, so that no other value takes its id
  kind: str
  origin: str   # the node whose outputs were padded
  rows: int     # the padded length
  key: str = ""   # values with the same key line up row by row (default: the origin)
  maker: str = "Unique"   # the origin's op
  partition: tuple[str, int, int] | None = None   # a DynamicPartition output: (origin, p, num_partitions)
  bound: int | None = None   # a partitioned vector of known ints: one past its largest value

  def __post_init__(self):
    if not self.key:
      object.__setattr__(self, "key", self.origin)


def mark(runtime, value, kind: str, origin: str, rows: int, **details) -> None:
  runtime.padded[id(value)] = Padded(value, kind, origin, rows, **details)


def mark_like(runtime, value, kind: str, source: Padded) -> None:
  """Marks `value` as `kind`, lined up with `source`'s rows."""
  runtime.padded[id(value)] = dataclasses.replace(source, value=value, kind=kind)


def padding_of(runtime, value) -> Padded | None:
  return runtime.padded.get(id(value))


def refuse(padded: Padded, op: str | None, node: str) -> PaddedSizeError:
  return PaddedSizeError(padded.origin, padded.rows, op, node, padded.maker)


def use(runtime, node, inputs) -> tuple[str, Padded] | None:
  """What `node`'s outputs become when it reads padded values (None: it reads none, or it consumes
  them: a scatter, a stitch, a Unique that pads anew); raises `PaddedSizeError` for a use the
  padding would change."""
  read = [(i, p) for i, x in enumerate(inputs) if (p := runtime.padded.get(id(x))) is not None]
  if not read:
    return None
  plan = _consumer_plan(node, inputs, read)
  if plan is False or (plan is None and len({p.key for _, p in read}) > 1):
    # two paddings' rows line up only where they share a key: never assumed
    raise refuse(read[0][1], node.op, node.name)
  if plan is not None:
    return None if plan is True else plan
  kind = _output_kind(node, inputs, [(i, p.kind) for i, p in read])
  if kind is False:
    raise refuse(read[0][1], node.op, node.name)
  return None if kind is None else (kind, read[0][1])


def _consumer_plan(node, inputs, read: list[tuple[int, Padded]]):
  """The plans of nodes that read paddings of different keys, or consume them: True (the rule
  consumes them), a (kind, source) plan, False (refused) or None (not such a node)."""
  op = node.op
  kinds = [(i, p.kind) for i, p in read]
  if op.startswith("Unique") and kinds == [(0, INDEX)]:
    return True   # padded anew, its `idx` lined up with these rows (`_padded_unique`)
  if op in ("DynamicStitch", "ParallelDynamicStitch"):
    n = len(inputs) // 2
    by_position = dict(read)
    pairs = [(by_position.get(m), by_position.get(m + n)) for m in range(n)]
    ok = all(i is not None and d is not None and i.kind == INDEX and d.kind == ROWS and i.key == d.key
             for i, d in pairs)
    return True if ok else False   # the stitch rule checks that the positions cover one partitioning
  if _is_segment_reduction(op) and len(read) == 3 and [k for _, k in kinds] == [ROWS, ROWS, COUNT]:
    (_, data), (_, ids), (_, count) = read
    # rows of a padding (a partition's) summed at a Unique's `idx` of them into as many segments as
    # that Unique's padded values: rows of the Unique's padding
    return (ROWS, count) if data.key == ids.key and [i for i, _ in read] == [0, 1, 2] else False
  return None


def _output_kind(node, inputs, read: list[tuple[int, str]]) -> str | None | bool:
  """The kind of the node's outputs given the (input position, kind) it reads; None where a scatter
  drops the padding, False where the padding would change the result."""
  op = node.op
  spec = get_rule(op)
  kinds = {kind for _, kind in read}
  if op in ("Identity", "Snapshot") and len(read) == 1:
    return read[0][1]
  if spec is not None and spec.scatter_indices is not None:   # out-of-range rows dropped: the padding ends
    ok = all((kind == INDEX) == (i == spec.scatter_indices) and kind in (INDEX, ROWS) for i, kind in read)
    return None if ok else False
  if spec is not None and spec.gather_indices is not None:   # rows picked at the ids (padding: clamped)
    axis = inputs[2] if len(inputs) > 2 else 0   # a traced axis is no constant: refused
    axis = axis if isinstance(axis, (int, np.integer, np.ndarray)) else None
    along_rows = axis is not None and np.ndim(axis) == 0 and int(axis) == 0 and not node.attrs.get("batch_dims")
    if along_rows and read == [(spec.gather_indices, INDEX)]:
      return ROWS
    # rows of padded values read at other indices (Unique's `idx`: real rows only): not padded
    return None if along_rows and read == [(0, ROWS)] else False
  if spec is not None and spec.elementwise and kinds == {ROWS}:
    return ROWS
  if op in ("Shape", "Size") and kinds == {INDEX}:
    return COUNT
  if op in ("StridedSlice", "ExpandDims") and read == [(0, COUNT)]:
    return COUNT
  if op in ("ConcatV2", "Pack") and read == [(0, COUNT)]:
    return SHAPE   # [count, *rest]: the shape of rows (a gather's gradient reshapes its values to it)
  if op == "Reshape" and read in ([(0, ROWS)], [(0, ROWS), (1, SHAPE)]):
    return ROWS    # axis 0 kept (checked on the output): each row stays one row
  if op == "Reshape" and read in ([(0, INDEX)], [(0, INDEX), (1, COUNT)]):
    return INDEX
  if op in ("MatMul", "BiasAdd") and read == [(0, ROWS)] and not node.attrs.get("transpose_a"):
    return ROWS    # row by row
  if op == "ConcatV2" and len(inputs) == 3 and read in ([(0, INDEX), (1, ROWS)], [(0, INDEX)]):
    axis = inputs[2]
    return COORDS if np.ndim(inputs[0]) == 2 and isinstance(axis, (int, np.integer, np.ndarray)) and \
        int(axis) in (1, -1) else False   # [index, other coordinate] per row
  if op in ("SparseToDense", "ScatterNd") and read in ([(0, COORDS)], [(0, COORDS), (2 if op == "SparseToDense"
                                                                                       else 1, ROWS)]):
    return None    # the padding rows' coordinates are out of range: dropped
  if _is_sparse_segment_reduction(op) and read == [(0, ROWS)]:
    return None   # rows picked at `indices` (Unique's `idx`: real rows only), then reduced
  if _is_segment_reduction(op) and read == [(2, COUNT)]:
    return ROWS   # as many segments as unique ids
  if _is_segment_reduction(op) and read == [(0, ROWS), (1, INDEX)]:
    # rows reduced into the segments their unique ids name (an IndexedSlices made dense): the padding
    # ids, the dtype's largest value, fall outside the segments and are dropped; TF's size comes out
    from jaxport.convert.ops._util import known_value   # ops imports the interpreter, which imports this
    segments = known_value(inputs[2])
    return None if segments is not None and int(segments) <= np.iinfo(inputs[1].dtype).max else False
  return False


def _kind(runtime, x) -> str | None:
  padded = runtime.padded.get(id(x))
  return padded.kind if padded is not None else None


def is_padding_index(runtime, indices) -> bool:
  """Whether `indices` are padded unique ids (a gather's bounds check then skips the padding)."""
  return _kind(runtime, indices) == INDEX


def mark_outputs(runtime, node, inputs, out, plan: tuple[str, Padded]) -> None:
  """Marks `node`'s outputs as `plan` says, once their shapes confirm the padding stays on axis 0."""
  kind, source = plan
  row_ranks = {np.ndim(x) for x in inputs
               if (p := runtime.padded.get(id(x))) and p.kind == ROWS and p.key == source.key}
  for leaf in out if isinstance(out, (tuple, list)) else [out]:
    shape = np.shape(leaf)
    if kind == COUNT:
      aligned = bool(np.all(np.asarray(leaf) == source.rows))
    elif kind == SHAPE:
      aligned = len(shape) == 1 and shape[0] >= 1 and int(np.asarray(leaf)[0]) == source.rows
    elif kind == INDEX:
      aligned = shape in ((source.rows,), (source.rows, 1))
    elif kind == COORDS:
      aligned = len(shape) == 2 and shape[0] == source.rows
    else:   # rows read row by row keep their rank (no broadcasting moves the padded axis)
      aligned = len(shape) >= 1 and shape[0] == source.rows and len(row_ranks) <= 1
      aligned = aligned and (not row_ranks or len(shape) in row_ranks or node.op == "Reshape")
    if not aligned:
      raise refuse(source, node.op, node.name)
    mark_like(runtime, leaf, kind, source)


def check_outputs(runtime, fn_name: str, outputs) -> None:
  """A padded value must not leave the function it was made in (its size would differ from TF's)."""
  for x in outputs:
    p = runtime.padded.get(id(x))
    if p is not None:
      raise refuse(p, None, fn_name)


def _is_segment_reduction(op: str) -> bool:
  from jaxport.convert.ops.gather_scatter import _SEGMENT_REDUCTIONS
  return op in _SEGMENT_REDUCTIONS


def _is_sparse_segment_reduction(op: str) -> bool:
  from jaxport.convert.ops.sparse_segment import FORWARD
  return op in FORWARD
