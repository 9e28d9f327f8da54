"""jaxport.data.loader over plain Python iterables: structure, batching, dtypes, errors,
prefetching, observability and resume."""
import collections
import gc
import itertools
import json
import subprocess
import sys
import threading
import types
import time
import traceback

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_support import ReadAheadProbe, assert_batches_equal, host, spy_on_to_jax
import jaxport.data
import jaxport.interop
from jaxport.data import NotResumableError
from jaxport.data import _prefetch

Pair = collections.namedtuple("Pair", "left right")


def examples(n, start=0):
  return [{"x": np.full((2, 3), i, np.float32), "id": np.int32(i),
           "meta": Pair(np.uint8(i % 7), np.array([i, -i], np.int16))}
          for i in range(start, start + n)]


def batches(n, size):
  """Pre-batched source: n batches of `size` rows (ids 0...), as (features, labels) tuples."""
  return [(np.arange(b * size, (b + 1) * size, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32),
           np.arange(b * size, (b + 1) * size, dtype=np.int32)) for b in range(n)]


def ids(batch):
  return np.asarray(batch["id"]).tolist()


def test_nested_structure_and_dtypes_are_kept():
  out = list(jaxport.data.loader(examples(6), batch_size=3))
  assert len(out) == 2
  first = out[0]
  assert isinstance(first["meta"], Pair)
  leaves = jax.tree.leaves(first)
  assert all(isinstance(leaf, jax.Array) for leaf in leaves)
  assert {k: v.dtype for k, v in first.items() if k != "meta"} == {"x": jnp.float32, "id": jnp.int32}
  assert first["meta"].left.dtype == jnp.uint8 and first["meta"].right.dtype == jnp.int16
  np.testing.assert_array_equal(first["x"], np.stack([np.full((2, 3), i, np.float32) for i in range(3)]))
  np.testing.assert_array_equal(out[1]["meta"].right, [[3, -3], [4, -4], [5, -5]])


def test_stacked_and_padded_batches_are_handed_over_without_copies(monkeypatch):
  seen = spy_on_to_jax(monkeypatch)  # asserts that every leaf is shared, not copied
  list(jaxport.data.loader(examples(5), batch_size=2, last_batch="pad", prefetch=0))
  assert seen == [np.ndarray] * (3 * 5)  # 3 batches of 4 leaves and a mask


def test_jax_array_leaves_pass_through():
  arrays = [jnp.arange(4) + i for i in range(2)]
  assert all(a is b for a, b in zip(jaxport.data.loader(arrays), arrays))


def test_64_bit_leaves_follow_jax_canonical_dtypes():
  out = next(iter(jaxport.data.loader([(np.arange(4, dtype=np.int64), np.ones(4, np.float64))])))
  assert out[0].dtype == jnp.int32 and out[1].dtype == jnp.float32
  np.testing.assert_array_equal(out[0], np.arange(4))


@pytest.mark.parametrize("policy, expected_sizes", [("drop", [4, 4]), ("partial", [4, 4, 2]),
                                                    ("pad", [4, 4, 4])])
def test_last_batch_of_examples(policy, expected_sizes):
  out = list(jaxport.data.loader(examples(10), batch_size=4, last_batch=policy))
  assert [b["id"].shape[0] for b in out] == expected_sizes
  assert sum((ids(b) for b in out), []) == (list(range(8)) if policy == "drop" else list(range(10))) + (
      [0, 0] if policy == "pad" else [])
  if policy == "pad":
    assert [np.asarray(b["mask"]).tolist() for b in out] == [[True] * 4] * 2 + [[True, True, False, False]]
    assert out[2]["mask"].dtype == jnp.bool_
    np.testing.assert_array_equal(out[2]["x"][2:], 0)
  else:
    assert all("mask" not in b for b in out)


def test_pad_adds_mask_next_to_non_dict_batches():
  source = batches(2, 3) + [batches(3, 2)[2]]  # a last batch of 2 rows
  out = list(jaxport.data.loader(source, last_batch="pad"))
  assert len(out) == 3
  (features, labels), mask = out[2]
  assert features.shape == (3, 2) and np.asarray(mask).tolist() == [True, True, False]
  np.testing.assert_array_equal(labels, [4, 5, 0])
  assert [np.asarray(m).all() for _, m in out[:2]] == [True, True]


