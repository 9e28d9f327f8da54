"""jaxport.data.loader over PyTorch DataLoaders and torch tensors."""
import itertools
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from data_support import assert_batches_equal, host, spy_on_to_jax
import jaxport.data
import jaxport.interop


class Records(Dataset):
  def __init__(self, n):
    self.n = n

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    return {"id": torch.tensor(i, dtype=torch.int32), "x": torch.full((3,), float(i)),
            "half": torch.full((2,), float(i), dtype=torch.bfloat16)}


def ids(batch):
  return np.asarray(batch["id"]).tolist()


def test_batched_dataloader():
  loader = jaxport.data.loader(DataLoader(Records(7), batch_size=3), last_batch="pad")
  assert len(loader) == 3
  out = list(loader)
  assert [ids(b) for b in out] == [[0, 1, 2], [3, 4, 5], [6, 0, 0]]
  assert np.asarray(out[2]["mask"]).tolist() == [True, False, False]
  assert out[0]["half"].dtype == jnp.bfloat16 and out[0]["x"].dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out[1]["half"], np.float32), [[3, 3], [4, 4], [5, 5]])


def test_len_follows_drop_last():
  assert len(jaxport.data.loader(DataLoader(Records(7), batch_size=3))) == 2
  assert len(jaxport.data.loader(DataLoader(Records(6), batch_size=3))) == 2
  assert len(jaxport.data.loader(DataLoader(Records(7), batch_size=3, drop_last=True))) == 2
  assert len(jaxport.data.loader(DataLoader(Records(7), batch_size=3), last_batch="partial")) == 3


def test_unbatched_dataloader_is_batched_by_the_loader():
  out = list(jaxport.data.loader(DataLoader(Records(5), batch_size=None), batch_size=2,
                                 last_batch="partial"))
  assert [ids(b) for b in out] == [[0, 1], [2, 3], [4]]


def test_double_batching_is_an_error():
  with pytest.raises(ValueError, match="already batches"):
    jaxport.data.loader(DataLoader(Records(4), batch_size=2), batch_size=2)


def test_torch_tensors_reach_to_jax_and_are_aliased(monkeypatch):
  seen = spy_on_to_jax(monkeypatch)
  tensors = [torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) + i for i in range(2)]
  out = list(jaxport.data.loader(tensors, prefetch=0))
  assert seen == [torch.Tensor, torch.Tensor]
  for tensor, array in zip(tensors, out):
    assert array.unsafe_buffer_pointer() == tensor.data_ptr()
    np.testing.assert_array_equal(array, tensor.numpy())


def test_tensors_requiring_grad_are_detached():
  weights = torch.ones(2, 3, requires_grad=True)
  out = next(iter(jaxport.data.loader([weights * 2])))
  np.testing.assert_array_equal(out, np.full((2, 3), 2.0))


def test_sparse_and_nested_tensors_raise_type_error():
  sparse = torch.eye(3).to_sparse()
  with pytest.raises(TypeError, match=r"leaf \['s'\] is a torch tensor with layout torch.sparse_coo"):
    list(jaxport.data.loader([{"s": sparse}]))
  nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
  with pytest.raises(TypeError, match=r"leaf \[0\] is a torch nested \(ragged\) tensor"):
    list(jaxport.data.loader([(nested,)]))


def test_strings_collated_by_the_dataloader_raise_type_error():
  class Named(Records):
    def __getitem__(self, i):
      return {**super().__getitem__(i), "name": f"record-{i}"}

  with pytest.raises(TypeError, match=r"leaf \['name'\]\[0\] is a Python str"):
    list(jaxport.data.loader(DataLoader(Named(4), batch_size=2)))


def epochs_of(loader, epochs):
  for _ in range(epochs):
    yield from loader


