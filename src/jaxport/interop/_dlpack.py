"""DLPack at the C level: devices, capsule inspection and dtype relabelling.

Structures follow dlpack.h (v1.1). Capsules are only read, and relabelled in place before
their single consumption; jaxport never allocates or frees a DLManagedTensor itself.
"""
from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

import numpy as np

from jaxport.errors import DeletedArrayError, InteropInputError
from jaxport.interop import _dtypes

# DLDeviceType values.
CPU, CUDA, CUDA_HOST, OPENCL, VULKAN, METAL, VPI, ROCM, ROCM_HOST = 1, 2, 3, 4, 7, 8, 9, 10, 11
CUDA_MANAGED, ONE_API = 13, 14
_DEVICE_NAMES = {CPU: "cpu", CUDA: "cuda", CUDA_HOST: "cuda_host", OPENCL: "opencl",
                 VULKAN: "vulkan", METAL: "metal", VPI: "vpi", ROCM: "rocm",
                 ROCM_HOST: "rocm_host", CUDA_MANAGED: "cuda_managed", ONE_API: "oneapi"}
_DEVICE_TYPES = {**{v: k for k, v in _DEVICE_NAMES.items()}, "gpu": CUDA}

Device = tuple[int, int]  # (DLDeviceType, device id), as returned by __dlpack_device__
HOST: Device = (CPU, 0)

NO_SYNC = -1  # the DLPack `stream` value asking the producer not to synchronise

READ_ONLY_FLAG = 1  # DLPACK_FLAG_BITMASK_READ_ONLY


def device_name(device: Device) -> str:
  kind, index = device
  return f"{_DEVICE_NAMES.get(int(kind), f'device_type_{int(kind)}')}:{index}"


def parse_device(spec: str) -> Device:
  """'cpu', 'cuda:1', 'gpu:0', 'rocm', '/GPU:0', '/job:x/device:GPU:1' -> (DLDeviceType, id)."""
  text = spec.lower().rsplit("device:", 1)[-1].strip("/")
  kind, _, index = text.partition(":")
  if kind not in _DEVICE_TYPES or (index and not index.isdigit()):
    raise ValueError(f"Unknown device {spec!r}; expected e.g. 'cpu', 'cuda:0' or 'gpu:1'.")
  return (_DEVICE_TYPES[kind], int(index or 0))


class _DLDevice(ctypes.Structure):
  _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
  _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
  _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
              ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
              ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
  _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
              ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):
  _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32),
              ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
              ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_get_name = ctypes.pythonapi.PyCapsule_GetName
_get_name.restype, _get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype, _get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]

_UNVERSIONED, _VERSIONED = b"dltensor", b"dltensor_versioned"


def is_capsule(x: Any) -> bool:
  return type(x).__name__ == "PyCapsule" and type(x).__module__ == "builtins"


class CapsuleInfo(NamedTuple):
  address: int
  shape: tuple[int, ...]
  strides: tuple[int, ...] | None  # elements; None: compact row-major
  dtype: np.dtype
  device: Device
  read_only: bool
  versioned: bool


def _managed(capsule: Any) -> tuple[_DLManagedTensor | _DLManagedTensorVersioned, bool]:
  if not is_capsule(capsule):
    raise InteropInputError(f"Expected a DLPack capsule, got a {type(capsule).__name__}: the "
                            "array's __dlpack__() does not keep the DLPack protocol. Convert it "
                            "with its own library (e.g. to NumPy) before handing it to jaxport.")
  name = _get_name(capsule)
  if name in (_UNVERSIONED, _VERSIONED):
    versioned = name == _VERSIONED
    struct = _DLManagedTensorVersioned if versioned else _DLManagedTensor
    return struct.from_address(_get_pointer(capsule, name)), versioned
  if name and name.startswith(b"used_"):
    raise DeletedArrayError("This DLPack capsule was already consumed: a capsule can be imported only "
                     "once. Export the source array again (its __dlpack__ method, or convert the "
                     "array itself rather than a capsule).")
  raise InteropInputError(f"Not a DLPack capsule (capsule name {name!r}): jaxport.interop takes "
                          "capsules named 'dltensor' or 'dltensor_versioned'; pass the array "
                          "itself, or a capsule from its __dlpack__().")


def read_capsule(capsule: Any) -> CapsuleInfo:
  """Reads a capsule's buffer description without consuming it."""
  managed, versioned = _managed(capsule)
  tensor = managed.dl_tensor
  code = (tensor.dtype.code, tensor.dtype.bits)
  if tensor.dtype.lanes != 1 or code not in _dtypes.FROM_DLPACK_CODE:
    raise _dtypes.unsupported(f"DLPack type code {code[0]}, {code[1]} bits, {tensor.dtype.lanes} "
                              "lanes", "DLPack")
  ndim = tensor.ndim
  shape = tuple(tensor.shape[i] for i in range(ndim))
  strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else None
  read_only = bool(versioned and managed.flags & READ_ONLY_FLAG)
  return CapsuleInfo((tensor.data or 0) + tensor.byte_offset, shape, strides,
                     _dtypes.FROM_DLPACK_CODE[code], (tensor.device.device_type,
                                                      tensor.device.device_id),
                     read_only, versioned)


def retag(capsule: Any, dtype: np.dtype) -> Any:
  """Relabels an unconsumed capsule's elements as `dtype` of the same width: a zero-copy bitcast."""
  tensor = _managed(capsule)[0].dl_tensor
  code, bits = _dtypes.DLPACK_CODE[dtype]
  if tensor.dtype.bits != bits or tensor.dtype.lanes != 1:
    raise AssertionError(f"cannot relabel {tensor.dtype.bits}-bit elements as {dtype}")
  tensor.dtype.code = code
  return capsule


class Retagged:
  """A DLPack producer that relabels `producer`'s capsules as `dtype` of the same width.

  The export happens when the consumer asks (with its own stream argument), so stream ordering
  is the consumer's and producer's as usual.
  """
  __slots__ = ("producer", "dtype")

  def __init__(self, producer: Any, dtype: np.dtype):
    self.producer, self.dtype = producer, dtype

  def __dlpack__(self, **kwargs):
    return retag(self.producer.__dlpack__(**kwargs), self.dtype)

  def __dlpack_device__(self):
    return self.producer.__dlpack_device__()


class CapsuleProducer:
  """Presents an already exported capsule to consumers that want a `__dlpack__` object.

  The capsule was exported before any consumer stream was known, so it adds no stream ordering:
  jaxport uses it for host memory, for TF (synchronised before export) and for user capsules.
  """
  __slots__ = ("capsule", "device")

  def __init__(self, capsule: Any, device: Device):
    self.capsule, self.device = capsule, device

  def __dlpack__(self, **unused_kwargs):
    capsule, self.capsule = self.capsule, None
    if capsule is None:
      raise DeletedArrayError("This DLPack capsule was already consumed: export the source "
                              "array again.")
    return capsule

  def __dlpack_device__(self):
    return self.device
