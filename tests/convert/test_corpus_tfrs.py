"""A corpus of TF Recommenders 0.7.7 programs: two-tower retrieval (BruteForce top-k, the Retrieval
task's loss) and a deep & cross network (DCN).

TFRS is written for Keras 2: its layers are built with `tf.keras` routed to tf_keras (what
`TF_USE_LEGACY_KERAS=1` does for a whole process). Each converts, matches TF eager and under
`jax.jit`, and takes `jax.grad` against `tf.GradientTape`.
"""
import numpy as np
import pytest
import tensorflow as tf

from corpus_support import sampled
from library_corpus import check_program, legacy_tf_keras

with legacy_tf_keras():
  tfrs = pytest.importorskip("tensorflow_recommenders", reason="tensorflow-recommenders==0.7.7 is not installed")
  import tf_keras as keras

USERS, ITEMS, DIM, BATCH = 30, 40, 8, 6


@pytest.fixture(autouse=True)
def _keras2():
  with legacy_tf_keras():
    yield


def _tower(vocab, seed):
  keras.utils.set_random_seed(seed)
  model = keras.Sequential([keras.layers.Embedding(vocab, 16), keras.layers.Dense(DIM)])
  model(np.zeros((1,), np.int32))
  return model


def _ids(n, vocab, seed):
  return np.random.RandomState(seed).randint(0, vocab, n).astype(np.int32)


def retrieval_brute_force():
  """Top-5 items for a batch of users: the query tower, then BruteForce over the indexed item tower."""
  query, candidate = _tower(USERS, 0), _tower(ITEMS, 1)
  index = tfrs.layers.factorized_top_k.BruteForce(query, k=5)
  index.index(candidate(np.arange(ITEMS, dtype=np.int32)), tf.range(100, 100 + ITEMS))
  return lambda users: index(users), (_ids(BATCH, USERS, 2),), {}


def retrieval_task_loss():
  """The Retrieval task's in-batch softmax loss of a two-tower model (a training step's forward)."""
  query, candidate = _tower(USERS, 0), _tower(ITEMS, 1)
  task = tfrs.tasks.Retrieval()

  def fn(users, items):
    return task(query(users), candidate(items), compute_metrics=False)
  return fn, (_ids(BATCH, USERS, 3), _ids(BATCH, ITEMS, 4)), {}


def dcn():
  """A deep & cross network: two low-rank cross layers beside a deep tower, then a logit."""
  keras.utils.set_random_seed(0)
  x0 = np.random.RandomState(5).normal(size=(BATCH, 12)).astype(np.float32)
  cross1 = tfrs.layers.dcn.Cross(projection_dim=4, kernel_initializer="glorot_uniform")
  cross2 = tfrs.layers.dcn.Cross(projection_dim=4, kernel_initializer="glorot_uniform")
  deep = keras.Sequential([keras.layers.Dense(16, activation="relu"), keras.layers.Dense(8, activation="relu")])
  head = keras.layers.Dense(1)

  def fn(x):
    crossed = cross2(x, cross1(x, x))
    return tf.sigmoid(head(tf.concat([crossed, deep(x)], axis=-1)))
  fn(x0)
  return fn, (x0,), {}


CORPUS = {f.__name__: f for f in [retrieval_brute_force, retrieval_task_loss, dcn]}
IN_CI = ["retrieval_brute_force", "dcn"]


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(CORPUS.items(), in_ci=IN_CI))
def test_tfrs_program_matches_tf(program):
  fn, args, options = program()
  check_program(program.__name__, "TFRS", fn, *args, **options)
