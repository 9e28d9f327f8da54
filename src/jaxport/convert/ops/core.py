"""Graph plumbing: constants, identities, run-time checks, gradient barriers.

TF's run-time checks (`Assert`, `CheckNumerics`) raise in TF when they fail. Here
they cost nothing by default: a check that fails on trace-time constants raises at
once, others are skipped. With `enable_checkify_for_asserts` on, they become
`jax.experimental.checkify` checks carrying TF's message: wrap the converted
function in `checkify.checkify` to get them reported. `EnsureShape` is checked
when the function is traced, against the shapes it really gets.
"""
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxport.convert import export_marks
from jaxport.convert import custom_gradient
from jaxport.convert.ops._util import is_concrete
from jaxport.convert.registry import register
from jaxport.errors import AssertionFailedError, ShapeMismatchError


@register("Const", structural=True)
def const(ctx):
  value = ctx.attr("value")
  if value.dtype == np.float32 and ctx.config["force_const_float32_to_bfloat16"]:
    value = value.astype(ml_dtypes.bfloat16)
  elif value.dtype == np.float64 and ctx.config["force_const_float64_to_bfloat16"]:
    value = value.astype(ml_dtypes.bfloat16)
  return value


@register("Identity", "Snapshot", structural=True)
def identity(ctx, x, *_):
  return x


@register("EnsureShape", structural=True)
def ensure_shape(ctx, x):
  expected, got = ctx.attr("shape"), tuple(np.shape(x))
  if expected is not None and (len(expected) != len(got) or
                               any(e is not None and e != g for e, g in zip(expected, got))):
    raise ShapeMismatchError(
        f"EnsureShape {ctx.name!r}: Shape of tensor {got} is not compatible with expected shape "
        f"{tuple(expected)} (Expected shape={tuple(expected)}, got {got}). Call the function with inputs "
        "of the shapes it was converted for.")
  return x


def runtime_check(ctx, ok, message: str, *values) -> None:
  """A TF run-time check: raise now when it fails on constants, else a checkify check when
  `enable_checkify_for_asserts` is on (TF raises; plain JAX cannot, so it is skipped otherwise)."""
  if is_concrete(ok) and all(is_concrete(v) for v in values):
    if not np.all(ok):
      shown = message.format(*[np.asarray(v) for v in values])
      raise AssertionFailedError(f"{ctx.op} {ctx.name!r} failed: {shown}")
    return
  if ctx.config["enable_checkify_for_asserts"]:
    from jax.experimental import checkify
    checkify.check(jnp.all(ok), f"{ctx.op} {ctx.name!r} failed: {message}", *values)


def _format_data(data) -> tuple[str, list]:
  """Assert's data inputs as a checkify format string (constant strings inline) and its arguments."""
  parts, values = [], []
  for item in data:
    if is_concrete(item) and np.asarray(item).dtype == object:
      text = " ".join(v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(item).reshape(-1))
      parts.append(text.replace("{", "{{").replace("}", "}}"))
    else:
      parts.append("{}")
      values.append(item)
  return " ".join(parts), values


@register("Assert", stateful=True)
def assert_(ctx, condition, *data):
  message, values = _format_data(data)
  runtime_check(ctx, condition, message, *values)
  return ()


@register("CheckNumerics", stateful=True)
def check_numerics(ctx, x):
  message = ctx.attr("message", "")
  m = np if is_concrete(x) else jnp
  message = message.replace("{", "{{").replace("}", "}}")
  # tf2jax's wording ("Found NaN values") beside TF's ("Tensor had NaN values").
  runtime_check(ctx, ~m.isnan(x), f"{message} : Found NaN values (Tensor had NaN values)")
  runtime_check(ctx, ~m.isinf(x), f"{message} : Found Inf values (Tensor had Inf values)")
  return x


@register("IdentityN", structural=True)
def identity_n(ctx, *xs):
  custom = ctx.runtime.custom_gradients.get(id(ctx.node))
  if custom is not None:   # a @tf.custom_gradient boundary (see convert/custom_gradient.py)
    return custom_gradient.apply(custom, ctx.runtime, list(xs))
  return list(xs)


@register("NoOp", structural=True)
def no_op(ctx, *_):
  return ()


@register("PlaceholderWithDefault", structural=True)
def placeholder_with_default(ctx, default):
  return default


@register("StopGradient", structural=True)
def stop_gradient(ctx, x):
  return x if is_concrete(x) else export_marks.stop_gradient(x)   # a constant (a shape) stays static


@register("PreventGradient", structural=True)
def prevent_gradient(ctx, x):
  message = ctx.attr("message", "") or f"gradient of {ctx.name!r} is not allowed"
  if not ctx.config["raise_on_prevent_gradient"]:
    warnings.warn(f"PreventGradient {ctx.name!r} ({message}) lets gradients through because "
                  "raise_on_prevent_gradient is off.", stacklevel=2)
    return x
  if export_marks.active(x):   # the artifact keeps the refusal (not the message: a name holds no text)
    return _prevented_in_artifact(x)
  return _prevented(message)(x)


def _prevented(message: str):
  @jax.custom_vjp
  def fn(x):
    return x

  def fwd(x):
    return x, None

  def bwd(_, g):
    raise LookupError(f"Gradient explicitly disabled. Reason: {message}")

  fn.defvjp(fwd, bwd)
  return fn


_prevented_in_artifact = export_marks.marked("prevent_gradient")(
    _prevented("a PreventGradient node of the exported function (its message is not in the artifact)"))
