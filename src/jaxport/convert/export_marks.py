"""Rules whose derivative `jax.export` loses, marked so that a loaded artifact differentiates like the
converted function.

`jax.export` writes values only: `lax.stop_gradient` becomes nothing (x * stop_gradient(x) would get the
gradient 2x, not x) and a `custom_jvp` rule becomes its primal ops (Relu6's TF gradient at 0 and 6,
Maximum's tie; a ReLU needs no mark: the interpreter reads max(x, 0) as one). While `jaxport.export`
traces, each marked rule runs as a named inner `jax.jit`, which the module keeps as a private function
`@jaxport_mark__<name>`; the interpreter runs a call to it as the rule itself. A `@tf.custom_gradient`
boundary (and jax2tf's recorded VJP) is kept the same way, with its gradient function (`CUSTOM_GRADIENT`
below). Outside an export the rule runs as written, with no call in the way. A rule with static arguments
(a crop size, a segment count) carries them in the function's name (`marked(..., static=True)`).
"""
from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
from typing import Callable

import jax

PREFIX = "jaxport_mark__"
_RULES: dict[str, Callable] = {}
_state = threading.local()


@contextlib.contextmanager
def exporting():
  """Within it, marked rules trace as named calls that `jax.export` keeps."""
  _state.depth = getattr(_state, "depth", 0) + 1
  try:
    yield
  finally:
    _state.depth -= 1


def exporting_now() -> bool:
  return bool(getattr(_state, "depth", 0))


def _any_traced(arrays) -> bool:
  return any(isinstance(a, jax.core.Tracer) for a in arrays)


def active(*arrays) -> bool:
  """Whether `jaxport.export` is tracing and some of `arrays` are traced (constants need no mark)."""
  return exporting_now() and _any_traced(arrays)


def named_jit(name: str, fn: Callable) -> Callable:
  """`jax.jit(fn)`, lowered as a private function named `name` (JAX appends `_<n>` per signature)."""
  def named(*args):
    return fn(*args)
  named.__name__ = named.__qualname__ = name
  return jax.jit(named)


def marked(name: str, static: bool = False, reader: Callable | None = None) -> Callable[[Callable], Callable]:
  """Registers `fn(*arrays)` under `name` and returns it marked for export. With `static`, the rule is
  `fn(*arrays, **static_args)`: ints, floats, strings and lists of them, written into the function's name.
  A loaded artifact runs `reader` (same arguments; default `fn`) where the module calls the mark."""
  if not re.fullmatch(r"[a-z][a-z0-9_]*[a-z]", name) or name in _RULES:
    raise ValueError(f"mark name {name!r} is taken or is not lower_snake_case ending in a letter")

  def mark(fn: Callable) -> Callable:
    _RULES[name] = reader or fn
    calls: dict[str, Callable] = {}
    inlined: dict[str, Callable] = {}

    @functools.wraps(fn)
    def rule(*args, **static_args):
      # Constants stay constants (a stop_gradient of a shape must stay static); they have no derivative.
      if not _any_traced(args):
        return fn(*args, **static_args)
      key = _encoded(static_args) if static else ""
      if not exporting_now():
        # Outside an export, an inlined jit: the same ops, traced once per shape (a custom_jvp costs
        # ~0.4 ms to trace per call).
        if key not in inlined:
          inlined[key] = jax.jit(functools.partial(fn, **static_args), inline=True)
        return inlined[key](*args)
      if key not in calls:
        calls[key] = named_jit(PREFIX + name + key, functools.partial(fn, **static_args))
      return calls[key](*args)
    return rule
  return mark


_STATIC = "__static_"   # then the static arguments' JSON in hex, then `_x` (JAX may append `_<n>` after it)
_STATIC_NAME = re.compile(r"(?P<rule>[a-z0-9_]+?)(?:__static_(?P<hex>[0-9a-f]+)_x)?(?:_\d+)?")


def _encoded(static_args: dict) -> str:
  return _STATIC + json.dumps(static_args, sort_keys=True, separators=(",", ":")).encode().hex() + "_x"


# A `@tf.custom_gradient` boundary (`custom_gradient.differentiable`) is exported as a call to
# `CUSTOM_GRADIENT` + `v<values>_r<residuals>_o<outputs>_i<inner residuals>`, whose body calls the forward
# (`CUSTOM_GRADIENT_FORWARD`: values -> outputs, inner residuals) and, kept by an optimization barrier, the
# recorded gradient (`CUSTOM_GRADIENT_BACKWARD`: residuals, inner residuals, one cotangent per output ->
# one gradient per float value).
CUSTOM_GRADIENT = PREFIX + "custom_gradient__"
CUSTOM_GRADIENT_FORWARD = "jaxport_custom_gradient_forward"
CUSTOM_GRADIENT_BACKWARD = "jaxport_custom_gradient_backward"
_COUNTS = re.compile(r"v(\d+)_r(\d+)_o(\d+)_i(\d+)(?:_\d+)?")


def custom_gradient_name(values: int, residuals: int, outputs: int, inner: int) -> str:
  return f"{CUSTOM_GRADIENT}v{values}_r{residuals}_o{outputs}_i{inner}"


def custom_gradient_counts(function_name: str) -> tuple[int, int, int, int] | None:
  """(values, residuals, outputs, inner residuals) of an exported custom-gradient boundary, or None."""
  if not function_name.startswith(CUSTOM_GRADIENT):
    return None
  m = _COUNTS.fullmatch(function_name[len(CUSTOM_GRADIENT):])
  return tuple(int(g) for g in m.groups()) if m else None


def rule_for(function_name: str) -> Callable | None:
  """The rule a module's private function stands for (with its static arguments bound), or None."""
  if not function_name.startswith(PREFIX):
    return None
  import jaxport.convert.ops  # noqa: F401  pylint: disable=import-outside-toplevel - registers the rules
  m = _STATIC_NAME.fullmatch(function_name[len(PREFIX):])
  fn = _RULES.get(m.group("rule")) if m else None
  if fn is None or not m.group("hex"):
    return fn
  return functools.partial(fn, **json.loads(bytes.fromhex(m.group("hex")).decode()))


stop_gradient = marked("stop_gradient")(jax.lax.stop_gradient)
