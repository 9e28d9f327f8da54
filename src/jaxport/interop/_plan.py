"""Deciding, from a buffer's description and the target's capabilities, whether to share or copy.

`decide` is pure: the conversion pipeline executes its `Plan` and `explain` returns it, so what
explain reports is what a conversion does.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple

import numpy as np

from jaxport.interop import _dtypes
from jaxport.interop._base import ACCEPTS, IRREGULAR, LAYOUT_NAMES, Buffer, Framework
from jaxport.interop._dlpack import CPU, HOST, Device, device_name
from jaxport.errors import DeviceMismatchError, ZeroCopyError

_ALIGN = 64  # the largest alignment any target needs; every target's need divides it

ReasonKind = Literal["alignment", "dtype", "strides", "device", "read-only", "lazy", "requested",
                     "no-buffer"]


class Reason(NamedTuple):
  """Why a conversion copies: `kind` is one of ReasonKind, `detail` a sentence."""
  kind: ReasonKind
  detail: str


class Request(NamedTuple):
  """A conversion's target and options, resolved once per call."""
  target: Framework
  device: Device | None   # requested DLPack device; None: the source's (or several, see spans)
  native: Any             # the target framework's own device object, or None
  spans: bool             # the requested placement spans several devices (a JAX sharding)
  copy: bool | None
  writable: bool


@dataclasses.dataclass(frozen=True)
class Plan:
  """How one array converts: whether it shares memory, why not, and the steps taken.

  Source-side steps (detach, resolve, host, compact) run first; the pipeline then describes the
  result again and plans the rest, so a plan with source steps is exact in `zero_copy` and in the
  first copy's reasons.
  """
  source: str
  target: str
  zero_copy: bool
  reasons: tuple[Reason, ...] = ()
  notes: tuple[str, ...] = ()
  identity: bool = False       # same framework: the input itself (or its copy/transfer) results
  dtype: np.dtype | None = None       # the source dtype
  detach: bool = False
  resolve: bool = False
  host: bool = False
  compact: bool = False
  send: np.dtype | None = None        # dtype the source exports
  wire: np.dtype | None = None        # dtype the target's importer sees (capsule relabelled)
  via_host: bool = False              # target builds a new array from a host view
  import_device: Device | None = None
  check_range: np.dtype | None = None  # integers must fit this narrower dtype
  narrow: np.dtype | None = None
  transfer: bool = False
  final_copy: bool = False
  mark_read_only: bool = False

  source_steps: bool = False   # any of detach, resolve, host, compact
  post_steps: bool = False     # any step after the import (view, narrow, transfer, copy, mark)

  @property
  def steps(self) -> tuple[str, ...]:
    """The plan as readable steps, in execution order."""
    if self.identity:
      return ("copy",) if self.final_copy else ("transfer",) if self.transfer else ("none",)
    out = []
    if self.detach:
      out.append("detach from autograd")
    if self.resolve:
      out.append("apply lazy conjugation/negation (copy)")
    if self.host:
      out.append("copy to host")
    if self.compact:
      out.append("copy to a compact aligned buffer")
    if self.source_steps:
      out.append("then plan again")
      return tuple(out)
    if self.check_range is not None:
      out.append(f"check values fit {self.check_range}")
    if self.via_host:
      out.append(f"copy into a new {self.target} array")
    else:
      if self.send != self.dtype:
        out.append(f"view the source as {self.send}")
      if self.wire != self.send:
        out.append(f"relabel the DLPack capsule as {self.wire}")
      out.append(f"DLPack import onto {device_name(self.import_device)}")
      if self.wire != self.dtype:
        out.append(f"view the result as {self.dtype}")
    if self.narrow is not None:
      out.append(f"narrow to {self.narrow} (copy)")
    if self.transfer:
      out.append("transfer to the requested device (copy)")
    if self.final_copy:
      out.append("copy")
    if self.mark_read_only:
      out.append("mark read-only")
    return tuple(out)

  def __str__(self):
    head = f"{self.source} -> {self.target}: " + ("zero-copy" if self.zero_copy else "copies")
    lines = [head] + [f"  {r.kind}: {r.detail}" for r in self.reasons]
    lines += [f"  note: {n}" for n in self.notes]
    lines.append("  steps: " + "; ".join(self.steps))
    return "\n".join(lines)


