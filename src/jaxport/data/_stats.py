"""Throughput accounting of a loader, and its optional rich progress bar."""
import dataclasses
import time
import weakref


@dataclasses.dataclass(frozen=True)
class LoaderStats:
  """What the consumer of a loader has seen so far (this process only)."""
  batches: int  # batches delivered to the consumer
  bytes: int  # bytes this process moved to devices for them, before any dtype cast
  seconds: float  # since the consumer first asked for a batch
  wait_seconds: float  # time the consumer spent blocked in next()
  queue_depth: int  # batches read ahead of the consumer, ready on device
  mean_queue_depth: float  # batches that were ready when the consumer asked, on average
  prefetch: int  # capacity of the prefetch queue

  @property
  def batches_per_second(self) -> float:
    return self.batches / self.seconds if self.seconds else 0.0

  @property
  def bytes_per_second(self) -> float:
    return self.bytes / self.seconds if self.seconds else 0.0

  @property
  def wait_fraction(self) -> float:
    """Share of the consumer's time spent waiting on data: near 0 means data keeps up."""
    return self.wait_seconds / self.seconds if self.seconds else 0.0

  def __str__(self) -> str:
    return (f"{self.batches} batches, {self.batches_per_second:.1f} batches/s, "
            f"{self.bytes_per_second / 2**20:.1f} MiB/s, waited {self.wait_seconds:.3f} s "
            f"({100 * self.wait_fraction:.1f}%), queue {self.queue_depth}/{self.prefetch} "
            f"(mean {self.mean_queue_depth:.2f})")


class Meter:
  """Accumulates LoaderStats from the consumer's side."""

  def __init__(self):
    self.batches = 0
    self.bytes = 0
    self.wait_seconds = 0.0
    self._depth_sum = 0
    self._started: float | None = None

  def begin_wait(self, depth: int) -> float:
    now = time.perf_counter()
    if self._started is None:
      self._started = now
    self._depth_sum += depth
    return now

  def delivered(self, began: float, nbytes: int) -> None:
    self.wait_seconds += time.perf_counter() - began
    self.batches += 1
    self.bytes += nbytes

  def snapshot(self, depth: int, prefetch: int) -> LoaderStats:
    seconds = 0.0 if self._started is None else time.perf_counter() - self._started
    return LoaderStats(batches=self.batches, bytes=self.bytes, seconds=seconds,
                       wait_seconds=self.wait_seconds, queue_depth=depth,
                       mean_queue_depth=self._depth_sum / self.batches if self.batches else 0.0,
                       prefetch=prefetch)


class ProgressBar:
  """A rich progress bar per epoch, with batches/s and the consumer's wait share."""

  def __init__(self):
    self._progress = None
    self._task = None
    self._finalizer = None

  def start(self, epoch: int, total: float | None, completed: int) -> None:
    from rich import progress  # pylint: disable=import-outside-toplevel
    if self._progress is None:
      self._progress = progress.Progress(
          progress.TextColumn("[bold]{task.description}"), progress.BarColumn(),
          progress.MofNCompleteColumn(), progress.TextColumn("{task.fields[rate]}"),
          progress.TimeElapsedColumn())
      self._progress.start()
      # The bar's refresh thread must not outlive a loader that was never closed.
      self._finalizer = weakref.finalize(self, self._progress.stop)
    total = None if total is None or total == float("inf") else int(total)
    self._task = self._progress.add_task(f"epoch {epoch}", total=total, completed=completed,
                                         rate="")

  def advance(self, stats: LoaderStats) -> None:
    if self._task is not None:
      self._progress.update(self._task, advance=1, rate=(
          f"{stats.batches_per_second:.1f} batch/s, waiting {100 * stats.wait_fraction:.0f}%"))

  def end_epoch(self) -> None:
    if self._task is not None:
      self._progress.stop_task(self._task)
      self._task = None

  def close(self) -> None:
    if self._finalizer is not None:
      self._finalizer()
    self._progress = self._task = self._finalizer = None
