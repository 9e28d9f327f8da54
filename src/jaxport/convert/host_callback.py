"""Tier 3, the last resort: a node runs in TensorFlow, eagerly, through `jax.pure_callback`.

Ops with neither a native rule nor an XLA kernel (string ops, `tf.py_function`, ...) land
here. The node becomes a one-node TF function (`tf_node`); its numeric outputs come back
through `jax.pure_callback`, with shapes and dtypes from TF's shape inference on the
static input shapes, so the node works under `jit`; `vmap_method="sequential"` loops over a
batch. Gradients come from TF's registered gradient: a `jax.custom_vjp` whose backward pass
runs TF's gradient graph in another callback (integer and string inputs get none; an op TF
has no gradient for raises `LookupError` when differentiated; no second-order gradients).

Strings never enter JAX. A node whose inputs are all trace-time constants runs at once
(constant folding), so its string outputs are NumPy object arrays, constants like a string
`Const`, that NumPy-capable native rules (slicing, reshapes) and later callbacks take. A
string that depends on the function's inputs is a `HostTensor`: a recipe that recomputes
it on the host from the JAX values it depends on; a callback node consuming it chains the
recipe into its own callback. Limits: a chained string is recomputed for each consumer;
it passes only between callback nodes and pass-through rules (`Identity`), as native rules
cannot take it; returning it from the converted function raises `StringTensorError` (a
`TypeError`); a recipe built inside a loop or branch body cannot be used outside it.

An output whose shape depends on input values (no static shape) works only when the
inputs are concrete (no `jit`/`vmap`): the node then runs at once. Each op type served
here warns once per conversion (`HostCallbackWarning`): it is slow (a host round trip per
call, serial under `vmap`) and needs TensorFlow at run time. Stateful ops (py_function)
run whenever JAX evaluates the callback: JAX may drop an unused one or run it again.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

import jax
import numpy as np

from jaxport.convert import tf_node
from jaxport.convert.graph import numpy_dtype, storage_array
from jaxport.convert.ops._util import is_concrete, jax_dtype
from jaxport.errors import StringTensorError, TierError

if TYPE_CHECKING:
  from jaxport.convert.interpreter import OpContext

TIER = "host-callback"


class HostCallbackWarning(RuntimeWarning):
  """An op type runs in TensorFlow through a host callback: slow, and TF is needed at run time."""


class HostTensor:
  """A string tensor that depends on the function's inputs: it stays on the host, never in JAX.

  `compute(*leaf_values)` recomputes it on the host from the values of `leaves`, the JAX
  values it depends on; `shape` is TF's static shape (None for unknown dims).
  """
  __slots__ = ("node", "shape", "leaves", "compute")
  dtype = np.dtype(object)

  def __init__(self, node: str, shape, leaves: Sequence, compute: Callable):
    self.node, self.shape, self.leaves, self.compute = node, shape, tuple(leaves), compute

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def _refuse(self, *_, **__):
    raise StringTensorError(
        f"the string tensor made by node {self.node!r} cannot become a JAX value: JAX has no "
        "string dtype. Strings may only flow between ops served by host callbacks; return numbers "
        "from the converted function (e.g. tf.strings.to_number or to_hash_bucket_fast).")

  __jax_array__ = __array__ = _refuse

  def __repr__(self) -> str:
    return f"HostTensor(node={self.node!r}, shape={self.shape}, from {len(self.leaves)} JAX value(s))"


def _tf():
  import tensorflow as tf
  return tf


def _is_string(dtype) -> bool:
  return dtype == _tf().string


def _to_host(value, tf_dtype) -> np.ndarray:
  """A value as NumPy in TF's dtype (JAX holds 64-bit types in 32 bits without x64)."""
  if _is_string(tf_dtype):
    return np.asarray(value, dtype=object)
  return np.asarray(value).astype(numpy_dtype(tf_dtype), copy=False)


# --------------------------------------------------------------------------- planning


