"""Random-access sources: anything with `__len__` and `__getitem__`, read by global position.

An epoch is a global order of the source's indices: the identity, or a permutation keyed by
(seed, epoch), nothing kept between epochs but the seed: a numpy Philox permutation drawn at the
epoch's start up to 2**24 items, and beyond, one computed per position (`IndexShuffle`: O(1)
memory and time per index, whatever the length). Global step s covers the positions
[s * B, (s + 1) * B) of that order, B being the global batch; process i of P takes positions
i, i + P, ... of them. So a state is only (epoch, step): resuming reads nothing
before the step (O(1)), and P may change between save and restore (`elastic`): the new processes
re-split the same global positions. The loader's last_batch policy pads the epoch's last step.

Which objects are random-access: `RandomAccess(x)` (the explicit opt-in, since lists and arrays
are iterated as streams of examples or batches otherwise), grain MapDatasets, grain's data sources
(ArrayRecordDataSource, RangeDataSource, SharedMemoryDataSource), array_record's and tfds's data
sources (`tfds.data_source`); detected by type, never by the mere presence of `__getitem__`.
"""
import concurrent.futures
import sys
import time
from typing import Any, Iterator

import numpy as np

from jaxport.data._batches import Flat, flatten, stack
from jaxport.data._sources import Source
from jaxport.data._state import is_int
from jaxport.errors import LoaderStateError

_MODULES = ("array_record.", "tensorflow_datasets.core.data_sources")  # their data sources' types
_GRAIN_SOURCES = ("ArrayRecordDataSource", "RangeDataSource", "SharedMemoryDataSource")


