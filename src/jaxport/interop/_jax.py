"""JAX adapter: immutable arrays on CPU/GPU devices; 64-bit dtypes only with jax_enable_x64."""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.interop import _base, _dlpack, _dtypes
from jaxport.interop._base import Buffer
from jaxport.errors import DeletedArrayError, DeviceMismatchError, ZeroCopyError
from jaxport.interop._plan import Reason

_X64_TYPES = frozenset(_dtypes.X64_NARROWING)
_ARRAY: type | None = None  # the concrete jax.Array class, learnt from the first array seen
_SINGLE = jax.sharding.SingleDeviceSharding


def _resolve_import():
  """jaxlib's DLPack import without jax.dlpack.from_dlpack's per-call overhead (a failed stream
  lookup on CPU, a dtype-canonicalising copy), or None where this jaxlib lacks it: then the public
  API is used. Checked once on a scratch array, since its signature is not public."""
  try:
    from jax._src.lib import _jax as jaxlib  # pylint: disable=import-outside-toplevel
    from jax._src.lib import jaxlib_extension_version  # pylint: disable=import-outside-toplevel
    raw = jaxlib.dlpack_managed_tensor_to_buffer
  except (ImportError, AttributeError):
    return None
  if jaxlib_extension_version < 467:
    raw = lambda capsule, device, stream, copy, unused_type, f=raw: f(capsule, device, stream, copy)
  scratch = np.arange(16, dtype=np.int32)
  try:
    imported = raw(scratch.__dlpack__(), jax.devices("cpu")[0], None, None, _dlpack.CPU)
    if np.asarray(imported).tolist() != scratch.tolist():
      return None
  except Exception:  # pylint: disable=broad-except  # any mismatch: use the public API
    return None
  return raw


_UNRESOLVED = object()
_raw_import: Any = _UNRESOLVED  # resolved on first use: checking it initialises JAX's backend


def _raw_importer():
  """`_resolve_import()`'s result, resolved on first use."""
  global _raw_import
  if _raw_import is _UNRESOLVED:
    _raw_import = _resolve_import()
  return _raw_import


@functools.lru_cache(maxsize=None)
def dl_device(device: jax.Device) -> _dlpack.Device:
  """(DLDeviceType, id); JAX's CPU devices all address host memory but keep their ids here."""
  if device.platform == "cpu":
    return (_dlpack.CPU, device.id)
  kind = _dlpack.ROCM if "rocm" in device.client.platform_version.lower() else _dlpack.CUDA
  return (kind, device.local_hardware_id)


@functools.lru_cache(maxsize=None)
def _all_devices() -> dict[_dlpack.Device, jax.Device]:
  found = {}
  for backend in ("gpu", "cpu"):
    try:
      devices = jax.devices(backend)
    except RuntimeError:
      continue
    for device in devices:
      found.setdefault(dl_device(device), device)
  return found


def _concrete(x: Any) -> bool:
  """`x` is a jax.Array with buffers (not a tracer)."""
  global _ARRAY
  if type(x) is _ARRAY:
    return True
  if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
    _ARRAY = type(x)
    return True
  return False


def _stream(device: jax.Device) -> int | None:
  """The stream JAX wants producers to order their pending work before (DLPack protocol)."""
  try:
    return device.get_stream_for_external_ready_events()
  except jax.errors.JaxRuntimeError as error:
    if "UNIMPLEMENTED" in str(error):
      return None
    raise


def _import_error(error: jax.errors.JaxRuntimeError) -> Exception:
  """What a failed DLPack import raises: ZeroCopyError for a misaligned buffer, else `error`."""
  if "aligned" not in str(error):
    return error
  detail = str(error).split(":", 1)[-1].strip()
  return ZeroCopyError("DLPack", "JAX", [Reason("alignment", detail)])


