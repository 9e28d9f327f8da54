"""NumPy adapter: host memory, any strides, every dtype (bfloat16 and float8 via ml_dtypes)."""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._base import Buffer
from jaxport.errors import DeviceMismatchError

ALIGNMENT = 64  # bytes; what JAX (CPU) and TensorFlow need to share a buffer


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype,
                  alignment: int = ALIGNMENT) -> np.ndarray:
  """An uninitialised C-order array whose data starts on an `alignment`-byte boundary."""
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + alignment, np.uint8)
  start = (-raw.ctypes.data) % alignment
  return raw[start:start + nbytes].view(dtype).reshape(shape)


def _protected(x: np.ndarray) -> bool:
  """Whether read-only `x` may view memory that is itself read-only (a read-only np.memmap,
  bytes, another library's buffer): true unless its bases lead to memory NumPy owns, which only a
  flag guards (read-only views such as broadcasts, arrays whose flag was cleared)."""
  node: Any = x
  while node is not None:
    if isinstance(node, np.ndarray):
      if node.flags.writeable or node.base is None:
        return False
    elif type(node).__name__ != "DummyArray":  # as_strided's holder of its base
      return True
    node = node.base
  return False


class _Alias:
  """Exposes a read-only array's memory as writable, for consumers that never write (JAX, TF).

  NumPy refuses to export read-only arrays as unversioned DLPack capsules (which cannot carry a
  read-only flag), and those consumers only take unversioned ones.
  """
  __slots__ = ("__array_interface__", "owner")

  def __init__(self, array: np.ndarray):
    interface = dict(array.__array_interface__)
    interface["data"] = (interface["data"][0], False)
    self.__array_interface__, self.owner = interface, array


class NumPy(_base.Framework):
  name, label, modules = "numpy", "NumPy", ("numpy",)
  marks_read_only = True
  strides = "any"
  dlpack_dtypes = _dtypes.STANDARD
  holds = _dtypes.SUPPORTED
  views = _dtypes.SUPPORTED

  def describe(self, x: Any, exact: bool = False) -> Buffer:
    if type(x) is not np.ndarray and (not isinstance(x, np.ndarray)
                                      or isinstance(x, np.ma.MaskedArray)):
      kind = "masked array (its mask would be lost; use .filled() or .data)" \
          if isinstance(x, np.ndarray) else type(x).__name__
      raise TypeError(f"jaxport.interop cannot convert a NumPy {kind}.")
    dtype = x.dtype
    if dtype not in _dtypes.SUPPORTED:
      _dtypes.check(dtype)
    flags = x.flags
    if flags.c_contiguous:
      layout, strides = _base.ROW_MAJOR, None
    else:
      item, strides = dtype.itemsize, x.strides
      layout = _base.IRREGULAR if any(s % item for s in strides) else \
          _base.classify(x.shape, tuple(s // item for s in strides))
    address = x.__array_interface__["data"][0] if exact else None
    read_only = not flags.writeable
    return Buffer(self, dtype, x.shape, layout, address, _dlpack.HOST, read_only, strides,
                  protected=read_only and _protected(x))

  def producer(self, x: np.ndarray, buf: Buffer, send: np.dtype,
               consumer_immutable: bool) -> Any:
    if send != buf.dtype:
      x = x.view(send)
    if buf.read_only and consumer_immutable:
      x = np.asarray(_Alias(x))
    return x

  def compact(self, x: np.ndarray) -> np.ndarray:
    out = aligned_empty(x.shape, x.dtype)
    np.copyto(out, x)
    return out

  def value_range(self, x: np.ndarray) -> tuple[int, int]:
    return (int(x.min()), int(x.max())) if x.size else (0, 0)

  def resolve_device(self, spec: Any):
    device = _dlpack.parse_device(spec) if isinstance(spec, str) else spec
    if not (isinstance(device, tuple) and device[0] == _dlpack.CPU):
      raise DeviceMismatchError(f"NumPy arrays live in host memory; device={spec!r} is not "
                                "'cpu'.", None, str(spec))
    return _dlpack.HOST, "cpu"

  def import_(self, producer: Any, device, native: Any, copy: bool | None) -> np.ndarray:
    return np.from_dlpack(producer)

  def view(self, y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return y.view(dtype)

  def copy(self, y: np.ndarray) -> np.ndarray:
    return y.copy()

  def transfer(self, y: np.ndarray, native: Any) -> np.ndarray:
    return y

  def from_host(self, array: np.ndarray, native: Any) -> np.ndarray:
    return array.copy()

  def mark_read_only(self, y: np.ndarray) -> np.ndarray:
    y.flags.writeable = False
    return y


NUMPY = _base.register(NumPy())
