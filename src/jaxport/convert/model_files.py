"""The function a model file holds, ready to convert, export or time (`jaxport convert`, `jaxport bench`).

A `.keras` / `.h5` file gives its model, traced with its input specs (batch dim None); a
SavedModel gives one signature or restored function (`--signature NAME`, else the only
one, else `serving_default`). Reading goes through `jaxport.convert.inspect`'s helpers, so
a path that is not a model fails the same way for every command.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np
import tree

from jaxport.convert import api
from jaxport.convert.graph import numpy_dtype
from jaxport.convert.inspect import (check_model_path, keras_input_specs, load_keras_file, load_saved_model,
                                     pick_functions)
from jaxport.convert.signature import path_name
from jaxport.errors import ModelFileError


@dataclasses.dataclass
class ModelFunction:
  """One function of a model file: `fn` (a Keras model or a concrete function) and its input specs."""
  path: str
  kind: str                  # "keras" or "saved_model"
  name: str
  fn: Any
  specs: tuple[tuple, dict]  # (args, kwargs) of tf.TensorSpecs (and fixed non-tensor values)
  owner: Any = None          # the restored SavedModel: its variables live as long as it does

  def convert(self):
    """`(jax_fn, params)` as `jaxport.convert` gives them."""
    if self.kind == "keras":
      args, kwargs = self.specs
      return api.convert(self.fn, *args, **kwargs)
    return api.convert_from_restored(self.fn)

  def example_inputs(self, batch: int, seed: int = 0) -> list[np.ndarray]:
    """Random arrays for the tensor inputs, in flattening order: the unknown leading dim is `batch`."""
    rs = np.random.RandomState(seed)
    arrays = []
    for path, spec in self._tensor_specs():
      dims = spec.shape.as_list() if spec.shape.rank is not None else None
      if dims and dims[0] is None:
        dims[0] = batch
      if dims is None or None in dims:
        raise ModelFileError(f"{self.path}: input {path} has unknown dims {dims}; only the batch dim may be "
                             "unknown here. Time or export the function from Python with example arrays.")
      dtype = numpy_dtype(spec.dtype)
      if np.issubdtype(dtype, np.floating):
        arrays.append(rs.normal(size=dims).astype(dtype))
      else:
        arrays.append(np.zeros(dims, dtype))
    return arrays

  def flat_callable(self) -> Callable:
    """`call(*arrays)`: the function on its tensor inputs in flattening order (what TF timing runs)."""
    fn, (args, kwargs) = self.fn, self.specs
    leaves = tree.flatten((tuple(args), dict(kwargs)))
    tensor_at = [i for i, leaf in enumerate(leaves) if _is_tensor_spec(leaf)]

    def call(*arrays):
      filled = list(leaves)
      for i, x in zip(tensor_at, arrays):
        filled[i] = x
      a, k = tree.unflatten_as((tuple(args), dict(kwargs)), filled)
      return fn(*a, **k)
    return call

  def _tensor_specs(self):
    flat = tree.flatten_with_path((tuple(self.specs[0]), dict(self.specs[1])))
    return [(path_name(path), spec) for path, spec in flat if _is_tensor_spec(spec)]


def _is_tensor_spec(x) -> bool:
  return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray)


def load_model_function(path: str, signature: str | None = None) -> ModelFunction:
  """The function of a `.keras` / `.h5` file or SavedModel directory; `ModelFileError` when there is none
  or several and `signature` does not pick one."""
  kind = check_model_path(path)
  if kind == "graph_def":
    raise ModelFileError(f"{path} is a GraphDef, which names no inputs or outputs; convert it in Python with "
                         "jaxport.convert_graph_def(path, inputs=[...], outputs=[...]) (inspect works on it).")
  if kind == "keras":
    if signature is not None:
      raise ModelFileError(f"{path} is a Keras file with one function; --signature applies to SavedModels.")
    model = load_keras_file(path)
    specs = keras_input_specs(model)
    if specs is None:
      raise ModelFileError(f"{path}: the model has no input specs (a subclassed model that was never built); "
                           "save it after calling it once, or convert it in Python with example inputs.")
    return ModelFunction(path, "keras", f"{os.path.basename(path)} ({type(model).__name__} {model.name!r})",
                         model, ((specs,), {}))
  restored, functions = load_saved_model(path)
  if signature is not None:
    picked = pick_functions(path, functions, signature)
    if len(picked) != 1:
      raise ModelFileError(f"{path} has several concrete functions named {signature!r}; pick one of: "
                           f"{', '.join(picked)}.")
  elif len(functions) == 1:
    picked = functions
  elif "serving_default" in functions:
    picked = {"serving_default": functions["serving_default"]}
  else:
    raise ModelFileError(f"{path} has {len(functions)} functions ({', '.join(functions)}); pick one with "
                         "--signature NAME.")
  (name, cf), = picked.items()
  args, kwargs = cf.structured_input_signature
  return ModelFunction(path, "saved_model", name, cf, (tuple(args), dict(kwargs)), owner=restored)
