"""Op rules: the training ops of TF's optimizers (`ResourceApply*`, `ResourceSparseApply*`).

Each update is written once, as a function of the slot values (`var` first), the
hyperparameters and `grad`, in the op's input order, following TF's kernels
(`tensorflow/core/kernels/training_ops.cc`). `@_optimizer` registers it as the
dense op, which reads its variables and assigns the results (they reach the caller
in `new_params`), and as the sparse op, whose inputs are the dense op's with
`indices` right after `grad`: it gathers the slot rows at `indices`, updates them
and writes them back.

Differences from TF: a sparse op given duplicate indices computes every duplicate
from the rows as they were before the op and keeps one of them (TF's CPU kernel
applies duplicates one after another, its GPU kernel races); tf_keras and TF1
optimizers sum duplicate gradients before calling the op, so they never pass any.
Out-of-range sparse indices are dropped (TF raises); negative ones wrap.
"""
from __future__ import annotations

import inspect
from typing import Callable

import jax.numpy as jnp

from jaxport.convert.interpreter import VariableRef
from jaxport.convert.registry import register


def _optimizer(*op_types: str) -> Callable:
  """Registers `update(ctx, *slots, *hyperparameters_and_grad) -> new slots` for `op_types`."""
  def decorator(update: Callable) -> Callable:
    grad_at = list(inspect.signature(update).parameters).index("grad") - 1   # after ctx

    def rule(ctx, *inputs):
      refs = [x for x in inputs if isinstance(x, VariableRef)]
      rest = list(inputs[len(refs):])
      slots = [jnp.asarray(ctx.runtime.read_variable(ref)) for ref in refs]
      if ctx.op.startswith("ResourceSparse"):
        indices = jnp.asarray(rest.pop(grad_at + 1 - len(refs)))
        rows = update(ctx, *(s[indices] for s in slots), *rest)
        new = [s.at[indices].set(r.astype(s.dtype), mode="drop") for s, r in zip(slots, rows)]
      else:
        new = update(ctx, *slots, *rest)
      for ref, old, value in zip(refs, slots, new):
        ctx.runtime.assign_variable(ref, jnp.asarray(value).astype(old.dtype))
      return ()

    rule.__name__ = rule.__qualname__ = f"apply_{update.__name__.lstrip('_')}"
    sparse = [op for op in op_types if op.startswith("ResourceSparse")]
    register(*[op for op in op_types if op not in sparse], writes_state=True, structural=True)(rule)
    if sparse:   # `indices` follows `grad`
      register(*sparse, writes_state=True, structural=True, scatter_indices=grad_at + 1)(rule)
    return update
  return decorator


def _proximal(prox_var, lr, l1, l2):
  """TF's proximal step: soft-threshold by `lr * l1` (when l1 > 0), then shrink by `1 + lr * l2`."""
  thresholded = jnp.sign(prox_var) * jnp.maximum(jnp.abs(prox_var) - lr * l1, 0)
  return jnp.where(l1 > 0, thresholded, prox_var) / (1 + lr * l2)


# --------------------------------------------------------------------------- gradient descent


@_optimizer("ResourceApplyGradientDescent")
def _gradient_descent(ctx, var, alpha, grad):
  return (var - alpha * grad,)


@_optimizer("ResourceApplyProximalGradientDescent", "ResourceSparseApplyProximalGradientDescent")
def _proximal_gradient_descent(ctx, var, alpha, l1, l2, grad):
  return (_proximal(var - alpha * grad, alpha, l1, l2),)


@_optimizer("ResourceApplyMomentum", "ResourceSparseApplyMomentum")
def _momentum(ctx, var, accum, lr, grad, momentum):
  accum = accum * momentum + grad
  if ctx.attr("use_nesterov", False):
    return var - (grad * lr + accum * momentum * lr), accum
  return var - accum * lr, accum


@_optimizer("ResourceApplyKerasMomentum", "ResourceSparseApplyKerasMomentum")
def _keras_momentum(ctx, var, accum, lr, grad, momentum):
  accum = accum * momentum - grad * lr
  if ctx.attr("use_nesterov", False):
    return var + (accum * momentum - grad * lr), accum
  return var + accum, accum


# --------------------------------------------------------------------------- Adam family


@_optimizer("ResourceApplyAdam")
def _adam(ctx, var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad):
  alpha = lr * jnp.sqrt(1 - beta2_power) / (1 - beta1_power)
  m = m + (grad - m) * (1 - beta1)
  v = v + (jnp.square(grad) - v) * (1 - beta2)
  if ctx.attr("use_nesterov", False):
    return var - (grad * (1 - beta1) + beta1 * m) * alpha / (jnp.sqrt(v) + epsilon), m, v
  return var - m * alpha / (jnp.sqrt(v) + epsilon), m, v


@_optimizer("ResourceApplyAdamWithAmsgrad")
def _adam_with_amsgrad(ctx, var, m, v, vhat, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad):
  alpha = lr * jnp.sqrt(1 - beta2_power) / (1 - beta1_power)
  m = m + (grad - m) * (1 - beta1)
  v = v + (jnp.square(grad) - v) * (1 - beta2)
  vhat = jnp.maximum(vhat, v)
  return var - m * alpha / (jnp.sqrt(vhat) + epsilon), m, v, vhat


@_optimizer("ResourceApplyAdaMax")
def _adamax(ctx, var, m, v, beta1_power, lr, beta1, beta2, epsilon, grad):
  m = m + (grad - m) * (1 - beta1)
  v = jnp.maximum(beta2 * v, jnp.abs(grad))
  return var - lr / (1 - beta1_power) * (m / (v + epsilon)), m, v