def _same_memory(a: Device, b: Device) -> bool:
  return a == b or (a[0] == CPU and b[0] == CPU)


def _mismatch(buf: Buffer, req: Request, device: Device) -> DeviceMismatchError:
  dst = req.target
  where = device_name(device)
  return DeviceMismatchError(
      f"{buf.framework.label} array on {device_name(buf.device)} cannot be shared with "
      f"{dst.label}, which has no device {where} (its devices: {', '.join(dst.devices())}). "
      f"Pass device= naming one of them to copy it there.", device_name(buf.device),
      where if device != buf.device else None)


def _requested(req: Request) -> str:
  return device_name(req.device) if req.device is not None else str(req.native)


def _same_framework(buf: Buffer, req: Request, placed: bool, earlier) -> Plan:
  reasons = list(earlier)
  transfer = not placed
  if transfer:
    reasons.append(Reason("device", f"moved from {device_name(buf.device)} to "
                                    f"{_requested(req)}"))
  final_copy = False
  if not transfer and req.copy and not buf.owned:
    final_copy = True
    reasons.append(Reason("requested", "copy=True"))
  elif not transfer and req.writable and buf.read_only:
    final_copy = True
    reasons.append(Reason("read-only", "the source is read-only and writable=True was asked"))
  name = buf.framework.label
  return Plan(name, name, not reasons, tuple(reasons), identity=True, transfer=transfer,
              final_copy=final_copy)


_CACHE: dict[tuple, Plan] = {}
_CACHE_SIZE = 4096


def decide(buf: Buffer, req: Request, placed: bool = True,
           earlier: tuple[Reason, ...] = ()) -> Plan:
  """The plan for converting `buf` as `req` asks.

  `placed`: (same framework only) `buf` already sits where `req` asks. `earlier`: reasons of the
  copies that produced `buf` (an owned buffer). Raises TypeError for dtypes the target cannot
  hold, DeviceMismatchError, or ZeroCopyError when copy=False and a copy is needed.
  """
  # Plans depend on the buffer's properties, not on its shape or exact address: memoised.
  key = (buf.framework, buf.dtype, buf.layout, buf.address is None or not buf.address % _ALIGN,
         buf.device, buf.read_only, buf.protected, buf.owned, buf.autograd, buf.lazy, req, placed, earlier,
         req.target.cache_token)
  plan = _CACHE.get(key)
  if plan is None:
    plan = _decide(buf, req, placed, earlier)
    if len(_CACHE) >= _CACHE_SIZE:
      _CACHE.clear()
    _CACHE[key] = plan
  return plan


