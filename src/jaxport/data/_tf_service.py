"""tf.data service pipelines: datasets read through `tf.data.experimental.service.distribute` or
`from_dataset_id`.

The service, not the loader, decides which process gets which element: the loader never applies
`Dataset.shard` to a service read, whatever `shard_by_process` says. With a shared `job_name`:
  * "distributed_epoch" (and the static sharding policies): every element of an epoch goes to
    exactly one consumer, first come first served, so a process's share is not known up front;
  * "parallel_epochs": every worker produces the whole dataset, so a job hands out one copy per
    worker per epoch, split between the consumers (without a job_name each process gets its own
    job: a copy per worker each).
Every process must still run the same number of steps. The processes agree on it as they go:
every `LOOKAHEAD` batches each one publishes how many batches it read (fewer than `LOOKAHEAD`:
its share of the epoch has ended) in the jax.distributed key-value store; a round lasts the
most any process read, the others fill it with all-padding batches (mask False), and the epoch
ends when every process has ended. That needs `last_batch="pad"`. Agreement runs in the prefetch
thread, off the consumer's path, one store round trip per round (~1.6 ms on localhost); other
sources never reach it.

Resume: tf.data cannot checkpoint a service iterator (TF 2.21: SerializeIterator fails with
"SaveInternal is not yet supported"); its position lives in the service's workers. `state()` works
at epoch boundaries only and a restored loader starts that epoch afresh, from a new job.
"""
import collections
import warnings
from typing import Any, Iterator

import numpy as np
from jax.tree_util import tree_flatten_with_path

from jaxport.data import _tf_compat
from jaxport.data._batches import BatchLayout, Flat, LastBatch, pad
from jaxport.data._leaves import aligned_empty
from jaxport.data._sources import NotResumableError, TFDataSource
from jaxport.errors import LoaderStateError

LOOKAHEAD = 4  # batches each process reads per agreement round
PEER_TIMEOUT_MS = 600_000  # how long a process waits for the others' round (their step can be slow)
_POLICIES = {0: "parallel_epochs", 1: "distributed_epoch", 2: "FILE", 3: "DATA",
             4: "FILE_OR_DATA", 5: "HINT"}
_streams: collections.Counter = collections.Counter()  # service loaders made per job, this process


def service_jobs(dataset: Any) -> list[tuple[str, str]]:
  """(job_name, processing mode) of every tf.data service read in the pipeline; [] if none."""
  return [(name, _POLICIES.get(policy, str(policy)))
          for name, policy in _tf_compat.data_service_jobs(dataset)]


def not_resumable(epoch: int, step: int) -> str:
  return (
      f"jaxport.data: this loader reads a tf.data service job and is at step {step} of epoch "
      f"{epoch}. tf.data cannot checkpoint a service iterator (its position lives in the "
      "service's workers), so the loader's state can only be taken at an epoch boundary: call "
      "state() before the epoch's first batch or after its loop ended. To resume from such a "
      "state, build the dataset again with a job_name not used before on this dispatcher (a "
      "finished job's name yields no data), e.g. f'{name}-resume{n}', and restore the state "
      "into a loader over it: the saved epoch starts afresh.")


