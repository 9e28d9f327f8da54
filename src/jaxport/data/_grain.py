"""grain iterators as sources: `grain.IterDataset` and `grain.DataLoader`, with their own state.

(A `grain.MapDataset` is random-access: `_random_access` reads it by position, with its own
shuffles reseeded per epoch by grain's index convention, and it resumes in O(1) and elastically.)

Each epoch iterates the dataset afresh. With several processes each reads the whole stream in
global chunks (the global batch's worth of elements) and keeps every P-th element of a chunk, so
that the processes agree on the steps; but the loader needs the length of the data then, which
grain iterators lack (they have no `len`), so in practice several processes use a MapDataset.

Resume uses grain's `get_state`/`set_state`: the iterator's state is taken after each chunk the
producer reads, kept for the batches read ahead, and `record()` returns the one after the last
batch the consumer received, so a restored loader sets it and reads on, replaying nothing. States
are JSON-encoded (bytes as base64). A DataLoader's worker processes (`worker_count`) are grain's
own: they start per epoch (per `iter`) and follow its state on restore.
"""
import base64
import collections
import itertools
import threading
from typing import Any, Iterator

from jaxport.data._batches import Flat, flatten, stack
from jaxport.data._sources import Source, _length
from jaxport.data._state import is_int, past_the_end
from jaxport.errors import LoaderStateError

_BYTES, _TUPLE = "__bytes_base64__", "__tuple__"


class GrainSource(Source):
  """A grain IterDataset or DataLoader; see the module docstring."""
  kind = "grain"

  def __init__(self, dataset: Any, *, batch_size: int | None, processes: int, index: int,
               shard: bool, prefetch: int):
    self._dataset = dataset
    self.examples = batch_size is not None
    self.loader_shards = shard
    self._per_process = batch_size or 1
    self._processes, self._index = (processes, index) if shard else (1, 0)
    # (epoch, step) -> the encoded iterator state before that local step; bounded by the batches
    # the producer may be ahead of the consumer.
    self._states: collections.OrderedDict[tuple[int, int], Any] = collections.OrderedDict()
    self._kept = prefetch + 8
    self._lock = threading.Lock()
    self._iterator: Any = None  # the epoch's iterator (a DataLoader's holds its workers)
    from absl import flags  # pylint: disable=import-outside-toplevel  # a grain dependency
    if not flags.FLAGS.is_parsed():
      # grain's worker processes read an absl flag, which raises in a program that does not parse
      # absl flags (no absl.app.run): its flags take their defaults, as grain's config does.
      flags.FLAGS.mark_as_parsed()

  def count(self) -> float | None:
    return _length(self._dataset)

  def batches(self, epoch: int, start: int) -> Iterator[Flat]:
    with self._lock:
      saved = self._states.get((epoch, start))
    self._iterator = None  # the previous epoch's workers go first
    iterator = iter(self._dataset)
    if saved is not None:
      try:
        iterator.set_state(decode(saved))
      except Exception as error:
        raise LoaderStateError("source_state.iterator", f"grain refused the saved iterator state "
                               f"({type(error).__name__}: {str(error)[:200]}); restore into a "
                               "loader over the same grain pipeline.") from error
    elif start:  # no state for this step (a loop broken off and restarted): replay
      skipped = sum(1 for _ in itertools.islice(iterator, start * self._chunk()))
      if skipped < start * self._chunk():
        raise past_the_end(start * self._chunk(), skipped, "elements")
    self._iterator = iterator
    self._remember(epoch, start, iterator)
    return self._read(iterator, epoch, start)

  def _chunk(self) -> int:
    return self._per_process * self._processes

  def _read(self, iterator: Any, epoch: int, step: int) -> Iterator[Flat]:
    while chunk := list(itertools.islice(iterator, self._chunk())):
      mine = chunk[self._index::self._processes]
      if not mine:
        return
      self._remember(epoch, step + 1, iterator)
      if self.examples:
        yield stack([flatten(element, batched=False) for element in mine],
                    getattr(self.clock, "pool", None))
      else:
        yield flatten(mine[0], batched=True)
      step += 1
    if self._iterator is iterator:
      self._iterator = None  # a DataLoader's workers stop with it

  def _remember(self, epoch: int, step: int, iterator: Any) -> None:
    state = encode(iterator.get_state())
    with self._lock:
      self._states[(epoch, step)] = state
      while len(self._states) > self._kept:
        self._states.popitem(last=False)

  def record(self, epoch: int, step: int) -> Any:
    with self._lock:
      state = self._states.get((epoch, step))
    if state is None and step:
      raise LoaderStateError("step", f"no grain iterator state is kept for step {step} of epoch "
                             f"{epoch}; call state() between batches of a running loader.")
    return {"iterator": state}

  def load(self, epoch: int, step: int, record: Any) -> None:
    if not isinstance(record, dict) or set(record) != {"iterator"}:
      raise LoaderStateError("source_state", f"expected a dict with 'iterator', found "
                             f"{record!r:.80}.")
    state = record["iterator"]
    if state is None and step:
      raise LoaderStateError("source_state.iterator", f"missing for step {step}.")
    if state is not None:  # checked here as JSON; grain checks it when the epoch opens
      try:
        decode(state)
      except (ValueError, TypeError, AttributeError) as error:
        raise LoaderStateError("source_state.iterator", f"not a saved grain state ({error}).") \
            from None
    with self._lock:
      self._states.clear()
      if state is not None:
        self._states[(epoch, step)] = state


def encode(state: Any) -> Any:
  """A grain state (dicts, lists, tuples, bytes, numbers, strings) as JSON data."""
  if isinstance(state, bytes):
    return {_BYTES: base64.b64encode(state).decode()}
  if isinstance(state, tuple):
    return {_TUPLE: [encode(x) for x in state]}
  if isinstance(state, list):
    return [encode(x) for x in state]
  if isinstance(state, dict):
    if not all(isinstance(key, str) for key in state):
      raise TypeError(f"jaxport.data: a grain state with non-string keys: {list(state)[:5]}")
    return {key: encode(value) for key, value in state.items()}
  if state is None or isinstance(state, (bool, str, float)) or is_int(state):
    return state
  if hasattr(state, "item"):  # a numpy scalar
    return state.item()
  raise TypeError(f"jaxport.data: cannot save a {type(state).__name__} of a grain state as JSON.")


def decode(state: Any) -> Any:
  if isinstance(state, dict):
    if set(state) == {_BYTES}:
      return base64.b64decode(state[_BYTES], validate=True)
    if set(state) == {_TUPLE}:
      return tuple(decode(x) for x in state[_TUPLE])
    return {key: decode(value) for key, value in state.items()}
  if isinstance(state, list):
    return [decode(x) for x in state]
  return state
