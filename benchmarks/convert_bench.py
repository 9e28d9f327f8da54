"""Converter benchmark: jaxport vs TF graph (oneDNN) and TF XLA, measured in one run.

For each model: conversion time, first-call compile time, steady-state jit run
time, and TF's `tf.function` and `jit_compile=True` times. Prints a table, checks
the targets, and writes benchmarks/out/convert_bench.png.

The jax2tf row: a Flax ResNet exported with `jax2tf.convert` (one XlaCallModule) and
converted back by jaxport's StableHLO interpreter, against the original JAX function
(compile and steady-state run time; target: run time within 5%).

The load row: a ResNet50 exported as a TF-free artifact (`jaxport.export`), timed from
`jaxport.load` to the end of its first jit call, against converting it again from its
SavedModel (`tf.saved_model.load` + `jaxport.convert_from_restored` + first jit call).

The tier-2 row: conversion-time cost per node of TF's XLA lowering, for ops without a
native rule.

  python benchmarks/convert_bench.py [--batch 4] [--repeats 5] [--models ResNet50,LSTM]
                                     [--sections tier2,jax2tf,load,models]
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
  parser.add_argument("--sections", default="tier2,jax2tf,load,models",
                      help="comma-separated: tier2 (lowering cost per node), jax2tf (round trip), "
                           "load (artifact vs SavedModel), models (Keras applications vs TF)")
  args = parser.parse_args()
  sections = set(args.sections.split(","))

  from rich.console import Console
  from rich.table import Table

  from jaxport.profiling import profile

  console = Console(width=None if sys.stdout.isatty() else 170)
  if "tier2" in sections:
    with console.status("tier 2: lowering ops through TF's XLA lowering..."):
      tier2_row(console)
  if "jax2tf" in sections:
    with console.status("jax2tf round trip of a Flax ResNet..."):
      jax2tf_row(console, args.batch, args.repeats)
  if "load" in sections:
    with console.status("ResNet50 artifact: export, load and first call vs converting again..."):
      load_row(console, args.batch, args.repeats)
  if "models" not in sections:
    return
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


def flax_resnet():
  """A small ResNet (basic blocks, BatchNorm in inference mode) written with flax.linen."""
  import flax.linen as nn

  class Block(nn.Module):
    features: int
    strides: int = 1

    @nn.compact
    def __call__(self, x):
      norm = lambda: nn.BatchNorm(use_running_average=True)
      y = nn.relu(norm()(nn.Conv(self.features, (3, 3), self.strides, use_bias=False)(x)))
      y = norm()(nn.Conv(self.features, (3, 3), use_bias=False)(y))
      if x.shape[-1] != self.features or self.strides != 1:
        x = norm()(nn.Conv(self.features, (1, 1), self.strides, use_bias=False)(x))
      return nn.relu(x + y)

  class ResNet(nn.Module):
    @nn.compact
    def __call__(self, x):
      x = nn.relu(nn.BatchNorm(use_running_average=True)(nn.Conv(32, (7, 7), 2, use_bias=False)(x)))
      x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
      for i, features in enumerate((32, 64, 128, 256)):
        x = Block(features, 1 if i == 0 else 2)(x)
        x = Block(features)(x)
      return nn.Dense(10)(x.mean(axis=(1, 2)))

  return ResNet()


def tier2_row(console) -> None:
  """Conversion-time cost of tier 2: TF lowers each node without a native rule to StableHLO."""
  import time

  import jax
  import tensorflow as tf
  from rich.table import Table

  import jaxport
  from jaxport.convert import xla_lowering

  def fn(x, y):   # ops with an XLA kernel and no native rule (yet)
    z = tf.linalg.cross(x, y) + tf.cast(tf.raw_ops.Bucketize(input=x, boundaries=[-1.0, 0.0, 1.0]), tf.float32)
    gram = tf.matmul(z, z, transpose_a=True) + 3.0 * tf.eye(3)
    z = tf.matmul(z, tf.linalg.inv(gram)) + tf.transpose(tf.linalg.solve(gram, tf.transpose(y)))
    z = z + tf.math.real(tf.signal.ifft(tf.signal.fft(tf.complex(z, 0.0))))
    z = z + tf.linalg.diag_part(tf.linalg.qr(gram)[1]) + tf.linalg.eigh(gram)[0]
    return tf.nn.depth_to_space(tf.reshape(tf.tile(z, [1, 4]), [2, 4, 1, 12]), 2)

  x, y = (np.random.RandomState(i).normal(size=(8, 3)).astype(np.float32) for i in (0, 1))
  xla_lowering.reset_lowering_stats()
  with jaxport.override_config("force_tier", None):
    start = time.perf_counter()
    f = jaxport.convert_functional(fn, x, y)
    convert_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(jax.jit(f)(x, y))
    first_call_s = time.perf_counter() - start
  from jaxport.profiling import max_abs_error
  error = max_abs_error(out, tf.function(fn)(x, y).numpy())
  stats = xla_lowering.lowering_stats()
  table = Table(title="tier 2: TF's XLA lowering of ops without a native rule (conversion-time cost)")
  for col in ["op", "lowered", "ms per node"]:
    table.add_column(col, justify="right" if col != "op" else "left")
  for op, row in sorted(stats["by_op"].items()):
    table.add_row(op, str(row.get("lowered", 0)), f"{1e3 * row.get('seconds', 0.0) / max(row.get('lowered', 0), 1):.0f}")
  table.add_row("total", str(stats["lowered"]), f"{1e3 * stats['seconds_per_node']:.0f}")
  console.print(table)
  console.print(f"convert {convert_s:.2f} s; first jit call (traces, lowers, compiles) {first_call_s:.2f} s; "
                f"max abs difference from TF {error:.1e}")


def jax2tf_row(console, batch: int, repeats: int) -> None:
  """Times the original JAX ResNet against its jax2tf export converted back by jaxport."""
  import time

  import jax
  import tensorflow as tf
  from jax.experimental import jax2tf
  from rich.table import Table

  import jaxport
  from jaxport.profiling import max_abs_error, median_time

  model = flax_resnet()
  x = np.random.RandomState(0).normal(size=(batch, 112, 112, 3)).astype(np.float32)
  variables = model.init(jax.random.key(0), x)
  original = jax.jit(lambda v, x: model.apply(v, x))
  start = time.perf_counter()
  compiled_original = original.lower(variables, x).compile()
  original_compile_s = time.perf_counter() - start
  original_s = median_time(lambda: compiled_original(variables, x), repeats)

  # The export closes over the weights, as a SavedModel of a JAX model does.
  tf_fn = tf.function(jax2tf.convert(lambda x: model.apply(variables, x)), autograph=False)
  start = time.perf_counter()
  jax_fn = jaxport.convert_functional(tf_fn, x)
  convert_s = time.perf_counter() - start
  converted = jax.jit(jax_fn)
  start = time.perf_counter()
  compiled = converted.lower(x).compile()
  compile_s = time.perf_counter() - start
  converted_s = median_time(lambda: compiled(x), repeats)
  error = max_abs_error(compiled(x), compiled_original(variables, x))

  table = Table(title=f"jax2tf round trip: Flax ResNet, batch {batch}, 112x112, CPU, medians of {repeats}")
  for col in ["", "convert s", "compile s", "run ms", "run / original", "max abs err"]:
    table.add_column(col, justify="right" if col else "left")
  table.add_row("original JAX", "-", f"{original_compile_s:.2f}", f"{original_s * 1e3:.1f}", "1.00x", "-")
  table.add_row("jax2tf → jaxport", f"{convert_s:.2f}", f"{compile_s:.2f}", f"{converted_s * 1e3:.1f}",
                f"{converted_s / original_s:.2f}x", f"{error:.1e}")
  console.print(table)
  ok = converted_s <= 1.05 * original_s
  console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'MISS'}[/] jax2tf round trip: run time within 5% "
                "of the original JAX function")


def load_row(console, batch: int, repeats: int) -> None:
  """ResNet50: `jaxport.load` of its artifact + first jit call vs converting it again from its SavedModel."""
  import tempfile
  import time

  import jax
  import keras
  import tensorflow as tf
  from rich.table import Table

  import jaxport
  from jaxport.artifact import example_inputs
  from jaxport.profiling import max_abs_error, median_time

  keras.utils.set_random_seed(0)
  model = keras.applications.ResNet50(weights=None)
  x = np.random.RandomState(0).uniform(0, 255, size=(batch, 224, 224, 3)).astype(np.float32)
  rows = {}
  with tempfile.TemporaryDirectory() as tmp:
    saved, artifact = os.path.join(tmp, "saved"), os.path.join(tmp, "artifact")
    module = tf.Module()
    module.model = model
    module.serve = tf.function(lambda images: model(images, training=False),
                               input_signature=[tf.TensorSpec([None, 224, 224, 3], tf.float32)])
    tf.saved_model.save(module, saved, signatures={"serving_default": module.serve})
    restored = tf.saved_model.load(saved)   # keep it: its variables live as long as it does
    jax_fn, params = jaxport.convert_from_restored(restored.signatures["serving_default"])
    args, kwargs = example_inputs(jax_fn, batch)
    start = time.perf_counter()
    jaxport.export(jax_fn, params, *args, path=artifact, platforms=("cpu", "cuda"), **kwargs)
    export_s = time.perf_counter() - start
    size = sum(os.path.getsize(os.path.join(artifact, f)) for f in os.listdir(artifact))
    del jax_fn, params, restored
    kept = []

    def convert_again():
      kept.append(tf.saved_model.load(saved))
      return jaxport.convert_from_restored(kept[-1].signatures["serving_default"])

    def first_call(prepare):
      start = time.perf_counter()
      fn, p = prepare()
      prepared = time.perf_counter() - start
      jitted = jax.jit(lambda p, images: fn(p, images=images)[0])
      out = jax.block_until_ready(jitted(p, x))
      total = time.perf_counter() - start
      return prepared, total - prepared, median_time(lambda: jitted(p, x), repeats), out

    rows["artifact: jaxport.load"] = first_call(lambda: jaxport.load(artifact))
    rows["SavedModel: load + convert_from_restored"] = first_call(convert_again)

  table = Table(title=f"load row: ResNet50, batch {batch}, CPU (export {export_s:.1f} s, artifact "
                      f"{size / 1e6:.0f} MB, platforms cpu+cuda)")
  for col in ["", "load / convert s", "first jit call s", "to first result s", "run ms", "vs converting again"]:
    table.add_column(col, justify="right" if col else "left")
  again = sum(rows["SavedModel: load + convert_from_restored"][:2])
  for name, (prepared, first, run_s, _) in rows.items():
    table.add_row(name, f"{prepared:.2f}", f"{first:.2f}", f"{prepared + first:.2f}", f"{run_s * 1e3:.1f}",
                  f"{(prepared + first) / again:.2f}x")
  console.print(table)
  outs = [r[3] for r in rows.values()]
  console.print(f"max abs difference, artifact vs converted: {max_abs_error(outs[0], outs[1]):.1e}")
  loaded_s = sum(rows["artifact: jaxport.load"][:2])
  ok = loaded_s < again
  console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'MISS'}[/] load row: an artifact reaches its first "
                "result sooner than converting the SavedModel again")


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