class _Plan:
  """Where each argument of the node function comes from, and the JAX values it needs."""

  def __init__(self, inputs: Sequence[Any]):
    self.node_inputs: list[Any] = []   # what tf_node sees: constants baked in, the rest by shape
    self.leaves: list[Any] = []        # the JAX values the callback takes
    self.sources: list[tuple] = []     # per argument: ("jax", leaf) or ("host", HostTensor, first leaf)
    self.lazy = False                  # some input is a string only the host can compute
    for x in inputs:
      if is_concrete(x):
        self.node_inputs.append(x)
      elif isinstance(x, HostTensor):
        self.node_inputs.append(x)
        self.sources.append(("host", x, len(self.leaves)))
        self.leaves += x.leaves
        self.lazy = True
      else:
        self.node_inputs.append(x)
        self.sources.append(("jax", len(self.leaves)))
        self.leaves.append(x)

  def host_args(self, fn: tf_node.NodeFunction, leaf_values: Sequence) -> list[np.ndarray]:
    args = []
    for source, dtype in zip(self.sources, fn.arg_dtypes):
      if source[0] == "jax":
        value = leaf_values[source[1]]
      else:
        host, first = source[1], source[2]
        value = host.compute(*leaf_values[first:first + len(host.leaves)])
      args.append(_to_host(value, dtype))
    return args


def _run(fn: tf_node.NodeFunction, plan: _Plan, leaf_values: Sequence) -> list[np.ndarray]:
  """Runs the node in TF eagerly; its outputs as NumPy in TF's dtypes."""
  tf = _tf()
  args = [tf.convert_to_tensor(a, dtype) for a, dtype in zip(plan.host_args(fn, leaf_values), fn.arg_dtypes)]
  outs = fn.concrete(*args)
  return [storage_array(o.numpy()) for o in (outs or [])]


# --------------------------------------------------------------------------- the rule


def callback_rule(ctx: OpContext, *inputs: Any, why: str = "") -> list:
  """The rule for nodes served by a host callback (see `tiers.node_rule`)."""
  node = ctx.node
  plan = _Plan(inputs)
  fn = tf_node.node_function(node, plan.node_inputs, TIER)
  specs = fn.output_specs()
  warn_once(ctx, why)
  if not plan.leaves and not plan.lazy and not fn.stateful:   # constant inputs: fold now
    return fn.fold()   # NumPy: trace-time constants (strings as object arrays)
  numeric = [k for k, (_, dtype) in enumerate(specs) if not _is_string(dtype)]
  dynamic = [k for k in numeric if specs[k][0] is None or None in specs[k][0]]
  if dynamic:
    if any(isinstance(x, jax.core.Tracer) for x in plan.leaves):
      k = dynamic[0]
      raise TierError(node.op, node.name, TIER,
                      f"output {k} has shape {_shape_text(specs[k][0])}, which depends on input values, "
                      "and a host callback under jax.jit or jax.vmap needs static output shapes.",
                      "Call the converted function without jit/vmap, or give the output a static "
                      "shape in TF (e.g. `y.set_shape(...)` right after a tf.py_function).")
    return _run(fn, plan, [np.asarray(x) for x in plan.leaves])
  call = _numeric_call(ctx, fn, plan, specs, numeric)
  values = call(*plan.leaves) if numeric else []
  out = []
  for k, (shape, dtype) in enumerate(specs):
    if _is_string(dtype):
      out.append(HostTensor(node.name, shape, leaves=plan.leaves,
                            compute=lambda *lv, k=k: _run(fn, plan, lv)[k]))
    else:
      out.append(values[numeric.index(k)])
  return out


def hand_to_host(ctx: OpContext, *inputs: Any) -> list:
  """For a native rule that cannot take this node (`register(host_nodes=...)`): the node through the
  host callback tier (constant inputs fold at once, in TF), or a TierError when callbacks are off."""
  if not ctx.config.get("allow_host_callback", True) and not all(is_concrete(x) for x in inputs):
    raise TierError(ctx.op, ctx.name, "native", "its native rule cannot take this node's inputs or "
                    "attributes, and host callbacks are off.",
                    "Allow host callbacks (jaxport.update_config('allow_host_callback', True)).")
  return callback_rule(ctx, *inputs)


