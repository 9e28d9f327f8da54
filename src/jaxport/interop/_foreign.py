"""DLPack capsules and arrays of other libraries (anything with `__dlpack__`).

They are described by reading a capsule. Host buffers are adopted as NumPy views (zero-copy) and
then converted like NumPy arrays; device buffers can only be imported as they are.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxport.errors import InteropInputError
from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._base import Buffer


def is_foreign(x: Any) -> bool:
  return _dlpack.is_capsule(x) or hasattr(type(x), "__dlpack__")


def _device_of(x: Any) -> _dlpack.Device:
  """`x.__dlpack_device__()` checked to be a (device type, id) pair of ints."""
  try:
    kind, index = x.__dlpack_device__()
    return int(kind), int(index)
  except (AttributeError, TypeError, ValueError) as error:
    raise InteropInputError(f"A {type(x).__name__} has __dlpack__ but no valid __dlpack_device__() "
                            f"({error}): it does not keep the DLPack protocol. Convert it with "
                            "its own library (e.g. to NumPy) first.") from None


class Foreign(_base.Framework):
  name, label = "dlpack", "DLPack producer"
  # Capsules are relabelled rather than viewed, so every supported dtype passes.
  dlpack_dtypes = holds = views = _dtypes.SUPPORTED

  def describe(self, x: Any, exact: bool = False) -> Buffer:
    if _dlpack.is_capsule(x):
      info = _dlpack.read_capsule(x)
      device = info.device
    else:  # export once to read the metadata; stream -1: no synchronisation needed for that
      device = _device_of(x)
      stream = None if device[0] == _dlpack.CPU else _dlpack.NO_SYNC
      try:  # as NumPy asks when adopting it, so read-only flags agree
        capsule = x.__dlpack__(stream=stream, max_version=(1, 0))
      except TypeError:  # a producer predating DLPack 1.0
        capsule = x.__dlpack__(stream=stream)
      info = _dlpack.read_capsule(capsule)
    strides = None
    layout = _base.ROW_MAJOR
    if info.strides is not None:
      layout = _base.classify(info.shape, info.strides)
      if layout != _base.ROW_MAJOR:
        strides = tuple(s * info.dtype.itemsize for s in info.strides)
    # An unversioned capsule cannot say whether its memory may be written: assume not (as NumPy).
    return Buffer(self, info.dtype, info.shape, layout, info.address, device,
                  info.read_only or not info.versioned, strides, protected=info.read_only)

  def producer(self, x: Any, buf: Buffer, send: np.dtype,
               consumer_immutable: bool) -> Any:
    return _dlpack.CapsuleProducer(x, buf.device) if _dlpack.is_capsule(x) else x

  def _no_copy(self, x: Any) -> Any:
    raise InteropInputError(f"A {type(x).__name__} in device memory can only be imported as it is; this "
                    "conversion needs a copy, layout change or device transfer first. Convert it "
                    "with its own library before handing it to jaxport.")

  compact = to_host = _no_copy


FOREIGN = Foreign()
