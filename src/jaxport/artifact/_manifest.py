"""`jaxport.json`, the manifest of an artifact: what it holds, checked field by field on load.

Everything read from the manifest is checked before use: the format and its version,
every field's type, dtypes against a fixed list, shapes, names, and the structures of
inputs and outputs. A failed check raises `ArtifactError` naming the file and the field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from typing import Any

import ml_dtypes
import numpy as np

from jaxport.artifact._structure import Structure
from jaxport.errors import ArtifactError

FORMAT = "jaxport.artifact"
FORMAT_VERSION = 1
MANIFEST = "jaxport.json"
FUNCTION_FILE = "function.jaxexport"   # jax.export's serialization (StableHLO and its VJP)
PARAMS_FILE = "params.safetensors"   # the params in one file, or split over shard files listed by PARAMS_INDEX
PARAMS_INDEX = "params.safetensors.index.json"   # {"metadata": {...}, "weight_map": {param: shard file}}
PAYLOADS = (FUNCTION_FILE, PARAMS_FILE)   # the files of an artifact whose params are one file
_SHARD_FILE = re.compile(r"params-(\d{5})-of-(\d{5})\.safetensors")
BATCH_DIM = "b"   # the name of the symbolic leading dimension of a batch-polymorphic export

# The dtypes an artifact may hold: NumPy names (complex128 params are stored as float64 pairs).
DTYPES = {name: np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}
DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)

REEXPORT = "export the model again with jaxport.export (or `jaxport convert`)"


def dtype_name(dtype) -> str:
  """The manifest's name of `dtype`; `ArtifactError` for a dtype an artifact cannot hold."""
  dt = np.dtype(dtype)
  if dt.name not in DTYPES:
    raise ArtifactError(f"dtype {dt.name} cannot be stored in an artifact (supported: {', '.join(DTYPES)}); "
                        "cast the array before exporting.")
  return dt.name


