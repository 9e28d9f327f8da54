"""Sources: tf.data datasets, PyTorch DataLoaders and plain iterables, read per process.

A source yields this process's local batches (checked and flattened) for one epoch, from a
given local step, and describes in JSON how a fresh copy of it resumes at that step.
"""
import base64
import collections.abc
import itertools
import math
import re
import sys
import threading
import time
import warnings
from typing import Any, Iterable, Iterator

import numpy as np

from jaxport.data import _tf_compat
from jaxport.data._batches import Flat, apply_last_batch, batch_examples, flatten
from jaxport.data._tf_read import (Retired, _ends_with_prefetch, _fitting, _read_with_next,  # noqa: F401
                                   _static_batch_size, _TensorReader, injects_prefetch)
from jaxport.data._state import is_int, past_the_end
from jaxport.errors import LoaderStateError


class NotResumableError(RuntimeError):
  """`Loader.state()`/`restore()` on a source whose position cannot be recovered."""


class Source:
  """Common interface; see the module docstring."""
  kind: str
  examples: bool  # yields single examples, which the loader batches
  loader_shards: bool  # the loader splits the source across processes (else it already is split)
  steps_agreed_online = False  # the processes agree on the step count while reading (length unknown)
  elastic: bool = False  # a state restores with another process count (same global batch)
  clock: Any = None  # the reading feed's _stats.StageClock (set by the loader): readers add
  # their host-side transform time (flattening, stacking) to clock.transform

  def count(self) -> float | None:
    """Elements per epoch (the whole source if `loader_shards`), inf if endless, None if unknown."""
    raise NotImplementedError

  def last_short(self) -> bool | None:
    """For batched sources: whether the last batch is short (None: unknown)."""
    return None

  def batches(self, epoch: int, start: int) -> Iterator[Flat]:
    raise NotImplementedError

  def steps(self, epoch: int, start: int, *, policy: Any, layout: Any,
            steps: float | None) -> Iterator[tuple[int, Flat, Any]]:
    """(step, batch, mask) of one epoch from local step `start`, the last batch handled by `policy`
    (`steps`: the step count every process runs, when several do)."""
    return apply_last_batch(self.batches(epoch, start), policy=policy, layout=layout, steps=steps,
                            start=start)

  def record(self, epoch: int, step: int) -> Any:
    """JSON data that lets a fresh source, given (epoch, step), continue from there."""
    return None

  def load(self, epoch: int, step: int, record: Any) -> None:
    """Prepares to resume `epoch` at `step` from `record` (made by `record()` of an identical
    source); LoaderStateError if `record` does not fit this source."""
    if record is not None:
      raise LoaderStateError("source_state", f"expected None for a {self.kind} source, found "
                             f"{type(record).__name__}.")


def make_source(source: Any, *, batch_size: int | None, processes: int, index: int, shard: bool,
                drop_remainder: bool, seed: int | None, checkpoint_every: int | None,
                prefetch: int, prefetch_bytes: int | None = None,
                torch_resume: str = "replay") -> Source:
  """The Source for `source`; `batch_size` is this process's batch size when it yields examples."""
  torch = sys.modules.get("torch")
  if torch_resume != "replay" and not (torch is not None and isinstance(
      source, torch.utils.data.DataLoader)):
    raise ValueError(f"jaxport.data: torch_resume={torch_resume!r} applies to torch DataLoaders "
                     "only; leave it at \"replay\" for this source.")
  tf = sys.modules.get("tensorflow")
  if tf is not None and isinstance(source, tf.data.Dataset):
    from jaxport.data import _tf_service  # pylint: disable=import-outside-toplevel
    jobs = _tf_service.service_jobs(source)
    if jobs:  # the service splits the data: never sharded here (see _tf_service)
      return _tf_service.TFServiceSource(
          source, jobs, batch_size=batch_size, processes=processes, index=index,
          drop_remainder=drop_remainder, checkpoint_every=checkpoint_every, prefetch=prefetch,
          prefetch_bytes=prefetch_bytes)
    return TFDataSource(source, batch_size=batch_size, processes=processes, index=index, shard=shard,
                        drop_remainder=drop_remainder, checkpoint_every=checkpoint_every,
                        prefetch=prefetch, prefetch_bytes=prefetch_bytes)
  if checkpoint_every is not None:
    raise ValueError("jaxport.data: checkpoint_every= applies to tf.data sources only; other "
                     "sources resume by replaying batches.")
  if torch is not None and isinstance(source, torch.utils.data.DataLoader):
    return TorchSource(source, batch_size=batch_size, processes=processes, index=index, shard=shard,
                       seed=seed, resume=torch_resume)
  from jaxport.data import _random_access  # pylint: disable=import-outside-toplevel
  found = _random_access.random_access_source(
      source, batch_size=batch_size, processes=processes, index=index, shard=shard, seed=seed,
      prefetch=prefetch)
  if found is not None:  # RandomAccess, grain datasets and data sources
    return found
  if isinstance(source, (str, bytes, collections.abc.Mapping)) or not isinstance(
      source, collections.abc.Iterable):
    raise TypeError("jaxport.data: source must be a tf.data.Dataset, a torch DataLoader, a grain "
                    "dataset or DataLoader, a random-access source wrapped in "
                    "jaxport.data.RandomAccess(...), or an iterable of (nested) arrays, not "
                    f"{type(source).__name__}.")
  return IterableSource(source, batch_size=batch_size, processes=processes, index=index, shard=shard)


