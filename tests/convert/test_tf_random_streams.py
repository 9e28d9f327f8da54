"""`tf_random_streams`: stateful random ops that TF seeded draw TF's own numbers, call after call.

TF's kernel for a seeded stateful op (RandomUniform, RandomStandardNormal, TruncatedNormal,
RandomUniformInt, Multinomial, RandomShuffle, RandomGamma, RandomPoisson) keeps a Philox counter that advances on every run. With the config on,
that counter is a param of the converted function and advances the same way, so each call, eager and
under `jax.jit`, in a loop step, after export and load, and in a TF1 `Session`, gives TF's values.
"""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
import oracle

CALLS = 3


def _streams_on():
  return jaxport.override_config("tf_random_streams", True)


def _converted(fn, *args):
  with _streams_on():
    return jaxport.convert(fn, *args)


def _assert_same(actual, expected, what, maxulp=0):
  actual, expected = np.asarray(actual), np.asarray(expected)
  expected = expected.astype(jax.dtypes.canonicalize_dtype(expected.dtype))   # int64 is int32 without x64
  assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
  if maxulp and expected.dtype.kind == "f":
    np.testing.assert_array_max_ulp(actual, expected, maxulp=maxulp)   # TF's glibc logf/sincosf
  else:
    np.testing.assert_array_equal(actual, expected, err_msg=what)


def _calls(jax_fn, params, args, jit):
  run = jax.jit(jax_fn) if jit else jax_fn
  outs = []
  for _ in range(CALLS):
    out, params = run(params, *args)
    outs.append(out)
  return outs, params


X = np.random.RandomState(0).normal(size=(4, 6)).astype(np.float32)
LOGITS = np.log(np.random.RandomState(1).dirichlet(np.ones(5), size=3)).astype(np.float32)
DRAWS = {   # name: (function of x, max ulp from TF)
    "uniform": (lambda x: tf.random.uniform([5, 7]) + 0 * x[0, 0], 0),
    "uniform_bfloat16": (lambda x: tf.random.uniform([9], dtype=tf.bfloat16), 0),
    "uniform_int": (lambda x: tf.random.uniform([11], -3, 40, tf.int32), 0),
    "normal": (lambda x: tf.random.normal([6, 5], mean=1.0, stddev=2.0), 2),
    "truncated_normal": (lambda x: tf.random.truncated_normal([13]), 2),
    "categorical": (lambda x: tf.random.categorical(LOGITS, 6), 0),
    "dropout": (lambda x: tf.nn.dropout(x, rate=0.4), 0),
    "shuffle": (lambda x: tf.random.shuffle(tf.range(9)), 0),
    "gamma": (lambda x: tf.random.gamma([5], [0.5, 2.0, 7.0]), 0),
    "poisson": (lambda x: tf.random.poisson([4], [1.5, 30.0]), 0),
    "shuffle_rows": (lambda x: tf.random.shuffle(x), 0),
    "op_seed": (lambda x: tf.random.uniform([4], seed=11) * x[0, :4], 0),
}


@pytest.mark.parametrize("name", DRAWS)
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_seeded_draws_are_tfs_call_after_call(name, jit):
  draw, maxulp = DRAWS[name]
  tf.random.set_seed(1234)
  fn = tf.function(draw)
  jax_fn, params = _converted(fn, X)
  assert not jax_fn.requires_rng
  streams = [k for k in params if k.startswith("random_stream/")]
  assert streams and not any(jax_fn.trainable[k] for k in streams)
  outs, _ = _calls(jax_fn, params, (X,), jit)
  for call, out in enumerate(outs):
    _assert_same(out, fn(X).numpy(), f"{name}: call {call}", maxulp)


def test_loop_steps_advance_the_stream_as_tf():
  tf.random.set_seed(7)

  @tf.function
  def fn(x, n):
    def body(i, acc):
      return i + 1, acc + tf.random.uniform(tf.shape(x)) * x
    return tf.while_loop(lambda i, a: i < n, body, (0, tf.zeros_like(x)))[1]

  x, n = np.ones((2, 3), np.float32), np.int32(3)
  jax_fn, params = _converted(fn, x, n)
  expected = [fn(x, n).numpy() for _ in range(CALLS)]
  for jit in (False, True):
    outs, state = _calls(jax_fn, params, (x, n), jit)
    for call, out in enumerate(outs):
      _assert_same(out, expected[call], f"jit={jit}: call {call}")
    (counter,) = [v for k, v in state.items() if k.startswith("random_stream/")]
    assert int(counter[0]) == CALLS * 3 * x.size * 256   # TF's kernel skips 256 words per value


def test_unseeded_ops_and_the_default_draw_from_rng():
  tf.random.set_seed(3)
  fn = tf.function(lambda x: (tf.random.uniform([4]),
                              tf.raw_ops.RandomUniform(shape=[4], dtype=tf.float32, seed=0, seed2=0)))
  jax_fn, params = _converted(fn, X)
  assert jax_fn.requires_rng   # seeds (0, 0): TF draws from a random seed, so jaxport from rng
  assert len([k for k in params if k.startswith("random_stream/")]) == 1
  with pytest.raises(jaxport.errors.MissingInputError):
    jax_fn(params, X)
  (seeded, unseeded), _ = jax_fn(params, X, rng=jax.random.key(0))
  _assert_same(seeded, fn(X)[0].numpy(), "the seeded node")
  assert np.all((np.asarray(unseeded) >= 0) & (np.asarray(unseeded) < 1))

  default_fn, default_params = jaxport.convert(fn, X)   # the config off: every stateful draw takes rng
  assert default_fn.requires_rng and not any(k.startswith("random_stream/") for k in default_params)


