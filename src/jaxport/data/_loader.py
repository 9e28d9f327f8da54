"""The Loader: source -> checked host batches -> devices, prefetched in a thread, resumable."""
import itertools
import math
import time
from typing import Any, Iterator

import jax
from jax.tree_util import DictKey, tree_unflatten

from jaxport.data._batches import (LAST_BATCH_POLICIES, BatchLayout, LastBatch,
                                   steps_per_epoch)
from jaxport.data._host_pool import HostPool
from jaxport.data._prefetch import Feed
from jaxport.data import _state
from jaxport.data._sources import Source, make_source
from jaxport.data._stats import LoaderStats, Meter, ProgressBar, StageClock
from jaxport.data._transfer import DtypePolicy, DtypesSpec, Placer, resolve_sharding
from jaxport.errors import LoaderStateError

STATE_FORMAT = _state.STATE_FORMAT
MASK_KEY = "mask"
DEFAULT_PREFETCH_BYTES = 1 << 30  # 1 GiB read ahead at most, whatever `prefetch` says
_names = itertools.count()


class Loader:
  """Iterates a source as batches of `jax.Array`s with the source's nested structure.

  Each `for` loop over the loader is one epoch (a loop that stops early is continued by the next
  one). See `loader()` for the arguments.
  """

  def __init__(self, source: Any, *, batch_size: int | None = None, sharding: Any = None,
               prefetch: int = 2, dtypes: DtypesSpec = None, last_batch: LastBatch = "drop",
               shard_by_process: bool = True, seed: int | None = None,
               checkpoint_every: int | None = None, progress: bool = False,
               state: dict | None = None, prefetch_bytes: int | None = DEFAULT_PREFETCH_BYTES,
               torch_resume: str = "replay"):
    if last_batch not in LAST_BATCH_POLICIES:
      raise ValueError(f"jaxport.data: last_batch must be one of {LAST_BATCH_POLICIES}, not "
                       f"{last_batch!r}.")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
      raise ValueError(f"jaxport.data: prefetch must be a number of batches >= 0, not {prefetch!r}.")
    if prefetch_bytes is not None and (isinstance(prefetch_bytes, bool) or not isinstance(
        prefetch_bytes, int) or prefetch_bytes < 1):
      raise ValueError(f"jaxport.data: prefetch_bytes must be a number of bytes >= 1 or None, not "
                       f"{prefetch_bytes!r}.")
    self._prefetch_bytes = prefetch_bytes
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
      raise ValueError(f"jaxport.data: batch_size must be a positive int or None, not {batch_size!r}.")
    processes, index = jax.process_count(), jax.process_index()
    if last_batch == "partial" and processes > 1:
      raise ValueError("jaxport.data: last_batch='partial' would give the processes batches of "
                       "different sizes; with several processes use 'pad' (or 'drop').")
    local_batch = None
    if batch_size is not None:
      if batch_size % processes:
        raise ValueError(f"jaxport.data: the global batch_size {batch_size} does not split evenly "
                         f"over {processes} processes.")
      local_batch = batch_size // processes
    self._batch_size, self._last_batch, self._prefetch = batch_size, last_batch, prefetch
    self._processes, self._index = processes, index
    self._source: Source = make_source(
        source, batch_size=local_batch, processes=processes, index=index, shard=shard_by_process,
        drop_remainder=last_batch == "drop", seed=seed, checkpoint_every=checkpoint_every,
        prefetch=prefetch, prefetch_bytes=prefetch_bytes, torch_resume=torch_resume)
    self._layout = BatchLayout(size=local_batch)
    self._steps = steps_per_epoch(
        self._source.count(), examples=self._source.examples, local_batch=local_batch,
        policy=last_batch, processes=processes, loader_shards=self._source.loader_shards,
        last_short=self._source.last_short())
    if processes > 1 and self._steps is None and not self._source.steps_agreed_online:
      raise ValueError(
          f"jaxport.data: with {processes} processes every process must run the same number of "
          "steps, so the length of the source must be known. Give tf.data pipelines a known "
          "cardinality (e.g. dataset.apply(tf.data.experimental.assert_cardinality(n))), or use a "
          "source with len().")
    self._placer = Placer(resolve_sharding(sharding, processes))
    if self._placer.reuses_host_buffers:
      self._placer.pool = HostPool(keep=prefetch + 3)
    self._casts = DtypePolicy(dtypes)
    self._meter = Meter()
    self._bar = ProgressBar() if progress else None
    self._name = f"jaxport-data-prefetch-{next(_names)}"
    self._feed: Feed | None = None
    self._clock = StageClock()  # the open feed's producer's
    self._epoch, self._step = 0, 0
    self._exhausted = self._closed = False
    self._failure: Exception | None = None
    if state is not None:
      self.restore(state)

  # Iteration -------------------------------------------------------------------------------------

  def __iter__(self) -> "Loader":
    self._check_open()
    if self._exhausted:
      self._epoch, self._step, self._exhausted = self._epoch + 1, 0, False
    return self

  def __next__(self) -> Any:
    self._check_open()
    if self._exhausted:
      raise StopIteration
    if self._failure is not None:
      raise RuntimeError("jaxport.data: the source raised earlier in this epoch (see the cause); "
                         "restore() a saved state to continue.") from self._failure
    if self._feed is None:
      self._feed = self._open_feed()
    began = self._meter.begin_wait(self._feed.depth())
    try:
      step, batch, size = self._feed.get()
    except StopIteration:
      self._exhausted = True
      self._drop_feed()
      raise
    except Exception as error:
      self._failure = error
      self._drop_feed()
      raise
    self._meter.delivered(began, size)
    self._step = step + 1
    if self._bar is not None:
      self._bar.advance(self.stats())
    return batch

  def __len__(self) -> int:
    if self._steps is None or math.isinf(self._steps):
      raise TypeError("jaxport.data: the number of batches per epoch is unknown (or infinite) for "
                      "this source.")
    return int(self._steps)

  def _open_feed(self) -> Feed:
    self._clock = StageClock(self._placer.pool)
    items = _produce(self._source, self._epoch, self._step, policy=self._last_batch,
                     layout=self._layout, steps=self._steps if self._processes > 1 else None,
                     placer=self._placer, casts=self._casts, clock=self._clock)
    if self._bar is not None:
      self._bar.start(self._epoch, self._steps, self._step)
    # Copies to devices run in the background: a consumer waiting on data gets each batch once
    # the next one is read and its copy dispatched, so that copies overlap reading.
    lead = 1 if self._prefetch and self._placer.copies else 0
    return Feed(items, self._prefetch, self._name, max_bytes=self._prefetch_bytes,
                size_of=_host_bytes, lead=lead)

  def _drop_feed(self) -> None:
    if self._feed is not None:
      self._feed.close()
      self._feed = None
      self._meter.retire(self._clock)
    if self._bar is not None:
      self._bar.end_epoch()

  def _check_open(self) -> None:
    if self._closed:
      raise RuntimeError("jaxport.data: the loader is closed; create a new one (restore() its "
                         "state() to continue where it stopped).")

  # Lifecycle -------------------------------------------------------------------------------------

  def close(self) -> None:
    """Stops the prefetch thread and frees prefetched batches. Idempotent."""
    if self._closed:
      return
    self._closed = True
    self._drop_feed()
    if self._bar is not None:
      self._bar.close()

  def __enter__(self) -> "Loader":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  # Resume ----------------------------------------------------------------------------------------

  @property
  def epoch(self) -> int:
    return self._epoch + 1 if self._exhausted else self._epoch

  @property
  def step(self) -> int:
    """Batches of the current epoch delivered to the consumer."""
    return 0 if self._exhausted else self._step

  def state(self) -> dict:
    """A JSON-serialisable position: right after the last batch the consumer received.

    Batches already prefetched but not received are produced again after a restore. Cost of
    resuming: Python iterables and DataLoaders replay the epoch's earlier batches (read, not
    transferred; a DataLoader with `torch_resume="seek"` skips their sampler indices instead,
    loading nothing before the step); random-access and grain sources seek; tf.data restores the
    latest iterator snapshot at or before the step (taken as their cost allows, ~5% of reading
    time, or every `checkpoint_every` batches) and replays the
    few batches after it: about the same cost anywhere in the epoch. The state holds the
    pipeline's buffers (shuffle and prefetch), compressed.
    """
    epoch, step = self.epoch, self.step
    return _state.seal({
        "format": STATE_FORMAT,
        "source": self._source.kind,
        "epoch": epoch,
        "step": step,
        "batch_size": self._batch_size,
        "local_batch_size": self._layout.size,
        "last_batch": self._last_batch,
        "process_index": self._index,
        "process_count": self._processes,
        "source_state": self._source.record(epoch, step),
    })

  def restore(self, state: dict) -> None:
    """Continues from `state` (from `state()` of a loader over an identical source).

    An invalid, altered or foreign state raises `jaxport.errors.LoaderStateError` (a ValueError)
    naming the field at fault, before any of it is used.
    """
    self._check_open()
    _state.check(state, steps=self._steps)
    expected = {"source": self._source.kind, "batch_size": self._batch_size,
                "last_batch": self._last_batch, "process_index": self._index,
                "process_count": self._processes}
    elastic = self._source.elastic  # re-splits the saved global position over these processes
    if elastic:
      del expected["process_index"], expected["process_count"]
    different = {key: (state.get(key), value) for key, value in expected.items()
                 if state.get(key) != value}
    if different:
      details = ", ".join(f"{key}: saved {saved!r}, here {here!r}"
                          for key, (saved, here) in different.items())
      way_out = (" The process count may change on restore, the global batch_size may not."
                 if elastic and "batch_size" in different else "")
      raise LoaderStateError(next(iter(different)), f"the state was saved by a differently "
                             f"configured loader ({details}).{way_out}")
    saved_size = self._layout.size if elastic else state["local_batch_size"]
    if saved_size is not None and self._layout.size not in (None, saved_size):
      raise LoaderStateError("local_batch_size", f"the state's batches have {saved_size} rows per "
                             f"process, this loader's {self._layout.size}.")
    self._drop_feed()
    self._source.load(state["epoch"], state["step"], state["source_state"])
    self._layout.size = saved_size if saved_size is not None else self._layout.size
    self._epoch, self._step = state["epoch"], state["step"]
    self._exhausted, self._failure = False, None

  # Observability ---------------------------------------------------------------------------------

  def stats(self) -> LoaderStats:
    depth = self._feed.depth() if self._feed is not None else 0
    return self._meter.snapshot(depth, self._prefetch,
                                self._clock if self._feed is not None else None)

  @property
  def sharding(self) -> jax.sharding.Sharding | None:
    return self._placer.sharding


