"""Interop's dtype vocabulary: NumPy dtypes (ml_dtypes for bf16/float8) and their DLPack codes."""
from __future__ import annotations

import jax
import ml_dtypes
import numpy as np

from jaxport.errors import InteropInputError, X64OverflowError

# DLPack DLDataTypeCode values (dlpack.h, v1.1).
_INT, _UINT, _FLOAT, _BFLOAT, _COMPLEX, _BOOL = 0, 1, 2, 4, 5, 6

BOOL = np.dtype(np.bool_)
INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
UINTS = tuple(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
FLOATS = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))
COMPLEXES = tuple(np.dtype(t) for t in (np.complex64, np.complex128))
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)

# Numeric dtypes every framework and DLPack implementation knows.
STANDARD = frozenset((BOOL, *INTS, *UINTS, *FLOATS, *COMPLEXES))

_FLOAT8_CODES = {
    "float8_e3m4": 7, "float8_e4m3": 8, "float8_e4m3b11fnuz": 9, "float8_e4m3fn": 10,
    "float8_e4m3fnuz": 11, "float8_e5m2": 12, "float8_e5m2fnuz": 13, "float8_e8m0fnu": 14,
}
FLOAT8 = {name: np.dtype(getattr(ml_dtypes, name))
          for name in _FLOAT8_CODES if hasattr(ml_dtypes, name)}
ALL_FLOAT8 = frozenset(FLOAT8.values())

# Every dtype interop moves: whole-byte numeric types.
SUPPORTED = STANDARD | {BFLOAT16} | ALL_FLOAT8

DLPACK_CODE: dict[np.dtype, tuple[int, int]] = {BOOL: (_BOOL, 8), BFLOAT16: (_BFLOAT, 16)}
for _dt in INTS:
  DLPACK_CODE[_dt] = (_INT, _dt.itemsize * 8)
for _dt in UINTS:
  DLPACK_CODE[_dt] = (_UINT, _dt.itemsize * 8)
for _dt in (*FLOATS, *COMPLEXES):
  DLPACK_CODE[_dt] = (_COMPLEX if _dt.kind == "c" else _FLOAT, _dt.itemsize * 8)
for _name, _dt in FLOAT8.items():
  DLPACK_CODE[_dt] = (_FLOAT8_CODES[_name], 8)
FROM_DLPACK_CODE = {code: dt for dt, code in DLPACK_CODE.items()}

_CARRIERS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
             8: np.dtype(np.uint64)}

# 64-bit types JAX narrows when jax_enable_x64 is off, and what it narrows them to.
X64_NARROWING = {np.dtype(np.int64): np.dtype(np.int32), np.dtype(np.uint64): np.dtype(np.uint32),
                 np.dtype(np.float64): np.dtype(np.float32),
                 np.dtype(np.complex128): np.dtype(np.complex64)}


def check_fits(dtype: np.dtype, narrow: np.dtype, low: int, high: int, what: str = "") -> None:
  """Raises `X64OverflowError` unless integers in [low, high] of `dtype` fit `narrow`, the type JAX
  stores `dtype` as while jax_enable_x64 is off."""
  info = np.iinfo(narrow)
  if low < info.min or high > info.max:
    raise X64OverflowError(
        f"{what + ' holds ' if what else ''}{dtype} values in [{low}, {high}], which do not fit {narrow}, the "
        f"type JAX stores {dtype} as while jax_enable_x64 is off, so they would wrap. Enable it "
        "(jax.config.update('jax_enable_x64', True)) or convert to a narrower dtype yourself.")


def x64_narrowed(dtype) -> np.dtype | None:
  """What JAX holds a 64-bit `dtype` as while jax_enable_x64 is off; None when it holds it as is."""
  return None if jax.config.jax_enable_x64 else X64_NARROWING.get(np.dtype(dtype))


def check_fits_jax(x: np.ndarray, what: str) -> None:
  """Refuses a host array of 64-bit integers that JAX (x64 off) would wrap to 32 bits: wrapped ids gather
  the wrong rows, silently."""
  narrow = x64_narrowed(x.dtype)
  if narrow is not None and narrow.kind in "iu" and x.size:
    check_fits(x.dtype, narrow, int(x.min()), int(x.max()), what)


def carrier(dtype: np.dtype) -> np.dtype | None:
  """The unsigned integer type of the same width, used to move a dtype a path lacks as raw bits."""
  return None if dtype.kind == "c" else _CARRIERS.get(dtype.itemsize)


def name(dtype) -> str:
  return dtype.name if isinstance(dtype, np.dtype) else str(dtype)


def unsupported(dtype_name: str, framework: str, hint: str = "") -> InteropInputError:
  """The error (a TypeError) for a non-numeric or unsupported dtype, raised before any DLPack call."""
  hint = hint or ("cast it to a numeric dtype first (bool, int8-64, uint8-64, float16/32/64, "
                  "bfloat16, float8, complex64/128)")
  return InteropInputError(f"jaxport.interop cannot exchange a {framework} tensor of dtype {dtype_name}: "
                   f"only whole-byte numeric buffers can be shared; {hint}.")


def check(dtype, framework: str = "NumPy") -> np.dtype:
  """`dtype` if interop supports it, else a TypeError naming it."""
  if dtype in SUPPORTED:
    return dtype
  if not isinstance(dtype, np.dtype):  # e.g. JAX's extended dtypes (PRNG keys)
    raise unsupported(str(dtype), framework, "it has no plain numeric buffer (for PRNG keys, "
                      "convert jax.random.key_data(key))")
  if dtype.byteorder not in "=|" and dtype.newbyteorder("=") in SUPPORTED:
    raise unsupported(f"{dtype.newbyteorder('=').name} in non-native byte order ({dtype.str})",
                      framework, "DLPack carries native byte order only; convert it first with "
                      "x.astype(x.dtype.newbyteorder('='))")
  kind = {"O": "object", "U": "string", "S": "bytes", "V": "structured/void", "M": "datetime",
          "m": "timedelta"}.get(dtype.kind)
  hint = ("strings and Python objects have no numeric buffer; encode them to numbers first"
          if kind in ("object", "string", "bytes") else "")
  raise unsupported(f"{dtype.name} ({kind})" if kind else dtype.name, framework, hint)
