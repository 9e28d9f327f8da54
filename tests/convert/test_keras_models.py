"""Whole Keras models: the applications zoo, gradients, Keras 3 and tf_keras, both modes."""
import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import jaxport
from oracle import assert_close

APPLICATIONS = {
    "ResNet50": (keras.applications.ResNet50, 64),
    "ResNet101": (keras.applications.ResNet101, 64),
    "MobileNetV2": (keras.applications.MobileNetV2, 64),
    "MobileNetV3Small": (keras.applications.MobileNetV3Small, 64),
    "MobileNetV3Large": (keras.applications.MobileNetV3Large, 64),
    "EfficientNetB0": (keras.applications.EfficientNetB0, 64),
    "EfficientNetV2B0": (keras.applications.EfficientNetV2B0, 64),
    "DenseNet121": (keras.applications.DenseNet121, 64),
    "InceptionV3": (keras.applications.InceptionV3, 96),
    "Xception": (keras.applications.Xception, 96),
    "NASNetMobile": (keras.applications.NASNetMobile, 64),
    "ConvNeXtTiny": (keras.applications.ConvNeXtTiny, 64),
    "VGG16": (keras.applications.VGG16, 64),
}


def _application(name):
  build, size = APPLICATIONS[name]
  keras.utils.set_random_seed(0)
  kwargs = {"weights": None, "input_shape": (size, size, 3), "classes": 10}
  if name.startswith("MobileNetV3"):
    kwargs["include_preprocessing"] = True
  model = build(**kwargs)
  x = np.random.RandomState(0).uniform(0, 255, size=(2, size, size, 3)).astype(np.float32)
  return model, x


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(APPLICATIONS))
def test_keras_application_matches_tf_under_jit(name):
  model, x = _application(name)
  expected = model(x, training=False).numpy()
  jax_fn, params = jaxport.convert(model, x)
  out, _ = jax.jit(jax_fn)(params, x)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, expected, atol=1e-4, rtol=0)
  assert np.abs(expected).max() > 0


def _grad_check(model, jax_fn, params, x, rtol):
  def loss(p):
    return jnp.sum(jax_fn(p, x)[0] ** 2)

  grads = jax.jit(jax.grad(loss))(params)
  trainable = [k for k in params if jax_fn.trainable[k]]
  with tf.GradientTape() as tape:
    tf_loss = tf.reduce_sum(model(x) ** 2)
  tf_grads = tape.gradient(tf_loss, [jax_fn.tf_variables[k] for k in trainable])
  scale = max(float(np.abs(g.numpy()).max()) for g in tf_grads)
  for key, g in zip(trainable, tf_grads):
    np.testing.assert_allclose(grads[key], g.numpy(), atol=rtol * scale, rtol=0, err_msg=key)


@pytest.mark.slow
def test_grad_through_resnet_matches_gradient_tape():
  keras.utils.set_random_seed(0)
  model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=10,
                                      classifier_activation=None)
  x = np.random.RandomState(0).normal(size=(2, 32, 32, 3)).astype(np.float32)
  jax_fn, params = jaxport.convert(model, x)
  _grad_check(model, jax_fn, params, x, rtol=1e-3)


def test_grad_through_lstm_matches_gradient_tape():
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((12, 5)), keras.layers.LSTM(16, return_sequences=True),
                            keras.layers.LSTM(8), keras.layers.Dense(3)])
  x = np.random.RandomState(0).normal(size=(4, 12, 5)).astype(np.float32)
  jax_fn, params = jaxport.convert(model, x)
  assert_close(jax.jit(jax_fn)(params, x)[0], model(x), 1e-5, 1e-5)
  _grad_check(model, jax_fn, params, x, rtol=1e-4)


@pytest.mark.parametrize("layer", ["LSTM", "GRU", "SimpleRNN", "Bidirectional"])
def test_recurrent_layers(layer):
  keras.utils.set_random_seed(1)
  make = {"LSTM": lambda: keras.layers.LSTM(6, return_sequences=True),
          "GRU": lambda: keras.layers.GRU(6, return_sequences=True),
          "SimpleRNN": lambda: keras.layers.SimpleRNN(6),
          "Bidirectional": lambda: keras.layers.Bidirectional(keras.layers.LSTM(4))}[layer]
  model = keras.Sequential([keras.Input((7, 3)), make()])
  x = np.random.RandomState(0).normal(size=(2, 7, 3)).astype(np.float32)
  jax_fn, params = jaxport.convert(model, x)
  assert_close(jax_fn(params, x)[0], model(x), 1e-5, 1e-5)
  assert_close(jax.jit(jax_fn)(params, x)[0], model(x), 1e-5, 1e-5)
  _grad_check(model, jax_fn, params, x, rtol=1e-4)


def _small_model(lib):
  layers = lib.layers
  return lib.Sequential([
      layers.Input((8, 8, 3)) if lib is keras else layers.InputLayer(input_shape=(8, 8, 3)),
      layers.Conv2D(4, 3, padding="same"),
      layers.BatchNormalization(),
      layers.ReLU(),
      layers.Flatten(),
      layers.Dropout(0.5),
      layers.Dense(3),
  ])


@pytest.mark.parametrize("lib", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_keras3_and_tf_keras_inference_and_training(lib):
  tf.random.set_seed(0)
  lib.utils.set_random_seed(0)
  model = _small_model(lib)
  x = np.random.RandomState(0).normal(size=(4, 8, 8, 3)).astype(np.float32)

  jax_fn, params = jaxport.convert(model, x)
  assert_close(jax.jit(jax_fn)(params, x)[0], model(x, training=False), 1e-5, 1e-5)

  train_fn, train_params = jaxport.convert(lambda t: model(t, training=True), x)
  assert set(params) <= set(train_params)   # the same names in both modes (+ dropout seed state)
  assert train_fn.requires_rng == (lib is tf_keras)   # Keras 3 drops out statelessly from its seed state
  out, new_params = jax.jit(train_fn)(train_params, x, rng=jax.random.key(0))
  assert out.shape == (4, 3)
  bn = next(l for l in model.layers if "batch_normalization" in l.name)
  moving_mean = [k for k in train_params if "moving_mean" in k]
  assert len(moving_mean) == 1
  # Keras updates moving_mean = m * momentum + batch_mean * (1 - momentum).
  conv_out = model.layers[0](x).numpy()
  expected = bn.momentum * np.zeros(4) + (1 - bn.momentum) * conv_out.mean(axis=(0, 1, 2))
  np.testing.assert_allclose(new_params[moving_mean[0]], expected, rtol=1e-4, atol=1e-6)
  assert not np.allclose(new_params[moving_mean[0]], train_params[moving_mean[0]])
