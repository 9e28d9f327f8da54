"""Converter benchmark: jaxport vs TF graph, TF XLA, Keras 3 on JAX and tf2jax, measured in one run.

The models section: the 13 Keras applications of the model zoo, an LSTM and a Transformer block
(`_bench_models.py`), at each batch size of --batches. Per model and batch: jaxport's steady-state
run time (`jaxport.jit(f.outputs_only)`, device-resident inputs; the same under a plain `jax.jit`
in its own column), its ratio to TF's `tf.function` graph, to TF XLA
(`jit_compile=True`), to Keras 3 on its JAX backend with the same weights (a subprocess,
`_keras_jax_runner.py`) and to tf2jax (if installed); conversion + compile time against TF XLA's
compile. Calls are interleaved (jaxport, TF graph, TF XLA, Keras-JAX, ...) round by round, so machine
load hits every system alike, each timed call right after an untimed one of the same system (steady
state: no cold-cache penalty for whoever follows another system); medians of --repeats rounds.
Prints the targets met and missed and writes benchmarks/out/convert_bench.png.

The params-copy section: a jitted `f(params, x) -> (outputs, new_params)` writes every param to new
buffers per call; `outputs_only`, `with_changed_params` and donation avoid that. Bytes per call from
XLA's memory analysis and from `jax.live_arrays()`, and run times, for DenseNet121 (training mode:
BatchNorm statistics change) and a small BERT (inference).

The jax2tf row: a Flax ResNet exported with `jax2tf.convert` (one XlaCallModule) and
converted back by jaxport's StableHLO interpreter, against the original JAX function
(compile and steady-state run time; target: run time within 5%).

The load row: a ResNet50 exported as a TF-free artifact (`jaxport.export`), timed from
`jaxport.load` to the end of its first jit call, against converting it again from its
SavedModel (`tf.saved_model.load` + `jaxport.convert_from_restored` + first jit call).

The train section (`_train_step.py`): one training step of a converted Keras application (training
mode: BatchNorm batch statistics and moving averages; softmax cross-entropy, Adam) written as a user
writes it -- `jax.grad` and an optax update inside their own `jax.jit` -- against TF's `GradientTape`
+ `apply_gradients` in a `tf.function` (and with `jit_compile=True`).

The compile section (`_compile_time.py`, asked for by name): from a built Keras application to its first
result at batch 2, jaxport (convert, then a plain `jax.jit`: trace, lower, compile, first call) against
TF XLA (trace, first call), each side cold in its own process.

The tier-2 row: conversion-time cost per node of TF's XLA lowering, for ops without a
native rule.

  python benchmarks/convert_bench.py [--models ResNet50,MobileNetV2,LSTM] [--batches 2,32] [--repeats 7]
                                     [--batch 4] [--train-models ResNet50] [--train-batch 8]
                                     [--sections tier2,jax2tf,load,params_copy,train,models,compile]
                                     [--compile-repeats 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE))
from _bench_models import ALL_MODELS, APPLICATIONS, build_model, example_input  # noqa: E402
from _timing import block, interleaved, timed  # noqa: E402

# "jaxport": `jaxport.jit` (jax.jit with jaxport's tuned XLA options, jaxport/xla_options.py);
# "jaxport jax.jit": the same function under a plain `jax.jit`.
SYSTEMS = ("jaxport", "jaxport jax.jit", "TF graph", "TF XLA", "Keras JAX", "tf2jax")


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", default=",".join(ALL_MODELS))
  parser.add_argument("--batches", default="2,32", help="batch sizes of the models section, all in one run")
  parser.add_argument("--repeats", type=int, default=7, help="timed rounds per model and batch (medians)")
  parser.add_argument("--batch", type=int, default=4, help="batch size of the jax2tf and load rows")
  parser.add_argument("--out", default=str(HERE / "out"))
  parser.add_argument("--train-models", default="ResNet50,MobileNetV2", help="models of the train section")
  parser.add_argument("--train-batch", type=int, default=8, help="batch size of the train section")
  parser.add_argument("--compile-repeats", type=int, default=3, help="cold processes per side (compile section)")
  parser.add_argument("--sections", default="tier2,jax2tf,load,params_copy,train,models",
                      help="comma-separated: tier2 (lowering cost per node), jax2tf (round trip), "
                           "load (artifact vs SavedModel), params_copy (call forms and donation), "
                           "train (a training step in the user's own jax.jit vs TF's GradientTape step), "
                           "models (Keras applications vs TF, Keras-on-JAX and tf2jax), "
                           "compile (conversion + first compile vs TF XLA's first call, cold processes, batch 2; "
                           "not in the default run)")
  args = parser.parse_args()
  sections = set(args.sections.split(","))

  from rich.console import Console

  console = Console(width=None if sys.stdout.isatty() else 200)
  console.print(machine_line())
  if "tier2" in sections:
    with console.status("tier 2: lowering ops through TF's XLA lowering..."):
      tier2_row(console)
  if "jax2tf" in sections:
    with console.status("jax2tf round trip of a Flax ResNet..."):
      jax2tf_row(console, args.batch, args.repeats)
  if "load" in sections:
    with console.status("ResNet50 artifact: export, load and first call vs converting again..."):
      load_row(console, args.batch, args.repeats)
  if "params_copy" in sections:
    params_copy_rows(console, args.repeats)
  if "train" in sections:
    from _train_step import train_step_rows
    train_step_rows(console, args.train_models.split(","), args.train_batch, args.repeats)
  if "compile" in sections:
    from _compile_time import compile_rows
    compile_rows(console, [m for m in args.models.split(",") if m in APPLICATIONS], 2, args.compile_repeats)
  if "models" in sections:
    batches = [int(b) for b in args.batches.split(",")]
    rows = models_rows(console, args.models.split(","), batches, args.repeats)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(rows, out / "convert_bench.png")
    console.print(f"plot written to {out / 'convert_bench.png'}")


def machine_line() -> str:
  """The CPU model and the threads each framework may use."""
  model = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return (f"CPU: {model}; {os.cpu_count()} logical CPUs, {usable} usable by this process (XLA and TF's "
          f"thread pools size to it); Python {platform.python_version()}")


# --------------------------------------------------------------------------- models section


@dataclasses.dataclass
class Row:
  name: str
  batch: int
  convert_s: float
  compile_s: float               # jaxport: lower + compile of the jitted call
  xla_compile_s: float           # TF XLA: first call minus a steady-state call
  run_s: dict[str, float]        # system -> median steady-state seconds
  rel_err: float                 # jaxport vs TF graph: max abs difference / max abs TF output
  keras_jax_err: float = float("nan")

  def ratio(self, system: str) -> float:
    other = self.run_s.get(system)
    return self.run_s["jaxport"] / other if other else float("nan")


class KerasJax:
  """Keras 3 on its JAX backend in a subprocess (`_keras_jax_runner.py`), answering one command at a time."""

  def __init__(self, name: str, model, tmp: str):
    self._tmp = tmp
    weights = os.path.join(tmp, f"{name}.weights.h5")
    model.save_weights(weights)
    self._log = open(os.path.join(tmp, f"{name}.log"), "w+")
    self._proc = subprocess.Popen([sys.executable, str(HERE / "_keras_jax_runner.py"), name, weights],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                  cwd=HERE, env=dict(os.environ, KERAS_BACKEND="jax"))
    self._read()

  def _read(self) -> dict:
    for line in self._proc.stdout:
      if line.startswith("@@ "):
        return json.loads(line[3:])
    self._log.seek(0)
    raise RuntimeError(f"the Keras-on-JAX runner exited ({self._proc.wait()}):\n{self._log.read()[-2000:]}")

  def _ask(self, command: str) -> dict:
    self._proc.stdin.write(command + "\n")
    self._proc.stdin.flush()
    return self._read()

  def prepare(self, x: np.ndarray) -> tuple[float, np.ndarray]:
    """Compiles for `x`'s shape: (compile seconds, output)."""
    path = os.path.join(self._tmp, "input.npy")
    np.save(path, x)
    compile_s = self._ask(f"prepare {path}")["compile_s"]
    return compile_s, np.load(path + ".out.npy")

  def time_call(self) -> float:
    return self._ask("time")["s"]

  def close(self) -> None:
    try:
      self._proc.stdin.write("quit\n")
      self._proc.stdin.close()
      self._proc.wait(timeout=60)
    except (OSError, subprocess.TimeoutExpired):   # already gone (Ctrl-C reaches it too), or stuck
      self._proc.kill()
    self._log.close()


