"""`XlaCallModule`: a StableHLO module inside a TF graph (jax2tf's native serialization).

The node's `module` is read once (cached by its bytes) and interpreted into `jax.lax`
inside the caller's trace (`jaxport.convert.stablehlo`), so `jit`, `grad`, `vmap`,
`jvp` and `eval_shape` all work through it. What the op's attributes say:

* `version`: 4 and up (StableHLO with compatibility guarantees); older ones raise at
  conversion.
* `platforms`: the module runs only on these. With several, `@main` takes the index of
  the current JAX backend (CPU, CUDA, ROCM, TPU) as its first argument. A module for
  other platforms only raises `ValueError` when called, unless the config key
  `xlacallmodule_strict_checks` is off at conversion or at the call (as in tf2jax) or
  the module disables the `platform` check; then it runs through the interpreter, with
  the first platform's index.
* `dim_args_spec` (old versions): `"i.j"` feeds dimension `j` of argument `i` as an
  extra leading argument.
* `has_token_input_output` and token arguments/results of `@main`: tokens are
  placeholders, and token results are dropped.
* `function_list`: TF functions the module calls through
  `custom_call @tf.call_tf_function` (jax2tf `call_tf(..., call_tf_graph=True)`); they
  run through jaxport's own converter, inline.
* `Sout`/`Tout`: the results must have these shapes (-1: any) and take these dtypes.
  Shape-polymorphic modules (`?` dims) run at the caller's concrete shapes: the
  dimension sizes `get_dimension_size` reads are NumPy constants, so every shape the
  dynamic ops compute is static, and `custom_call @shape_assertion` checks the
  module's shape constraints when the function is traced (once per input shape, as
  `jit` caches it).

Every op of the module (and of the functions it calls) must have a handler: `check`
raises at conversion time naming the ops, the module and the node.

Gradients: jax2tf's `with_gradient=True` wraps the call in a custom gradient holding
the VJP module; `custom_gradient.apply_to_call` makes it the reverse-mode derivative
(see that module for how forward mode and reverse mode can differ).
"""
from __future__ import annotations

import collections
import dataclasses
import re
import threading

import jax
import numpy as np
from jax import lax

from jaxport import config as _config
from jaxport.convert import custom_gradient
from jaxport.convert.registry import Tier, register
from jaxport.errors import InvalidNodeError, StableHLOError

MIN_VERSION = 4   # StableHLO with compatibility guarantees (03/2023)
_PLATFORM_CHECK = "platform"   # the `disabled_checks` entry that lets any platform run
_STRICT_KEY = "xlacallmodule_strict_checks"


@dataclasses.dataclass(frozen=True)
class LoadedModule:
  """A decoded module and the node attributes that say how to call it."""
  module: object                   # stablehlo.Module
  version: int
  platforms: tuple[str, ...]
  dim_args: tuple[tuple[int, int], ...]
  functions: tuple[str, ...]       # function_list, by called_index
  platform_check: bool


_CACHE_SIZE = 64
_modules: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def _decoded(data):
  """The decoded StableHLO module of `data` (cached: live and restored graphs share modules)."""
  from jaxport.convert import stablehlo
  with _lock:
    found = _modules.get(data)
    if found is not None:
      _modules.move_to_end(data)
      return found
  module = stablehlo.load_module(data)
  with _lock:
    _modules[data] = module
    while len(_modules) > _CACHE_SIZE:
      _modules.popitem(last=False)
  return module


def clear_module_cache() -> None:
  """Forgets every decoded module: the next conversion decodes its modules again, as a new process does."""
  with _lock:
    _modules.clear()


def load(node) -> LoadedModule:
  """The node's module and calling convention (raises `StableHLOError` when it cannot run)."""
  attrs = node.attrs
  version = int(attrs.get("version", 0))
  if version < MIN_VERSION:
    raise StableHLOError(f"XlaCallModule node {node.name!r} has version {version}; jaxport reads versions "
                         f"{MIN_VERSION} and up (StableHLO with compatibility guarantees). Re-export it with "
                         "a newer jax2tf.")
  dim_args = []
  for spec in attrs.get("dim_args_spec") or []:
    m = re.fullmatch(r"(\d+)\.(\d+)", str(spec))
    if not m:
      raise StableHLOError(f"XlaCallModule node {node.name!r}: cannot read dim_args_spec entry {spec!r} "
                           "(expected 'ARG.AXIS')")
    dim_args.append((int(m.group(1)), int(m.group(2))))
  functions = tuple(f.name for f in attrs.get("function_list") or [])
  disabled = {str(c).lower() for c in attrs.get("disabled_checks") or []}
  return LoadedModule(_decoded(attrs["module"]), version, tuple(str(p).upper() for p in attrs.get("platforms") or []),
                      tuple(dim_args), functions, _PLATFORM_CHECK not in disabled)


def check(node) -> None:
  """Conversion-time check: the module loads and the interpreter handles every op in it."""
  from jaxport.convert import stablehlo
  loaded = load(node)
  stablehlo.check_module(loaded.module, where=f"XlaCallModule node {node.name!r}")


def current_platform() -> str:
  """The current JAX backend as XlaCallModule names platforms: CPU, CUDA, ROCM or TPU."""
  backend = jax.default_backend().lower()
  if backend in ("gpu", "cuda", "rocm"):
    version = str(getattr(jax.devices()[0].client, "platform_version", "")).lower()
    return "ROCM" if backend == "rocm" or "rocm" in version else "CUDA"
  return backend.upper()