def _local_batches(elements: Iterator[Any], *, batch_size: int | None, processes: int, index: int,
                   shard: bool, start: int, clock: Any = None) -> Iterator[Flat]:
  """This process's batches of a Python stream, from local step `start` (skipped, not loaded)."""
  if shard and processes > 1:
    elements = itertools.islice(elements, index, None, processes)
  if batch_size is not None:
    # The last batch delivered may have been short: one element of it must be there.
    return batch_examples(_skipped(elements, start * batch_size, (start - 1) * batch_size + 1,
                                   "examples"), batch_size, clock)
  return _flattened(_skipped(elements, start, start, "batches"), clock)


def _flattened(elements: Iterator[Any], clock: Any) -> Iterator[Flat]:
  """Checked batches, the time spent checking them added to `clock.transform`."""
  for element in elements:
    began = time.perf_counter()
    batch = flatten(element, batched=True)
    if clock is not None:
      clock.transform += time.perf_counter() - began
    yield batch


def _skipped(elements: Iterator[Any], count: int, needed: int, unit: str) -> Iterator[Any]:
  """`elements` past the first `count`; LoaderStateError if fewer than `needed` are there."""
  found = sum(1 for _ in itertools.islice(elements, count)) if count else 0
  if found < needed:
    raise past_the_end(needed, found, unit)
  return elements


def _length(source: Any) -> int | None:
  try:
    return len(source)
  except TypeError:
    return None


class IterableSource(Source):
  """Any iterable. Re-iterable ones (lists, custom classes) must yield the same order each pass to
  resume, which replays by count; a one-shot iterator serves one epoch and cannot resume."""
  kind = "iterable"

  def __init__(self, source: Iterable[Any], *, batch_size: int | None, processes: int, index: int,
               shard: bool):
    self._source = source
    self._one_shot = isinstance(source, collections.abc.Iterator)
    self._opened = False
    self._batch_size, self._processes, self._index = batch_size, processes, index
    self.examples = batch_size is not None
    self.loader_shards = shard

  def count(self) -> float | None:
    return None if self._one_shot else _length(self._source)

  def batches(self, epoch: int, start: int) -> Iterator[Flat]:
    if self._one_shot and (self._opened or epoch or start):
      raise NotResumableError(_ONE_SHOT)
    self._opened = True
    return _local_batches(iter(self._source), batch_size=self._batch_size,
                          processes=self._processes, index=self._index, shard=self.loader_shards,
                          start=start, clock=self.clock)

  def record(self, epoch: int, step: int) -> Any:
    if self._one_shot:
      raise NotResumableError(_ONE_SHOT)
    return None

  def load(self, epoch: int, step: int, record: Any) -> None:
    if self._one_shot:
      raise NotResumableError(_ONE_SHOT)
    super().load(epoch, step, record)


_ONE_SHOT = ("jaxport.data: the source is a one-shot iterator: it serves a single epoch and cannot "
             "be replayed, so it has no resumable state. Pass a re-iterable source instead: a "
             "list, a tf.data.Dataset, a DataLoader, or an object whose __iter__ returns a fresh "
             "iterator in the same order.")


