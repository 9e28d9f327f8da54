"""Op rules: TF's fused RNN kernels (`LSTMBlockCell`, `BlockLSTM`, `BlockLSTMV2`, `GRUBlockCell`) and
their gradient ops (`LSTMBlockCellGrad`, `BlockLSTMGrad`, `BlockLSTMGradV2`, `GRUBlockCellGrad`), as
TF1 graphs hold them (`tf.contrib.rnn.LSTMBlockCell`, `LSTMBlockFusedCell`, `GRUBlockCell`).

The forward rules follow tensorflow/core/kernels/rnn/lstm_ops.cc and gru_ops.h: the gates are
`[x, h_prev] @ w + b`, laid out i, ci, f, o (`LSTMBlockCell`, `BlockLSTM`) or i, f, ci, o (`BlockLSTMV2`,
which has no forget bias); `cell_clip > 0` clips the cell state to [-cell_clip, cell_clip]. The block ops
run `seq_len_max` steps of a `lax.scan` (a traced `seq_len_max` masks the steps instead); from step
`seq_len_max` on every output is 0 (TF zeroes cs and h there and leaves i, f, o, ci, co uninitialized).

`jax.grad` of the forward rules is what TF's backward kernels compute: it flows from `cs` and `h` only
(the gradient functions ignore the other outputs), and through the cell clip as if unclipped. (TF itself
registers gradients for BlockLSTM and BlockLSTMV2 only; tf.contrib registered the cells'.) The gradient
ops are those kernels' formulas, on the forward values they are given.

Differences from TF: a `seq_len_max` outside [0, T] is an error when it is known, and is clamped to it
when it is traced (TF always errors); the uninitialized outputs past `seq_len_max` are zeros. TF's
gradient of BlockLSTMV2 runs BlockLSTMGrad, whose gate layout is BlockLSTM's, so tf.GradientTape's is
wrong there; JAX's, used here, is BlockLSTMGradV2's (and matches finite differences).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.ops._util import known_value
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

# where each gate's columns sit in w and b (in units of cell_size): i, ci, f, o
_ICFO = (0, 1, 2, 3)
_IFCO = (0, 2, 1, 3)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def _clip(cs, limit: float):
  """The cell clip, differentiated as the identity like TF's backward kernels."""
  return jnp.minimum(jnp.maximum(cs, -limit), limit)   # Eigen's scalar_clip_op


@_clip.defjvp
def _clip_jvp(limit, primals, tangents):
  return _clip(primals[0], limit), tangents[0]


@export_marks.marked("lstm_cell_clip", static=True)   # an artifact keeps the derivative too
def _clip_marked(cs, *, limit: float):
  return _clip(cs, limit)


def _gates(gates, layout):
  """The i, ci, f, o gate columns of `gates` [batch, 4 * cell]."""
  parts = jnp.split(gates, 4, axis=-1)
  return tuple(parts[k] for k in layout)


def _lstm_cell(x, cs_prev, h_prev, w, wci, wcf, wco, b, *, forget_bias, cell_clip, use_peephole, layout):
  """One LSTMBlockCell step: (i, cs, f, o, ci, co, h)."""
  gi, gc, gf, go = _gates(jnp.concatenate([x, h_prev], 1) @ w + b, layout)
  if use_peephole:
    gi = gi + cs_prev * wci
  gf = gf + jnp.asarray(forget_bias, gf.dtype)
  if use_peephole:
    gf = gf + cs_prev * wcf
  i, ci, f = jax.nn.sigmoid(gi), jnp.tanh(gc), jax.nn.sigmoid(gf)
  cs = i * ci + f * cs_prev
  if cell_clip > 0:
    cs = _clip_marked(cs, limit=cell_clip)
  co = jnp.tanh(cs)
  o = jax.nn.sigmoid(go + cs * wco if use_peephole else go)
  return i, cs, f, o, ci, co, o * co


def _lstm_cell_bprop(cs_prev, wci, wcf, wco, i, cs, f, o, ci, co, cs_grad, h_grad, *, use_peephole, layout):
  """TF's LSTMBlockCellBprop: (cs_prev_grad, dgates, wci_grad, wcf_grad, wco_grad)."""
  do = o * (1 - o) * h_grad * co
  dcs = (1 - co * co) * h_grad * o + cs_grad
  if use_peephole:
    dcs = dcs + do * wco
  dci = (1 - ci * ci) * dcs * i
  df = f * (1 - f) * dcs * cs_prev
  di = i * (1 - i) * dcs * ci
  by_gate = (di, dci, df, do)
  dgates = jnp.concatenate([by_gate[layout.index(k)] for k in range(4)], 1)
  cs_prev_grad = dcs * f
  if not use_peephole:
    return cs_prev_grad, dgates, jnp.zeros_like(wci), jnp.zeros_like(wcf), jnp.zeros_like(wco)
  cs_prev_grad = cs_prev_grad + di * wci + df * wcf
  return cs_prev_grad, dgates, (di * cs_prev).sum(0), (df * cs_prev).sum(0), (do * cs).sum(0)


