"""An artifact's params as safetensors: written file by file, read tensor by tensor into their shards.

Writing: the params are grouped in order into files of at most `max_shard_bytes` (one file,
`params.safetensors`, when they fit; else `params-00001-of-0000N.safetensors` and the index
`params.safetensors.index.json`, as large checkpoints on model hubs). Each file is serialized by
safetensors straight from the arrays' memory (no bytes blob), then hashed by reading it back
in chunks; a param not already in host memory is copied there only while its file is written.

Reading: each file is opened memory-mapped (`safe_open`); a param is read whole into host memory
(no sharding) or, under a sharding, shard by shard by `jax.make_array_from_callback`, which reads
only the slices of the devices this process addresses.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

import jax
import numpy as np
from safetensors import safe_open

from jaxport.artifact import _manifest as mf
from jaxport.errors import ArtifactError

DEFAULT_MAX_SHARD_BYTES = 4 << 30   # 4 GiB per params file, about what model hubs use

# safetensors' dtype names -> the manifest's
_ST_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "F16": "float16",
              "BF16": "bfloat16", "I32": "int32", "U32": "uint32", "F32": "float32", "I64": "int64",
              "U64": "uint64", "F64": "float64", "C64": "complex64"}


# Dtypes safetensors cannot store: kept as (real, imag) pairs, a trailing axis of 2 of this dtype.
_AS_PARTS = {np.dtype(np.complex128): np.dtype(np.float64)}


def param_dtype(value) -> np.dtype:
  """The dtype `value` is stored with (canonical for JAX: float64 becomes float32 without x64)."""
  dtype = getattr(value, "dtype", None)
  dtype = np.dtype(getattr(dtype, "as_numpy_dtype", dtype))
  return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _host(value, dtype: np.dtype) -> np.ndarray:
  """`value` as a C-ordered host array of `dtype`: no copy for a host (or CPU jax) array that is one."""
  if hasattr(value, "numpy") and not isinstance(value, (np.ndarray, jax.Array)):
    value = value.numpy()   # a tf.Variable or tensor
  if isinstance(value, jax.Array) and not value.is_fully_addressable:
    raise ArtifactError("a param is split over several processes, and one process cannot write it; export from "
                        "one process, with the params gathered (jax.experimental.multihost_utils."
                        "process_allgather) or loaded unsharded.")
  # np.asarray(order="C"), not np.ascontiguousarray: that makes 0-d params (e.g. CLIP's logit_scale) 1-d.
  value = np.asarray(value, dtype, order="C")
  if dtype in _AS_PARTS:   # the same bytes, as pairs
    value = value.reshape(value.shape + (1,)).view(_AS_PARTS[dtype])
  return value


def _nbytes(value, dtype: np.dtype) -> int:
  return int(np.prod(tuple(value.shape), dtype=np.int64)) * dtype.itemsize


def write_params(directory: str, params: Mapping[str, Any], dtypes: Mapping[str, np.dtype],
                 max_shard_bytes: int | None) -> dict[str, dict]:
  """Writes `params` to `directory`; returns {file: {"sha256", "bytes"}} for the manifest."""
  limit = DEFAULT_MAX_SHARD_BYTES if max_shard_bytes is None else int(max_shard_bytes)
  if limit <= 0:
    raise ArtifactError(f"max_shard_bytes={max_shard_bytes!r}: pass a positive number of bytes per params file "
                        "(or None for the default, 4 GiB).")
  groups: list[list[str]] = [[]]
  size = 0
  for k, v in params.items():
    n = _nbytes(v, dtypes[k])
    if groups[-1] and size + n > limit:
      groups.append([])
      size = 0
    groups[-1].append(k)
    size += n
  names = ([mf.PARAMS_FILE] if len(groups) == 1
           else [mf.shard_file(i + 1, len(groups)) for i in range(len(groups))])
  files = {}
  for name, keys in zip(names, groups):
    files[name] = _write_safetensors(os.path.join(directory, name), {k: params[k] for k in keys}, dtypes)
  if len(groups) > 1:
    total = sum(_nbytes(params[k], dtypes[k]) for k in params)
    index = {"metadata": {"format": mf.FORMAT, "total_size": total},
             "weight_map": {k: name for name, keys in zip(names, groups) for k in keys}}
    data = (json.dumps(index, indent=1) + "\n").encode()
    tmp = os.path.join(directory, mf.PARAMS_INDEX + ".tmp")
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, os.path.join(directory, mf.PARAMS_INDEX))
    files[mf.PARAMS_INDEX] = {"sha256": mf.sha256_bytes(data), "bytes": len(data)}
  return files


def _write_safetensors(path: str, params: Mapping[str, Any], dtypes: Mapping[str, np.dtype]) -> dict:
  import safetensors.numpy
  tmp = path + ".tmp"
  host = {k: _host(v, dtypes[k]) for k, v in params.items()}
  safetensors.numpy.save_file(host, tmp, metadata={"format": mf.FORMAT})   # from the arrays' own memory
  del host
  entry = {"sha256": mf.sha256_file(tmp), "bytes": os.path.getsize(tmp)}
  os.replace(tmp, path)
  return entry


def weight_map(directory: str, manifest: mf.Manifest, verify: bool) -> dict[str, str]:
  """Param name -> the file that holds it, checked against the manifest."""
  names = [p.path for p in manifest.params]
  if manifest.params_files == (mf.PARAMS_FILE,):
    return {k: mf.PARAMS_FILE for k in names}
  path = os.path.join(directory, mf.PARAMS_INDEX)
  if verify:
    data = mf.read_payload(directory, mf.PARAMS_INDEX, manifest)
  else:
    with open(path, "rb") as f:
      data = f.read()
  try:
    mapping = json.loads(data.decode("utf-8"))["weight_map"]
  except Exception as e:
    raise ArtifactError(f"{path}: it is not a params index ({type(e).__name__}); {mf.REEXPORT}.") from None
  if (not isinstance(mapping, dict) or sorted(mapping) != sorted(names)
      or not all(isinstance(v, str) and v in manifest.params_files for v in mapping.values())):
    raise ArtifactError(f"{path}: its weight_map does not map each of the manifest's params to one of its "
                        f"params files; {mf.REEXPORT}.")
  return mapping


def read_params(directory: str, manifest: mf.Manifest, shardings: Mapping[str, Any] | None,
                wrap: Callable[[np.ndarray, mf.ArraySpec], Any], verify: bool = True) -> dict[str, Any]:
  """The params of an artifact: `wrap(host array, spec)` of each without `shardings`, else each a
  jax.Array placed by its sharding, read shard by shard from the memory-mapped files. `verify` checks
  each file's SHA-256 first (streamed through the page cache)."""
  where = weight_map(directory, manifest, verify)
  by_file: dict[str, list[mf.ArraySpec]] = {}
  for spec in manifest.params:
    by_file.setdefault(where[spec.path], []).append(spec)
  params: dict[str, Any] = {}
  for name in manifest.params_files:
    path = mf.verify_payload(directory, name, manifest) if verify else os.path.join(directory, name)
    specs = by_file.get(name, [])
    with _open(path) as f:   # the header only: names, shapes, dtypes
      _check_keys(path, set(f.keys()), [s.path for s in specs])
      for spec in specs:
        tensor = f.get_slice(spec.path)
        _check_spec(path, spec, tuple(tensor.get_shape()), tensor.get_dtype())
    for spec in specs:
      read = _reader(path, spec)
      if shardings is None:
        params[spec.path] = wrap(read(()), spec)
      else:
        # blocked on: the host slices go as soon as their copies land, not all of them at the end
        params[spec.path] = jax.make_array_from_callback(spec.shape, shardings[spec.path], read).block_until_ready()
  return {s.path: params[s.path] for s in manifest.params}


