"""Interprets a decoded StableHLO module op by op into `jax.lax`, inside the caller's trace.

Handlers are registered per op name with `@handler("stablehlo.add")` in the family
modules beside this one, and called as `fn(ctx, *operands)`; they return one value
or a list with one entry per result. Operands that are NumPy arrays are trace-time
constants: handlers keep them NumPy where they can, so shapes and trip counts stay
static under `jit`. Regions see the values of the regions around them.

64-bit values are computed in 64 bits whatever the caller's `jax_enable_x64`: an op with a 64-bit result
type or a 64-bit traced operand runs in JAX's scoped x64 mode. A module that JAX exported without x64
holds such types only where its code asked for them in a scope (jaxport's Philox runs in uint64, TF's
stateless random in ui64 states); narrowing them to 32 bits changed the numbers. A module's results come
back in the caller's dtypes (`narrowed`).
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import jax
import numpy as np

from jaxport import config
from jaxport.convert.ops._util import has_symbolic
from jaxport.convert.stablehlo.module import Block, Module, Op, TensorType
from jaxport.errors import StableHLOError

_HANDLERS: dict[str, Callable] = {}


def handler(*names: str):
  """Registers `fn(ctx, *operands)` for the StableHLO (or chlo/func) op `names`."""
  def decorator(fn):
    for name in names:
      if name in _HANDLERS:
        raise ValueError(f"StableHLO op {name!r} already has a handler")
      _HANDLERS[name] = fn
    return fn
  return decorator


def handler_for(name: str) -> Callable | None:
  """The handler registered for op `name`, if any."""
  return _HANDLERS.get(name)


def handled_ops() -> frozenset[str]:
  _load()
  return frozenset(_HANDLERS)


class Env:
  """Values of one region, falling back to the regions that enclose it."""
  __slots__ = ("values", "parent")

  def __init__(self, parent: "Env | None" = None):
    self.values: dict[int, Any] = {}
    self.parent = parent

  def __getitem__(self, key: int):
    env = self
    while env is not None:
      if key in env.values:
        return env.values[key]
      env = env.parent
    raise StableHLOError(f"StableHLO value %{key} is used before it is defined")


class Call:
  """One interpretation of a module: its functions, the rng key, where it runs."""

  def __init__(self, module: Module, rng=None, name: str = "", call_tf_function: Callable | None = None):
    self.module = module
    self.rng = rng
    self.name = name or module.name
    self.call_tf_function = call_tf_function   # (index, args) -> results, for custom_call @tf.call_tf_function
    self._rng_count = 0

  def next_rng(self):
    """A fresh key for keyless random ops (`stablehlo.rng`)."""
    if self.rng is None:
      from jaxport.errors import MissingInputError
      raise MissingInputError(f"StableHLO module {self.name!r} draws random numbers: "
                              "call the converted function with rng=jax.random.key(...)")
    import jax
    self._rng_count += 1
    return jax.random.fold_in(self.rng, self._rng_count)

  def call_function(self, name: str, args: Sequence[Any]) -> list:
    fn = self.module.functions.get(name)
    if fn is None:
      raise StableHLOError(f"StableHLO module {self.name!r} calls @{name}, which it does not define")
    return run_block(fn.block, list(args), self, None)


class OpContext:
  """What a handler sees of its op."""
  __slots__ = ("op", "call", "env")

  def __init__(self, op: Op, call: Call, env: Env):
    self.op, self.call, self.env = op, call, env

  @property
  def attrs(self) -> dict[str, Any]:
    return self.op.attrs

  def attr(self, key: str, default: Any = ...):
    value = self.op.attrs.get(key, default)
    if value is ...:
      raise StableHLOError(f"{self.op.name} in module {self.call.name!r} has no attribute {key!r}")
    return value

  @property
  def result_types(self) -> list[TensorType]:
    return self.op.result_types

  @property
  def result_type(self) -> TensorType:
    return self.op.result_types[0]

  def region(self, index: int) -> Callable[..., list]:
    """Region `index` as a function of its block arguments, returning its results."""
    block = self.op.regions[index]
    return lambda *args: run_block(block, list(args), self.call, self.env)

  def region_block(self, index: int) -> Block:
    return self.op.regions[index]


def run_block(block: Block, args: list, call: Call, parent: Env | None) -> list:
  if len(args) != len(block.args):
    raise StableHLOError(f"a block of module {call.name!r} takes {len(block.args)} arguments, got {len(args)}")
  from jaxport.convert.stablehlo.regions import block_regions, run_region
  env = Env(parent)
  env.values.update(zip(block.args, args))
  regions, in_regions = block_regions(block, call.module)
  run = lambda op, env_: _run_op(op, env_, call)
  for op in block.ops:
    for region in regions.get(id(op), ()):
      run_region(region, env, run)
    if id(op) not in in_regions:
      run(op, env)
  return [env[v] for v in block.returns]


def _run_op(op: Op, env: Env, call: Call) -> None:
  fn = _HANDLERS.get(op.name)
  if fn is None:
    raise StableHLOError(f"StableHLO op {op.name} (in module {call.name!r}) cannot be interpreted; "
                         "please report it with the module")
  rewrite = getattr(op, "rewrite", None)   # set by patterns.annotate: the op runs as one lax primitive
  if rewrite is not None and not all(isinstance(env[v], (np.ndarray, np.generic)) for v in rewrite[1]):
    fn, operands = (lambda ctx, *xs: rewrite[0](*xs)), [env[v] for v in rewrite[1]]
  else:
    operands = [env[v] for v in op.operands]
  if operands and all(isinstance(x, (np.ndarray, np.generic)) for x in operands) and _too_big(op):
    from jaxport.convert.stablehlo.elementwise import staged
    operands = [staged(x) for x in operands]   # computed by XLA where it runs, not folded into a constant
  try:
    if _is_wide(op, operands):
      outer, _scope.active = getattr(_scope, "active", False), True
      try:
        with jax.enable_x64(True):
          out = fn(OpContext(op, call, env), *operands)
      finally:
        _scope.active = outer
    else:
      out = fn(OpContext(op, call, env), *operands)
  except StableHLOError:
    raise
  except Exception as e:
    if not getattr(e, "_jaxport_noted", False):
      e.add_note(f"while interpreting {op.name} in StableHLO module {call.name!r}")
      e._jaxport_noted = True
    raise
  if len(op.results) == 1 and not isinstance(out, list):
    out = [out]
  out = list(out)
  if len(out) != len(op.results):
    raise StableHLOError(f"{op.name} handler gave {len(out)} results, expected {len(op.results)}")
  for vid, value, rtype in zip(op.results, out, op.result_types):
    env.values[vid] = _as_result(value, rtype)


_scope = threading.local()   # .active: a 64-bit op's handler runs, in scoped x64 mode


def caller_x64() -> bool:
  """The caller's `jax_enable_x64`, also while a 64-bit op runs in scoped x64 mode."""
  return bool(jax.config.jax_enable_x64) and not getattr(_scope, "active", False)


