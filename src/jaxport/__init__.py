"""jaxport: move TensorFlow work into JAX.

`import jaxport as tf2jax` works for code written against tf2jax.

`jaxport.flax` (converted functions as Flax NNX modules) is optional: it is imported only by
`import jaxport.flax` and needs `pip install 'jaxport[flax]'`.
"""
from jaxport.artifact import LoadedFunction, export, load
from jaxport.composite import RaggedArrays, SparseArrays
from jaxport.config import get_config, override_config, override_configs, update_config
from jaxport.convert import (ConvertedFunction, Variable, convert, convert_from_restored,
                             convert_functional, convert_functional_from_restored,
                             get_unsupported_operations)
from jaxport.convert.graph_def import convert_functional_graph_def, convert_graph_def
from jaxport.convert.inspect import InspectReport, inspect
from jaxport.errors import (ArtifactError, AssertionFailedError, ConfigError, DeviceMismatchError, DtypeCastWarning,
                            DtypeMismatchError, DynamicLoopError, DynamicShapeError, JaxportError, MissingInputError,
                            PaddedSizeError, RunTimeBranchWarning, ShapeMismatchError, ShardedArrayError, SignatureError,
                            StableHLOError,
                            StaticArgumentError, UnsupportedOperationsError, UnsupportedValueError, X64NarrowingWarning,
                            X64OverflowError, ZeroCopyError)
from jaxport.interop import shares_memory, to_cupy, to_jax, to_numpy, to_tf, to_torch
from jaxport.sharding import fsdp_shardings, shard_params
from jaxport.xla_options import jit

__version__ = "0.1.0"

__all__ = [
    "convert", "convert_functional", "convert_from_restored", "convert_functional_from_restored",
    "convert_graph_def", "convert_functional_graph_def",
    "inspect", "InspectReport", "jit",
    "export", "load", "LoadedFunction", "ArtifactError", "fsdp_shardings", "shard_params",
    "get_unsupported_operations", "get_config", "update_config", "override_config", "override_configs",
    "MissingInputError", "UnsupportedOperationsError", "ShapeMismatchError", "DtypeMismatchError",
    "SignatureError", "JaxportError", "ConvertedFunction", "Variable",
    "to_jax", "to_torch", "to_tf", "to_numpy", "to_cupy", "shares_memory",
    "ZeroCopyError", "DeviceMismatchError", "ShardedArrayError", "AssertionFailedError", "StableHLOError",
    "ConfigError", "DtypeCastWarning", "StaticArgumentError", "UnsupportedValueError",
    "DynamicShapeError", "DynamicLoopError", "PaddedSizeError", "X64NarrowingWarning", "X64OverflowError",
    "RunTimeBranchWarning", "SparseArrays", "RaggedArrays",
]