@pytest.mark.parametrize("policy", ["drop", "partial"])
def test_prebatched_short_last_batch(policy):
  source = batches(2, 3) + [batches(3, 2)[2]]
  out = list(jaxport.data.loader(source, last_batch=policy))
  assert [b[1].shape[0] for b in out] == ([3, 3] if policy == "drop" else [3, 3, 2])


def test_short_batch_before_the_end_is_an_error():
  full = batches(2, 3)
  source = [full[0], batches(3, 2)[2], full[1]]
  with pytest.raises(ValueError, match="batch 1 has 2 rows .* only the last batch"):
    list(jaxport.data.loader(source, last_batch="partial"))


def test_pad_mask_key_collision():
  with pytest.raises(ValueError, match="already has one"):
    list(jaxport.data.loader([{"x": np.zeros(2), "mask": np.zeros(2)}], batch_size=2, last_batch="pad"))


# Dtype policy ----------------------------------------------------------------------------------


def test_cast_every_float_leaf():
  out = next(iter(jaxport.data.loader(examples(2), batch_size=2, dtypes=jnp.bfloat16)))
  assert out["x"].dtype == jnp.bfloat16 and out["id"].dtype == jnp.int32
  assert out["meta"].right.dtype == jnp.int16


def test_cast_by_source_dtype_and_by_key_path():
  source = [{"features": {"image": np.full((2, 2), 3, np.uint8), "scale": np.float32(0.5)},
             "label": np.int32(1)}] * 2
  policy = {np.uint8: jnp.float32, "features/scale": jnp.bfloat16, "label": np.float32}
  out = next(iter(jaxport.data.loader(source, batch_size=2, dtypes=policy)))
  assert out["features"]["image"].dtype == jnp.float32
  assert out["features"]["scale"].dtype == jnp.bfloat16
  assert out["label"].dtype == jnp.float32
  np.testing.assert_array_equal(out["features"]["image"], np.full((2, 2, 2), 3.0))


def test_key_path_beats_source_dtype_and_longer_path_wins():
  source = [{"a": {"b": np.float32(1), "c": np.float32(2)}}] * 2
  policy = {np.float32: jnp.float16, "a": jnp.bfloat16, "a/c": np.int32}
  out = next(iter(jaxport.data.loader(source, batch_size=2, dtypes=policy)))
  assert out["a"]["b"].dtype == jnp.bfloat16 and out["a"]["c"].dtype == jnp.int32


def test_unknown_key_path_names_the_leaves():
  with pytest.raises(KeyError, match="'imgae'.*'image'"):
    list(jaxport.data.loader([{"image": np.zeros(2)}], dtypes={"imgae": jnp.bfloat16}))


def test_bfloat16_host_leaves_are_kept():
  source = [np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)]
  out = next(iter(jaxport.data.loader(source)))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.arange(4))


# Leaves JAX cannot hold ------------------------------------------------------------------------


@pytest.mark.parametrize("source, path, what", [
    ([{"x": np.zeros(2), "name": np.array(["a", "b"])}], r"\['name'\]", "string array"),
    ([{"x": np.zeros(2), "name": np.array([b"a", b"b"])}], r"\['name'\]", "bytes array"),
    ([(np.zeros(2), np.array([np.zeros(2), np.zeros(3)], dtype=object))], r"\[1\]", "object array"),
    ([{"x": np.zeros(2), "tags": ["a", "b"]}], r"\['tags'\]\[0\]", "Python str"),
    ([{"x": np.zeros(2), "when": np.array(["2020-01-01"] * 2, "datetime64[D]")}], r"\['when'\]",
     "datetime64"),
])
def test_unsupported_leaves_raise_type_error_with_key_path(source, path, what):
  with pytest.raises(TypeError, match=rf"leaf {path} .*{what}"):
    list(jaxport.data.loader(source))


