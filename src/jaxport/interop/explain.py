"""Explain mode: would a conversion share memory, and if not, why."""
from __future__ import annotations

from typing import Any

from jaxport.interop import _base
from jaxport.interop.convert import Shards, plans
from jaxport.interop._plan import Plan


def explain(x: Any, target: str, *, device: Any = None, copy: bool | None = None,
            writable: bool = False, shards: Shards = "split") -> Any:
  """The `Plan` of converting `x` to `target` ('jax', 'torch', 'tf', 'numpy' or 'cupy') with the
  same options as the `to_*` call, without converting (a pytree of plans for a pytree).

  `plan.zero_copy` says whether memory is shared; `plan.reasons` lists each copy's cause as
  (kind, detail) with kind one of alignment, dtype, strides, device, read-only, lazy, requested,
  no-buffer; `plan.notes` lists caveats such as autograd detachment. `print(plan)` reads well.
  Raises what the conversion would raise for unsupported dtypes or devices. With copy=False it
  reports instead of raising BufferError. DLPack capsules are inspected, not consumed.
  """
  return plans(x, _base.by_name(target), device, copy, writable, shards)


__all__ = ["explain", "Plan"]