def _tf2jax():
  """tf2jax if it is installed (and is not jaxport installed under that name)."""
  try:
    import tf2jax
  except ImportError:
    return None
  return None if "jaxport" in (getattr(tf2jax, "__file__", "") or "") else tf2jax


def measure(name: str, model, batch: int, keras_jax: KerasJax | None, repeats: int) -> Row:
  """One model at one batch size against every system, interleaved."""
  import jax
  import tensorflow as tf

  import jaxport

  x = example_input(name, batch)
  start = time.perf_counter()
  fn, params = jaxport.convert(model, x)
  convert_s = time.perf_counter() - start
  params, x_device = jax.device_put(params), jax.device_put(x)
  start = time.perf_counter()
  compiled = jaxport.jit(fn.outputs_only).lower(params, x_device).compile()
  compile_s = time.perf_counter() - start
  plain = jax.jit(fn.outputs_only).lower(params, x_device).compile()

  tf_x = tf.constant(x)
  graph = tf.function(lambda t: model(t, training=False))
  xla = tf.function(lambda t: model(t, training=False), jit_compile=True)
  expected = graph(tf_x).numpy()
  start = time.perf_counter()
  block(xla(tf_x))
  xla_first_s = time.perf_counter() - start
  runners = {"jaxport": timed(lambda: compiled(params, x_device)),
             "jaxport jax.jit": timed(lambda: plain(params, x_device)), "TF graph": timed(lambda: graph(tf_x)),
             "TF XLA": timed(lambda: xla(tf_x))}
  keras_err = float("nan")
  if keras_jax is not None:
    _, keras_out = keras_jax.prepare(x)
    keras_err = relative_error(keras_out, expected)
    runners["Keras JAX"] = keras_jax.time_call
  peer = _tf2jax()
  if peer is not None:
    peer_fn, peer_params = peer.convert(graph, np.zeros_like(x))
    peer_jit = jax.jit(lambda p, t: peer_fn(p, t)[0])
    peer_params = jax.device_put(peer_params)
    runners["tf2jax"] = timed(lambda: peer_jit(peer_params, x_device))
  run_s = interleaved(runners, repeats)
  return Row(name, batch, convert_s, compile_s, max(xla_first_s - run_s["TF XLA"], 0.0), run_s,
             relative_error(compiled(params, x_device), expected), keras_err)


