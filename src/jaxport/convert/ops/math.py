"""Op rules: elementwise math, activations, comparisons, logical ops and casts.

Rules written as `fn(xp, *inputs)` run with NumPy when every input is a
trace-time constant (so shape arithmetic stays static under jit) and with
jax.numpy otherwise. Special functions that never take part in shape arithmetic
always run with JAX.

Where TF's gradient differs from JAX's default one (ties of Maximum/Minimum, Abs
at 0, Pow at x <= 0, MulNoNan at y == 0, Selu/Relu6 kinks), the rule reproduces
TF's gradient.

Known differences from TF: integer division or modulo by zero and integers
raised to negative powers are errors in TF and unspecified values here; with
JAX's x64 mode off, 64-bit results are 32-bit.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import ml_dtypes
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.ops._util import has_symbolic, is_concrete, jax_dtype, stage_dims, xp
from jaxport.convert.ops.core import runtime_check
from jaxport.convert.ops.tensor_list import TensorList, add_lists
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

# --------------------------------------------------------------------------- helpers


def apply(fn, inputs):
  """`fn(xp, *inputs)` with NumPy for constants (warnings off, as TF has none) or jax.numpy."""
  module = xp(*inputs)
  if module is np and any(map(has_symbolic, inputs)):
    return _apply_symbolic(fn, inputs)
  if module is np:
    with np.errstate(all="ignore"):
      return np.asarray(fn(np, *[np.asarray(x) for x in inputs]))
  return fn(jnp, *inputs)


def _apply_symbolic(fn, inputs):
  """Inputs holding symbolic dims (object arrays): NumPy keeps integer shape arithmetic
  symbolic; what dimension expressions cannot do (float math, casts) is staged in JAX."""
  try:
    out = np.asarray(fn(np, *[np.asarray(x) for x in inputs]))
    return out if out.dtype != object or has_symbolic(out) else np.asarray(out.tolist())   # b - b: 0
  except (jax.errors.InconclusiveDimensionOperation, TypeError, ValueError):
    staged = [stage_dims(x) if has_symbolic(x) else x for x in inputs]
    return fn(jnp, *staged)


def _elementwise(*op_types):
  """Registers `fn(xp, *inputs)` for `op_types`, computed as `apply` does."""
  def decorator(fn):
    register(*op_types, elementwise=True)(lambda ctx, *inputs: apply(fn, inputs))
    return fn
  return decorator


def _jax_elementwise(*op_types):
  """Registers `fn(*inputs)` that always computes with JAX (no NumPy counterpart)."""
  def decorator(fn):
    # lax's binary special functions (igamma, polygamma, ...) need operands of one shape.
    register(*op_types, elementwise=True)(
        lambda ctx, *inputs: fn(*jnp.broadcast_arrays(*[jnp.asarray(x) for x in inputs])))
    return fn
  return decorator


def _is_float(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


def _is_complex(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.complexfloating)


def _is_integer(x) -> bool:
  return jnp.issubdtype(x.dtype, jnp.integer)


def _x64_enabled() -> bool:
  return jax_dtype(np.int64) == np.int64


def truncate_div(xp, x, y):
  """Integer division rounding toward zero (C semantics), like TF's Div on integers."""
  floor = xp.floor_divide(x, y)
  inexact_negative = (xp.remainder(x, y) != 0) & ((x < 0) != (y < 0))
  return xp.where(inexact_negative, floor + 1, floor)


# --------------------------------------------------------------------------- NumPy-named math


def _numpy_api(op_type, name):
  """Registers `op_type` as the function called `name` in both NumPy and jax.numpy."""
  if name in _LAX_BINARY:
    _elementwise(op_type)(lambda xp, *xs: _lax_binary(name, *xs) if xp is jnp else getattr(xp, name)(*xs))
  else:
    _elementwise(op_type)(lambda xp, *xs: getattr(xp, name)(*xs))


# The commonest binary ops straight to lax when TF's operands already agree in dtype: the same values
# as jax.numpy's, traced 3-4x faster (a jnp ufunc with a NumPy operand costs ~200 us to trace, ~55 here).
_LAX_BINARY = {"add": lax.add, "subtract": lax.sub, "multiply": lax.mul}