class TFServiceSource(TFDataSource):
  """A tf.data pipeline that reads from the tf.data service: never sharded by the loader, no
  iterator snapshots, states at epoch boundaries only, steps agreed between processes."""
  kind = "tf.data service"
  steps_agreed_online = True

  def __init__(self, dataset: Any, jobs: list[tuple[str, str]], *, batch_size: int | None,
               processes: int, index: int, drop_remainder: bool, checkpoint_every: int | None,
               prefetch: int, prefetch_bytes: int | None = None):
    if checkpoint_every is not None:
      raise ValueError("jaxport.data: checkpoint_every= snapshots the tf.data iterator, which "
                       "tf.data cannot do for a service read (its position lives in the "
                       "service's workers); leave checkpoint_every unset.")
    if processes > 1 and drop_remainder:
      raise ValueError(
          "jaxport.data: the tf.data service hands each process a share of the data that is not "
          "known up front, so the processes run out at different steps; they fill the steps "
          "left with padding, which needs last_batch='pad' (its mask marks the padded rows).")
    unnamed = [mode for name, mode in jobs if not name and mode != "parallel_epochs"]
    if processes > 1 and unnamed:
      raise ValueError(
          f"jaxport.data: the tf.data service read ({unnamed[0]}) has no job_name, so each of the "
          f"{processes} processes would start its own job and see every element. Pass the same "
          "job_name= to distribute()/from_dataset_id() in every process to split one job between "
          "them (or distinct names, e.g. f'{name}-{jax.process_index()}', if each process "
          "should see the whole dataset).")
    super().__init__(dataset, batch_size=batch_size, processes=processes, index=index,
                     shard=False, drop_remainder=drop_remainder, checkpoint_every=None,
                     prefetch=prefetch, prefetch_bytes=prefetch_bytes)
    self.jobs, self._processes = jobs, processes
    self._rows = batch_size if batch_size is not None else self._static_batch
    self._agreement = None
    if processes > 1:
      names = ",".join(name for name, _ in jobs)
      _streams[names] += 1
      self._agreement = StepAgreement(f"jaxport.data/tf.data-service/{names}/{_streams[names]}",
                                      processes, index)

  def count(self) -> float | None:
    # With several consumers a process's share is decided as the service runs.
    return None if self._processes > 1 else super().count()

  def _snapshot(self, epoch: int, position: int, iterator: Any) -> None:
    pass  # tf.data cannot serialize a service iterator

  def record(self, epoch: int, step: int) -> Any:
    if step:
      raise NotResumableError(not_resumable(epoch, step))
    return {"epoch_start": True, "jobs": [name for name, _ in self.jobs]}

  def load(self, epoch: int, step: int, record: Any) -> None:
    if step:
      raise LoaderStateError("step", f"a tf.data service loader resumes at epoch boundaries only, "
                             f"found step {step}.")
    if not isinstance(record, dict) or set(record) != {"epoch_start", "jobs"} \
        or record["epoch_start"] is not True or not isinstance(record["jobs"], list):
      raise LoaderStateError("source_state", f"expected {{'epoch_start': True, 'jobs': [...]}}, "
                             f"found {record!r:.80}.")
    reused = sorted(set(record["jobs"]) & {name for name, _ in self.jobs} - {""})
    if reused:
      warnings.warn(f"jaxport.data: the restored loader reads tf.data service job {reused[0]!r} "
                    "again. If the dispatcher still knows that job, its finished epochs yield no "
                    "data; give the dataset a job_name not used before.", stacklevel=3)

  def steps(self, epoch: int, start: int, *, policy: LastBatch, layout: BatchLayout,
            steps: float | None = None) -> Iterator[tuple[int, Flat, np.ndarray | None]]:
    """(step, batch, mask) of one epoch: every short batch padded (or dropped, or kept, by
    `policy`), and with several processes, the rounds agreed with the others."""
    if start:
      raise LoaderStateError("step", "a tf.data service loader resumes at epoch boundaries only.")
    if self._agreement is not None:
      _prime(layout, self._dataset.element_spec, self._rows)
    batches = self.batches(epoch, 0)
    step = 0
    while True:
      read = []
      for batch in batches:
        read.append(batch)
        if len(read) == LOOKAHEAD:
          break
      counts = [len(read)] if self._agreement is None else self._agreement.exchange(len(read))
      for batch in read:
        out = _fitted(batch, policy, layout, step)
        if out is not None:
          yield step, *out
          step += 1
      for _ in range(max(counts) - len(read)):
        yield step, layout.empty(), _mask(layout.size, 0)
        step += 1
      if max(counts) < LOOKAHEAD:
        break
    if step == 0:
      warnings.warn(f"jaxport.data: the tf.data service job gave no data in epoch {epoch}. A "
                    "job_name already used (and finished) on this dispatcher yields nothing; "
                    "give the dataset a new job_name.", stacklevel=2)


