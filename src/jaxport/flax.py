"""Converted functions as Flax NNX modules: `pip install 'jaxport[flax]'`.

`ConvertedModule(jax_fn, params, rngs=...)` holds the parameters of a converted function as NNX
variables, so a converted backbone composes with Flax layers, `nnx.jit`, `nnx.grad` and
`nnx.Optimizer(model, tx, wrt=nnx.Param)`:

- trainable parameters (`jax_fn.trainable[key]`) become `nnx.Param`; the others (BatchNorm moving
  statistics, Keras 3's dropout seed state) become `nnx.BatchStat`, which an optimizer over
  `nnx.Param` leaves alone;
- they live in one dict attribute, `module.variables`, under their jaxport keys unchanged
  (`module.variables["sequential/conv/kernel"]`). Keys keep their `/`: NNX state paths read
  `(..., "variables", "sequential/conv/kernel")`, one path element per parameter, so every key maps
  back to `params` exactly, with no renaming and no clash with the module's own attributes;
- calling the module runs `jax_fn` on the variables' values and writes `new_params` back into them
  (the BatchNorm statistics of a function converted in training mode);
- a function with random ops (`jax_fn.requires_rng`, e.g. dropout) draws its key from the `rngs`
  given at construction (stream `"dropout"`, else `"default"`), or from `rng=` at the call.

A converted function is fixed to one mode: convert `lambda t: model(t, training=True)` for training
and pass the inference conversion as `eval_fn`; `module.eval()` / `module.train()` (NNX's
`deterministic` attribute) then pick between them.
"""
from __future__ import annotations

from typing import Any

try:
  from flax import nnx
except ImportError as e:
  raise ImportError("jaxport.flax needs Flax NNX: pip install 'jaxport[flax]'") from e
import jax.numpy as jnp

from jaxport.convert import ConvertedFunction
from jaxport.errors import MissingInputError

__all__ = ["ConvertedModule"]


class ConvertedModule(nnx.Module):
  """An `nnx.Module` around `jax_fn(params, *args, rng=None, **kwargs) -> (outputs, new_params)`.

  Args:
    jax_fn: a function returned by `jaxport.convert`.
    params: its parameters (the `params` returned with it, or fine-tuned values with the same keys).
    eval_fn: optional conversion of the same model in inference mode; its parameter keys must be
      among `jax_fn`'s. Used when `deterministic` is True (after `module.eval()`).
    rngs: where keys for random ops come from; needed when `jax_fn.requires_rng`, unless each call
      passes `rng=`.
    rng_stream: the `nnx.Rngs` stream to draw from (falls back to `"default"`).

  Attributes:
    variables: dict of jaxport key -> `nnx.Param` (trainable) or `nnx.BatchStat` (the others).
    deterministic: with `eval_fn`, selects it; set by `module.eval()` and `module.train()`.
  """

  def __init__(self, jax_fn: ConvertedFunction, params: dict[str, Any], *,
               eval_fn: ConvertedFunction | None = None, rngs: nnx.Rngs | nnx.RngStream | None = None,
               rng_stream: str = "dropout"):
    missing = [k for k in jax_fn.param_keys if k not in params]
    if missing:
      raise MissingInputError(f"params is missing {len(missing)} parameter(s) of jax_fn: {', '.join(missing)}. "
                              "Pass the params returned by jaxport.convert with it.")
    if eval_fn is not None:
      extra = [k for k in eval_fn.param_keys if k not in jax_fn.param_keys]
      if extra:
        raise ValueError(f"eval_fn uses parameter(s) that jax_fn does not: {', '.join(extra)}. "
                         "Convert both functions from the same model.")
    self.jax_fn = jax_fn
    self.eval_fn = eval_fn
    self.deterministic = False
    self.variables = nnx.data({
        key: (nnx.Param if jax_fn.trainable[key] else nnx.BatchStat)(jnp.asarray(params[key]))
        for key in jax_fn.param_keys})
    if isinstance(rngs, nnx.Rngs):
      self.rngs = rngs[rng_stream].fork()
    elif isinstance(rngs, nnx.RngStream):
      self.rngs = rngs.fork()
    elif rngs is None:
      self.rngs = nnx.data(None)
    else:
      raise TypeError(f"rngs must be an nnx.Rngs, an nnx.RngStream or None, got {type(rngs).__name__}")

  def __call__(self, *args, rng=None, **kwargs):
    """Runs the converted function on the variables' values and returns its outputs.

    `new_params` is written back into the variables. `rng` overrides the key drawn from `rngs`.
    """
    fn = self.eval_fn if self.deterministic and self.eval_fn is not None else self.jax_fn
    params = {key: self.variables[key].get_value() for key in fn.param_keys}
    if fn.requires_rng and rng is None:
      if self.rngs is None:
        raise MissingInputError("this converted function uses random ops (e.g. dropout) and needs keys: "
                                "pass rngs=nnx.Rngs(dropout=seed) to ConvertedModule, or rng= to the call.")
      rng = self.rngs()
    outputs, new_params = fn(params, *args, rng=rng, **kwargs)
    for key, value in params.items():
      if new_params[key] is not value:
        self.variables[key].set_value(new_params[key])
    return outputs

  def to_params(self) -> dict[str, Any]:
    """The current values as a flat dict keyed like `jax_fn`'s params (for `jax_fn` itself)."""
    return {key: variable.get_value() for key, variable in self.variables.items()}