def _strongly_typed_array(x) -> bool:
  if isinstance(x, np.ndarray):
    return x.dtype.kind in "biufc"
  return isinstance(x, jax.Array) and not x.aval.weak_type


def _lax_binary(name: str, x, y):
  """`jnp.<name>(x, y)` for a name in `_LAX_BINARY`, by lax where the operands agree in dtype."""
  if not (_strongly_typed_array(x) and _strongly_typed_array(y) and x.dtype == y.dtype
          and x.dtype != np.bool_):
    return getattr(jnp, name)(x, y)
  shape = lax.broadcast_shapes(x.shape, y.shape)

  def broadcast(v):
    if v.shape == shape:
      return v
    return lax.broadcast_in_dim(v, shape, tuple(range(len(shape) - v.ndim, len(shape))))
  return _LAX_BINARY[name](broadcast(x), broadcast(y))


for _op, _name in {
    "Neg": "negative", "Sign": "sign", "Square": "square", "Sqrt": "sqrt", "Exp": "exp",
    "Expm1": "expm1", "Log": "log", "Sin": "sin", "Cos": "cos", "Tan": "tan",
    "Asin": "arcsin", "Acos": "arccos", "Atan": "arctan", "Sinh": "sinh", "Cosh": "cosh",
    "Tanh": "tanh", "Asinh": "arcsinh", "Acosh": "arccosh", "Atanh": "arctanh", "Floor": "floor",
    "Ceil": "ceil", "Rint": "rint", "IsNan": "isnan", "IsInf": "isinf", "IsFinite": "isfinite",
    "Real": "real", "Imag": "imag", "Conj": "conj", "Angle": "angle", "ComplexAbs": "abs",
    "Invert": "invert", "LogicalNot": "logical_not",
    "Round": "round",   # half to even, like TF; integers unchanged
    # Binary. Add also concatenates string constants, like TF; Mod/TruncateMod take the dividend's sign.
    "Add": "add", "AddV2": "add", "Sub": "subtract", "Mul": "multiply", "Atan2": "arctan2",
    "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor", "LogicalAnd": "logical_and", "LogicalOr": "logical_or",
}.items():
  _numpy_api(_op, _name)


def _filled_like(fill):
  def rule(ctx, x):
    if not jax.tree_util.all_leaves([x]):   # pytrees such as TensorLists: fill leaf by leaf
      return jax.tree_util.tree_map(lambda leaf: jnp.full_like(leaf, fill), x)
    return apply(lambda xp, x: xp.full_like(x, fill), (x,))
  return rule


register("ZerosLike", size_bounded=True)(_filled_like(0))
register("OnesLike", size_bounded=True)(_filled_like(1))


@jax.custom_jvp
def _abs_tf_grad(x):
  return lax.abs(x)


@_abs_tf_grad.defjvp
def _abs_tf_grad_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return lax.abs(x), t * lax.sign(x)   # TF: gradient sign(x), so 0 at 0


_abs_marked = export_marks.marked("abs")(_abs_tf_grad)


@_elementwise("Abs")
def _abs(xp, x):
  return _abs_marked(x) if xp is jnp and _is_float(x) else xp.abs(x)


@_elementwise("Log1p")
def _log1p(xp, x):
  """XLA's float64 log1p is up to 128 ulp off for x in [-0.414, -0.343] (TF's, Eigen's, 2.2 ulp; XLA's
  float32 is fine). For |x| < 1/2, log(u) - ((u - 1) - x) / u with u = 1 + x: the second term restores
  what rounding u lost (the barrier keeps XLA from folding it to zero); within 1.3 ulp of the exact value."""
  if xp is np or x.dtype != np.float64:
    return xp.log1p(x)
  near_zero = jnp.abs(x) < 0.5   # u in (0.5, 1.5): no zero, infinity or cancellation to guard
  small = jnp.where(near_zero, x, 0)
  u = lax.optimization_barrier(1 + small)
  corrected = jnp.log(u) - ((u - 1) - small) / u
  return jnp.where(near_zero, corrected, jnp.log1p(x))


