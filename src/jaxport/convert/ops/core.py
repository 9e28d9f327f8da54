"""Graph plumbing: constants, identities, gradient barriers."""
import warnings

import jax
import ml_dtypes
import numpy as np

from jaxport.convert import custom_gradient
from jaxport.convert.registry import register


@register("Const", structural=True)
def const(ctx):
  value = ctx.attr("value")
  if value.dtype == np.float32 and ctx.config["force_const_float32_to_bfloat16"]:
    value = value.astype(ml_dtypes.bfloat16)
  elif value.dtype == np.float64 and ctx.config["force_const_float64_to_bfloat16"]:
    value = value.astype(ml_dtypes.bfloat16)
  return value


@register("Identity", "Snapshot", "EnsureShape", "CheckNumerics", structural=True)
def identity(ctx, x, *_):
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
  return jax.lax.stop_gradient(x)


@register("PreventGradient", structural=True)
def prevent_gradient(ctx, x):
  message = ctx.attr("message", "") or f"gradient of {ctx.name!r} is not allowed"
  if not ctx.config["raise_on_prevent_gradient"]:
    warnings.warn(f"PreventGradient {ctx.name!r} ({message}) lets gradients through because "
                  "raise_on_prevent_gradient is off.", stacklevel=2)
    return x
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
