"""Random ops: TF's distributions, shapes and dtypes; stateful ops draw from the `rng` key.

Stateless ops ignore `rng` (they are functions of their seed); their bit-exactness with
TF is tested in test_ops_stateless_random.py."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from test_ops_array import legacy_graph_function

RAW = tf.raw_ops
N = 4000
SEED = np.array([7, 11], np.int32)
KEY = jax.random.key(0)


def run(fn, *args, rng=KEY, jit=False):
  jax_fn, params = jaxport.convert(fn, *args)
  call = lambda *a: jax_fn(params, *a, rng=rng)[0]  # noqa: E731
  return np.asarray((jax.jit(call) if jit else call)(*args))


def assert_moments(x, mean, std, tol=0.05):
  assert abs(x.mean() - mean) < tol * max(std, 1), (x.mean(), mean)
  assert abs(x.std() - std) < tol * max(std, 1), (x.std(), std)


TRUNC_STD = 0.8796256610342398   # std of a standard normal truncated to [-2, 2]

# name -> (function of a seed, dtype, check of the samples)
CONTINUOUS = {
    "RandomUniform": (lambda s: tf.random.uniform([N]), np.float32,
                      lambda x: (x.min() >= 0) & (x.max() < 1), (0.5, 12 ** -0.5)),
    "RandomUniform_bf16": (lambda s: tf.random.uniform([N], dtype=tf.bfloat16), "bfloat16",
                           lambda x: (x.min() >= 0) & (x.max() <= 1), (0.5, 12 ** -0.5)),
    "RandomStandardNormal": (lambda s: tf.random.normal([N]), np.float32, None, (0, 1)),
    "TruncatedNormal": (lambda s: tf.random.truncated_normal([N]), np.float32,
                        lambda x: np.abs(x).max() <= 2, (0, TRUNC_STD)),
    "StatelessRandomUniformV2": (lambda s: tf.random.stateless_uniform([N], s), np.float32,
                                 lambda x: (x.min() >= 0) & (x.max() < 1), (0.5, 12 ** -0.5)),
    "StatelessRandomNormalV2": (lambda s: tf.random.stateless_normal([N], s, mean=1.0, stddev=2.0), np.float32,
                                None, (1, 2)),
    "StatelessTruncatedNormalV2": (lambda s: tf.random.stateless_truncated_normal([N], s), np.float32,
                                   lambda x: np.abs(x).max() <= 2, (0, TRUNC_STD)),
    "StatelessRandomUniform": (lambda s: RAW.StatelessRandomUniform(shape=[N], seed=s), np.float32,
                               lambda x: (x.min() >= 0) & (x.max() < 1), (0.5, 12 ** -0.5)),
    "StatelessRandomNormal": (lambda s: RAW.StatelessRandomNormal(shape=[N], seed=s), np.float32, None, (0, 1)),
    "StatelessTruncatedNormal": (lambda s: RAW.StatelessTruncatedNormal(shape=[N], seed=s), np.float32,
                                 lambda x: np.abs(x).max() <= 2, (0, TRUNC_STD)),
    "RandomGamma": (lambda s: tf.random.gamma([N], 3.0), np.float32, lambda x: x.min() > 0, (3, 3 ** 0.5)),
    "StatelessRandomGammaV3": (lambda s: tf.random.stateless_gamma([N], s, alpha=3.0), np.float32,
                               lambda x: x.min() > 0, (3, 3 ** 0.5)),
    "StatelessRandomGammaV2": (lambda s: RAW.StatelessRandomGammaV2(shape=[N], seed=s, alpha=3.0), np.float32,
                               lambda x: x.min() > 0, (3, 3 ** 0.5)),
    "RandomPoissonV2": (lambda s: tf.random.poisson([N], 4.0), np.float32,
                        lambda x: (x == np.round(x)).all(), (4, 2)),
    "StatelessRandomPoisson": (lambda s: tf.random.stateless_poisson([N], s, lam=4.0, dtype=tf.int32), np.int32,
                               lambda x: x.min() >= 0, (4, 2)),
    "StatelessRandomBinomial": (lambda s: tf.random.stateless_binomial([N], s, counts=10.0, probs=0.3),
                                np.int32, lambda x: (x.min() >= 0) & (x.max() <= 10), (3, 2.1 ** 0.5)),
}


@pytest.mark.parametrize("name", CONTINUOUS)
def test_distribution(name):
  fn, dtype, valid, (mean, std) = CONTINUOUS[name]
  x = run(fn, SEED)
  assert x.shape == (N,) and x.dtype == np.dtype(dtype), (x.shape, x.dtype)
  x = x.astype(np.float64)
  assert valid is None or valid(x)
  assert_moments(x, mean, std)


def test_ops_are_the_ones_named():
  # The table above exercises the op its key names.
  for name, (fn, *_) in CONTINUOUS.items():
    graph = tf.function(fn).get_concrete_function(tf.TensorSpec([2], tf.int32)).graph
    assert name.split("_")[0] in {op.type for op in graph.get_operations()}, name


@pytest.mark.parametrize("fn", [
    lambda s: tf.random.uniform([N], minval=-3, maxval=9, dtype=tf.int32),
    lambda s: tf.random.stateless_uniform([N], s, minval=-3, maxval=9, dtype=tf.int32),
    lambda s: RAW.StatelessRandomUniformInt(shape=[N], seed=s, minval=-3, maxval=9),
], ids=["RandomUniformInt", "StatelessRandomUniformIntV2", "StatelessRandomUniformInt"])
def test_uniform_int(fn):
  x = run(fn, SEED)
  assert x.dtype == np.int32
  np.testing.assert_array_equal(np.unique(x), np.arange(-3, 9))
  assert_moments(x.astype(np.float64), 2.5, (144 - 1) ** 0.5 / 12 ** 0.5)


@pytest.mark.parametrize("fn", [
    lambda s: tf.random.stateless_uniform([N], s, minval=None, maxval=None, dtype=tf.int32),
    lambda s: RAW.StatelessRandomUniformFullInt(shape=[N], seed=s, dtype=tf.uint32),
], ids=["StatelessRandomUniformFullIntV2", "StatelessRandomUniformFullInt"])
def test_uniform_full_int(fn):
  x = run(fn, SEED)
  info = np.iinfo(x.dtype)
  assert x.dtype in (np.int32, np.uint32)
  quarter = (float(info.max) - float(info.min)) / 4
  # The full range is used: every quarter of it gets about a quarter of the samples.
  counts = np.histogram(x.astype(np.float64), bins=4, range=(float(info.min), float(info.max)))[0]
  assert (np.abs(counts - N / 4) < 0.1 * N).all(), (counts, quarter)


@pytest.mark.parametrize("fn", [
    lambda s: tf.random.categorical(tf.math.log([[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]]), N),
    lambda s: tf.random.stateless_categorical(tf.math.log([[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]]), N, s),
], ids=["Multinomial", "StatelessMultinomial"])
def test_categorical(fn):
  x = run(fn, SEED)
  assert x.shape == (2, N) and x.dtype == np.int32   # TF's int64, narrowed without jax x64
  freqs = np.stack([np.bincount(row, minlength=3) / N for row in x])
  np.testing.assert_allclose(freqs, [[0.2, 0.5, 0.3], [0.7, 0.1, 0.2]], atol=0.03)


@pytest.mark.parametrize("fn", [lambda x: tf.random.shuffle(x), lambda x: RAW.RandomShuffle(value=x)],
                         ids=["tf.random.shuffle", "RandomShuffle"])
def test_random_shuffle_permutes_the_first_axis(fn):
  x = np.arange(20, dtype=np.float32).reshape(10, 2)
  out = run(fn, x)
  assert not np.array_equal(out, x)
  np.testing.assert_array_equal(out[np.argsort(out[:, 0])], x)


def test_random_poisson_v1_from_an_old_graph():
  """RandomPoisson (replaced by RandomPoissonV2 in GraphDef version 25) still converts."""
  build = lambda r: RAW.RandomPoissonV2(shape=[N], rate=r, dtype=tf.float32, name="legacy")  # noqa: E731
  fn = legacy_graph_function(np.float32(4.0), build, "RandomPoisson", inputs=2, R=None)
  jax_fn, params = jaxport.convert(fn, np.float32(4.0))
  assert jax_fn.requires_rng
  x = np.asarray(jax.jit(lambda r: jax_fn(params, r, rng=KEY)[0])(np.float32(4.0)))[0]
  assert x.shape == (N,) and x.dtype == np.float32
  assert (x == np.round(x)).all() and x.min() >= 0
  assert_moments(x.astype(np.float64), 4, 2)


def test_gamma_broadcasts_alpha_after_shape():
  out = run(lambda s: tf.random.gamma([N], [1.0, 10.0]), SEED)
  assert out.shape == (N, 2)
  np.testing.assert_allclose(out.mean(0), [1.0, 10.0], rtol=0.1)


# --------------------------------------------------------------------------- keys and seeds


def uniform_pair(seed):
  stateful = tf.random.uniform([8])
  return stateful, tf.random.stateless_uniform([8], seed)


def test_same_rng_same_values_different_rng_different_values():
  a, b, c = (run(uniform_pair, SEED, rng=k) for k in (KEY, KEY, jax.random.key(1)))
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a[0], c[0])
  np.testing.assert_array_equal(a[1], c[1])   # stateless: the seed alone decides


def test_raw_uint32_keys_work():
  out = run(uniform_pair, SEED, rng=jax.random.PRNGKey(3))
  assert out.shape == (2, 8)


def test_distinct_stateful_nodes_draw_independent_values():
  out = run(lambda s: (tf.random.uniform([8]), tf.random.uniform([8])), SEED)
  assert not np.allclose(out[0], out[1])


def test_stateless_equal_seeds_equal_streams_different_seeds_different():
  def fn(s):
    return (tf.random.stateless_uniform([8], s), tf.random.stateless_uniform([8], s),
            tf.random.stateless_uniform([8], s + 1), tf.random.stateless_uniform([8], s[::-1]),
            RAW.StatelessRandomUniform(shape=[8], seed=s))
  same, again, shifted, swapped, v1 = run(fn, SEED)
  np.testing.assert_array_equal(same, again)
  np.testing.assert_array_equal(same, v1)   # V1 and V2 (via its key and counter) share the stream
  assert not np.allclose(same, shifted) and not np.allclose(same, swapped)


def test_seed_plumbing_get_alg_matches_tf():
  jax_fn, params = jaxport.convert(lambda: RAW.StatelessRandomGetAlg())
  out = jax_fn(params)[0]
  assert out.dtype == np.int32 and int(out) == int(RAW.StatelessRandomGetAlg())


def test_seed_plumbing_key_counter_feeds_the_v2_ops():
  """StatelessRandomGetKeyCounter(Alg) is how tf.random.stateless_* reach the V2 ops: the V2 ops
  draw the seed's stream from its key and counter."""
  def fn(s):
    key, counter = RAW.StatelessRandomGetKeyCounter(seed=s)
    key2, counter2, alg2 = RAW.StatelessRandomGetKeyCounterAlg(seed=s)
    alg = RAW.StatelessRandomGetAlg()
    return (RAW.StatelessRandomUniformV2(shape=[N], key=key, counter=counter, alg=alg),
            RAW.StatelessRandomNormalV2(shape=[N], key=key2, counter=counter2, alg=alg2),
            tf.random.stateless_uniform([N], s), tf.random.stateless_uniform([N], s + 1))

  graph = tf.function(lambda s: tf.random.stateless_uniform([2], s)).get_concrete_function(SEED).graph
  assert "StatelessRandomGetKeyCounter" in {op.type for op in graph.get_operations()}
  uniform, normal, same_seed, other_seed = run(fn, SEED)
  assert uniform.dtype == normal.dtype == np.float32 and uniform.shape == normal.shape == (N,)
  np.testing.assert_array_equal(uniform, same_seed)
  assert not np.allclose(uniform, other_seed)
  assert_moments(uniform.astype(np.float64), 0.5, 12 ** -0.5)
  assert_moments(normal.astype(np.float64), 0, 1)


