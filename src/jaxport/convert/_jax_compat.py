"""The converter's one door to JAX's internal APIs, so a JAX upgrade breaks one file.

`custom_linear(fwd, bwd, res, lin, out_avals)` is a function linear in `lin`, computed
by `fwd(res, lin)`, whose transpose is `bwd(res, cts)`: JAX's `linear_call`, plus what
jax 0.10's lacks: a batching rule (so `vmap` of `grad` and `grad` of `vmap` work), a
transpose that runs `bwd` as plain JAX code (so it can be differentiated again), and
`None` cotangents from `bwd` that stay symbolic zeros (so nothing is transposed behind
them). It reaches `jax.extend.core.Primitive` and the `ad`, `batching` and `mlir`
rule tables; `tests/convert/test_jax2tf_roundtrip.py` pins it.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

_NOT_MAPPED = None   # a batch dimension of an unbatched operand
custom_linear_p = Primitive("jaxport_custom_linear")
custom_linear_p.multiple_results = True


def custom_linear(fwd: Callable, bwd: Callable, res: Sequence, lin: Sequence, out_avals: Sequence) -> list:
  """`fwd(res, lin)`: linear in the arrays `lin`, with transpose `bwd(res, cts) -> [ct or None per lin]`.

  `out_avals` are the `jax.ShapedArray`s of `fwd`'s results; `res` are arrays `fwd` and
  `bwd` are not linear in (differentiating through them runs `fwd` and `bwd` as plain code).
  """
  return custom_linear_p.bind(*res, *lin, n_res=len(res), fwd=fwd, bwd=bwd, out_avals=tuple(out_avals))


def _impl(*args, n_res, fwd, bwd, out_avals):
  return list(fwd(list(args[:n_res]), list(args[n_res:])))


def _abstract_eval(*avals, n_res, fwd, bwd, out_avals):
  return list(out_avals)


def _jvp(primals, tangents, *, n_res, fwd, bwd, out_avals):
  params = dict(n_res=n_res, fwd=fwd, bwd=bwd, out_avals=out_avals)
  out = custom_linear_p.bind(*primals, **params)
  res, lin = list(primals[:n_res]), list(primals[n_res:])
  t_res, t_lin = tangents[:n_res], tangents[n_res:]
  t_out = None
  if not all(type(t) is ad.Zero for t in t_lin):   # linear in lin: the same map on the tangents
    t_out = custom_linear_p.bind(*res, *[ad.instantiate_zeros(t) for t in t_lin], **params)
  if not all(type(t) is ad.Zero for t in t_res):   # through the residuals: differentiate fwd itself
    t_res = [ad.instantiate_zeros(t) for t in t_res]
    _, t_more = jax.jvp(lambda r: list(fwd(r, lin)), (res,), (t_res,))
    t_out = t_more if t_out is None else [a + b for a, b in zip(t_out, t_more)]
  if t_out is None:
    return out, [ad.Zero(a.to_tangent_aval()) for a in out_avals]
  return out, t_out


def _transpose(cts, *args, n_res, fwd, bwd, out_avals):
  res = list(args[:n_res])
  if any(ad.is_undefined_primal(r) for r in res):
    raise NotImplementedError("jaxport_custom_linear is not linear in its residuals")
  cts = [ad.instantiate_zeros(ct) for ct in cts]
  return [None] * n_res + list(bwd(res, cts))


def _batch(args, dims, *, n_res, fwd, bwd, out_avals):
  size = next(x.shape[d] for x, d in zip(args, dims) if d is not _NOT_MAPPED)
  res = [x if d is _NOT_MAPPED else jnp.moveaxis(x, d, 0) for x, d in zip(args[:n_res], dims[:n_res])]
  res_axes = [None if d is _NOT_MAPPED else 0 for d in dims[:n_res]]
  lin = [batching.bdim_at_front(x, d, size) for x, d in zip(args[n_res:], dims[n_res:])]

  def batched_fwd(r, l):
    return jax.vmap(lambda r, l: list(fwd(r, l)), in_axes=(res_axes, 0))(r, l)

  def batched_bwd(r, c):
    return jax.vmap(lambda r, c: list(bwd(r, c)), in_axes=(res_axes, 0))(r, c)

  avals = tuple(a.update(shape=(size, *a.shape)) for a in out_avals)
  out = custom_linear_p.bind(*res, *lin, n_res=n_res, fwd=batched_fwd, bwd=batched_bwd, out_avals=avals)
  return out, [0] * len(out)


custom_linear_p.def_impl(_impl)
custom_linear_p.def_abstract_eval(_abstract_eval)
ad.primitive_jvps[custom_linear_p] = _jvp
ad.primitive_transposes[custom_linear_p] = _transpose
batching.primitive_batchers[custom_linear_p] = _batch
mlir.register_lowering(custom_linear_p, mlir.lower_fun(_impl, multiple_results=True))