def sha256_bytes(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


_HASH_WINDOW = 32 << 20   # bytes mapped (and counted in RSS) per hash call; a multiple of mmap.ALLOCATIONGRANULARITY


def sha256_file(path: str) -> str:
  """The file's SHA-256, hashed from the page cache through 32 MiB memory-mapped windows (never the
  whole file in memory). Each window is one GIL-free hash call: a thread busy in Python beside it (export's
  lowering) makes every GIL round trip wait a switch interval, so hashlib's 256 KiB reads took 6 s for
  160 MB where this takes 0.15 s."""
  import mmap
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    for offset in range(0, size, _HASH_WINDOW):
      with mmap.mmap(f.fileno(), min(_HASH_WINDOW, size - offset), offset=offset,
                     access=mmap.ACCESS_READ) as window:
        digest.update(window)
  return digest.hexdigest()


def shard_file(index: int, count: int) -> str:
  """The name of params shard `index` (1-based) of `count`, as large checkpoints on model hubs name them."""
  return f"params-{index:05d}-of-{count:05d}.safetensors"


def params_files(names) -> tuple[str, ...] | None:
  """The params files among an artifact's `names`, in order: (PARAMS_FILE,), the shard files, or None
  when `names` is neither set (a missing or stray file)."""
  names = set(names)
  if names == set(PAYLOADS):
    return (PARAMS_FILE,)
  shards = sorted(n for n in names if _SHARD_FILE.fullmatch(n))
  count = len(shards)
  if count and names == {FUNCTION_FILE, PARAMS_INDEX, *shards} and shards == [shard_file(i + 1, count)
                                                                              for i in range(count)]:
    return tuple(shards)
  return None


def is_params_payload(name: str) -> bool:
  """Whether `name` is a params file or index an export may have written (stale ones are removed)."""
  return name in (PARAMS_FILE, PARAMS_INDEX) or bool(_SHARD_FILE.fullmatch(name))


@dataclasses.dataclass(frozen=True)
class ArraySpec:
  path: str                            # a parameter's name, or an input/output leaf's path
  shape: tuple[int | str, ...]         # str: a symbolic dimension ("b", or an expression for outputs)
  dtype: np.dtype

  def to_json(self, key: str = "path") -> dict:
    return {key: self.path, "shape": list(self.shape), "dtype": self.dtype.name}

  def shape_text(self) -> str:
    return "(" + ", ".join(map(str, self.shape)) + ("," if len(self.shape) == 1 else "") + ")"


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A checked manifest."""
  params: tuple[ArraySpec, ...]
  trainable: dict[str, bool]
  inputs: tuple[ArraySpec, ...]
  input_structure: Structure
  outputs: tuple[ArraySpec, ...]
  output_structure: Structure
  state_outputs: tuple[str, ...]       # the params the function updates, after the outputs
  rng: dict | None                     # {"impl", "shape", "dtype"} of the key data input
  platforms: tuple[str, ...]
  batch_polymorphic: bool
  files: dict[str, str]                # payload file -> SHA-256
  params_files: tuple[str, ...]        # (PARAMS_FILE,) or the shard files, in order
  name: str
  raw: dict[str, Any]                  # the whole manifest, e.g. its conversion report


class _Reader:
  """Typed access to the manifest's fields; each failure names the file and the field."""

  def __init__(self, path: str):
    self.path = path

  def error(self, message: str) -> ArtifactError:
    return ArtifactError(f"{self.path}: {message}; the manifest was edited or damaged: {REEXPORT}.")

  def get(self, obj, key: str, types, where: str):
    if not isinstance(obj, dict) or key not in obj:
      raise self.error(f"field {where}.{key} is missing")
    value = obj[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
      raise self.error(f"field {where}.{key} is {value!r}, of the wrong type")
    if not isinstance(value, types):
      raise self.error(f"field {where}.{key} is a {type(value).__name__}, of the wrong type")
    return value

  def array(self, obj, where: str, *, symbolic: str, key: str = "path") -> ArraySpec:
    """`symbolic`: "none" (static shapes), "batch" (the leading dim may be "b"), "any" (any expression)."""
    path = self.get(obj, key, str, where)
    shape = self.get(obj, "shape", list, where)
    for i, d in enumerate(shape):
      ok = (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or (
          isinstance(d, str) and (symbolic == "any" and d or (symbolic == "batch" and i == 0 and d == BATCH_DIM)))
      if not ok:
        raise self.error(f"field {where}.shape[{i}] = {d!r} is not a valid dimension")
    name = self.get(obj, "dtype", str, where)
    if name not in DTYPES:
      raise self.error(f"field {where}.dtype = {name!r} is not a dtype an artifact may hold ({', '.join(DTYPES)})")
    return ArraySpec(path, tuple(shape), DTYPES[name])


def read_manifest(directory: str) -> Manifest:
  """Reads and checks `directory/jaxport.json`."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.isdir(directory):
    raise ArtifactError(f"{directory} is not a directory; pass the directory that jaxport.export "
                        "(or `jaxport convert`) wrote.")
  if not os.path.isfile(path):
    raise ArtifactError(f"{path} is missing: {directory} is not a jaxport artifact (or its export did not "
                        f"finish); {REEXPORT}.")
  r = _Reader(path)
  try:
    with open(path, "rb") as f:
      raw = json.loads(f.read().decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise r.error(f"it is not valid JSON ({e})") from None
  if not isinstance(raw, dict):
    raise r.error("it is not a JSON object")
  if raw.get("format") != FORMAT:
    raise r.error(f"field format is {raw.get('format')!r}, expected {FORMAT!r}")
  version = r.get(raw, "format_version", int, "manifest")
  if version != FORMAT_VERSION:
    raise ArtifactError(f"{path}: format_version {version} is not the version this jaxport reads "
                        f"({FORMAT_VERSION}); load it with the jaxport release that wrote it "
                        f"({raw.get('made_by', {}).get('jaxport', 'unknown') if isinstance(raw.get('made_by'), dict) else 'unknown'}), "
                        f"or {REEXPORT}.")

  files = r.get(raw, "files", dict, "manifest")
  params_payloads = params_files(files)
  if params_payloads is None:
    raise r.error(f"field files lists {sorted(files)}, expected {sorted(PAYLOADS)} or {FUNCTION_FILE}, "
                  f"{PARAMS_INDEX} and {shard_file(1, 2)}, {shard_file(2, 2)}, ...")
  hashes = {}
  for name in files:
    digest = r.get(files[name], "sha256", str, f"files[{name!r}]")
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
      raise r.error(f"field files[{name!r}].sha256 is not a SHA-256 hex digest")
    hashes[name] = digest

  params, trainable = [], {}
  for i, entry in enumerate(r.get(raw, "params", list, "manifest")):
    spec = r.array(entry, f"params[{i}]", symbolic="none", key="name")
    if spec.path in trainable:
      raise r.error(f"parameter {spec.path!r} is listed twice")
    trainable[spec.path] = r.get(entry, "trainable", bool, f"params[{i}]")
    params.append(spec)

  batch_polymorphic = r.get(raw, "batch_polymorphic", bool, "manifest")
  inputs_obj = r.get(raw, "inputs", dict, "manifest")
  inputs = [r.array(e, f"inputs.leaves[{i}]", symbolic="batch" if batch_polymorphic else "none")
            for i, e in enumerate(r.get(inputs_obj, "leaves", list, "inputs"))]
  outputs_obj = r.get(raw, "outputs", dict, "manifest")
  outputs = [r.array(e, f"outputs.leaves[{i}]", symbolic="any" if batch_polymorphic else "none")
             for i, e in enumerate(r.get(outputs_obj, "leaves", list, "outputs"))]
  input_structure = Structure.read(r.get(inputs_obj, "structure", dict, "inputs"), len(inputs), r.error,
                                   "inputs.structure")
  output_structure = Structure.read(r.get(outputs_obj, "structure", dict, "outputs"), len(outputs), r.error,
                                    "outputs.structure")
  if input_structure.node.get("kind") != "tuple" or len(input_structure.node["items"]) != 2:
    raise r.error("field inputs.structure is not the pair (args, kwargs)")
  args_node, kwargs_node = input_structure.node["items"]
  if args_node.get("kind") != "tuple" or kwargs_node.get("kind") != "dict" \
      or not all(isinstance(k, str) for k in kwargs_node["keys"]):
    raise r.error("field inputs.structure is not the pair (args tuple, kwargs dict with str keys)")

  state_outputs = r.get(raw, "state_outputs", list, "manifest")
  if not all(isinstance(k, str) and k in trainable for k in state_outputs) or len(set(state_outputs)) != len(state_outputs):
    raise r.error("field state_outputs must name distinct parameters")

  rng = raw.get("rng")
  if rng is not None:
    impl = r.get(rng, "impl", str, "rng")
    shape = r.get(rng, "shape", list, "rng")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape) or \
        r.get(rng, "dtype", str, "rng") != "uint32":
      raise r.error("field rng must describe uint32 key data of a static shape")
    rng = {"impl": impl, "shape": tuple(shape), "dtype": np.dtype(np.uint32)}

  platforms = r.get(raw, "platforms", list, "manifest")
  if not platforms or not all(isinstance(p, str) and p for p in platforms) or len(set(platforms)) != len(platforms):
    raise r.error("field platforms must list distinct platform names")
  name = raw.get("name", "artifact")
  return Manifest(tuple(params), trainable, tuple(inputs), input_structure, tuple(outputs), output_structure,
                  tuple(state_outputs), rng, tuple(platforms), batch_polymorphic, hashes, params_payloads,
                  name if isinstance(name, str) else "artifact", raw)


def read_payload(directory: str, name: str, manifest: Manifest) -> bytes:
  """The bytes of a payload file, after checking them against the manifest's SHA-256."""
  path = os.path.join(directory, name)
  _exists(path)
  with open(path, "rb") as f:
    data = f.read()
  _check_digest(path, sha256_bytes(data), manifest.files[name])
  return data


def verify_payload(directory: str, name: str, manifest: Manifest) -> str:
  """The path of a payload file, after checking its SHA-256 (streamed: the file is not read into memory)."""
  path = os.path.join(directory, name)
  _exists(path)
  _check_digest(path, sha256_file(path), manifest.files[name])
  return path


def _exists(path: str) -> None:
  if not os.path.isfile(path):
    raise ArtifactError(f"{path} is missing (the manifest lists it); restore the file from where the artifact "
                        f"came from, or {REEXPORT}.")


def _check_digest(path: str, digest: str, recorded: str) -> None:
  if digest != recorded:
    raise ArtifactError(f"{path}: its SHA-256 is {digest[:16]}..., the manifest records "
                        f"{recorded[:16]}...: the file changed after export (damaged, truncated or "
                        f"replaced); restore the file the export wrote, or {REEXPORT}.")