def _open(path: str):
  try:
    return safe_open(path, framework="numpy")
  except Exception as e:
    raise ArtifactError(f"{path}: safetensors cannot read it ({type(e).__name__}: {_first_line(e)}); "
                        f"{mf.REEXPORT}.") from None


def _reader(path: str, spec: mf.ArraySpec) -> Callable[[tuple], np.ndarray]:
  """`read(index)`: the slice `index` of a param, copied out of the file mapped for that read alone: the
  pages it maps (file-backed, yet counted in RSS) are unmapped before JAX copies the slice to a device."""
  def read(index) -> np.ndarray:
    with _open(path) as f:
      return _read(f.get_slice(spec.path), spec, index)
  return read


def _read(tensor, spec: mf.ArraySpec, index) -> np.ndarray:
  """The slice `index` of a memory-mapped tensor, copied out (only its bytes are read)."""
  value = tensor[index]
  value = np.asarray(value).reshape(value.shape)
  if spec.dtype in _AS_PARTS:   # (real, imag) pairs: a view, so that inf and NaN parts stay as written
    return np.ascontiguousarray(value).view(spec.dtype).reshape(value.shape[:-1])
  return value if value.dtype == spec.dtype else value.view(spec.dtype)   # bfloat16 comes as its bits


def _check_keys(path: str, keys: set, want: list[str]) -> None:
  if keys != set(want):
    extra, missing = sorted(keys - set(want)), sorted(set(want) - keys)
    raise ArtifactError(f"{path}: its tensors do not match the manifest's params (missing: "
                        f"{', '.join(missing) or 'none'}; not listed: {', '.join(extra) or 'none'}); {mf.REEXPORT}.")


def _check_spec(path: str, spec: mf.ArraySpec, shape: tuple, st_dtype: str) -> None:
  dtype = _ST_DTYPES.get(st_dtype, st_dtype.lower())
  if spec.dtype in _AS_PARTS and shape[-1:] == (2,) and dtype == _AS_PARTS[spec.dtype].name:
    shape, dtype = shape[:-1], spec.dtype.name
  if shape != spec.shape or dtype != spec.dtype.name:
    raise ArtifactError(f"{path}: tensor {spec.path!r} is {dtype}{list(shape)}, the manifest says "
                        f"{spec.dtype.name}{list(spec.shape)}; {mf.REEXPORT}.")


def _first_line(error: BaseException, limit: int = 200) -> str:
  text = (str(error).strip().splitlines() or [""])[0]
  return text if len(text) <= limit else text[:limit - 3] + "..."
