"""StableHLO (and CHLO) elementwise ops: arithmetic, bitwise, compare, select, convert.

Exact ops on constant operands (integer and shape arithmetic, comparisons) run in
NumPy so they stay trace-time constants; everything else runs through `jax.lax`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.interpreter import handler
from jaxport.convert.stablehlo.module import TensorType


def is_const(x) -> bool:
  return isinstance(x, (np.ndarray, np.generic))


def canon(x):
  """A NumPy constant in the dtype JAX will use (64-bit narrows without x64), else `x`. A large broadcast
  view (a splat constant) becomes a broadcast of its distinct values: an op under jit, not a constant."""
  if is_const(x):
    dtype = jax.dtypes.canonicalize_dtype(x.dtype)
    if x.ndim and 0 in x.strides and x.nbytes > _VIEW_BYTES:
      compact = x[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in x.strides)]
      return jnp.broadcast_to(np.ascontiguousarray(compact, dtype), x.shape)
    return x if x.dtype == dtype else np.asarray(x).astype(dtype)
  return x


def staged(x):
  """`x` as an operand that takes a handler's lax path (under jit an op, never a folded constant)."""
  x = canon(x)
  return jnp.asarray(x) if is_const(x) else x


_VIEW_BYTES = 4096


def jax_dtype(t: TensorType):
  return jax.dtypes.canonicalize_dtype(t.dtype)


def _all_const(xs) -> bool:
  return all(is_const(x) for x in xs)


# Ops that map equal-shaped operands element by element (their handlers below); see `regions`.
ELEMENTWISE_OPS: set[str] = {"stablehlo.convert", "stablehlo.compare", "stablehlo.select", "stablehlo.clamp",
                             "stablehlo.reduce_precision"}


def _register(name: str, lax_fn, np_fn=None):
  """`name` computes `np_fn` on constants (when given) and `lax_fn` otherwise."""
  ELEMENTWISE_OPS.add(name)
  def rule(ctx, *xs):
    if np_fn is not None and _all_const(xs):
      with np.errstate(all="ignore"):
        return np.asarray(np_fn(*xs))
    return lax_fn(*[canon(x) for x in xs])
  handler(name)(rule)


def _relu_or_max(x, y):
  """`max(x, 0)` is a ReLU (jax.nn.relu and TF's Relu write it so): its derivative at 0 is 0, as theirs is,
  not lax.max's tie rule (1/2)."""
  for a, b in ((x, y), (y, x)):
    if is_const(b) and jnp.issubdtype(b.dtype, jnp.floating) and not np.any(b) and not is_const(a):
      return jax.nn.relu(jnp.broadcast_to(a, jnp.broadcast_shapes(np.shape(a), np.shape(b))))
  return lax.max(x, y)


def _int_div(x, y):
  """C division: truncates toward zero; x / 0 is -1 for unsigned, as XLA defines it."""
  with np.errstate(all="ignore"):
    q = np.trunc(np.true_divide(x, np.where(y == 0, 1, y))).astype(x.dtype)
  return np.where(y == 0, np.asarray(-1).astype(x.dtype), q)


def _np_divide(x, y):
  return _int_div(x, y) if x.dtype.kind in "iu" else x / y


def _np_remainder(x, y):
  if x.dtype.kind in "iu":
    return np.where(y == 0, x, np.fmod(x, np.where(y == 0, 1, y)))
  return np.fmod(x, y)


def _shift(np_fn):
  def fn(x, y):
    bits = x.dtype.itemsize * 8
    out = np_fn(x, np.where((y < 0) | (y >= bits), 0, y).astype(x.dtype))
    overflow = (y < 0) | (y >= bits)
    fill = (x >> (bits - 1)) if np_fn is np.right_shift and x.dtype.kind == "i" else np.zeros_like(x)
    return np.where(overflow, fill, out)
  return fn


def _arithmetic_right_shift(x, y):
  """XLA shifts in the sign bit for unsigned types too (0xFF >> 4 is 0xFF): shift the signed view."""
  signed = np.asarray(x).view(np.dtype(f"i{x.dtype.itemsize}"))
  return _shift(np.right_shift)(signed, np.asarray(y).view(signed.dtype)).view(x.dtype)


