"""The StableHLO tier: StableHLO modules interpreted op by op into `jax.lax`.

`load_module` reads a module (VHLO portable artifact, MLIR bytecode or text) once into
plain Python; `call_module` interprets its `@main` inside the caller's JAX trace, so
`jit`, `grad`, `vmap`, `jvp` and `eval_shape` all work through it.
"""
from jaxport.convert.stablehlo.interpreter import call_module, check_module, handled_ops, unsupported_ops
from jaxport.convert.stablehlo.module import Module, TensorType, load_module

__all__ = ["Module", "TensorType", "call_module", "check_module", "handled_ops", "load_module",
           "unsupported_ops"]