def relative_error(actual, expected) -> float:
  from jaxport.profiling import max_abs_error
  return max_abs_error(actual, expected) / max(float(np.max(np.abs(expected))), 1e-30)


def models_rows(console, names: list[str], batches: list[int], repeats: int) -> list[Row]:
  rows = []
  try:
    with tempfile.TemporaryDirectory() as tmp:
      for name in names:
        with console.status(f"{name}: building, starting Keras on JAX, converting, compiling, timing..."):
          rows += model_rows(console, name, batches, repeats, tmp)
  except KeyboardInterrupt:   # Ctrl-C: the rows measured so far still print
    console.print("[yellow]interrupted: the table holds the rows measured so far")
  print_models_table(console, rows, repeats)
  return rows


def model_rows(console, name: str, batches: list[int], repeats: int, tmp: str) -> list[Row]:
  """One model at every batch size; a batch that fails is reported and skipped."""
  model, rows, keras_jax = build_model(name), [], None
  try:
    keras_jax = KerasJax(name, model, tmp)
  except (RuntimeError, OSError) as e:
    console.print(f"[yellow]{name}: Keras on JAX unavailable: {str(e)[-300:]}")
  try:
    for batch in batches:
      try:
        rows.append(measure(name, model, batch, keras_jax, repeats))
      except Exception as e:   # one model failing (an op without a rule) leaves the others' rows
        console.print(f"[red]{name} batch {batch} failed: {type(e).__name__}: {str(e)[:400]}")
        continue
      r = rows[-1]
      console.log(f"{name} batch {batch}: jaxport {r.run_s['jaxport'] * 1e3:.1f} ms, {r.ratio('TF graph'):.2f}x TF "
                  f"graph, {r.ratio('TF XLA'):.2f}x TF XLA, {r.ratio('Keras JAX'):.2f}x Keras JAX; convert+compile "
                  f"{r.convert_s + r.compile_s:.1f} s (convert {r.convert_s:.1f} + compile {r.compile_s:.1f}) vs TF "
                  f"XLA compile {r.xla_compile_s:.1f} s")
  finally:
    if keras_jax is not None:
      keras_jax.close()
  return rows


