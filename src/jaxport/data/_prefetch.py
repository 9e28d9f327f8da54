"""The feed between the producer of device batches and the consumer.

A consumer that waits on data runs the producer itself: handing each batch over from a thread
costs ~50 µs of GIL switches, more than the rest of the loader's work per batch. A consumer that
works between batches (its training step) has the next ones read ahead by a daemon thread in the
meantime, so that they are ready when it asks.
"""
import collections
import threading
import time
import weakref
from typing import Any, Callable, Iterator

_POLL_S = 0.05  # how often an idle thread checks whether the feed was closed
_JOIN_S = 5.0
# A consumer back sooner than this after its last batch is waiting on data, not working.
_WORKING_S = 200e-6
_THREAD_NOTE = "(raised while reading ahead in jaxport.data's prefetch thread)"


class _Shared:
  """The state the feed and its thread share. The thread holds no reference to the feed, so the
  feed (and its loader) can be garbage-collected while the thread runs."""

  def __init__(self, items: Iterator[Any], depth: int, max_bytes: int | None,
               size_of: Callable[[Any], int] | None):
    self.items = items
    self.depth = depth
    self.max_bytes, self.size_of = max_bytes, size_of
    # Bytes of the results produced and taken: each counter has one writer (the lock's holder,
    # the consumer), so their difference needs no lock.
    self.added = self.taken = 0
    self.ready: collections.deque = collections.deque()
    self.end: BaseException | None = None  # StopIteration() or the producer's error, after `ready`
    self.lock = threading.Lock()  # held while the producer runs
    self.wake = threading.Event()  # the consumer went to work: read ahead
    self.stop = threading.Event()
    self.consumer_waiting = False  # the thread yields the lock to the consumer between batches
    self._items_closed = False

  def produce(self, note: str | None = None) -> None:
    """Runs the producer once, into `ready` or `end`; the caller holds `lock`."""
    try:
      item = next(self.items)
      if self.size_of is not None:
        self.added += self.size_of(item)
      self.ready.append(item)
    except StopIteration:
      self.end = StopIteration()
    except BaseException as error:  # pylint: disable=broad-except  # raised by get(), in order
      # Kept even for a KeyboardInterrupt: the producer cannot go on after it, and a later get()
      # must not mistake its end for the end of the data.
      if note:
        error.add_note(note)
      self.end = error

  def has_room(self) -> bool:
    """Whether the results read ahead hold fewer than `max_bytes`."""
    return self.max_bytes is None or self.added - self.taken < self.max_bytes

  def wanted(self) -> bool:
    """Whether the thread should read one more batch ahead."""
    return (not self.stop.is_set() and not self.consumer_waiting and self.end is None
            and len(self.ready) < self.depth and self.has_room())

  def close_items(self) -> None:
    """Closes the producer (once); the caller holds `lock`."""
    if not self._items_closed:
      self._items_closed = True
      close = getattr(self.items, "close", None)
      if close is not None:
        close()


class Feed:
  """Hands the producer's results to the consumer, reading up to `depth` ahead in a daemon thread
  while the consumer works (`depth=0`: no thread), and, with `max_bytes`, no further once the
  results read ahead hold that many bytes (by `size_of`; one result is always allowed). With
  `lead`, a consumer waiting on data runs the producer until `lead` more results are made
  before it gets the oldest: their background work (copies to a device) overlaps making the next.

  `get()` returns the next result, raises StopIteration at the end, and re-raises an exception of
  the producer (with its original traceback) after the results produced before it. `close()` is
  idempotent and never blocks for long, even on a stuck producer; garbage collection closes too.
  """

  def __init__(self, items: Iterator[Any], depth: int, name: str, *,
               max_bytes: int | None = None, size_of: Callable[[Any], int] | None = None,
               lead: int = 0):
    if max_bytes is not None and size_of is None:
      raise ValueError("max_bytes needs size_of")
    self._shared = shared = _Shared(items, depth, max_bytes, size_of)
    self._lead = lead
    self._left: float | None = None  # when the consumer last left get()
    self._interrupted = False  # the producer ended with a KeyboardInterrupt, already raised
    self._thread = None
    if depth > 0:
      self._thread = threading.Thread(target=_read_ahead, args=(shared,), name=name, daemon=True)
      self._thread.start()
    self._finalizer = weakref.finalize(self, _shutdown, shared, self._thread, 0.0)

  @property
  def thread(self) -> threading.Thread | None:
    return self._thread

  def get(self) -> Any:
    shared = self._shared
    working = self._left is None or time.perf_counter() - self._left >= _WORKING_S
    if len(shared.ready) <= self._lead:
      shared.consumer_waiting = True
      with shared.lock:
        shared.consumer_waiting = False
        # Runs the producer until `lead` results wait behind the one returned (results whose
        # work, a copy to a device, goes on in the background while the next ones are made).
        while (len(shared.ready) <= self._lead and shared.end is None
               and (not shared.ready or shared.has_room())):
          shared.produce()
    try:
      if shared.ready:
        item = shared.ready.popleft()
        if shared.size_of is not None:
          shared.taken += shared.size_of(item)
        return item
      if isinstance(shared.end, StopIteration):
        raise StopIteration
      if self._interrupted:
        raise RuntimeError("jaxport.data: reading a batch was interrupted (see the cause); the "
                           "source cannot go on, restore() a saved state to continue.") \
            from shared.end
      self._interrupted = not isinstance(shared.end, Exception)
      raise shared.end
    finally:
      self._left = time.perf_counter()
      if working and self._thread is not None and shared.end is None:
        shared.wake.set()

  def depth(self) -> int:
    return len(self._shared.ready)

  def queued_bytes(self) -> int:
    """Bytes of the results read ahead and not taken yet (0 without `size_of`)."""
    return self._shared.added - self._shared.taken

  def close(self) -> None:
    if self._finalizer.alive:
      self._finalizer.detach()
      _shutdown(self._shared, self._thread, _JOIN_S)


def _read_ahead(shared: _Shared) -> None:
  try:
    while not shared.stop.is_set():
      if not shared.wake.wait(_POLL_S):
        continue
      shared.wake.clear()
      # Fill the room there is now; a consumer that drains the batches faster than this thread
      # reads them is waiting on data, and reads them itself.
      for _ in range(shared.depth - len(shared.ready)):
        with shared.lock:
          if not shared.wanted():
            break
          shared.produce(_THREAD_NOTE)
  finally:
    # Closed while this thread ran the producer: close it now, unless the consumer has the lock.
    if shared.stop.is_set() and shared.lock.acquire(blocking=False):
      try:
        shared.close_items()
      finally:
        shared.lock.release()


def _shutdown(shared: _Shared, thread: threading.Thread | None, join_s: float) -> None:
  shared.stop.set()
  shared.wake.set()
  shared.ready.clear()  # free read-ahead device buffers now rather than when the feed is collected
  own_thread = thread is threading.current_thread()
  deadline = time.monotonic() + join_s
  # A producer stuck inside its own next() cannot be interrupted; the thread then closes it
  # when it returns, and, being a daemon, never keeps the interpreter alive.
  acquired = shared.lock.acquire(blocking=False) if own_thread or join_s <= 0 else \
      shared.lock.acquire(timeout=join_s)
  if acquired:
    try:
      shared.close_items()
    finally:
      shared.lock.release()
  if thread is not None and join_s and not own_thread:
    thread.join(max(0.0, deadline - time.monotonic()))
