"""grain as a source (issue 13): MapDatasets read by position (O(1), elastic resume), IterDatasets
and DataLoaders with grain's own iterator state inside the loader's state, for the batch the
consumer received (not the ones read ahead)."""
import itertools
import json

import numpy as np
import pytest

import jaxport.data
from jaxport.data import _grain
from jaxport.data._random_access import RandomAccessSource
from jaxport.errors import LoaderStateError

grain = pytest.importorskip("grain")
from data_grain_ops import Example, example  # noqa: E402  # pylint: disable=wrong-import-position


def ids(batch):
  batch_ids = np.asarray(batch["id"])
  return batch_ids[np.asarray(batch["mask"])].tolist() if "mask" in batch else batch_ids.tolist()


def read(loader, epochs=1):
  return [[ids(batch) for batch in loader] for _ in range(epochs)]


def map_dataset(n=13, seed=4):
  return grain.MapDataset.range(n).shuffle(seed=seed).map(example)


def data_loader(workers=0, n=13):
  return grain.DataLoader(data_source=grain.sources.RangeDataSource(0, n, 1),
                          sampler=grain.samplers.IndexSampler(n, shuffle=True, seed=4,
                                                              num_epochs=1),
                          operations=[Example()], worker_count=workers)


def stop_and_resume(make, stop, **options):
  """The rest of the epoch after `stop` batches: from the running loader (read ahead by its
  prefetch thread) and from a new loader restored from its JSON state."""
  loader = jaxport.data.loader(make(), prefetch=3, **options)
  head = [ids(next(iter(loader))) for _ in range(stop)]
  state = json.loads(json.dumps(loader.state()))
  rest = [ids(batch) for batch in loader]
  loader.close()
  resumed = jaxport.data.loader(make(), state=state, **options)
  return head, rest, [ids(batch) for batch in resumed], state


def test_map_dataset_once_per_epoch_reshuffled_by_grain_and_resumed_in_o1():
  n = 13
  first, second = read(jaxport.data.loader(map_dataset(n), batch_size=4, last_batch="pad"), 2)
  for epoch in (first, second):
    assert sorted(itertools.chain(*epoch)) == list(range(n))
  assert first != second  # grain's shuffle reseeds per epoch (index // len is the epoch)
  assert [first, second] == read(jaxport.data.loader(map_dataset(n), batch_size=4,
                                                     last_batch="pad"), 2)
  head, rest, resumed, state = stop_and_resume(lambda: map_dataset(n), 2, batch_size=4,
                                               last_batch="pad")
  assert state["source"] == "random_access" and head + rest == first and resumed == rest
  # Reads by position: a restored loader reads only the remaining positions of the epoch.
  source = RandomAccessSource(jaxport.data.RandomAccess(map_dataset(n), shuffle=False),
                              batch_size=4, processes=1, index=0, shard=True, seed=None)
  assert [b.leaves[0].tolist() for b in source.batches(0, 2)] == rest


def test_map_dataset_elastic_over_simulated_processes():
  n, batch = 14, 4
  def part(processes, start, stop, record=None):
    sources = [RandomAccessSource(_as_random_access(map_dataset(n)), batch_size=batch // processes,
                                  processes=processes, index=i, shard=True, seed=None)
               for i in range(processes)]
    for source in sources:
      if record is not None:
        source.load(1, start, record)
    seen = [int(i) for source in sources
            for b in itertools.islice(source.batches(1, start), stop - start) for i in b.leaves[0]]
    return seen, sources[0].record(1, stop)
  head, record = part(2, 0, 2)
  tail, _ = part(4, 2, 4, record)
  assert sorted(head + tail) == list(range(n))


def _as_random_access(dataset):
  spec = jaxport.data.RandomAccess(dataset, shuffle=False)
  assert spec.epoch_indices  # grain's index convention: epoch e reads e * len + i
  return spec


def test_iter_dataset_resumes_with_grains_state():
  make = lambda: map_dataset(13).to_iter_dataset()
  whole = read(jaxport.data.loader(make(), batch_size=4, last_batch="pad"))[0]
  assert sorted(itertools.chain(*whole)) == list(range(13))
  head, rest, resumed, state = stop_and_resume(make, 2, batch_size=4, last_batch="pad")
  assert state["source"] == "grain" and head + rest == whole and resumed == rest
  assert state["source_state"] == {"iterator": {"next_index": 8}}  # not what was read ahead
  loader = jaxport.data.loader(make(), batch_size=4, last_batch="pad")
  list(loader)  # at the epoch boundary
  resumed = jaxport.data.loader(make(), batch_size=4, last_batch="pad", state=loader.state())
  assert resumed.epoch == 1 and read(resumed) == [whole]
  # Already batched in grain: the loader takes the batches as they are.
  batched = lambda: map_dataset(13).batch(4, drop_remainder=True).to_iter_dataset()
  head, rest, resumed, _ = stop_and_resume(batched, 1)
  assert len(head + rest) == 3 and resumed == rest


def test_grain_state_encoding_round_trips_bytes_and_tuples():
  state = {"a": b"\x00\xff", "b": (1, [2, b"x"]), "c": None, "d": 1.5, "e": np.int64(3)}
  encoded = json.loads(json.dumps(_grain.encode(state)))
  assert _grain.decode(encoded) == {**state, "e": 3}


def test_a_foreign_grain_state_is_refused():
  loader = jaxport.data.loader(map_dataset(13).to_iter_dataset(), batch_size=4)
  next(iter(loader))
  state = loader.state()
  with pytest.raises(LoaderStateError) as raised:
    list(jaxport.data.loader(data_loader(), batch_size=4, state=state))
  assert raised.value.field == "source_state.iterator"


def test_data_loader_resumes_with_grains_state():
  whole = read(jaxport.data.loader(data_loader(), batch_size=4, last_batch="pad"))[0]
  assert sorted(itertools.chain(*whole)) == list(range(13))
  head, rest, resumed, state = stop_and_resume(data_loader, 2, batch_size=4, last_batch="pad")
  assert head + rest == whole and resumed == rest
  assert "__bytes_base64__" in state["source_state"]["iterator"]  # grain's bytes, as base64


@pytest.mark.slow  # grain starts worker processes that import jax: ~20-50 s on a busy machine
def test_data_loader_with_worker_processes():
  whole = read(jaxport.data.loader(data_loader(), batch_size=4, last_batch="pad"))[0]
  loader = jaxport.data.loader(data_loader(workers=2), batch_size=4, last_batch="pad", prefetch=3)
  head = [ids(next(iter(loader))) for _ in range(2)]
  state = json.loads(json.dumps(loader.state()))
  rest = [ids(batch) for batch in loader]
  loader.close()
  assert head + rest == whole  # the workers keep the sampler's order
  resumed = jaxport.data.loader(data_loader(workers=2), batch_size=4, last_batch="pad",
                                state=state)
  assert [ids(batch) for batch in resumed] == rest
