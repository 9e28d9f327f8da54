"""A corpus of TF Recommenders 0.7.7 programs: two-tower retrieval (BruteForce top-k, the Retrieval
task's loss, a training step with Adagrad's sparse updates) and a deep & cross network (DCN).

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


def retrieval_training_step():
  """One training step of the TFRS tutorial's two-tower model: the Retrieval loss, then Adagrad. The
  embeddings' sparse gradients are summed per id with tf.unique (padded under jit) and scattered."""
  query, candidate = _tower(USERS, 0), _tower(ITEMS, 1)
  for tower in (query, candidate):   # logits of order 1: at the default scale the softmax is uniform and
    tower.layers[0].embeddings.assign(tower.layers[0].embeddings * 30)   # the biases' gradients cancel to noise
  task = tfrs.tasks.Retrieval()
  optimizer = keras.optimizers.Adagrad(0.1)
  variables = query.trainable_variables + candidate.trainable_variables
  optimizer.build(variables)

  def fn(users, items):
    with tf.GradientTape() as tape:
      loss = task(query(users), candidate(items), compute_metrics=False)
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss
  users, items = _ids(BATCH, USERS, 3), _ids(BATCH, ITEMS, 4)
  users[1], items[2] = users[0], items[0]   # repeated ids: rows summed, and the padding used
  # The candidate tower's bias gradient is zero (each softmax row sums to 1): TF's and ours are float
  # noise (~1e-7), so the variables are compared to 1e-6 absolute; the embeddings move by ~1e-1.
  return fn, (users, items), {"grad": False, "variables_changed": True, "variables_atol": 1e-6}


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


CORPUS = {f.__name__: f for f in [retrieval_brute_force, retrieval_task_loss, retrieval_training_step, dcn]}
IN_CI = ["retrieval_brute_force", "retrieval_training_step", "dcn"]


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(CORPUS.items(), in_ci=IN_CI))
def test_tfrs_program_matches_tf(program):
  fn, args, options = program()
  check_program(program.__name__, "TFRS", fn, *args, **options)
