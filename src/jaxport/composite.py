"""`tf.SparseTensor` and `tf.RaggedTensor` as arrays: the pytrees converted functions take and return.

A converted function's SparseTensor argument is a `SparseArrays(indices, values, dense_shape)`, and a
RaggedTensor one a `RaggedArrays(flat_values, nested_row_splits)`: TF's own components, in TF's order,
as named tuples (so `jax.jit`, `vmap` and `tree_util` see their arrays). A call may also pass the TF
objects themselves, a `tf.compat.v1.SparseTensorValue`, or a `jax.experimental.sparse.BCOO`; composite
outputs come back as these tuples. No TF import here: TF objects are recognized by their type's name.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import tree


class SparseArrays(NamedTuple):
  """A `tf.SparseTensor`'s components: [nnz, rank] int64 coordinates, their nnz values, the dense shape."""
  indices: Any
  values: Any
  dense_shape: Any


class RaggedArrays(NamedTuple):
  """A `tf.RaggedTensor`'s components: the flat values and each ragged dimension's row splits, outermost
  first."""
  flat_values: Any
  nested_row_splits: tuple


_SPARSE = ("SparseTensor", "SparseTensorValue", "SparseTensorSpec")
_RAGGED = ("RaggedTensor", "RaggedTensorSpec")


def _tf_type(x, names) -> bool:
  cls = type(x)
  return cls.__name__ in names and cls.__module__.startswith("tensorflow")


def _is_bcoo(x) -> bool:
  return type(x).__name__ == "BCOO" and type(x).__module__.startswith("jax")


def _tf_components(x) -> list:
  """TF's component tensors (or TensorSpecs) of a composite, in TF's order."""
  import tensorflow as tf   # only reached with a TF object in hand
  return tf.nest.flatten(x, expand_composites=True)


def components(x):
  """`x` as a SparseArrays/RaggedArrays when it is a sparse or ragged tensor (or spec, or BCOO); else None."""
  if _tf_type(x, _SPARSE):
    if type(x).__name__ == "SparseTensorValue":
      return SparseArrays(np.asarray(x.indices, np.int64), np.asarray(x.values), np.asarray(x.dense_shape, np.int64))
    indices, values, dense_shape = _tf_components(x)
    if type(x).__name__ == "SparseTensorSpec" and x.shape.is_fully_defined():   # the shape is part of the type
      dense_shape = np.asarray(x.shape.as_list(), np.int64)
    return SparseArrays(indices, values, dense_shape)
  if _tf_type(x, _RAGGED):
    flat_values, *splits = _tf_components(x)
    if len(splits) != x.ragged_rank:
      raise TypeError(f"a RaggedTensor with uniform row lengths is not supported as an input or output; got {x!r:.80}")
    return RaggedArrays(flat_values, tuple(splits))
  if _is_bcoo(x):
    if x.n_batch or x.n_dense:
      raise TypeError(f"a BCOO with batch or dense dimensions has no tf.SparseTensor form; got n_batch={x.n_batch}, "
                      f"n_dense={x.n_dense}")
    return SparseArrays(x.indices, x.data, np.asarray(x.shape, np.int64))
  return None


def expand(structure):
  """`structure` with every sparse or ragged tensor (or spec) replaced by its components' tuple."""
  return tree.traverse(components, structure, top_down=True)


def known_dense_shapes(structure) -> dict[tuple, np.ndarray]:
  """The path of each sparse component's dense shape that `structure` (expanded) knows, with its value.

  TF traces a SparseTensor example with its dense shape in the type (as a dense array's shape), so the
  converted function keeps it a constant: shape arithmetic on it stays static under jit."""
  found = {}

  def visit(path, x):
    if isinstance(x, SparseArrays):
      shape = x.dense_shape
      value = shape if isinstance(shape, np.ndarray) else shape.numpy() if hasattr(shape, "numpy") else None
      if value is not None:
        found[tuple(path) + ("dense_shape",)] = np.asarray(value, np.int64)
    return None

  tree.traverse_with_path(visit, structure, top_down=True)
  return found


def is_composite(x) -> bool:
  return _tf_type(x, _SPARSE + _RAGGED) or _is_bcoo(x)
