"""Candidate sampling (`ops/candidate_sampling.py`) against TF: ComputeAccidentalHits bit for bit
(eagerly, and under jit where its padded hits go through SparseToDense as in
`sampled_softmax_loss`); the samplers' probabilities and expected counts against TF's, their draws
against TF's distributions; a sampled-softmax training graph under jit against a Session."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.errors import PaddedSizeError
from oracle import assert_close

raw = tf.raw_ops


def _hits_dense(true_classes, sampled):
  """`sampled_softmax_loss`'s use of the hits: a [batch, num_sampled] mask of -FLT_MAX."""
  indices, ids, weights = tf.nn.compute_accidental_hits(true_classes, sampled, num_true=true_classes.shape[1])
  coordinates = tf.concat([tf.reshape(indices, [-1, 1]), tf.reshape(tf.cast(ids, tf.int32), [-1, 1])], 1)
  shape = tf.stack([tf.shape(true_classes)[0], tf.shape(sampled)[0]])
  return raw.SparseToDense(sparse_indices=coordinates, output_shape=shape, sparse_values=weights,
                           default_value=0.0, validate_indices=False)


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 4), num_true=st.integers(1, 3), num_sampled=st.integers(0, 6), seed=st.integers(0, 99))
def test_accidental_hits_match_tf(batch, num_true, num_sampled, seed):
  """Repeated classes on both sides (a repeated sample: its last position, as TF's map keeps)."""
  rs = np.random.RandomState(seed)
  true = rs.randint(0, 6, (batch, num_true)).astype(np.int64)
  sampled = rs.randint(0, 6, num_sampled).astype(np.int64)
  hits = lambda t, s: tf.nn.compute_accidental_hits(t, s, num_true=num_true)  # noqa: E731
  expected = [x.numpy() for x in tf.function(hits)(true, sampled)]
  jax_fn, params = jaxport.convert(tf.function(hits), true, sampled)
  assert_close(jax_fn(params, true, sampled)[0], expected, 0, 0, "eager")
  dense = tf.function(_hits_dense)
  jax_dense, params = jaxport.convert(dense, true, sampled)
  assert_close(jax.jit(jax_dense)(params, true, sampled)[0], dense(true, sampled).numpy(), 0, 0, "jit, dense")


def test_accidental_hits_under_jit_refuse_other_uses():
  true, sampled = np.array([[1, 3], [3, 5]], np.int64), np.array([3, 9, 1], np.int64)
  count = lambda t, s: tf.size(tf.nn.compute_accidental_hits(t, s, num_true=2)[0])  # noqa: E731
  jax_fn, params = jaxport.convert(tf.function(count), true, sampled)
  assert int(jax_fn(params, true, sampled)[0]) == 3   # eagerly TF's count
  with pytest.raises(PaddedSizeError, match="ComputeAccidentalHits node .* as many outputs as true classes"):
    jax.jit(jax_fn)(params, true, sampled)


SAMPLERS = {   # LogUniformCandidateSampler, UniformCandidateSampler, FixedUnigramCandidateSampler
    "log_uniform": lambda t, n, unique: tf.random.log_uniform_candidate_sampler(t, 2, n, unique, 40),
    "uniform": lambda t, n, unique: tf.random.uniform_candidate_sampler(t, 2, n, unique, 40),
    "fixed_unigram": lambda t, n, unique: tf.random.fixed_unigram_candidate_sampler(
        t, 2, n, unique, 40, unigrams=list(range(1, 38)), distortion=0.75, num_reserved_ids=3),
}
TRUE = np.array([[0, 1], [5, 39], [17, 3]], np.int64)


def _convert_sampler(name, num_sampled, unique):
  fn = tf.function(lambda t: SAMPLERS[name](t, num_sampled, unique))
  return fn, *jaxport.convert(fn, TRUE)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_probabilities_match_tf(name):
  """Without `unique` every expected count is p * num_sampled: the true classes' against TF's, and the
  drawn classes' against TF's for the same classes (fed to TF as true classes)."""
  fn, jax_fn, params = _convert_sampler(name, 6, False)
  sampled, true_expected, sampled_expected = jax.jit(jax_fn)(params, TRUE, rng=jax.random.key(0))[0]
  assert sampled.shape == (6,) and np.all((sampled >= 0) & (sampled < 40))
  assert_close(true_expected, fn(TRUE)[1].numpy(), 0, 1e-6, "true_expected_count")
  _, tf_expected, _ = SAMPLERS[name](np.asarray(sampled, np.int64).reshape(3, 2), 6, False)
  assert_close(sampled_expected, tf_expected.numpy().reshape(-1), 0, 1e-6, "sampled_expected_count")