class RandomAccess:
  """Marks `source` (with `__len__` and `__getitem__`) to be read by index, not iterated.

  Args:
    source: the examples (or, with the loader's batch_size=None, the batches) by index.
    shuffle: a fresh global order each epoch, drawn from (seed, epoch).
    seed: the shuffle's seed; None: the loader's `seed=`, else a random one (kept in the state).
    read_threads: read each batch's items with this many threads (order kept); 0: in the
      loader's prefetch thread. Helps when `__getitem__` waits on I/O or releases the GIL.
  """

  def __init__(self, source: Any, *, shuffle: bool = True, seed: int | None = None,
               read_threads: int = 0):
    if not (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
      raise TypeError(f"jaxport.data.RandomAccess: the source needs __len__ and __getitem__; "
                      f"{type(source).__name__} lacks them. Pass an iterable to loader() directly.")
    if seed is not None and not is_int(seed):
      raise TypeError(f"jaxport.data.RandomAccess: seed must be an int or None, not {seed!r}.")
    if not is_int(read_threads) or read_threads < 0:
      raise ValueError(f"jaxport.data.RandomAccess: read_threads must be an int >= 0, not "
                       f"{read_threads!r}.")
    self.source, self.shuffle, self.seed, self.read_threads = source, shuffle, seed, read_threads
    # grain's MapDataset convention: index // len(ds) is the epoch (its shuffles and random maps
    # reseed per epoch), so epoch e reads indices e * n + i.
    grain = sys.modules.get("grain")
    self.epoch_indices = grain is not None and isinstance(source, grain.MapDataset)


def random_access_source(source: Any, *, batch_size: int | None, processes: int, index: int,
                         shard: bool, seed: int | None, prefetch: int) -> Source | None:
  """The Source for a random-access or grain `source`; None for any other object."""
  grain = sys.modules.get("grain")
  if grain is not None:
    if isinstance(source, grain.MapDataset):
      source = RandomAccess(source, shuffle=False)  # in grain's order (its own shuffles)
    elif isinstance(source, (grain.IterDataset, grain.DataLoader)):
      from jaxport.data._grain import GrainSource  # pylint: disable=import-outside-toplevel
      return GrainSource(source, batch_size=batch_size, processes=processes, index=index,
                         shard=shard, prefetch=prefetch)
  if not isinstance(source, RandomAccess) and _is_data_source(source, grain):
    source = RandomAccess(source, shuffle=False)
  if isinstance(source, RandomAccess):
    return RandomAccessSource(source, batch_size=batch_size, processes=processes, index=index,
                              shard=shard, seed=seed)
  return None


def _is_data_source(source: Any, grain: Any) -> bool:
  kind = type(source)
  if grain is not None and any(isinstance(source, getattr(grain.sources, name, ()))
                               for name in _GRAIN_SOURCES):
    return True
  return kind.__module__.startswith(_MODULES) and hasattr(source, "__getitem__")


_TABLE_MAX = 1 << 24  # longer sources are shuffled per position (64 MiB of int32 tables here)
_ROUNDS = 8
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio, odd
_THIRTY_TWO = np.uint64(32)


class IndexShuffle:
  """A pseudo-random permutation of range(n) keyed by (seed, epoch), evaluated per position: an
  8-round unbalanced Feistel network over [0, 2**bits), the smallest power of two >= n (each round
  moves the low part up and adds to the high part a multiplicative hash of the low part and the
  round key), cycle-walked back into range(n) (under 2 passes on average), so no table of n
  entries is ever built. A statistical shuffle, not a cryptographic one."""

  def __init__(self, n: int, seed: int, epoch: int):
    bits = max(2, (n - 1).bit_length())
    keys = np.random.SeedSequence([seed, epoch]).generate_state(_ROUNDS, np.uint64)
    self._rounds = []  # (key, low bits, high bits) of each round; the split alternates
    low = bits // 2
    for key in keys:
      self._rounds.append((key, np.uint64(low), np.uint64(bits - low),
                           np.uint64((1 << low) - 1), np.uint64((1 << (bits - low)) - 1)))
      low = bits - low
    self._n = np.uint64(n)

  def __call__(self, positions: np.ndarray) -> np.ndarray:
    out = self._encrypt(np.asarray(positions, np.uint64))
    outside = out >= self._n
    while outside.any():  # walk the cycle until back in range(n)
      out = np.where(outside, self._encrypt(out), out)
      outside = out >= self._n
    return out.astype(np.int64)

  def _encrypt(self, x: np.ndarray) -> np.ndarray:
    for key, low, high, low_mask, high_mask in self._rounds:
      rest = x & low_mask
      mixed = ((rest ^ key) * _MULTIPLIER >> _THIRTY_TWO) & high_mask
      x = (rest << high) | ((x >> low) ^ mixed)
    return x


class RandomAccessSource(Source):
  """Reads a `RandomAccess` by global position; see the module docstring."""
  kind = "random_access"

  def __init__(self, spec: RandomAccess, *, batch_size: int | None, processes: int, index: int,
               shard: bool, seed: int | None):
    self._spec, self._source = spec, spec.source
    self._length = len(spec.source)
    self.examples = batch_size is not None
    self.loader_shards = shard
    # Re-splittable over another process count when the global step is a whole number of
    # examples of the source (not of batches the source made).
    self.elastic = self.examples and shard
    self._per_process = batch_size or 1
    self._processes, self._index = (processes, index) if shard else (1, 0)
    self._seed = (spec.seed if spec.seed is not None else seed) if spec.shuffle else None
    if spec.shuffle and self._seed is None:
      self._seed = int(np.random.SeedSequence().entropy % 2**63)
    self._pool: concurrent.futures.ThreadPoolExecutor | None = None
    self._table: tuple[int, np.ndarray] | None = None  # (epoch, its permutation)

  def count(self) -> float | None:
    return self._length

  def order(self, epoch: int) -> Any:
    """The epoch's global order, a function position -> index (None: the identity): a table
    drawn once per epoch up to _TABLE_MAX items, an `IndexShuffle` beyond."""
    if not self._spec.shuffle:
      return None
    if self._length > _TABLE_MAX:
      return IndexShuffle(self._length, self._seed, epoch)
    if self._table is None or self._table[0] != epoch:
      generator = np.random.Generator(np.random.Philox(np.random.SeedSequence([self._seed, epoch])))
      self._table = (epoch, generator.permutation(self._length).astype(np.int32))
    return self._table[1].__getitem__

  def global_batch(self) -> int:
    """Source items per global step."""
    return self._per_process * self._processes

  def batches(self, epoch: int, start: int) -> Iterator[Flat]:
    order, width = self.order(epoch), self.global_batch()
    offset = epoch * self._length if self._spec.epoch_indices else 0
    step = start
    while True:
      positions = np.arange(step * width + self._index, min((step + 1) * width, self._length),
                            self._processes)
      if not positions.size:
        return
      indices = (order(positions) if order is not None else positions) + offset
      items = self._read([int(i) for i in indices])
      began = time.perf_counter()
      if self.examples:
        batch = stack([flatten(item, batched=False) for item in items],
                      getattr(self.clock, "pool", None))
      else:
        batch = flatten(items[0], batched=True)
      if self.clock is not None:
        self.clock.transform += time.perf_counter() - began
      yield batch
      step += 1

  def _read(self, indices: list[int]) -> list[Any]:
    threads = self._spec.read_threads
    if threads and len(indices) > 1:
      if self._pool is None:
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, "jaxport-data-read")
      items = list(self._pool.map(self._source.__getitem__, indices))
    else:
      items = [self._source[i] for i in indices]
    for i, item in zip(indices, items):
      if item is None:
        raise ValueError(f"jaxport.data: the random-access source returned None for index {i} "
                         "(a grain MapDataset.filter drops elements that way). A filtered "
                         "dataset has no fixed positions: filter in the source, or pass "
                         "dataset.to_iter_dataset() to the loader.")
    return items

  def __del__(self):
    pool = getattr(self, "_pool", None)
    if pool is not None:
      pool.shutdown(wait=False)

  def record(self, epoch: int, step: int) -> Any:
    return {"seed": self._seed, "length": self._length, "position": step * self.global_batch()}

  def load(self, epoch: int, step: int, record: Any) -> None:
    if not isinstance(record, dict) or set(record) != {"seed", "length", "position"}:
      raise LoaderStateError("source_state", "expected a dict with 'seed', 'length' and "
                             f"'position', found {record!r:.80}.")
    for key in ("seed", "length", "position"):
      if not is_int(record[key]) and not (key == "seed" and record[key] is None):
        raise LoaderStateError(f"source_state.{key}", f"expected an int, found {record[key]!r}.")
    if record["length"] != self._length:
      raise LoaderStateError("source_state.length", f"the state comes from a source of "
                             f"{record['length']} items, this one has {self._length}; restore "
                             "into a loader over the same source.")
    if record["position"] != step * self.global_batch():
      raise LoaderStateError("source_state.position", f"position {record['position']} is not "
                             f"step {step} times the global batch of {self.global_batch()} items "
                             "here: the state was saved with another batch layout. Restore with "
                             "the same global batch_size.")
    if (record["seed"] is None) != (self._seed is None):
      raise LoaderStateError("source_state.seed", "the state comes from a source that shuffles "
                             "differently; restore into a loader over the same RandomAccess setup.")
    self._seed = record["seed"]
