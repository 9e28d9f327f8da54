"""PyTorch adapter: mutable tensors with non-negative strides on CPU/CUDA; no read-only tensors."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._base import Buffer

_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
# torch dtypes that interop moves, as NumPy dtypes; built when torch is first used.
_NAMES = {"bool": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32,
          "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
          "uint64": np.uint64, "float16": np.float16, "float32": np.float32,
          "float64": np.float64, "complex64": np.complex64, "complex128": np.complex128,
          "bfloat16": _dtypes.BFLOAT16}


class _OnDevice:
  """Exports a CUDA tensor with its device current: torch refuses to export from another one."""
  __slots__ = ("tensor",)

  def __init__(self, tensor):
    self.tensor = tensor

  def __dlpack__(self, **kwargs):
    import torch  # pylint: disable=import-outside-toplevel
    with torch.cuda.device(self.tensor.device):
      return self.tensor.__dlpack__(**kwargs)

  def __dlpack_device__(self):
    return self.tensor.__dlpack_device__()


class Torch(_base.Framework):
  name, label, modules = "torch", "PyTorch", ("torch",)
  strides = "non-negative"

  def __init__(self):
    self._devices: dict[Any, _dlpack.Device] = {}

  @functools.cached_property
  def holds(self) -> frozenset:
    """What this torch build has; it exports, imports and views all of them."""
    return frozenset(self._to_numpy.values())

  @property
  def dlpack_dtypes(self) -> frozenset:
    return self.holds

  @property
  def views(self) -> frozenset:
    return self.holds

  @functools.cached_property
  def _to_numpy(self) -> dict:
    torch = self.module
    table = {getattr(torch, n): np.dtype(t) for n, t in _NAMES.items() if hasattr(torch, n)}
    table.update({getattr(torch, n): _dtypes.FLOAT8[n] for n in _FLOAT8
                  if hasattr(torch, n) and n in _dtypes.FLOAT8})
    return table

  @functools.cached_property
  def _from_numpy(self) -> dict:
    return {v: k for k, v in self._to_numpy.items()}

  def _dl_device(self, device) -> _dlpack.Device:
    try:
      return self._devices[device]
    except KeyError:
      found = (_dlpack.CPU, 0) if device.type == "cpu" else (
          (_dlpack.ROCM if self.module.version.hip else _dlpack.CUDA, device.index or 0)
          if device.type == "cuda" else (-1, device.index or 0))
      self._devices[device] = found
      return found

  # --- source side -----------------------------------------------------------------------
  def describe(self, x: Any, exact: bool = False) -> Buffer:
    torch = self.module
    if not isinstance(x, torch.Tensor):
      raise TypeError(f"jaxport.interop cannot convert a {type(x).__module__}."
                      f"{type(x).__name__}: not a tensor.")
    dtype = self._to_numpy.get(x.dtype)
    if dtype is None or x.is_quantized:
      raise _dtypes.unsupported(str(x.dtype), "PyTorch")
    if x.layout is not torch.strided:
      raise TypeError(f"jaxport.interop shares dense tensors only, not {x.layout} ones; call "
                      ".to_dense() first.")
    device = self._dl_device(x.device)
    if device[0] < 0:
      raise TypeError(f"jaxport.interop cannot share tensors on the {x.device} device.")
    if x.is_contiguous():
      layout, strides = _base.ROW_MAJOR, None
    else:
      layout = _base.classify(x.shape, x.stride())
      strides = tuple(s * dtype.itemsize for s in x.stride())
    lazy = "conjugation" if x.is_conj() else "negation" if x.is_neg() else ""
    return Buffer(self, dtype, tuple(x.shape), layout, x.data_ptr() if exact else None, device,
                  False, strides, autograd=x.requires_grad, lazy=lazy)

  def placed(self, x: Any, buf: Buffer, native: Any) -> bool:
    return native is None or x.device == native

  def detach(self, x: Any) -> Any:
    return x.detach()

  def resolve(self, x: Any) -> Any:
    return x.resolve_conj().resolve_neg()

  def producer(self, x: Any, buf: Buffer, send: np.dtype, consumer_immutable: bool) -> Any:
    if send != buf.dtype:
      x = x.view(self._from_numpy[send])
    if buf.device[0] == _dlpack.CPU:
      if consumer_immutable:  # an unversioned capsule (no writable flag needed), 8x cheaper
        return _dlpack.CapsuleProducer(self.module.utils.dlpack.to_dlpack(x), buf.device)
      return x
    if x.device.index != self.module.cuda.current_device():
      return _OnDevice(x)
    return x

  def compact(self, x: Any) -> Any:
    return self.module.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x)

  def to_host(self, x: Any) -> Any:
    return x.cpu()

  def value_range(self, x: Any) -> tuple[int, int]:
    if x.numel() == 0:
      return 0, 0
    try:
      return int(x.min()), int(x.max())
    except (RuntimeError, NotImplementedError):  # no min/max kernel for uint64 on some devices
      host = x.cpu().view(self.module.int64).numpy().view(np.uint64)
      return int(host.min()), int(host.max())

  def synchronize(self, x: Any) -> None:
    if x.device.type == "cuda":
      self.module.cuda.current_stream(x.device).synchronize()

  # --- target side -----------------------------------------------------------------------
  def resolve_device(self, spec: Any):
    torch = self.module
    if isinstance(spec, str):  # jaxport's device names ('gpu:1', 'cuda', 'cpu:0') or torch's
      kind, index = _dlpack.parse_device(spec)
      current = ":" not in spec and kind != _dlpack.CPU and torch.cuda.is_available()
      device = torch.device("cpu") if kind == _dlpack.CPU else \
          torch.device("cuda", torch.cuda.current_device() if current else index)
    else:
      device = torch.device(spec)
    return self._dl_device(device), device

  def can_address(self, device: _dlpack.Device) -> bool:
    if device[0] == _dlpack.CPU:
      return True
    cuda = self.module.cuda
    gpu = _dlpack.ROCM if self.module.version.hip else _dlpack.CUDA
    return device[0] == gpu and cuda.is_available() and device[1] < cuda.device_count()

  def devices(self) -> list[str]:
    cuda = self.module.cuda
    return ["cpu:0"] + ([f"cuda:{i}" for i in range(cuda.device_count())]
                      if cuda.is_available() else [])

  def import_(self, producer: Any, device, native: Any, copy: bool | None) -> Any:
    return self.module.from_dlpack(producer)

  def view(self, y: Any, dtype: np.dtype) -> Any:
    return y.view(self._from_numpy[dtype])

  def copy(self, y: Any) -> Any:
    return y.clone()

  def transfer(self, y: Any, native: Any) -> Any:
    return y.to(native)


TORCH = _base.register(Torch())
