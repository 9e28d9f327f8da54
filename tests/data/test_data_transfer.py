"""Copies to devices overlap reading, and reused host buffers never change a batch the consumer
holds. Without a GPU, an accelerator is emulated on the CPU device: the loader is told that
placing a batch copies it, as it does to a GPU."""
import threading

import jax
import numpy as np
import pytest

import jaxport.data
from jaxport.data import _host_pool, _transfer
from jaxport.data._host_pool import HostPool
from jaxport.data._tf_read import Retired


def as_accelerator(loader):
  """Makes `loader` place batches as onto an accelerator (before its first batch)."""
  placer = loader._placer  # pylint: disable=protected-access
  placer.copies, placer._accelerator = True, jax.devices()[0]  # pylint: disable=protected-access
  return loader


def logged_source(n, events):
  def batches():
    for i in range(n):
      events.append(("read", i))
      yield {"x": np.full((4, 3), i, np.float32)}
  return batches()


def spy_on_copies(monkeypatch, events):
  """Logs each batch's copy to the device (by the value of its first leaf) and any wait on it."""
  put = jax.device_put

  def logged_put(hosts, device):
    events.append(("copy", int(np.asarray(hosts[0]).flat[0])))
    return put(hosts, device)
  monkeypatch.setattr(_transfer.jax, "device_put", logged_put)
  monkeypatch.setattr(jax, "block_until_ready", lambda tree: events.append(("wait",)) or tree)


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_a_batch_is_copied_while_the_next_is_read(monkeypatch, prefetch):
  n, events = 6, []
  spy_on_copies(monkeypatch, events)
  loader = as_accelerator(jaxport.data.loader(logged_source(n, events), prefetch=prefetch))
  for k, batch in enumerate(loader):
    events.append(("got", k))
    assert float(batch["x"][0, 0]) == k
  assert ("wait",) not in events  # the loader never waits on a copy
  for k in range(n - 1):
    # Copy k is dispatched, then batch k + 1 is read while it runs, then the consumer gets k.
    assert events.index(("copy", k)) < events.index(("read", k + 1)) < events.index(("got", k))


def test_without_prefetch_nothing_is_read_ahead(monkeypatch):
  n, events = 4, []
  spy_on_copies(monkeypatch, events)
  for k, _ in enumerate(as_accelerator(jaxport.data.loader(logged_source(n, events), prefetch=0))):
    events.append(("got", k))
  assert events == [e for k in range(n) for e in (("read", k), ("copy", k), ("got", k))]


def test_an_error_after_a_read_ahead_batch_comes_after_it():
  def failing():
    yield {"x": np.zeros((2,), np.float32)}
    raise OSError("disk gone")
  loader = as_accelerator(jaxport.data.loader(failing(), prefetch=2))
  assert float(next(loader)["x"][0]) == 0.0
  with pytest.raises(OSError, match="disk gone"):
    next(loader)


class Copy:
  """A device array whose copy from host memory finishes when the test says."""

  def __init__(self):
    self.done = False

  def is_ready(self):
    return self.done


def test_a_host_buffer_is_reused_only_once_its_copy_is_done():
  pool = HostPool(keep=2)
  first = pool.take((4, 3), np.float32)
  copy = Copy()
  pool.placed([first], [copy])
  second = pool.take((4, 3), np.float32)
  assert second is not first  # copy still running: the buffer may still be read
  copy.done = True
  assert pool.take((4, 3), np.float32) is first
  assert pool.take((4, 3), np.float32) is not second  # `second` was never placed: not returned


def test_a_host_buffer_is_never_reused_across_shapes_or_dtypes():
  pool = HostPool(keep=2)
  buffer = pool.take((4, 3), np.float32)
  done = Copy()
  done.done = True
  pool.placed([buffer], [done])
  assert pool.take((4, 3), np.int32) is not buffer and pool.take((3, 4), np.float32) is not buffer


def stacked_batches_held(loader, n_batches):
  held = list(loader)
  assert len(held) == n_batches
  return [np.asarray(batch["x"]).copy() for batch in held], held


