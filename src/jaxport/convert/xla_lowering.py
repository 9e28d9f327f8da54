"""Tier 2: a node without a native rule runs as TF's own XLA lowering, interpreted into lax.

For each node, `tf_node` builds a one-node TF function (constant inputs baked in), TF
lowers it with `experimental_get_compiler_ir(...)(stage="stablehlo_serialized")`, and
`jaxport.convert.stablehlo` interprets that module (under a cached `jax.jit`) inside the
caller's JAX trace, so `jit` and `vmap` work as for native rules. Lowered modules are
cached with the node function: one lowering per (op, attrs, input shapes/dtypes, constants).

Reverse-mode gradients are TF's: the XLA lowering of TF's registered gradient of the node
(lowered when first differentiated), or a host callback running it when that lowering
fails. Forward mode (`jax.jvp`) differentiates the interpreted lowering itself.

A node whose inputs are all trace-time constants is folded instead: TF runs it once at
trace time and its outputs stay NumPy, as native rules keep constant shape arithmetic.

Lowering fails when XLA needs an input at compile time that depends on the function's
inputs, when the op has no XLA kernel for these dtypes, or when the module uses an op
the StableHLO interpreter cannot take. The node then falls back to the host-callback
tier when `allow_host_callback` is on, else raises `TierError` naming the node and why.

`lowering_stats()` reports how many nodes were lowered and what lowering cost.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import jax

from jaxport.convert import export_marks
from jaxport.convert import tf_node
from jaxport.convert.graph import numpy_dtype
from jaxport.errors import TierError

if TYPE_CHECKING:
  from jaxport.convert.interpreter import OpContext

TIER = "XLA-lowering (StableHLO)"
_FIX = ("Give the op a native rule (jaxport.convert.registry.register), or allow the host-callback "
        "tier with jaxport.update_config('allow_host_callback', True).")

_stats_lock = threading.Lock()
_stats: dict[str, Any] = {"lowered": 0, "failed": 0, "reused": 0, "seconds": 0.0, "by_op": {}}


class _Lowered:
  """What lowering one node function gave: the decoded module, or why it failed."""
  __slots__ = ("module", "reason")

  def __init__(self, module=None, reason: str = ""):
    self.module, self.reason = module, reason


def lowered_rule(ctx: OpContext, *inputs: Any) -> list:
  """The rule for nodes served by TF's XLA lowering (see `tiers.node_rule`)."""
  node = ctx.node
  fn = tf_node.node_function(node, inputs, TIER)
  if not fn.arg_positions and not fn.stateful:   # constant inputs: fold, keeping shapes static
    return fn.fold()
  lowered = _lower(fn, node.op, fn.stablehlo, "lowered")
  if lowered.module is None:
    return _fallback(ctx, inputs, lowered.reason)
  args = [_cast(inputs[pos], dtype) for pos, dtype in zip(fn.arg_positions, fn.arg_dtypes)]
  from jaxport.errors import StableHLOError
  rng = ctx.runtime.rng_for(node.name) if fn.stateful and ctx.runtime.rng is not None else None
  try:
    return _differentiable_call(ctx, fn, lowered.module, rng)(*args)
  except StableHLOError as e:   # an op form the interpreter cannot take yet
    fn.memo["lowered"] = _Lowered(reason=str(e))
    return _fallback(ctx, inputs, str(e))


def _cast(x: Any, tf_dtype) -> Any:
  """`x` in the dtype JAX holds TF's `tf_dtype` in (64-bit types are 32-bit without x64)."""
  want = jax.dtypes.canonicalize_dtype(numpy_dtype(tf_dtype))
  return x if x.dtype == want else x.astype(want)


def _differentiable_call(ctx: OpContext, fn: tf_node.NodeFunction, module, rng) -> Callable:
  """`f(*args) -> outputs` interpreting `module`: forward mode differentiates the interpreted
  lowering, reverse mode runs TF's registered gradient (`custom_gradient.differentiable`).

  TF's gradient is what TF computes: straight-through estimators (FakeQuant*), subgradient
  choices, and lowerings with while loops (which JAX cannot reverse-differentiate) all follow
  TF this way. Where TF's gradient is not the derivative (straight-through estimators),
  `jax.jvp` gives the lowering's derivative while `jax.grad` gives TF's.
  """
  from jaxport.convert import custom_gradient
  node = ctx.node
  name = f"{node.op} node {node.name!r}"
  result_types = module.main.result_types
  run = _jitted(fn, "forward", module, name)

  def forward(*args):
    return run(args, rng)

  wrt, outs = fn.differentiable([t.dtype for t in result_types])
  if not wrt or not outs:
    return forward
  kind = fn.gradient_kind()
  if kind == "zero":   # TF declares the op non-differentiable
    return lambda *args: forward(*[export_marks.stop_gradient(a) for a in args])

  def backward(args, dys):
    if kind == "none":
      raise tf_node.no_gradient_error(node)
    cts = [dys[k].astype(result_types[k].dtype) for k in outs]
    lowered = _lower(fn, f"{node.op} (gradient)", lambda: fn.vjp_stablehlo(wrt, outs), ("vjp", wrt, outs))
    if lowered.module is not None:
      run_vjp = _jitted(fn, ("vjp", wrt, outs), lowered.module, f"the gradient of {name}")
      grads = run_vjp((*args, *cts), None)
    elif ctx.config.get("allow_host_callback", True):
      from jaxport.convert import host_callback
      host_callback.warn_once(ctx, f"its gradient's XLA lowering failed: {lowered.reason}")
      grads = host_callback.vjp_callback(fn, list(args), cts, wrt, outs)
    else:
      raise TierError(node.op, node.name, TIER, f"the lowering of its gradient failed: {lowered.reason}", _FIX)
    out = [None] * len(args)
    for j, g in zip(wrt, grads):
      out[j] = g.astype(args[j].dtype)
    return out

  return lambda *args: custom_gradient.differentiable(lambda a: forward(*a), backward, list(args), list(args))


