"""Keras layers (Keras 3 and tf_keras) converted and compared with the layer's own output."""
import inspect

import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import jaxport
from oracle import assert_close, check

BACKENDS = {"keras": keras, "tf_keras": tf_keras}


def normal(*shape, seed=0):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def randomize(layer, seed=0):
  """Random float weights (positive for variances), so no layer is checked at its trivial init."""
  rs = np.random.RandomState(seed)
  for v in layer.weights:
    dtype = np.dtype(v.dtype if isinstance(v.dtype, str) else v.dtype.name)
    if not np.issubdtype(dtype, np.floating):
      continue
    shape = tuple(v.shape)
    value = rs.uniform(0.5, 1.5, shape) if "variance" in v.name else rs.normal(0, 0.5, shape)
    v.assign(value.astype(dtype))


def built(layer, *inputs):
  layer(*inputs)
  randomize(layer)
  return layer


def assert_converts(fn, *inputs, atol=1e-4, rtol=1e-4, rng=None):
  """Converted `fn` matches TF's eager result, with and without jax.jit. Returns (jax_fn, params)."""
  expected = fn(*inputs)
  jax_fn, params = jaxport.convert(fn, *inputs)
  out, _ = jax_fn(params, *inputs, rng=rng)
  assert_close(out, expected, atol, rtol, "eager")
  out, _ = jax.jit(lambda p, *xs: jax_fn(p, *xs, rng=rng))(params, *inputs)
  assert_close(out, expected, atol, rtol, "jit")
  return jax_fn, params


def assert_grads_match(fn, x, *, atol=1e-4, rtol=1e-3):
  """Gradients of a random projection of fn(x) w.r.t. x and the trainable weights, against GradientTape."""
  jax_fn, params = jaxport.convert(fn, x)
  weights = normal(*fn(x).shape, seed=5)
  trainable = [k for k in params if jax_fn.trainable[k]]

  def loss(p, x):
    return jnp.sum(jax_fn(p, x)[0] * weights)

  grads, grad_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
  x_tf = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x_tf)
    tf_loss = tf.reduce_sum(fn(x_tf) * weights)
  tf_grads = tape.gradient(tf_loss, [jax_fn.tf_variables[k] for k in trainable] + [x_tf])
  for key, g in zip(trainable + ["input"], tf_grads):
    np.testing.assert_allclose(grad_x if key == "input" else grads[key], g.numpy(), atol=atol, rtol=rtol,
                               err_msg=key)


X1, X2, X3 = (2, 9, 3), (2, 8, 7, 3), (1, 5, 6, 4, 2)

