"""Matching a call's arguments to the traced signature, by name, with typed errors.

A converted function was traced with one `(args, kwargs)` structure: tensor leaves
(each with an `InputSpec`) and static leaves (`training=True`, a string mode, `None`),
which TF baked into the graph. A call must give the same names (dict keys and keyword
arguments are matched by name, never by sorted position), no `None` where a tensor was
traced, and dense tensors (a sparse or ragged one as its components: `jaxport.composite`).
An input or param of another dtype kind (ints where floats were traced) is cast to the
traced dtype with a one-time `DtypeCastWarning`, or refused under `strict_dtype_check`;
another width of the same kind (bfloat16 for float32) passes as given, so lower-precision
runs stay possible. Static leaves that differ from the traced
ones are reported as `StaticMismatch`es: the caller retraces for them or raises, never
computing the traced branch for another value.

While jax_enable_x64 is off, JAX holds 64-bit values in 32 bits: a conversion that declares
float64/complex128 leaves warns once (`X64NarrowingWarning`), and 64-bit integer inputs or
params whose values do not fit 32 bits are refused (`X64OverflowError`).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tree

from jaxport.errors import (DtypeCastWarning, DtypeMismatchError, UnsupportedValueError, MissingInputError,
                            ShapeMismatchError, SignatureError, StringTensorError, X64NarrowingWarning)
from jaxport.interop._dtypes import check_fits_jax, x64_narrowed


@dataclasses.dataclass(frozen=True)
class InputSpec:
  path: str
  shape: tuple[int | None, ...] | None
  dtype: np.dtype
  constant: np.ndarray | None = None   # a sparse input's dense shape, fixed by the trace


@dataclasses.dataclass(frozen=True)
class StaticMismatch:
  path: str
  traced: Any      # `MISSING` when the traced call did not pass it
  given: Any       # `MISSING` when this call does not pass it


class _Missing:
  def __repr__(self):
    return "<not passed>"


MISSING = _Missing()


def is_static_leaf(x) -> bool:
  """Leaves that stay Python values in the trace (e.g. `training=True`), not tensor inputs."""
  return isinstance(x, (bool, str, bytes)) or x is None


def path_name(path) -> str:
  """How an error names the leaf at `path` in (args, kwargs): `args[0]['x']`, `scale`."""
  head, *rest = path
  if not rest:
    return "args" if head == 0 else "kwargs"
  name = f"args[{rest[0]}]" if head == 0 else str(rest[0])
  return name + "".join(f"[{p!r}]" for p in rest[1:])


def _same_static(a, b) -> bool:
  return type(a) is type(b) and a == b


def composite_kind(x) -> str | None:
  """'RaggedTensor'/'SparseTensor'/... for TF composite tensors, else None (no TF import)."""
  cls = type(x)
  if (cls.__module__.startswith("tensorflow") and "Variable" not in cls.__name__
      and any(base.__name__ == "CompositeTensor" for base in cls.__mro__)):
    return cls.__name__
  return None


class Signature:
  """The traced `(args, kwargs)`: its structure, tensor specs and static values."""

  def __init__(self, structure, specs: list[InputSpec], static_leaves: dict[int, Any]):
    self.structure = structure
    self.specs = specs
    self.static_leaves = static_leaves
    self._warned: set[str] = set()

  def names(self) -> str:
    return ", ".join(s.path for s in self.specs) or "(none)"

  # ------------------------------------------------------------------ structure

  def static_mismatches(self, args, kwargs) -> list[StaticMismatch]:
    """Checks the call's structure against the traced one; returns the static leaves that differ.

    Raises a typed error for anything a retrace cannot fix (a missing or unknown tensor
    argument, a `None` tensor, a different nesting).
    """
    traced_args, traced_kwargs = self.structure
    if len(args) != len(traced_args):
      raise MissingInputError(
          f"expected {len(traced_args)} positional argument(s), got {len(args)}; the traced inputs are "
          f"{self.names()}. Call with the same arguments used for conversion.")
    found: list[StaticMismatch] = []
    for i, (t, g) in enumerate(zip(traced_args, args)):
      self._compare(t, g, (0, i), found)
    if not isinstance(kwargs, Mapping):
      raise UnsupportedValueError(f"keyword arguments must be a mapping, got {type(kwargs).__name__}")
    self._compare_mapping(dict(traced_kwargs), dict(kwargs), (1,), found, keywords=True)
    return found

  def _compare(self, traced, given, path, found) -> None:
    if isinstance(traced, Mapping):
      if not isinstance(given, Mapping):
        raise SignatureError(f"input {path_name(path)} was traced as a dict with keys {sorted(traced)}, "
                             f"got {type(given).__name__}; pass a dict with those keys.")
      self._compare_mapping(traced, given, path, found, keywords=False)
    elif isinstance(traced, (list, tuple)) and not is_static_leaf(traced):
      if not isinstance(given, Sequence) or isinstance(given, (str, bytes)) or len(given) != len(traced):
        what = f"a sequence of {len(given)}" if isinstance(given, Sequence) else type(given).__name__
        raise SignatureError(f"input {path_name(path)} was traced as a sequence of {len(traced)} "
                             f"item(s), got {what}; pass the same structure used for conversion.")
      for i, (t, g) in enumerate(zip(traced, given)):
        self._compare(t, g, path + (i,), found)
    elif is_static_leaf(traced):
      if not _same_static(traced, given):
        if given is not None and not is_static_leaf(given) and traced is not None:
          raise SignatureError(f"input {path_name(path)} was traced as the Python value {traced!r} "
                               f"(baked into the graph), got a {type(given).__name__}; pass a Python "
                               f"value, or convert with a tensor there.")
        found.append(StaticMismatch(path_name(path), traced, given))
    else:   # a traced tensor
      if given is None:
        raise UnsupportedValueError(f"input {path_name(path)} is None, but it was traced as a tensor; pass an array "
                         "of the traced shape and dtype.")
      if isinstance(given, (Mapping, list, tuple)):
        raise SignatureError(f"input {path_name(path)} was traced as a tensor, got a "
                             f"{type(given).__name__}; pass the same structure used for conversion.")

  def _compare_mapping(self, traced: Mapping, given: Mapping, path, found, *, keywords: bool) -> None:
    what = "keyword argument" if keywords else f"key of {path_name(path)}"
    for key in sorted(set(traced) | set(given), key=str):
      sub = path + (key,)
      if key not in given:
        if is_static_leaf(traced[key]):
          found.append(StaticMismatch(path_name(sub), traced[key], MISSING))
          continue
        raise MissingInputError(f"{what} {key!r} is missing; it was traced as an input "
                                f"(traced {what}s: {', '.join(map(repr, sorted(traced, key=str)))}).")
      if key not in traced:
        if is_static_leaf(given[key]):
          found.append(StaticMismatch(path_name(sub), MISSING, given[key]))
          continue
        raise SignatureError(f"unknown {what} {key!r}; the function was traced with "
                             f"{', '.join(map(repr, sorted(traced, key=str))) or 'none'}. Check the name, or "
                             "convert again with this argument.")
      self._compare(traced[key], given[key], sub, found)

  # ------------------------------------------------------------------ tensors

  def tensor_inputs(self, args, kwargs, *, strict_shape: bool, strict_dtype: bool) -> list:
    """The tensor leaves of a call whose structure matched, as JAX arrays in traced order."""
    leaves = tree.flatten((tuple(args), dict(kwargs)))
    tensors = [x for i, x in enumerate(leaves) if i not in self.static_leaves]
    return [self._as_input(spec, x, strict_shape, strict_dtype) for spec, x in zip(self.specs, tensors)]

  def with_constants(self, inputs: list) -> list:
    """The graph's inputs with each fixed one (a traced sparse dense shape) as its NumPy constant."""
    return [x if spec.constant is None else spec.constant for spec, x in zip(self.specs, inputs)]

  def _check_constant(self, spec: InputSpec, x) -> None:
    given = None if isinstance(x, jax.core.Tracer) else np.asarray(x)
    if given is not None and (given.shape != spec.constant.shape or np.any(given != spec.constant)):
      raise ShapeMismatchError(
          f"incompatible input: {spec.path} (a sparse tensor's dense shape) was traced as {spec.constant.tolist()}, "
          f"got {given.tolist()}. Convert with a tf.SparseTensorSpec whose free dims are None.")

  def _as_input(self, spec: InputSpec, x, strict_shape: bool, strict_dtype: bool):
    if spec.constant is not None:
      self._check_constant(spec, x)
    kind = composite_kind(x)
    if kind:
      raise UnsupportedValueError(f"input {spec.path} is a tf.{kind}; jaxport functions take dense arrays. Convert it "
                       "first (e.g. `.to_tensor()` for a ragged tensor, `tf.sparse.to_dense` for a sparse one).")
    weak = isinstance(x, (int, float, complex)) and not isinstance(x, bool)
    if not isinstance(x, jax.Array):
      x = np.asarray(x)
      if x.dtype.kind in "OSU":
        raise StringTensorError(f"input {spec.path} holds strings ({x.dtype}); JAX has no string arrays. "
                                "Encode them as numbers before calling (e.g. token ids).")
      check_fits_jax(x, f"input {spec.path}")
    if strict_shape and spec.shape is not None:
      got = tuple(x.shape)
      if len(got) != len(spec.shape) or any(e is not None and e != g for e, g in zip(spec.shape, got)):
        expected = "(" + ", ".join(str(d) for d in spec.shape) + ("," if len(spec.shape) == 1 else "") + ")"
        raise ShapeMismatchError(
            f"incompatible input shape: input {spec.path} expected shape {expected}, got {got}. "
            "Convert with a TensorSpec whose "
            "free dims are None, or disable the check with override_config('strict_shape_check', False).")
    want = jax.dtypes.canonicalize_dtype(spec.dtype)
    got = jax.dtypes.canonicalize_dtype(x.dtype)
    if got != want and (strict_dtype or _kind(got) != _kind(want)):
      if strict_dtype:
        raise DtypeMismatchError(f"incompatible input dtype: input {spec.path} expected {spec.dtype}, "
                                 f"got {np.dtype(x.dtype)}. "
                                 "Cast it, or turn off override_config('strict_dtype_check', ...).")
      if not weak and spec.path not in self._warned:
        self._warned.add(spec.path)
        warnings.warn(f"input {spec.path} has dtype {np.dtype(x.dtype)} but was traced as {spec.dtype}; "
                      f"casting it to {spec.dtype} (set strict_dtype_check to make this an error).",
                      DtypeCastWarning, stacklevel=4)
      return jnp.asarray(x).astype(want)
    return jnp.asarray(x)