def test_ragged_examples_raise_type_error_with_key_path():
  source = [{"tokens": np.arange(3)}, {"tokens": np.arange(4)}]
  with pytest.raises(TypeError, match=r"\['tokens'\] is ragged"):
    list(jaxport.data.loader(source, batch_size=2))


def test_leaves_must_share_the_batch_dimension():
  with pytest.raises(ValueError, match=r"\[1\] has 3 rows"):
    list(jaxport.data.loader([(np.zeros(2), np.zeros(3))]))


# Prefetching -----------------------------------------------------------------------------------


def failing_source(good):
  for i in range(good):
    yield {"id": np.arange(2, dtype=np.int32) + 2 * i}
  raise ValueError("corrupt record")


@pytest.mark.parametrize("prefetch", [0, 2])
def test_source_error_reaches_the_consumer_with_its_traceback(prefetch):
  loader = jaxport.data.loader(failing_source(3), prefetch=prefetch)
  received = []
  with pytest.raises(ValueError, match="corrupt record") as error:
    for batch in loader:
      received.append(ids(batch))
  assert received == [[0, 1], [2, 3], [4, 5]]
  assert "failing_source" in [frame.name for frame in traceback.extract_tb(error.value.__traceback__)]
  with pytest.raises(RuntimeError, match="raised earlier"):
    next(loader)
  assert loader.step == 3
  loader.close()


def test_restore_after_a_source_error_continues_from_the_last_delivered_batch():
  data = examples(10)

  class Flaky:
    """Re-iterable; the first pass fails after 5 examples."""
    passes = 0

    def __iter__(self):
      Flaky.passes += 1
      for i, example in enumerate(data):
        if Flaky.passes == 1 and i == 5:
          raise OSError("disk hiccup")
        yield example

  loader = jaxport.data.loader(Flaky(), batch_size=2, prefetch=3)
  received = []
  with pytest.raises(OSError):
    for batch in loader:
      received += ids(batch)
  loader.restore(loader.state())
  received += sum((ids(b) for b in loader), [])
  assert received == list(range(10))


def prefetch_threads():
  return [t for t in threading.enumerate() if t.name.startswith("jaxport-data-prefetch")]


def wait_until(predicate, timeout=5.0):
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if predicate():
      return True
    time.sleep(0.01)
  return predicate()


def test_close_mid_epoch_stops_the_thread_and_is_idempotent():
  loader = jaxport.data.loader(examples(40), batch_size=2, prefetch=2)
  next(loader)
  thread = loader._feed.thread
  assert thread.is_alive()
  loader.close()
  assert wait_until(lambda: not thread.is_alive())
  loader.close()
  with pytest.raises(RuntimeError, match="closed"):
    next(loader)
  with pytest.raises(RuntimeError, match="closed"):
    iter(loader)


def test_context_manager_closes():
  with jaxport.data.loader(examples(40), batch_size=2) as loader:
    next(loader)
    thread = loader._feed.thread
  assert wait_until(lambda: not thread.is_alive())


def test_garbage_collection_stops_the_thread():
  loader = jaxport.data.loader(examples(40), batch_size=2, prefetch=1)
  next(loader)
  thread = loader._feed.thread
  del loader
  gc.collect()
  assert wait_until(lambda: not thread.is_alive())


def test_close_never_hangs_on_a_blocked_source(monkeypatch):
  monkeypatch.setattr(_prefetch, "_JOIN_S", 0.2)
  release = threading.Event()

  def stuck():
    yield np.zeros(1)
    release.wait(30)
    yield np.zeros(1)

  loader = jaxport.data.loader(stuck(), prefetch=2)
  began = time.monotonic()
  next(loader)  # delivered while the source blocks on the next element
  assert time.monotonic() - began < 5.0
  began = time.monotonic()
  loader.close()
  assert time.monotonic() - began < 2.0
  release.set()


def test_prefetch_fills_the_queue_and_overlaps_with_the_step():
  delay, n = 0.03, 8

  def slow():
    for i in range(n):
      time.sleep(delay)
      yield np.full(2, i)

  loader = jaxport.data.loader(slow(), prefetch=2)
  next(loader)
  assert wait_until(lambda: loader.stats().queue_depth == 2)
  loader.close()

  def run(prefetch, wait_s):
    probe = ReadAheadProbe(n)

    def source():
      for i in range(n):
        probe.produced(i)
        yield np.full(2, i)
    return probe.steps_that_overlapped(jaxport.data.loader(source(), prefetch=prefetch), wait_s)

  assert run(prefetch=2, wait_s=30.0) == [True] * (n - 1)
  assert run(prefetch=0, wait_s=0.2) == [False] * (n - 1)


