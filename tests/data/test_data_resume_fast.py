"""Resuming tf.data pipelines without replaying the epoch (issue 13): exact at any step, later
epochs' reshuffles included; the state's position tracks the consumer's step; small states; the
fixes NotResumableError suggests work."""
import itertools
import json
import time
import warnings

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from data_support import assert_batches_equal, host
import jaxport.data
from jaxport.data import NotResumableError
from jaxport.data._state import digest
from jaxport.errors import LoaderStateError

EPOCHS = 3
IGNORE = tf.data.experimental.ExternalStatePolicy.IGNORE


def typical(n=40, buffer=16):
  """range -> shuffle -> map -> (the loader batches: 10 batches of 4) -> prefetch."""
  return (tf.data.Dataset.range(n).shuffle(buffer, seed=3)
          .map(lambda i: {"id": tf.cast(i, tf.int32), "x": tf.fill([3], tf.cast(i, tf.float32))}))


def interleaved():
  """Parallel interleave of per-file ranges, shuffled: 10 batches of 4 per epoch."""
  files = tf.data.Dataset.range(8)
  return (files.interleave(lambda f: tf.data.Dataset.range(f * 10, f * 10 + 5),
                           cycle_length=3, num_parallel_calls=2, deterministic=True)
          .shuffle(12, seed=4).map(lambda i: {"id": tf.cast(i, tf.int32)}))


def run(loader, count, working=False):
  """The next `count` batches over epoch boundaries; a `working` consumer lets the prefetch thread
  read ahead (as a training step does), so that states come from earlier snapshots."""
  out, empty = [], 0
  while len(out) < count and empty < 2:  # an epoch resumed at its end is empty; two: the end
    empty += 1
    for batch in loader:
      empty = 0
      out.append(host(batch))
      if working:
        time.sleep(0.002)
      if len(out) == count:
        break
  return out


@pytest.fixture(scope="module")
def uninterrupted():
  return {name: run(jaxport.data.loader(make(), batch_size=4, prefetch=0), 10 * EPOCHS)
          for name, make in (("typical", typical), ("interleaved", interleaved))}


@pytest.mark.parametrize("name, make, stops", [
    ("typical", typical, [3, 9, 10, 11, 24]),  # mid-epoch, last batch, epoch boundary, epoch 2
    ("interleaved", interleaved, [5, 10, 17]),
])
def test_resume_is_exact_anywhere(uninterrupted, name, make, stops):
  expected = uninterrupted[name]
  for stop in stops:
    first = jaxport.data.loader(make(), batch_size=4, prefetch=2)
    received = run(first, stop, working=True)
    state = json.loads(json.dumps(first.state()))
    first.close()
    assert 0 <= state["source_state"]["position"] <= state["step"]
    resumed = jaxport.data.loader(make(), batch_size=4, prefetch=2, state=state)
    received += run(resumed, 10 * EPOCHS - stop)
    assert_batches_equal(received, expected)


def test_restore_does_not_replay_the_epoch():
  pulled = []

  def note(i):
    pulled.append(int(i))
    return i

  def counted():  # a pure py_function: IGNORE leaves out only its (absent) state
    options = tf.data.Options()
    options.experimental_external_state_policy = IGNORE
    return (tf.data.Dataset.range(400).map(lambda i: tf.py_function(note, [i], tf.int64))
            .shuffle(8, seed=1).with_options(options))

  first = jaxport.data.loader(counted(), batch_size=4, prefetch=0)
  received = run(first, 90)
  state = first.state()
  # Nothing read ahead (prefetch=0 and a consumer waiting): snapshotted at the step itself.
  assert state["source_state"]["position"] == state["step"] == 90
  rest = run(first, 10)
  pulled.clear()
  resumed = jaxport.data.loader(counted(), batch_size=4, prefetch=0, state=state)
  assert_batches_equal(run(resumed, 10), rest)
  # The 90 batches before the step (360 elements) are not read again: the shuffle buffer and the
  # input's position come from the snapshot; only the next 10 batches (+ tf.data's read-ahead).
  assert len(pulled) < 40 + 40 and all(i >= 360 for i in pulled), sorted(pulled)[:5]
  assert sorted(np.concatenate([b for b in received + rest]).tolist()) == list(range(400))


def test_checkpoint_every_bounds_the_distance_to_the_step():
  loader = jaxport.data.loader(typical(200), batch_size=4, prefetch=3, checkpoint_every=1)
  for stop in (7, 31):
    run(loader, stop - loader.step, working=True)
    state = loader.state()
    # The snapshot before the consumer's step (the producer read up to 3 + 1 batches ahead).
    assert state["source_state"]["position"] == state["step"] == stop


