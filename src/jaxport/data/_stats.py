"""Throughput accounting of a loader, where its time goes, and its optional rich progress bar.

Stages of producing a batch: "source" (reading it, or its examples, from the source: tf.data,
the user's iterator or DataLoader, replays after a restore), "transform" (the host-side work of
jaxport: checking and flattening elements, stacking examples into batches), "transfer" (placing
the leaves on devices and dtype casts there: dispatching copies, which finish in the background). They are measured
wherever the producer runs (the prefetch thread, or the consumer waiting on data); "wait" is the
time the consumer spent blocked in `next()`.
"""
import dataclasses
import time
import weakref
from typing import Any

STAGES = ("source", "transform", "transfer")


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
  produced: int = 0  # batches produced (delivered, read ahead, or dropped by a restore)
  source_seconds: float = 0.0  # producing them: reading from the source
  transform_seconds: float = 0.0  # checking, flattening and stacking on the host
  transfer_seconds: float = 0.0  # moving to devices (and casting there)

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

  @property
  def stage_ms(self) -> dict[str, float]:
    """Milliseconds per batch of each stage ("source", "transform", "transfer", "wait")."""
    per = {stage: getattr(self, f"{stage}_seconds") / self.produced if self.produced else 0.0
           for stage in STAGES}
    per["wait"] = self.wait_seconds / self.batches if self.batches else 0.0
    return {stage: 1e3 * seconds for stage, seconds in per.items()}

  @property
  def stage_fractions(self) -> dict[str, float]:
    """Share of each production stage in the time spent producing batches (sums to 1)."""
    total = sum(getattr(self, f"{stage}_seconds") for stage in STAGES)
    return {stage: getattr(self, f"{stage}_seconds") / total if total else 0.0
            for stage in STAGES}

  def stages_text(self) -> str:
    """"source 20.1 ms (95%), transform 0.1 ms (0%), transfer 1.0 ms (5%), wait 0.2 ms"."""
    ms, fractions = self.stage_ms, self.stage_fractions
    parts = [f"{stage} {ms[stage]:.2f} ms ({100 * fractions[stage]:.0f}%)" for stage in STAGES]
    return ", ".join(parts + [f"wait {ms['wait']:.2f} ms"])

  def __str__(self) -> str:
    return (f"{self.batches} batches, {self.batches_per_second:.1f} batches/s, "
            f"{self.bytes_per_second / 2**20:.1f} MiB/s, waited {self.wait_seconds:.3f} s "
            f"({100 * self.wait_fraction:.1f}%), queue {self.queue_depth}/{self.prefetch} "
            f"(mean {self.mean_queue_depth:.2f}); per batch: {self.stages_text()}")


class StageClock:
  """Seconds one producer (one feed's `_produce`) spent per stage, and the batches it produced.

  Written only by that producer (which one thread at a time runs, under the feed's lock), read
  by the consumer without a lock: each field has a single writer, as in `_prefetch`.
  """
  FIELDS = ("batches",) + STAGES
  __slots__ = FIELDS + ("pool",)

  def __init__(self, pool: Any = None):
    self.batches = 0
    self.source = self.transform = self.transfer = 0.0
    self.pool = pool  # the loader's _host_pool.HostPool for the batches readers stack, if any


class Meter:
  """Accumulates LoaderStats from the consumer's side."""

  def __init__(self):
    self.batches = 0
    self.bytes = 0
    self.wait_seconds = 0.0
    self._depth_sum = 0
    self._started: float | None = None
    self._done = StageClock()  # the stages of the feeds already closed

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

  def retire(self, clock: StageClock) -> None:
    """Adds the stages of a closed feed's producer."""
    for field in StageClock.FIELDS:
      setattr(self._done, field, getattr(self._done, field) + getattr(clock, field))

  def snapshot(self, depth: int, prefetch: int, clock: StageClock | None = None) -> LoaderStats:
    """`clock`: the open feed's producer, if any."""
    seconds = 0.0 if self._started is None else time.perf_counter() - self._started
    stages = {field: getattr(self._done, field) + (getattr(clock, field) if clock else 0)
              for field in StageClock.FIELDS}
    return LoaderStats(batches=self.batches, bytes=self.bytes, seconds=seconds,
                       wait_seconds=self.wait_seconds, queue_depth=depth,
                       mean_queue_depth=self._depth_sum / self.batches if self.batches else 0.0,
                       prefetch=prefetch, produced=stages["batches"],
                       source_seconds=stages["source"], transform_seconds=stages["transform"],
                       transfer_seconds=stages["transfer"])


def progress_text(stats: LoaderStats) -> str:
  """The progress bar's rate column."""
  ms = stats.stage_ms
  return (f"{stats.batches_per_second:.1f} batch/s, waiting {100 * stats.wait_fraction:.0f}% | "
          f"ms/batch: source {ms['source']:.1f}, transform {ms['transform']:.1f}, "
          f"transfer {ms['transfer']:.1f}, wait {ms['wait']:.1f}")


class ProgressBar:
  """A rich progress bar per epoch, with batches/s, the consumer's wait share, and the time per
  batch of each stage. `console`: a rich Console to draw on (default: rich's)."""

  def __init__(self, console=None):
    self._console = console
    self._progress = None
    self._task = None
    self._finalizer = None

  def start(self, epoch: int, total: float | None, completed: int) -> None:
    from rich import progress  # pylint: disable=import-outside-toplevel
    if self._progress is None:
      self._progress = progress.Progress(
          progress.TextColumn("[bold]{task.description}"), progress.BarColumn(),
          progress.MofNCompleteColumn(), progress.TextColumn("{task.fields[rate]}"),
          progress.TimeElapsedColumn(), console=self._console)
      self._progress.start()
      # The bar's refresh thread must not outlive a loader that was never closed.
      self._finalizer = weakref.finalize(self, self._progress.stop)
    total = None if total is None or total == float("inf") else int(total)
    self._task = self._progress.add_task(f"epoch {epoch}", total=total, completed=completed,
                                         rate="")

  def advance(self, stats: LoaderStats) -> None:
    if self._task is not None:
      self._progress.update(self._task, advance=1, rate=progress_text(stats))

  def end_epoch(self) -> None:
    if self._task is not None:
      self._progress.stop_task(self._task)
      self._task = None

  def close(self) -> None:
    if self._finalizer is not None:
      self._finalizer()
    self._progress = self._task = self._finalizer = None
