"""Host-side batches: checked flattening, stacking examples, and the last-batch policy."""
import dataclasses
import itertools
import math
import time
from typing import Any, Iterable, Iterator, Literal

import numpy as np
from jax.tree_util import tree_flatten, tree_flatten_with_path

from jaxport.data._leaves import aligned_empty, check_leaf, dtype_of, host_view, leading_dim, path_str

LastBatch = Literal["drop", "pad", "partial"]
LAST_BATCH_POLICIES = ("drop", "pad", "partial")


@dataclasses.dataclass
class Flat:
  """One element of the source, flattened: checked leaves, their key paths, and the leading
  dimension they share (None for single examples)."""
  treedef: Any
  paths: tuple[tuple, ...]
  leaves: list[Any]
  size: int | None


def flatten(tree: Any, *, batched: bool) -> Flat:
  """Flattens and checks one element; batched elements must agree on their leading dimension."""
  leaves, treedef = tree_flatten(tree)
  if not leaves:
    raise ValueError(f"jaxport.data: the source yielded an element without array leaves: {tree!r}")
  paths = _paths(treedef, tree)
  leaves = [check_leaf(path, leaf) for path, leaf in zip(paths, leaves)]
  return Flat(treedef, paths, leaves, batch_rows(paths, leaves) if batched else None)


def batch_rows(paths: tuple[tuple, ...], leaves: list[Any]) -> int:
  """The leading (batch) dimension that every leaf of a batch shares."""
  sizes = [leading_dim(leaf) for leaf in leaves]
  for path, size in zip(paths, sizes):
    if size is None:
      raise ValueError(f"jaxport.data: leaf {path_str(path)} of a batch is a scalar; every leaf "
                       "of a batch needs the batch dimension first. If the source yields single "
                       "examples, pass batch_size=.")
    if size != sizes[0]:
      raise ValueError(f"jaxport.data: leaf {path_str(path)} has {size} rows but "
                       f"{path_str(paths[0])} has {sizes[0]}; all leaves of a batch must share "
                       "the leading (batch) dimension.")
  return sizes[0]


_known_paths: dict[Any, tuple[tuple, ...]] = {}


def _paths(treedef: Any, tree: Any) -> tuple[tuple, ...]:
  """Key paths of the leaves of `tree`, computed once per structure."""
  paths = _known_paths.get(treedef)
  if paths is None:
    paths = tuple(path for path, _ in tree_flatten_with_path(tree)[0])
    if len(_known_paths) < 1024:
      _known_paths[treedef] = paths
  return paths


def stack(examples: list[Flat], pool: Any = None) -> Flat:
  """Stacks examples into one batch, in host buffers that JAX can alias (lent by `pool`, a
  `_host_pool.HostPool`, if given)."""
  first = examples[0]
  for number, example in enumerate(examples[1:], 1):
    if example.treedef != first.treedef:
      raise ValueError(f"jaxport.data: example {number} of a batch has structure {example.treedef}, "
                       f"but the first has {first.treedef}.")
  leaves = []
  for index, path in enumerate(first.paths):
    views = [host_view(example.leaves[index]) for example in examples]
    shape, dtype = views[0].shape, views[0].dtype
    for view in views[1:]:
      if view.shape != shape:
        raise TypeError(f"jaxport.data: leaf {path_str(path)} is ragged: examples of one batch "
                        f"have shapes {shape} and {view.shape}. Pad them to a common shape in the "
                        "source, or batch them there with padding.")
    out = (aligned_empty((len(views),) + shape, dtype) if pool is None
           else pool.take((len(views),) + shape, dtype))
    np.stack(views, out=out)
    leaves.append(out)
  return Flat(first.treedef, first.paths, leaves, len(examples))


def batch_examples(examples: Iterable[Any], batch_size: int, clock: Any = None) -> Iterator[Flat]:
  """Groups a stream of examples into batches; the last one may be short. The time spent
  flattening and stacking is added to `clock.transform` (a `_stats.StageClock`), if given."""
  iterator = iter(examples)
  while chunk := list(itertools.islice(iterator, batch_size)):
    began = time.perf_counter()
    batch = stack([flatten(example, batched=False) for example in chunk],
                  clock.pool if clock is not None else None)
    if clock is not None:
      clock.transform += time.perf_counter() - began
    yield batch


