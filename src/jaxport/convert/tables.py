"""Lookup tables a function captures (`tf.lookup.StaticHashTable`, Keras `IntegerLookup`, restored
SavedModel tables): converted read-only, as the constants they hold.

A captured table handle evaluates to a `TableRef`. Its contents are read from TF once per key and
value dtype, when a rule first needs them (the dtypes come from the reading op's attributes: a
restored table does not know its own), and then stay: the converted function is a snapshot of the
table, as `params` are of the variables. Ops that write a table are refused at conversion.
"""
from __future__ import annotations

import jax
import numpy as np

from jaxport.errors import UnsupportedValueError
from jaxport.interop._dtypes import check_fits_jax


class TableRef:
  """What a lookup-table handle evaluates to: the table's contents, read once."""

  def __init__(self, handle, name: str):
    self._handle = handle   # the eager resource handle
    self.name = name
    self._contents: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    self._sorted: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    self._size: np.int64 | None = None

  @classmethod
  def constant(cls, name: str, keys: np.ndarray, values: np.ndarray) -> TableRef:
    """A table whose contents the graph itself gives (TF1's HashTableV2 and its initializer)."""
    table = cls(None, name)
    table._fixed = (np.asarray(keys), np.asarray(values))
    table._size = np.int64(len(keys))
    return table

  def __repr__(self) -> str:
    return f"TableRef({self.name!r})"

  def contents(self, key_dtype, value_dtype) -> tuple[np.ndarray, np.ndarray]:
    """The table's keys and values (TF's export order) as NumPy arrays of the given dtypes (the
    reading op's `Tin`/`Tout`; strings are NumPy's object dtype)."""
    key_dtype, value_dtype = np.dtype(key_dtype), np.dtype(value_dtype)
    if object in (key_dtype, value_dtype):
      raise UnsupportedValueError(
          f"lookup table {self.name!r} holds strings, which cannot run in JAX. Look the strings up "
          "in the input pipeline and feed the ids instead.")
    if self._handle is None:
      keys, values = self._fixed
      if (keys.dtype, values.dtype) != (key_dtype, value_dtype):
        raise UnsupportedValueError(f"lookup table {self.name!r} maps {keys.dtype} to {values.dtype}, "
                                    f"not {key_dtype} to {value_dtype}")
      return self._fixed
    cache_key = (key_dtype.str, value_dtype.str)
    if cache_key not in self._contents:
      import tensorflow as tf
      tf_keys, tf_values = tf.as_dtype(key_dtype), tf.as_dtype(value_dtype)
      self._check(tf_keys, tf_values)
      keys, values = tf.raw_ops.LookupTableExportV2(table_handle=self._handle, Tkeys=tf_keys,
                                                    Tvalues=tf_values)
      self._contents[cache_key] = (keys.numpy(), values.numpy())
    return self._contents[cache_key]

  def sorted_for(self, key_dtype, value_dtype, lookup_dtype) -> tuple[np.ndarray, np.ndarray]:
    """The keys sorted and cast to `lookup_dtype` (the looked-up keys' dtype), with their values in
    JAX's dtype; keys that dtype cannot hold can never equal a lookup and are left out. Once per dtypes
    (an eager call looks up without sorting again)."""
    lookup_dtype = np.dtype(lookup_dtype)
    cache_key = (np.dtype(key_dtype).str, np.dtype(value_dtype).str, lookup_dtype.str, jax.config.jax_enable_x64)
    if cache_key not in self._sorted:
      keys, values = self.contents(key_dtype, value_dtype)
      if lookup_dtype.kind in "iu" and keys.size:
        info = np.iinfo(lookup_dtype)
        fits = (keys >= info.min) & (keys <= info.max)
        keys, values = keys[fits], values[fits]
      order = np.argsort(keys, kind="stable")
      values = values[order]
      check_fits_jax(values, f"lookup table {self.name!r}")
      self._sorted[cache_key] = (keys[order].astype(lookup_dtype),
                                 values.astype(jax.dtypes.canonicalize_dtype(values.dtype)))
    return self._sorted[cache_key]

  def size(self) -> np.int64:
    if self._size is None:
      import tensorflow as tf
      self._size = np.int64(tf.raw_ops.LookupTableSizeV2(table_handle=self._handle).numpy())
    return self._size

  def _check(self, key_dtype, value_dtype) -> None:
    """A find with no keys: TF checks the handle and the dtypes with a clean error (an export with
    the wrong dtypes aborts the process)."""
    import tensorflow as tf
    try:
      tf.raw_ops.LookupTableFindV2(table_handle=self._handle, keys=tf.zeros([0], key_dtype),
                                   default_value=tf.zeros([], value_dtype))
    except tf.errors.InvalidArgumentError as e:
      if "default value" in str(e):   # a table of vectors: the dtypes matched
        return
      raise UnsupportedValueError(f"captured resource {self.name!r} is not a lookup table from "
                                  f"{key_dtype.name} to {value_dtype.name}: {e.message}") from None
    except tf.errors.OpError as e:
      raise UnsupportedValueError(f"captured resource {self.name!r} cannot be read as a lookup table "
                                  f"({e.message}); pass its contents as an input instead") from None