def _kind(dtype) -> str:
  """'f' for every float width (bfloat16 included), else NumPy's kind: same-kind dtypes pass as given."""
  dtype = np.dtype(dtype)
  return "f" if dtype.kind == "V" or jnp.issubdtype(dtype, jnp.floating) else dtype.kind


def check_params(params, specs: Mapping[str, jax.ShapeDtypeStruct], *, strict_dtype: bool,
                 warned: set[str]) -> dict:
  """`params` as a dict of arrays, each checked against its variable's shape and dtype."""
  if params is None:
    params = {}
  if not isinstance(params, Mapping):
    raise UnsupportedValueError(f"params must be a dict of arrays keyed by name (as jaxport.convert returns it), "
                     f"got {type(params).__name__}.")
  missing = [k for k in specs if k not in params]
  if missing:
    raise MissingInputError(f"Some parameters are missing, {missing}. Pass the params returned by "
                            "jaxport.convert (or arrays of the same shapes under the same keys).")
  out = dict(params)
  for key, spec in specs.items():
    value = params[key]
    if value is None or not hasattr(value, "shape") and not isinstance(value, (int, float, list, tuple)):
      raise UnsupportedValueError(f"param {key!r} is {type(value).__name__}, not an array; pass the params returned "
                       "by jaxport.convert (or arrays of the same shapes).")
    if not isinstance(value, jax.Array):
      value = np.asarray(value)
      check_fits_jax(value, f"param {key!r}")
      value = jnp.asarray(value)
    if tuple(value.shape) != tuple(spec.shape):
      raise ShapeMismatchError(f"param {key!r} has shape {tuple(value.shape)}, but its variable has shape "
                               f"{tuple(spec.shape)}; pass a value of the variable's shape.")
    if value.dtype != spec.dtype and (strict_dtype or _kind(value.dtype) != _kind(spec.dtype)):
      if strict_dtype:
        raise DtypeMismatchError(f"param {key!r} has dtype {value.dtype}, but its variable is {spec.dtype}.")
      if key not in warned:
        warned.add(key)
        warnings.warn(f"param {key!r} has dtype {value.dtype} but its variable is {spec.dtype}; casting it "
                      "(set strict_dtype_check to make this an error).", DtypeCastWarning, stacklevel=4)
      value = value.astype(spec.dtype)
    out[key] = value
  return out