def producing_threads(consume_s: float, n: int = 40) -> list[str]:
  """The thread that produced each batch when the consumer spends `consume_s` on each."""
  names = []

  def source():
    for i in range(n):
      names.append(threading.current_thread().name)
      yield np.full(2, i)

  for _ in jaxport.data.loader(source(), prefetch=2):
    if consume_s:
      time.sleep(consume_s)
  return names


def test_a_consumer_waiting_on_data_produces_its_batches_itself(monkeypatch):
  # No handoff from a thread per batch: the loop produces inline (the thread may take the first).
  # A frozen clock makes every return to get() immediate, whatever the machine's load.
  from jaxport.data import _prefetch
  monkeypatch.setattr(_prefetch, "time", types.SimpleNamespace(perf_counter=lambda: 0.0,
                                                               monotonic=time.monotonic))
  names = producing_threads(0.0)
  inline = names.count(threading.current_thread().name)
  assert inline >= len(names) - 1 - 2, names   # at most the first wake-up's read-ahead


def test_a_working_consumer_has_its_batches_read_ahead():
  names = producing_threads(0.005)
  ahead = sum(name.startswith("jaxport-data-prefetch") for name in names)
  assert ahead >= 0.8 * len(names), names


@pytest.mark.parametrize("depth", [0, 2])
def test_feed_keeps_order_and_raises_after_the_results_before_an_error(depth):
  def items():
    yield 1
    yield 2
    raise KeyError("boom")

  feed = _prefetch.Feed(items(), depth, "jaxport-data-prefetch-test")
  assert feed.get() == 1
  if depth:
    assert wait_until(lambda: feed.depth() == 1 and feed._shared.end is not None)
  assert feed.get() == 2
  with pytest.raises(KeyError, match="boom") as raised:
    feed.get()
  assert raised.traceback[-1].name == "items"
  if depth:
    assert "prefetch thread" in "".join(raised.value.__notes__)
  with pytest.raises(KeyError):
    feed.get()
  feed.close()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_interrupted_source_is_not_mistaken_for_its_end(prefetch):
  def source():
    yield np.zeros(1)
    raise KeyboardInterrupt

  loader = jaxport.data.loader(source(), prefetch=prefetch)
  next(loader)
  with pytest.raises(KeyboardInterrupt):
    next(loader)
  with pytest.raises(RuntimeError, match="interrupted") as raised:
    next(loader)
  assert isinstance(raised.value.__cause__, KeyboardInterrupt)


def test_stats_report_throughput_wait_and_depth():
  loader = jaxport.data.loader(examples(8), batch_size=2, prefetch=2)
  delivered = list(loader)
  stats = loader.stats()
  assert stats.batches == len(delivered) == 4
  per_batch = sum(leaf.nbytes for leaf in jax.tree.leaves(delivered[0]))
  assert stats.bytes == 4 * per_batch
  assert stats.seconds > 0 and stats.batches_per_second > 0 and stats.bytes_per_second > 0
  assert 0 <= stats.wait_seconds <= stats.seconds and 0 <= stats.wait_fraction <= 1
  assert stats.prefetch == 2 and 0 <= stats.mean_queue_depth <= 2
  assert "batches/s" in str(stats)


def test_progress_bar_counts_batches():
  with jaxport.data.loader(examples(6), batch_size=2, progress=True) as loader:
    assert len(list(loader)) == 3
    task = loader._bar._progress.tasks[0]
    assert (task.completed, task.total) == (3, 3)


def test_len_and_epochs():
  loader = jaxport.data.loader(examples(7), batch_size=2, last_batch="partial")
  assert len(loader) == 4
  first = [ids(b) for b in loader]
  second = [ids(b) for b in loader]
  assert first == second == [[0, 1], [2, 3], [4, 5], [6]]
  assert loader.epoch == 2 and loader.step == 0
  with pytest.raises(TypeError, match="unknown"):
    len(jaxport.data.loader(iter(examples(2))))


