"""Shardings for params: FSDP-style defaults, rules by name, and placing params without a gathered copy.

`jaxport.load(path, sharding=...)` and `shard_params(params, sharding=...)` take the same forms:

- a `jax.sharding.Sharding`: every param placed by it (e.g. replicated over a mesh);
- `"fsdp"`: `fsdp_shardings` (each param split along its largest dim the mesh divides; small ones
  replicated), over `mesh` or a 1-D mesh of all devices;
- a dict `{param name: Sharding or PartitionSpec}` naming every param (PartitionSpecs need `mesh`);
- a callable `(name, shape, dtype) -> Sharding or PartitionSpec`;
- rules in the style of Flax's logical axis rules: a list of `(regex, PartitionSpec)` pairs, the first
  rule whose regex matches (`re.search`) a param's name places it (PartitionSpecs over `mesh`);
  a param no rule matches is replicated.

Params are placed by `jax.make_array_from_callback`: each device gets its slice only, and no device
(nor, with several processes, any process) holds a param it does not need.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxport.errors import UnsupportedValueError

FSDP_AXIS = "fsdp"
MIN_SHARDED_SIZE = 2 ** 16   # params with fewer elements are replicated by `fsdp_shardings`


def default_mesh(axis: str = FSDP_AXIS) -> Mesh:
  """A 1-D mesh over every device (of every process)."""
  return Mesh(np.asarray(jax.devices()), (axis,))


def param_specs(source) -> dict[str, jax.ShapeDtypeStruct]:
  """The params' shapes and dtypes of `source`: a dict of arrays (or ShapeDtypeStructs), a converted or
  loaded function, or an artifact's directory (only its manifest is read)."""
  if isinstance(source, (str, os.PathLike)):
    from jaxport.artifact._manifest import read_manifest
    source = read_manifest(os.fspath(source))
  m = getattr(source, "_m", source)   # a LoadedFunction's checked manifest
  if hasattr(m, "params") and hasattr(m, "platforms"):
    return {p.path: jax.ShapeDtypeStruct(p.shape, p.dtype) for p in m.params}
  if hasattr(source, "_param_specs"):   # a ConvertedFunction
    return dict(source._param_specs)
  if isinstance(source, Mapping):
    return {k: jax.ShapeDtypeStruct(tuple(v.shape), np.dtype(getattr(v.dtype, "as_numpy_dtype", v.dtype)))
            for k, v in source.items()}
  raise UnsupportedValueError(f"cannot read param shapes from a {type(source).__name__}; pass a dict of arrays, a "
                              "converted or loaded function, or an artifact's directory.")


def fsdp_spec(shape: tuple[int, ...], parts: int, axis, min_size: int = MIN_SHARDED_SIZE) -> PartitionSpec:
  """Splits the largest dim that `parts` divides over `axis`; replicated when small or none divides."""
  if parts <= 1 or int(np.prod(shape, dtype=np.int64)) < min_size:
    return PartitionSpec()
  dims = sorted((d for d in range(len(shape)) if shape[d] % parts == 0), key=lambda d: (-shape[d], d))
  if not dims:
    return PartitionSpec()
  spec: list = [None] * len(shape)
  spec[dims[0]] = axis
  return PartitionSpec(*spec)


def fsdp_shardings(source, mesh: Mesh | None = None, *, axis: str | Sequence[str] | None = None,
                   min_size: int = MIN_SHARDED_SIZE) -> dict[str, NamedSharding]:
  """FSDP-style shardings of `source`'s params (see `param_specs`) over `mesh` (default: all devices):
  each param split along its largest dim divisible by the size of `axis` (default: all mesh axes
  together); params under `min_size` elements, or with no such dim, replicated."""
  mesh = mesh or default_mesh()
  axes = tuple(mesh.axis_names) if axis is None else ((axis,) if isinstance(axis, str) else tuple(axis))
  parts = int(np.prod([mesh.shape[a] for a in axes]))
  entry = axes[0] if len(axes) == 1 else axes
  return {k: NamedSharding(mesh, fsdp_spec(tuple(s.shape), parts, entry, min_size))
          for k, s in param_specs(source).items()}


