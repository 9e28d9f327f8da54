"""TF-free artifacts: convert once, run anywhere.

`export(jax_fn, params, *example_args, path=...)` writes a directory holding the function as
serialized StableHLO (`jax.export`), the params as safetensors and a JSON manifest `jaxport.json`;
`load(path)` gives `(fn, params)` back with `convert`'s calling convention, without TensorFlow,
pickle or any code read from the files; `load(path, sharding=...)` reads the params straight into
their shards (see `jaxport.sharding`). Big params are split over several files with an index.
"""
from jaxport.artifact._export import (FALLBACK_BATCH, BatchFallbackWarning, LoweredArtifact, conversion_report,
                                      example_inputs, export, lower)
from jaxport.artifact._load import LoadedFunction, load
from jaxport.artifact._manifest import (FORMAT_VERSION, FUNCTION_FILE, MANIFEST, PARAMS_FILE, PARAMS_INDEX,
                                        shard_file)
from jaxport.artifact._params import DEFAULT_MAX_SHARD_BYTES

__all__ = ["export", "load", "lower", "example_inputs", "conversion_report", "LoadedFunction", "LoweredArtifact",
           "BatchFallbackWarning", "FALLBACK_BATCH", "FORMAT_VERSION", "MANIFEST", "FUNCTION_FILE", "PARAMS_FILE",
           "PARAMS_INDEX", "shard_file", "DEFAULT_MAX_SHARD_BYTES"]