@_elementwise("Reciprocal", "Inv")
def _reciprocal(xp, x):
  return truncate_div(xp, xp.ones_like(x), x) if _is_integer(x) else xp.reciprocal(x)


@_elementwise("Rsqrt")
def _rsqrt(xp, x):
  return lax.rsqrt(x) if xp is jnp else 1 / np.sqrt(x)


@_jax_elementwise("Sigmoid")
def _sigmoid(x):
  return jax.nn.sigmoid(x)


@register("PopulationCount", size_bounded=True)
def _population_count(ctx, x):
  if is_concrete(x):   # 64-bit constants keep their width (jax without x64 would narrow them)
    x = np.asarray(x)
    return np.bitwise_count(x.view(np.dtype(f"u{x.dtype.itemsize}"))).astype(np.uint8)
  return lax.population_count(x).astype(np.uint8)


@jax.custom_jvp
def _spence(x):
  return jsp.spence(x)


@_spence.defjvp
def _spence_jvp(primals, tangents):
  # JAX's own derivative is NaN for x > 1; TF's is log(x) / (1 - x), -1 at x = 1.
  (x,), (t,) = primals, tangents
  one = x == 1
  slope = jnp.log(x) / (1 - jnp.where(one, jnp.zeros_like(x), x))
  return _spence(x), t * jnp.where(one, -jnp.ones_like(x), slope)


_spence_marked = export_marks.marked("spence")(_spence)


# Special functions: float only, never shape arithmetic. Each is marked for export: `jax.export` writes
# some as loops (expi, igamma, betainc: a while loop that reverse mode cannot differentiate) or as pieces
# whose ops' derivative is not JAX's rule; the loaded artifact runs the same JAX function instead.
for _op, _fn in {
    "Erf": lax.erf, "Erfc": lax.erfc, "Erfinv": lax.erf_inv, "Ndtri": jsp.ndtri,
    "Lgamma": lax.lgamma, "Digamma": lax.digamma, "BesselI0": jsp.i0, "BesselI0e": lax.bessel_i0e,
    "BesselI1": jsp.i1, "BesselI1e": lax.bessel_i1e, "Dawsn": jsp.dawsn, "Expint": jsp.expi,
    "Spence": _spence_marked, "FresnelSin": lambda x: jsp.fresnel(x)[0],
    "FresnelCos": lambda x: jsp.fresnel(x)[1], "Igamma": lax.igamma, "Igammac": lax.igammac,
    "Zeta": jsp.zeta, "Polygamma": lax.polygamma, "Betainc": lax.betainc,
}.items():
  _jax_elementwise(_op)(_fn if _fn is _spence_marked else export_marks.marked(f"{_op.lower()}_special")(_fn))

# --------------------------------------------------------------------------- activations


# jax.nn.relu keeps NaN and has TF's zero gradient at 0. Its custom_jvp costs ~0.4 ms to trace per call;
# an inlined jit traces it once per shape.
_relu_traced_once = jax.jit(jax.nn.relu, inline=True)


@_elementwise("Relu")
def _relu(xp, x):
  return _relu_traced_once(x) if xp is jnp else np.maximum(x, 0).astype(x.dtype)


@jax.custom_jvp
def _relu6_tf_grad(x):
  return jnp.minimum(jnp.maximum(x, 0), 6)


@_relu6_tf_grad.defjvp
def _relu6_tf_grad_jvp(primals, tangents):
  (x,), (t,) = primals, tangents
  return _relu6_tf_grad(x), jnp.where((x > 0) & (x < 6), t, jnp.zeros_like(t))


_relu6_marked = export_marks.marked("relu_six")(_relu6_tf_grad)


@_elementwise("Relu6")
def _relu6(xp, x):
  if xp is jnp and _is_float(x):
    return _relu6_marked(x)
  return xp.minimum(xp.maximum(x, 0), 6).astype(x.dtype)


