"""The convert benchmark's train section: a converted Keras application's training step, written the
way a user writes it, against TF's own training step on the same weights.

jaxport: `jaxport.convert(lambda t: model(t, training=True), x)`, then the user's step -- `jax.grad`
of a softmax cross-entropy over the trainable params, an optax Adam update, BatchNorm's moving
statistics taken from `new_params` -- in their own `jax.jit` (XLA's default options), with the state
donated as a training loop does; the same step with `xla_options.CONV_NET_CPU_OPTIONS` in its own
column; and the same step on the converted function exported and `jaxport.load`ed (a user fine-tuning
from an artifact: the StableHLO interpreter's function differentiated). TF: `GradientTape` + `apply_gradients` of a Keras Adam in a `tf.function` (graph) and with
`jit_compile=True` (XLA). Both start from the same weights; the first step's losses are compared.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time

import numpy as np

from _bench_models import build_model, example_input
from _timing import interleaved

SYSTEMS = ("jax.jit", "jax.jit + conv options", "artifact jax.jit", "TF graph", "TF XLA")


@dataclasses.dataclass
class TrainRow:
  name: str
  batch: int
  run_s: dict[str, float]       # system -> median seconds per step
  compile_s: float              # the user's jax.jit step: lower + compile
  tf_xla_first_s: float         # TF XLA's first step (tracing + compile + one step)
  loss_rel_err: float           # first-step loss, jaxport vs TF graph
  artifact_loss_rel_err: float  # first-step loss, the loaded artifact vs the converted function

  def ratio(self, system: str, to: str = "TF graph") -> float:
    return self.run_s[system] / self.run_s[to]


def _labels(batch: int, classes: int) -> np.ndarray:
  return np.random.RandomState(7).randint(0, classes, size=(batch,)).astype(np.int32)


def _tf_step(model, jit_compile: bool):
  import keras
  import tensorflow as tf

  optimizer = keras.optimizers.Adam(1e-3)

  @tf.function(jit_compile=jit_compile)
  def step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss
  return step


def _jax_step(jax_fn, params, compiler_options=None):
  """The user's training step: returns (step, initial state); step(state, x, y) -> (state, loss)."""
  import jax
  import optax

  trainable = {k: v for k, v in params.items() if jax_fn.trainable[k]}
  others = {k: v for k, v in params.items() if not jax_fn.trainable[k]}
  optimizer = optax.adam(1e-3)

  def loss_fn(trainable, others, x, y):
    logits, new_params = jax_fn({**others, **trainable}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean(), new_params

  def step(state, x, y):
    trainable, others, opt_state = state
    (loss, new_params), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, others, x, y)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    return (optax.apply_updates(trainable, updates), {k: new_params[k] for k in others}, opt_state), loss

  state = jax.device_put((trainable, others, optimizer.init(trainable)))
  return jax.jit(step, donate_argnums=0, compiler_options=compiler_options), state


def measure_train(name: str, batch: int, repeats: int) -> TrainRow:
  import jax
  import tensorflow as tf

  import jaxport
  from jaxport import xla_options

  model = build_model(name)
  x = example_input(name, batch)
  y = _labels(batch, model.output_shape[-1])
  jax_fn, params = jaxport.convert(lambda t: model(t, training=True), x)   # before TF's steps move the weights
  params = {k: np.asarray(v) for k, v in params.items()}
  x_device, y_device = jax.device_put(x), jax.device_put(y)
  with tempfile.TemporaryDirectory() as artifact:
    jaxport.export(jax_fn, params, x, path=artifact)   # the default platforms, cpu and cuda
    loaded_fn, _ = jaxport.load(artifact)
  steps, states, first_loss = {}, {}, {}
  compile_s = 0.0
  for system, fn, options in (("jax.jit", jax_fn, None),
                              ("jax.jit + conv options", jax_fn, xla_options.CONV_NET_CPU_OPTIONS),
                              ("artifact jax.jit", loaded_fn, None)):
    step, state = _jax_step(fn, params, options)
    start = time.perf_counter()
    steps[system] = step.lower(state, x_device, y_device).compile()
    if options is None:
      compile_s = time.perf_counter() - start
    states[system], loss = steps[system](state, x_device, y_device)
    first_loss[system] = float(loss)

  tf_x, tf_y = tf.constant(x), tf.constant(y)
  graph, xla = _tf_step(model, False), _tf_step(model, True)
  tf_loss = float(graph(tf_x, tf_y))       # the same initial weights: jaxport's params were read before
  start = time.perf_counter()
  float(xla(tf_x, tf_y))
  tf_xla_first_s = time.perf_counter() - start

  def jax_runner(system):
    def run() -> float:
      start = time.perf_counter()
      states[system], loss = steps[system](states[system], x_device, y_device)
      loss.block_until_ready()
      return time.perf_counter() - start
    return run

  def tf_runner(step):
    def run() -> float:
      start = time.perf_counter()
      float(step(tf_x, tf_y))
      return time.perf_counter() - start
    return run

  runners = {system: jax_runner(system) for system in steps}
  run_s = interleaved({**runners, "TF graph": tf_runner(graph), "TF XLA": tf_runner(xla)}, repeats)
  rel = lambda a, b: abs(a - b) / max(abs(b), 1e-30)
  return TrainRow(name, batch, run_s, compile_s, tf_xla_first_s, rel(first_loss["jax.jit"], tf_loss),
                  rel(first_loss["artifact jax.jit"], first_loss["jax.jit"]))


def train_step_rows(console, names: list[str], batch: int, repeats: int) -> list[TrainRow]:
  from rich.table import Table

  rows = []
  for name in names:
    with console.status(f"train step: {name} at batch {batch}: converting, compiling, timing..."):
      try:
        rows.append(measure_train(name, batch, repeats))
      except Exception as e:   # one model failing leaves the others' rows
        console.print(f"[red]train step {name} failed: {type(e).__name__}: {str(e)[:400]}")
  table = Table(title=f"Training step (grad + Adam), batch {batch}, CPU, interleaved medians of {repeats}: the "
                      "user's own jax.jit vs TF's GradientTape step")
  for col in ["model", *[f"{s} ms" for s in SYSTEMS], "jax.jit /TF graph", "artifact /TF graph", "jax.jit /TF XLA",
              "compile s", "TF XLA first step s", "first loss rel err", "artifact loss rel err"]:
    table.add_column(col, justify="left" if col == "model" else "right")
  for r in rows:
    table.add_row(r.name, *[f"{r.run_s[s] * 1e3:.1f}" for s in SYSTEMS], f"{r.ratio('jax.jit'):.2f}x",
                  f"{r.ratio('artifact jax.jit'):.2f}x",
                  f"{r.ratio('jax.jit', 'TF XLA'):.2f}x", f"{r.compile_s:.1f}", f"{r.tf_xla_first_s:.1f}",
                  f"{r.loss_rel_err:.1e}", f"{r.artifact_loss_rel_err:.1e}")
  console.print(table)
  misses = [r.name for r in rows if not r.ratio("jax.jit") <= 1.0]
  console.print(f"[{'red' if misses else 'green'}]{'MISS' if misses else 'PASS'}[/] the user's jax.jit training "
                f"step <= TF's GradientTape step (graph){' (missed: ' + ', '.join(misses) + ')' if misses else ''}")
  return rows
