"""JAX functions exported with jax.export and run back through the StableHLO interpreter."""
import jax

from jaxport.convert import stablehlo


def exported(f, *args, platforms=("cpu",)):
  """(the decoded module, the jax.export.Exported) of `jax.jit(f)` at `args`; every op must have a handler."""
  exp = jax.export.export(jax.jit(f), platforms=list(platforms))(*args)
  module = stablehlo.load_module(exp.mlir_module_serialized)
  missing = stablehlo.unsupported_ops(module)
  assert not missing, missing
  return module, exp


def as_fn(module):
  """The interpreted module as a function: its one result, or a tuple of them."""
  def g(*a):
    out = stablehlo.call_module(module, list(a))
    return out[0] if len(out) == 1 else tuple(out)
  return g
