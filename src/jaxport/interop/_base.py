"""What every framework adapter provides, and the framework-neutral description of a buffer.

An adapter describes its arrays as `Buffer`s (source side), declares what its DLPack importer
accepts (target side), and implements the few operations the conversion pipeline needs. Adapters
import their framework lazily: only when one of its arrays is seen or it is the requested target.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np

from jaxport.interop import _dlpack, _dtypes
from jaxport.interop._dlpack import Device

# Layout classes, from most to least widely accepted.
ROW_MAJOR = 0    # compact, C order
PERMUTED = 1     # compact, dimensions permuted (e.g. a transpose)
STRIDED = 2      # non-negative strides with gaps or zeros (slices, broadcasts)
NEGATIVE = 3     # some stride negative (reversed views)
IRREGULAR = 4    # strides not a multiple of the element size
LAYOUT_NAMES = ("row-major", "permuted (transposed)", "gapped or zero (broadcast)", "negative",
                "non-element-multiple")

# Stride policies of DLPack importers: the worst layout class each accepts.
ACCEPTS = {"any": NEGATIVE, "non-negative": STRIDED, "permuted": PERMUTED, "row-major": ROW_MAJOR}


class Buffer(NamedTuple):
  """A source array as the pipeline sees it."""
  framework: "Framework"
  dtype: np.dtype
  shape: tuple[int, ...]
  layout: int
  address: int | None       # None where reading it would cost an export (the buffer is aligned)
  device: Device
  read_only: bool           # the memory must not be written (immutable framework or flag)
  strides: tuple[int, ...] | None = None  # in bytes, for non-compact layouts only
  owned: bool = False       # nothing else references this buffer (a fresh copy)
  autograd: bool = False    # torch: requires_grad, exported detached
  lazy: str = ""            # torch: a pending conjugation/negation bit that exporting must apply
  protected: bool = False   # the memory is flagged read-only (NumPy flag, DLPack flag): it may be
  #                           mapped read-only, so that a write through a shared view crashes


def extent(buf: Buffer) -> tuple[int, int]:
  """[first, last) byte addresses `buf` spans; empty when it has no elements."""
  item = buf.dtype.itemsize
  if any(n == 0 for n in buf.shape):
    return buf.address, buf.address
  if buf.strides is None:
    return buf.address, buf.address + item * int(np.prod(buf.shape, dtype=np.int64))
  low = sum(s * (n - 1) for s, n in zip(buf.strides, buf.shape) if s < 0)
  high = sum(s * (n - 1) for s, n in zip(buf.strides, buf.shape) if s > 0)
  return buf.address + low, buf.address + high + item


def classify(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> int:
  """Layout class of a buffer with element `strides` (None: compact row-major)."""
  if strides is None:
    return ROW_MAJOR
  dims = [(s, n) for s, n in zip(strides, shape) if n != 1]
  if any(n == 0 for n in shape):
    return ROW_MAJOR
  expected = 1
  for stride, size in reversed(dims):
    if stride != expected:
      break
    expected *= size
  else:
    return ROW_MAJOR
  if any(s < 0 for s, _ in dims):
    return NEGATIVE
  expected = 1
  for stride, size in sorted(dims):
    if stride != expected:
      return STRIDED
    expected *= size
  return PERMUTED


class Framework:
  """Base adapter. Class attributes declare capabilities; methods do the framework's part."""
  name: ClassVar[str]            # "numpy", "jax", "torch", "tf", "cupy"
  label: ClassVar[str]           # human name for messages
  modules: ClassVar[tuple[str, ...]] = ()   # top-level modules whose types this adapter owns
  immutable: ClassVar[bool] = False         # its arrays are never written in place
  marks_read_only: ClassVar[bool] = False   # it can flag a shared buffer read-only
  strides: ClassVar[str] = "any"            # what its DLPack importer accepts (see ACCEPTS)
  alignment: ClassVar[int] = 0              # byte alignment its importer needs (0: none)
  copies_unaligned: ClassVar[bool] = False  # it copies unaligned buffers itself on import
  dlpack_dtypes: ClassVar[frozenset] = _dtypes.STANDARD  # dtypes it exports and imports
  holds: ClassVar[frozenset] = _dtypes.STANDARD          # dtypes its arrays can have
  views: ClassVar[frozenset] = frozenset()               # dtypes it reinterprets without a copy
  takes_stream: ClassVar[bool] = True       # its importer passes its stream to GPU producers

  _module: Any = None

  @property
  def module(self):
    """The framework's module, imported on first use."""
    if self._module is None:
      try:
        type(self)._module = importlib.import_module(self.modules[0])
      except ImportError as error:
        raise ImportError(f"Converting to {self.label} needs the '{self.modules[0]}' package, "
                          "which is not installed.") from error
    return self._module

  @property
  def cache_token(self) -> Any:
    """Mutable state (beyond the class attributes) that plans for this target depend on."""
    return None

  @functools.cached_property
  def needs_exact(self) -> bool:
    """Sources must report exact layout and address (costly for some) before importing here."""
    return self.strides == "row-major" or bool(self.alignment and not self.copies_unaligned)

  # --- source side -----------------------------------------------------------------------
  def unwrap(self, x: Any) -> Any:
    """The exportable array behind `x` (e.g. a variable's current value)."""
    return x

  def describe(self, x: Any, exact: bool = False) -> Buffer:
    """`x` as a Buffer; TypeError for non-arrays and unsupported dtypes (before any export).
    `exact`: also find layout and address where that costs an export."""
    raise NotImplementedError

  def plan_key(self, x: Any) -> Any:
    """A cheap hashable summary of `x` such that arrays with equal summaries describe to buffers
    that plan alike (all of Buffer but the shape), or None where only describe() can tell, e.g.
    where layout or address vary from array to array."""
    return None

  def placed(self, x: Any, buf: Buffer, native: Any) -> bool:
    """`x` already sits on the device `native` (a target-side spec of this framework)."""
    return native is None or buf.device == self.resolve_device(native)[0]

  def detach(self, x: Any) -> Any:
    return x

  def resolve(self, x: Any) -> Any:
    return x

  def synchronize(self, x: Any) -> None:
    """Blocks until pending device work writing `x` is done (for importers without streams)."""

  def producer(self, x: Any, buf: Buffer, send: np.dtype, consumer_immutable: bool) -> Any:
    """The object handed to consumers' from_dlpack, exporting `x` as dtype `send`
    (`consumer_immutable`: the consumer never writes the buffer)."""
    return x if send == buf.dtype else self.view(x, send)

  def exporter(self, buf: Buffer, send: np.dtype,
               consumer_immutable: bool) -> Callable[[Any], Any]:
    """`producer` for any array described like `buf` (repeated conversions), with what it
    decides from `buf` decided once."""
    return lambda x: self.producer(x, buf, send, consumer_immutable)

  def compact(self, x: Any) -> Any:
    """A fresh, compact, row-major, 64-byte-aligned copy of `x`, in this framework."""
    raise NotImplementedError

  def to_host(self, x: Any) -> Any:
    """A fresh copy of `x` in host memory (any framework's array, compact and aligned)."""
    raise NotImplementedError

  def value_range(self, x: Any) -> tuple[int, int]:
    """(min, max) of an integer array, as Python ints."""
    raise NotImplementedError

  # --- target side -----------------------------------------------------------------------
  def resolve_device(self, spec: Any) -> tuple[Device | None, Any]:
    """`device=` argument -> (DLPack device or None when it spans several, native spec)."""
    device = _dlpack.parse_device(spec) if isinstance(spec, str) else spec
    return device, device

  def can_address(self, device: Device) -> bool:
    return device[0] == _dlpack.CPU

  def devices(self) -> list[str]:
    return ["cpu:0"]

  def import_(self, producer: Any, device: Device, native: Any, copy: bool | None) -> Any:
    """Zero-copy DLPack import of `producer` (lives on `device`)."""
    raise NotImplementedError

  def importer(self, device: Device, native: Any, copy: bool | None) -> Callable[[Any], Any]:
    """`import_` for repeated imports from `device` with the same options."""
    return lambda producer: self.import_(producer, device, native, copy)

  def view(self, y: Any, dtype: np.dtype) -> Any:
    """`y` reinterpreted as `dtype` of the same width (zero-copy for dtypes in `views`)."""
    raise NotImplementedError

  def copy(self, y: Any) -> Any:
    raise NotImplementedError

  def transfer(self, y: Any, native: Any) -> Any:
    raise NotImplementedError

  def from_host(self, array: np.ndarray, native: Any) -> Any:
    """A new array holding a copy of host `array` (any dtype in `holds`), on `native` device."""
    raise NotImplementedError

  def narrowing(self, dtype: np.dtype) -> np.dtype | None:
    """The dtype this target stores `dtype` as when it cannot hold it exactly (JAX without x64)."""
    return None

  def narrow(self, y: Any, dtype: np.dtype) -> Any:
    raise NotImplementedError

  def mark_read_only(self, y: Any) -> Any:
    return y

  def __repr__(self):
    return f"<jaxport.interop {self.label} adapter>"


_BY_MODULE: dict[str, Framework] = {}
_BY_NAME: dict[str, Framework] = {}
_BY_TYPE: dict[type, Framework | None] = {}


def register(framework: Framework) -> Framework:
  _BY_NAME[framework.name] = framework
  for module in framework.modules:
    _BY_MODULE[module] = framework
  return framework


def by_name(name: str) -> Framework:
  try:
    return _BY_NAME[name]
  except KeyError:
    raise ValueError(f"Unknown interop target {name!r}; one of {sorted(_BY_NAME)}.") from None


def owner(x: Any) -> Framework | None:
  """The adapter whose framework `x` belongs to, found by its type's top-level module."""
  cls = type(x)
  try:
    return _BY_TYPE[cls]
  except KeyError:
    framework = _BY_MODULE.get(cls.__module__.partition(".")[0])
    _BY_TYPE[cls] = framework
    return framework