def _negative_part(xp, x, fn):
  """`fn(x)` where x < 0 and x elsewhere; `fn` never sees positive x, so gradients stay finite."""
  negative = x < 0
  return xp.where(negative, fn(xp.where(negative, x, xp.zeros_like(x))), x)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


# Elu and Selu take exp(x) - 1 where x < 0, as TF's kernels do (not expm1): in bfloat16 each op rounds.
@_elementwise("Elu")
def _elu(xp, x):
  return _negative_part(xp, x, lambda v: xp.exp(v) - 1)


@_elementwise("Selu")
def _selu(xp, x):
  # astype: older NumPy turns bfloat16 times a Python float into float32
  negative = x < 0
  scaled = _SELU_SCALE * _SELU_ALPHA * (xp.exp(xp.where(negative, x, xp.zeros_like(x))) - 1)
  return xp.where(negative, scaled, _SELU_SCALE * x).astype(x.dtype)


@_jax_elementwise("Softplus")
def _softplus(x):
  return jax.nn.softplus(x)


@_elementwise("Softsign")
def _softsign(xp, x):
  return x / (1 + xp.abs(x))


@register("LeakyRelu", size_bounded=True)
def _leaky_relu(ctx, x):
  alpha = ctx.attr("alpha", 0.2)
  return apply(lambda xp, x: xp.where(x > 0, x, x * np.asarray(alpha, x.dtype)), (x,))


# Gradient ops that TF emits when a gradient is taken inside the traced function.


@_elementwise("ReluGrad")
def _relu_grad(xp, g, x):
  return xp.where(x > 0, g, xp.zeros_like(g))


@_elementwise("Relu6Grad")
def _relu6_grad(xp, g, x):
  return xp.where((x > 0) & (x < 6), g, xp.zeros_like(g))


@_elementwise("EluGrad")
def _elu_grad(xp, g, y):
  return xp.where(y < 0, g * (y + 1), g)


@_elementwise("SeluGrad")
def _selu_grad(xp, g, y):
  return xp.where(y < 0, g * (y + _SELU_SCALE * _SELU_ALPHA), g * _SELU_SCALE)


@_jax_elementwise("SoftplusGrad")
def _softplus_grad(g, x):
  return g * jax.nn.sigmoid(x)


@_elementwise("SoftsignGrad")
def _softsign_grad(xp, g, x):
  return g / xp.square(1 + xp.abs(x))


@register("LeakyReluGrad", size_bounded=True)
def _leaky_relu_grad(ctx, g, x):
  alpha = ctx.attr("alpha", 0.2)
  return apply(lambda xp, g, x: xp.where(x > 0, g, g * np.asarray(alpha, g.dtype)), (g, x))


# `(y, dy)` gradient ops: complex inputs use the conjugate derivative, like TF.


@_elementwise("SigmoidGrad")
def _sigmoid_grad(xp, y, dy):
  return dy * xp.conj(y * (1 - y))


@_elementwise("TanhGrad")
def _tanh_grad(xp, y, dy):
  return dy * xp.conj(1 - y * y)


@_elementwise("SqrtGrad")
def _sqrt_grad(xp, y, dy):
  return dy * 0.5 / xp.conj(y)


@_elementwise("RsqrtGrad")
def _rsqrt_grad(xp, y, dy):
  return dy * -0.5 * xp.conj(y * y * y)


@_elementwise("ReciprocalGrad", "InvGrad")
def _reciprocal_grad(xp, y, dy):
  return -dy * xp.conj(y * y)


# --------------------------------------------------------------------------- binary arithmetic


@register("AddN", size_bounded=True)
def _add_n(ctx, *xs):
  if any(isinstance(x, TensorList) for x in xs):   # a list's gradients summed over its uses
    return add_lists(xs)
  return apply(lambda xp, *xs: functools.reduce(xp.add, xs), xs)


def _division(*op_types):
  """Registers a division-like `fn(xp, x, y)`. Integer division by zero raises in TF: here it
  raises on constants and, with `enable_checkify_for_asserts`, is a checkify check."""
  def decorator(fn):
    def rule(ctx, x, y):
      if _is_integer(x):
        runtime_check(ctx, y != 0, "Integer division by zero")
      return apply(fn, (x, y))
    register(*op_types, elementwise=True)(rule)
    return fn
  return decorator