def test_typical_state_is_tens_of_kb():
  pipeline = (tf.data.Dataset.range(100_000).shuffle(1000, seed=2)
              .map(lambda i: (tf.cast(i, tf.float32) * 2, i % 10)).batch(32).prefetch(2))
  loader = jaxport.data.loader(pipeline)
  run(loader, 40, working=True)
  size = len(json.dumps(loader.state()))
  loader.close()
  # The 1000-element shuffle buffer (and the epoch's first snapshot) compressed; 239 KB before.
  assert size < 40_000, size


# The fixes NotResumableError suggests -----------------------------------------------------------


def test_from_generator_hint_a_reiterable_python_source_resumes():
  def generate():
    yield from range(10)

  dataset = tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec((), tf.int64))
  loader = jaxport.data.loader(dataset, batch_size=2)
  next(loader)
  with pytest.raises(NotResumableError, match="re-iterable Python source"):
    loader.state()

  class Reiterable:  # the fix: a fresh generator per epoch, in the same order
    def __iter__(self):
      return (np.int64(i) for i in generate())

  first = jaxport.data.loader(Reiterable(), batch_size=2)
  head = run(first, 2)
  resumed = jaxport.data.loader(Reiterable(), batch_size=2, state=first.state())
  assert [np.asarray(b).tolist() for b in head + run(resumed, 3)] == [[0, 1], [2, 3], [4, 5],
                                                                      [6, 7], [8, 9]]


def test_py_function_hint_ignore_resumes_a_pure_function():
  pure = lambda: tf.data.Dataset.range(12).shuffle(12, seed=1).map(
      lambda i: tf.py_function(lambda x: x * 3, [i], tf.int64))
  loader = jaxport.data.loader(pure(), batch_size=3)
  next(loader)
  with pytest.raises(NotResumableError, match="ExternalStatePolicy.IGNORE") as raised:
    loader.state()
  assert "pure" in str(raised.value)
  options = tf.data.Options()
  options.experimental_external_state_policy = IGNORE  # the fix
  expected = run(jaxport.data.loader(pure().with_options(options), batch_size=3), 8)
  first = jaxport.data.loader(pure().with_options(options), batch_size=3, prefetch=2)
  head = run(first, 3, working=True)
  resumed = jaxport.data.loader(pure().with_options(options), batch_size=3,
                                state=json.loads(json.dumps(first.state())))
  assert_batches_equal(head + run(resumed, 5), expected)


def test_stateful_random_hint_stateless_ops_keyed_by_index_resume():
  noisy = tf.data.Dataset.range(12).map(lambda i: tf.cast(i, tf.float32) + tf.random.uniform(()))
  loader = jaxport.data.loader(noisy, batch_size=3)
  next(loader)
  with pytest.raises(NotResumableError, match="stateless_uniform") as raised:
    loader.state()
  assert "RandomUniform" in str(raised.value) and "example_keys" in str(raised.value)
  # The fix: noise keyed by (seed, epoch, index), here from enumerate.
  keyed = lambda epoch: tf.data.Dataset.range(12).enumerate().map(
      lambda index, i: tf.cast(i, tf.float32) + tf.random.stateless_uniform(
          (), seed=tf.stack([tf.constant(7, tf.int64) * 1000 + epoch, index])))
  expected = run(jaxport.data.loader(keyed(0), batch_size=3), 4)
  first = jaxport.data.loader(keyed(0), batch_size=3)
  head = run(first, 2)
  resumed = jaxport.data.loader(keyed(0), batch_size=3, state=first.state())
  assert_batches_equal(head + run(resumed, 2), expected)


def test_a_restored_state_keeps_its_epoch_start_for_later_states(uninterrupted):
  # States taken after a restore (from the restored loader) resume exactly too.
  first = jaxport.data.loader(typical(), batch_size=4, prefetch=2)
  received = run(first, 4, working=True)
  middle = jaxport.data.loader(typical(), batch_size=4, prefetch=2, state=first.state())
  received += run(middle, 5, working=True)
  state = json.loads(json.dumps(middle.state()))
  assert "epoch_start" in state["source_state"] or "first" in state["source_state"]
  last = jaxport.data.loader(typical(), batch_size=4, state=state)
  received += run(last, 10 * EPOCHS - 9)
  assert_batches_equal(received, uninterrupted["typical"])