def test_constant_and_traced_seeds_agree():
  traced = run(lambda s: tf.random.stateless_normal([8], s), SEED)
  constant = run(lambda s: tf.random.stateless_normal([8], tf.constant(SEED)), SEED)
  wide = run(lambda s: tf.random.stateless_normal([8], tf.constant(SEED, tf.int64)), SEED)
  np.testing.assert_array_equal(traced, constant)
  np.testing.assert_array_equal(traced, wide)


def test_missing_rng_raises():
  jax_fn, params = jaxport.convert(lambda s: tf.random.normal([3]), SEED)
  with pytest.raises(jaxport.MissingInputError, match="PRNG key"):
    jax_fn(params, SEED)


@pytest.mark.parametrize("fn", [lambda s: tf.random.stateless_normal([3], s),
                                lambda s: tf.random.stateless_poisson([3], s, lam=2.0)],
                         ids=["stateless", "stateless_poisson"])
def test_stateless_ops_need_no_rng(fn):
  jax_fn, params = jaxport.convert(fn, SEED)
  assert not jax_fn.requires_rng
  np.testing.assert_array_equal(jax_fn(params, SEED)[0], run(fn, SEED))


def test_jit_matches_eager():
  np.testing.assert_array_equal(run(uniform_pair, SEED, jit=True), run(uniform_pair, SEED))


def test_vmap_over_keys_and_seeds():
  jax_fn, params = jaxport.convert(uniform_pair, SEED)
  keys = jax.random.split(KEY, 3)
  stateful, stateless = jax.vmap(lambda k: jax_fn(params, SEED, rng=k)[0])(keys)
  assert stateful.shape == (3, 8) and len({tuple(np.asarray(r)) for r in stateful}) == 3
  seeds = np.stack([SEED, SEED + 1, SEED])
  _, per_seed = jax.jit(jax.vmap(lambda s: jax_fn(params, s, rng=KEY)[0]))(seeds)
  np.testing.assert_array_equal(per_seed[0], per_seed[2])
  assert not np.allclose(per_seed[0], per_seed[1])
  np.testing.assert_array_equal(per_seed[0], run(uniform_pair, SEED)[1])


def test_stateless_dropout():
  x = np.ones((N,), np.float32)
  out = run(lambda x, s: tf.nn.experimental.stateless_dropout(x, 0.25, s), x, SEED)
  kept = out != 0
  assert abs(kept.mean() - 0.75) < 0.03
  np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
