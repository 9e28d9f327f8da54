"""Differential fuzzing of single op rules against TF, without `jaxport.convert` per case.

Per (op, input dtypes, attrs, constant inputs) the raw op is traced once in a `tf.function`
with shape-free inputs; its node is decoded with `decode_nodes`, exactly as the converter sees
it, and the rule is called directly three ways: NumPy inputs (the constant-folding path),
jax arrays eagerly, and under `jax.jit` (cached per key and shapes). TF's value comes from the
traced concrete function.
"""
from __future__ import annotations

import collections
import functools
import dataclasses
import inspect
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import tensorflow as tf

from jaxport import config
from jaxport.convert import _tf_compat
from jaxport.convert.graph import Library, decode_nodes
from jaxport.convert.interpreter import OpContext, Runtime
from jaxport.convert.registry import get_rule

X64 = jax.dtypes.canonicalize_dtype(np.int64) == np.int64
MODES = ("numpy", "eager", "jit")

# Outcome counters, per op: "cases", "tf_error_rule_raised", "tf_error_filtered", "documented", ...
STATS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@dataclasses.dataclass
class Case:
  """One op call: inputs (NumPy), the raw op's attrs, and which inputs stay NumPy constants."""
  op: str
  inputs: list
  attrs: dict = dataclasses.field(default_factory=dict)
  static: frozenset = frozenset()      # input indices that decide shapes: NumPy in every mode
  layout: tuple | None = None          # ((param, count|None), ...) when an input is a list
  rtol: float | None = None            # override of the dtype's tolerance
  atol: float = 0.0
  jit: bool = True                     # False for ops whose output shape depends on values
  vary: tuple | None = None            # inputs redrawn for extra value sets (None: float/complex ones)


class Mismatch(AssertionError):
  pass


# --------------------------------------------------------------------------- tracing


_TRACED: dict = {}
_JITTED: dict = {}


def _param_names(op):
  params = inspect.signature(getattr(tf.raw_ops, op)).parameters
  return [p for p in params if p != "name"]


def _group(case, flat):
  """Maps the flat input list onto the raw op's keyword arguments."""
  layout = case.layout or [(p, None) for p in _param_names(case.op)[:len(flat)]]
  kwargs, i = {}, 0
  for param, count in layout:
    if count is None:
      kwargs[param] = flat[i]
      i += 1
    else:
      kwargs[param] = list(flat[i:i + count])
      i += count
  return kwargs


def _key(case):
  attrs = tuple(sorted((k, repr(v)) for k, v in case.attrs.items()))
  dtypes = tuple(np.asarray(x).dtype.name for x in case.inputs)
  return case.op, dtypes, attrs, case.static, case.layout


def _traced(case):
  key = _key(case)
  if key not in _TRACED:
    raw = getattr(tf.raw_ops, case.op)

    def fn(*xs):
      return raw(**_group(case, xs), **case.attrs)

    specs = [tf.TensorSpec(None, tf.as_dtype(np.asarray(x).dtype)) for x in case.inputs]
    concrete = tf.function(fn).get_concrete_function(*specs)
    nodes = decode_nodes(concrete.graph.as_graph_def().node)
    node = next(n for n in nodes.values() if n.op == case.op)
    _TRACED[key] = concrete, node
  return _TRACED[key]


_TF_ERRORS = (tf.errors.InvalidArgumentError, tf.errors.OutOfRangeError, tf.errors.UnimplementedError,
              tf.errors.NotFoundError, tf.errors.InternalError)


def tf_value(concrete, inputs) -> list[np.ndarray]:
  return [t.numpy() for t in tf.nest.flatten(concrete(*[tf.constant(x) for x in inputs]))]


@functools.cache
def cpu_dtypes(op: str, attr: str = "T") -> frozenset[str]:
  """The dtypes TF's CPU kernels of `op` take for the type attribute `attr` (all when unconstrained)."""
  names = _tf_compat.kernel_dtypes(op, attr, "CPU")
  return frozenset(ALL_DTYPES) if names is None else names


def dtypes_for(op: str, wanted, attr: str = "T") -> tuple[str, ...]:
  return tuple(d for d in wanted if d in cpu_dtypes(op, attr))