def _tries(expected, p, num_sampled):
  """The number of draws TF's unique sampler made, from an expected count: 1 - (1 - p) ** tries, or
  p * num_sampled when no draw was repeated."""
  expected, p = np.asarray(expected, np.float64), np.float64(p)
  none_repeated = np.isclose(expected, p * num_sampled, rtol=1e-6, atol=0)
  return np.where(none_repeated, num_sampled, np.log1p(-np.minimum(expected, 1 - 1e-12)) / np.log1p(-p))


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_unique_sampler_draws_as_tf(name):
  """unique=True: distinct classes, expected counts from the number of draws that took, and the
  same distributions as TF's over many calls: how often each class is drawn, how many draws."""
  runs, num_sampled = 400, 12
  fn, jax_fn, params = _convert_sampler(name, num_sampled, True)
  draw = jax.jit(jax.vmap(lambda key: jax_fn(params, TRUE, rng=key)[0]))
  sampled, true_expected, sampled_expected = draw(jax.random.split(jax.random.key(1), runs))
  assert all(len(set(row.tolist())) == num_sampled for row in np.asarray(sampled))
  _, p, _ = SAMPLERS[name](TRUE, 1, False)   # p * 1
  ours = _tries(true_expected[:, 1, 0], p.numpy()[1, 0], num_sampled)   # class 5: p > 0 in all three
  assert np.all(ours >= num_sampled - 1e-3) and np.allclose(ours, np.round(ours), atol=2e-2)
  tf.random.set_seed(0)   # TF's draws, reproducible
  rows = [fn(TRUE) for _ in range(runs)]
  theirs = _tries([r[1].numpy()[1, 0] for r in rows], p.numpy()[1, 0], num_sampled)
  assert abs(ours.mean() - theirs.mean()) < 4 * np.sqrt((ours.var() + theirs.var()) / runs) + 1e-6
  frequency = lambda s: np.bincount(np.asarray(s).reshape(-1), minlength=40) / runs  # noqa: E731
  ours_f, theirs_f = frequency(sampled), frequency([r[0].numpy() for r in rows])   # how often each class is in
  both = (ours_f + theirs_f) / 2
  assert np.all(np.abs(ours_f - theirs_f) <= 5 * np.sqrt(2 * both * (1 - both) / runs) + 1e-9)
  # the drawn classes' expected counts at the same number of draws as the true classes'
  p_sampled = np.asarray(SAMPLERS[name](np.asarray(sampled[0], np.int64).reshape(-1, 2), 1, False)[1]).reshape(-1)
  tries = np.round(ours[0])
  expected = p_sampled * num_sampled if tries == num_sampled else -np.expm1(tries * np.log1p(-p_sampled))
  assert_close(sampled_expected[0], expected.astype(np.float32), 1e-6, 1e-5, "sampled_expected_count")


def test_all_candidate_sampler_matches_tf():
  """AllCandidateSampler: every class, each expected once; TF's range check on the true classes."""
  true = TRUE % 5
  fn = tf.function(lambda t: tf.random.all_candidate_sampler(t, 2, 5, True))
  jax_fn, params = jaxport.convert(fn, true)
  assert_close(jax.jit(jax_fn)(params, true)[0], [x.numpy() for x in fn(true)], 0, 0, "all")
  out_of_range = tf.function(lambda: tf.random.all_candidate_sampler(tf.constant(TRUE), 2, 5, True))
  jax_fn, params = jaxport.convert(out_of_range)
  with pytest.raises(jaxport.errors.AssertionFailedError, match=r"out of range \[0, 5\), received 5"):
    jax_fn(params)   # TF: InvalidArgumentError, naming the first such class


@pytest.mark.parametrize("loss_name,partitioned", [("sampled_softmax_loss", False), ("nce_loss", True),
                                                    ("sampled_softmax_loss", True)])
