"""Fine-tuning converted Keras models in JAX with optax.

One SGD step against the same step in TF (weights and BatchNorm statistics), dropout keys, a
jitted training loop whose loss falls, and frozen parameters under `optax.masked`.
"""
import jax
import jax.numpy as jnp
import keras
import numpy as np
import optax
import pytest
import tensorflow as tf
import tf_keras

import jaxport

LIBS = pytest.mark.parametrize("lib", [keras, tf_keras], ids=["keras3", "tf_keras"])


def _cnn(lib, *, size=8, dropout=0.0, frozen=()):
  """A tiny CNN with BatchNorm and Dropout; layers named in `frozen` get `trainable = False`."""
  layers = lib.layers
  lib.utils.set_random_seed(0)
  model = lib.Sequential([
      layers.Input((size, size, 3)) if lib is keras else layers.InputLayer(input_shape=(size, size, 3)),
      layers.Conv2D(4, 3, padding="same", name="conv1"),
      layers.BatchNormalization(name="bn"),
      layers.ReLU(),
      layers.Conv2D(4, 3, strides=2, name="conv2"),
      layers.GlobalAveragePooling2D(),
      layers.Dropout(dropout),
      layers.Dense(3, name="head"),
  ])
  for name in frozen:
    model.get_layer(name).trainable = False
  return model


def _batch(n=8, size=8, seed=0):
  rs = np.random.RandomState(seed)
  return rs.normal(size=(n, size, size, 3)).astype(np.float32), rs.randint(0, 3, size=n).astype(np.int32)


def _xent(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _split(jax_fn, params):
  """(trainable, the rest) by `jax_fn.trainable`: BN statistics and seed state are the rest."""
  trainable = {k: v for k, v in params.items() if jax_fn.trainable[k]}
  return trainable, {k: v for k, v in params.items() if k not in trainable}


def _keys(jax_fn, layer):
  return [k for k in jax_fn.param_keys if f"{layer}/" in k]


@LIBS
def test_one_sgd_step_matches_tf(lib):
  model = _cnn(lib)
  x, y = _batch()
  train_fn, params = jaxport.convert(lambda t: model(t, training=True), x)
  assert not train_fn.requires_rng   # Dropout(0) draws nothing
  trainable, state = _split(train_fn, params)
  assert sorted(state) == sorted(k for k in _keys(train_fn, "bn") if "moving" in k)
  tx = optax.sgd(0.1)

  @jax.jit
  def step(trainable, state, opt_state):
    def loss_fn(trainable):
      logits, new_params = train_fn({**trainable, **state}, x)
      return _xent(logits, y), new_params
    (loss, new_params), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), {k: new_params[k] for k in state}, loss

  new_trainable, new_state, loss = step(trainable, state, tx.init(trainable))

  with tf.GradientTape() as tape:
    tf_loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, model(x, training=True)))
  variables = model.trainable_variables
  lib.optimizers.SGD(learning_rate=0.1).apply_gradients(zip(tape.gradient(tf_loss, variables), variables))

  np.testing.assert_allclose(loss, tf_loss.numpy(), atol=1e-5, rtol=0)
  for key, value in {**new_trainable, **new_state}.items():
    expected = train_fn.tf_variables[key].numpy()
    np.testing.assert_allclose(value, expected, atol=1e-5, rtol=0, err_msg=key)
    assert not np.array_equal(value, params[key]), f"{key} did not move"


@LIBS
def test_dropout_follows_the_rng_key(lib):
  model = _cnn(lib, dropout=0.5)
  x, _ = _batch()
  train_fn, params = jaxport.convert(lambda t: model(t, training=True), x)
  if lib is keras:   # Keras 3 drops out with stateless ops on its seed state (in params), as TF does
    assert not train_fn.requires_rng
    out_a, new_a = jax.jit(train_fn)(params, x)
    np.testing.assert_allclose(out_a, train_fn(params, x)[0], rtol=1e-5, atol=1e-6)
    assert not np.allclose(out_a, train_fn(new_a, x)[0])   # the next step's state, another mask
    return
  assert train_fn.requires_rng
  with pytest.raises(jaxport.MissingInputError, match="rng"):
    train_fn(params, x)
  run = jax.jit(train_fn)
  out_a, new_a = run(params, x, rng=jax.random.key(0))
  out_b, new_b = run(params, x, rng=jax.random.key(0))
  out_c, _ = run(params, x, rng=jax.random.key(1))
  np.testing.assert_array_equal(out_a, out_b)
  for key in new_a:
    np.testing.assert_array_equal(new_a[key], new_b[key], err_msg=key)
  assert not np.allclose(out_a, out_c)

  # The layer itself: inverted dropout, zeros at about the rate, survivors scaled by 1 / (1 - rate).
  dropout = next(layer for layer in model.layers if isinstance(layer, lib.layers.Dropout))
  ones = np.ones((64, 64), np.float32)
  drop_fn, drop_params = jaxport.convert(lambda t: dropout(t, training=True), ones)
  dropped = np.asarray(drop_fn(drop_params, ones, rng=jax.random.key(0))[0])
  assert set(np.unique(dropped)) == {0.0, 2.0}
  assert 0.45 < (dropped == 0).mean() < 0.55