def _is_wide_dtype(dtype) -> bool:
  return isinstance(dtype, np.dtype) and dtype.itemsize == 8 and dtype.kind in "iuf" or dtype == np.complex128


def _is_wide(op: Op, operands: list) -> bool:
  """Whether `op` must run in scoped x64 mode: x64 is off and it makes or reads 64-bit arrays."""
  if jax.config.jax_enable_x64:
    return False
  wide = getattr(op, "_jaxport_wide", None)
  if wide is None:
    wide = op._jaxport_wide = any(_is_wide_dtype(t.dtype) for t in op.result_types)
  return wide or any(map(_is_wide_array, operands))


def _is_wide_array(x) -> bool:
  """A 64-bit JAX array (NumPy constants keep their dtype; `canon` narrows them where they are used)."""
  return not isinstance(x, (np.ndarray, np.generic)) and _is_wide_dtype(getattr(x, "dtype", None))


def narrowed(values: list) -> list:
  """A module's results in the caller's dtypes: 64-bit arrays made in scoped x64 mode narrowed as JAX narrows."""
  if jax.config.jax_enable_x64:
    return list(values)
  return [jax.lax.convert_element_type(x, jax.dtypes.canonicalize_dtype(x.dtype)) if _is_wide_array(x) else x
          for x in values]


def _too_big(op: Op) -> bool:
  """Whether `op`'s results, computed from constants, would exceed the `max_constant_bytes` limit."""
  size = 0
  for t in op.result_types:
    if isinstance(t.dtype, str) or not t.is_static:
      return False
    size += int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize
  return size > config.max_constant_bytes()


def _as_result(value, rtype: TensorType):
  """NumPy results take the op's result dtype exactly (NumPy's promotion rules differ)."""
  if isinstance(value, (np.ndarray, np.generic)) and not isinstance(rtype.dtype, str):
    if has_symbolic(value):   # dimension expressions (a shape_value) stay symbolic
      return value
    if value.dtype != rtype.dtype:
      return np.asarray(value).astype(rtype.dtype)
    return np.asarray(value)
  return value


def unsupported_ops(module: Module) -> dict[str, int]:
  """Op names (and custom_call targets) of `module` no handler takes, with their counts."""
  _load()
  from jaxport.convert.stablehlo.custom_call import handled_targets
  missing: dict[str, int] = {}
  def walk(block: Block):
    for op in block.ops:
      name = op.name
      if name == "stablehlo.custom_call":
        target = op.attrs.get("call_target_name", "")
        if target not in handled_targets():
          name = f"stablehlo.custom_call @{target}"
        else:
          name = None
      elif name in _HANDLERS:
        name = None
      if name:
        missing[name] = missing.get(name, 0) + 1
      for region in op.regions:
        walk(region)
  for fn in module.functions.values():
    walk(fn.block)
  return missing


def check_module(module: Module, where: str = "") -> None:
  """Raises `StableHLOError` listing every op of `module` that cannot be interpreted."""
  missing = unsupported_ops(module)
  if missing:
    listed = ", ".join(f"{name} ({n}x)" for name, n in sorted(missing.items()))
    raise StableHLOError(f"StableHLO module {module.name!r}{' in ' + where if where else ''} uses ops jaxport "
                         f"cannot interpret: {listed}. Please report them with the module.")


def call_module(module: Module, args: Sequence[Any], rng=None, name: str = "") -> list:
  """Interprets `module`'s @main on `args` inside the current JAX trace."""
  _load()
  main = module.main
  if len(args) != len(main.block.args):
    raise StableHLOError(f"StableHLO module {module.name!r} takes {len(main.block.args)} arguments, "
                         f"got {len(args)}")
  return narrowed(Call(module, rng, name).call_function("main", args))


_loaded = False


def _load() -> None:
  global _loaded
  if not _loaded:
    _loaded = True
    from jaxport.convert.stablehlo import families  # noqa: F401  (registers every handler)