def expected(n_batches, size):
  return [np.repeat(np.arange(b * size, (b + 1) * size, dtype=np.float32), 3).reshape(size, 3)
          for b in range(n_batches)]


def examples(n):
  return [{"x": np.full((3,), i, np.float32)} for i in range(n)]


def test_batches_the_consumer_holds_are_never_overwritten():
  # On the CPU the batches alias the host buffers they were stacked in: no pool is made, and
  # every batch held keeps its own values.
  loader = jaxport.data.loader(examples(24), batch_size=4, prefetch=2)
  assert loader._placer.pool is None  # pylint: disable=protected-access
  _, held = stacked_batches_held(loader, 6)
  for batch, want in zip(held, expected(6, 4)):
    np.testing.assert_array_equal(np.asarray(batch["x"]), want)


def test_the_overwrite_check_catches_a_pool_on_an_aliasing_device():
  # The check above can fail: forcing a pool where the device aliases host memory (every copy
  # done at once on the CPU) lets later batches overwrite the held ones.
  loader = jaxport.data.loader(examples(24), batch_size=4, prefetch=0)
  loader._placer.pool = HostPool(keep=2)  # pylint: disable=protected-access
  _, held = stacked_batches_held(loader, 6)
  assert any(not np.array_equal(np.asarray(batch["x"]), want)
             for batch, want in zip(held, expected(6, 4)))


def test_an_accelerator_reuses_host_buffers_and_keeps_every_batch(monkeypatch):
  made = []
  allocate = _host_pool.aligned_empty
  monkeypatch.setattr(_host_pool, "aligned_empty", lambda *a, **k: made.append(1) or allocate(*a, **k))
  put = jax.device_put
  # The emulated accelerator copies (a GPU never aliases host memory).
  monkeypatch.setattr(_transfer.jax, "device_put",
                      lambda hosts, device: put([np.array(h, copy=True) for h in hosts], device))
  loader = jaxport.data.loader(examples(48), batch_size=4, prefetch=2)
  as_accelerator(loader)._placer.pool = HostPool(keep=5)  # pylint: disable=protected-access
  _, held = stacked_batches_held(loader, 12)
  for batch, want in zip(held, expected(12, 4)):
    np.testing.assert_array_equal(np.asarray(batch["x"]), want)
  assert len(made) < 12  # buffers were reused


def test_an_accelerator_checks_64_bit_leaves_as_the_cpu_does():
  fits = as_accelerator(jaxport.data.loader([np.arange(3, dtype=np.int64)]))
  out = next(fits)
  assert out.dtype == np.int32 and out.tolist() == [0, 1, 2]
  with pytest.raises(OverflowError, match="do not fit int32"):
    next(as_accelerator(jaxport.data.loader([np.array([2**40], np.int64)])))


def test_finished_tf_iterators_are_deleted_off_the_consumers_thread():
  # Deleting a tf.data iterator just after it ends blocks for ~20-300 ms: the reaper has it
  # deleted off the consumer's thread once it holds the last reference, and a deletion that never
  # ends (a pipeline stuck in its source) holds up no later one.
  deleted, unblock = [], threading.Event()
  gone = {name: threading.Event() for name in ("stuck", "next")}

  class Iterator:
    def __init__(self, name):
      self.name = name

    def __del__(self):
      deleted.append((self.name, threading.current_thread().name))
      gone[self.name].set()
      if self.name == "stuck":
        unblock.wait(120)

  iterator = Iterator("stuck")
  still_used = iterator  # like the source's record of the epoch's live iterator
  Retired().add(iterator)
  del iterator
  assert not gone["stuck"].wait(0.3)  # still referred to
  del still_used
  assert gone["stuck"].wait(60)
  Retired().add(Iterator("next"))
  try:
    assert gone["next"].wait(60)
  finally:
    unblock.set()
  assert [name for name, _ in deleted] == ["stuck", "next"]
  assert all(thread.startswith("jaxport-data-reaper") for _, thread in deleted)
  assert threading.current_thread().name not in {thread for _, thread in deleted}
