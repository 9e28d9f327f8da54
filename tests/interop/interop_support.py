"""Builders and independent probes for the interop tests.

Arrays are made with each framework's own API and inspected with each framework's own API
(buffer addresses, values), never with jaxport's, so the tests check jaxport against the
frameworks themselves.
"""
from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import tensorflow as tf
import torch

ALIGN = 64
DTYPES = {
    "bool": np.dtype(np.bool_), "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64), "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
}
WIDE = {"int64", "uint64", "float64", "complex128"}  # JAX narrows these without x64
FLOAT8 = {"float8_e4m3fn", "float8_e5m2"}
CARRIER = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

# Layouts each framework's arrays can have.
LAYOUTS = {
    "numpy": ("contiguous", "transposed", "negative", "broadcast", "strided", "unaligned"),
    "torch": ("contiguous", "transposed", "broadcast", "strided", "unaligned"),
    "jax": ("contiguous", "transposed"),
    "tf": ("contiguous",),
}


def values(dtype: np.dtype, shape=(3, 4), seed: int = 0) -> np.ndarray:
  """Deterministic values exactly representable in `dtype` (and in every narrower sibling)."""
  rng = np.random.default_rng(seed)
  n = int(np.prod(shape))
  if dtype.kind == "b":
    data = rng.integers(0, 2, n).astype(bool)
  elif dtype.kind == "i":
    data = rng.integers(-100, 100, n)
  elif dtype.kind == "u":
    data = rng.integers(0, 200, n)
  elif dtype.kind == "c":
    data = rng.integers(-8, 8, n) * 0.5 + 1j * rng.integers(-8, 8, n) * 0.25
  else:
    data = rng.integers(-12, 12, n) * 0.5
  return data.astype(dtype).reshape(shape)


def aligned(array: np.ndarray, offset: int = 0) -> np.ndarray:
  """A copy of `array` whose data starts `offset` bytes past a 64-byte boundary."""
  nbytes = array.nbytes
  raw = np.empty(nbytes + 2 * ALIGN, np.uint8)
  start = (-raw.ctypes.data) % ALIGN + offset
  out = raw[start:start + nbytes].view(array.dtype).reshape(array.shape)
  out[...] = array
  return out


def _torch_dtype(dtype: np.dtype):
  return getattr(torch, dtype.name)


def torch_from_numpy(array: np.ndarray) -> torch.Tensor:
  """A torch tensor sharing `array`'s memory (bfloat16/float8 through same-width views)."""
  if array.dtype.kind == "V" or array.dtype in (DTYPES["bfloat16"], *(DTYPES[f] for f in FLOAT8)):
    bits = array.view(CARRIER[array.dtype.itemsize])
    return torch.from_numpy(bits).view(_torch_dtype(array.dtype))
  return torch.from_numpy(array)


def make(framework: str, layout: str, expected: np.ndarray):
  """An array of `framework` with logical value `expected` (see `logical`), laid out as `layout`."""
  if framework == "tf":
    return tf.constant(expected)
  if framework == "jax":
    if layout == "transposed":  # a jax.Array with a column-major (permuted) device layout
      return jax.dlpack.from_dlpack(torch_from_numpy(aligned(np.ascontiguousarray(expected.T))).t())
    return jax.device_put(expected)
  if framework == "numpy":
    return _numpy_layout(layout, expected)
  return _torch_layout(layout, expected)


def _numpy_layout(layout: str, expected: np.ndarray) -> np.ndarray:
  if layout == "contiguous":
    return aligned(expected)
  if layout == "transposed":
    return aligned(np.ascontiguousarray(expected.T)).T
  if layout == "negative":
    return aligned(np.ascontiguousarray(expected[::-1, ::-1]))[::-1, ::-1]
  if layout == "broadcast":
    return np.broadcast_to(aligned(expected[0]), expected.shape)
  if layout == "strided":
    return aligned(_interleaved(expected))[:, ::2]
  if layout == "unaligned":
    return aligned(expected, offset=expected.dtype.itemsize)
  raise ValueError(layout)


def _torch_layout(layout: str, expected: np.ndarray) -> torch.Tensor:
  if layout == "contiguous":
    return torch_from_numpy(aligned(expected))
  if layout == "transposed":
    return torch_from_numpy(aligned(np.ascontiguousarray(expected.T))).t()
  if layout == "broadcast":
    return torch_from_numpy(aligned(expected[0])).expand(expected.shape)
  if layout == "strided":
    return torch_from_numpy(aligned(_interleaved(expected)))[:, ::2]
  if layout == "unaligned":
    flat = expected.reshape(-1)
    return torch_from_numpy(aligned(np.concatenate([flat[:1], flat])))[1:].view(expected.shape)
  raise ValueError(layout)


def _interleaved(expected: np.ndarray) -> np.ndarray:
  """`expected` with a zero column after each column (its [:, ::2] is `expected`)."""
  wide = np.zeros((expected.shape[0], 2 * expected.shape[1]), expected.dtype)
  wide[:, ::2] = expected
  return wide


def logical(layout: str, expected: np.ndarray) -> np.ndarray:
  """The logical value `make` produces for `layout` (broadcast repeats the first row)."""
  return np.broadcast_to(expected[0], expected.shape) if layout == "broadcast" else expected


def framework_of(x) -> str:
  if isinstance(x, np.ndarray):
    return "numpy"
  if isinstance(x, torch.Tensor):
    return "torch"
  if isinstance(x, jax.Array):
    return "jax"
  if isinstance(x, tf.Tensor):
    return "tf"
  raise TypeError(type(x))


def address(x) -> int | None:
  """Address of `x`'s first element, read with the framework's own API (None: not exportable)."""
  kind = framework_of(x)
  if kind == "numpy":
    return x.__array_interface__["data"][0]
  if kind == "torch":
    return x.data_ptr()
  if kind == "jax":
    return x.unsafe_buffer_pointer()
  try:
    return torch.from_dlpack(tf.experimental.dlpack.to_dlpack(x)).data_ptr()
  except (tf.errors.InvalidArgumentError, RuntimeError, BufferError):
    return None  # TF cannot export float8: such a tensor is always TF's own copy


def to_host(x) -> np.ndarray:
  """`x`'s values as a NumPy array (ml_dtypes for bfloat16/float8), via the framework's API."""
  kind = framework_of(x)
  if kind == "numpy":
    return x
  if kind == "jax":
    return np.asarray(x)
  if kind == "tf":
    return x.numpy()
  x = x.detach().resolve_conj().cpu()
  name = str(x.dtype).split(".")[-1]
  if name == "bfloat16" or name.startswith("float8"):
    dtype = DTYPES[name]
    return x.contiguous().view(getattr(torch, np.dtype(CARRIER[dtype.itemsize]).name)) \
        .numpy().view(dtype)
  return x.numpy()


def dtype_of(x) -> np.dtype:
  kind = framework_of(x)
  if kind == "torch":
    return DTYPES[str(x.dtype).split(".")[-1]]
  if kind == "tf":
    return np.dtype(x.dtype.as_numpy_dtype)
  return np.dtype(x.dtype)


def same_values(actual: np.ndarray, expected: np.ndarray) -> bool:
  """Exact equality, dtype and shape included (bitwise, so NaN-free ml_dtypes compare too)."""
  return (actual.dtype == expected.dtype and actual.shape == expected.shape and
          np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes())
