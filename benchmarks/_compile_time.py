"""The convert benchmark's compile section: from a built Keras model to its first result, jaxport against
TF XLA, each side in a fresh process (issue 20, item 4).

jaxport: `jaxport.convert` (TF's trace of the model included), then the plain `jax.jit` a tf2jax user
writes -- JAX's trace, lowering, XLA's compile -- and the first call. TF: `tf.function(jit_compile=True)`'s
trace (`get_concrete_function`) and its first call (TF's graph passes, XLA's compile, the run). Each side
runs cold in its own subprocess, alternating, so neither inherits the other's caches (Keras layers'
AutoGraph conversions, TF's traced functions): measured in one process, whichever side runs second is
~0.1-0.6 s faster. Wall seconds, medians over `repeats` processes per side.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import numpy as np

_JAXPORT_PARTS = ("convert", "trace", "lower", "compile", "first_call")
_TF_PARTS = ("trace", "first_call")


@dataclasses.dataclass
class CompileRow:
  name: str
  batch: int
  jaxport: dict[str, float]   # part -> median seconds
  tf: dict[str, float]

  @property
  def jaxport_total(self) -> float:
    return sum(self.jaxport.values())

  @property
  def tf_total(self) -> float:
    return sum(self.tf.values())


def _child(side: str, name: str, batch: int) -> None:
  """Runs in the subprocess: one side, cold; prints its parts as JSON."""
  import jax

  from _bench_models import build_model, example_input
  model, x = build_model(name), example_input(name, batch)
  parts = {}

  def timed(part, fn):
    start = time.perf_counter()
    result = fn()
    parts[part] = time.perf_counter() - start
    return result

  if side == "jaxport":
    import jaxport
    fn, params = timed("convert", lambda: jaxport.convert(model, x))
    params, x_device = jax.device_put(params), jax.device_put(x)
    traced = timed("trace", lambda: jax.jit(fn).trace(params, x_device))
    lowered = timed("lower", traced.lower)
    compiled = timed("compile", lowered.compile)
    timed("first_call", lambda: jax.block_until_ready(compiled(params, x_device)))
  else:
    import tensorflow as tf
    xla = tf.function(lambda t: model(t, training=False), jit_compile=True)
    timed("trace", lambda: xla.get_concrete_function(tf.TensorSpec(x.shape, tf.float32)))
    timed("first_call", lambda: xla(tf.constant(x)).numpy())
  print("COMPILE_PARTS " + json.dumps(parts), flush=True)


def _run_side(side: str, name: str, batch: int) -> dict[str, float]:
  env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run([sys.executable, __file__, side, name, str(batch)], env=env, capture_output=True,
                          text=True, timeout=1800, cwd=os.path.dirname(os.path.abspath(__file__)))
  for line in result.stdout.splitlines():
    if line.startswith("COMPILE_PARTS "):
      return json.loads(line.split(" ", 1)[1])
  raise RuntimeError(f"{side} {name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}")


def compile_rows(console, names: list[str], batch: int, repeats: int) -> list[CompileRow]:
  rows = []
  for name in names:
    runs = {"jaxport": [], "tf": []}
    with console.status(f"compile time: {name}..."):
      for _ in range(repeats):
        for side in runs:
          runs[side].append(_run_side(side, name, batch))
    median = lambda side: {part: float(np.median([r[part] for r in runs[side]])) for part in runs[side][0]}
    rows.append(CompileRow(name, batch, median("jaxport"), median("tf")))
  print_compile_table(console, rows, repeats)
  return rows


def print_compile_table(console, rows: list[CompileRow], repeats: int) -> None:
  from rich.table import Table
  table = Table(title=f"From a built model to its first result, each side cold in its own process (wall s, "
                      f"medians of {repeats})")
  for column in ("model", "batch", "convert", "JAX trace", "lower", "XLA compile", "first call", "jaxport total",
                 "TF trace", "TF first call", "TF XLA total", "jaxport / TF", "met"):
    table.add_column(column, justify="left" if column == "model" else "right")
  for r in rows:
    ratio = r.jaxport_total / r.tf_total
    table.add_row(r.name, str(r.batch), *(f"{r.jaxport[p]:.2f}" for p in _JAXPORT_PARTS), f"{r.jaxport_total:.2f}",
                  *(f"{r.tf[p]:.2f}" for p in _TF_PARTS), f"{r.tf_total:.2f}", f"{ratio:.2f}x",
                  "yes" if ratio <= 1 else "no")
  console.print(table)


if __name__ == "__main__":
  _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