class Jax(_base.Framework):
  name, label, modules = "jax", "JAX", ("jax", "jaxlib")
  immutable = True
  strides = "permuted"
  alignment = 64
  copies_unaligned = True
  dlpack_dtypes = _dtypes.SUPPORTED

  @property
  def cache_token(self) -> bool:
    return jax.config.jax_enable_x64

  @property
  def holds(self) -> frozenset:
    return _dtypes.SUPPORTED if jax.config.jax_enable_x64 else _dtypes.SUPPORTED - _X64_TYPES

  def narrowing(self, dtype: np.dtype) -> np.dtype | None:
    return _dtypes.x64_narrowed(dtype)

  # --- source side -----------------------------------------------------------------------
  def describe(self, x: Any, exact: bool = False) -> Buffer:
    if not _concrete(x):
      if isinstance(x, jax.core.Tracer):
        raise TypeError(f"jaxport.interop cannot convert a {type(x).__name__}: inside jit, grad "
                        "or vmap values have no buffer yet; convert outside the transformation.")
      if not isinstance(x, jax.Array):
        raise TypeError(f"jaxport.interop cannot convert a {type(x).__name__}: not a jax.Array.")
    if x.is_deleted():
      raise DeletedArrayError("jaxport.interop cannot convert a deleted jax.Array (x.delete() "
                              "was called, or it was donated to a jitted function): its buffer "
                              "is gone. Convert the array before deleting or donating it.")
    dtype = x.dtype
    if dtype not in _dtypes.SUPPORTED:
      _dtypes.check(dtype, "JAX")
    devices = x.sharding.device_set
    device = next(iter(devices)) if len(devices) == 1 else x.addressable_shards[0].device
    layout, address = _base.ROW_MAJOR, None
    if exact:
      address = x.unsafe_buffer_pointer()
      if x.ndim > 1 and tuple(x.format.layout.major_to_minor) != tuple(range(x.ndim)):
        layout = _base.PERMUTED
    return Buffer(self, dtype, x.shape, layout, address, dl_device(device), True)

  def multi_device(self, x: Any) -> bool:
    """`x` is a concrete jax.Array spread over several devices (converted shard by shard)."""
    if not _concrete(x):
      return False
    sharding = x.sharding
    return type(sharding) is not _SINGLE and len(sharding.device_set) > 1

  def placed(self, x: jax.Array, buf: Buffer, native: Any) -> bool:
    if native is None:
      return True
    if isinstance(native, jax.Device):
      return x.sharding.device_set == {native}
    return x.sharding.is_equivalent_to(native, x.ndim)

  def compact(self, x: jax.Array) -> jax.Array:
    return jnp.copy(x)

  def to_host(self, x: jax.Array) -> jax.Array:
    return jax.device_put(x, jax.devices("cpu")[0])

  def value_range(self, x: jax.Array) -> tuple[int, int]:
    return (int(x.min()), int(x.max())) if x.size else (0, 0)

  def synchronize(self, x: jax.Array) -> None:
    x.block_until_ready()

  # --- target side -----------------------------------------------------------------------
  def resolve_device(self, spec: Any):
    if isinstance(spec, jax.Device):
      return dl_device(spec), spec
    if isinstance(spec, jax.sharding.Sharding):
      devices = spec.device_set
      if len(devices) == 1:
        device, = devices
        return dl_device(device), device
      return None, spec
    if isinstance(spec, str):
      kind, index = _dlpack.parse_device(spec)
      platform = "cpu" if kind == _dlpack.CPU else "gpu"
      try:
        return self.resolve_device(jax.devices(platform)[index])
      except (RuntimeError, IndexError):
        raise DeviceMismatchError(f"JAX has no device {spec!r}; its devices: {self.devices()}.",
                                  None, spec) from None
    raise TypeError(f"device= for JAX takes a jax.Device, a Sharding or a string, not {spec!r}.")

  def can_address(self, device: _dlpack.Device) -> bool:
    return device in _all_devices()

  def devices(self) -> list[str]:
    return [str(d) for d in _all_devices().values()]

  def import_(self, producer: Any, device: _dlpack.Device, native: Any,
              copy: bool | None) -> jax.Array:
    raw = _raw_importer()
    target = native if isinstance(native, jax.Device) else _all_devices()[device]
    if raw is None:
      return jax.dlpack.from_dlpack(producer, device=target, copy=copy)
    stream = None if device[0] == _dlpack.CPU else _stream(target)
    capsule = producer.__dlpack__(stream=stream)
    try:
      return raw(capsule, target, stream, copy, device[0])
    except jax.errors.JaxRuntimeError as error:
      raise _import_error(error) from None

  def importer(self, device: _dlpack.Device, native: Any, copy: bool | None):
    raw = _raw_importer()
    if raw is None or device[0] != _dlpack.CPU:  # devices order by stream, per import
      return super().importer(device, native, copy)
    target = native if isinstance(native, jax.Device) else _all_devices()[device]
    kind = device[0]

    def import_host(producer: Any) -> jax.Array:
      try:
        return raw(producer.__dlpack__(stream=None), target, None, copy, kind)
      except jax.errors.JaxRuntimeError as error:
        raise _import_error(error) from None
    return import_host

  def copy(self, y: jax.Array) -> jax.Array:
    return jnp.array(y, copy=True)

  def transfer(self, y: jax.Array, native: Any) -> jax.Array:
    return jax.device_put(y, native)

  def narrow(self, y: jax.Array, dtype: np.dtype) -> jax.Array:
    return jnp.asarray(y, dtype)


JAX = _base.register(Jax())