def print_models_table(console, rows: list[Row], repeats: int) -> None:
  from rich.table import Table

  peer = any("tf2jax" in r.run_s for r in rows)
  table = Table(title=f"jaxport convert benchmark (CPU, interleaved, medians of {repeats}); ratios are "
                      "jaxport's time over the other system's (< 1: jaxport faster)")
  columns = ["model", "batch", "jaxport ms", "jaxport jax.jit ms", "TF graph ms", "TF XLA ms", "Keras JAX ms"] + \
            (["tf2jax ms"] if peer else []) + ["/jaxport jax.jit", "/TF graph", "/TF XLA", "/Keras JAX"] + \
            (["/tf2jax"] if peer else []) + \
            ["convert+compile s", "TF XLA compile s", "rel err", "Keras JAX rel err"]
  for col in columns:
    table.add_column(col, justify="left" if col == "model" else "right")
  ms = lambda r, k: f"{r.run_s[k] * 1e3:.1f}" if k in r.run_s else "-"
  ratio = lambda r, k: f"{r.ratio(k):.2f}x" if k in r.run_s else "-"
  for r in rows:
    shown = [k for k in SYSTEMS if peer or k != "tf2jax"]
    table.add_row(r.name, str(r.batch), *[ms(r, k) for k in shown], *[ratio(r, k) for k in shown[1:]],
                  f"{r.convert_s + r.compile_s:.2f}", f"{r.xla_compile_s:.2f}", f"{r.rel_err:.1e}",
                  f"{r.keras_jax_err:.1e}")
  console.print(table)
  if not peer:
    console.print("tf2jax: not installed (pip install tf2jax==0.3.8 adds its column)")
  for label, ok, misses in targets(rows):
    detail = "" if ok else f" (missed: {', '.join(misses)})"
    console.print(f"[{'green' if ok else 'red'}]{'PASS' if ok else 'MISS'}[/] {label}{detail}")


def geomean(values) -> float:
  values = [v for v in values if v == v]
  return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def targets(rows: list[Row]) -> list[tuple[str, bool, list[str]]]:
  """(target, met, rows that miss it) for the issue's targets."""
  label = lambda r: f"{r.name}@{r.batch}"
  plain = lambda r: r.run_s["jaxport jax.jit"] / r.run_s["TF graph"]
  checks = [("every model <= 1.0x TF graph", [label(r) for r in rows if not r.ratio("TF graph") <= 1.0]),
            ("plain jax.jit: every model <= 1.0x TF graph", [label(r) for r in rows if not plain(r) <= 1.0])]
  for batch in sorted({r.batch for r in rows}):
    g = geomean(r.ratio("TF graph") for r in rows if r.batch == batch)
    checks.append((f"geomean at batch {batch} <= 0.8x TF graph (is {g:.2f}x)", [] if g <= 0.8 else [f"batch {batch}"]))
  with_keras = [r for r in rows if "Keras JAX" in r.run_s]
  checks.append((f"every model <= Keras on JAX ({len(with_keras)} rows)",
                 [label(r) for r in with_keras if not r.ratio("Keras JAX") <= 1.0]))
  checks.append(("convert + compile <= TF XLA compile",
                 [label(r) for r in rows if not r.convert_s + r.compile_s <= r.xla_compile_s]))
  return [(name, not misses, misses) for name, misses in checks]


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


# --------------------------------------------------------------------------- params-copy section


def _bert():
  """A small BERT (keras-hub BertBackbone, random weights) and its inputs, batch 8, 128 tokens."""
  import keras
  import keras_hub
  keras.utils.set_random_seed(0)
  model = keras_hub.models.BertBackbone(vocabulary_size=1000, num_layers=4, num_heads=4, hidden_dim=256,
                                        intermediate_dim=1024, max_sequence_length=128)
  rs = np.random.RandomState(0)
  inputs = {"token_ids": rs.randint(1, 1000, (8, 128)).astype(np.int32),
            "segment_ids": np.zeros((8, 128), np.int32), "padding_mask": np.ones((8, 128), np.int32)}
  return model, inputs


