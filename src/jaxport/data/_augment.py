"""Per-example random keys, so that random augmentation resumes exactly (as clu and grain do).

A random op that draws from a hidden state (`tf.random.uniform`, `tf.image.random_flip_*`, a
global NumPy generator) cannot be checkpointed: after a restore it draws other numbers. Here each
example instead gets its own key, a pure function of (seed, epoch, index), that stateless random
ops consume; replaying an example replays its augmentation.

- tf.data: `example_keys(dataset, seed)` pairs each element with an int64 `[2]` seed for
  `tf.random.stateless_*` / `tf.image.stateless_random_*`.
- Python transforms: `example_rng(seed, epoch, index)` (a NumPy Generator), `example_key(...)`
  (a JAX key), and `example_rng_map(fn, seed)` for index-aware maps (grain's `map_with_index`, a
  random-access source's `__getitem__`).
"""
import sys
from typing import Any, Callable

import numpy as np

# TF ops that draw from a hidden random state (stateless and counter-based ops are fine).
STATEFUL_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "RandomCrop", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "StatefulUniform", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngReadAndSkip", "RngSkip",
    "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2", "NonDeterministicInts",
})
_MAX = 2**63


def _check(name: str, value: Any, limit: int = _MAX) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < limit:
    raise ValueError(f"jaxport.data: {name} must be an int in [0, {limit}), not {value!r}.")
  return int(value)


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
  """A NumPy Generator for example `index` of `epoch`: the same triple, the same numbers.

  Hashed by NumPy's SeedSequence, so neighbouring seeds, epochs and indices give independent
  streams. Costs ~20 µs.
  """
  entropy = [_check("seed", seed), _check("epoch", epoch), _check("index", index)]
  return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))


def example_key(seed: int, epoch: Any, index: Any) -> Any:
  """A JAX PRNG key (`jax.random.key`) for example `index` of `epoch`. `epoch` and `index` may
  be traced integer arrays (below 2**32); a Python `seed` may use all 63 bits."""
  import jax  # pylint: disable=import-outside-toplevel
  seed = _check("seed", seed)
  for name, value in (("epoch", epoch), ("index", index)):
    if isinstance(value, (int, np.integer)):
      _check(name, value, 2**32)
  key = jax.random.fold_in(jax.random.key(seed % 2**32), seed >> 32)
  return jax.random.fold_in(jax.random.fold_in(key, epoch), index)


def example_rng_map(fn: Callable[[Any, np.random.Generator], Any], seed: int, *,
                    epoch: int = 0) -> Callable[[int, Any], Any]:
  """`fn(element, rng)` as `g(index, element)`, with `rng = example_rng(seed, epoch, index)`.

  For maps that know each element's index. grain's `MapDataset.map_with_index(g)`: the loader
  reads a MapDataset at `epoch * len + i`, so with the default epoch=0 each epoch already gets
  fresh keys. A `jaxport.data.RandomAccess` source's `__getitem__(i)` can return `g(i, data[i])`,
  `g` made for the epoch the loader is in (`loader.epoch`, set before each epoch's loop; the
  loader reads no further ahead than the current epoch).
  """
  seed, epoch = _check("seed", seed), _check("epoch", epoch)

  def with_rng(index: int, element: Any) -> Any:
    return fn(element, example_rng(seed, epoch, index))
  return with_rng


def example_keys(dataset: Any, seed: int, epoch: int | None = None) -> Any:
  """`dataset` as `(key, element)` pairs: `key` an int64 `[2]` seed for `tf.random.stateless_*`
  and `tf.image.stateless_random_*`, a function of (seed, epoch, index of the element).

      ds = jaxport.data.example_keys(ds, seed=0).map(
          lambda key, x: tf.image.stateless_random_flip_left_right(x, key))

  With `epoch=None` (the default) every iteration of the dataset (every epoch of a loader) gets
  fresh keys: the epoch part comes from `tf.data.Dataset.random(seed,
  rerandomize_each_iteration=True)`, whose position and per-iteration reseeding tf.data saves
  with its iterator, so that `Loader.state()`/`restore()` resumes the same keys (it depends on
  TF's global seed too, if one is set). With an int `epoch`, the keys of each iteration are the
  same: for pipelines rebuilt per epoch, or augmentation fixed once for all epochs.

  Keys follow the element's index at this point of the pipeline: apply `example_keys` before a
  shuffle to tie each example's augmentation to the example rather than to its position.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  seed = _check("seed", seed)
  base = tf.constant([seed >> 32, seed % 2**32], tf.int64)
  fold = tf.random.experimental.stateless_fold_in
  if epoch is not None:
    epoch_key = fold(base, tf.constant(_check("epoch", epoch), tf.int64))
    return dataset.enumerate().map(lambda index, element: (fold(epoch_key, index), element))
  # One draw per element of a stream reseeded on each iteration: the epoch, and the position in
  # it; the index, folded in too, keeps keys distinct even where two draws collide.
  draws = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
  return tf.data.Dataset.zip(dataset.enumerate(), draws).map(
      lambda indexed, draw: (fold(fold(base, draw), indexed[0]), indexed[1]))


def stateful_random_ops(dataset: Any) -> list[str]:
  """The op types of `STATEFUL_RANDOM_OPS` that `dataset`'s pipeline runs (in its map, filter,
  ... functions), sorted: these make the pipeline impossible to checkpoint; `example_keys` with
  stateless ops replaces them."""
  tf = sys.modules.get("tensorflow")
  if tf is None or not isinstance(dataset, tf.data.Dataset):
    return []
  from jaxport.data import _tf_compat  # pylint: disable=import-outside-toplevel
  return sorted(_tf_compat.pipeline_ops(tf, dataset) & STATEFUL_RANDOM_OPS)