@dataclasses.dataclass
class BatchLayout:
  """What every local batch of a stream looks like, learned from its first batch.

  Kept across epochs and in the resume state: a stream resumed on its short last batch still
  knows the full size.
  """
  size: int | None = None
  treedef: Any = None
  paths: tuple[tuple, ...] = ()
  shapes: tuple[tuple[int, ...], ...] = ()
  dtypes: tuple[np.dtype, ...] = ()

  def learn(self, batch: Flat) -> None:
    if self.size is None:
      self.size = batch.size
    if self.treedef is None:
      self.treedef, self.paths = batch.treedef, batch.paths
      self.shapes = tuple(tuple(int(d) for d in leaf.shape[1:]) for leaf in batch.leaves)
      self.dtypes = tuple(dtype_of(leaf) for leaf in batch.leaves)

  def empty(self) -> Flat:
    """A batch of zeros, for a process that has run out of examples before the others."""
    if self.treedef is None:
      raise RuntimeError("jaxport.data: this process received no data at all, so it cannot build "
                         "padding batches for the steps the other processes still run.")
    leaves = [aligned_empty((self.size,) + shape, dtype, zero=True)
              for shape, dtype in zip(self.shapes, self.dtypes)]
    return Flat(self.treedef, self.paths, leaves, self.size)


def pad(batch: Flat, size: int) -> Flat:
  leaves = []
  for leaf in batch.leaves:
    view = host_view(leaf)
    out = aligned_empty((size,) + view.shape[1:], view.dtype, zero=True)
    out[:view.shape[0]] = view
    leaves.append(out)
  return Flat(batch.treedef, batch.paths, leaves, size)


def apply_last_batch(batches: Iterable[Flat], *, policy: LastBatch, layout: BatchLayout,
                     steps: int | None, start: int) -> Iterator[tuple[int, Flat, np.ndarray | None]]:
  """Yields (step, batch, mask) from local step `start`; `mask` is None unless policy == "pad".

  `steps` is the number of steps every process must yield per epoch (None when there is one
  process: the stream then ends with the source). Only the last batch of a source may be short.
  """
  iterator = iter(batches)
  step = start
  while steps is None or step < steps:
    current = next(iterator, None)
    if current is None:
      break
    layout.learn(current)
    full = layout.size
    if current.size > full:
      raise ValueError(f"jaxport.data: batch {step} has {current.size} rows, more than the batch "
                       f"size {full} set by the first batch.")
    mask = None
    if current.size < full:
      # Only a short batch looks ahead: it must be the last one.
      if (steps is None or step + 1 < steps) and next(iterator, None) is not None:
        raise ValueError(f"jaxport.data: batch {step} has {current.size} rows but the batch size is "
                         f"{full}; only the last batch of an epoch may be short.")
      if policy == "drop":
        if steps is not None:
          raise RuntimeError(
              f"jaxport.data: with last_batch='drop', the short batch at step {step} of this "
              "process cannot be dropped without the other processes also dropping a step. Batch "
              "with drop_remainder=True in the source, pass single examples with batch_size=, or "
              "use last_batch='pad'.")
        return
      if policy == "pad":
        mask = _mask(full, current.size)
        current = pad(current, full)
    elif policy == "pad":
      mask = _mask(full, full)
    yield step, current, mask
    step += 1
  if steps is None or math.isinf(steps):
    return
  if step < steps and policy != "pad":
    raise RuntimeError(
        f"jaxport.data: this process ran out of data after {step} of the {steps} steps that every "
        "process must run per epoch. Every process must see the same source; with uneven shards "
        "use last_batch='pad'.")
  for step in range(step, steps):
    yield step, layout.empty(), _mask(layout.size, 0)


def _mask(size: int, valid: int) -> np.ndarray:
  mask = aligned_empty((size,), np.bool_, zero=True)
  mask[:valid] = True
  return mask


def steps_per_epoch(count: float | None, *, examples: bool, local_batch: int | None, policy: LastBatch,
                    processes: int, loader_shards: bool, last_short: bool | None) -> float | None:
  """How many batches each process yields per epoch, or None when that is unknown.

  `count` is the number of source elements (examples when `examples`, batches otherwise) that
  the loader sees: the whole source when it shards it across `processes` itself
  (`loader_shards`), else this process's part. `math.inf` for endless sources.
  """
  if count is None or math.isinf(count):
    return count
  count = int(count)
  fewest, most = (count // processes, -(-count // processes)) if loader_shards else (count, count)
  if examples:
    return fewest // local_batch if policy == "drop" else -(-most // local_batch)
  if policy != "drop":
    return most
  if processes > 1:
    return fewest
  return None if last_short is None else count - int(last_short)