def test_unread_epoch_iterators_are_snapshotted_on_demand():
  loader = jaxport.data.loader(typical(), batch_size=4, prefetch=0)
  state = loader.state()  # before any batch: the first iterator is made and snapshotted now
  assert state["source_state"]["position"] == 0 and state["step"] == 0
  run(loader, 10)
  list(itertools.islice(loader, 1))  # ends epoch 0
  boundary = loader.state()
  assert (boundary["epoch"], boundary["step"], boundary["source_state"]["position"]) == (1, 0, 0)


def test_symbolic_checkpointing_set_by_the_user_resumes_exactly():
  def make():  # no shuffle: symbolic checkpoints leave the map's and prefetch's buffers out
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    return (tf.data.Dataset.range(30).map(lambda i: i * 2, num_parallel_calls=2)
            .with_options(options))
  expected = run(jaxport.data.loader(make(), batch_size=3), 20)
  first = jaxport.data.loader(make(), batch_size=3, prefetch=2)
  head = run(first, 13, working=True)
  resumed = jaxport.data.loader(make(), batch_size=3, state=json.loads(json.dumps(first.state())))
  assert_batches_equal(head + run(resumed, 7), expected)


def test_each_epoch_makes_only_its_own_iterator():
  # The next epoch's iterator is made when that epoch starts: a loader used for one epoch makes
  # (and snapshots) none it would not read, and states at the boundary still resume exactly.
  loader = jaxport.data.loader(typical(), batch_size=4, prefetch=2)
  run(loader, 10)
  assert list(itertools.islice(loader, 1)) == []  # ends epoch 0
  assert loader._source._made == 1
  boundary = json.loads(json.dumps(loader.state()))  # makes epoch 1's iterator on demand
  assert loader._source._made == 2 and boundary["step"] == 0
  rest = run(loader, 10)
  resumed = jaxport.data.loader(typical(), batch_size=4, prefetch=0, state=boundary)
  assert_batches_equal(run(resumed, 10), rest)


def test_snapshots_are_spaced_by_their_measured_cost():
  source = jaxport.data.loader(typical(), batch_size=4)._source
  source._snapshot_s = 0.01
  due = source._snapshot_due
  assert due(1, 1, 0.0)  # an epoch without a snapshot takes one after its first batch
  assert not due(5, None, 0.19) and due(5, None, 0.2)  # then after 20x its cost of reading
  source._checkpoint_every = 3
  assert [p for p in range(1, 10) if due(p, None, 1.0)] == [3, 6, 9]
  source._snapshot_error = "cannot"
  assert not due(1, 1, 1.0)


def test_stateful_pipelines_under_fail_explain_how_to_resume():
  # TF refuses to serialize such a pipeline's graph even with IGNORE passed (the user's FAIL
  # option wins), which finding its ops for the message needs: the error must still be ours.
  def draws(i):
    return tf.cast(i, tf.float32) + tf.random.uniform([])
  options = tf.data.Options()
  options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.FAIL
  pipeline = tf.data.Dataset.range(400).map(draws).with_options(options)
  loader = jaxport.data.loader(pipeline, batch_size=4, prefetch=2)
  run(loader, 2, working=True)
  with pytest.raises(NotResumableError, match="RandomUniform draws from a random generator"):
    loader.state()
  loader.close()


# Pipelines that replay from their start -------------------------------------------------------


def _options(**values):
  options = tf.data.Options()
  for name, value in values.items():
    setattr(options, name, value)
  return options


RANGE = tf.data.Dataset.range(12)
REPLAYS = {  # pipeline -> whether every fresh iterator yields the same elements in the same order
    "slices, batch, memory cache": (tf.data.Dataset.from_tensor_slices(np.arange(6)).batch(2)
                                    .cache(), True),
    "parallel map, filter, repeat, take, skip, prefetch": (
        RANGE.map(lambda i: i * 2, num_parallel_calls=2).filter(lambda i: i > 2).repeat(2)
        .take(9).skip(1).prefetch(2), True),
    "padded batch, unbatch, shard, zip, concatenate": (
        tf.data.Dataset.zip((RANGE.padded_batch(2).unbatch().shard(2, 0), RANGE))
        .concatenate(tf.data.Dataset.zip((RANGE, RANGE))), True),
    "interleave and flat_map building datasets": (
        RANGE.interleave(lambda i: tf.data.Dataset.range(i), cycle_length=2)
        .flat_map(lambda i: tf.data.Dataset.range(i).map(lambda j: j + 1)), True),
    "tf.cond and stateless random ops": (
        RANGE.map(lambda i: tf.cond(i > 3, lambda: tf.random.stateless_uniform([], [1, i]),
                                    lambda: 0.0)), True),
    "seeded shuffle": (RANGE.shuffle(4, seed=1), False),
    "unseeded shuffle inside flat_map": (RANGE.flat_map(lambda i: tf.data.Dataset.range(i)
                                                        .shuffle(3)), False),
    "random op in a tf.cond branch": (
        RANGE.map(lambda i: tf.cond(i > 3, lambda: i, lambda: tf.random.uniform([], 0, 3,
                                                                                tf.int64))), False),
    "map with deterministic=False": (RANGE.map(lambda i: i, num_parallel_calls=2,
                                               deterministic=False), False),
    "options.deterministic = False": (RANGE.with_options(_options(deterministic=False)), False),
    "parallel interleave (its order is kept out of sight)": (
        RANGE.interleave(lambda i: tf.data.Dataset.range(i), cycle_length=2,
                         num_parallel_calls=2), False),
    "file cache": (RANGE.cache("/nonexistent/never-written"), False),
    "py_function": (RANGE.map(lambda i: tf.py_function(lambda v: v, [i], tf.int64)), False),
    "from_generator": (tf.data.Dataset.from_generator(lambda: iter([1]), output_signature=tf.TensorSpec((), tf.int64)), False),
    "sample_from_datasets": (tf.data.Dataset.sample_from_datasets([RANGE, RANGE]), False),
}