@_division("Div", "RealDiv")
def _div(xp, x, y):
  return truncate_div(xp, x, y) if _is_integer(x) else xp.true_divide(x, y)


@_division("TruncateDiv")
def _truncate_div(xp, x, y):
  return truncate_div(xp, x, y) if _is_integer(x) else xp.trunc(x / y)


@_division("FloorDiv")
def _floor_div(xp, x, y):
  # Floats: floor(x / y), not Python's `//` (TF gives floor(1 / 0.1) = 10, Python 9).
  return xp.floor_divide(x, y) if _is_integer(x) else xp.floor(x / y)


@_division("Mod", "TruncateMod")
def _truncate_mod(xp, x, y):
  return xp.fmod(x, y)   # the dividend's sign, like C


@_division("FloorMod")
def _floor_mod(xp, x, y):
  if not _is_float(x):
    return xp.remainder(x, y)   # sign of the divisor, like Python
  trunc = xp.fmod(x, y)
  return xp.where((trunc != 0) & ((y < 0) != (trunc < 0)), trunc + y, trunc)


@jax.custom_jvp
def _pow_tf_grad(x, y):
  return jnp.power(x, y)


@_pow_tf_grad.defjvp
def _pow_tf_grad_jvp(primals, tangents):
  (x, y), (tx, ty) = primals, tangents
  z = jnp.power(x, y)
  positive = x > 0   # TF: d/dy is 0 where x <= 0 (JAX gives NaN for x < 0)
  log_x = jnp.where(positive, jnp.log(jnp.where(positive, x, jnp.ones_like(x))), jnp.zeros_like(x))
  return z, tx * (y * jnp.power(x, y - 1)) + ty * (z * log_x)


_pow_marked = export_marks.marked("pow")(_pow_tf_grad)


def _int_power(x, y):
  """Integer x ** y over every bit of y, wrapping on overflow like TF (jnp.power reads 6 bits of y)."""
  out = jnp.where(y < 0, 0, 1).astype(x.dtype)   # TF rejects negative exponents
  for _ in range(np.iinfo(y.dtype).bits - 1):
    out = jnp.where((y & 1) == 1, out * x, out)
    x, y = x * x, y >> 1
  return out


@_elementwise("Pow")
def _pow(xp, x, y):
  if xp is jnp and jnp.issubdtype(x.dtype, jnp.integer):
    return _int_power(x, y)
  return _pow_marked(x, y) if xp is jnp and _is_float(x) else xp.power(x, y)


def _tie_to_x(fn, x_wins):
  """`fn` (maximum or minimum) whose gradient goes entirely to x on ties, like TF."""
  @jax.custom_jvp
  def chosen(x, y):
    return fn(x, y)

  @chosen.defjvp
  def chosen_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    return fn(x, y), jnp.where(x_wins(x, y), tx, ty)

  return chosen


_maximum_tf_grad = export_marks.marked("maximum_tie_to_x")(_tie_to_x(jnp.maximum, jnp.greater_equal))
_minimum_tf_grad = export_marks.marked("minimum_tie_to_x")(_tie_to_x(jnp.minimum, jnp.less_equal))


def _maximum(xp, x, y):
  return _maximum_tf_grad(x, y) if xp is jnp and _is_float(x) else xp.maximum(x, y)


@register("Maximum", elementwise=True)
def maximum(ctx, x, y):
  relu = jax2tf_relu(ctx, x, y)
  if relu is not None:
    return relu
  clamped = _clamp(ctx, x, y, upper=False)
  return clamped if clamped is not None else apply(_maximum, (x, y))


@register("Minimum", elementwise=True)
def minimum(ctx, x, y):
  clamped = _clamp(ctx, x, y, upper=True)
  return clamped if clamped is not None else apply(_minimum, (x, y))


