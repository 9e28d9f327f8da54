"""ImageProjectiveTransformV2/V3 (Keras' random rotation, translation, zoom and shear) against TF: every
fill mode and interpolation, projective and affine transforms, fill values, integer images, other output
sizes; the gradient is TF's (the output gradient warped back through the inverse transform)."""
import numpy as np
import pytest
import tensorflow as tf

from oracle import check

raw = tf.raw_ops
rs = np.random.RandomState(0)
IMAGES = rs.uniform(-1, 1, size=(2, 7, 9, 3)).astype(np.float32)


def _rotation(angle, height, width, scale=1.0, shift=(0.0, 0.0)):
  """The flat transform Keras builds for a rotation about the center (output -> input), scaled and moved."""
  cos, sin = np.cos(angle) / scale, np.sin(angle) / scale
  x0 = ((width - 1) - (cos * (width - 1) - sin * (height - 1))) / 2 + shift[0]
  y0 = ((height - 1) - (sin * (width - 1) + cos * (height - 1))) / 2 + shift[1]
  return [cos, -sin, x0, sin, cos, y0, 0.0, 0.0]


TRANSFORMS = np.array([_rotation(0.4, 7, 9, scale=0.8, shift=(1.5, -0.7)),
                       [1.1, 0.3, -2.2, -0.2, 0.9, 1.3, 0.02, -0.015]], np.float32)   # affine; projective


@pytest.mark.parametrize("mode", ["CONSTANT", "REFLECT", "WRAP", "NEAREST"])
@pytest.mark.parametrize("interpolation", ["BILINEAR", "NEAREST"])
def test_projective_transform(mode, interpolation):
  def fn(images, fill):
    return (raw.ImageProjectiveTransformV3(images=images, transforms=TRANSFORMS, output_shape=[7, 9], fill_value=fill,
                                           interpolation=interpolation, fill_mode=mode),
            raw.ImageProjectiveTransformV3(images=images, transforms=TRANSFORMS[:1] * 1.7, output_shape=[5, 11],
                                           fill_value=fill, interpolation=interpolation, fill_mode=mode),
            raw.ImageProjectiveTransformV2(images=images, transforms=TRANSFORMS, output_shape=[7, 9],
                                           interpolation=interpolation, fill_mode=mode))
  check(fn, IMAGES, np.float32(0.25), atol=2e-5)


def test_integer_images_and_traced_transforms():
  pixels = rs.randint(0, 256, size=(2, 7, 9, 3)).astype(np.uint8)
  for interpolation in ("NEAREST", "BILINEAR"):
    check(lambda x, t: raw.ImageProjectiveTransformV3(images=x, transforms=t, output_shape=[7, 9], fill_value=7.0,
                                                      interpolation=interpolation, fill_mode="REFLECT"),
          pixels, TRANSFORMS, vmap=False)


@pytest.mark.slow
def test_keras_augmentation_layers_in_training():
  """Keras 3's RandomRotation, RandomZoom, RandomTranslation and RandomShear (their stateless draws and
  projective transforms) before a convolution, called with training=True: two steps with the seed state
  threaded through params match TF's two calls, eagerly and under jit, and the convolution's gradient
  matches GradientTape's."""
  import jax
  import jax.numpy as jnp
  import keras

  import jaxport
  from oracle import assert_close
  layers = [keras.layers.RandomRotation(0.2, seed=1), keras.layers.RandomZoom(0.2, seed=2),
            keras.layers.RandomTranslation(0.1, 0.1, seed=3, fill_mode="reflect"),
            keras.layers.RandomShear(0.2, 0.2, seed=4)]
  inputs = keras.Input((16, 16, 3))
  x = inputs
  for layer in layers:
    x = layer(x)
  model = keras.Model(inputs, keras.layers.Conv2D(4, 3)(x))
  images = rs.uniform(0, 1, (2, 16, 16, 3)).astype(np.float32)
  jax_fn, params = jaxport.convert(model, images, training=True)
  kernel = next(k for k in params if k.endswith("kernel"))

  def loss(kernel_value, p):   # the seed generators' states are ints: differentiate the kernel only
    out, new = jax_fn({**p, kernel: kernel_value}, images, training=True)
    return jnp.sum(out ** 2), (out, new)
  for label, step in (("eager", jax.grad(loss, has_aux=True)), ("jit", jax.jit(jax.grad(loss, has_aux=True)))):
    state = dict(params)
    for _ in range(2):
      grad, (out, state) = step(state[kernel], state)
    if label == "eager":
      with tf.GradientTape() as tape:
        model(images, training=True)
        expected = model(images, training=True)
        tf_loss = tf.reduce_sum(expected ** 2)
      expected_grad = tape.gradient(tf_loss, model.layers[-1].kernel)
    assert_close(out, expected, 2e-5, 1e-5, label)
    assert_close(grad, expected_grad, 2e-4, 1e-4, f"{label} grad")
