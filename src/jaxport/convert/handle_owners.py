"""The tf.Variable behind a resource handle that a function captured without reading the variable.

Training ops take `var.handle` directly (tf_keras's legacy optimizers, TF1's `tf.compat.v1.train`
optimizers, `tf.raw_ops` in user code), so their slot variables are captured as bare handles and
missing from `ConcreteFunction.variables`. The owners are found among the live objects, in one scan
that is repeated only when a handle is not in the last one.
"""
from __future__ import annotations

import gc
import weakref

_by_handle: dict[int, weakref.ref] = {}


def owning_variable(handle):
  """The live tf.Variable whose `.handle` is `handle`, or None."""
  var = _lookup(handle)
  if var is None:
    _rescan()
    var = _lookup(handle)
  return var


def _lookup(handle):
  ref = _by_handle.get(id(handle))
  var = ref() if ref is not None else None
  return var if var is not None and _handle_of(var) is handle else None


def _rescan() -> None:
  import tensorflow as tf
  _by_handle.clear()
  is_variable_type: dict[type, bool] = {}   # per type, by MRO: isinstance on tf.Variable is slow
  for obj in gc.get_objects():
    kind = type(obj)
    if kind not in is_variable_type:
      is_variable_type[kind] = tf.Variable in kind.__mro__
    if is_variable_type[kind]:
      handle = _handle_of(obj)
      if handle is not None:
        try:
          _by_handle[id(handle)] = weakref.ref(obj)
        except TypeError:   # a variable type without weak references: skip it
          pass


def _handle_of(var):
  try:
    return var.handle
  except Exception:   # distributed and other variables without a single handle
    return None
