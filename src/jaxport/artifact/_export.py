"""`jaxport.export`: a converted function lowered once through `jax.export`, written with its params.

The exported function takes one flat list of arrays, in this order (the manifest's
`calling_convention` says the same):

1. the params, in the manifest's `params` order (the order of the `params` dict);
2. the array leaves of `(args, kwargs)`, in the order of `inputs.leaves` (dict keys sorted);
3. the rng key's data (`jax.random.key_data`, uint32), when the function draws random numbers.

It returns the array leaves of the outputs (`outputs.leaves`), then the new values of the
params it updates (`state_outputs`, e.g. BatchNorm moving statistics in training mode).
Params it only reads are not returned: `load` passes them through.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from typing import Any, Callable

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np

from jaxport import composite
from jaxport.artifact import _manifest as mf
from jaxport.artifact._params import param_dtype, write_params
from jaxport.artifact._structure import Structure, encode
from jaxport.convert import export_marks
from jaxport.errors import ArtifactError, BatchFallbackWarning, DynamicShapeError, JaxportError, ShapeMismatchError

CALLING_CONVENTION = ("flat inputs: params (in `params` order), the array leaves of (args, kwargs) (in "
                      "`inputs.leaves` order), then the rng key data when `rng` is set; flat outputs: the array "
                      "leaves of the outputs (in `outputs.leaves` order), then the new values of `state_outputs`")


@dataclasses.dataclass
class LoweredArtifact:
  """A function lowered by `lower`, ready to `write`: `exported` is its `jax.export.Exported`; `arrays`
  the params as given (copied to host memory, if they are not there, file by file as `write` writes them)."""
  exported: Any
  serialized: bytes
  arrays: dict[str, Any]
  manifest: dict[str, Any]
  batch_fallback: str | None = None   # why an automatic batch-polymorphic export fell back to a fixed batch

  def write(self, path: str | os.PathLike, *, max_shard_bytes: int | None = None) -> dict[str, Any]:
    """Writes the artifact directory (created if needed); returns the manifest written. The params go to
    one safetensors file, or to several of at most `max_shard_bytes` each (default 4 GiB) with an index."""
    path = _checked_directory(path)
    _clear_directory(path)
    dtypes = {p["name"]: mf.DTYPES[p["dtype"]] for p in self.manifest["params"]}
    return self._finish(path, write_params(path, self.arrays, dtypes, max_shard_bytes))

  def _finish(self, path: str, params_files: dict[str, dict]) -> dict[str, Any]:
    """Writes the function and, last, the manifest listing every file (the params are already written)."""
    _write_file(os.path.join(path, mf.FUNCTION_FILE), self.serialized)
    files = {mf.FUNCTION_FILE: {"sha256": mf.sha256_bytes(self.serialized), "bytes": len(self.serialized)}}
    files.update(params_files)
    manifest = dict(self.manifest, files=files)
    _write_file(os.path.join(path, mf.MANIFEST), (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def _checked_directory(path: str | os.PathLike) -> str:
  """`path` as a directory an artifact may be written to (created if need be): new, empty or an artifact."""
  path = os.fspath(path)
  if os.path.exists(path) and not os.path.isdir(path):
    raise ArtifactError(f"{path} is a file; pass a new or empty directory (or an artifact to replace).")
  os.makedirs(path, exist_ok=True)
  if any(n != _STAGING for n in os.listdir(path)) and not os.path.exists(os.path.join(path, mf.MANIFEST)):
    raise ArtifactError(f"{path} is a directory that holds other files and no {mf.MANIFEST}; pass a new or "
                        "empty directory, or an earlier artifact to replace.")
  return path


def _clear_directory(path: str) -> None:
  """Removes an earlier artifact's manifest (first: an interrupted rewrite leaves no manifest listing stale
  files) and params files, which this one may not replace."""
  manifest_path = os.path.join(path, mf.MANIFEST)
  if os.path.exists(manifest_path):
    os.remove(manifest_path)
  for name in os.listdir(path):
    if mf.is_params_payload(name):
      os.remove(os.path.join(path, name))


_STAGING = ".jaxport-params-staging"   # params written while the function lowers, moved in once it has


def _export_overlapped(lower_fn: Callable[[], "LoweredArtifact"], params: dict, path: str | os.PathLike,
                       max_shard_bytes: int | None) -> dict[str, Any]:
  """`lower_fn().write(path)`, with the params written (into a staging folder, I/O that releases the GIL)
  while the function traces and lowers: an export then costs about the longer of the two, not their sum.
  A failed lowering leaves an earlier artifact at `path` as it was."""
  import concurrent.futures
  import shutil
  created = not os.path.exists(path)
  path = _checked_directory(path)
  staging = os.path.join(path, _STAGING)
  shutil.rmtree(staging, ignore_errors=True)
  os.makedirs(staging)
  dtypes = {k: param_dtype(v) for k, v in params.items()}
  try:
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxport-export") as pool:
      written = pool.submit(write_params, staging, dict(params), dtypes, max_shard_bytes)
      lowered = lower_fn()   # on an error, the pool waits for the writer before the staging folder goes
      params_files = written.result()
    _clear_directory(path)
    for name in params_files:
      os.replace(os.path.join(staging, name), os.path.join(path, name))
    return lowered._finish(path, params_files)   # pylint: disable=protected-access
  except BaseException:
    shutil.rmtree(staging, ignore_errors=True)
    if created and not os.listdir(path):
      os.rmdir(path)   # a failed export leaves no directory it made
    raise
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _write_file(path: str, data: bytes) -> None:
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(data)
  os.replace(tmp, path)


def export(jax_fn: Callable, params: dict, *example_args, path: str | os.PathLike,
           platforms: tuple[str, ...] = ("cpu", "cuda"), batch_polymorphic: bool | None = None,
           vjp_order: int = 0, max_shard_bytes: int | None = None, **example_kwargs) -> dict[str, Any]:
  """Writes `jax_fn` (a converted function) and `params` to the directory `path`; returns the manifest.

  `example_args`/`example_kwargs` give the input shapes and dtypes (arrays, `jax.ShapeDtypeStruct`s,
  `tf.TensorSpec`s); without any, those `jaxport.convert` traced with are used. Non-array leaves (bools,
  strings, None) are fixed at export. `platforms` are lowered together into one module. An `rng=` example
  key is not an input: the artifact takes a key of its implementation (default: JAX's default).

  `batch_polymorphic`: None (default) keeps an unknown leading (batch) dim of the traced input specs
  symbolic (`b`) when no example inputs are given, and falls back to batch 1 with a
  `BatchFallbackWarning` when the function cannot be exported that way; True makes the leading dim of
  every input (of rank 1 and up) `b`, or fails; False never does. `vjp_order=1` also serializes the
  VJP, which only `fn.exported.call` needs under `jax.grad` (`jaxport.load`'s function differentiates
  itself); it costs a second, bigger lowering. `jaxport.load(path)` gives the function back, without
  TensorFlow.

  The params are written tensor by tensor from their own memory (no serialized copy): to one
  `params.safetensors`, or, past `max_shard_bytes` (default 4 GiB), to `params-0000i-of-0000N.safetensors`
  files with `params.safetensors.index.json`. Params on devices are copied to the host one file at a time.
  """
  _check_params(params)
  return _export_overlapped(lambda: lower(jax_fn, params, *example_args, platforms=platforms,
                                          batch_polymorphic=batch_polymorphic, vjp_order=vjp_order,
                                          **example_kwargs), params, path, max_shard_bytes)


FALLBACK_BATCH = 1   # the batch an automatic export fixes when the function cannot be batch-polymorphic


def _check_params(params) -> None:
  bad = [repr(k) for k, v in params.items() if not isinstance(k, str) or not hasattr(v, "dtype")]
  if bad:
    raise ArtifactError(f"params must be a flat dict of arrays keyed by name (as jaxport.convert returns them); "
                        f"these entries are not: {', '.join(bad[:5])}.")


def lower(jax_fn: Callable, params: dict, *example_args, platforms: tuple[str, ...] = ("cpu", "cuda"),
          batch_polymorphic: bool | None = None, vjp_order: int = 0, **example_kwargs) -> LoweredArtifact:
  """What `export` does before writing: checks, traces and lowers `jax_fn` (see `export`). When an automatic
  batch-polymorphic export fell back to a fixed batch, `LoweredArtifact.batch_fallback` says why."""
  platforms = tuple(p.lower() for p in ([platforms] if isinstance(platforms, str) else platforms))
  if not platforms:
    raise ArtifactError("platforms is empty; pass the platforms to lower for, e.g. ('cpu', 'cuda').")
  if vjp_order not in (0, 1):
    raise ArtifactError(f"vjp_order={vjp_order!r}: pass 0 (the default) or 1 (also serialize the VJP).")
  report = conversion_report(jax_fn)
  callbacks = [row["op"] for row in (report or {}).get("rows", []) if row["tier"] == "callback"]
  if callbacks:
    raise ArtifactError(f"ops {', '.join(callbacks)} run in TensorFlow through host callbacks (tier 3), which "
                        "cannot be exported; check `jaxport inspect`, then add native rules for them or "
                        "rewrite the model to avoid them.")
  example_key = example_kwargs.pop("rng", None)   # an example key: only its implementation is recorded
  given = bool(example_args or example_kwargs)
  if not given and hasattr(jax_fn, "_input_structure"):
    example_args, example_kwargs = jax_fn._input_structure
  example_args, example_kwargs = composite.expand((tuple(example_args), dict(example_kwargs)))
  _check_params(params)
  auto = batch_polymorphic is None
  if not auto:
    return _lower(jax_fn, params, example_args, example_kwargs, platforms, "all" if batch_polymorphic else None,
                  vjp_order, report, example_key)
  if given or not _unknown_batch(example_args, example_kwargs):
    return _lower(jax_fn, params, example_args, example_kwargs, platforms, None, vjp_order, report, example_key)
  try:
    return _lower(jax_fn, params, example_args, example_kwargs, platforms, "unknown", vjp_order, report,
                  example_key)
  except Exception as e:   # retried at a fixed batch; an error there is the function's own and is raised
    why = getattr(e, "reason", None) or f"{type(e).__name__}: {_first_line(e)}"
  fixed_args, fixed_kwargs = example_inputs(jax_fn, FALLBACK_BATCH)
  lowered = _lower(jax_fn, params, fixed_args, fixed_kwargs, platforms, None, vjp_order, report, example_key)
  lowered.batch_fallback = why
  warnings.warn(BatchFallbackWarning(
      f"{lowered.manifest['name']} cannot be exported with a symbolic batch dim ({why}); exported for batch "
      f"{FALLBACK_BATCH} instead. To export another batch size, pass example inputs of that size "
      "(jaxport.export(fn, params, x, path=...)) or run `jaxport convert --batch N`."), stacklevel=3)
  return lowered


def _unknown_batch(args, kwargs) -> bool:
  """Whether some example input leaves its leading dim unknown (a TensorSpec([None, ...]))."""
  import tree
  for x in tree.flatten((tuple(args), dict(kwargs))):
    dims = _dims(x.shape) if _is_input_array(x) and hasattr(x, "shape") else None
    if dims and dims[0] is None:
      return True
  return False


def _lower(jax_fn, params, example_args, example_kwargs, platforms, symbolic: str | None, vjp_order: int,
           report, example_key=None) -> LoweredArtifact:
  """One lowering. `symbolic`: None (concrete shapes), "all" (every input's leading dim is `b`) or
  "unknown" (the leading dims left unknown are `b`)."""
  batch_polymorphic = symbolic is not None
  keys = list(params)
  arrays = dict(params)   # read (and copied to the host if need be) only when written
  param_dtypes = {k: param_dtype(v) for k, v in params.items()}
  dtypes = {k: mf.dtype_name(d) for k, d in param_dtypes.items()}
  flags = getattr(jax_fn, "trainable", None) or {}
  trainable = {k: bool(flags.get(k, getattr(params[k], "trainable", True))) for k in keys}

  in_node, in_leaves, in_paths = encode((tuple(example_args), dict(example_kwargs)), _is_input_array, "")
  input_structure = Structure.read(in_node, len(in_leaves), ArtifactError, "inputs")
  batch = jax.export.symbolic_shape(mf.BATCH_DIM)[0] if batch_polymorphic else None
  in_specs = [_input_spec(x, p, batch, only_unknown=symbolic == "unknown") for x, p in zip(in_leaves, in_paths)]
  requires_rng = bool(getattr(jax_fn, "requires_rng", False))
  key_data, rng_impl = _rng_spec(example_key) if requires_rng else (None, None)
  param_specs = [jax.ShapeDtypeStruct(tuple(v.shape), param_dtypes[k]) for k, v in arrays.items()]
  specs = param_specs + in_specs + ([jax.ShapeDtypeStruct(key_data.shape, key_data.dtype)] if requires_rng else [])
  name = str(getattr(jax_fn, "__name__", "function"))
  n_params, n_inputs = len(keys), len(in_specs)
  recorded: dict[str, Any] = {}

  def flat_fn(*flat):
    p = dict(zip(keys, flat[:n_params]))
    args, kwargs = input_structure.unflatten(list(flat[n_params:n_params + n_inputs]))
    rng = jax.random.wrap_key_data(flat[-1], impl=rng_impl) if requires_rng else None
    outputs, new_params = jax_fn(p, *args, rng=rng, **kwargs)
    node, leaves, paths = encode(outputs, _is_output_array, "outputs")
    recorded.update(node=node, paths=paths, n_out=len(leaves))
    return (tuple(jnp.asarray(x) for x in leaves)
            + tuple(jnp.asarray(new_params[k], param_dtypes[k]) for k in keys))

  try:
    # One trace of the converted function: its jaxpr says which params it updates, and jax.export lowers
    # the jaxpr (replayed, much cheaper than tracing the conversion again) without the others.
    with export_marks.exporting():   # stop_gradient and TF-gradient rules kept as named calls
      closed = jax.make_jaxpr(flat_fn)(*specs)
    state_keys, kept = _updated_params(closed, keys, recorded["n_out"])
    replay = jax.extend.core.jaxpr_as_fun(closed)

    def pruned(*flat):
      outs = replay(*flat)
      return tuple(outs[i] for i in kept)
    pruned.__name__ = name
    exported = jax.export.export(jax.jit(pruned), platforms=platforms)(*specs)
  except ShapeMismatchError as e:
    if not batch_polymorphic:
      raise
    raise ArtifactError(f"{e} A batch-polymorphic export needs a function converted with an unknown batch dim: "
                        "convert with tf.TensorSpec([None, ...]) inputs (Keras models: model.input's specs).") from e
  except Exception as e:
    if batch_polymorphic and (isinstance(e, DynamicShapeError)
                              or type(e).__name__ == "InconclusiveDimensionOperation"):
      where = "; ".join(n for n in getattr(e, "__notes__", ()) if n.startswith("while converting"))
      error = ArtifactError(f"{name} cannot be exported with a symbolic batch dim: {where or 'an op'} needs a "
                            f"concrete size ({_first_line(e)}); export without batch_polymorphic, one artifact "
                            "per batch size.")
      error.reason = f"{where or 'an op'} needs a concrete size ({_first_line(e)})"
      raise error from e
    if isinstance(e, DynamicShapeError):   # the advice to call without jax.jit does not apply here
      raise ArtifactError(f"{name} cannot be exported: an artifact is one traced program with static shapes, and "
                          f"an output size here depends on input values ({_first_line(e)}). Export a function "
                          "whose shapes follow from the input shapes (a padded or fixed-size variant of the op), "
                          "or run the converted function eagerly instead.") from e
    if isinstance(e, JaxportError):
      raise
    raise ArtifactError(f"jax.export cannot lower {name} for {', '.join(platforms)} ({type(e).__name__}: "
                        f"{_first_line(e)}); export for fewer platforms (e.g. platforms=('cpu',))"
                        + (" or without batch_polymorphic" if batch_polymorphic else "") + ".") from e
  try:
    serialized = exported.serialize(vjp_order=vjp_order)
  except Exception as e:
    raise ArtifactError(f"jax.export cannot differentiate {name} for its serialized VJP ({type(e).__name__}: "
                        f"{_first_line(e)}); export with vjp_order=0 (jaxport.load's function is still "
                        "differentiable: it differentiates the interpreted module).") from e

  out_avals = exported.out_avals
  n_out = len(out_avals) - len(state_keys)
  outputs = [mf.ArraySpec(p, _shape(a.shape), np.dtype(a.dtype)) for p, a in zip(recorded["paths"], out_avals[:n_out])]
  inputs = [mf.ArraySpec(p, _shape(s.shape), np.dtype(s.dtype)) for p, s in zip(in_paths, in_specs)]
  for spec in [*inputs, *outputs]:
    mf.dtype_name(spec.dtype)
  manifest = {
      "format": mf.FORMAT, "format_version": mf.FORMAT_VERSION, "name": name,
      "calling_convention": CALLING_CONVENTION,
      "platforms": list(exported.platforms), "batch_polymorphic": bool(batch_polymorphic), "vjp_order": vjp_order,
      "params": [{"name": k, "shape": list(s.shape), "dtype": dtypes[k], "trainable": trainable[k]}
                 for k, s in zip(keys, param_specs)],
      "inputs": {"structure": in_node, "leaves": [s.to_json() for s in inputs]},
      "rng": ({"impl": rng_impl, "shape": list(key_data.shape), "dtype": "uint32"} if requires_rng else None),
      "outputs": {"structure": recorded["node"], "leaves": [s.to_json() for s in outputs]},
      "state_outputs": list(state_keys),
      "conversion": report,
      "made_by": _versions(),
  }
  return LoweredArtifact(exported, bytes(serialized), arrays, manifest)


def _rng_spec(example_key=None) -> tuple[jax.ShapeDtypeStruct, str]:
  """The shape of the PRNG implementation's key data, and its name (traced: nothing compiles): that of a
  typed `example_key`, else the default one."""
  impl = []
  typed = hasattr(example_key, "dtype") and jax.dtypes.issubdtype(example_key.dtype, jax.dtypes.prng_key)

  def key_data():
    key = example_key if typed else jax.random.key(0)
    impl.append(str(jax.random.key_impl(key)))
    return jax.random.key_data(key)
  return jax.eval_shape(key_data), impl[0]


def _updated_params(closed, keys: list[str], n_out: int) -> tuple[list[str], list[int]]:
  """The params whose new value is not simply the value passed in (found in the jaxpr), and the indices
  of the jaxpr's outputs to keep: the function's outputs, then those params' new values."""
  invars, outvars = closed.jaxpr.invars, closed.jaxpr.outvars
  updated = [i for i, k in enumerate(keys) if outvars[n_out + i] is not invars[i]]
  return [keys[i] for i in updated], list(range(n_out)) + [n_out + i for i in updated]


def _is_input_array(x) -> bool:
  return not isinstance(x, (type(None), bool, str, bytes))


def _is_output_array(x) -> bool:
  return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _dims(shape) -> list | None:
  """The dims of a shape (a tf.TensorShape too) as a list with None for unknown ones; None: unknown rank."""
  if getattr(shape, "rank", 0) is None:
    return None
  return list(shape.as_list() if hasattr(shape, "as_list") else shape)


def _input_spec(x, path: str, batch, only_unknown: bool = False) -> jax.ShapeDtypeStruct:
  """The shape and dtype of an example input leaf (array, ShapeDtypeStruct, TensorSpec, Python number);
  `batch` (a symbolic dim) replaces its leading dim, with `only_unknown` only where that is unknown."""
  if isinstance(x, float):
    shape, dtype = [], np.float32
  elif isinstance(x, int):
    shape, dtype = [], np.int32
  elif hasattr(x, "shape") and hasattr(x, "dtype"):
    shape, dtype = _dims(x.shape), getattr(x.dtype, "as_numpy_dtype", x.dtype)
    if shape is None:
      raise ShapeMismatchError(f"input {path} has an unknown rank; pass an example array (or a "
                               "jax.ShapeDtypeStruct) of the shape to export to jaxport.export.")
  else:
    arr = np.asarray(x)
    shape, dtype = list(arr.shape), arr.dtype
  if batch is not None and shape and (shape[0] is None or not only_unknown):
    shape[0] = batch
  if any(d is None for d in shape):
    raise ShapeMismatchError(
        f"input {path} has unknown dims {tuple(shape)}; an export needs concrete shapes: pass example arrays "
        "(or jax.ShapeDtypeStruct) to jaxport.export, or leave batch_polymorphic unset (or True) when only the "
        "leading dim is unknown.")
  dtype = jax.dtypes.canonicalize_dtype(np.dtype(dtype))
  mf.dtype_name(dtype)
  return jax.ShapeDtypeStruct(tuple(shape), dtype)


@dataclasses.dataclass(frozen=True)
class ExampleSpec:
  """An example input's shape (None: unknown) and dtype, as `example_inputs` gives them."""
  shape: tuple
  dtype: Any


def example_inputs(jax_fn, batch: int = 1) -> tuple[tuple, dict]:
  """The example `(args, kwargs)` a converted function was traced with, an unknown leading dim set to
  `batch` (how `jaxport convert` exports a model whose input specs leave the batch dim free)."""
  import tree
  args, kwargs = getattr(jax_fn, "_input_structure", ((), {}))

  def fix(x):
    if not (_is_input_array(x) and hasattr(x, "shape") and hasattr(x, "dtype")):
      return x
    shape = _dims(x.shape)
    if shape is None:
      return x
    if shape and shape[0] is None:
      shape[0] = batch
    return ExampleSpec(tuple(shape), np.dtype(getattr(x.dtype, "as_numpy_dtype", x.dtype)))
  return tree.map_structure(fix, (tuple(args), dict(kwargs)))


def conversion_report(jax_fn) -> dict[str, Any] | None:
  """`jaxport.inspect`'s report of a converted function (tiers under the config at conversion), as a dict."""
  graph, library, conf = (getattr(jax_fn, a, None) for a in ("_graph", "_library", "_config"))
  if graph is None or library is None or conf is None:
    return None
  from jaxport.convert import inspect as inspect_mod
  return inspect_mod._report(graph, library, str(getattr(jax_fn, "__name__", "function")), conf).to_dict()


def _versions() -> dict[str, str | None]:
  import jaxlib

  import jaxport
  tf = sys.modules.get("tensorflow")   # set when TF made the function; never imported here
  return {"jaxport": jaxport.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "tensorflow": getattr(tf, "__version__", None),
          "python": ".".join(map(str, sys.version_info[:3]))}


def _shape(shape) -> list:
  return [d if isinstance(d, int) else str(d) for d in shape]


def _first_line(error: BaseException, limit: int = 200) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  return text if len(text) <= limit else text[:limit - 3] + "..."
