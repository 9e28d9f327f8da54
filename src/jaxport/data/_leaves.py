"""Leaves of a batch: which ones JAX can hold, zero-copy host views, aligned host buffers.

TensorFlow and PyTorch are never imported here: a leaf can only be one of their tensors when the
caller already imported the library, so `sys.modules` tells which checks apply.
"""
import functools
import math
import sys
from typing import Any

import jax
import numpy as np
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey, keystr

from jaxport import interop

# XLA's CPU client aliases host buffers aligned to this many bytes instead of copying them.
ALIGNMENT = 64


def path_str(path: tuple) -> str:
  return keystr(path) or "<root>"


def path_parts(path: tuple) -> tuple[str, ...]:
  """('features', 'image') for the key path of batch['features']['image']."""
  parts = []
  for key in path:
    if isinstance(key, DictKey):
      parts.append(str(key.key))
    elif isinstance(key, SequenceKey):
      parts.append(str(key.idx))
    elif isinstance(key, GetAttrKey):
      parts.append(key.name)
    elif isinstance(key, FlattenedIndexKey):
      parts.append(str(key.key))
    else:
      parts.append(str(key))
  return tuple(parts)


def jax_can_hold(dtype: np.dtype) -> bool:
  if dtype.kind in "biufc":
    return True
  # bfloat16, float8_* and int4 come from ml_dtypes as NumPy "void" kinds.
  return dtype.kind == "V" and dtype.names is None and dtype.type.__module__.startswith("ml_dtypes")


def _unsupported(path: tuple, what: str, hint: str) -> TypeError:
  return TypeError(f"jaxport.data: leaf {path_str(path)} {what}, which a jax.Array cannot hold. "
                   f"{hint}")


_STRING_HINT = ("Drop or encode it in the pipeline before the loader, e.g. "
                "ds.map(lambda x: {k: v for k, v in x.items() if k != 'name'}) or a lookup table "
                "that maps strings to ids.")
_RAGGED_HINT = ("Make it dense in the pipeline: ragged.to_tensor() / tf.sparse.to_dense(), "
                "Dataset.padded_batch, or pad the examples to a common shape.")


def check_leaf(path: tuple, leaf: Any) -> Any:
  """Returns `leaf` when JAX can hold it (Python numbers become NumPy scalars).

  Raises a TypeError naming the key path otherwise. Only types and dtypes are inspected: a TF
  string tensor must never reach DLPack, which aborts the process on it.
  """
  kind = _kind(type(leaf))
  if kind == "numpy":
    if not jax_can_hold(leaf.dtype):
      what = {"U": "is a string array", "S": "is a bytes array",
              "O": "is an object array (ragged rows or Python objects)"}.get(
                  leaf.dtype.kind, f"has dtype {leaf.dtype}")
      raise _unsupported(path, what, _RAGGED_HINT if leaf.dtype.kind == "O" else _STRING_HINT)
    return leaf
  if kind == "tf":
    problem = tf_dtype_problem(leaf.dtype)
    if problem:
      raise _unsupported(path, *problem)
    return leaf
  if kind == "jax":
    return leaf
  if kind == "torch":
    torch = sys.modules["torch"]
    if leaf.is_nested:
      raise _unsupported(path, "is a torch nested (ragged) tensor", _RAGGED_HINT)
    if leaf.layout != torch.strided:
      raise _unsupported(path, f"is a torch tensor with layout {leaf.layout}", _RAGGED_HINT)
    if leaf.is_quantized:
      raise _unsupported(path, "is a quantized torch tensor", "Dequantize it in the pipeline.")
    return leaf.detach() if leaf.requires_grad else leaf
  if kind == "number":
    value = np.asarray(leaf)
    if not jax_can_hold(value.dtype):
      raise _unsupported(path, f"is a NumPy scalar of dtype {value.dtype}", _STRING_HINT)
    return value
  if kind == "text":
    raise _unsupported(path, f"is a Python {type(leaf).__name__}", _STRING_HINT)
  if kind == "tf_composite":
    raise _unsupported(path, f"is a tf.{type(leaf).__name__}", _RAGGED_HINT)
  raise _unsupported(path, f"is a {type(leaf).__module__}.{type(leaf).__qualname__}",
                     "Leaves must be NumPy, TensorFlow, PyTorch or JAX arrays, or Python numbers.")


@functools.cache
def _kind(cls: type) -> str:
  """What kind of leaf instances of `cls` are; cached, as it runs for every leaf of every batch."""
  if issubclass(cls, np.ndarray):
    return "numpy"
  if issubclass(cls, jax.Array):
    return "jax"
  if issubclass(cls, (bool, int, float, complex, np.generic)):
    return "number"
  if issubclass(cls, (str, bytes)):
    return "text"
  tf = sys.modules.get("tensorflow")
  if tf is not None:
    if issubclass(cls, (tf.RaggedTensor, tf.SparseTensor)):
      return "tf_composite"
    if issubclass(cls, tf.Tensor):
      return "tf"
  torch = sys.modules.get("torch")
  if torch is not None and issubclass(cls, torch.Tensor):
    return "torch"
  return "other"


@functools.cache
def tf_dtype_problem(dtype: Any) -> tuple[str, str] | None:
  """(what, hint) when JAX cannot hold tensors of this tf.DType."""
  tf = sys.modules["tensorflow"]
  if dtype == tf.string:
    return "is a tf.string tensor", _STRING_HINT
  if not dtype.is_numpy_compatible or dtype in (tf.variant, tf.resource):
    return f"is a tf.Tensor of dtype {dtype.name}", "Only numeric and boolean tensors can be loaded."
  return None


def host_view(leaf: Any) -> np.ndarray:
  """A NumPy view of a checked leaf, sharing its memory when it lives on the host."""
  if isinstance(leaf, np.ndarray):  # the common case when stacking examples: no conversion
    return leaf
  return interop.to_numpy(leaf, device="cpu")


def on_host(leaf: Any) -> bool:
  """Whether a checked leaf lives in host memory (a jax.Array never counts)."""
  kind = _kind(type(leaf))
  if kind == "numpy":
    return True
  if kind == "torch":
    return leaf.device.type == "cpu"
  if kind == "tf":
    return leaf.device.rpartition("device:")[2].startswith("CPU")
  return False


def leading_dim(leaf: Any) -> int | None:
  shape = tuple(leaf.shape)
  return int(shape[0]) if shape else None


def dtype_of(leaf: Any) -> np.dtype:
  """The NumPy dtype of a checked leaf."""
  if isinstance(leaf, (np.ndarray, jax.Array)):
    return np.dtype(leaf.dtype)
  return _foreign_numpy_dtype(leaf.dtype)


@functools.cache
def _foreign_numpy_dtype(dtype: Any) -> np.dtype:
  """The NumPy dtype of a TF or torch dtype."""
  torch = sys.modules.get("torch")
  if torch is not None and isinstance(dtype, torch.dtype):
    if dtype == torch.bfloat16:
      import ml_dtypes  # pylint: disable=import-outside-toplevel
      return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(torch.empty((), dtype=dtype).numpy().dtype)
  return np.dtype(dtype.as_numpy_dtype)  # tf.DType


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, *, zero: bool = False) -> np.ndarray:
  """A host array whose buffer JAX's CPU client can alias without a copy."""
  dtype = np.dtype(dtype)
  size = math.prod(shape) * dtype.itemsize
  raw = (np.zeros if zero else np.empty)(size + ALIGNMENT, np.uint8)
  start = -raw.ctypes.data % ALIGNMENT
  return raw[start:start + size].view(dtype).reshape(shape)