@pytest.mark.parametrize("make", [
    lambda: DataLoader(Records(9), batch_size=2, shuffle=True),  # the loader seeds the sampler
    lambda: DataLoader(Records(9), batch_size=2, shuffle=True,
                       generator=torch.Generator().manual_seed(3)),  # the user's generator
    lambda: DataLoader(TensorDataset(torch.arange(9)), batch_size=2),  # sequential
], ids=["seeded-by-loader", "user-generator", "sequential"])
@pytest.mark.parametrize("stop", [0, 3, 4, 7])
def test_resume_replays_the_same_order(make, stop):
  def run(state=None, loader_seed=11):
    return jaxport.data.loader(make(), seed=loader_seed, state=state, last_batch="pad", prefetch=2)

  expected = [host(b) for b in epochs_of(run(), 2)]
  first = run()
  received = [host(b) for b in itertools.islice(epochs_of(first, 2), stop)]
  state = json.loads(json.dumps(first.state()))
  first.close()
  # Another seed argument: the state's own seed wins, so the order is still the saved one.
  resumed = run(state, loader_seed=99)
  received += [host(b) for b in epochs_of(resumed, 2 - state["epoch"])]
  assert_batches_equal(received, expected)


def test_shuffled_epochs_differ_and_the_seed_decides_them():
  def orders(seed):
    loader = jaxport.data.loader(DataLoader(Records(8), batch_size=4, shuffle=True), seed=seed)
    return [sum((ids(b) for b in loader), []) for _ in range(2)]

  first, again, other = orders(1), orders(1), orders(2)
  assert first == again and first != other and first[0] != first[1]


class CountedRecords(Records):
  """Records that count their reads (in this process: num_workers=0)."""

  def __init__(self, n):
    super().__init__(n)
    self.reads = []

  def __getitem__(self, i):
    self.reads.append(int(i))
    return super().__getitem__(i)


@pytest.mark.parametrize("make", [
    lambda data: DataLoader(data, batch_size=2, shuffle=True),
    lambda data: DataLoader(data, batch_size=2, shuffle=True,
                            generator=torch.Generator().manual_seed(3)),
    lambda data: DataLoader(data, batch_size=None, shuffle=True),  # the loader batches examples
], ids=["seeded-by-loader", "user-generator", "examples"])
@pytest.mark.parametrize("stop", [1, 3, 4, 7])
def test_seek_resume_reads_nothing_before_the_step_and_equals_replay(make, stop):
  def run(data, state=None):
    source = make(data)
    return jaxport.data.loader(source, seed=11, state=state, last_batch="pad", prefetch=0,
                               torch_resume="seek",
                               batch_size=2 if source.batch_size is None else None)

  expected = [host(b) for b in epochs_of(run(CountedRecords(9)), 2)]
  first = run(CountedRecords(9))
  received = [host(b) for b in itertools.islice(epochs_of(first, 2), stop)]
  state = json.loads(json.dumps(first.state()))
  data = CountedRecords(9)
  resumed = run(data, state)
  rest = [host(b) for b in epochs_of(resumed, 2 - state["epoch"])]
  assert_batches_equal(received + rest, expected)
  delivered = [i for b in rest for i, valid in zip(ids(b[0] if isinstance(b, tuple) else b),
                                                    mask_of(b)) if valid]
  assert sorted(data.reads) == sorted(delivered)   # nothing read before the step


def mask_of(batch):
  mask = batch["mask"] if isinstance(batch, dict) else batch[1]
  return np.asarray(mask).tolist()


@pytest.mark.slow   # spawns worker processes (~15-30 s)
def test_seek_with_worker_processes_equals_an_uninterrupted_run():
  def run(state=None):
    # spawn: forking a process that runs JAX's threads can deadlock.
    source = DataLoader(TensorDataset(torch.arange(12)), batch_size=2, shuffle=True,
                        num_workers=2, multiprocessing_context="spawn")
    return jaxport.data.loader(source, seed=5, state=state, torch_resume="seek")

  expected = [host(b) for b in epochs_of(run(), 2)]
  first = run()
  received = [host(b) for b in itertools.islice(epochs_of(first, 2), 4)]
  resumed = run(json.loads(json.dumps(first.state())))
  received += [host(b) for b in epochs_of(resumed, 2)]
  assert_batches_equal(received, expected)


def test_seek_is_refused_where_items_cannot_be_skipped_unread():
  class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
      return iter(range(4))

  with pytest.raises(ValueError, match="map-style dataset.*RandomAccess"):
    jaxport.data.loader(DataLoader(Stream(), batch_size=2), torch_resume="seek")
  with pytest.raises(ValueError, match="torch DataLoaders only"):
    jaxport.data.loader([np.zeros(2)], torch_resume="seek")
  with pytest.raises(ValueError, match="replay.*seek"):
    jaxport.data.loader(DataLoader(Records(4), batch_size=2), torch_resume="skip")