def _platform_index(ctx, loaded: LoadedModule) -> int:
  if not loaded.platforms:
    return 0
  here = current_platform()
  if here in loaded.platforms:
    return loaded.platforms.index(here)
  if loaded.platform_check and ctx.config.get(_STRICT_KEY, True) and _config.get_config(_STRICT_KEY):
    lowered_for = tuple(p.lower() for p in loaded.platforms)
    raise InvalidNodeError(f"Unsupported backend: `{here.lower()}` not in `{lowered_for}`: "
                           f"XlaCallModule node {ctx.name!r} was lowered for {', '.join(loaded.platforms)} only and "
                           f"this is {here}. To run it through the interpreter anyway, set the config "
                           f"{_STRICT_KEY!r} to False (jaxport.override_config({_STRICT_KEY!r}, False)).")
  return 0


def _leading_args(ctx, loaded: LoadedModule, args: list) -> list:
  """The platform index (for several platforms) and the dimension arguments (dim_args_spec)."""
  main = loaded.module.main
  lead = []
  index = _platform_index(ctx, loaded)
  if len(loaded.platforms) > 1:
    lead.append(np.asarray(index, np.int32))
  for i, axis in loaded.dim_args:
    dtype = main.block.arg_types[len(lead)].dtype
    lead.append(np.asarray(np.shape(args[i])[axis], dtype))
  return lead


class _ModuleCall:
  """One call of a module: what `custom_call @tf.call_tf_function` reaches (see stablehlo/custom_call.py)."""

  def __init__(self, runtime, functions: tuple[str, ...], node_name: str):
    self.runtime, self.functions, self.node_name = runtime, functions, node_name

  def call_tf_function(self, index: int, args: list) -> list:
    if not 0 <= index < len(self.functions):
      raise StableHLOError(f"XlaCallModule node {self.node_name!r} calls TF function #{index} but its "
                           f"function_list has {len(self.functions)}")
    return self.runtime.call(self.functions[index], args)


def _interpret(ctx, loaded: LoadedModule, lead: list, args: list) -> list:
  from jaxport.convert.stablehlo import interpreter
  from jaxport.convert.stablehlo.module import TOKEN
  interpreter.handled_ops()   # loads every handler family
  main = loaded.module.main
  values = iter(lead + list(args))
  token = np.zeros((0,), np.bool_)   # what stablehlo.create_token gives
  try:
    operands = [token if t.dtype == TOKEN else next(values) for t in main.block.arg_types]
  except StopIteration:
    operands = None
  if operands is None or next(values, None) is not None:
    raise StableHLOError(f"XlaCallModule node {ctx.name!r}: module {loaded.module.name!r} takes "
                         f"{len(main.block.arg_types)} arguments (tokens, platform index and dimension arguments "
                         f"included), but the node gives {len(args)} and {len(lead)} leading ones")
  call = interpreter.Call(loaded.module, None, f"{loaded.module.name} (XlaCallModule node {ctx.name!r})",
                          call_tf_function=_ModuleCall(ctx.runtime, loaded.functions, ctx.name).call_tf_function)
  outs = interpreter.narrowed(call.call_function("main", operands))
  return [o for o, t in zip(outs, main.result_types) if t.dtype != TOKEN]


def _check_results(ctx, loaded: LoadedModule, outs: list) -> list:
  """The results in the node's `Tout` dtypes, after checking them against `Sout`."""
  shapes, dtypes = ctx.attr("Sout", None) or [], ctx.attr("Tout")
  if len(outs) != len(dtypes):
    raise StableHLOError(f"XlaCallModule node {ctx.name!r}: module {loaded.module.name!r} returns {len(outs)} "
                         f"results, the node declares {len(dtypes)}")
  fixed = []
  for k, (x, dtype) in enumerate(zip(outs, dtypes)):
    want = shapes[k] if k < len(shapes) else None
    got = tuple(np.shape(x))
    if want is not None and (len(want) != len(got) or any(w is not None and w != g for w, g in zip(want, got))):
      raise StableHLOError(f"XlaCallModule node {ctx.name!r}: result {k} of module {loaded.module.name!r} has "
                           f"shape {got}, the node declares {tuple(-1 if w is None else w for w in want)}")
    if np.dtype(x.dtype) != np.dtype(dtype):
      if isinstance(x, (np.ndarray, np.generic)):
        x = np.asarray(x).astype(dtype)
      else:
        x = lax.convert_element_type(x, jax.dtypes.canonicalize_dtype(dtype))
    fixed.append(x)
  return fixed


# Structural: it calls library functions and carries jax2tf's gradient, so `force_tier` leaves it here.
@register("XlaCallModule", tier=Tier.STABLEHLO, structural=True, check=check)
def xla_call_module(ctx, *inputs):
  loaded = load(ctx.node)
  n_args = len(ctx.attr("Tin"))
  args, fed = list(inputs[:n_args]), list(inputs[n_args:])   # fed: captures of a custom gradient
  lead = _leading_args(ctx, loaded, args)

  def forward(args):
    return _check_results(ctx, loaded, _interpret(ctx, loaded, lead, args))

  custom = ctx.runtime.custom_gradients.get(id(ctx.node))
  if custom is None:
    return forward(args)
  return custom_gradient.apply_to_call(custom, ctx.runtime, forward, args, fed)