# name -> (make(layers), input shape); inference mode, compared with the layer's own output.
LAYERS = {
    "Conv1D": (lambda L: L.Conv1D(4, 3, strides=2, padding="same"), X1),
    "Conv1D_causal_dilated": (lambda L: L.Conv1D(4, 2, padding="causal", dilation_rate=2), X1),
    "Conv2D": (lambda L: L.Conv2D(4, 3, strides=2, padding="same"), X2),
    "Conv2D_dilated_valid": (lambda L: L.Conv2D(2, 3, dilation_rate=2, activation="relu"), X2),
    "Conv2D_groups": (lambda L: L.Conv2D(4, 3, groups=2, padding="same"), (2, 6, 6, 4)),
    "Conv3D": (lambda L: L.Conv3D(3, 2, strides=(1, 2, 1), padding="same"), X3),
    "Conv1DTranspose": (lambda L: L.Conv1DTranspose(3, 3, strides=2, padding="same"), X1),
    "Conv2DTranspose": (lambda L: L.Conv2DTranspose(3, 3, strides=2, padding="same"), X2),
    "Conv2DTranspose_valid": (lambda L: L.Conv2DTranspose(2, (3, 2), strides=(2, 3)), X2),
    "Conv3DTranspose": (lambda L: L.Conv3DTranspose(2, 2, strides=2), X3),
    "SeparableConv1D": (lambda L: L.SeparableConv1D(4, 3, depth_multiplier=2, padding="same"), X1),
    "SeparableConv2D": (lambda L: L.SeparableConv2D(4, 3, strides=2), X2),
    "DepthwiseConv2D": (lambda L: L.DepthwiseConv2D(3, strides=2, depth_multiplier=2, padding="same"), X2),
    "DepthwiseConv2D_dilated": (lambda L: L.DepthwiseConv2D(3, dilation_rate=2), X2),
    "MaxPooling1D": (lambda L: L.MaxPooling1D(2), X1),
    "MaxPooling2D": (lambda L: L.MaxPooling2D(3, strides=2, padding="same"), X2),
    "MaxPooling3D": (lambda L: L.MaxPooling3D(2), X3),
    "AveragePooling1D": (lambda L: L.AveragePooling1D(3, strides=2, padding="same"), X1),
    "AveragePooling2D": (lambda L: L.AveragePooling2D(3, strides=2, padding="same"), X2),
    "AveragePooling3D": (lambda L: L.AveragePooling3D(2, padding="same"), X3),
    "GlobalMaxPooling1D": (lambda L: L.GlobalMaxPooling1D(), X1),
    "GlobalMaxPooling2D": (lambda L: L.GlobalMaxPooling2D(), X2),
    "GlobalMaxPooling3D": (lambda L: L.GlobalMaxPooling3D(), X3),
    "GlobalAveragePooling1D": (lambda L: L.GlobalAveragePooling1D(), X1),
    "GlobalAveragePooling2D": (lambda L: L.GlobalAveragePooling2D(keepdims=True), X2),
    "GlobalAveragePooling3D": (lambda L: L.GlobalAveragePooling3D(), X3),
    "UpSampling1D": (lambda L: L.UpSampling1D(3), X1),
    "UpSampling2D_nearest": (lambda L: L.UpSampling2D((2, 3)), X2),
    "UpSampling2D_bilinear": (lambda L: L.UpSampling2D((2, 3), interpolation="bilinear"), X2),
    "UpSampling3D": (lambda L: L.UpSampling3D((1, 2, 2)), X3),
    "BatchNormalization": (lambda L: L.BatchNormalization(), X2),
    "BatchNormalization_axis1": (lambda L: L.BatchNormalization(axis=1), X1),
    "LayerNormalization": (lambda L: L.LayerNormalization(), X2),
    "LayerNormalization_axes": (lambda L: L.LayerNormalization(axis=(1, 2), center=False), X2),
    "Dense": (lambda L: L.Dense(5, activation="tanh"), X1),
    "Dropout": (lambda L: L.Dropout(0.5), X2),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", LAYERS)
def test_layer_inference(name, backend):
  make, shape = LAYERS[name]
  x = normal(*shape)
  layer = built(make(BACKENDS[backend].layers), x)
  jax_fn, _ = assert_converts(layer, x)
  assert not jax_fn.requires_rng


# A representative layer of each kind: gradients w.r.t. weights and input.
GRAD_LAYERS = ["Conv1D", "Conv2D", "Conv2D_groups", "Conv2DTranspose", "Conv3D", "SeparableConv2D",
               "DepthwiseConv2D", "MaxPooling2D", "AveragePooling2D", "UpSampling2D_bilinear",
               "BatchNormalization", "LayerNormalization", "Dense"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", GRAD_LAYERS)
def test_layer_gradients(name, backend):
  make, shape = LAYERS[name]
  x = normal(*shape)
  layer = built(make(BACKENDS[backend].layers), x)
  assert_grads_match(layer, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_embedding(backend):
  ids = np.array([[0, 3, 9, 3, 1], [2, 2, 7, 0, 5]], np.int32)
  layer = built(BACKENDS[backend].layers.Embedding(10, 3), ids)
  jax_fn, params = assert_converts(layer, ids)
  grads = jax.grad(lambda p: jnp.sum(jax_fn(p, ids)[0] ** 2))(params)
  (key,) = params
  counts = np.bincount(ids.ravel(), minlength=10)
  np.testing.assert_allclose(grads[key], 2 * counts[:, None] * np.asarray(params[key]), rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_multi_head_attention(backend, causal):
  q, v = normal(2, 4, 6), normal(2, 5, 6, seed=1)
  kwargs = {"use_causal_mask": True} if causal else {}
  layer = BACKENDS[backend].layers.MultiHeadAttention(num_heads=2, key_dim=3)
  layer(q, v, **kwargs)
  randomize(layer)
  fn = lambda q, v: layer(q, v, **kwargs)  # noqa: E731
  jax_fn, params = assert_converts(fn, q, v)

  weights = normal(2, 4, 6, seed=5)
  trainable = [k for k in params if jax_fn.trainable[k]]
  grads = jax.grad(lambda p: jnp.sum(jax_fn(p, q, v)[0] * weights))(params)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(fn(q, v) * weights)
  tf_grads = tape.gradient(loss, [jax_fn.tf_variables[k] for k in trainable])
  for key, g in zip(trainable, tf_grads):
    np.testing.assert_allclose(grads[key], g.numpy(), atol=1e-4, rtol=1e-3, err_msg=key)


# --------------------------------------------------------------------------- training mode


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,axis", [(X2, -1), (X1, 1)], ids=["channels_last", "axis1"])
def test_batch_normalization_training_updates_moving_statistics(backend, shape, axis):
  x = normal(*shape) * 2 + 1
  layer = built(BACKENDS[backend].layers.BatchNormalization(axis=axis, momentum=0.8), x)
  fn = lambda x: layer(x, training=True)  # noqa: E731
  jax_fn, params = jaxport.convert(fn, x)
  out, new_params = jax_fn(params, x)
  expected = fn(x)   # runs the layer: its moving statistics move to the values to compare with
  assert_close(out, expected, 1e-4, 1e-4, "training output")
  moving = [k for k in params if "moving" in k]
  assert len(moving) == 2
  for key in moving:
    assert not np.allclose(new_params[key], params[key]), key
    np.testing.assert_allclose(new_params[key], jax_fn.tf_variables[key].numpy(), atol=1e-5, rtol=1e-5,
                               err_msg=key)
  _, jit_params = jax.jit(jax_fn)(params, x)
  for key in moving:
    np.testing.assert_allclose(jit_params[key], new_params[key], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_normalization_training_gradients(backend):
  x = normal(*X2)
  layer = built(BACKENDS[backend].layers.BatchNormalization(), x)
  assert_grads_match(lambda x: layer(x, training=True), x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dropout_training(backend):
  rate = 0.3
  x = np.abs(normal(4, 50, 20)) + 0.5
  layer = BACKENDS[backend].layers.Dropout(rate, seed=3)
  jax_fn, params = jaxport.convert(lambda x: layer(x, training=True), x)
  if backend == "keras":   # Keras 3: a stateless op on its seed generator's state draws TF's very mask
    assert not jax_fn.requires_rng
    out, new_params = jax.jit(jax_fn)(params, x)
    np.testing.assert_allclose(out, layer(x, training=True), rtol=1e-6)
    following, _ = jax_fn(new_params, x)   # the state advanced as TF's did
    np.testing.assert_allclose(following, layer(x, training=True), rtol=1e-6)
    assert not np.array_equal(np.asarray(following) != 0, np.asarray(out) != 0)
    return
  assert jax_fn.requires_rng
  with pytest.raises(jaxport.MissingInputError):
    jax_fn(params, x)

  out, new_params = jax.jit(jax_fn)(params, x, rng=jax.random.key(0))
  out = np.asarray(out)
  kept = out != 0
  assert abs(1 - kept.mean() - rate) < 0.02
  np.testing.assert_allclose(out[kept], x[kept] / (1 - rate), rtol=1e-6)

  again, _ = jax_fn(params, x, rng=jax.random.key(0))
  np.testing.assert_array_equal(again, out)
  other, _ = jax_fn(params, x, rng=jax.random.key(1))
  assert not np.array_equal(other != 0, kept)
  if new_params:   # Keras 3 advances its seed generator's state: the next step draws a new mask
    assert any(not np.array_equal(new_params[k], params[k]) for k in params)
    following, _ = jax_fn(new_params, x, rng=jax.random.key(0))
    assert not np.array_equal(np.asarray(following) != 0, kept)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_step_with_gradient_tape(backend):
  # A whole TF training step (forward, GradientTape, TF's gradient ops) converted, its gradients and
  # moving-statistics updates compared with TF running the same step.
  K = BACKENDS[backend]
  L = K.layers
  model = K.Sequential([
      K.Input((8, 8, 3)), L.Conv2D(4, 3, padding="same"), L.BatchNormalization(), L.ReLU(),
      L.DepthwiseConv2D(3, padding="same"), L.MaxPooling2D(), L.UpSampling2D(interpolation="bilinear"),
      L.AveragePooling2D(2), L.UpSampling2D(), L.Conv2DTranspose(2, 3, strides=2), L.Flatten(), L.Dense(5)])
  randomize(model)
  x, y = normal(4, 8, 8, 3), np.array([0, 3, 1, 4], np.int32)

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
      loss += 1e-2 * tf.nn.l2_loss(model.trainable_variables[0])
    return loss, tape.gradient(loss, model.trainable_variables)

  jax_fn, params = jaxport.convert(step, x, y)
  (loss, grads), new_params = jax.jit(jax_fn)(params, x, y)
  tf_loss, tf_grads = step(x, y)
  assert_close(loss, tf_loss, 1e-5, 1e-5, "loss")
  assert_close(grads, tf_grads, 1e-4, 1e-3, "gradients")
  moving = [k for k in params if "moving" in k]
  assert moving
  for key in moving:
    np.testing.assert_allclose(new_params[key], jax_fn.tf_variables[key].numpy(), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- activations

REQUIRED_ARGS = {"threshold": dict(threshold=0.3, default_value=-1.0)}
VARIANTS = {
    "gelu_approximate": ("gelu", dict(approximate=True)),
    "relu_leaky_capped_thresholded": ("relu", dict(negative_slope=0.1, max_value=1.5, threshold=0.2)),
    "relu_alpha_capped": ("relu", dict(alpha=0.1, max_value=1.5)),   # tf_keras spelling
    "elu_alpha": ("elu", dict(alpha=0.5)),
    "leaky_relu_slope": ("leaky_relu", dict(negative_slope=0.05)),
    "softmax_axis1": ("softmax", dict(axis=1)),
    "log_softmax_axis1": ("log_softmax", dict(axis=1)),
    "glu_axis1": ("glu", dict(axis=1)),
    "sparsemax_axis1": ("sparsemax", dict(axis=1)),
    "squareplus_b": ("squareplus", dict(b=1.0)),
}


def _activation_names(module):
  helpers = {"get", "serialize", "deserialize"}
  return sorted(n for n, f in vars(module.activations).items()
                if not n.startswith("_") and inspect.isfunction(f) and n not in helpers)


def _accepts(module, name, kwargs):
  return (name in _activation_names(module)
          and set(kwargs) <= set(inspect.signature(getattr(module.activations, name)).parameters))


ACTIVATIONS = [(b, n, n, REQUIRED_ARGS.get(n, {})) for b, m in BACKENDS.items() for n in _activation_names(m)]
ACTIVATIONS += [(b, v, n, kw) for v, (n, kw) in VARIANTS.items()
                for b, m in BACKENDS.items() if _accepts(m, n, kw)]


def test_every_keras_activation_is_listed():
  assert len(_activation_names(keras)) >= 30 and len(_activation_names(tf_keras)) >= 14
  assert {"relu", "gelu", "sparsemax", "threshold", "celu"} <= set(_activation_names(keras))


@pytest.mark.parametrize("backend,case,name,kwargs", ACTIVATIONS,
                         ids=[f"{b}-{c}" for b, c, _, _ in ACTIVATIONS])
def test_activation(backend, case, name, kwargs):
  fn = getattr(BACKENDS[backend].activations, name)
  x = normal(2, 4, 6) * 2
  check(lambda x: fn(x, **kwargs), x, atol=1e-5, rtol=1e-5)