def _context(node):
  return OpContext(node, Runtime(Library([]), config.snapshot(), {}))


def _flat(out):
  if isinstance(out, (tuple, list)):
    return list(out)
  return [out]


def run_mode(case, node, mode):
  rule = get_rule(case.op)
  ctx = _context(node)
  if mode == "numpy":
    return _flat(rule(ctx, *case.inputs))
  dynamic = [i for i in range(len(case.inputs)) if i not in case.static]
  args = [jnp.asarray(case.inputs[i]) for i in dynamic]

  def call(*dyn):
    full = list(case.inputs)
    for i, a in zip(dynamic, dyn):
      full[i] = a
    return rule(ctx, *full)

  if mode == "eager":
    return _flat(call(*args))
  consts = tuple(np.asarray(case.inputs[i]).tobytes() + str(np.shape(case.inputs[i])).encode()
                 for i in case.static)
  jkey = (_key(case), consts)
  if jkey not in _JITTED:
    _JITTED[jkey] = jax.jit(call)
  return _flat(_JITTED[jkey](*args))


# --------------------------------------------------------------------------- comparison

RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 2e-6, "float64": 1e-12,
        "complex64": 2e-6, "complex128": 1e-12}


def _as_f64(x):
  return np.asarray(x).astype(np.complex128 if np.asarray(x).dtype.kind == "c" else np.float64)


def compare(actual, expected, mode, rtol_scale=1.0, rtol=None, atol=0.0) -> str | None:
  """None when `actual` matches TF's `expected`, else what differs."""
  if len(actual) != len(expected):
    return f"{len(actual)} outputs, TF has {len(expected)}"
  for k, (a, e) in enumerate(zip(actual, expected)):
    a, e = np.asarray(a), np.asarray(e)
    want = e.dtype if mode == "numpy" else jax.dtypes.canonicalize_dtype(e.dtype)
    if a.dtype not in (want, e.dtype, jax.dtypes.canonicalize_dtype(e.dtype)):
      return f"output {k}: dtype {a.dtype}, TF {e.dtype}"
    if a.shape != e.shape:
      return f"output {k}: shape {a.shape}, TF {e.shape}"
    if a.size == 0:
      continue
    narrowed = a.dtype != e.dtype   # 64-bit held in 32 bits: compare TF's value narrowed too
    if e.dtype.kind in "biu" or e.dtype == bool:
      if narrowed:
        e = e.astype(a.dtype)
      if not np.array_equal(a, e):
        return f"output {k}: values differ\n  ours {a.ravel()[:12]}\n  TF   {e.ravel()[:12]}"
      continue
    if narrowed:
      e = e.astype(a.dtype)
    tol = (rtol if rtol is not None else RTOL[a.dtype.name]) * rtol_scale
    info = ml_dtypes.finfo(np.float32 if a.dtype.kind == "c" and a.dtype.itemsize == 8 else
                           np.float64 if a.dtype.kind == "c" else a.dtype)
    # XLA's CPU backend flushes denormals to zero (see fuzz_differences.py): absolute slack of `tiny`.
    abs_tol = max(atol, float(info.tiny) * 2, tol if rtol_scale >= 8 else 0.0)   # results near 0
    bad = _mismatch(_as_f64(a), _as_f64(e), tol, abs_tol)
    if bad.any():
      return (f"output {k} ({a.dtype}): {int(bad.sum())} values differ (rtol {tol:g})\n"
              f"  ours {a[bad].ravel()[:8]}\n  TF   {e[bad].ravel()[:8]}")
  return None


def _mismatch(a, e, rtol, atol):
  if a.dtype.kind == "c":
    return _mismatch(a.real, e.real, rtol, atol) | _mismatch(a.imag, e.imag, rtol, atol)
  both_nan = np.isnan(a) & np.isnan(e)
  with np.errstate(all="ignore"):
    finite = np.isfinite(e) & np.isfinite(a)
    close = np.abs(a - e) <= atol + rtol * np.abs(e)
  same_inf = ~np.isfinite(e) & (a == e)
  return ~(both_nan | same_inf | (finite & close))