def _jitted(fn: tf_node.NodeFunction, key, module, name: str) -> Callable:
  """`f(args, rng) -> outputs` interpreting `module` under `jax.jit`, cached on `fn`.

  The jit compiles an eagerly called node once (interpreting loops op by op is slow) and
  lets later traces of the same node reuse its jaxpr.
  """
  run = fn.memo.get(("jit", key))
  if run is None:
    from jaxport.convert.stablehlo import call_module
    run = jax.jit(lambda args, rng: call_module(module, list(args), rng=rng, name=name))
    fn.memo[("jit", key)] = run
  return run


def _fallback(ctx: OpContext, inputs: Sequence[Any], reason: str) -> list:
  from jaxport.convert.tiers import has_host_kernel
  if ctx.config.get("allow_host_callback", True) and has_host_kernel(ctx.op):
    from jaxport.convert import host_callback
    return host_callback.callback_rule(ctx, *inputs, why=f"XLA lowering failed: {reason}")
  raise TierError(ctx.op, ctx.name, TIER, reason, _FIX)


def _lower(fn: tf_node.NodeFunction, op: str, get_bytes, key) -> _Lowered:
  """The lowering `get_bytes()` of `fn`, cached on it under `key`; `op` names it in the stats."""
  cached = fn.memo.get(key)
  if cached is not None:
    _record(op, reused=True)
    return cached
  start = time.perf_counter()
  try:
    data = get_bytes()
  except Exception as e:   # TF raises ValueError or an OpError with XLA's diagnosis
    lowered = _Lowered(reason=_tf_reason(e))
  else:
    from jaxport.convert.stablehlo import check_module, load_module
    from jaxport.errors import StableHLOError
    try:
      module = load_module(data)
      check_module(module, where=f"the lowering of {op}")
      lowered = _Lowered(module)
    except StableHLOError as e:
      lowered = _Lowered(reason=str(e))
  _record(op, seconds=time.perf_counter() - start, failed=lowered.module is None)
  fn.memo[key] = lowered
  return lowered


def _tf_reason(error: Exception) -> str:
  """The useful lines of TF's lowering error."""
  text = getattr(error, "message", None) or str(error)
  text = text.replace("Failed getting HLO text: ", "").strip().strip("'")
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  noise = ("The op is created at", "dummy_file_name", "tf2xla conversion failed")
  keep = [ln for ln in lines if not ln.startswith(noise)]
  reason = " ".join(keep[:2]) or type(error).__name__
  return reason if len(reason) < 600 else reason[:600] + "..."


def _record(op: str, *, seconds: float = 0.0, failed: bool = False, reused: bool = False) -> None:
  with _stats_lock:
    entry = _stats["by_op"].setdefault(op, {"lowered": 0, "failed": 0, "reused": 0, "seconds": 0.0})
    key = "reused" if reused else ("failed" if failed else "lowered")
    for d in (_stats, entry):
      d[key] += 1
      d["seconds"] += seconds


def lowering_stats() -> dict[str, Any]:
  """Counts and time spent lowering nodes through TF since the last reset.

  `lowered`: nodes lowered (one per distinct op, attrs, input shapes and constants);
  `failed`: lowerings that failed (the node fell back or raised); `reused`: nodes served
  from the cache; `seconds`: total time in TF's lowering and module decoding;
  `seconds_per_node`: the mean per lowering; `by_op`: the same counts per op type.
  """
  with _stats_lock:
    out = {k: v for k, v in _stats.items() if k != "by_op"}
    out["by_op"] = {op: dict(v) for op, v in _stats["by_op"].items()}
  done = out["lowered"] + out["failed"]
  out["seconds_per_node"] = out["seconds"] / done if done else 0.0
  return out


def reset_lowering_stats() -> None:
  with _stats_lock:
    _stats.update(lowered=0, failed=0, reused=0, seconds=0.0, by_op={})