def _separable_data(n=256, size=16, seed=0):
  """Three classes: class c brightens channel c of a noisy image."""
  rs = np.random.RandomState(seed)
  labels = rs.randint(0, 3, size=n).astype(np.int32)
  images = rs.normal(size=(n, size, size, 3)).astype(np.float32)
  images[np.arange(n), :, :, labels] += 1.0
  return images, labels


def test_finetune_loop_lowers_the_loss_and_moves_bn_statistics_through_new_params():
  images, labels = _separable_data()
  model = _cnn(keras, size=16, dropout=0.2)
  train_fn, params = jaxport.convert(lambda t: model(t, training=True), images[:32])
  infer_fn, _ = jaxport.convert(model, images)
  trainable, state = _split(train_fn, params)
  assert any("moving_mean" in k for k in state) and any("seed_generator" in k for k in state)
  tx = optax.adam(1e-2)
  opt_state = tx.init(trainable)
  assert set(opt_state[0].mu) == set(trainable)   # the optimizer sees trainable entries only

  @jax.jit
  def train_step(trainable, state, opt_state, x, y, rng):
    def loss_fn(trainable):
      logits, new_params = train_fn({**trainable, **state}, x, rng=rng)
      return _xent(logits, y), new_params
    (loss, new_params), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    updates, opt_state = tx.update(grads, opt_state, trainable)
    return optax.apply_updates(trainable, updates), {k: new_params[k] for k in state}, opt_state, loss

  losses = []
  rng = jax.random.key(0)
  for i in range(300):
    rng, key = jax.random.split(rng)
    batch = slice((i * 32) % 256, (i * 32) % 256 + 32)
    trainable, state, opt_state, loss = train_step(trainable, state, opt_state, images[batch],
                                                   labels[batch], key)
    losses.append(float(loss))
  first, last = np.mean(losses[:10]), np.mean(losses[-20:])
  assert last < 0.3 * first, (first, last)

  for key in state:   # moving statistics and seed state moved, through new_params only
    assert not np.array_equal(state[key], params[key]), key
  # The fine-tuned weights with their BN statistics run in inference mode (no rng needed).
  logits, _ = jax.jit(infer_fn)({**trainable, **state}, images)
  assert (np.argmax(logits, -1) == labels).mean() > 0.9


def _train_masked(jax_fn, params, x, y, steps):
  """Trains over the whole params dict; `optax.masked` picks what the optimizer moves.

  `optax.masked(tx, mask)` passes the other leaves' updates through untouched, so those get
  `optax.set_to_zero()` (what `optax.freeze` does in newer optax).
  """
  mask = dict(jax_fn.trainable)
  tx = optax.chain(optax.masked(optax.adam(1e-2), mask),
                   optax.masked(optax.set_to_zero(), {k: not m for k, m in mask.items()}))
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    def loss_fn(params):
      logits, new_params = jax_fn(params, x)
      return _xent(logits, y), new_params
    (loss, new_params), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    # BN statistics come from new_params; the optimizer's update of them is zero.
    return optax.apply_updates(new_params, updates), opt_state, loss, updates

  params = {k: jnp.asarray(v) for k, v in params.items()}
  losses = []
  for _ in range(steps):
    params, opt_state, loss, updates = step(params, opt_state)
    losses.append(float(loss))
  for key, trainable in mask.items():
    assert trainable or not np.any(updates[key]), f"the optimizer moved non-trainable {key}"
  return params, losses


def test_masked_optimizer_moves_bn_statistics_only_through_new_params():
  model = _cnn(keras)
  x, y = _batch()
  train_fn, params = jaxport.convert(lambda t: model(t, training=True), x)
  tuned, losses = _train_masked(train_fn, params, x, y, steps=20)
  assert losses[-1] < losses[0]
  moving = [k for k in params if "moving" in k]
  assert moving and not any(train_fn.trainable[k] for k in moving)
  for key in params:   # everything moved: weights by the optimizer, statistics by new_params
    assert not np.array_equal(tuned[key], params[key]), key


@LIBS
def test_frozen_keras_layers_stay_unchanged_under_masked_optimizer(lib):
  model = _cnn(lib, frozen=("conv1",))
  x, y = _batch()
  train_fn, params = jaxport.convert(lambda t: model(t, training=True), x)
  frozen = _keys(train_fn, "conv1")
  assert frozen and not any(train_fn.trainable[k] for k in frozen)
  assert [k for k in params if train_fn.trainable[k]] == [
      k for k in params if k not in frozen and "moving" not in k]
  tuned, losses = _train_masked(train_fn, params, x, y, steps=20)
  assert losses[-1] < losses[0]
  for key in frozen:
    np.testing.assert_array_equal(tuned[key], params[key], err_msg=key)
  for key in _keys(train_fn, "head"):
    assert not np.array_equal(tuned[key], params[key]), key
