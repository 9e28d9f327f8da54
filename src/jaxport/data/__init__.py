"""Input pipelines feeding JAX: tf.data, PyTorch DataLoaders and any iterable of arrays.

    import jaxport.data
    for batch in jaxport.data.loader(dataset, batch_size=256, last_batch="pad"):
      state, metrics = train_step(state, batch)

Batches arrive as `jax.Array`s with the source's structure, moved without copies where the host
buffer allows it, prefetched by a background thread, optionally sharded over devices and
processes, and resumable through `Loader.state()` / `Loader.restore()`. TensorFlow and PyTorch
are imported only when a source uses them.
"""
from jaxport.data._augment import (example_key, example_keys, example_rng, example_rng_map,
                                   stateful_random_ops)
from jaxport.data._loader import Loader, loader
from jaxport.data._random_access import RandomAccess
from jaxport.data._sources import NotResumableError
from jaxport.data._stats import LoaderStats

__all__ = ["loader", "Loader", "LoaderStats", "NotResumableError", "RandomAccess",
           "example_keys", "example_rng", "example_key", "example_rng_map", "stateful_random_ops"]
