"""`jaxport demo`: convert a small built-in Keras model (a CNN and an LSTM) and compare with TF."""
from __future__ import annotations

import os

import numpy as np


def build_demo_model(seed: int = 0):
  """A two-input Keras 3 model: a small CNN on 32x32 images and an LSTM on sequences."""
  import keras
  keras.utils.set_random_seed(seed)
  image = keras.Input((32, 32, 3), name="image")
  x = keras.layers.Conv2D(16, 3, padding="same")(image)
  x = keras.layers.BatchNormalization()(x)
  x = keras.layers.ReLU()(x)
  x = keras.layers.MaxPooling2D()(x)
  x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu")(x)
  x = keras.layers.Conv2D(32, 3, strides=2, activation="relu")(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  sequence = keras.Input((20, 8), name="sequence")
  s = keras.layers.LSTM(32)(sequence)
  h = keras.layers.Concatenate()([x, s])
  h = keras.layers.Dense(64, activation="gelu")(h)
  out = keras.layers.Dense(10, activation="softmax")(h)
  return keras.Model([image, sequence], out, name="jaxport_demo")


def demo_inputs(batch: int = 8, seed: int = 0):
  rs = np.random.RandomState(seed)
  return (rs.normal(size=(batch, 32, 32, 3)).astype(np.float32),
          rs.normal(size=(batch, 20, 8)).astype(np.float32))


def run_demo(batch: int = 8, repeats: int = 10) -> int:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  from rich.console import Console
  from rich.table import Table

  from jaxport.profiling import profile

  console = Console()
  with console.status("Building the demo model (CNN + LSTM) in Keras..."):
    model = build_demo_model()
    image, sequence = demo_inputs(batch)
  with console.status("Converting to JAX, compiling, and timing against TensorFlow..."):
    wrapped = lambda img, seq: model([img, seq])
    result = profile(model.name, wrapped, (image, sequence), repeats=repeats, tf_xla=True, check_grad=True)

  table = Table(title=f"jaxport demo: {model.name} ({model.count_params():,} params, batch {batch})")
  table.add_column("measure")
  table.add_column("value", justify="right")
  ms = lambda s: f"{s * 1e3:.2f} ms"
  table.add_row("conversion time", ms(result.convert_s))
  table.add_row("JAX compile time (first call)", ms(result.compile_s))
  table.add_row("JAX run time (jit, steady state)", ms(result.jax_run_s))
  table.add_row("TF run time (tf.function)", ms(result.tf_run_s))
  table.add_row("TF run time (XLA, jit_compile=True)", ms(result.tf_xla_run_s))
  table.add_row("JAX / TF run-time ratio", f"{result.jax_run_s / result.tf_run_s:.2f}x")
  table.add_row("max abs error vs TF (outputs)", f"{result.max_abs_err:.2e}")
  table.add_row("jax.grad vs tf.GradientTape (max rel error)", f"{result.grad_rel_err:.2e}")
  console.print(table)
  ok = result.max_abs_err <= 1e-4 and result.grad_rel_err <= 1e-3
  console.print("[green]outputs and gradients match TensorFlow[/green]" if ok
                else "[red]mismatch against TensorFlow[/red]")
  return 0 if ok else 1