def _logical_right_shift(x, y):
  unsigned = x.view(np.dtype(f"u{x.dtype.itemsize}"))
  return _shift(np.right_shift)(unsigned, y.view(unsigned.dtype)).view(x.dtype)


# Exact on constants.
_register("stablehlo.add", lax.add, np.add)
_register("stablehlo.subtract", lax.sub, np.subtract)
@jax.custom_jvp
def _square(x):
  return lax.mul(x, x)


@_square.defjvp
def _square_jvp(primals, tangents):
  # One term, rounded as the product rule's x*t + t*x (= 2 * (x*t) exactly, overflowing where it does).
  (x,), (t,) = primals, tangents
  xt = lax.mul(x, t)
  return _square(x), lax.mul(xt, lax.convert_element_type(2, xt.dtype))


_register("stablehlo.multiply", lambda x, y: _square(x) if x is y else lax.mul(x, y), np.multiply)
_register("stablehlo.divide", lax.div, _np_divide)
_register("stablehlo.remainder", lax.rem, _np_remainder)
_register("stablehlo.maximum", lambda x, y: _relu_or_max(x, y), np.maximum)
_register("stablehlo.minimum", lax.min, np.minimum)
_register("stablehlo.negate", lax.neg, np.negative)
_register("stablehlo.abs", lax.abs, np.abs)
_register("stablehlo.sign", lax.sign, np.sign)
_register("stablehlo.floor", lax.floor, np.floor)
_register("stablehlo.ceil", lax.ceil, np.ceil)
_register("stablehlo.and", lax.bitwise_and, np.bitwise_and)
_register("stablehlo.or", lax.bitwise_or, np.bitwise_or)
_register("stablehlo.xor", lax.bitwise_xor, np.bitwise_xor)
_register("stablehlo.not", lax.bitwise_not, lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x))
_register("stablehlo.shift_left", lax.shift_left, _shift(np.left_shift))
_register("stablehlo.shift_right_arithmetic", lax.shift_right_arithmetic, _arithmetic_right_shift)
_register("stablehlo.shift_right_logical", lax.shift_right_logical, _logical_right_shift)

# Always through lax.
for _name, _fn in {
    "stablehlo.atan2": lax.atan2, "stablehlo.cbrt": lax.cbrt, "stablehlo.cosine": lax.cos,
    "stablehlo.sine": lax.sin, "stablehlo.tan": lax.tan, "stablehlo.tanh": lax.tanh,
    "stablehlo.exponential": lax.exp, "stablehlo.exponential_minus_one": lax.expm1,
    "stablehlo.log": lax.log, "stablehlo.log_plus_one": lax.log1p, "stablehlo.logistic": lax.logistic,
    "stablehlo.power": lax.pow, "stablehlo.rsqrt": lax.rsqrt, "stablehlo.sqrt": lax.sqrt,
    "stablehlo.round_nearest_even": lax.round_nearest_even if hasattr(lax, "round_nearest_even")
    else (lambda x: lax.round(x, lax.RoundingMethod.TO_NEAREST_EVEN)),
    "stablehlo.round_nearest_afz": lambda x: lax.round(x, lax.RoundingMethod.AWAY_FROM_ZERO),
    "stablehlo.is_finite": lax.is_finite, "stablehlo.count_leading_zeros": lax.clz,
    "stablehlo.popcnt": lax.population_count, "stablehlo.real": lax.real, "stablehlo.imag": lax.imag,
    "stablehlo.complex": lax.complex,
    "chlo.erf": lax.erf, "chlo.erfc": lax.erfc, "chlo.erf_inv": lax.erf_inv, "chlo.lgamma": lax.lgamma,
    "chlo.digamma": lax.digamma, "chlo.tan": lax.tan, "chlo.sinh": jnp.sinh, "chlo.cosh": jnp.cosh,
    "chlo.asin": lax.asin, "chlo.acos": lax.acos, "chlo.atan": lax.atan, "chlo.asinh": lax.asinh,
    "chlo.acosh": lax.acosh, "chlo.atanh": lax.atanh, "chlo.conj": lax.conj, "chlo.square": lax.square,
    "chlo.is_inf": jnp.isinf, "chlo.is_pos_inf": jnp.isposinf, "chlo.is_neg_inf": jnp.isneginf,
    "chlo.next_after": lax.nextafter, "chlo.polygamma": lax.polygamma, "chlo.zeta": lax.zeta,
    "chlo.bessel_i1e": lax.bessel_i1e,
}.items():
  _register(_name, _fn)


