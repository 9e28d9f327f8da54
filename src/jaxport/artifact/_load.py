"""`jaxport.load`: an artifact back as `fn(params, *args, rng=None, **kwargs) -> (outputs, new_params)`.

Nothing here imports TensorFlow, Keras or pickle, and nothing from the files runs as
code: the manifest is JSON checked field by field, the params are safetensors, and the
function is jax.export's flatbuffer, whose StableHLO module jaxport's interpreter runs op
by op into `jax.lax` inside the caller's trace (only ops it has handlers for), so `jit`,
`grad`, `vmap` and `jvp` work on every platform.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxport import composite
from jaxport.artifact import _manifest as mf
from jaxport.artifact._params import read_params
from jaxport.call_forms import CallForms
from jaxport.convert import export_marks
from jaxport.errors import (ArtifactError, DtypeMismatchError, MissingInputError, ShapeMismatchError,
                            StableHLOError)
from jaxport.interop._dtypes import check_fits_jax


class LoadedFunction(CallForms):
  """`fn(params, *args, rng=None, **kwargs) -> (outputs, new_params)`, read from an artifact.

  Attributes, as on a converted function: `param_keys`, `trainable` (name -> flag), `requires_rng`,
  the call forms `fn.outputs_only`, `fn.with_changed_params` and `fn.returning(form)`, and
  `has_convolutions` (`jaxport.jit` picks its XLA options from it); and `platforms`, `manifest`
  (the checked JSON), `exported` (the `jax.export.Exported`, whose `call` runs the same function
  through XLA's own deserializer), `path`.
  """

  def __init__(self, path: str, manifest: mf.Manifest, exported, module, platform: str | None):
    self.path, self._m, self.exported, self._module = path, manifest, exported, module
    self.manifest = manifest.raw
    self.param_keys = tuple(p.path for p in manifest.params)
    self.trainable = dict(manifest.trainable)
    self.requires_rng = manifest.rng is not None
    self.platforms = manifest.platforms
    self._platform = platform
    self._kept = tuple(exported.module_kept_var_idx)
    self.__name__ = manifest.name
    self.platform_index()   # fails early when this platform was not exported

  def __repr__(self) -> str:
    return f"<jaxport.LoadedFunction {self.__name__!r} from {self.path}>"

  def platform_index(self) -> int:
    """The index of the current JAX backend in `platforms` (what a multi-platform module takes first)."""
    from jaxport.convert.ops.xla_call_module import current_platform
    here = (self._platform or current_platform()).lower()
    if here not in self.platforms:
      raise ArtifactError(f"{self.path} was exported for {', '.join(self.platforms)} and this is {here}; export "
                          f"it again with platforms including {here!r}, or pass jaxport.load(..., "
                          f"platform={self.platforms[0]!r}) to interpret that lowering here anyway.")
    return self.platforms.index(here)

  def flat_inputs(self, params, *args, rng=None, **kwargs) -> list:
    """The exported function's arguments, in its order (see `jax.export.Exported.call`)."""
    params = dict(params) if params is not None else {}
    missing = [k for k in self.param_keys if k not in params]
    if missing:
      raise MissingInputError(f"params is missing {len(missing)} parameter(s): {', '.join(missing)}. "
                              "Pass the params returned by jaxport.load.")
    flat = [self._array(params[s.path], s, f"params[{s.path!r}]", batch=None) for s in self._m.params]
    leaves = self._m.input_structure.flatten(composite.expand((tuple(args), dict(kwargs))), "")
    batch: dict[str, int] = {}
    flat += [self._array(x, s, f"input {s.path}", batch) for x, s in zip(leaves, self._m.inputs)]
    if self.requires_rng:
      flat.append(self._rng(rng))
    return flat

  @property
  def has_convolutions(self) -> bool:
    """Whether the module has convolutions, as XLA's op or as the converter's Winograd conv (a mark)."""
    winograd = export_marks.PREFIX + "winograd_conv"
    return ("stablehlo.convolution" in self._module.op_names()
            or any(name.startswith(winograd) for name in self._module.functions))

  def _run(self, form: str, params, args, kwargs, rng):
    flat = self.flat_inputs(params, *args, rng=rng, **kwargs)
    lead = [np.asarray(self.platform_index(), np.int32)] if len(self.platforms) > 1 else []
    from jaxport.convert import stablehlo
    outs = stablehlo.call_module(self._module, lead + [flat[i] for i in self._kept], name=f"{self.path} ({self.__name__})")
    outs = [jnp.asarray(o) for o in outs]
    n_out = len(self._m.outputs)
    outputs = self._m.output_structure.unflatten(outs[:n_out])
    if form == "outputs":
      return outputs
    changed = dict(zip(self._m.state_outputs, outs[n_out:]))
    return outputs, (changed if form == "changed" else {**params, **changed})

  def _array(self, x, spec: mf.ArraySpec, what: str, batch: dict | None):
    # device_put, not jnp.asarray: a NumPy view of a CPU jax.Array's buffer (load's params) is not copied
    if isinstance(x, (np.ndarray, np.generic)):
      check_fits_jax(np.asarray(x), what)
    x = x if isinstance(x, jax.Array) else jax.device_put(x) if isinstance(x, np.ndarray) else jnp.asarray(x)
    if np.dtype(x.dtype) != spec.dtype:
      raise DtypeMismatchError(f"{what}: the artifact takes {spec.dtype.name}, got {np.dtype(x.dtype).name}; "
                               f"cast it first (x.astype('{spec.dtype.name}')).")
    got = tuple(x.shape)
    ok = len(got) == len(spec.shape)
    for want, dim in zip(spec.shape, got):
      if isinstance(want, str) and batch is not None:   # the symbolic batch dim: one size for every input
        ok = ok and batch.setdefault(want, dim) == dim and dim >= 1
      else:
        ok = ok and want == dim
    if not ok:
      tail = (f" (the batch dim {mf.BATCH_DIM} is {batch[mf.BATCH_DIM]} for an earlier input)"
              if batch and mf.BATCH_DIM in batch else "")
      raise ShapeMismatchError(f"{what}: expected shape {spec.shape_text()}, got {got}{tail}; "
                               + ("the leading dim may vary (batch-polymorphic export), the others are fixed."
                                  if self._m.batch_polymorphic else "the artifact was exported for these shapes: "
                                  "export again with batch_polymorphic=True for a free batch dim."))
    return x

  def _rng(self, rng):
    if rng is None:
      raise MissingInputError("this function uses random ops and needs a PRNG key: pass rng=jax.random.key(seed)")
    rng = rng if isinstance(rng, jax.Array) else jnp.asarray(rng)
    if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
      rng = jax.random.key_data(rng)
    spec = mf.ArraySpec("rng", self._m.rng["shape"], self._m.rng["dtype"])
    if tuple(rng.shape) != spec.shape or np.dtype(rng.dtype) != spec.dtype:
      raise ShapeMismatchError(f"rng: expected a key of the {self._m.rng['impl']} implementation (key data "
                               f"uint32{list(spec.shape)}), got {np.dtype(rng.dtype).name}{list(rng.shape)}; "
                               "pass rng=jax.random.key(seed) under the PRNG implementation used at export.")
    return rng


def load(path: str | os.PathLike, *, platform: str | None = None, sharding=None, mesh=None,
         verify: bool = True) -> tuple[LoadedFunction, dict[str, Any]]:
  """Reads an artifact written by `jaxport.export`: `(fn, params)`, called as `fn(params, *args, rng=None,
  **kwargs) -> (outputs, new_params)`. `params` maps each name to a `jaxport.Variable` (a NumPy array
  with `.name` and `.trainable`); `fn.trainable` holds the flags too.

  `sharding` places the params on devices instead, each a `jax.Array` read from the memory-mapped
  params files slice by slice straight into its shards (no process holds a whole param it does not
  need): a `jax.sharding.Sharding` for all, `"fsdp"` (`jaxport.sharding.fsdp_shardings` over `mesh`, by
  default all devices), a dict or callable by param name, or `(regex, PartitionSpec)` rules over `mesh`
  (see `jaxport.sharding`). Under `jax.jit`, the function's outputs keep the shardings GSPMD gives them.

  Every file is checked against the manifest (SHA-256, streamed; names, shapes, dtypes): a mismatch
  raises `ArtifactError`; `verify=False` skips the hashes (e.g. on many hosts reading one shared copy).
  `platform` interprets that platform's lowering on the current backend. TensorFlow is not needed.
  """
  from jaxport import sharding as sharding_mod
  from jaxport.convert import stablehlo
  from jaxport.convert.api import Variable
  from jaxport.interop import to_jax
  directory = os.fspath(path)
  manifest = mf.read_manifest(directory)
  blob = mf.read_payload(directory, mf.FUNCTION_FILE, manifest)
  function_path = os.path.join(directory, mf.FUNCTION_FILE)
  try:
    exported = jax.export.deserialize(bytearray(blob))
  except Exception as e:
    raise ArtifactError(f"{function_path}: jax.export cannot read it ({type(e).__name__}: {_first_line(e)}); "
                        f"load it with the jax release that wrote it ({_made_by(manifest, 'jax')}), or "
                        f"{mf.REEXPORT}.") from None
  del blob
  _check_exported(exported, manifest, function_path)
  try:
    module = stablehlo.load_module(exported.mlir_module_serialized)
    stablehlo.check_module(module, where=function_path)
  except StableHLOError as e:
    raise ArtifactError(f"{function_path}: {e}") from None

  shardings = sharding_mod.resolve(sharding, manifest, mesh)

  def wrap(value: np.ndarray, spec: mf.ArraySpec):
    # The host copy becomes a CPU jax.Array's buffer (DLPack, no copy), so a call hands it to JAX as is.
    shared = np.asarray(to_jax(value, device="cpu")) if _jax_dtype(value.dtype) else value
    return Variable(shared, name=spec.path, trainable=manifest.trainable[spec.path])
  params = read_params(directory, manifest, shardings, wrap=wrap, verify=verify)
  return LoadedFunction(directory, manifest, exported, module, platform), params


def _check_exported(exported, manifest: mf.Manifest, where: str) -> None:
  """The serialized function's signature must be the manifest's: same count, shapes and dtypes."""
  want_in = [*manifest.params, *manifest.inputs]
  if manifest.rng is not None:
    want_in.append(mf.ArraySpec("rng", manifest.rng["shape"], manifest.rng["dtype"]))
  want_out = [*manifest.outputs, *(next(p for p in manifest.params if p.path == k) for k in manifest.state_outputs)]
  for kind, avals, wants in (("arguments", exported.in_avals, want_in), ("results", exported.out_avals, want_out)):
    if len(avals) != len(wants):
      raise ArtifactError(f"{where} takes {len(avals)} {kind} but the manifest describes {len(wants)}; the files "
                          f"do not belong together: {mf.REEXPORT}.")
    for aval, want in zip(avals, wants):
      shape = tuple(d if isinstance(d, int) else str(d) for d in aval.shape)
      if shape != want.shape or np.dtype(aval.dtype) != want.dtype:
        raise ArtifactError(f"{where}: the {kind[:-1]} for {want.path} is {np.dtype(aval.dtype).name}"
                            f"{list(shape)}, the manifest says {want.dtype.name}{list(want.shape)}; the files do "
                            f"not belong together: {mf.REEXPORT}.")
  if tuple(exported.platforms) != manifest.platforms:
    raise ArtifactError(f"{where} was lowered for {', '.join(exported.platforms)}, the manifest says "
                        f"{', '.join(manifest.platforms)}; {mf.REEXPORT}.")
  if exported.ordered_effects or exported.nr_devices != 1:
    raise ArtifactError(f"{where} has ordered effects or runs on {exported.nr_devices} devices; jaxport "
                        "artifacts hold single-device functions without effects.")
  kept = tuple(exported.module_kept_var_idx)
  if any(not 0 <= i < len(want_in) for i in kept) or list(kept) != sorted(set(kept)):
    raise ArtifactError(f"{where}: its kept-argument list is not valid; {mf.REEXPORT}.")


def _jax_dtype(dtype: np.dtype) -> bool:
  """Whether JAX keeps `dtype` as it is (no x64 narrowing)."""
  return dtype.kind in "biuf" and np.dtype(jax.dtypes.canonicalize_dtype(dtype)) == dtype


def _made_by(manifest: mf.Manifest, key: str) -> str:
  made_by = manifest.raw.get("made_by")
  return str(made_by.get(key)) if isinstance(made_by, dict) and made_by.get(key) else "unknown"


def _first_line(error: BaseException, limit: int = 200) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  return text if len(text) <= limit else text[:limit - 3] + "..."
