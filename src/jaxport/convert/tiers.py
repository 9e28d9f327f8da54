"""Which tier converts an op: native rule → TF's XLA lowering (StableHLO) → host callback.

`op_tier` classifies an op type at conversion time, before anything runs (the
unsupported-op check and `jaxport inspect` use it); `node_rule` gives the rule the
interpreter calls for one node. Config keys steer it:

* `allow_xla_lowering` (default True): ops without a native rule may use TF's XLA lowering;
* `allow_host_callback` (default True): ops left over may run in TF through a host callback;
* `force_tier` (default None): "stablehlo" or "callback" sends every op that tier can
  take through it even when a native rule exists (to compare tiers or work around a rule).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from jaxport.convert.registry import OpRule, Tier, get_rule

# Ops the graph machinery handles itself; never classified as a model op.
GRAPH_INPUT_OPS = frozenset({"Placeholder", "_Arg"})


@functools.lru_cache(maxsize=None)
def _kernel_devices(op_type: str) -> frozenset[str]:
  """The device types TF registers kernels for `op_type` on (empty when TF does not know it)."""
  from jaxport.convert import _tf_compat
  _tf_compat.register_xla_kernels()   # TF registers its XLA kernels lazily
  return _tf_compat.kernel_devices(op_type)


def has_xla_kernel(op_type: str) -> bool:
  """TF can lower `op_type` to XLA (it has an XLA_CPU_JIT kernel)."""
  return "XLA_CPU_JIT" in _kernel_devices(op_type)


def has_host_kernel(op_type: str) -> bool:
  """TF can run `op_type` eagerly on the CPU."""
  return "CPU" in _kernel_devices(op_type) or "DEFAULT" in _kernel_devices(op_type)


@functools.lru_cache(maxsize=None)
def _takes_handles(op_type: str) -> bool:
  from jaxport.convert import _tf_compat
  return _tf_compat.takes_handles(op_type)


def _forceable(rule: OpRule | None) -> bool:
  return rule is None or not (rule.structural or rule.stateful)


def op_tier(op_type: str, config: Mapping[str, Any]) -> Tier:
  """The tier that converts `op_type` under `config`."""
  rule = get_rule(op_type)
  forced = config.get("force_tier")
  if forced and _forceable(rule):
    if forced == Tier.STABLEHLO and has_xla_kernel(op_type):
      return Tier.STABLEHLO
    if forced == Tier.CALLBACK and has_host_kernel(op_type):
      return Tier.CALLBACK
  if rule is not None:
    return rule.tier
  if _takes_handles(op_type):   # resource or variant operands: only a native rule can take them
    return Tier.UNSUPPORTED
  if config.get("allow_xla_lowering", True) and has_xla_kernel(op_type):
    return Tier.STABLEHLO
  if config.get("allow_host_callback", True) and has_host_kernel(op_type):
    return Tier.CALLBACK
  return Tier.UNSUPPORTED


def host_tier(op_type: str, config: Mapping[str, Any]) -> Tier:
  """The tier of a node its op's native rule hands to the host (`register(host_nodes=...)`)."""
  if config.get("allow_host_callback", True) and has_host_kernel(op_type):
    return Tier.CALLBACK
  return Tier.UNSUPPORTED


def node_rule(op_type: str, config: Mapping[str, Any]) -> Callable | None:
  """The rule `fn(ctx, *inputs)` for nodes of `op_type`, or None when no tier takes it."""
  tier = op_tier(op_type, config)
  rule = get_rule(op_type)
  if tier == Tier.STABLEHLO and (rule is None or rule.tier != Tier.STABLEHLO):
    from jaxport.convert import xla_lowering
    return xla_lowering.lowered_rule
  if tier == Tier.CALLBACK:
    from jaxport.convert import host_callback
    return host_callback.callback_rule
  return rule.fn if rule is not None else None
