"""Per-example random keys (jaxport.data.example_keys / example_rng / example_key): determinism,
independence, and exact resume of randomly augmented streams through Loader.state()/restore()."""
import jax
import numpy as np
import pytest
import tensorflow as tf

from data_support import assert_batches_equal, host
import jaxport.data
from jaxport.data import NotResumableError

SEED = 1234
BATCH = 4
EPOCH_BATCHES = 5  # 20 images


def images():
  return tf.data.Dataset.from_tensor_slices(
      np.arange(20 * 6 * 6, dtype=np.float32).reshape(20, 6, 6, 1))


def augment(key, image):
  keys = tf.random.experimental.stateless_split(key, 2)
  image = tf.image.stateless_random_flip_left_right(image, keys[0])
  return {"image": tf.image.stateless_random_crop(image, [4, 4, 1], keys[1]),
          "noise": tf.random.stateless_uniform([], keys[1], dtype=tf.float32)}


def pipeline(epoch=None):
  shuffled = images().shuffle(20, seed=7, reshuffle_each_iteration=True)
  return jaxport.data.example_keys(shuffled, SEED, epoch=epoch).map(augment)


def keys_of(dataset):
  return [tuple(key.numpy()) for key, _ in dataset]


def run(make_loader, epochs, stop=None):
  """Batches of `epochs` epochs; with stop=(epoch, step), saved there (a JSON round trip) and
  continued by a fresh loader."""
  loader, out, epoch = make_loader(None), [], 0
  while epoch < epochs:
    for batch in loader:
      out.append(host(batch))
      if stop == (epoch, loader.step):
        state = loader.state()
        loader.close()
        loader, stop = make_loader(state), None
        break
    else:
      epoch += 1
  loader.close()
  return out


def test_tf_keys_are_deterministic_and_differ_by_index_epoch_and_seed():
  plain = tf.data.Dataset.range(8)
  first = keys_of(jaxport.data.example_keys(plain, SEED))
  assert len(set(first)) == 8
  assert first == keys_of(jaxport.data.example_keys(plain, SEED))  # a rebuilt pipeline
  again = jaxport.data.example_keys(plain, SEED)
  epochs = [keys_of(again) for _ in range(2)]
  assert epochs[0] == first and not set(epochs[0]) & set(epochs[1])  # fresh keys each epoch
  assert not set(first) & set(keys_of(jaxport.data.example_keys(plain, SEED + 1)))
  fixed = [keys_of(jaxport.data.example_keys(plain, SEED, epoch=e)) for e in (0, 0, 1)]
  assert fixed[0] == fixed[1] and len(set(fixed[0])) == 8 and not set(fixed[0]) & set(fixed[2])
  key, element = next(iter(jaxport.data.example_keys(plain, SEED)))
  assert key.dtype == tf.int64 and key.shape == (2,) and int(element) == 0


def make_tf_loader(state):
  return jaxport.data.loader(pipeline(), batch_size=BATCH, state=state)


@pytest.fixture(scope="module")
def tf_expected():
  expected = run(make_tf_loader, 3)
  assert len(expected) == 3 * EPOCH_BATCHES
  # Epochs differ (reshuffled and re-augmented), so a resume at the wrong epoch would show.
  assert not np.array_equal(expected[0]["noise"], expected[EPOCH_BATCHES]["noise"])
  return expected


@pytest.mark.parametrize("stop", [(0, 1), (1, 1), (2, 4)])
def test_tf_augmented_stream_resumes_exactly(stop, tf_expected):
  assert_batches_equal(run(make_tf_loader, 3, stop), tf_expected)


def test_tf_resume_with_snapshots_and_fixed_epoch():
  make = lambda state: jaxport.data.loader(pipeline(epoch=3), batch_size=BATCH, state=state,
                                           checkpoint_every=2, prefetch=3)
  expected = run(make, 2)
  assert_batches_equal(run(make, 2, (1, 3)), expected)


def flip_and_noise(image, rng):
  return {"image": image[:, ::-1] if rng.random() < 0.5 else image,
          "noise": rng.normal(size=3).astype(np.float32)}


def image(index):
  return np.arange(16, dtype=np.float32).reshape(4, 4) + index


class Augmented:
  """A re-iterable Python source whose examples are augmented with example_rng; it shuffles
  with a generator of its own, also from (seed, epoch)."""

  def __init__(self):
    self.epoch = 0

  def __iter__(self):
    for index in jaxport.data.example_rng(SEED, self.epoch, 2**32).permutation(12):
      yield flip_and_noise(image(index), jaxport.data.example_rng(SEED, self.epoch, int(index)))


