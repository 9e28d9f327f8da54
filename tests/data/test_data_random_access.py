"""Random-access sources (issue 13): a seeded global shuffle per epoch, every example once per
epoch, O(1) resume from (epoch, step), and elastic restore over another process count."""
import copy
import itertools
import json
import pathlib

import numpy as np
import pytest

import jaxport.data
from jaxport.data import RandomAccess, _random_access, _state
from jaxport.data._random_access import IndexShuffle, RandomAccessSource
from jaxport.errors import LoaderStateError

from data_support import run_workers
from test_data_multiprocess import free_port

WORKER = pathlib.Path(__file__).with_name("data_elastic_worker.py")


class Counted:
  """n examples by index, recording every index read."""

  def __init__(self, n):
    self.n, self.reads = n, []

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    self.reads.append(i)
    return {"id": np.int64(i), "x": np.full(2, i, np.float32)}


def ids(batch):
  """The real (unpadded) example ids of a host or device batch."""
  batch_ids = np.asarray(batch["id"])
  return batch_ids[np.asarray(batch["mask"])].tolist() if "mask" in batch else batch_ids.tolist()


def epochs(loader, count):
  return [[ids(batch) for batch in loader] for _ in range(count)]


def test_every_example_once_per_epoch_and_a_seeded_shuffle_per_epoch():
  n = 13
  first, second = epochs(jaxport.data.loader(RandomAccess(Counted(n), seed=7), batch_size=4,
                                             last_batch="pad"), 2)
  for epoch in (first, second):
    assert sorted(itertools.chain(*epoch)) == list(range(n)) and len(epoch) == 4
  assert first != second
  again = epochs(jaxport.data.loader(RandomAccess(Counted(n)), batch_size=4, last_batch="pad",
                                     seed=7), 2)  # the loader's seed, when RandomAccess has none
  assert again == [first, second]
  other = epochs(jaxport.data.loader(RandomAccess(Counted(n), seed=8), batch_size=4,
                                     last_batch="pad"), 1)
  assert other[0] != first
  drop = epochs(jaxport.data.loader(RandomAccess(Counted(n), seed=7), batch_size=4), 1)[0]
  assert len(drop) == 3 and len(set(itertools.chain(*drop))) == 12
  plain = epochs(jaxport.data.loader(RandomAccess(Counted(n), shuffle=False), batch_size=5,
                                     last_batch="partial"), 1)[0]
  assert plain == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12]]


def test_the_index_shuffle_is_a_permutation_at_any_length():
  for n in (1, 2, 3, 13, 64, 1000):
    for epoch in (0, 1):
      order = IndexShuffle(n, 7, epoch)(np.arange(n))
      assert sorted(order.tolist()) == list(range(n))
  assert IndexShuffle(1000, 7, 0)(np.arange(1000)).tolist() != list(range(1000))
  # 2**40 examples: a batch's positions are computed without a table of that size.
  huge = IndexShuffle(2**40, 3, 5)(np.arange(2**40 - 64, 2**40))
  assert len(set(huge.tolist())) == 64 and (huge < 2**40).all()


def test_sources_past_the_table_size_are_shuffled_per_position(monkeypatch):
  monkeypatch.setattr(_random_access, "_TABLE_MAX", 8)
  first, second = epochs(jaxport.data.loader(RandomAccess(Counted(13), seed=7), batch_size=4,
                                             last_batch="pad"), 2)
  assert sorted(itertools.chain(*first)) == sorted(itertools.chain(*second)) == list(range(13))
  assert first != second


def test_threaded_reads_keep_the_order():
  make = lambda threads: epochs(jaxport.data.loader(
      RandomAccess(Counted(11), seed=3, read_threads=threads), batch_size=4, last_batch="pad"), 2)
  assert make(3) == make(0)


def test_plain_sequences_are_still_iterated_and_objects_need_len_and_getitem():
  loader = jaxport.data.loader([np.arange(3), np.arange(3)])  # batches, as before
  assert loader.state()["source"] == "iterable" and len(list(loader)) == 2
  with pytest.raises(TypeError, match="__len__ and __getitem__"):
    RandomAccess(iter([1, 2]))


@pytest.mark.parametrize("stop_epoch, stop_step", [(0, 2), (1, 0), (1, 3)])
def test_resume_is_exact_and_reads_nothing_before_the_step(stop_epoch, stop_step):
  n, make = 14, lambda source: RandomAccess(source, seed=5)
  whole = epochs(jaxport.data.loader(make(Counted(n)), batch_size=4, last_batch="pad"), 2)
  loader = jaxport.data.loader(make(Counted(n)), batch_size=4, last_batch="pad", prefetch=3)
  for _ in range(stop_epoch):
    list(loader)
  for _ in range(stop_step):
    next(iter(loader))  # the prefetch thread reads ahead of these
  state = json.loads(json.dumps(loader.state()))
  loader.close()
  fresh = Counted(n)
  resumed = jaxport.data.loader(make(fresh), batch_size=4, last_batch="pad", state=state)
  rest = [ids(batch) for batch in resumed]
  assert rest == whole[stop_epoch][stop_step:]
  # Only the examples of the remaining steps were read: none before the resume point.
  assert sorted(fresh.reads) == sorted(itertools.chain(*rest))
  if stop_epoch == 0:
    assert [ids(batch) for batch in resumed] == whole[1]