def _dropout_model(seed, rate, outputs, x):
  """A tf_keras MLP with a Dropout (stateful RandomUniform) seeded through TF's global seed, built on x."""
  import tf_keras
  tf.random.set_seed(seed)
  tf_keras.utils.set_random_seed(seed)
  model = tf_keras.Sequential([tf_keras.layers.Dense(16, activation="relu"), tf_keras.layers.Dropout(rate),
                               tf_keras.layers.Dense(outputs)])
  model(x)
  return model


def test_a_retrace_for_another_static_value_converts_with_the_same_settings():
  tf.random.set_seed(2)
  fn = tf.function(lambda x, heavy: tf.nn.dropout(x, rate=0.5 if heavy else 0.25))
  jax_fn, params = _converted(fn, X, True)
  out, _ = jax_fn(params, X, False)   # retraced outside the override: still TF's stream, no rng
  assert np.asarray(out).shape == X.shape and not jax_fn.requires_rng


def test_dropout_training_steps_match_tf():
  import tf_keras
  x = np.random.RandomState(2).normal(size=(8, 5)).astype(np.float32)
  y = np.random.RandomState(3).normal(size=(8, 2)).astype(np.float32)
  model = _dropout_model(5, 0.3, 2, x)
  with _streams_on():
    oracle.check_train_steps(model, tf_keras.optimizers.Adam(1e-2), x, y, steps=3, training=True)


def test_jax_grad_through_tfs_dropout_mask_matches_the_tape():
  x = np.random.RandomState(4).normal(size=(8, 5)).astype(np.float32)
  model = _dropout_model(11, 0.5, 3, x)
  fn = tf.function(lambda x: model(x, training=True))
  jax_fn, params = _converted(fn, x)
  trainable = {k: v for k, v in params.items() if jax_fn.trainable[k]}
  state = {k: v for k, v in params.items() if not jax_fn.trainable[k]}   # the mask's counter

  def loss(trainable):
    out, new_params = jax_fn({**trainable, **state}, x)
    return (out ** 2).sum(), new_params

  for step in range(2):   # the second step reads the counter the first one advanced
    (value, new_params), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(trainable)
    with tf.GradientTape() as tape:
      expected = tf.reduce_sum(fn(x) ** 2)
    tape_grads = tape.gradient(expected, model.trainable_variables)
    np.testing.assert_allclose(value, expected.numpy(), rtol=1e-5, err_msg=f"step {step}")
    for variable, tape_grad in zip(model.trainable_variables, tape_grads):
      (key,) = [k for k, v in jax_fn.tf_variables.items() if v is variable]
      np.testing.assert_allclose(grads[key], tape_grad.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{key}, step {step}")
    state = {k: new_params[k] for k in state}


def test_exported_artifact_keeps_drawing_tfs_numbers(tmp_path):
  tf.random.set_seed(9)
  fn = tf.function(lambda x: (tf.nn.dropout(x, rate=0.5), tf.random.normal([6])))
  jax_fn, params = _converted(fn, X)
  jaxport.export(jax_fn, params, X, path=tmp_path / "artifact", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "artifact")
  assert not loaded.requires_rng
  outs, _ = _calls(loaded, loaded_params, (X,), jit=True)
  for call, (dropped, normal) in enumerate(outs):
    expected = fn(X)
    _assert_same(dropped, expected[0].numpy(), f"loaded: call {call}")
    _assert_same(normal, expected[1].numpy(), f"loaded: call {call}", maxulp=2)


def test_tf1_session_runs_are_matched():
  graph = tf.Graph()
  with graph.as_default():
    tf.compat.v1.set_random_seed(21)
    x = tf.compat.v1.placeholder(tf.float32, [4, 6], name="x")
    out = tf.identity(tf.nn.dropout(x, rate=0.25) * tf.random.uniform([6]), name="out")
  with _streams_on():
    jax_fn, params = jaxport.convert_graph_def(graph.as_graph_def(), ["x"], "out")
  assert not jax_fn.requires_rng
  with tf.compat.v1.Session(graph=graph) as session:
    expected = [session.run(out, {x: X}) for _ in range(CALLS)]
  outs, _ = _calls(jax_fn, params, (X,), jit=True)
  for call, (actual, want) in enumerate(zip(outs, expected)):
    _assert_same(actual, want, f"session run {call}")


def test_flax_module_advances_its_counters_as_batch_stats():
  nnx = pytest.importorskip("flax.nnx")
  from jaxport.flax import ConvertedModule
  x = np.random.RandomState(6).normal(size=(8, 5)).astype(np.float32)
  model = _dropout_model(13, 0.5, 3, x)
  fn = tf.function(lambda x: model(x, training=True))
  module = ConvertedModule(*_converted(fn, x))   # no rngs: every draw is seeded
  counters = [k for k, v in module.variables.items() if isinstance(v, nnx.BatchStat)]
  assert counters and all(k.startswith("random_stream/") for k in counters)
  call = nnx.jit(lambda module, x: module(x))
  for step in range(2):
    np.testing.assert_allclose(call(module, x), fn(x).numpy(), rtol=1e-6, err_msg=f"call {step}")