def _clamp(ctx, x, y, upper: bool):
  """Maximum (`upper` False) or Minimum of a traced integer scalar and a constant one, with the
  bounds it gives noted; a constant when the traced value's noted bounds already decide it.

  `tf.math.bincount` (Keras `CategoryEncoding`, `IntegerLookup(output_mode="multi_hot")`) clamps
  its size, max(x) + 1, between minlength and maxlength: equal ones give a static size under jit.
  """
  for value, c in ((x, y), (y, x)):
    if not (isinstance(value, jax.Array) and is_concrete(c) and np.ndim(value) == 0 and np.ndim(c) == 0
            and jnp.issubdtype(value.dtype, jnp.integer)):
      continue
    _, low, high = ctx.runtime.bounds.get(id(value), (value, None, None))
    c = int(c)
    if upper:
      if low is not None and low >= c:
        return np.asarray(c, value.dtype)
      low, high = (None if low is None else min(low, c)), (c if high is None else min(high, c))
    else:
      if high is not None and high <= c:
        return np.asarray(c, value.dtype)
      low, high = (c if low is None else max(low, c)), (None if high is None else max(high, c))
    out = (jnp.minimum if upper else jnp.maximum)(value, jnp.asarray(c, value.dtype))
    ctx.runtime.bounds[id(out)] = (out, low, high)
    return out
  return None


def jax2tf_relu(ctx, x, y) -> Any | None:
  """`jax.nn.relu(x)` when a Maximum node is jax2tf's lowering of relu, else None.

  jax2tf lowers `jax.nn.relu` to `Maximum(x, 0)` in a name scope holding "jax2tf"
  and "_relu_"; taking it back to relu restores relu's gradient at 0 (Maximum's
  TF gradient is 1 there). Config key `infer_relu_from_jax2tf` (default True).
  """
  if not ctx.config.get("infer_relu_from_jax2tf", True):
    return None
  if "jax2tf" not in ctx.name or "_relu_" not in ctx.name or not is_concrete(y) or is_concrete(x):
    return None
  y = np.asarray(y)
  if y.size == 0 or np.any(y != 0):
    return None
  x = jnp.asarray(x)
  return jnp.broadcast_to(jax.nn.relu(x), jnp.broadcast_shapes(x.shape, y.shape))


def _minimum(xp, x, y):
  return _minimum_tf_grad(x, y) if xp is jnp and _is_float(x) else xp.minimum(x, y)


@_elementwise("SquaredDifference")
def _squared_difference(xp, x, y):
  d = x - y
  return d * xp.conj(d) if _is_complex(d) else xp.square(d)


def _where_x_nonzero(xp, x, y, fn, y_fill):
  """0 where x == 0, else fn(x, y); y is replaced by `y_fill` there so gradients stay finite."""
  zero = x == 0
  safe_y = xp.where(zero, xp.asarray(y_fill, y.dtype), y)
  return xp.where(zero, xp.zeros_like(x * safe_y), fn(x, safe_y))


@_elementwise("Xlogy")
def _xlogy(xp, x, y):
  return _where_x_nonzero(xp, x, y, lambda x, y: x * xp.log(y), 1)


@_elementwise("Xlog1py")
def _xlog1py(xp, x, y):
  return _where_x_nonzero(xp, x, y, lambda x, y: x * xp.log1p(y), 0)


@_elementwise("Xdivy")
def _xdivy(xp, x, y):
  return _where_x_nonzero(xp, x, y, lambda x, y: x / y, 1)


@_elementwise("DivNoNan")
def _div_no_nan(xp, x, y):
  zero = y == 0
  quotient = x / xp.where(zero, xp.ones_like(y), y)
  return xp.where(zero, xp.zeros_like(quotient), quotient)


@jax.custom_jvp
def _mul_no_nan_tf_grad(x, y):
  product = x * y
  return jnp.where(y == 0, jnp.zeros_like(product), product)


@_mul_no_nan_tf_grad.defjvp
def _mul_no_nan_tf_grad_jvp(primals, tangents):
  # TF: d/dx = mul_no_nan(g, y), d/dy = x * g (also where y == 0).
  (x, y), (tx, ty) = primals, tangents
  scaled = tx * y
  return _mul_no_nan_tf_grad(x, y), jnp.where(y == 0, jnp.zeros_like(scaled), scaled) + x * ty


