"""Models of the convert benchmark, built with Keras 3 so the same code runs on its TF and JAX backends.

`build_model(name)` gives a model with seeded random weights (nothing downloads); `example_input(name,
batch)` its input. The subprocess that times Keras on its JAX backend (`_keras_jax_runner.py`) builds
the same model here and loads the parent's weights, so both sides run identical weights.
"""
from __future__ import annotations

import numpy as np

# The 13 Keras applications of the project's model zoo (tests/convert/test_keras_models.py); any other
# `keras.applications` name (ResNet50V2, RegNetX002, ...) works with --models too.
APPLICATIONS = ("VGG16", "ResNet50", "ResNet101", "InceptionV3", "Xception", "DenseNet121", "MobileNetV2",
                "MobileNetV3Small", "MobileNetV3Large", "EfficientNetB0", "EfficientNetV2B0", "NASNetMobile",
                "ConvNeXtTiny")
SEQUENCE_MODELS = ("LSTM", "Transformer")
ALL_MODELS = APPLICATIONS + SEQUENCE_MODELS
_SIZE_299 = ("InceptionV3", "Xception", "InceptionResNetV2")


def input_shape(name: str) -> tuple[int, ...]:
  """The shape of one example (no batch dim)."""
  if name == "LSTM":
    return (64, 64)
  if name == "Transformer":
    return (128, 256)
  size = 299 if name in _SIZE_299 else 224
  return (size, size, 3)


def example_input(name: str, batch: int) -> np.ndarray:
  rs = np.random.RandomState(batch)
  if name in SEQUENCE_MODELS:
    return rs.normal(size=(batch, *input_shape(name))).astype(np.float32)
  return rs.uniform(0, 255, size=(batch, *input_shape(name))).astype(np.float32)


def build_model(name: str):
  """The model `name` with seeded random weights (BatchNorm statistics at their initial values);
  applications return logits."""
  import keras
  keras.utils.set_random_seed(0)
  if name == "LSTM":
    return keras.Sequential([keras.Input(input_shape(name)), keras.layers.LSTM(256, return_sequences=True),
                             keras.layers.LSTM(256), keras.layers.Dense(10)])
  if name == "Transformer":
    return transformer_block()
  # Logits, not probabilities: a softmax saturated by random weights would hide differences.
  return getattr(keras.applications, name)(weights=None, input_shape=input_shape(name), classifier_activation=None)


def transformer_block(seq: int = 128, dim: int = 256, heads: int = 4, ffn: int = 1024):
  """One post-norm encoder block: self-attention, residual, LayerNorm, GELU feed-forward, residual, LayerNorm."""
  import keras
  layers = keras.layers
  inputs = keras.Input((seq, dim))
  attended = layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(inputs, inputs)
  x = layers.LayerNormalization()(layers.Add()([inputs, attended]))
  hidden = layers.Dense(dim)(layers.Dense(ffn, activation="gelu")(x))
  return keras.Model(inputs, layers.LayerNormalization()(layers.Add()([x, hidden])), name="transformer_block")
