"""Feeds that hand produced batches to the consumer: in a background thread, or inline."""
import collections
import queue
import threading
import weakref
from typing import Any, Iterator

_ITEM, _END, _ERROR = "item", "end", "error"
_POLL_S = 0.05
_JOIN_S = 5.0


class InlineFeed:
  """The consumer's `next()` runs the producer itself, keeping `ahead` results produced in advance.

  For sources that read ahead in their own threads (tf.data), this costs less than a Python thread:
  no GIL handoff per batch. `ahead` > 0 lets asynchronous device transfers started for later
  batches overlap the consumer's work. An error of the producer is raised after the results
  produced before it, with its own traceback.
  """

  def __init__(self, items: Iterator[Any], ahead: int = 0):
    self._items = items
    self._ahead = ahead
    self._ready: collections.deque = collections.deque()
    self._end: BaseException | None = None

  def get(self) -> Any:
    while self._end is None and len(self._ready) <= self._ahead:
      try:
        self._ready.append(next(self._items))
      except StopIteration:
        self._end = StopIteration()
      except Exception as error:  # pylint: disable=broad-except  # raised in order, below
        self._end = error
    if self._ready:
      return self._ready.popleft()
    if isinstance(self._end, StopIteration):
      raise StopIteration
    raise self._end

  def depth(self) -> int:
    return len(self._ready)

  def close(self) -> None:
    self._ready.clear()
    close = getattr(self._items, "close", None)
    if close is not None:
      close()


class ThreadFeed:
  """Runs `items` in a daemon thread that keeps up to `depth` results ready in a bounded queue.

  `get()` returns the next result, raises StopIteration at the end, and re-raises an exception
  of the producer (with its original traceback). `close()` is idempotent and never blocks for
  long; garbage collection of the feed closes it too, because the thread holds no reference to it.
  """

  def __init__(self, items: Iterator[Any], depth: int, name: str):
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._done = False
    self._thread = threading.Thread(target=_produce, args=(items, self._queue, self._stop),
                                    name=name, daemon=True)
    self._thread.start()
    self._finalizer = weakref.finalize(self, _shutdown, self._stop, self._queue, self._thread, 0.0)

  @property
  def thread(self) -> threading.Thread:
    return self._thread

  def get(self) -> Any:
    if self._done:
      raise StopIteration
    while True:
      try:
        kind, value = self._queue.get(timeout=_POLL_S)
        break
      except queue.Empty:
        if not self._thread.is_alive() and self._queue.empty():
          self._done = True
          raise RuntimeError("jaxport.data: the prefetch thread stopped without a result or an "
                             "error; the feed was closed or the interpreter is shutting down.") from None
    if kind == _ITEM:
      return value
    self._done = True
    if kind == _END:
      raise StopIteration
    raise value

  def depth(self) -> int:
    return self._queue.qsize()

  def close(self) -> None:
    self._done = True
    if self._finalizer.alive:
      self._finalizer.detach()
      _shutdown(self._stop, self._queue, self._thread, _JOIN_S)


def _produce(items: Iterator[Any], out: queue.Queue, stop: threading.Event) -> None:
  try:
    for item in items:
      if not _put(out, (_ITEM, item), stop):
        return
    _put(out, (_END, None), stop)
  except BaseException as error:  # pylint: disable=broad-except
    error.add_note("(raised while producing a batch in jaxport.data's prefetch thread)")
    _put(out, (_ERROR, error), stop)
  finally:
    close = getattr(items, "close", None)
    if close is not None:
      close()


def _put(out: queue.Queue, entry: tuple[str, Any], stop: threading.Event) -> bool:
  while not stop.is_set():
    try:
      out.put(entry, timeout=_POLL_S)
      return True
    except queue.Full:
      continue
  return False


def _shutdown(stop: threading.Event, pending: queue.Queue, thread: threading.Thread,
              join_s: float) -> None:
  stop.set()
  while True:  # free prefetched device buffers now rather than when the queue is collected
    try:
      pending.get_nowait()
    except queue.Empty:
      break
  if join_s and thread is not threading.current_thread():
    # A source blocked inside its own next() cannot be interrupted; the daemon thread then
    # exits when the source returns, and never keeps the interpreter alive.
    thread.join(join_s)