_mul_no_nan_marked = export_marks.marked("mul_no_nan")(_mul_no_nan_tf_grad)


@_elementwise("MulNoNan")
def _mul_no_nan(xp, x, y):
  if xp is jnp:
    return _mul_no_nan_marked(x, y)
  product = x * y
  return np.where(y == 0, np.zeros_like(product), product)


def _clamped_shift(xp, x, y):
  # TF clamps the shift amount to [0, bits - 1]; XLA would give 0 beyond the width.
  return xp.clip(y, 0, np.dtype(x.dtype).itemsize * 8 - 1).astype(y.dtype)


@_elementwise("LeftShift")
def _left_shift(xp, x, y):
  return xp.left_shift(x, _clamped_shift(xp, x, y))


@_elementwise("RightShift")
def _right_shift(xp, x, y):
  return xp.right_shift(x, _clamped_shift(xp, x, y))   # arithmetic for signed types


@register("Complex", size_bounded=True)
def _complex(ctx, real, imag):
  dtype = ctx.attr("Tout", np.dtype(np.complex64))
  if xp(real, imag) is np:
    out = np.empty(np.broadcast_shapes(np.shape(real), np.shape(imag)), dtype)
    out.real, out.imag = real, imag
    return out
  return lax.complex(*jnp.broadcast_arrays(real, imag))


@register("ApproximateEqual", size_bounded=True)
def _approximate_equal(ctx, x, y):
  tolerance = ctx.attr("tolerance", 1e-5)
  return apply(lambda xp, x, y: xp.abs(x - y) < tolerance, (x, y))


@_elementwise("ClipByValue")
def _clip_by_value(xp, x, lo, hi):
  # min then max like TF: NaN passes through, and the gradient goes to x at both bounds.
  capped = xp.where(x > hi, hi, x)
  return xp.where(capped < lo, lo, capped)


# --------------------------------------------------------------------------- comparisons and logic


def _comparison(op_type, fn_name, incompatible_result=None):
  """`incompatible_result`: what Equal/NotEqual return for non-broadcastable shapes when
  `incompatible_shape_error` is off."""
  def rule(ctx, x, y):
    if incompatible_result is not None and not ctx.attr("incompatible_shape_error", True):
      try:
        np.broadcast_shapes(np.shape(x), np.shape(y))
      except ValueError:
        return np.asarray(incompatible_result)
    return apply(lambda xp, x, y: getattr(xp, fn_name)(x, y), (x, y))
  register(op_type, elementwise=True)(rule)


_comparison("Equal", "equal", incompatible_result=False)
_comparison("NotEqual", "not_equal", incompatible_result=True)
_comparison("Less", "less")
_comparison("LessEqual", "less_equal")
_comparison("Greater", "greater")
_comparison("GreaterEqual", "greater_equal")


def _zero_low_mantissa_bits(xp, x, dst):
  """TF's `Truncate=True`: zero the mantissa bits `dst` cannot hold (NaN kept), then round."""
  dropped = ml_dtypes.finfo(x.dtype).nmant - ml_dtypes.finfo(dst).nmant
  if dropped <= 0:
    return x
  bits_type = np.dtype(f"u{np.dtype(x.dtype).itemsize}")
  mask = np.asarray(~((1 << dropped) - 1) & ((1 << 8 * bits_type.itemsize) - 1), bits_type)
  if xp is np:
    truncated = (x.view(bits_type) & mask).view(x.dtype)
  else:
    truncated = lax.bitcast_convert_type(lax.bitcast_convert_type(x, bits_type) & mask, x.dtype)
  return xp.where(xp.isnan(x), x, truncated)


def _to_signed(xp, x, wide):
  """Truncates toward zero into signed `wide`; NaN and out-of-range give its minimum, like x86."""
  limit = 2.0 ** (8 * np.dtype(wide).itemsize - 1)
  invalid = ~((x >= -limit) & (x < limit))
  converted = xp.where(invalid, xp.zeros_like(x), x).astype(wide)
  return xp.where(invalid, np.asarray(np.iinfo(wide).min, wide), converted)