def _float_dtype(dtype) -> np.dtype | None:
  """`dtype` (NumPy's or TF's) as a NumPy dtype where it is a float or complex type, else None."""
  if getattr(dtype, "is_floating", False) or getattr(dtype, "is_complex", False):   # a tf.DType
    return np.dtype(dtype.as_numpy_dtype)
  try:
    dtype = np.dtype(dtype)
  except TypeError:   # a resource, variant or other non-array leaf
    return None
  return dtype if dtype.kind in "fc" else None


def warn_if_narrowed(specs: Sequence[InputSpec], structured_outputs, params: Mapping[str, Any]) -> None:
  """One `X64NarrowingWarning` per conversion that declares float64/complex128 inputs, outputs or params
  while jax_enable_x64 is off: JAX computes them in 32 bits, so results move away from TF's. 64-bit
  integers are left out: most (argmax's indices) fit 32 bits, and inputs and params that do not are
  refused at the call."""
  if jax.config.jax_enable_x64:
    return
  leaves = [(f"input {s.path}", s.dtype) for s in specs]
  leaves += [("output" + "".join(f"[{k!r}]" for k in path), getattr(spec, "dtype", None))
             for path, spec in tree.flatten_with_path(structured_outputs)]
  leaves += [(f"param {k!r}", getattr(v, "dtype", None)) for k, v in params.items()]
  narrowed = [f"{what} ({dtype} -> {x64_narrowed(dtype)})" for what, dtype in
              ((what, _float_dtype(d)) for what, d in leaves) if dtype is not None and x64_narrowed(dtype)]
  if narrowed:
    more = f" and {len(narrowed) - 6} more" if len(narrowed) > 6 else ""
    warnings.warn(f"jax_enable_x64 is off, so JAX computes this function's 64-bit floats in 32 bits: "
                  f"{', '.join(narrowed[:6])}{more}. Results will differ from TF's beyond float32 precision. "
                  "To match TF, enable it before converting: jax.config.update('jax_enable_x64', True).",
                  X64NarrowingWarning, stacklevel=4)


def plain_structure(structure):
  """`structure` with framework containers (Keras' TrackedDict/ListWrapper) as dicts and lists."""
  if isinstance(structure, Mapping):
    return {k: plain_structure(v) for k, v in structure.items()}
  if isinstance(structure, tuple) and hasattr(structure, "_fields"):   # a namedtuple stays one
    return type(structure)(*(plain_structure(v) for v in structure))
  if isinstance(structure, tuple):
    return tuple(plain_structure(v) for v in structure)
  if isinstance(structure, list) or (isinstance(structure, Sequence) and not isinstance(structure, (str, bytes))
                                     and type(structure).__module__.startswith(("keras", "tf_keras", "tensorflow"))):
    return [plain_structure(v) for v in structure]
  return structure