@handler("stablehlo.convert")
def convert(ctx, x):
  dtype = ctx.result_type.dtype
  if is_const(x):
    if np.dtype(dtype).kind in "iu" and x.dtype.kind in "fc":   # float → int truncates, saturating like XLA
      info = np.iinfo(dtype)
      # In float64, not x's type: f16 rounds int16's max 32767 up to 32768, which wraps to -32768.
      x = (np.real(x) if x.dtype.kind == "c" else x).astype(np.float64)
      with np.errstate(all="ignore"):
        out = np.where(np.isnan(x), 0, np.trunc(x)).astype(dtype)
      return np.where(x >= info.max, info.max, np.where(x <= info.min, info.min, out)).astype(dtype)
    if x.dtype.kind == "c" and np.dtype(dtype).kind != "c":
      return np.real(x).astype(dtype)
    return x.astype(dtype)
  return lax.convert_element_type(x, jax_dtype(ctx.result_type))


@handler("stablehlo.bitcast_convert")
def bitcast_convert(ctx, x):
  if is_const(x):   # exact in NumPy, 64-bit types included (little-endian, as XLA)
    return np.ascontiguousarray(x).reshape(-1).view(ctx.result_type.dtype).reshape(ctx.result_type.shape)
  return lax.bitcast_convert_type(canon(x), jax_dtype(ctx.result_type))


_DIRECTIONS = {"EQ": (lax.eq, np.equal), "NE": (lax.ne, np.not_equal), "LT": (lax.lt, np.less),
               "LE": (lax.le, np.less_equal), "GT": (lax.gt, np.greater), "GE": (lax.ge, np.greater_equal)}


@handler("stablehlo.compare")
def compare(ctx, x, y):
  direction = ctx.attr("comparison_direction").value
  kind = getattr(ctx.attrs.get("compare_type"), "value", None)
  lax_fn, np_fn = _DIRECTIONS[direction]
  if kind == "TOTALORDER":
    x, y = _total_order_key(canon(x)), _total_order_key(canon(y))
    return lax_fn(x, y)
  if _all_const((x, y)):
    return np_fn(x, y)
  return lax_fn(canon(x), canon(y))


def _total_order_key(x):
  """Integers that order floats as IEEE totalOrder does (-NaN < -inf < ... < -0 < +0 < ... < NaN)."""
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    return x
  int_type = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[x.dtype.itemsize]
  bits = lax.bitcast_convert_type(x, int_type)
  return jnp.where(bits < 0, bits ^ jnp.iinfo(int_type).max, bits)


@handler("stablehlo.select")
def select(ctx, pred, on_true, on_false):
  if _all_const((pred, on_true, on_false)):
    return np.where(pred, on_true, on_false)
  pred, on_true, on_false = canon(pred), canon(on_true), canon(on_false)
  if np.ndim(pred) == 0 and np.ndim(on_true) > 0:
    pred = jnp.broadcast_to(pred, np.shape(on_true))
  return lax.select(pred, on_true, on_false)


@handler("stablehlo.clamp")
def clamp(ctx, lo, x, hi):
  if _all_const((lo, x, hi)):
    return np.minimum(np.maximum(x, lo), hi)
  # lax.clamp itself (not max then min): its derivative at x == lo or x == hi is JAX's (0 for x), where
  # max/min would split it between the tied operands. Scalar bounds are broadcast: JAX cannot transpose
  # a clamp with scalar bounds and an array x.
  shape = np.shape(x)
  lo, x, hi = canon(lo), canon(x), canon(hi)
  return lax.clamp(jnp.broadcast_to(lo, shape), x, jnp.broadcast_to(hi, shape))


@handler("stablehlo.reduce_precision")
def reduce_precision(ctx, x):
  return lax.reduce_precision(x, exponent_bits=ctx.attr("exponent_bits"), mantissa_bits=ctx.attr("mantissa_bits"))


@handler("stablehlo.constant")
def constant(ctx):
  return ctx.attr("value")