def _produce(source: Source, epoch: int, start: int, *, policy: LastBatch, layout: BatchLayout,
             steps: float | None, placer: Placer, casts: DtypePolicy,
             clock: StageClock) -> Iterator[tuple[int, Any, int]]:
  """(step, device batch, host bytes) for one epoch. Copies to devices are dispatched, never
  waited for: they complete while the next batches are read (and JAX orders any use of a batch
  after its copy). It may run in the prefetch thread, so it holds no reference to the Loader: the
  loader can be collected while it runs. Times its stages into `clock` (the source's readers add
  their transform time to it), a few µs per batch."""
  source.clock = clock
  began, transformed = time.perf_counter(), 0.0
  stream = source.steps(epoch, start, policy=policy, layout=layout, steps=steps)
  for step, batch, mask in stream:
    read = time.perf_counter()
    clock.source += read - began - (clock.transform - transformed)
    arrays, moved = placer.put_all(batch.paths, batch.leaves)
    targets = casts.targets(batch)
    if any(target is not None for target in targets):
      arrays = [array if target is None or array.dtype == target else array.astype(target)
                for array, target in zip(arrays, targets)]
    tree = tree_unflatten(batch.treedef, arrays)
    if mask is not None:
      tree = _with_mask(tree, placer.put((DictKey(MASK_KEY),), mask)[0])
    placer.lent(batch.leaves, arrays)
    clock.transfer += time.perf_counter() - read
    clock.batches += 1
    yield step, tree, moved
    began, transformed = time.perf_counter(), clock.transform