# --------------------------------------------------------------------------- Adagrad family


@_optimizer("ResourceApplyAdagrad", "ResourceSparseApplyAdagrad")
def _adagrad(ctx, var, accum, lr, grad):
  if ctx.attr("update_slots", True):
    accum = accum + jnp.square(grad)
  return var - lr * grad / jnp.sqrt(accum), accum


@_optimizer("ResourceApplyAdagradV2", "ResourceSparseApplyAdagradV2")
def _adagrad_v2(ctx, var, accum, lr, epsilon, grad):
  if ctx.attr("update_slots", True):
    accum = accum + jnp.square(grad)
  return var - lr * grad / (jnp.sqrt(accum) + epsilon), accum


@_optimizer("ResourceApplyProximalAdagrad", "ResourceSparseApplyProximalAdagrad")
def _proximal_adagrad(ctx, var, accum, lr, l1, l2, grad):
  accum = accum + jnp.square(grad)
  step = lr / jnp.sqrt(accum)
  return _proximal(var - grad * step, step, l1, l2), accum


@_optimizer("ResourceApplyAdagradDA", "ResourceSparseApplyAdagradDA")
def _adagrad_da(ctx, var, gradient_accum, gradient_squared_accum, grad, lr, l1, l2, global_step):
  gradient_accum = gradient_accum + grad
  gradient_squared_accum = gradient_squared_accum + jnp.square(grad)
  step = jnp.asarray(global_step).astype(gradient_accum.dtype)
  shrunk = jnp.sign(gradient_accum) * jnp.maximum(jnp.abs(gradient_accum) - l1 * step, 0)
  numerator = jnp.where(l1 > 0, shrunk, gradient_accum)
  var = -lr * numerator / (l2 * step * lr + jnp.sqrt(gradient_squared_accum))
  return var, gradient_accum, gradient_squared_accum


@_optimizer("ResourceApplyAdadelta", "ResourceSparseApplyAdadelta")
def _adadelta(ctx, var, accum, accum_update, lr, rho, epsilon, grad):
  accum = accum * rho + jnp.square(grad) * (1 - rho)
  update = jnp.sqrt(accum_update + epsilon) / jnp.sqrt(accum + epsilon) * grad
  accum_update = accum_update * rho + jnp.square(update) * (1 - rho)
  return var - update * lr, accum, accum_update


# --------------------------------------------------------------------------- RMSProp


@_optimizer("ResourceApplyRMSProp", "ResourceSparseApplyRMSProp")
def _rms_prop(ctx, var, ms, mom, lr, rho, momentum, epsilon, grad):
  ms = ms + (jnp.square(grad) - ms) * (1 - rho)
  mom = mom * momentum + lr * grad / jnp.sqrt(ms + epsilon)
  return var - mom, ms, mom


@_optimizer("ResourceApplyCenteredRMSProp", "ResourceSparseApplyCenteredRMSProp")
def _centered_rms_prop(ctx, var, mg, ms, mom, lr, rho, momentum, epsilon, grad):
  ms = ms + (jnp.square(grad) - ms) * (1 - rho)
  mg = mg + (grad - mg) * (1 - rho)
  mom = mom * momentum + lr * grad / jnp.sqrt(ms - jnp.square(mg) + epsilon)
  return var - mom, mg, ms, mom


# --------------------------------------------------------------------------- FTRL


def _ftrl_step(ctx, var, accum, linear, grad, lr, l1, l2, l2_shrinkage, lr_power):
  shrunk_grad = grad + 2 * l2_shrinkage * var
  new_accum = accum + jnp.square(grad)
  power_delta = new_accum ** -lr_power - accum ** -lr_power
  if ctx.attr("multiply_linear_by_lr", False):
    linear = linear + shrunk_grad * lr - power_delta * var
    l1_scaled, quadratic = l1 * lr, new_accum ** -lr_power + 2 * l2 * lr
  else:
    linear = linear + shrunk_grad - power_delta / lr * var
    l1_scaled, quadratic = l1, new_accum ** -lr_power / lr + 2 * l2
  var = jnp.where(jnp.abs(linear) > l1_scaled, (jnp.sign(linear) * l1_scaled - linear) / quadratic, 0)
  return var, new_accum, linear


@_optimizer("ResourceApplyFtrl", "ResourceSparseApplyFtrl")
def _ftrl(ctx, var, accum, linear, grad, lr, l1, l2, lr_power):
  return _ftrl_step(ctx, var, accum, linear, grad, lr, l1, l2, 0, lr_power)


@_optimizer("ResourceApplyFtrlV2", "ResourceSparseApplyFtrlV2")
def _ftrl_v2(ctx, var, accum, linear, grad, lr, l1, l2, l2_shrinkage, lr_power):
  return _ftrl_step(ctx, var, accum, linear, grad, lr, l1, l2, l2_shrinkage, lr_power)


# --------------------------------------------------------------------------- sign methods


@_optimizer("ResourceApplyAddSign")
def _add_sign(ctx, var, m, lr, alpha, sign_decay, beta, grad):
  m = m * beta + grad * (1 - beta)
  return var - lr * (alpha + sign_decay * jnp.sign(grad) * jnp.sign(m)) * grad, m


@_optimizer("ResourceApplyPowerSign")
def _power_sign(ctx, var, m, lr, logbase, sign_decay, beta, grad):
  m = m * beta + grad * (1 - beta)
  return var - lr * jnp.exp(logbase * sign_decay * jnp.sign(grad) * jnp.sign(m)) * grad, m