class TorchSource(Source):
  """A torch DataLoader. Resumes by replaying batches in the same order, which it makes
  reproducible: a RandomSampler without a generator gets one, seeded per epoch from `seed`; the
  state of the user's generators is recorded at each epoch start; a DistributedSampler gets
  set_epoch(epoch)."""
  kind = "torch"

  def __init__(self, loader: Any, *, batch_size: int | None, processes: int, index: int,
               shard: bool, seed: int | None, resume: str = "replay"):
    import torch  # pylint: disable=import-outside-toplevel
    self._torch = torch
    self._loader = loader
    if resume not in ("replay", "seek"):
      raise ValueError(f"jaxport.data: torch_resume must be \"replay\" or \"seek\", not {resume!r}.")
    if resume == "seek" and (type(loader) is not torch.utils.data.DataLoader
                             or isinstance(loader.dataset, torch.utils.data.IterableDataset)):
      raise ValueError(
          "jaxport.data: torch_resume=\"seek\" needs a plain torch DataLoader over a map-style "
          f"dataset (found a {type(loader).__name__} over a {type(loader.dataset).__name__}): an "
          "IterableDataset or a DataLoader subclass cannot skip items unread. Use \"replay\", or "
          "wrap the dataset in jaxport.data.RandomAccess(...).")
    self._seek = resume == "seek"
    batched = loader.batch_size is not None or loader.batch_sampler is not None
    if batched and batch_size is not None:
      raise ValueError(f"jaxport.data: the DataLoader already batches (batch_size="
                       f"{loader.batch_size}); pass batch_size=None to the loader, or build the "
                       "DataLoader with batch_size=None.")
    self.examples = not batched
    self._batch_size, self._processes, self._index = batch_size, processes, index
    self._sampler = getattr(loader.batch_sampler, "sampler", None) or loader.sampler
    self._distributed = isinstance(self._sampler, torch.utils.data.DistributedSampler)
    self.loader_shards = shard and not self._distributed
    # The user's generators (the sampler's, the DataLoader's for worker seeds): recorded.
    self._generators = []
    for generator in (getattr(self._sampler, "generator", None), loader.generator):
      if generator is not None and all(generator is not g for g in self._generators):
        self._generators.append(generator)
    # A RandomSampler left to torch's global RNG: given a generator seeded per epoch.
    self._seed: int | None = None
    if (isinstance(self._sampler, torch.utils.data.RandomSampler)
        and self._sampler.generator is None):
      self._seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**63)
      self._sampler.generator = torch.Generator()
    self._epoch_states: dict[int, list[str]] = {}

  def count(self) -> float | None:
    return _length(self._loader)

  def last_short(self) -> bool | None:
    size, dataset_len = self._loader.batch_size, _length(self._loader.dataset)
    if self._loader.drop_last:
      return False
    if size is None or dataset_len is None or self._distributed:
      return None
    return dataset_len % size != 0

  def batches(self, epoch: int, start: int) -> Iterator[Flat]:
    self._begin_epoch(epoch)
    if start and self._seek:
      return self._sought(start)
    return _local_batches(iter(self._loader), batch_size=self._batch_size,
                          processes=self._processes, index=self._index, shard=self.loader_shards,
                          start=start, clock=self.clock)

  def _sought(self, start: int) -> Iterator[Flat]:
    """The batches from local step `start`, from a copy of the DataLoader whose sampler skips the
    items before it unread (drawn in the same order, so the random generators end where an
    uninterrupted epoch leaves them)."""
    per_step = self._batch_size or 1   # DataLoader items per local step
    stride = self._processes if self.loader_shards and self._processes > 1 else 1
    skip = start * per_step * stride   # items of the whole stream before this process's next one
    loader = self._loader
    batched = loader.batch_sampler is not None
    indices = loader.batch_sampler if batched else loader.sampler
    total = _length(indices)
    if total is not None:   # as replaying would: an item of the last batch delivered must be there
      offset = self._index if stride > 1 else 0
      local = max(0, -(-(total - offset) // stride))
      if local < (start - 1) * per_step + 1:
        raise past_the_end((start - 1) * per_step + 1, local, "examples" if self._batch_size
                           else "batches")
    options = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                   pin_memory=loader.pin_memory, timeout=loader.timeout,
                   worker_init_fn=loader.worker_init_fn, generator=loader.generator,
                   multiprocessing_context=loader.multiprocessing_context,
                   prefetch_factor=loader.prefetch_factor,
                   pin_memory_device=loader.pin_memory_device)
    if hasattr(loader, "in_order"):
      options["in_order"] = loader.in_order
    skipped = _SkippedSampler(indices, skip)
    copy = (self._torch.utils.data.DataLoader(loader.dataset, batch_sampler=skipped, **options)
            if batched else
            self._torch.utils.data.DataLoader(loader.dataset, batch_size=None, sampler=skipped,
                                              **options))
    return _local_batches(iter(copy), batch_size=self._batch_size, processes=self._processes,
                          index=self._index, shard=self.loader_shards, start=0, clock=self.clock)

  def _begin_epoch(self, epoch: int) -> None:
    if self._distributed:
      self._sampler.set_epoch(epoch)
    if self._seed is not None:
      seed = np.random.SeedSequence([self._seed, epoch]).generate_state(1, np.uint64)[0]
      self._sampler.generator.manual_seed(int(seed) % 2**63)
    saved = self._epoch_states.get(epoch)
    if saved is None:
      self._epoch_states = {epoch: self._generator_states()}
    else:
      for generator, state in zip(self._generators, saved):
        generator.set_state(self._torch.from_numpy(
            np.frombuffer(base64.b64decode(state), np.uint8).copy()))

  def _generator_states(self) -> list[str]:
    return [base64.b64encode(g.get_state().numpy().tobytes()).decode() for g in self._generators]

  def record(self, epoch: int, step: int) -> Any:
    # An epoch not started yet starts from the generators' state now.
    states = self._epoch_states.get(epoch) or self._generator_states()
    return {"seed": self._seed, "generators": states}

  def load(self, epoch: int, step: int, record: Any) -> None:
    if not isinstance(record, dict) or set(record) != {"seed", "generators"}:
      raise LoaderStateError("source_state", "expected a dict with 'seed' and 'generators', found "
                             f"{record!r:.80}.")
    if record["seed"] is not None and not is_int(record["seed"]):
      raise LoaderStateError("source_state.seed", f"expected an int or None, found "
                             f"{record['seed']!r}.")
    generators = record["generators"]
    if not isinstance(generators, list) or not all(isinstance(g, str) for g in generators):
      raise LoaderStateError("source_state.generators", "expected a list of base64 strings.")
    if (record["seed"] is None) != (self._seed is None) or len(generators) != len(
        self._generators):
      raise LoaderStateError("source_state.generators", "the state comes from a DataLoader with "
                             "other random generators (a shuffling sampler with or without a "
                             "generator); restore into a loader over the same DataLoader setup.")
    self._seed = record["seed"]
    for generator, state in zip(self._generators, generators):
      try:  # on a scratch copy: checked before anything changes
        scratch = self._torch.Generator(device=generator.device)
        scratch.set_state(self._torch.from_numpy(np.frombuffer(base64.b64decode(
            state, validate=True), np.uint8).copy()))
      except (ValueError, RuntimeError, TypeError) as error:
        raise LoaderStateError("source_state.generators", f"not a saved state of this "
                               f"DataLoader's random generator ({error}).") from None
    self._epoch_states = {epoch: list(generators)}


class _SkippedSampler:
  """A sampler's indices after its first `count` (which are drawn, then dropped)."""

  def __init__(self, sampler: Any, count: int):
    self.sampler, self.count = sampler, count

  def __iter__(self) -> Iterator[Any]:
    # A generator, as torch's samplers are: the draws happen at the first next(), after the
    # DataLoader's own (worker seeds), in the order of an uninterrupted epoch.
    indices = iter(self.sampler)
    for _ in itertools.islice(indices, self.count):
      pass
    yield from indices

  def __len__(self) -> int:
    return max(0, len(self.sampler) - self.count)


# Snapshots may take this share of the time spent reading batches: restoring then replays at most
# ~1/_SNAPSHOT_BUDGET snapshots' worth of reading, wherever in the epoch the state was taken.
_SNAPSHOT_BUDGET = 0.05
# The cost taken for a snapshot before one is measured (a pipeline that replays from its start
# is first snapshotted after this many / _SNAPSHOT_BUDGET seconds of reading).
_SNAPSHOT_GUESS_S = 1e-3
_PY_FUNCTIONS = ("PyFunc", "EagerPyFunc", "PyFuncStateless")


def _inexact_later_epochs(record: dict, dataset: Any) -> list[str]:
  """Why epochs after the one a state resumes may be in another order."""
  why = []
  if record.get("cache_writer") and record["position"] > 0:
    why.append("This pipeline caches a shuffled or random stream in memory (cache() after a "
               "shuffle or random op), and the state is taken in the cache's first pass: tf.data "
               "saves a memory cache only once complete, so the restored loader fills it anew. "
               "Cache before shuffling (.cache().shuffle(...)) to resume exactly.")
  if _tf_compat.draws_shuffle_seeds_apart(dataset):
    why.append("This pipeline draws shuffle seeds more than once per epoch (a shuffle under "
               "repeat(), or several shuffles), and tf.data's iterator state does not bring their "
               "seed generators back. Use one shuffle and repeat outside the pipeline (one loader "
               "epoch per pass) to resume exactly.")
  return why


class _Snapshot:
  """A tf.data iterator's state before it read batch `position` of its epoch: TF's variant tensor
  (its tensors referenced, not copied), encoded once a state needs it."""
  __slots__ = ("position", "variant", "encoded")

  def __init__(self, position: int, variant: Any = None, encoded: str | None = None):
    self.position, self.variant, self.encoded = position, variant, encoded


class TFDataSource(Source):
  """A tf.data.Dataset, sharded per process with Dataset.shard and batched in tf.data.

  tf.data also reads ahead in its own threads, which need no GIL (its own injected prefetch, or a
  `prefetch` stage the loader appends; see __init__). Elements are read as flat tensors
  (`_TensorReader`).

  Resume uses tf.data's own iterator checkpointing. While reading, the iterator is snapshotted
  (`_tf_compat.snapshot_iterator`, kept unencoded) before a batch every so often: each snapshot's
  cost is measured, and the next one comes once reading has taken 1/_SNAPSHOT_BUDGET times as long
  (every `checkpoint_every` batches if given), so snapshots cost ~5% of reading at most; a cheap
  pipeline is snapshotted before every batch. Only the snapshots that can still be the latest at
  or before the consumer's step (the consumer trails by the batches read ahead) are kept. `state()`
  encodes the latest one at or before the consumer's step (or snapshots the iterator then, when it
  has read exactly the consumer's batches: nothing read ahead), and a restored loader restores it
  and replays the batches from there to the step: a bounded number (the reading time of ~20
  snapshots), whatever the step, so restoring late in an epoch costs what restoring early does.
  Each epoch's iterator is also snapshotted when made, before it reads anything (see load() for
  why): that snapshot holds no elements, but costs ~10 µs per slot of a shuffle buffer (~10-25 ms
  for `shuffle(1000)`), so the loader's first iterator, made on the way to the first batch, is not:
  a restore remakes its snapshot from the restored dataset's own first iterator. That assumes the
  dataset was not iterated outside the loader before it and is restored into a new loader;
  otherwise a state saved in the last batches of the loader's first epoch resumes that epoch
  exactly, but later epochs may reshuffle differently.

  A pipeline whose fresh iterators all yield the same elements in the same order
  (`_tf_compat.replays_from_start`: no shuffle, random op or nondeterministic stage) needs neither
  of those unconditional snapshots: its epoch's start is a fresh iterator, so its snapshots come
  by the budget alone, and a state taken before the first says "replay `step` batches of a fresh
  iterator" (`fresh`).

  Two kinds of pipeline resume their epoch exactly, but not always the order of later epochs, and
  `state()` warns (`_inexact_later_epochs`): a memory `cache()` of a shuffled or random stream
  whose state is taken in the cache's first pass (tf.data saves such a cache only once complete,
  so the restored loader fills it anew), and a pipeline that draws shuffle seeds more than once
  per epoch (a shuffle under `repeat()`, or several shuffles), whose seed generators tf.data's
  iterator state does not bring back.

  A snapshot holds the pipeline's buffers: tf.data's prefetch buffer, a shuffle buffer (its
  elements, compressed in the state: ~9 KB for a `shuffle(1000)` of scalars, but ~150 MB for one of
  224x224x3 images). tf.data's `experimental_symbolic_checkpoint` option, where the user sets it,
  leaves prefetch and map buffers out (smaller, cheaper snapshots); in TF 2.21 shuffle still saves
  its buffer under it (and reads ~2x slower), and cache, rebatch and ignore_errors refuse it.
  """
  kind = "tf.data"

  def __init__(self, dataset: Any, *, batch_size: int | None, processes: int, index: int, shard: bool,
               drop_remainder: bool, checkpoint_every: int | None, prefetch: int,
               prefetch_bytes: int | None = None):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    self._tf = tf
    user_dataset = dataset
    self.examples = batch_size is not None  # counted in examples; batched inside tf.data
    self.loader_shards = shard
    cardinality = int(dataset.cardinality())
    self._count = math.inf if cardinality == tf.data.INFINITE_CARDINALITY else (
        None if cardinality < 0 else cardinality)
    prefetched = _ends_with_prefetch(dataset)
    # Snapshots are taken under the user's policy, by default (as tf.train.Checkpoint does)
    # failing on state that tf.data cannot serialize (a from_generator's Python generator)
    # rather than silently leaving it out.
    self._policy = dataset.options().experimental_external_state_policy
    # The user's own dataset object is read as it is where the loader needs no stage of its own:
    # the first iterator of a new Dataset object costs ~15-40 ms (tf.data finalizes its graph),
    # which an already iterated one does not. A pipeline the loader shards or batches is new
    # anyway: it carries the policy in its options, as states of earlier versions expect (the
    # options stage changes how tf.data rewrites the pipeline, so the iterator's saved layout).
    derived = (shard and processes > 1) or batch_size is not None
    if derived and self._policy is None:
      options = tf.data.Options()
      options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.FAIL
      dataset = dataset.with_options(options)
    if shard and processes > 1:
      dataset = dataset.shard(processes, index)
    if batch_size is not None:
      dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    if prefetch and (derived or not (prefetched or injects_prefetch(dataset))):
      # A second prefetch stage would only add a thread handoff per element (~20 µs).
      dataset = dataset.prefetch(_fitting(tf, dataset.element_spec, prefetch, prefetch_bytes))
    self._dataset = dataset
    self._static_batch = _static_batch_size(tf, dataset.element_spec)
    self._reader = _TensorReader.build(tf, dataset.element_spec, self._static_batch)
    if checkpoint_every is not None and checkpoint_every < 1:
      raise ValueError(f"jaxport.data: checkpoint_every must be a positive number of batches, not "
                       f"{checkpoint_every}.")
    self._checkpoint_every = checkpoint_every
    # How far the consumer can trail the producer: the batches read ahead, a short batch's
    # look-ahead.
    self._trailing = prefetch + 3
    self._lock = threading.Lock()
    self._pending: tuple[int, Any, int] | None = None  # (epoch, iterator, position) ready to use
    self._live: list | None = None  # [epoch, iterator, batches read] of the one being read
    self._reading = threading.Lock()  # held by the producer while it reads or snapshots
    self._retired = Retired()  # finished iterators, deleted once that is cheap
    self._snapshots: dict[int, list[_Snapshot]] = {}  # epoch -> by position
    self._snapshot_error: str | None = None
    self._snapshot_s = _SNAPSHOT_GUESS_S  # how long the latest snapshot took
    self._replays = _tf_compat.replays_from_start(dataset)  # an epoch's start is a fresh iterator
    # Whether a memory cache is complete (an epoch read whole, not restored part-way, ended), and
    # which epochs' iterators were made before it was, so write it (tf.data saves it only whole).
    self._cache_complete = False
    self._cache_writers: dict[int, bool] = {}
    self._restored_epoch: int | None = None  # restored part-way, which leaves a cache unfilled
    self._user_dataset = user_dataset
    self._fingerprint: str | None = None  # of the user's pipeline, made when a state needs it
    self._ops: set[str] | None = None  # the pipeline's op types, found when a state needs them
    self._made = 0  # iterators made from the dataset
    self._first_epoch: int | None = None  # the epoch of the unsnapshotted first iterator

  def count(self) -> float | None:
    return self._count

  def last_short(self) -> bool | None:
    return False if self._static_batch is not None else None

  def batches(self, epoch: int, start: int) -> Iterator[Flat]:
    iterator, position = self._iterator(epoch)
    try:
      while position < start:  # from the restored snapshot to the saved step: a bounded replay
        if next(iterator, None) is None:
          raise past_the_end(start, position, "batches")
        position += 1
      read = self._reader.bind(iterator) if self._reader else _read_with_next(iterator)
      # An epoch whose iterator has no snapshot yet (the loader's first) takes one after its first
      # batch, so that every later step has one to resume from; then as their cost allows.
      first = position + 1 if not (self._replays or self._snapshots.get(epoch)) else None
      since = 0.0  # reading time since the latest snapshot
      live = self._live = [epoch, iterator, position]  # and the batches read from it
      while True:
        with self._reading:  # record() may snapshot `iterator` between reads
          if self._snapshot_due(position, first, since):
            self._snapshot(epoch, position, iterator)
            first, since = None, 0.0
          began = time.perf_counter()
          batch = read()
          since += time.perf_counter() - began
          if batch is None:
            self._cache_complete |= epoch != self._restored_epoch
            break
          live[2] = position + 1
        yield batch
        position += 1
      # The next epoch's iterator is made when that epoch starts (or record() needs it): a loader
      # used for one epoch makes none it would not read.
    finally:
      # Deleting a tf.data iterator just after it ends blocks for ~20-300 ms while its threads
      # wind down: `Retired` deletes it in a daemon thread, off the consumer's path.
      self._retired.add(iterator)

  def _iterator(self, epoch: int) -> tuple[Any, int]:
    # The loader's first iterator is made on the way to the first batch: not snapshotted then, as
    # a restore can remake its first snapshot (see load()).
    self._prepare(epoch, snapshot=self._made > 0)
    self._live = None
    with self._lock:
      _, iterator, position = self._pending
      self._pending = None
      for old in [e for e in self._snapshots if e < epoch]:
        del self._snapshots[old]
      for old in [e for e in self._cache_writers if e < epoch]:
        del self._cache_writers[old]
    return iterator, position

  def _prepare(self, epoch: int, snapshot: bool = True) -> None:
    with self._lock:
      if self._pending is not None and self._pending[0] == epoch:
        return
    iterator = iter(self._dataset)
    self._made += 1
    self._cache_writers[epoch] = not self._cache_complete
    if snapshot and not self._replays:  # a replayable epoch's start is a fresh iterator
      # Before it reads anything, its snapshot holds no elements; restored last, it sets the
      # shuffle seed generators right (see load()). It costs ~10 µs per slot of a shuffle buffer.
      self._snapshot(epoch, 0, iterator)
    elif self._made == 1:
      self._first_epoch = epoch
    with self._lock:
      self._pending = (epoch, iterator, 0)

  def _snapshot(self, epoch: int, position: int, iterator: Any) -> None:
    """Snapshots `iterator`, about to read batch `position`, timing it in `_snapshot_s`."""
    if self._snapshot_error is not None:
      return
    began = time.perf_counter()
    try:
      variant = _tf_compat.snapshot_iterator(iterator, self._policy)
    except Exception as error:  # pylint: disable=broad-except  # reported by record()
      self._snapshot_error = f"{type(error).__name__}: {error}".strip()
      return
    self._snapshot_s = time.perf_counter() - began
    with self._lock:
      kept = self._snapshots.setdefault(epoch, [])
      if kept and kept[-1].position == position:
        return  # taken by record() already
      kept.append(_Snapshot(position, variant))
      # The epoch's first snapshot stays (see load()); of the others, the consumer is past
      # kept[1] once it is past kept[2].
      while len(kept) > 2 and kept[2].position <= position - self._trailing:
        del kept[1]

  def _snapshot_due(self, position: int, first: int | None, since: float) -> bool:
    """Whether to snapshot before reading batch `position`: at `first`, every `checkpoint_every`
    batches if given, else once reading since the latest snapshot took 1/_SNAPSHOT_BUDGET times
    as long as that snapshot (the cost is measured on each, so the spacing follows it)."""
    if self._snapshot_error is not None:
      return False
    if first is not None and position >= first:
      return True
    if self._checkpoint_every:
      return position > 0 and position % self._checkpoint_every == 0
    return since > 0 and since * _SNAPSHOT_BUDGET >= self._snapshot_s

  def record(self, epoch: int, step: int) -> Any:
    fail = self._tf.data.experimental.ExternalStatePolicy.FAIL
    if self._policy not in (None, fail) and "GeneratorDataset" in self.ops():
      raise NotResumableError(self._not_resumable())  # its snapshots would restart the generator
    with self._lock:
      known = any(made is not None and made[0] == epoch for made in (self._pending, self._live))
    if not known and epoch not in self._snapshots:
      self._prepare(epoch)  # an epoch not started yet
    with self._reading, self._lock:
      kept = self._snapshots.setdefault(epoch, [])
      for live in (self._pending, self._live):
        # An iterator that has read exactly the consumer's batches (not read yet, or read by a
        # consumer that waits on data): snapshotted now, exactly, while the producer waits.
        if (live is not None and live[0] == epoch and live[2] == step
            and self._snapshot_error is None and all(s.position != step for s in kept)):
          try:
            kept.append(_Snapshot(step, _tf_compat.snapshot_iterator(live[1], self._policy)))
          except Exception as error:  # pylint: disable=broad-except
            self._snapshot_error = f"{type(error).__name__}: {error}".strip()
          kept.sort(key=lambda s: s.position)
          break
      usable = [s for s in kept if s.position <= step]
    fingerprint = self.fingerprint()
    if not usable and self._replays:
      return {"position": 0, "fresh": True, "encoding": _tf_compat.COMPACT, "pipeline": fingerprint}
    if not usable:
      raise NotResumableError(self._not_resumable())
    latest = max(usable, key=lambda s: s.position)
    record = {"position": latest.position, "iterator": self._encoded(latest),
              "encoding": _tf_compat.COMPACT, "pipeline": fingerprint}
    if self._cache_writers.get(epoch) and _tf_compat.caches_a_changing_stream(self._dataset):
      record["cache_writer"] = True
    for why in _inexact_later_epochs(record, self._dataset):
      warnings.warn(f"jaxport.data: {why} A loader restored from this state resumes its epoch "
                    "exactly, but later epochs may come in another order than an uninterrupted "
                    "run's.", stacklevel=3)
    if usable[0].position <= 0 and latest is not usable[0]:
      record["epoch_start"] = self._encoded(usable[0])
    elif usable[0].position > 0 and epoch == self._first_epoch and not self._replays:
      record["first"] = True  # the epoch's iterator was the dataset's first, not snapshotted
    return record

  def _encoded(self, snapshot: _Snapshot) -> str:
    if snapshot.encoded is None:
      snapshot.encoded = _tf_compat.encode_snapshot(self._tf, snapshot.variant)
      snapshot.variant = None
    return snapshot.encoded

  def ops(self) -> set[str]:
    """The op types of the user's pipeline (`_tf_compat.pipeline_ops`), found once."""
    if self._ops is None:
      self._ops = _tf_compat.pipeline_ops(self._tf, self._user_dataset)
    return self._ops

  def _not_resumable(self) -> str:
    """Why `state()` cannot resume this pipeline, and the way out that fits its cause."""
    error = self._snapshot_error or ""
    stateful = re.search(r"(\w+) is stateful", error)
    op = stateful.group(1) if stateful else ""
    head = ("jaxport.data: tf.data cannot checkpoint this pipeline's iterator"
            + (f" ({error.splitlines()[0][:300]})" if error else "") + ", so the loader cannot "
            "resume it. ")
    if "GeneratorDataset" in self.ops():
      return head + (
          "Dataset.from_generator keeps its position in a Python generator, which tf.data does "
          "not save (ExternalStatePolicy.IGNORE only leaves it out: the resumed generator would "
          "start over). Pass the data to jaxport.data.loader as a re-iterable Python source "
          "instead (an object whose __iter__ returns a fresh generator in the same order; it "
          "resumes by replaying), or build the pipeline from Dataset.from_tensor_slices, range "
          "or TFRecordDataset.")
    if op in _PY_FUNCTIONS:
      return head + (
          "If the Python function (tf.py_function / tf.numpy_function) is pure, its output "
          "depending on its input only, set options.experimental_external_state_policy = "
          "tf.data.experimental.ExternalStatePolicy.IGNORE on the dataset: the pipeline's "
          "position is saved and only the function's (unused) state is left out. A Python "
          "function that draws random numbers or reads changing state cannot be resumed.")
    if op.startswith(("Random", "Stateful", "TruncatedNormal", "Multinomial")):
      return head + (
          f"{op} draws from a random generator whose state is not saved. Use stateless random "
          "ops keyed by (seed, epoch, index), e.g. tf.random.stateless_uniform / "
          "tf.image.stateless_random_* (see jaxport.data.example_keys).")
    return head + "Remove the stateful op it names from the pipeline, or make it stateless."

  def fingerprint(self) -> str:
    """The user's pipeline's fingerprint (`_tf_compat.pipeline_fingerprint`), made once."""
    if self._fingerprint is None:
      self._fingerprint = _tf_compat.pipeline_fingerprint(self._tf, self._user_dataset)
    return self._fingerprint

  def _check_record(self, step: int, record: Any) -> None:
    """Checks `record` before any of its bytes reach TF (the loader checked its digest)."""
    fresh = isinstance(record, dict) and record.get("fresh") is True
    required = {"position", "pipeline", "fresh"} if fresh else {"position", "iterator", "pipeline"}
    optional = {"encoding"} if fresh else {"encoding", "epoch_start", "first", "cache_writer"}
    if not isinstance(record, dict) or not required <= set(record) \
        or not set(record) <= required | optional:
      raise LoaderStateError("source_state", "expected a dict with 'position', 'iterator' (or "
                             f"'fresh'), 'pipeline' and 'encoding', found {record!r:.80}.")
    position = record["position"]
    if fresh and position != 0:
      raise LoaderStateError("source_state.position", f"expected 0 with 'fresh', found "
                             f"{position!r}.")
    if not is_int(position) or not 0 <= position <= step:
      raise LoaderStateError("source_state.position", f"expected an int in [0, step={step}], "
                             f"found {position!r}.")
    for key in ("iterator", "pipeline", "epoch_start"):
      if key in record and not isinstance(record[key], str):
        raise LoaderStateError(f"source_state.{key}", f"expected a string, found "
                               f"{type(record[key]).__name__}.")
    if record.get("cache_writer", True) is not True:
      raise LoaderStateError("source_state.cache_writer", f"expected True, found "
                             f"{record['cache_writer']!r}.")
    if record.get("first", True) is not True:
      raise LoaderStateError("source_state.first", f"expected True, found {record['first']!r}.")
    if "first" in record and "epoch_start" in record:
      raise LoaderStateError("source_state.epoch_start", "not expected with 'first'.")
    encoding = record.get("encoding")
    if encoding not in (None, _tf_compat.COMPACT):
      raise LoaderStateError("source_state.encoding", f"expected {_tf_compat.COMPACT!r}, found "
                             f"{encoding!r}.")
    # States of earlier versions (no "encoding") carry the epoch's first snapshot past position 0.
    if encoding is None and not fresh and ("epoch_start" in record) != (position > 0):
      raise LoaderStateError("source_state.epoch_start", "present exactly when position > 0.")
    if record["pipeline"] != self.fingerprint():
      raise LoaderStateError(
          "source_state.pipeline", "the state was saved from a different tf.data pipeline: its "
          "graph changed since (a shuffle seed or buffer size, a map function, the data, the "
          "order of stages). Resuming it would repeat and skip examples; restore into a loader "
          "over the same pipeline, or start the epoch afresh.")

  def load(self, epoch: int, step: int, record: Any) -> None:
    self._check_record(step, record)
    if record.get("fresh"):  # the epoch replayed from its start: a fresh iterator
      if not self._replays:
        raise LoaderStateError("source_state.fresh", "the state replays the epoch from a fresh "
                               "iterator, but this pipeline's iterators may differ (a shuffle, a "
                               "random op or a nondeterministic stage); restore into a loader over "
                               "the same pipeline.")
      iterator = iter(self._dataset)
      self._made += 1
      with self._lock:
        self._pending, self._live, self._snapshots = (epoch, iterator, 0), None, {}
      return
    encoding, position = record.get("encoding"), record["position"]
    # A state of an iterator made after a memory cache was complete holds it whole; one made
    # before writes it, and restored part-way leaves it for the next epoch to write.
    writer = "cache_writer" in record
    self._cache_complete, self._cache_writers = not writer, {epoch: writer}
    self._restored_epoch = epoch if position > 0 else None
    # A snapshot taken late in an epoch (once read-ahead drained a shuffle buffer) can leave the
    # shuffle seed generators, which a dataset's iterators share, off from where an uninterrupted run
    # has them; restoring a snapshot of the epoch's iterator made before it read anything, last,
    # puts them back, so that later epochs reshuffle as they would have. For the loader's first
    # iterator (not snapshotted then) it is remade here, from this dataset's first iterator.
    first = None
    if record.get("first") and self._made == 0:
      first = iter(self._dataset)
      self._made += 1
      snapshot_of_first = _tf_compat.snapshot_iterator(first, self._policy)
    iterator = self._restored(record["iterator"], encoding, "iterator", first)
    snapshots = [_Snapshot(position, encoded=record["iterator"])]
    if "epoch_start" in record:
      start = self._restored(record["epoch_start"], encoding, "epoch_start")
      snapshots.insert(0, _Snapshot(-1, encoded=record["epoch_start"]))  # kept as the first
      if encoding is None:  # an earlier version's snapshots, encoded afresh
        snapshots[0] = _Snapshot(-1, _tf_compat.snapshot_iterator(start, self._policy))
    elif first is not None:
      _tf_compat.restore_snapshot(iter(self._dataset), snapshot_of_first)
      self._made += 1
      snapshots.insert(0, _Snapshot(-1, snapshot_of_first))
    if encoding is None:
      snapshots[-1] = _Snapshot(position, _tf_compat.snapshot_iterator(iterator, self._policy))
    with self._lock:
      self._pending, self._live = (epoch, iterator, position), None
      self._snapshots = {epoch: snapshots}

  def _restored(self, state: str, encoding: str | None, field: str, iterator: Any = None) -> Any:
    if iterator is None:
      iterator = iter(self._dataset)
      self._made += 1
    try:
      _tf_compat.restore_iterator(self._tf, iterator, state, encoding)
    except Exception as error:
      raise LoaderStateError(f"source_state.{field}", "the saved tf.data iterator does not fit "
                             "this dataset; restore into a loader over the same pipeline.") \
          from error
    return iterator
