"""tf.data service pipelines through jaxport.data.loader, against a real dispatcher and two
workers on localhost (in this process; in a subprocess for the two-process test): the loader never shards a service read, pads each
worker's short batch, takes states at epoch boundaries only and resumes them on a new job; two
JAX processes (jax.distributed on localhost) split one job exactly once per epoch and run the
same number of steps (data_service_worker.py)."""
import collections
import contextlib
import gc
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import jaxport.data  # noqa: E402
from jaxport.data._tf_service import service_jobs  # noqa: E402
from jaxport.errors import LoaderStateError  # noqa: E402
from data_support import run_workers  # noqa: E402
from test_data_multiprocess import free_port  # noqa: E402

WORKER = pathlib.Path(__file__).with_name("data_service_worker.py")
TIMEOUT_S = 300
service = tf.data.experimental.service


@pytest.fixture(scope="module")
def target():
  """A dispatcher and two workers in a subprocess, killed at the end (`servers_process`): stopping
  in-process servers once clients have left blocked a CI worker's teardown for ~50 s."""
  with servers_process() as address:
    yield address
    gc.collect()  # service iterators left in cycles go while their servers still answer


@pytest.fixture(autouse=True)
def collect_iterators():
  """Service iterators left in reference cycles (a test's frames kept by an exception's
  traceback) are freed right after their test: left for later, each takes seconds to go."""
  yield
  gc.collect()


def distributed(target, job_name, *, batch=None, mode="distributed_epoch"):
  dataset = tf.data.Dataset.range(100)
  if batch:
    dataset = dataset.batch(batch)  # each worker batches its own split: one short batch each
  return dataset.apply(service.distribute(mode, target, job_name=job_name))


def epoch_ids(loader) -> tuple[list[int], int]:
  ids, steps = [], 0
  for batch, mask in loader:
    steps += 1
    assert batch.shape == mask.shape
    ids += np.asarray(batch)[np.asarray(mask)].tolist()
  return ids, steps


def test_service_reads_are_found_through_later_stages(target):
  dataset = distributed(target, "find").map(lambda x: x + 1).batch(2).prefetch(1)
  assert service_jobs(dataset) == [("find", "distributed_epoch")]
  dataset_id = service.register_dataset(target, tf.data.Dataset.range(3))
  by_id = service.from_dataset_id("parallel_epochs", target, dataset_id,
                                  tf.TensorSpec([], tf.int64))
  assert service_jobs(by_id.take(2)) == [("", "parallel_epochs")]
  assert service_jobs(tf.data.Dataset.range(3).map(lambda x: x)) == []


def test_each_workers_short_batch_is_padded_and_every_example_seen_once(target):
  loader = jaxport.data.loader(distributed(target, "short", batch=8), last_batch="pad")
  for _ in range(2):  # each epoch is a new iteration of the job
    ids, steps = epoch_ids(loader)
    assert sorted(ids) == list(range(100))
    assert steps >= 13  # 100 = 12 * 8 + 4, and each of the two workers may end short
  loader.close()


def test_state_at_epoch_boundaries_only_and_resume_on_a_new_job(target):
  loader = jaxport.data.loader(distributed(target, "resume"), batch_size=10, last_batch="pad")
  assert loader.state()["source_state"] == {"epoch_start": True, "jobs": ["resume"]}
  iterator = iter(loader)
  next(iterator)
  with pytest.raises(jaxport.data.NotResumableError, match="epoch boundary") as refused:
    loader.state()
  assert "job_name not used before" in str(refused.value) and "IGNORE" not in str(refused.value)
  for _ in iterator:
    pass
  saved = loader.state()
  loader.close()
  assert (saved["epoch"], saved["step"]) == (1, 0)
  # The fix the error suggests: the same pipeline on a job_name never used before.
  resumed = jaxport.data.loader(distributed(target, "resume-resume1"), batch_size=10,
                                last_batch="pad", state=saved)
  assert resumed.epoch == 1
  ids, steps = epoch_ids(resumed)
  assert sorted(ids) == list(range(100)) and steps == 10
  resumed.close()
  # What the error warns against: the finished job's name again gives an empty epoch.
  with pytest.warns(UserWarning, match="again"):
    stale = jaxport.data.loader(distributed(target, "resume"), batch_size=10, last_batch="pad",
                                state=saved)
  with pytest.warns(UserWarning, match="no data"):
    assert epoch_ids(stale) == ([], 0)
  stale.close()
  bad = {**saved, "step": 3}
  with pytest.raises(LoaderStateError):
    jaxport.data.loader(distributed(target, "resume-2"), batch_size=10, last_batch="pad",
                        state=bad)