def test_single_device_sharding():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("batch", None, None))
  out = list(jaxport.data.loader(examples(4), batch_size=2, sharding=sharding, last_batch="pad"))
  assert out[0]["x"].sharding == sharding
  assert out[0]["id"].sharding.spec == jax.sharding.PartitionSpec("batch")
  assert out[0]["mask"].sharding.spec == jax.sharding.PartitionSpec("batch")
  via_pair = next(iter(jaxport.data.loader(examples(2), batch_size=2, sharding=(mesh, ("batch",)))))
  assert via_pair["x"].sharding.spec == jax.sharding.PartitionSpec("batch")


@pytest.mark.parametrize("kwargs, error", [
    ({"last_batch": "keep"}, ValueError), ({"prefetch": -1}, ValueError),
    ({"batch_size": 0}, ValueError), ({"sharding": "batch"}, TypeError),
    ({"checkpoint_every": 5}, ValueError)])
def test_argument_errors(kwargs, error):
  with pytest.raises(error):
    jaxport.data.loader(examples(2), **kwargs)


def test_source_type_error():
  with pytest.raises(TypeError, match="source must be"):
    jaxport.data.loader({"x": np.zeros(3)})


# Resume ----------------------------------------------------------------------------------------


def epochs_of(loader, epochs):
  for _ in range(epochs):
    yield from loader


def run_stream(loader, epochs):
  return [host(b) for b in epochs_of(loader, epochs)]


@settings(max_examples=20, deadline=None)
@given(stop=st.integers(0, 9), prefetch=st.sampled_from([0, 1, 3]),
       policy=st.sampled_from(["drop", "pad", "partial"]))
def test_resume_replays_a_reiterable_source_exactly(stop, prefetch, policy):
  source = examples(9)
  expected = run_stream(jaxport.data.loader(source, batch_size=2, last_batch=policy), epochs=2)
  first = jaxport.data.loader(source, batch_size=2, last_batch=policy, prefetch=prefetch)
  received = [host(b) for b in itertools.islice(epochs_of(first, 2), stop)]
  state = json.loads(json.dumps(first.state()))
  first.close()
  resumed = jaxport.data.loader(source, batch_size=2, last_batch=policy, prefetch=prefetch,
                                state=state)
  # The resumed loader may be mid-epoch (one pass left) or at an epoch start.
  received += run_stream(resumed, epochs=2 - state["epoch"])
  assert_batches_equal(received, expected)


def test_one_shot_iterator_is_not_resumable():
  loader = jaxport.data.loader(iter(examples(4)), batch_size=2)
  assert len(list(loader)) == 2
  with pytest.raises(NotResumableError, match="one-shot"):
    loader.state()
  with pytest.raises(NotResumableError, match="one-shot"):
    list(loader)  # a second epoch
  fresh = jaxport.data.loader(iter(examples(4)), batch_size=2)
  with pytest.raises(NotResumableError):
    fresh.restore(jaxport.data.loader(examples(4), batch_size=2).state())


def test_restore_checks_the_configuration():
  state = jaxport.data.loader(examples(4), batch_size=2).state()
  with pytest.raises(ValueError, match="batch_size: saved 2, here 4"):
    jaxport.data.loader(examples(4), batch_size=4, state=state)
  with pytest.raises(ValueError, match="not a loader state"):
    jaxport.data.loader(examples(4), batch_size=2).restore({"step": 3})


def test_import_needs_neither_tensorflow_nor_torch():
  code = ("import sys, numpy as np, jax; jax.config.update('jax_platforms', 'cpu'); "
          "import jaxport.data; "
          "mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ('b',)); "
          "out = list(jaxport.data.loader([{'x': np.ones((2, 2))}] * 3, sharding=(mesh, ('b',)))); "
          "assert len(out) == 3; "
          "print(sorted(m for m in ('tensorflow', 'torch') if m in sys.modules))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.strip().splitlines()[-1] == "[]"