def _host_bytes(item: tuple[int, Any, int]) -> int:
  return item[2]


def _with_mask(tree: Any, mask: jax.Array) -> Any:
  """Adds the padding mask: as a "mask" key of a dict batch, else as `(batch, mask)`."""
  if isinstance(tree, dict):
    if MASK_KEY in tree:
      raise ValueError(f"jaxport.data: last_batch='pad' adds a {MASK_KEY!r} key, but the batch "
                       "already has one; rename it in the source.")
    return {**tree, MASK_KEY: mask}
  return tree, mask


def loader(source: Any, *, batch_size: int | None = None, sharding: Any = None, prefetch: int = 2,
           dtypes: DtypesSpec = None, last_batch: LastBatch = "drop", shard_by_process: bool = True,
           seed: int | None = None, checkpoint_every: int | None = None, progress: bool = False,
           state: dict | None = None,
           prefetch_bytes: int | None = DEFAULT_PREFETCH_BYTES,
           torch_resume: str = "replay") -> Loader:
  """Feeds JAX from a tf.data.Dataset, a torch DataLoader, or any iterable of (nested) arrays.

  Args:
    source: a `tf.data.Dataset`, a `torch.utils.data.DataLoader`, or an iterable/iterator whose
      elements are nested dicts/tuples/lists/namedtuples of NumPy, TensorFlow, PyTorch or JAX
      arrays (Python numbers too, for single examples).
    batch_size: None when the source already yields batches; else the source yields single
      examples and the loader batches them, `batch_size` being the global batch (over all
      processes). tf.data sources are then batched inside tf.data.
    sharding: a `jax.sharding.Sharding`, or a `(Mesh, PartitionSpec)` pair, for every leaf (a spec
      longer than a leaf's rank is cut to it). Batches become global arrays; with several
      processes each process contributes its own rows. Default: the default device with one
      process, the batch split over all devices with several.
    prefetch: batches a background thread reads ahead onto devices while the consumer works
      between batches (a consumer waiting on data reads them itself). Copies to an accelerator
      are never waited for: they run while the next batches are read, and with prefetch >= 1 a
      consumer waiting on data gets each batch once the next one is read and its copy started.
      Batches the loader stacks for an accelerator reuse host buffers once their copies are done.
      tf.data pipelines also get a tf.data prefetch stage of this size where tf.data would not
      inject one itself. 0: no thread, nothing read ahead.
    prefetch_bytes: also stop reading ahead once the batches read ahead hold this many bytes
      (host bytes; one batch is always allowed), so that a large `prefetch` of large batches
      cannot exhaust memory; tf.data's prefetch stage is shortened to fit when its element size
      is static. Default 1 GiB; None: bounded by `prefetch` only.
    dtypes: casts on device: a dtype (for every floating leaf), or a dict keyed by source dtype
      or by key path ("image", "features/image").
    last_batch: "drop" the short last batch, yield it "partial", or "pad" it to full size with
      zeros; "pad" adds a boolean mask leaf to every batch (a "mask" key of dict batches, else
      batches become `(batch, mask)`).
    shard_by_process: with several processes, each reads its own share of the source
      (`Dataset.shard`, or every n-th element of other sources). Set False when the source already
      yields this process's share (e.g. a DataLoader with a DistributedSampler is detected). A
      tf.data service read is never sharded: the service splits it (needs last_batch="pad").
    seed: seeds the shuffling order the loader owns: a DataLoader's RandomSampler that has no
      generator gets one, seeded per epoch, so that its order can be replayed.
    checkpoint_every: tf.data only: snapshot the tf.data iterator every n batches, so that
      resuming replays at most n batches (default: as often as the snapshots' measured cost
      allows, ~5% of the time spent reading).
    progress: show a rich progress bar.
    state: a `Loader.state()` to resume from (an invalid, altered or foreign state raises
      `jaxport.errors.LoaderStateError` naming the field).
    torch_resume: how a torch DataLoader resumes mid-epoch. "replay" (default) re-reads the epoch's
      earlier batches: exact for any dataset. "seek" (map-style datasets) skips their sampler
      indices without loading them, so restoring costs the same anywhere in the epoch; exact when
      an item depends only on its index (random augmentation keyed by
      `jaxport.data.example_rng(seed, epoch, index)`, not a global or per-worker generator, whose
      draws seeking skips).
  """
  return Loader(source, batch_size=batch_size, sharding=sharding, prefetch=prefetch, dtypes=dtypes,
                last_batch=last_batch, shard_by_process=shard_by_process, seed=seed,
                checkpoint_every=checkpoint_every, progress=progress, state=state,
                prefetch_bytes=prefetch_bytes, torch_resume=torch_resume)
