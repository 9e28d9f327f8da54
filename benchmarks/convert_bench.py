"""Converter benchmark: jaxport vs TF graph (oneDNN) and TF XLA, measured in one run.

For each model: conversion time, first-call compile time, steady-state jit run
time, and TF's `tf.function` and `jit_compile=True` times. Prints a table, checks
the targets, and writes benchmarks/out/convert_bench.png.

  python benchmarks/convert_bench.py [--batch 4] [--repeats 5] [--models ResNet50,LSTM]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def build(name: str, batch: int):
  import keras
  keras.utils.set_random_seed(0)
  rs = np.random.RandomState(0)
  if name == "LSTM":
    model = keras.Sequential([keras.Input((64, 64)), keras.layers.LSTM(256, return_sequences=True),
                              keras.layers.LSTM(256), keras.layers.Dense(10)])
    return model, rs.normal(size=(batch * 4, 64, 64)).astype(np.float32)
  app = getattr(keras.applications, name)
  size = 299 if name == "InceptionV3" else 224
  model = app(weights=None, input_shape=(size, size, 3))
  return model, rs.uniform(0, 255, size=(batch, size, size, 3)).astype(np.float32)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--models", default="ResNet50,MobileNetV2,EfficientNetB0,InceptionV3,LSTM")
  parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "out"))
  args = parser.parse_args()

  from rich.console import Console
  from rich.table import Table

  from jaxport.profiling import profile

  console = Console(width=None if sys.stdout.isatty() else 170)
  results = []
  for name in args.models.split(","):
    with console.status(f"{name}: building, converting, compiling, timing..."):
      model, x = build(name, args.batch)
      results.append(profile(name, model, (x,), repeats=args.repeats, tf_xla=True))
    console.log(f"{name} done")

  table = Table(title=f"jaxport convert benchmark (batch {args.batch}, CPU, medians of {args.repeats})")
  for col in ["model", "convert s", "JAX compile s", "convert+compile s", "TF XLA compile s",
              "JAX run ms", "TF graph ms", "TF XLA ms", "JAX/TF graph", "JAX/TF XLA", "max abs err"]:
    table.add_column(col, justify="right" if col != "model" else "left")
  for r in results:
    table.add_row(r.name, f"{r.convert_s:.2f}", f"{r.compile_s:.2f}", f"{r.convert_s + r.compile_s:.2f}",
                  f"{r.tf_xla_compile_s:.2f}", f"{r.jax_run_s * 1e3:.1f}", f"{r.tf_run_s * 1e3:.1f}",
                  f"{r.tf_xla_run_s * 1e3:.1f}", f"{r.jax_run_s / r.tf_run_s:.2f}x",
                  f"{r.jax_run_s / r.tf_xla_run_s:.2f}x", f"{r.max_abs_err:.1e}")
  console.print(table)

  checks = []
  for r in results:
    checks.append((f"{r.name}: steady state <= TF XLA", r.jax_run_s <= r.tf_xla_run_s))
    checks.append((f"{r.name}: convert+compile <= TF XLA compile", r.convert_s + r.compile_s <= r.tf_xla_compile_s))
    if r.name in ("MobileNetV2", "EfficientNetB0"):
      checks.append((f"{r.name}: within 1.5x of TF graph", r.jax_run_s <= 1.5 * r.tf_run_s))
    if r.name == "InceptionV3":
      checks.append((f"{r.name}: compile < 10 s", r.compile_s < 10))
  for label, ok in checks:
    console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'MISS'}[/] {label}")

  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  plot(results, out / "convert_bench.png")
  console.print(f"plot written to {out / 'convert_bench.png'}")


def plot(results, path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = [r.name for r in results]
  idx = np.arange(len(names))
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
  width = 0.27
  for i, (label, values) in enumerate([("jaxport (jit)", [r.jax_run_s for r in results]),
                                       ("TF graph", [r.tf_run_s for r in results]),
                                       ("TF XLA", [r.tf_xla_run_s for r in results])]):
    ax1.bar(idx + (i - 1) * width, np.asarray(values) * 1e3, width, label=label)
  ax1.set_xticks(idx, names, rotation=20)
  ax1.set_ylabel("steady-state run time (ms)")
  ax1.set_yscale("log")
  ax1.legend()
  ax2.bar(idx - width / 2, [r.convert_s + r.compile_s for r in results], width, label="jaxport convert+compile")
  ax2.bar(idx + width / 2, [r.tf_xla_compile_s for r in results], width, label="TF XLA compile")
  ax2.set_xticks(idx, names, rotation=20)
  ax2.set_ylabel("seconds")
  ax2.legend()
  fig.suptitle("jaxport vs TensorFlow on CPU (ratios within one run)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)


if __name__ == "__main__":
  main()