def _fitted(batch: Flat, policy: LastBatch, layout: BatchLayout,
            step: int) -> tuple[Flat, np.ndarray | None] | None:
  """A batch at the layout's size: short batches (each service worker's last one can be short)
  are padded, dropped or kept by `policy`; None when dropped."""
  layout.learn(batch)
  full = layout.size
  if batch.size > full:
    raise ValueError(
        f"jaxport.data: batch {step} has {batch.size} rows, more than the batch size {full} of "
        "the first batch. A tf.data service read of batches can start with a short one (a "
        "worker's last); batch with drop_remainder=True before distribute(), or pass single "
        "examples and batch_size= to the loader.")
  if policy != "pad":
    return None if policy == "drop" and batch.size < full else (batch, None)
  return (pad(batch, full) if batch.size < full else batch), _mask(full, batch.size)


def _mask(size: int, valid: int) -> np.ndarray:
  mask = aligned_empty((size,), np.bool_, zero=True)
  mask[:valid] = True
  return mask


def _prime(layout: BatchLayout, element_spec: Any, rows: int | None) -> None:
  """Teaches `layout` the batch shape from the element_spec, where that is fully known, so that
  a process the service gave no data can still pad."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if layout.treedef is not None or rows is None:
    return
  specs = tf.nest.flatten(element_spec)
  if not specs or not all(isinstance(spec, tf.TensorSpec) and spec.shape.rank
                          and spec.shape[1:].is_fully_defined() for spec in specs):
    return
  zeros = [np.zeros([rows] + spec.shape[1:].as_list(), spec.dtype.as_numpy_dtype)
           for spec in specs]
  keyed, treedef = tree_flatten_with_path(tf.nest.pack_sequence_as(element_spec, zeros))
  layout.learn(Flat(treedef, tuple(path for path, _ in keyed), [leaf for _, leaf in keyed], rows))


class StepAgreement:
  """Rounds of "how many batches did you read" between the processes, through the
  jax.distributed key-value store (not a device collective: it runs in the prefetch thread, and
  collectives issued from two threads could interleave differently on each process)."""

  def __init__(self, prefix: str, processes: int, index: int):
    self._client = _kv_client()
    self._prefix, self._processes, self._index = prefix, processes, index
    self._round = 0

  def exchange(self, count: int) -> list[int]:
    """Publishes this process's count for the next round; returns every process's."""
    round_, client = self._round, self._client
    client.key_value_set(f"{self._prefix}/{round_}/{self._index}", str(count))
    counts = []
    for peer in range(self._processes):
      if peer == self._index:
        counts.append(count)
        continue
      try:
        counts.append(int(client.blocking_key_value_get(f"{self._prefix}/{round_}/{peer}",
                                                        PEER_TIMEOUT_MS)))
      except Exception as error:  # pylint: disable=broad-except
        raise RuntimeError(
            f"jaxport.data: process {peer} did not report its tf.data service batches within "
            f"{PEER_TIMEOUT_MS // 1000} s (round {round_} of {self._prefix}). Every process must "
            "iterate its loaders over the service in the same order, and as many epochs.") \
            from error
    # Every process has read round r - 1's keys before publishing round r: r - 2's can go.
    if round_ >= 2:
      client.key_value_delete(f"{self._prefix}/{round_ - 2}/{self._index}")
    self._round += 1
    return counts


def _kv_client() -> Any:
  """jax.distributed's key-value store client (private JAX API, no public equivalent)."""
  from jax._src.distributed import global_state  # pylint: disable=import-outside-toplevel
  if global_state.client is None:
    raise RuntimeError("jaxport.data: several JAX processes but no jax.distributed client; call "
                       "jax.distributed.initialize() before creating the loader.")
  return global_state.client