@pytest.mark.parametrize("name", sorted(REPLAYS))
def test_pipelines_that_replay_from_their_start_are_told_apart(name):
  from jaxport.data._tf_compat import replays_from_start
  dataset, replays = REPLAYS[name]
  assert replays_from_start(dataset) is replays
  if replays:  # and they do: two fresh iterators agree
    assert_batches_equal(list(dataset), list(dataset))


def _deterministic():
  """10 batches of 4 per epoch, no randomness: a fresh iterator is the epoch's start."""
  return tf.data.Dataset.range(40).map(lambda i: {"id": i}, num_parallel_calls=2)


def test_a_replayable_pipeline_resumes_exactly_without_unconditional_snapshots(monkeypatch):
  from jaxport.data import _sources, _tf_compat
  expected = run(jaxport.data.loader(_deterministic(), batch_size=4, prefetch=0), 30)
  taken = []
  snapshot = _tf_compat.snapshot_iterator
  monkeypatch.setattr(_tf_compat, "snapshot_iterator",
                      lambda *args: taken.append(1) or snapshot(*args))
  monkeypatch.setattr(_sources, "_SNAPSHOT_GUESS_S", 1e3)  # no snapshot comes by the budget

  first = jaxport.data.loader(_deterministic(), batch_size=4, prefetch=2)
  head = run(first, 13, working=True)  # into epoch 1; the producer reads ahead
  live = first._source._live
  deadline = time.monotonic() + 30
  while live[2] <= first.step and time.monotonic() < deadline:
    time.sleep(0.01)  # until the producer has read ahead: no snapshot at the step then
  state = json.loads(json.dumps(first.state()))
  first.close()
  assert taken == []  # neither at the epochs' starts nor after their first batches
  assert state["epoch"] == 1 and state["step"] == 3
  assert {k: state["source_state"][k] for k in ("position", "fresh")} == {"position": 0,
                                                                          "fresh": True}
  resumed = jaxport.data.loader(_deterministic(), batch_size=4, prefetch=2, state=state)
  assert_batches_equal(head + run(resumed, 17), expected)
  assert taken == []

  bad = json.loads(json.dumps(state))
  bad["source_state"]["position"] = 2
  bad["digest"] = digest(bad)  # past the digest, to the source's own check
  with pytest.raises(LoaderStateError, match="expected 0 with 'fresh'"):
    jaxport.data.loader(_deterministic(), batch_size=4, state=bad)
  monkeypatch.setattr(_tf_compat, "replays_from_start", lambda dataset: False)
  with pytest.raises(LoaderStateError, match="fresh iterator"):
    list(jaxport.data.loader(_deterministic(), batch_size=4, state=state))


# Stages a pipeline is built from in the property test below: (name, dataset -> dataset).
_STAGES = {
    "map": lambda d: d.map(lambda i: i * 3 + 1),
    "parallel map": lambda d: d.map(lambda i: i - 2, num_parallel_calls=2),
    "filter": lambda d: d.filter(lambda i: i % 3 != 0),
    "batch, unbatch": lambda d: d.batch(3).unbatch(),
    "interleave": lambda d: d.interleave(lambda i: tf.data.Dataset.from_tensors(i).repeat(2),
                                         cycle_length=2),
    "repeat, take": lambda d: d.repeat(2).take(45),
    "skip": lambda d: d.skip(2),
    "cache": lambda d: d.cache(),
    "prefetch": lambda d: d.prefetch(2),
    "shuffle": lambda d: d.shuffle(5, seed=7),
    "stateless noise": lambda d: d.map(
        lambda i: i + tf.cast(10 * tf.random.stateless_uniform([], [3, i]), tf.int64)),
}