def test_sampled_softmax_training_graph_under_jit_matches_session(loss_name, partitioned):
  """A TF1 word2vec-style step: `sampled_softmax_loss` or `nce_loss` with fed sampled values (so TF
  is deterministic) and accidental hits removed, trained by Adagrad; partitioned: the embedding and
  the output weights partitioned variables (looked up with `max_norm`, `partition_strategy="div"`).
  Three steps under jit against a Session's: the losses and every variable."""
  from tf1_oracle import v1_graph
  v1 = tf.compat.v1
  rs = np.random.RandomState(0)
  feeds = {"x": np.array([1, 2, 3, 4], np.int64), "labels": np.array([[2], [3], [7], [5]], np.int64),
           "sampled": np.array([3, 0, 7, 11, 2, 9], np.int64)}   # three accidental hits
  feeds["true_expected"] = rs.uniform(0.1, 0.9, (4, 1)).astype(np.float32)
  feeds["sampled_expected"] = rs.uniform(0.1, 0.9, 6).astype(np.float32)
  with v1_graph() as g:
    x, labels = v1.placeholder(tf.int64, [4], "x"), v1.placeholder(tf.int64, [4, 1], "labels")
    sampled = v1.placeholder(tf.int64, [6], "sampled")
    true_expected = v1.placeholder(tf.float32, [4, 1], "true_expected")
    sampled_expected = v1.placeholder(tf.float32, [6], "sampled_expected")
    parts = (lambda n: dict(partitioner=v1.fixed_size_partitioner(n))) if partitioned else (lambda n: {})
    emb = v1.get_variable("emb", [16, 8], initializer=v1.random_uniform_initializer(-1, 1, seed=1), **parts(2))
    w = v1.get_variable("w", [16, 8], initializer=v1.truncated_normal_initializer(seed=2), **parts(3))
    b = v1.get_variable("b", [16], initializer=v1.zeros_initializer())
    h = v1.nn.embedding_lookup(emb, x, partition_strategy="div", max_norm=1.0 if partitioned else None)
    loss = tf.reduce_mean(getattr(v1.nn, loss_name)(
        w, b, labels, h, num_sampled=6, num_classes=16, partition_strategy="div",
        sampled_values=(sampled, true_expected, sampled_expected), remove_accidental_hits=True))
    train = v1.train.AdagradOptimizer(0.5).minimize(loss)
    with tf.control_dependencies([train]):
      tf.identity(loss, name="loss_after")
    variables = v1.global_variables()
  graph_ops = {n.op for n in g.as_graph_def().node}
  assert "ComputeAccidentalHits" in graph_ops and ("DynamicPartition" in graph_ops) == partitioned
  with v1.Session(graph=g) as sess:
    sess.run(v1.global_variables_initializer())
    initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
    losses = [sess.run("loss_after:0", {f"{k}:0": v for k, v in feeds.items()}) for _ in range(3)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  names = list(feeds)
  jax_fn, state = jaxport.convert_graph_def(g.as_graph_def(), names, "loss_after", variables=initial)
  step = jax.jit(jax_fn)
  for expected in losses:
    loss_value, state = step(state, *[feeds[k] for k in names])
    assert_close(loss_value, expected, 1e-5, 1e-6, "loss")
  for key, value in final.items():
    assert_close(state[key], value, 1e-5, 1e-6, key)


def test_sampled_softmax_with_tfs_sampler_trains_under_jit(tmp_path):
  """The default path: TF's LogUniform sampler inside `sampled_softmax_loss`, drawn from `rng`;
  jitted gradient steps, the loss finite and falling; the same through an exported artifact."""
  v1 = tf.compat.v1
  w = tf.Variable(np.random.RandomState(0).normal(size=(30, 8)).astype(np.float32))
  b = tf.Variable(np.zeros(30, np.float32))

  @tf.function
  def loss_fn(h, labels):
    return tf.reduce_mean(v1.nn.sampled_softmax_loss(w, b, labels, h, num_sampled=10, num_classes=30))

  h = np.random.RandomState(1).normal(size=(16, 8)).astype(np.float32)
  labels = np.random.RandomState(2).randint(0, 30, (16, 1)).astype(np.int64)
  jax_fn, params = jaxport.convert(loss_fn, h, labels)
  loss = lambda p, key: jax_fn(p, h, labels, rng=key)[0]  # noqa: E731
  grad = jax.jit(jax.value_and_grad(loss))
  values = []
  for step in range(30):
    value, g = grad(params, jax.random.key(step))
    params = jax.tree.map(lambda p, d: p - 0.5 * d, params, g)
    values.append(float(value))
  assert np.all(np.isfinite(values)) and np.mean(values[-5:]) < 0.8 * np.mean(values[:5])
  assert all(bool(jnp.all(jnp.isfinite(d))) for d in g.values())

  path = tmp_path / "artifact"   # exported and loaded: the same draws for the same key, and gradients
  jaxport.export(jax_fn, params, h, labels, path=str(path), rng=jax.random.key(0))
  loaded, loaded_params = jaxport.load(str(path))
  key = jax.random.key(99)
  value, g = grad(params, key)
  loaded_value, loaded_g = jax.jit(jax.value_and_grad(lambda p: loaded(p, h, labels, rng=key)[0]))(loaded_params)
  assert_close(loaded_value, value, 0, 1e-6, "loaded loss")
  assert_close(loaded_g, g, 1e-6, 1e-5, "loaded gradients")


def test_fixed_unigram_sampler_reads_a_vocab_file(tmp_path):
  """The counts from the last column of `vocab_file`, as TF reads it; one of two shards: its classes
  are the positions of its ids (every other one after 3 reserved), so range_max is its size."""
  path = tmp_path / "vocab.csv"
  path.write_text("".join(f"word{k},{(k * 7) % 11 + 1}\n" for k in range(37)))
  sampler = lambda t, range_max: tf.random.fixed_unigram_candidate_sampler(  # noqa: E731
      t, 2, 6, False, range_max, vocab_file=str(path), distortion=0.5, num_reserved_ids=3, num_shards=2, shard=1)
  fn = tf.function(lambda t: sampler(t, 20))
  true = TRUE % 20
  jax_fn, params = jaxport.convert(fn, true)
  sampled, true_expected, _ = jax.jit(jax_fn)(params, true, rng=jax.random.key(0))[0]
  assert np.all((np.asarray(sampled) >= 0) & (np.asarray(sampled) < 20))
  assert_close(true_expected, fn(true)[1].numpy(), 0, 1e-6, "true_expected_count")
  with pytest.raises(jaxport.errors.InvalidNodeError, match="range is 40 must be equal to weights size 20"):
    wrong, params = jaxport.convert(tf.function(lambda t: sampler(t, 40)), true)
    wrong(params, true, rng=jax.random.key(0))   # TF: InvalidArgumentError with the same words