def params_copy_rows(console, repeats: int) -> None:
  """Bytes written and run time per call of each call form, with and without donation."""
  import jax
  import jax.numpy as jnp
  from rich.table import Table

  import jaxport

  densenet = build_model("DenseNet121")
  cases = [("DenseNet121, training (BatchNorm statistics change), batch 2",
            lambda t: densenet(t, training=True), example_input("DenseNet121", 2))]
  cases.append(("BERT (keras-hub BertBackbone, 4 layers, hidden 256), inference, batch 8", *_bert()))
  for title, model, x in cases:
    with console.status(f"params copy: {title}..."):
      fn, params = jaxport.convert(model, x)
      params, x = jax.device_put(params), jax.device_put(x)
      param_bytes = sum(v.nbytes for v in params.values())
      forms = {"f (outputs, new_params)": jax.jit(fn), "f.outputs_only": jax.jit(fn.outputs_only),
               "f.with_changed_params": jax.jit(fn.with_changed_params),
               "f + donate_argnums=0": jax.jit(fn, donate_argnums=0)}
      compiled, stats, held = {}, {}, {}
      for label, jitted in forms.items():
        compiled[label] = jitted.lower(params, x).compile()
        stats[label] = compiled[label].memory_analysis()
      donated = [jax.tree.map(jnp.copy, params)]

      def run_donated():
        out, donated[0] = compiled["f + donate_argnums=0"](donated[0], x)
        return out, donated[0]

      calls = {label: (lambda c=c: c(params, x)) for label, c in compiled.items() if "donate" not in label}
      calls["f + donate_argnums=0"] = run_donated
      for label, call in calls.items():   # bytes of the arrays a call leaves alive (its result)
        jax.block_until_ready(call())
        before = sum(a.nbytes for a in jax.live_arrays())
        result = jax.block_until_ready(call())
        held[label] = (sum(a.nbytes for a in jax.live_arrays()) - before, len(jax.tree.leaves(result)))
        del result
      run_s = interleaved({label: timed(call) for label, call in calls.items()}, repeats)
    table = Table(title=f"params copy: {title}; {len(params)} params, {param_bytes / 1e6:.1f} MB "
                        f"(CPU, interleaved, medians of {repeats})")
    for col in ["call form", "outputs", "XLA output MB", "aliased MB", "temp MB", "written per call MB",
                "live arrays added MB", "run ms", "vs f"]:
      table.add_column(col, justify="left" if col == "call form" else "right")
    for label, m in stats.items():
      written = m.output_size_in_bytes - m.alias_size_in_bytes
      table.add_row(label, str(held[label][1]), f"{m.output_size_in_bytes / 1e6:.1f}",
                    f"{m.alias_size_in_bytes / 1e6:.1f}", f"{m.temp_size_in_bytes / 1e6:.1f}",
                    f"{written / 1e6:.1f}", f"{held[label][0] / 1e6:.1f}", f"{run_s[label] * 1e3:.1f}",
                    f"{run_s[label] / run_s['f (outputs, new_params)']:.2f}x")
    console.print(table)
  console.print("written per call = XLA output bytes not aliased to a donated input; live arrays added = bytes "
                "of the arrays a call leaves alive (a donated call frees the old params)")


def plot(rows: list[Row], path) -> None:
  """Per batch size: jaxport's time ratios to each system, and convert+compile vs TF XLA's compile."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  batches = sorted({r.batch for r in rows})
  fig, axes = plt.subplots(len(batches), 2, figsize=(16, 4.5 * len(batches)), squeeze=False)
  for (ax1, ax2), batch in zip(axes, batches):
    sel = [r for r in rows if r.batch == batch]
    idx = np.arange(len(sel))
    others = [k for k in SYSTEMS[1:] if any(k in r.run_s for r in sel)]
    width = 0.8 / max(len(others), 1)
    for i, system in enumerate(others):
      ax1.bar(idx + (i - (len(others) - 1) / 2) * width, [r.ratio(system) for r in sel], width,
              label=f"jaxport / {system}")
    ax1.axhline(1.0, color="black", linewidth=0.8)
    ax1.set_xticks(idx, [r.name for r in sel], rotation=45, ha="right")
    ax1.set_ylabel("run time ratio (< 1: jaxport faster)")
    ax1.set_title(f"batch {batch}: steady state, geomean vs TF graph "
                  f"{geomean(r.ratio('TF graph') for r in sel):.2f}x")
    ax1.legend(fontsize=8)
    ax2.bar(idx - 0.2, [r.convert_s + r.compile_s for r in sel], 0.4, label="jaxport convert+compile")
    ax2.bar(idx + 0.2, [r.xla_compile_s for r in sel], 0.4, label="TF XLA compile")
    ax2.set_xticks(idx, [r.name for r in sel], rotation=45, ha="right")
    ax2.set_ylabel("seconds")
    ax2.set_title(f"batch {batch}: conversion + compile")
    ax2.legend(fontsize=8)
  fig.suptitle("jaxport vs TF graph, TF XLA, Keras on JAX (and tf2jax) on CPU, ratios within one run")
  fig.tight_layout()
  fig.savefig(path, dpi=100)


if __name__ == "__main__":
  main()
