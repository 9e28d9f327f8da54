"""Host buffers for the batches jaxport stacks, reused once their copy to the device is done.

Only for an accelerator: there `jax.device_put` copies a batch out of its host buffer, and the
buffer is free again once the copy is (the device array `is_ready()`). On the CPU, JAX aliases
the buffer itself (zero-copy): the consumer's batch *is* the buffer, so no pool is made.
Reusing a buffer saves allocating (and page-faulting) a fresh one per batch.
"""
import threading
from typing import Any

import numpy as np

from jaxport.data._leaves import aligned_empty

_LENT_MAX = 256  # buffers handed out and not placed yet (a batch dropped by a restore is forgotten)


class HostPool:
  """Aligned host buffers by (shape, dtype). `take` lends one; `placed` tells which device arrays
  were copied from lent buffers: each buffer returns to the pool when its array is ready. At most
  `keep` buffers wait or lie free per (shape, dtype)."""

  def __init__(self, keep: int):
    self._keep = keep
    self._free: dict[tuple, list[np.ndarray]] = {}
    self._lent: dict[int, tuple[tuple, np.ndarray]] = {}
    self._copying: list[tuple[tuple, np.ndarray, Any]] = []  # (key, buffer, device array)
    self._lock = threading.Lock()  # the producer takes, the consumer's thread may place

  def take(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    key = (tuple(shape), np.dtype(dtype))
    with self._lock:
      self._collect()
      free = self._free.get(key)
      buffer = free.pop() if free else None
    if buffer is None:
      buffer = aligned_empty(key[0], key[1])
    with self._lock:
      if len(self._lent) >= _LENT_MAX:
        self._lent.clear()
      self._lent[id(buffer)] = (key, buffer)
    return buffer

  def placed(self, leaves: list, arrays: list) -> None:
    with self._lock:
      for leaf, array in zip(leaves, arrays):
        entry = self._lent.pop(id(leaf), None)
        if entry is None or entry[1] is not leaf:
          continue
        if sum(1 for key, _, _ in self._copying if key == entry[0]) < self._keep:
          self._copying.append((entry[0], leaf, array))

  def _collect(self) -> None:
    """Frees the buffers whose copies are done; the caller holds the lock."""
    copying = []
    for key, buffer, array in self._copying:
      if not array.is_ready():
        copying.append((key, buffer, array))
        continue
      free = self._free.setdefault(key, [])
      if len(free) < self._keep:
        free.append(buffer)
    self._copying = copying
