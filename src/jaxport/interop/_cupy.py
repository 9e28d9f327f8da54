"""CuPy adapter: mutable arrays on CUDA (or ROCm) devices, NumPy's standard dtypes only."""
from __future__ import annotations

from typing import Any

import numpy as np

from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._base import Buffer
from jaxport.errors import DeviceMismatchError
from jaxport.interop._numpy import aligned_empty


class CuPy(_base.Framework):
  name, label, modules = "cupy", "CuPy", ("cupy",)
  strides = "non-negative"
  views = _dtypes.STANDARD

  @property
  def _gpu(self) -> int:
    return _dlpack.ROCM if self.module.cuda.runtime.is_hip else _dlpack.CUDA

  def _device_count(self) -> int:
    try:
      return self.module.cuda.runtime.getDeviceCount()
    except self.module.cuda.runtime.CUDARuntimeError:  # no driver or no device
      return 0

  # --- source side -----------------------------------------------------------------------
  def describe(self, x: Any, exact: bool = False) -> Buffer:
    if not isinstance(x, self.module.ndarray):
      raise TypeError(f"jaxport.interop cannot convert a CuPy {type(x).__name__}.")
    dtype = _dtypes.check(x.dtype, "CuPy")
    item = dtype.itemsize
    strides = None if x.flags.c_contiguous else x.strides
    if strides is None:
      layout = _base.ROW_MAJOR
    elif any(s % item for s in strides):
      layout = _base.IRREGULAR
    else:
      layout = _base.classify(x.shape, tuple(s // item for s in strides))
    return Buffer(self, dtype, x.shape, layout, x.data.ptr, (self._gpu, x.device.id), False,
                  strides)

  def placed(self, x: Any, buf: Buffer, native: Any) -> bool:
    return native is None or x.device.id == native

  def producer(self, x: Any, buf: Buffer, send: np.dtype,
               consumer_immutable: bool) -> Any:
    return x if send == buf.dtype else x.view(send)

  def compact(self, x: Any) -> Any:
    with x.device:
      return self.module.ascontiguousarray(x) if not x.flags.c_contiguous else x.copy()

  def to_host(self, x: Any) -> np.ndarray:
    out = aligned_empty(x.shape, x.dtype)
    x.get(out=out)
    return out

  def value_range(self, x: Any) -> tuple[int, int]:
    return (int(x.min()), int(x.max())) if x.size else (0, 0)

  def synchronize(self, x: Any) -> None:
    x.device.synchronize()

  # --- target side -----------------------------------------------------------------------
  def resolve_device(self, spec: Any):
    if isinstance(spec, str):
      kind, index = _dlpack.parse_device(spec)
      if kind not in (_dlpack.CUDA, _dlpack.ROCM):
        raise DeviceMismatchError(f"CuPy arrays live on GPUs; device={spec!r} is not one.", None,
                                  spec)
    else:
      index = spec.id if isinstance(spec, self.module.cuda.Device) else int(spec)
    return (self._gpu, index), index

  def can_address(self, device: _dlpack.Device) -> bool:
    return device[0] == self._gpu and device[1] < self._device_count()

  def devices(self) -> list[str]:
    return [f"cuda:{i}" for i in range(self._device_count())]

  def import_(self, producer: Any, device, native: Any, copy: bool | None) -> Any:
    with self.module.cuda.Device(device[1]):
      return self.module.from_dlpack(producer)

  def view(self, y: Any, dtype: np.dtype) -> Any:
    return y.view(dtype)

  def copy(self, y: Any) -> Any:
    with y.device:
      return y.copy()

  def transfer(self, y: Any, native: Any) -> Any:
    with self.module.cuda.Device(native):
      return self.module.array(y, copy=True)

  def from_host(self, array: np.ndarray, native: Any) -> Any:
    with self.module.cuda.Device(native if native is not None else 0):
      return self.module.asarray(array)


CUPY = _base.register(CuPy())
