"""The one registry of op rules: `@register("OpName", ...)` on a function.

A rule is called as `rule(ctx, *inputs)` where `ctx` is an `OpContext` (node
attributes, name, runtime) and `inputs` are the node's data inputs. It returns a
single value or a tuple/list with one entry per node output.
"""
from __future__ import annotations

from typing import Callable

_RULES: dict[str, Callable] = {}


def register(*op_types: str):
  def decorator(fn: Callable) -> Callable:
    for op in op_types:
      if op in _RULES:
        raise ValueError(f"op {op!r} already has a rule: {_RULES[op].__module__}.{_RULES[op].__name__}")
      _RULES[op] = fn
    return fn
  return decorator


def get_rule(op_type: str) -> Callable | None:
  _load_rules()
  return _RULES.get(op_type)


def supported_ops() -> frozenset[str]:
  _load_rules()
  return frozenset(_RULES)


_loaded = False


def _load_rules() -> None:
  global _loaded
  if not _loaded:
    from jaxport.convert import ops  # noqa: F401  (registers every family)
    _loaded = True