def _decide(buf: Buffer, req: Request, placed: bool, earlier: tuple[Reason, ...]) -> Plan:
  src, dst = buf.framework, req.target
  if src is dst:
    return _check_copy_allowed(_same_framework(buf, req, placed, earlier), req)
  reasons: list[Reason] = list(earlier)
  notes: list[str] = []
  dtype = buf.dtype

  # Where the data can be imported, and whether it then moves.
  if req.device is not None and not dst.can_address(req.device):
    raise _mismatch(buf, req, req.device)
  host = via_host = False
  import_device = buf.device
  if not dst.can_address(buf.device):
    if req.native is None:
      raise _mismatch(buf, req, buf.device)
    if buf.device[0] == CPU:
      via_host = True
      reasons.append(Reason("device", f"{dst.label} cannot address host memory; copied to "
                                      f"{_requested(req)}"))
    else:
      host, import_device = True, HOST
      reasons.append(Reason("device", f"{dst.label} cannot address {device_name(buf.device)}; "
                                      "copied to host memory first"))
  transfer = not via_host and (req.spans or (req.device is not None
                                             and not _same_memory(req.device, import_device)))
  if transfer:
    reasons.append(Reason("device", f"moved from {device_name(import_device)} to "
                                    f"{_requested(req)}"))

  # Dtypes: what the target stores, what each side's DLPack speaks, and same-width relabelling.
  narrow = None
  if dtype not in dst.holds:
    narrow = dst.narrowing(dtype)
    if narrow is None:
      raise _dtypes.unsupported(dtype.name, f"{src.label}→{dst.label}",
                                f"{dst.label} has no {dtype.name} dtype; cast it (in "
                                f"{src.label}) to one it has")
    reasons.append(Reason("dtype", f"{dst.label} stores {dtype} as {narrow} "
                                   "(jax_enable_x64 is off)"))
  carrier = _dtypes.carrier(dtype)
  send = wire = None
  if not via_host:
    if dtype in src.dlpack_dtypes:
      send = dtype
    elif dtype in src.views and carrier in src.dlpack_dtypes:
      send = carrier
    elif not host:
      host = True
      reasons.append(Reason("dtype", f"{src.label} can neither export {dtype} over DLPack nor "
                                     "view it as raw bits; copied to host memory first"))
    if dtype in dst.dlpack_dtypes:
      wire = dtype
    elif dtype in dst.views and carrier in dst.dlpack_dtypes:
      wire = carrier
    else:
      via_host = True
      reasons.append(Reason("dtype", f"{dst.label} can neither import {dtype} over DLPack nor "
                                     "view raw bits as it; copied into a new array"))

  # Layout and alignment, fixed by one compact copy in the source framework.
  compact = resolve = False
  target_copies = False
  if not host:
    if buf.lazy:
      resolve = True
      reasons.append(Reason("lazy", f"the tensor carries a lazy {buf.lazy} bit; applied by a copy"))
    elif buf.layout == IRREGULAR or buf.layout > ACCEPTS[dst.strides]:
      if not via_host:
        compact = True
        reasons.append(Reason("strides", f"{dst.label} cannot import {LAYOUT_NAMES[buf.layout]} "
                                         "strides; copied to a compact buffer"))
    elif dst.alignment and buf.address is not None and buf.address % dst.alignment \
        and not via_host:
      if dst.copies_unaligned:
        target_copies = True
        reasons.append(Reason("alignment", f"the buffer is not {dst.alignment}-byte aligned; "
                                           f"{dst.label} copies it on import"))
      else:
        compact = True
        reasons.append(Reason("alignment", f"{dst.label} needs {dst.alignment}-byte aligned "
                                           "buffers; copied to an aligned buffer"))
  if (buf.protected and not dst.immutable and not dst.marks_read_only
      and not (host or compact or resolve or via_host)):
    # A shared view would be writable in the target; a write to read-only mapped memory (a
    # read-only np.memmap) crashes the process. Copied before any DLPack call.
    compact = True
    reasons.append(Reason("read-only", f"the {src.label} buffer is flagged read-only (it may be "
                                       f"mapped read-only) and {dst.label} cannot mark tensors "
                                       "read-only; copied to a writable buffer"))
  detach = buf.autograd
  if detach:
    notes.append("detached from autograd: the result shares memory but gradients do not flow "
                 "back to the source tensor")

  fresh = (host or compact or resolve or via_host or buf.owned or target_copies
           or narrow is not None or transfer)
  mark_read_only = final_copy = False
  if buf.read_only and not fresh and not dst.immutable:
    if req.writable:
      final_copy = True
      reasons.append(Reason("read-only", f"the {src.label} buffer is read-only and "
                                         "writable=True was asked"))
    elif dst.marks_read_only:
      mark_read_only = True
    else:
      notes.append(f"{dst.label} cannot mark tensors read-only: do not write to the result "
                   "(it aliases read-only memory), or pass writable=True for a copy")
  if req.copy and not fresh and not final_copy:
    final_copy = True
    reasons.append(Reason("requested", "copy=True"))

  check_range = narrow if narrow is not None and narrow.kind in "iu" else None
  plan = Plan(src.label, dst.label, not reasons, tuple(reasons), tuple(notes),
              detach=detach, resolve=resolve, host=host, compact=compact,
              dtype=dtype, send=send, wire=wire, via_host=via_host,
              import_device=import_device, check_range=check_range, narrow=narrow,
              transfer=transfer, final_copy=final_copy, mark_read_only=mark_read_only,
              source_steps=detach or resolve or host or compact,
              post_steps=(wire != dtype and not via_host) or narrow is not None or transfer
              or final_copy or mark_read_only)
  return _check_copy_allowed(plan, req)


def _check_copy_allowed(plan: Plan, req: Request) -> Plan:
  if req.copy is False and plan.reasons:
    raise ZeroCopyError(plan.source, plan.target, plan.reasons)
  return plan