# --------------------------------------------------------------------------- running one case


def run_cases(case: Case, rs: np.random.RandomState, values: int, documented=lambda c, m: False,
              rtol_scale: float = 1.0) -> int:
  """Runs `case`, then up to `values - 1` more with the same signature and fresh values
  (so TF's trace and the jit cache are shared). Returns the number of cases run."""
  vary = case.vary
  if vary is None:
    vary = tuple(i for i, x in enumerate(case.inputs)
                 if i not in case.static and np.asarray(x).dtype.kind in "fcV")   # V: bfloat16
  before = STATS[case.op]["cases"]
  run_case(case, documented, rtol_scale)
  for _ in range(values - 1 if vary else 0):
    edges = rs.rand() < 0.5
    inputs = [fill(rs, np.asarray(x).dtype, np.shape(x), edges) if i in vary else x
              for i, x in enumerate(case.inputs)]
    run_case(dataclasses.replace(case, inputs=inputs), documented, rtol_scale)
  return STATS[case.op]["cases"] - before


def run_case(case: Case, documented: Callable[[Case, str], bool] = lambda c, m: False,
             rtol_scale: float = 1.0) -> None:
  """Runs `case` in TF and in every mode; raises `Mismatch` unless all agree (or it is documented)."""
  stats = STATS[case.op]
  if get_rule(case.op) is None:
    stats["no_rule"] += 1
    return
  try:
    concrete, node = _traced(case)
  except (TypeError, ValueError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
    stats["tf_cannot_trace"] += 1    # TF refuses these dtypes/attrs: nothing to compare
    return
  try:
    expected = tf_value(concrete, case.inputs)
  except _TF_ERRORS:
    expected = None
  stats["cases"] += 1
  narrowed = ...
  for mode in MODES if case.jit else MODES[:2]:
    if mode != "numpy" and narrowed is ...:
      narrowed = _narrowed_expected(case, expected)
    try:
      actual = run_mode(case, node, mode)
    except Exception as e:   # noqa: BLE001 - any error of the rule is compared with TF's
      if (expected if mode == "numpy" else narrowed) is None:
        stats[f"tf_error_rule_raised_{mode}"] += 1
        continue
      if documented(case, mode):
        stats["documented"] += 1
        continue
      raise Mismatch(f"{case.op} [{mode}] raised {type(e).__name__}: {e}\n{_describe(case)}") from e
    if mode == "numpy" and any(isinstance(a, jax.Array) for a in actual):
      # a rule that computes with JAX even on NumPy inputs holds what JAX holds: compare as eager does
      narrowed = _narrowed_expected(case, expected) if narrowed is ... else narrowed
      want = narrowed
    else:
      want = expected if mode == "numpy" else narrowed
    if want is None:
      stats[f"tf_error_filtered_{mode}"] += 1
      continue
    problem = compare(actual, want, mode, rtol_scale, case.rtol, case.atol)
    if problem is not None:
      if documented(case, mode):
        stats["documented"] += 1
        continue
      raise Mismatch(f"{case.op} [{mode}]: {problem}\n{_describe(case)}")


def _narrowed_expected(case, expected):
  """TF's value for the inputs jax holds: without x64, 64-bit inputs narrowed to 32 bits."""
  inputs = [np.asarray(x) for x in case.inputs]
  narrow = [x.astype(range_type(x.dtype)) if i not in case.static else x for i, x in enumerate(inputs)]
  if all(a.dtype == b.dtype for a, b in zip(inputs, narrow)):
    return expected
  try:
    concrete, _ = _traced(dataclasses.replace(case, inputs=narrow))
  except (TypeError, ValueError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
    return expected   # TF has no 32-bit kernel: compare with the 64-bit value, narrowed
  try:
    return tf_value(concrete, narrow)
  except _TF_ERRORS:
    return None


def _describe(case):
  lines = [f"  attrs={case.attrs}"]
  for i, x in enumerate(case.inputs):
    x = np.asarray(x)
    lines.append(f"  input {i}: {x.dtype}{list(x.shape)} {x.ravel()[:12]}")
  return "\n".join(lines)


# --------------------------------------------------------------------------- value pools

FLOATS = ("float16", "bfloat16", "float32", "float64")
SINTS = ("int8", "int16", "int32", "int64")
UINTS = ("uint8", "uint16", "uint32", "uint64")
INTS = SINTS + UINTS
REALS = FLOATS + INTS
ALL_DTYPES = REALS + ("bool", "complex64", "complex128")
SHAPES = ((), (0,), (1,), (3,), (2, 3), (2, 0, 3), (1, 4, 1))
C64 = ("complex64",)
ANY_DTYPES = REALS + ("bool",) + C64


def np_dtype(name: str) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def range_type(dtype):
  """The type whose range JAX can hold for `dtype` (64-bit types are 32-bit without x64)."""
  if not X64 and dtype.itemsize == 8 and dtype.kind in "fiu":
    return np.dtype(dtype.kind + "4")
  if not X64 and dtype == np.complex128:
    return np.dtype(np.complex64)
  return dtype


def value_pool(dtype: np.dtype, edges: bool) -> np.ndarray:
  """Ordinary values of `dtype`, plus NaN, ±inf, -0, extremes and denormals when `edges`."""
  dtype = np.dtype(dtype)
  if dtype == bool:
    return np.array([False, True])
  rt = range_type(dtype)
  if dtype.kind in "iu":
    info = np.iinfo(rt)
    base = [0, 1, 2, 3, 5, 7, 100] + ([-1, -2, -7, -100] if dtype.kind == "i" else [])
    base = [v for v in base if info.min <= v <= info.max]
    if edges:
      base += [info.min, info.max, info.max - 1] + ([info.min + 1] if dtype.kind == "i" else [])
    return np.array(base, dtype=np.int64 if dtype.kind == "i" else np.uint64).astype(dtype)
  real = np.float32 if dtype.kind == "c" and not X64 else rt
  info = ml_dtypes.finfo(real if dtype.kind != "c" else (np.float32 if dtype.itemsize == 8 else np.float64))
  base = [0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.5, 3.0, 0.1, -0.3, 7.25, -9.0, 100.0, 1e-3, 0.75, 1.5]
  if edges:
    base += [np.nan, np.inf, -np.inf, -0.0, float(info.max), -float(info.max), float(info.tiny),
             float(info.smallest_subnormal) * 3, -float(info.tiny)]
  base = np.array(base, np.float64)
  if dtype.kind == "c":
    re, im = np.meshgrid(base[:12] if not edges else base, base[:6])
    return (re + 1j * im).ravel().astype(dtype)
  return base.astype(dtype)


def fill(rs: np.random.RandomState, dtype, shape, edges: bool, pool=None) -> np.ndarray:
  dtype = np_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
  pool = value_pool(dtype, edges) if pool is None else np.asarray(pool).astype(dtype)
  size = int(np.prod(shape, dtype=np.int64))
  out = pool[rs.randint(0, len(pool), size=size)]
  if dtype.kind == "f" and not edges and size:   # some generic values too
    noise = rs.uniform(-4, 4, size=size).astype(dtype)
    out = np.where(rs.rand(size) < 0.5, noise, out)
  return np.asarray(out, dtype).reshape(shape)


def broadcast_partner(rs: np.random.RandomState, shape) -> tuple:
  """A shape that broadcasts with `shape`: itself, a scalar, a suffix, or with some dims set to 1."""
  choice = rs.randint(4)
  if choice == 0:
    return tuple(shape)
  if choice == 1:
    return ()
  if choice == 2:
    return tuple(shape[rs.randint(0, len(shape) + 1):])
  return tuple(1 if rs.rand() < 0.5 else d for d in shape)


def sample(rs, seq):
  return seq[rs.randint(len(seq))]


def random_shape(rs):
  return sample(rs, SHAPES)


def random_data(rs, shape, dtype=None):
  """Values of `shape` (a dtype drawn from every kind when not given), edge values in 30% of draws."""
  return fill(rs, dtype or sample(rs, ANY_DTYPES), shape, rs.rand() < 0.3)


def report() -> str:
  total = collections.Counter()
  for c in STATS.values():
    total.update(c)
  return ", ".join(f"{k}={v}" for k, v in sorted(total.items()))