def _arrays(*xs):
  return [jnp.asarray(x) for x in xs]


def _run_steps(ctx, step, carry, xs, seq_len_max, reverse=False):
  """`lax.scan(step)` over the first `seq_len_max` of the T steps in `xs`, its outputs zero-padded to T.

  A known `seq_len_max` slices the steps; a traced one runs all T and masks steps from it on (they keep
  the carry and output zeros). `step(carry, xs_t)` returns (carry, outputs).
  """
  steps = jax.tree.leaves(xs)[0].shape[0]
  known = known_value(seq_len_max)
  if known is not None and not 0 <= int(known) <= steps:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: seq_len_max must be between 0 and {steps} but is {int(known)}")
  run = steps if known is None else int(known)
  limit = None if known is not None else jnp.asarray(seq_len_max)

  def body(carry, inputs):
    t, xs_t = inputs
    new_carry, outs = step(carry, xs_t)
    if limit is None:
      return new_carry, outs
    active = t < limit
    keep = lambda new, old: jnp.where(active, new, old)  # noqa: E731
    return (jax.tree.map(keep, new_carry, carry),
            jax.tree.map(lambda o: jnp.where(active, o, jnp.zeros_like(o)), outs))

  xs = jax.tree.map(lambda a: a[:run], xs)
  carry, outs = lax.scan(body, carry, (jnp.arange(run), xs), reverse=reverse)
  pad = lambda o: jnp.pad(o, [(0, steps - run)] + [(0, 0)] * (o.ndim - 1))  # noqa: E731
  return carry, jax.tree.map(pad, outs)


def _only_cs_and_h(outputs):
  """TF's gradient functions read the gradients of cs and h only."""
  i, cs, f, o, ci, co, h = outputs
  stop = export_marks.stop_gradient
  return stop(i), cs, stop(f), stop(o), stop(ci), stop(co), h


def _cell_attrs(ctx, forget_bias: bool = True):
  return dict(forget_bias=float(ctx.attr("forget_bias", 1.0)) if forget_bias else 0.0,
              cell_clip=float(ctx.attr("cell_clip", 3.0 if forget_bias else 0.0)),
              use_peephole=bool(ctx.attr("use_peephole", False)))


@register("LSTMBlockCell")
def lstm_block_cell(ctx, x, cs_prev, h_prev, w, wci, wcf, wco, b):
  outputs = _lstm_cell(*_arrays(x, cs_prev, h_prev, w, wci, wcf, wco, b), **_cell_attrs(ctx), layout=_ICFO)
  return _only_cs_and_h(outputs)


def _block_lstm(ctx, layout, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b):
  x, cs_prev, h_prev, w, wci, wcf, wco, b = _arrays(x, cs_prev, h_prev, w, wci, wcf, wco, b)
  cell = functools.partial(_lstm_cell, w=w, wci=wci, wcf=wcf, wco=wco, b=b, layout=layout,
                           **_cell_attrs(ctx, forget_bias=ctx.op == "BlockLSTM"))

  def step(carry, x_t):
    outputs = cell(x_t, *carry)
    return (outputs[1], outputs[6]), outputs

  _, outputs = _run_steps(ctx, step, (cs_prev, h_prev), x, seq_len_max)
  return _only_cs_and_h(outputs)


@register("BlockLSTM")
def block_lstm(ctx, seq_len_max, *inputs):
  return _block_lstm(ctx, _ICFO, seq_len_max, *inputs)


@register("BlockLSTMV2")
def block_lstm_v2(ctx, seq_len_max, *inputs):
  return _block_lstm(ctx, _IFCO, seq_len_max, *inputs)


@register("LSTMBlockCellGrad")
def lstm_block_cell_grad(ctx, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, cs_grad, h_grad):
  """(cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad); TF's gradient function derives the rest."""
  return _lstm_cell_bprop(*_arrays(cs_prev, wci, wcf, wco, i, cs, f, o, ci, co, cs_grad, h_grad),
                          use_peephole=bool(ctx.attr("use_peephole")), layout=_ICFO)