@settings(max_examples=12, deadline=None)
@given(stages=st.lists(st.sampled_from(sorted(_STAGES)), min_size=1, max_size=4),
       batch=st.integers(1, 4), prefetch=st.integers(0, 3), stop=st.integers(1, 40),
       working=st.booleans())
def test_resume_is_exact_whether_the_pipeline_replays_or_not(stages, batch, prefetch, stop,
                                                             working):
  def make():
    dataset = tf.data.Dataset.range(30)
    for stage in stages:
      dataset = _STAGES[stage](dataset)
    return dataset.map(lambda i: {"id": i})

  per_epoch = len(list(jaxport.data.loader(make(), batch_size=batch, prefetch=0)))
  total = 3 * per_epoch
  expected = run(jaxport.data.loader(make(), batch_size=batch, prefetch=0), total)
  first = jaxport.data.loader(make(), batch_size=batch, prefetch=prefetch)
  stop = min(stop, total)
  received = run(first, stop, working=working)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    state = json.loads(json.dumps(first.state()))
  first.close()
  resumed = jaxport.data.loader(make(), batch_size=batch, prefetch=prefetch, state=state)
  received += run(resumed, total - stop)
  # A state in the first pass of a cache over a shuffle (past its start), or of a pipeline that
  # draws shuffle seeds more than once per epoch, resumes that epoch exactly, and says later
  # epochs may come in another order.
  past_start = state["source_state"].get("position", 0) > 0
  caching = past_start and state["epoch"] == 0 and any(
      stage == "cache" and "shuffle" in stages[:at] for at, stage in enumerate(stages))
  reseeding = stages.count("shuffle") > 1 or any(
      stage == "repeat, take" and "shuffle" in stages[:at] for at, stage in enumerate(stages))
  said = " ".join(str(w.message) for w in caught)
  assert ("fills it anew" in said) == caching, said
  assert ("draws shuffle seeds more than once" in said) == reseeding, said
  exact = (state["epoch"] + 1) * per_epoch if caching or reseeding else total
  assert_batches_equal(received[:exact], expected[:exact])
  assert len(received) == len(expected)


def _cached_shuffle():
  """A memory cache of a shuffled stream: every epoch in the first epoch's order."""
  return (tf.data.Dataset.range(24).shuffle(8, seed=5).cache()
          .map(lambda i: {"id": i}))


def test_a_state_in_a_shuffled_caches_first_pass_says_later_epochs_are_refilled():
  expected = run(jaxport.data.loader(_cached_shuffle(), batch_size=4, prefetch=0), 18)
  first = jaxport.data.loader(_cached_shuffle(), batch_size=4, prefetch=0)
  head = run(first, 3)
  with pytest.warns(UserWarning, match="fills it anew"):
    state = json.loads(json.dumps(first.state()))
  assert state["source_state"]["cache_writer"] is True
  resumed = jaxport.data.loader(_cached_shuffle(), batch_size=4, prefetch=0, state=state)
  assert_batches_equal(head + run(resumed, 3), expected[:6])  # the epoch itself: exact
  # Epoch 1 fills the cache anew: a state in it warns again; one in epoch 2 is exact.
  refill = run(resumed, 2)
  with pytest.warns(UserWarning, match="fills it anew"):
    resumed.state()
  refill += run(resumed, 4)
  cached = run(resumed, 2)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    later = json.loads(json.dumps(resumed.state()))
  assert (later["epoch"], later["step"]) == (2, 2) and "cache_writer" not in later["source_state"]
  assert_batches_equal(cached, refill[:2])  # read from the cache filled in epoch 1
  tail = run(resumed, 4)
  assert_batches_equal(tail, refill[2:])
  again = jaxport.data.loader(_cached_shuffle(), batch_size=4, prefetch=0, state=later)
  assert_batches_equal(run(again, 4), tail)

  # After the first pass the state carries the whole cache: no warning, exact.
  whole = jaxport.data.loader(_cached_shuffle(), batch_size=4, prefetch=0)
  run(whole, 8)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    state = json.loads(json.dumps(whole.state()))
  rest = run(whole, 10)
  assert_batches_equal(run(jaxport.data.loader(_cached_shuffle(), batch_size=4, prefetch=0,
                                               state=state), 10), rest)
  assert_batches_equal(rest, expected[8:])
