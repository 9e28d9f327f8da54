"""Zero-copy tensor exchange between JAX, PyTorch, TensorFlow, NumPy and CuPy.

`to_jax`, `to_torch`, `to_tf`, `to_numpy` and `to_cupy` take an array of any of these
frameworks (or a DLPack capsule or producer, or a pytree of them) and share its memory where
the target can hold it, copying only where needed; `explain` says which and why;
`shares_memory` checks two arrays by buffer address. TensorFlow, PyTorch and CuPy are imported
only when one of their arrays is seen or they are the requested target.
"""
from jaxport.errors import DeviceMismatchError, ShardedArrayError, ZeroCopyError
from jaxport.interop._plan import Plan, Reason
from jaxport.interop.convert import (Shard, shares_memory, to_cupy, to_jax, to_numpy, to_tf,
                                     to_torch)
from jaxport.interop.explain import explain

__all__ = [
    "to_jax", "to_torch", "to_tf", "to_numpy", "to_cupy", "shares_memory", "explain", "Plan",
    "Reason", "Shard", "ZeroCopyError", "DeviceMismatchError", "ShardedArrayError",
]