def _block_lstm_grad(ctx, layout, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b,
                     i, cs, f, o, ci, co, h, cs_grad, h_grad):
  """TF's BlockLSTMGradOp: the steps backwards from seq_len_max - 1, gradients summed over them."""
  x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad = _arrays(
      x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad)
  inputs = x.shape[2]
  bprop = functools.partial(_lstm_cell_bprop, wci=wci, wcf=wcf, wco=wco, layout=layout,
                            use_peephole=bool(ctx.attr("use_peephole")))
  cs_prevs = jnp.concatenate([cs_prev[None], cs[:-1]])
  h_prevs = jnp.concatenate([h_prev[None], h[:-1]])

  def step(carry, step_inputs):
    dcs_next, dh_next, w_grad, wci_grad, wcf_grad, wco_grad, b_grad = carry
    x_t, cs_prev_t, h_prev_t, i_t, cs_t, f_t, o_t, ci_t, co_t, cs_grad_t, h_grad_t = step_inputs
    dcs_prev, dgates, dwci, dwcf, dwco = bprop(cs_prev_t, i=i_t, cs=cs_t, f=f_t, o=o_t, ci=ci_t, co=co_t,
                                               cs_grad=cs_grad_t + dcs_next, h_grad=h_grad_t + dh_next)
    xh_grad = dgates @ w.T
    xh = jnp.concatenate([x_t, h_prev_t], 1)
    carry = (dcs_prev, xh_grad[:, inputs:], w_grad + xh.T @ dgates, wci_grad + dwci, wcf_grad + dwcf,
             wco_grad + dwco, b_grad + dgates.sum(0))
    return carry, xh_grad[:, :inputs]

  zeros = jnp.zeros_like
  carry = (zeros(cs_prev), zeros(h_prev), zeros(w), zeros(wci), zeros(wcf), zeros(wco), zeros(b))
  per_step = (x, cs_prevs, h_prevs, i, cs, f, o, ci, co, cs_grad, h_grad)
  carry, x_grad = _run_steps(ctx, step, carry, per_step, seq_len_max, reverse=True)
  cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad = carry
  return x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad


@register("BlockLSTMGrad")
def block_lstm_grad(ctx, *inputs):
  return _block_lstm_grad(ctx, _ICFO, *inputs)


@register("BlockLSTMGradV2")
def block_lstm_grad_v2(ctx, *inputs):
  return _block_lstm_grad(ctx, _IFCO, *inputs)


@register("GRUBlockCell")
def gru_block_cell(ctx, x, h_prev, w_ru, w_c, b_ru, b_c):
  """(r, u, c, h): h = u * h_prev + (1 - u) * c; the gradient flows from h only, as TF's does."""
  x, h_prev, w_ru, w_c, b_ru, b_c = _arrays(x, h_prev, w_ru, w_c, b_ru, b_c)
  r, u = jnp.split(jax.nn.sigmoid(jnp.concatenate([x, h_prev], 1) @ w_ru + b_ru), 2, axis=1)
  c = jnp.tanh(jnp.concatenate([x, h_prev * r], 1) @ w_c + b_c)
  h = u * (h_prev - c) + c
  stop = export_marks.stop_gradient
  return stop(r), stop(u), stop(c), h


@register("GRUBlockCellGrad")
def gru_block_cell_grad(ctx, x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
  """TF's GRUBlockCellBprop: (d_x, d_h_prev, d_c_bar, d_r_bar_u_bar)."""
  x, h_prev, w_ru, w_c, r, u, c, d_h = _arrays(x, h_prev, w_ru, w_c, r, u, c, d_h)
  inputs = x.shape[1]
  d_c_bar = d_h * (1 - u) * (1 - c * c)
  d_u_bar = d_h * (h_prev - c) * u * (1 - u)
  d_xh_c = d_c_bar @ w_c.T
  d_hr = d_xh_c[:, inputs:]
  d_r_bar = d_hr * h_prev * r * (1 - r)
  d_r_bar_u_bar = jnp.concatenate([d_r_bar, d_u_bar], 1)
  d_xh_ru = d_r_bar_u_bar @ w_ru.T
  d_x = d_xh_ru[:, :inputs] + d_xh_c[:, :inputs]
  d_h_prev = d_xh_ru[:, inputs:] + d_hr * r + d_h * u
  return d_x, d_h_prev, d_c_bar, d_r_bar_u_bar
