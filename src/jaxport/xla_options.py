"""XLA compiler options jaxport picks per converted function, and `jaxport.jit`, which applies them.

XLA:CPU (jaxlib 0.10) hands convolutions, dots and their neighbours to YNNPACK. On conv nets that
loses: it outlines whole networks into one fusion, ~10x slower than its parts when it holds
convolutions and then large dots (see `fusion_boundary`), and its convolutions and
GEMMs leave one of two cores idle (InceptionV3 0.50 s vs 0.37 s, DenseNet121 0.26 vs 0.21 s).
On small recurrent matmuls it wins (an LSTM: 9.6 ms vs 16 ms without it). So a converted graph
with convolutions compiles with YNNPACK off (`CONV_NET_CPU_OPTIONS`); anything else keeps XLA's
defaults. Measurements: benchmarks/README.md.

The options are per computation (`jax.jit(..., compiler_options=...)`), so they change nothing
else in the process. For a conv net's inference jitted elsewhere (a Flax loop), use
`jit_with_options(fn, CONV_NET_CPU_OPTIONS)`, or set the flag for the whole process
before JAX starts: `XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type="` (`xla_flags_line()`). Not
for training steps: their backward convs and GEMMs run 1.6-1.9x faster with YNNPACK on.
Other backends ignore `xla_cpu_*` options.

Under a plain `jax.jit` (XLA's defaults) the converted graph itself keeps the worst case away:
`fusion_boundary` in front of each dense layer stops YNNPACK from outlining a conv trunk together
with the dense layers after it (VGG16, batch 2: 0.88 s -> 0.34 s, as fast as with YNNPACK off), and
most convs compute their values in a form YNNPACK refuses (`conv_lowering.base_dilation_pays`). Those
choices depend on the options, so `jit_with_options` traces with `compiling_without_ynn()` true
where they turn YNNPACK off.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Measured per model in benchmarks/convert_bench.py (see benchmarks/README.md, "YNNPACK on XLA:CPU").
CONV_NET_CPU_OPTIONS: dict[str, Any] = {"xla_cpu_experimental_ynn_fusion_type": ""}


@functools.lru_cache(maxsize=None)
def _accepted(options: tuple[tuple[str, Any], ...]) -> bool:
  """Whether this jaxlib's compiler knows every option (a later jaxlib may rename them)."""
  try:
    jax.jit(lambda x: x + 1).lower(1.0).compile(compiler_options=dict(options))
  except Exception as e:   # XlaRuntimeError "No such compile option" / invalid enum value
    warnings.warn(f"jaxport: this jaxlib refuses the tuned XLA options {dict(options)} ({str(e)[:200]}); "
                  "compiling with XLA's defaults.", RuntimeWarning, stacklevel=3)
    return False
  return True


def _is_conv_net(fun: Callable) -> bool:
  """Whether `fun` is a converted function or loaded artifact (or one of their call forms) with convolutions."""
  from jaxport.call_forms import CallForms
  owner = getattr(fun, "__self__", fun)   # f.outputs_only, f.with_changed_params
  return isinstance(owner, CallForms) and owner.has_convolutions


def compiler_options(fun: Callable | None = None) -> dict[str, Any]:
  """The options `jaxport.jit(fun)` adds: `CONV_NET_CPU_OPTIONS` for a converted function with
  convolutions, {} for anything else (XLA's defaults) or where this jaxlib refuses the options."""
  if fun is None or not _is_conv_net(fun):
    return {}
  return dict(CONV_NET_CPU_OPTIONS) if _accepted(tuple(sorted(CONV_NET_CPU_OPTIONS.items()))) else {}


def xla_flags_line(options: dict[str, Any] | None = None) -> str:
  """`options` (default `CONV_NET_CPU_OPTIONS`) as an `XLA_FLAGS` value, to set them process-wide
  before JAX starts."""
  return " ".join(f"--{key}={value}" for key, value in (options or CONV_NET_CPU_OPTIONS).items())


def jit(fun: Callable, /, **jit_kwargs) -> Callable:
  """`jax.jit(fun, **jit_kwargs)` with the XLA options measured fastest for `fun`.

  A converted function or loaded artifact (or `f.outputs_only`, `f.with_changed_params`,
  `f.returning(...)`) whose graph has convolutions compiles with `CONV_NET_CPU_OPTIONS`; anything else with XLA's defaults.
  Options the caller passes in `compiler_options` win over jaxport's.
  """
  options = {**compiler_options(fun), **(jit_kwargs.pop("compiler_options", None) or {})}
  return jit_with_options(fun, options, **jit_kwargs)


_COMPILING_WITHOUT_YNN = contextvars.ContextVar("jaxport_compiling_without_ynn", default=False)


def compiling_without_ynn() -> bool:
  """Whether the trace in progress is for a computation compiled with YNNPACK off (`jit_with_options`):
  the converter's lowerings then pick what XLA's own kernels run fastest, not what YNNPACK does."""
  return _COMPILING_WITHOUT_YNN.get()


def jit_with_options(fun: Callable, options: dict[str, Any], /, **jit_kwargs) -> Callable:
  """`jax.jit(fun, compiler_options=options)`; where the options turn YNNPACK off, `fun` traces with
  `compiling_without_ynn()` true."""
  if options.get("xla_cpu_experimental_ynn_fusion_type") == "":
    fun = _traced_without_ynn(fun)
  return jax.jit(fun, compiler_options=options or None, **jit_kwargs)


@contextlib.contextmanager
def tracing_without_ynn():
  """Traces in this block pick the lowerings for a computation compiled with YNNPACK off."""
  token = _COMPILING_WITHOUT_YNN.set(True)
  try:
    yield
  finally:
    _COMPILING_WITHOUT_YNN.reset(token)


def _traced_without_ynn(fun: Callable) -> Callable:
  @functools.wraps(fun, updated=())
  def traced(*args, **kwargs):
    with tracing_without_ynn():
      return fun(*args, **kwargs)
  return traced


_BOUNDARY_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def fusion_boundary(x):
  """`x` unchanged, behind an op XLA:CPU's YNNPACK fusions cannot absorb (identity elsewhere).

  One YNNPACK fusion holding convolutions and then two or more large dots runs ~10x slower than
  its parts (VGG16's last conv block + fc1 + fc2, batch 2: 0.62 s vs 0.05 s). `reduce_precision`
  to the dtype's own exponent and mantissa widths is exact, survives XLA's simplifier, and
  YNNPACK does not take it, so the fusion stops there; XLA's own loop fusions absorb it.
  Other dtypes and concrete (NumPy) inputs pass through.
  """
  if isinstance(x, (np.ndarray, np.generic)) or jnp.dtype(x.dtype) not in _BOUNDARY_DTYPES:
    return x
  info = jnp.finfo(x.dtype)
  return lax.platform_dependent(x, cpu=lambda v: lax.reduce_precision(v, info.nexp, info.nmant), default=lambda v: v)