def test_checkpoint_every_is_refused_with_the_reason(target):
  with pytest.raises(ValueError, match="leave checkpoint_every unset"):
    jaxport.data.loader(distributed(target, "snap"), batch_size=10, checkpoint_every=2)
  loader = jaxport.data.loader(distributed(target, "snap"), batch_size=10)  # the fix
  assert sorted(epoch_ids_plain(loader)) == list(range(100))
  loader.close()


def epoch_ids_plain(loader) -> list[int]:
  return [int(x) for batch in loader for x in np.asarray(batch)]


@contextlib.contextmanager
def servers_process(workers: int = 2):
  """A dispatcher and `workers` workers in a subprocess (killed at the end: stopping servers
  whose clients have left can take half a minute); yields the dispatcher's target."""
  servers = subprocess.Popen([sys.executable, str(WORKER), "servers", str(workers)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
  timer = threading.Timer(TIMEOUT_S, servers.kill)  # no target line: readline returns ""
  timer.start()
  try:
    target = servers.stdout.readline().strip()
    timer.cancel()
    assert target.startswith("grpc://"), "the tf.data service did not start"
    yield target
  finally:
    timer.cancel()
    servers.kill()
    servers.wait()


def run_consumers(target: str) -> list[dict]:
  port = free_port()
  return run_workers(WORKER, [["consumer", str(i), str(port), target] for i in range(2)], TIMEOUT_S)


@pytest.mark.slow
def test_two_processes_split_one_job_exactly_once_with_equal_steps():
  with servers_process() as target:
    reports = run_consumers(target)

  def union(name, epoch=None):
    parts = [r[name] if epoch is None else r[name][epoch] for r in reports]
    assert parts[0]["steps"] == parts[1]["steps"], name  # the same number of steps everywhere
    assert parts[0]["global_examples"] == parts[1]["global_examples"], name
    return collections.Counter(parts[0]["ids"] + parts[1]["ids"]), parts

  for epoch in range(2):
    seen, parts = union("distributed", epoch)
    assert seen == collections.Counter(range(100)), f"epoch {epoch}"  # exactly once
    assert parts[0]["global_examples"] == 100
    # The loader did not shard the job again: the service's split, uneven or not, is all there.
    assert parts[0]["steps"] >= -(-max(len(p["ids"]) for p in parts) // 4)
  assert all("epoch boundary" in r["distributed"][0]["refused"] for r in reports)
  seen, parts = union("resumed")
  assert seen == collections.Counter(range(100)) and parts[0]["epoch"] == 2
  # parallel_epochs: each of the 2 workers produces the whole dataset. A shared job splits those
  # 2 copies between the processes; without a job_name each process reads its own 2 copies.
  seen, _ = union("parallel_shared")
  assert seen == collections.Counter(2 * list(range(100)))
  _, parts = union("parallel_own")
  for part in parts:
    assert collections.Counter(part["ids"]) == collections.Counter(2 * list(range(100)))
  for report in reports:
    assert "last_batch='pad'" in report["errors"]["drop"]
    assert "job_name=" in report["errors"]["unnamed"]