def rule_shardings(source, rules: Sequence[tuple[str, PartitionSpec]], mesh: Mesh | None = None
                   ) -> dict[str, NamedSharding]:
  """Shardings from `(regex, PartitionSpec)` rules: the first whose regex `re.search`es a param's name
  places it over `mesh`; a param no rule matches is replicated."""
  mesh = mesh or default_mesh()
  compiled = [(re.compile(pattern), spec) for pattern, spec in rules]
  out = {}
  for k, s in param_specs(source).items():
    spec = next((sp for rx, sp in compiled if rx.search(k)), PartitionSpec())
    out[k] = _as_sharding(spec, mesh, k, tuple(s.shape))
  return out


def resolve(sharding, source, mesh: Mesh | None = None) -> dict[str, Sharding] | None:
  """Each param's Sharding for one of the forms `load` and `shard_params` take (see the module's doc)."""
  if sharding is None:
    return None
  specs = param_specs(source)
  if isinstance(sharding, str):
    if sharding == "fsdp":
      return fsdp_shardings(specs, mesh)
    if sharding == "replicated":
      return {k: NamedSharding(mesh or default_mesh(), PartitionSpec()) for k in specs}
    raise UnsupportedValueError(f"sharding={sharding!r}: the named shardings are 'fsdp' and 'replicated'; or pass "
                                "a Sharding, a dict by param name, a callable or (regex, PartitionSpec) rules.")
  if isinstance(sharding, Sharding):
    return {k: _as_sharding(sharding, mesh, k, tuple(s.shape)) for k, s in specs.items()}
  if isinstance(sharding, Mapping):
    missing = [k for k in specs if k not in sharding]
    if missing:
      raise UnsupportedValueError(f"sharding names no sharding for {len(missing)} param(s): "
                                  f"{', '.join(missing[:5])}; name every param (see fsdp_shardings for defaults).")
    return {k: _as_sharding(sharding[k], mesh, k, tuple(s.shape)) for k, s in specs.items()}
  if callable(sharding):
    return {k: _as_sharding(sharding(k, tuple(s.shape), s.dtype), mesh, k, tuple(s.shape)) for k, s in specs.items()}
  if isinstance(sharding, Sequence) and all(isinstance(r, (tuple, list)) and len(r) == 2 for r in sharding):
    return rule_shardings(specs, sharding, mesh)
  raise UnsupportedValueError(f"sharding of type {type(sharding).__name__} is not one jaxport takes: pass a Sharding, "
                              "'fsdp', a dict by param name, a callable (name, shape, dtype) -> Sharding, or "
                              "(regex, PartitionSpec) rules.")


def _as_sharding(value, mesh: Mesh | None, name: str, shape: tuple) -> Sharding:
  try:
    if isinstance(value, PartitionSpec):
      value = NamedSharding(mesh or default_mesh(), value)
    if not isinstance(value, Sharding):
      raise UnsupportedValueError(f"the sharding for {name!r} is a {type(value).__name__}; give a "
                                  "jax.sharding.Sharding or a PartitionSpec.")
    value.shard_shape(shape)
  except UnsupportedValueError:
    raise
  except Exception as e:
    raise UnsupportedValueError(f"the sharding for {name!r} cannot split its shape {shape} ({e}); name mesh axes "
                                "that divide its dims, or replicate it (PartitionSpec()).") from None
  return value


def shard_params(params: Mapping[str, Any], sharding="fsdp", *, mesh: Mesh | None = None) -> dict[str, jax.Array]:
  """`params` (e.g. from `jaxport.convert`) placed by `sharding` (any form `resolve` takes): each device
  gets only its slice, copied from the host array (no device ever holds a whole param it does not need)."""
  shardings = resolve(sharding, params, mesh)
  out = {}
  for k, v in params.items():
    host = v if isinstance(v, np.ndarray) else np.asarray(v)
    out[k] = jax.make_array_from_callback(host.shape, shardings[k], lambda index, h=host: h[index])
  return out


__all__ = ["fsdp_shardings", "rule_shardings", "shard_params", "resolve", "param_specs", "default_mesh",
           "fsdp_spec", "FSDP_AXIS", "MIN_SHARDED_SIZE"]
