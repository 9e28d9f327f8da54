"""TensorFlow adapter: immutable eager tensors, compact row-major and 64-byte aligned.

TF's DLPack importer takes only unversioned capsules, no stream, no strides; it accepts an
unaligned buffer but TF kernels later abort the process on it, so imports are aligned first.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._base import Buffer

_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e4m3b11fnuz",
           "float8_e5m2fnuz")
_NON_NUMERIC_HINTS = {
    "string": "decode strings in TF (e.g. tf.strings.to_number, a lookup table) first",
    "variant": "variant tensors (datasets, tensor lists) hold no numeric buffer",
    "resource": "resource handles hold no numeric buffer; read the variable's value",
}


class TensorFlow(_base.Framework):
  name, label, modules = "tf", "TensorFlow", ("tensorflow",)
  immutable = True
  strides = "row-major"
  alignment = 64
  dlpack_dtypes = _dtypes.STANDARD | {_dtypes.BFLOAT16}
  holds = dlpack_dtypes | {_dtypes.FLOAT8[n] for n in _FLOAT8 if n in _dtypes.FLOAT8}
  views = (_dtypes.STANDARD - {_dtypes.BOOL}) | {_dtypes.BFLOAT16}  # tf.bitcast's types
  takes_stream = False

  def __init__(self):
    self._devices: dict[str, _dlpack.Device] = {}

  @functools.cached_property
  def _to_numpy(self) -> dict:
    tf = self.module
    table = {}
    for dtype in self.holds:
      try:
        table[tf.as_dtype(dtype)] = dtype
      except TypeError:
        continue
    return table

  @functools.cached_property
  def _from_numpy(self) -> dict:
    return {v: k for k, v in self._to_numpy.items()}

  def _dl_device(self, name: str) -> _dlpack.Device:
    try:
      return self._devices[name]
    except KeyError:
      kind, index = _dlpack.parse_device(name or "cpu")
      found = self._devices[name] = (kind, index)
      return found

  # --- source side -----------------------------------------------------------------------
  def unwrap(self, x: Any) -> Any:
    return x.value() if isinstance(x, self.module.Variable) else x

  def describe(self, x: Any, exact: bool = False) -> Buffer:
    if type(x).__name__ != "EagerTensor":
      what = "a symbolic tensor (inside tf.function)" if isinstance(x, self.module.Tensor) \
          else f"a {type(x).__name__}"
      raise TypeError(f"jaxport.interop converts eager TF tensors, not {what}.")
    dtype = self._to_numpy.get(x.dtype)
    if dtype is None:
      name = x.dtype.name
      raise _dtypes.unsupported(name, "TensorFlow", _NON_NUMERIC_HINTS.get(name, ""))
    address = None
    if exact and dtype in self.dlpack_dtypes:  # TF cannot export (so not share) float8 tensors
      address = _dlpack.read_capsule(self.module.experimental.dlpack.to_dlpack(x)).address
    return Buffer(self, dtype, tuple(x.shape), _base.ROW_MAJOR, address, self._dl_device(x.device),
                  True)

  def plan_key(self, x: Any) -> Any:
    # Eager tensors are always dense and row-major; alignment only matters to exact describes.
    return (x.dtype, x.device) if type(x).__name__ == "EagerTensor" else None

  def placed(self, x: Any, buf: Buffer, native: Any) -> bool:
    return native is None or buf.device == _dlpack.parse_device(native)

  def producer(self, x: Any, buf: Buffer, send: np.dtype,
               consumer_immutable: bool) -> Any:
    if send != buf.dtype:
      x = self.module.bitcast(x, self._from_numpy[send])
    if buf.device[0] != _dlpack.CPU:
      self.synchronize(x)  # TF's exporter ignores the consumer's stream
    return _dlpack.CapsuleProducer(self.module.experimental.dlpack.to_dlpack(x), buf.device)

  def exporter(self, buf: Buffer, send: np.dtype, consumer_immutable: bool):
    if send != buf.dtype or buf.device[0] != _dlpack.CPU:
      return super().exporter(buf, send, consumer_immutable)
    to_dlpack, device, producer = (self.module.experimental.dlpack.to_dlpack, buf.device,
                                   _dlpack.CapsuleProducer)
    return lambda x: producer(to_dlpack(x), device)

  def compact(self, x: Any) -> Any:
    return self.module.raw_ops.DeepCopy(x=x)

  def to_host(self, x: Any) -> Any:
    if self._to_numpy[x.dtype] not in self.dlpack_dtypes:
      return x.numpy()
    with self.module.device("/CPU:0"):
      return self.module.identity(x)

  def value_range(self, x: Any) -> tuple[int, int]:
    if x.shape.num_elements() == 0:
      return 0, 0
    tf = self.module
    try:
      return int(tf.reduce_min(x)), int(tf.reduce_max(x))
    except tf.errors.InvalidArgumentError:  # no kernel for this dtype (e.g. uint64)
      host = x.numpy()
      return int(host.min()), int(host.max())

  def synchronize(self, x: Any) -> None:
    self.module.test.experimental.sync_devices()

  # --- target side -----------------------------------------------------------------------
  def resolve_device(self, spec: Any):
    name = spec.to_string() if hasattr(spec, "to_string") else spec
    if not isinstance(name, str):
      raise TypeError(f"device= for TensorFlow takes a device string such as '/GPU:0', not "
                      f"{spec!r}.")
    kind, index = _dlpack.parse_device(name)
    return (kind, index), f"/{'CPU' if kind == _dlpack.CPU else 'GPU'}:{index}"

  def can_address(self, device: _dlpack.Device) -> bool:
    if device[0] == _dlpack.CPU:
      return True
    return device[0] == _dlpack.CUDA and device[1] < len(self._gpus)

  @functools.cached_property
  def _gpus(self) -> list:
    return self.module.config.list_logical_devices("GPU")

  def devices(self) -> list[str]:
    return ["cpu:0"] + [f"cuda:{i}" for i in range(len(self._gpus))]

  def import_(self, producer: Any, device, native: Any, copy: bool | None) -> Any:
    return self.module.experimental.dlpack.from_dlpack(producer.__dlpack__())

  def view(self, y: Any, dtype: np.dtype) -> Any:
    return self.module.bitcast(y, self._from_numpy[dtype])

  def copy(self, y: Any) -> Any:
    return self.module.raw_ops.DeepCopy(x=y)

  def transfer(self, y: Any, native: Any) -> Any:
    with self.module.device(native):
      return self.module.identity(y)

  def from_host(self, array: np.ndarray, native: Any) -> Any:
    with self.module.device(native or "/CPU:0"):
      return self.module.constant(array)


TF = _base.register(TensorFlow())