def _global_order(source_n, batch, processes, seed, epoch, start, stop, record=None):
  """The ids of global steps [start, stop) read by `processes` simulated processes."""
  sources = [RandomAccessSource(RandomAccess(Counted(source_n), seed=seed),
                                batch_size=batch // processes, processes=processes, index=i,
                                shard=True, seed=None) for i in range(processes)]
  if record is not None:
    for source in sources:
      source.load(epoch, start, record)
  batches = [list(itertools.islice(source.batches(epoch, start), stop - start))
             for source in sources]
  seen = [int(i) for per_process in batches for b in per_process for i in b.leaves[0]]
  reads = [i for source in sources
           for i in source._source.reads]  # pylint: disable=protected-access
  return seen, sources[0].record(epoch, stop), reads


@pytest.mark.parametrize("before, after", [(2, 3), (2, 1), (1, 6), (3, 2)])
def test_elastic_restore_simulated_processes(before, after):
  n, batch, seed = 23, 6, 9  # 4 global steps, the last one short
  steps = -(-n // batch)
  for epoch in (0, 1):
    head, record, _ = _global_order(n, batch, before, seed, epoch, 0, 2)
    assert record["position"] == 2 * batch
    tail, _, reads = _global_order(n, batch, after, seed, epoch, 2, steps, record)
    assert sorted(head + tail) == list(range(n))
    assert sorted(reads) == sorted(tail)  # nothing before the global position was read


def test_elastic_restore_through_the_loader():
  """A state saved by process 1 of 2 restores into a one-process loader (the state's process
  fields forged, as the real two-process run is in test_elastic_restore_two_processes_to_one)."""
  n, make = 14, lambda: RandomAccess(Counted(n), seed=2)
  whole = epochs(jaxport.data.loader(make(), batch_size=4, last_batch="pad"), 1)[0]
  loader = jaxport.data.loader(make(), batch_size=4, last_batch="pad")
  next(iter(loader))
  state = _state.seal({**copy.deepcopy(loader.state()), "process_index": 1, "process_count": 2,
                       "local_batch_size": 2})
  resumed = jaxport.data.loader(make(), batch_size=4, last_batch="pad", state=state)
  assert [ids(batch) for batch in resumed] == whole[1:]
  with pytest.raises(LoaderStateError, match="the global batch_size may not") as raised:
    jaxport.data.loader(make(), batch_size=2, last_batch="pad", state=state)
  assert raised.value.field == "batch_size"
  # A source that is not elastic still refuses another process count.
  plain = jaxport.data.loader([np.zeros(2)] * 4)
  forged = _state.seal({**plain.state(), "process_index": 1, "process_count": 2})
  with pytest.raises(LoaderStateError, match="process_index"):
    jaxport.data.loader([np.zeros(2)] * 4, state=forged)


def test_a_state_of_another_source_is_refused():
  loader = jaxport.data.loader(RandomAccess(Counted(10), seed=1), batch_size=2)
  next(iter(loader))
  state = loader.state()
  with pytest.raises(LoaderStateError) as raised:
    jaxport.data.loader(RandomAccess(Counted(12), seed=1), batch_size=2, state=state)
  assert raised.value.field == "source_state.length"
  with pytest.raises(LoaderStateError) as raised:
    jaxport.data.loader(RandomAccess(Counted(10), shuffle=False), batch_size=2, state=state)
  assert raised.value.field == "source_state.seed"


def test_grain_data_sources_are_random_access():
  grain = pytest.importorskip("grain")
  loader = jaxport.data.loader(grain.sources.RangeDataSource(0, 10, 1), batch_size=4,
                               last_batch="pad")
  assert loader.state()["source"] == "random_access"
  assert [np.asarray(b[0])[np.asarray(b[1])].tolist() for b in loader] == [
      [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def _run(processes, state_path, port):
  return run_workers(WORKER, [[str(processes), str(i), str(port), str(state_path)]
                              for i in range(processes)], 300)


@pytest.mark.slow  # three interpreters start jax (and two jax.distributed): ~30-75 s
def test_elastic_restore_two_processes_to_one(tmp_path):
  """Two real processes (jax.distributed on loopback) read epoch 0 and part of epoch 1, then one
  process restores process 1's state and finishes epoch 1: every example exactly once per epoch,
  for a RandomAccess source and a grain MapDataset."""
  state_path = tmp_path / "state.json"
  two = _run(2, state_path, free_port())
  one = _run(1, state_path, free_port())[0]
  for name in ("random_access", "grain"):
    n = two[0][name]["n"]
    epoch0 = two[0][name]["epoch0"] + two[1][name]["epoch0"]
    assert sorted(epoch0) == list(range(n)), (name, epoch0)
    epoch1 = two[0][name]["epoch1"] + two[1][name]["epoch1"] + one[name]["epoch1"]
    assert sorted(epoch1) == list(range(n)), (name, epoch1)
    # The restored process read only the examples it delivered: nothing before the position.
    assert sorted(one[name]["reads"]) == sorted(one[name]["epoch1"])