def _shape_text(shape) -> str:
  return "unknown" if shape is None else "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def _numeric_call(ctx: OpContext, fn: tf_node.NodeFunction, plan: _Plan, specs,
                  numeric: list[int]) -> Callable:
  """`f(*leaves) -> numeric outputs` through pure_callback, with TF's gradient as its VJP."""
  structs = [jax.ShapeDtypeStruct(specs[k][0], jax_dtype(numpy_dtype(specs[k][1]))) for k in numeric]

  def host_forward(*leaf_values):
    outs = _run(fn, plan, leaf_values)
    return [np.asarray(outs[k]).astype(s.dtype, copy=False) for k, s in zip(numeric, structs)]

  def forward(*leaves):
    return jax.pure_callback(host_forward, structs, *leaves, vmap_method="sequential")

  if not any(jax.dtypes.issubdtype(x.dtype, np.inexact) for x in plan.leaves):
    return forward   # nothing to differentiate

  # TF's gradient flows from the float outputs to the node's own float inputs (not to
  # the values behind a string recipe: strings carry no gradient).
  wrt, outs = fn.differentiable([dtype for _, dtype in specs])
  wrt = tuple(j for j in wrt if plan.sources[j][0] == "jax")
  kind = fn.gradient_kind()

  @jax.custom_vjp
  def call(*leaves):
    return forward(*leaves)

  def call_fwd(*leaves):
    return forward(*leaves), leaves

  def call_bwd(leaves, cts):
    grads = [None] * len(leaves)
    if not wrt or not outs or kind == "zero":   # TF: no gradient flows here
      return tuple(grads)
    if kind == "none":
      raise tf_node.no_gradient_error(ctx.node)
    found = _tf_vjp(fn, plan, leaves, [cts[numeric.index(k)] for k in outs], wrt, outs)
    for j, g in zip(wrt, found):
      grads[plan.sources[j][1]] = g
    return tuple(grads)

  call.defvjp(call_fwd, call_bwd)
  return call


def warn_once(ctx: OpContext, why: str = "") -> None:
  """One warning per op type per conversion (the conversion's library holds the record)."""
  warned = ctx.runtime.library.memo.setdefault("host_callback_warned", set())
  if ctx.op in warned:
    return
  warned.add(ctx.op)
  reason = f" ({why})" if why else ""
  warnings.warn(HostCallbackWarning(
      f"{ctx.op} (node {ctx.name!r}) runs in TensorFlow through a host callback{reason}. "
      "This is slow (a host round trip per call, serial under vmap) and needs TensorFlow at run time. "
      "Give the op a native rule (jaxport.convert.registry.register), or make it an error with "
      "jaxport.update_config('allow_host_callback', False)."), stacklevel=2)


def vjp_callback(fn: tf_node.NodeFunction, args: list, cts: list, wrt: tuple[int, ...],
                 outs: tuple[int, ...]) -> list:
  """TF's VJP of `fn` through a host callback, for JAX values `args` (one per argument of `fn`)
  and cotangents `cts` of its outputs `outs`: one gradient per argument in `wrt`."""
  return _tf_vjp(fn, _Plan(args), list(args), cts, wrt, outs)


def _tf_vjp(fn: tf_node.NodeFunction, plan: _Plan, leaves: Sequence, cts: list, wrt: tuple[int, ...],
            outs: tuple[int, ...]) -> list:
  """TF's registered gradient of `fn` run on the host: one gradient per argument in `wrt`."""
  specs = fn.output_specs()
  diff_leaves = [plan.sources[j][1] for j in wrt]

  def host(*values):
    tf = _tf()
    leaf_values, ct_values = values[:len(leaves)], values[len(leaves):]
    args = [tf.convert_to_tensor(a, d) for a, d in zip(plan.host_args(fn, leaf_values), fn.arg_dtypes)]
    seeds = [tf.convert_to_tensor(_to_host(ct, specs[k][1])) for ct, k in zip(ct_values, outs)]
    grads = fn.vjp_concrete(wrt, outs)(*args, *seeds)
    return [np.asarray(g.numpy()).astype(leaves[l].dtype, copy=False) for g, l in zip(grads, diff_leaves)]

  structs = [jax.ShapeDtypeStruct(leaves[l].shape, leaves[l].dtype) for l in diff_leaves]
  return jax.pure_callback(host, structs, *leaves, *cts, vmap_method="sequential")