def _float_to_int(xp, x, dst):
  """Float to integer as TF does on x86: truncation into int32 (int64 for 64-bit targets) where
  NaN and out-of-range values give INT_MIN, then wrapped to `dst`. (Out-of-range results for
  uint32 and 64-bit targets even depend on the element's position in TF's vectorised loop.)
  `dst` is what JAX supports: without x64 there are no 64-bit targets."""
  if np.dtype(x.dtype).itemsize < 4:
    x = x.astype(np.float32)
  if dst.itemsize < 4 or dst == np.int32:
    return _to_signed(xp, x, np.int32).astype(dst)
  if dst == np.uint32 and xp is jnp and not _x64_enabled():
    upper = x >= 2.0**31
    direct = xp.where(upper, x, xp.zeros_like(x)).astype(dst)
    return xp.where(upper, direct, _to_signed(xp, x, np.int32).astype(dst))
  out = _to_signed(xp, x, np.int64).astype(dst)
  if dst == np.uint64:   # [2**63, 2**64) converts directly
    upper = (x >= 2.0**63) & (x < 2.0**64)
    out = xp.where(upper, xp.where(upper, x, xp.zeros_like(x)).astype(dst), out)
  return out


def cast_like_tf(x, dst, truncate: bool = False):
  """`x` cast to `dst` exactly as TF's Cast op does (NumPy stays NumPy)."""
  dst = np.dtype(dst)
  return apply(lambda xp, x: _cast(xp, x, dst, truncate), (x,))


def _cast(xp, x, dst, truncate):
  src = np.dtype(x.dtype)
  if has_symbolic(x) and jnp.issubdtype(dst, jnp.integer):
    return x   # symbolic dims stay dimension expressions
  if xp is jnp:
    dst = jax_dtype(dst)
  if src == dst:
    return x
  if _is_complex(x) and not jnp.issubdtype(dst, jnp.complexfloating):
    x = xp.real(x)   # TF drops the imaginary part, even when casting to bool
  if dst == np.bool_:
    return x != 0
  if _is_float(x) and jnp.issubdtype(dst, jnp.integer):
    return _float_to_int(xp, x, dst)
  if truncate and _is_float(x) and jnp.issubdtype(dst, jnp.floating):
    x = _zero_low_mantissa_bits(xp, x, dst)
  if xp is jnp and src.itemsize == 2 and _is_float(x) and jnp.issubdtype(dst, jnp.inexact):
    # XLA folds a widening convert into the op before it (a bfloat16 dot then computes in float32,
    # a reduction sums in float32), so TF's 16-bit rounding of that op would be lost; rounding to
    # the 16-bit type's own widths (exact, kept by XLA's simplifier) holds the op in 16 bits
    info = jnp.finfo(src)
    x = lax.reduce_precision(x, info.nexp, info.nmant)
  return x.astype(dst)


@register("Cast", elementwise=True)
def _cast_rule(ctx, x):
  return cast_like_tf(x, ctx.attr("DstT"), ctx.attr("Truncate", False))


@register("Bitcast")
def _bitcast(ctx, x):
  dst = np.dtype(ctx.attr("type"))
  if xp(x) is jnp:
    return lax.bitcast_convert_type(x, jax_dtype(dst))
  x = np.asarray(x, order="C")
  ratio = x.dtype.itemsize / dst.itemsize
  if ratio > 1:   # one element becomes a trailing dimension of `ratio` elements
    return x.reshape(x.shape + (1,)).view(dst)
  if ratio < 1:   # the trailing dimension is merged into one element
    if not x.shape or x.shape[-1] * x.dtype.itemsize != dst.itemsize:
      raise InvalidNodeError(f"Bitcast of shape {x.shape} {x.dtype} to {dst} needs a last dimension of "
                             f"{dst.itemsize // x.dtype.itemsize}")
    return x.view(dst).reshape(x.shape[:-1])
  return x.view(dst)