class AugmentedByIndex:
  """A random-access source whose examples are augmented with example_rng."""

  def __init__(self):
    self.epoch = 0

  def __len__(self):
    return 12

  def __getitem__(self, index):
    return flip_and_noise(image(index), jaxport.data.example_rng(SEED, self.epoch, index))


@pytest.mark.parametrize("random_access", [False, True])
def test_python_augmented_stream_resumes_exactly(random_access):
  def make(state):
    source = AugmentedByIndex() if random_access else Augmented()
    wrapped = jaxport.data.RandomAccess(source, seed=3) if random_access else source
    return jaxport.data.loader(wrapped, batch_size=BATCH, state=state), source

  def run_python(stop=None):
    (loader, source), out, epoch = make(None), [], 0
    while epoch < 2:
      source.epoch = loader.epoch  # the source learns its epoch from the loader's
      for batch in loader:
        out.append(host(batch))
        if stop == (epoch, loader.step):
          state = loader.state()
          loader.close()
          (loader, source), stop = make(state), None
          break
      else:
        epoch += 1
    return out

  expected = run_python()
  assert len(expected) == 6
  assert not np.array_equal(expected[0]["noise"], expected[3]["noise"])
  assert_batches_equal(run_python((0, 1)), expected)
  assert_batches_equal(run_python((1, 2)), expected)


def test_python_rngs_and_jax_keys():
  draw = lambda *triple: jaxport.data.example_rng(*triple).integers(2**62, size=2).tolist()
  triples = [(0, 0, 0), (0, 0, 1), (0, 1, 0), (1, 0, 0), (2**40, 0, 0)]
  draws = [draw(*t) for t in triples]
  assert draws == [draw(*t) for t in triples]
  assert len({tuple(d) for d in draws}) == len(triples)
  data = lambda *t: tuple(np.asarray(jax.random.key_data(jaxport.data.example_key(*t))).tolist())
  keys = [data(*t) for t in triples + [(2**40 + 2**32, 0, 0)]]
  assert keys[:-1] == [data(*t) for t in triples] and len(set(keys)) == len(keys)
  jitted = jax.jit(lambda e, i: jax.random.key_data(jaxport.data.example_key(5, e, i)))
  assert tuple(np.asarray(jitted(1, 2)).tolist()) == data(5, 1, 2)
  with pytest.raises(ValueError, match="index must be an int"):
    jaxport.data.example_rng(0, 0, -1)
  mapped = jaxport.data.example_rng_map(lambda x, rng: x + rng.random(), SEED, epoch=2)
  assert mapped(3, 1.0) == 1.0 + jaxport.data.example_rng(SEED, 2, 3).random()


def test_stateful_random_ops_are_named_and_the_error_points_to_example_keys():
  stateful = images().map(tf.image.random_flip_left_right).map(
      lambda x: x + tf.random.uniform([]))
  assert jaxport.data.stateful_random_ops(stateful) == ["RandomUniform"]
  assert jaxport.data.stateful_random_ops(pipeline()) == []
  assert jaxport.data.stateful_random_ops([1, 2]) == []
  loader = jaxport.data.loader(stateful, batch_size=BATCH)
  next(loader)
  with pytest.raises(NotResumableError, match=r"(?s)RandomUniform.*example_keys"):
    loader.state()
  loader.close()
  # Following the hint: the same augmentation, stateless, resumes.
  fixed = jaxport.data.example_keys(images(), SEED).map(
      lambda key, x: tf.image.stateless_random_flip_left_right(x, key) + tf.random.stateless_uniform(
          [], tf.random.experimental.stateless_fold_in(key, 1)))
  assert jaxport.data.stateful_random_ops(fixed) == []
  loader = jaxport.data.loader(fixed, batch_size=BATCH)
  next(loader)
  assert jaxport.data.loader(fixed, batch_size=BATCH, state=loader.state()).step == 1
  loader.close()


def test_grain_map_with_index_resumes_exactly():
  grain = pytest.importorskip("grain")
  dataset = grain.MapDataset.range(12).map(image).map_with_index(
      jaxport.data.example_rng_map(flip_and_noise, SEED))
  make = lambda state: jaxport.data.loader(dataset, batch_size=BATCH, state=state)
  expected = run(make, 2)
  assert len(expected) == 6  # epochs read at epoch * len + i: fresh keys, no epoch to pass
  assert not np.array_equal(expected[0]["noise"], expected[3]["noise"])
  assert_batches_equal(run(make, 2, (0, 2)), expected)
  assert_batches_equal(run(make, 2, (1, 1)), expected)
