"""Measure a conversion against TensorFlow: times and numerical agreement.

Used by `jaxport demo` and benchmarks/convert_bench.py, so both report the same
quantities measured the same way.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable

import jax
import numpy as np
import tree


@dataclasses.dataclass
class Profile:
  name: str
  convert_s: float
  compile_s: float
  jax_run_s: float
  tf_run_s: float
  tf_xla_run_s: float | None = None
  tf_xla_compile_s: float | None = None
  max_abs_err: float = float("nan")
  grad_rel_err: float | None = None

  def as_row(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def median_time(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (results are blocked on), after `warmup` calls."""
  for _ in range(warmup):
    _block(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    _block(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _block(out):
  for leaf in tree.flatten(out):
    if hasattr(leaf, "block_until_ready"):
      leaf.block_until_ready()
    elif hasattr(leaf, "numpy"):
      leaf.numpy()
  return out


def max_abs_error(actual, expected) -> float:
  errs = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(e, np.float64))))
          for a, e in zip(tree.flatten(actual), tree.flatten(expected)) if np.size(e)]
  return max(errs, default=0.0)


def profile(name: str, model, inputs: tuple, *, repeats: int = 5, tf_xla: bool = True,
            check_grad: bool = False) -> Profile:
  """Converts `model` (Keras model or TF callable) on `inputs` and times it against TF."""
  import tensorflow as tf

  import jaxport

  start = time.perf_counter()
  jax_fn, params = jaxport.convert(model, *inputs)
  convert_s = time.perf_counter() - start

  # Device-resident arguments on both sides: TF below gets tf.constants.
  params, device_inputs = jax.device_put(params), jax.device_put(inputs)
  jitted = jaxport.jit(jax_fn.outputs_only)   # with the XLA options jaxport picks for this graph
  start = time.perf_counter()
  compiled = jitted.lower(params, *device_inputs).compile()
  compile_s = time.perf_counter() - start
  jax_run_s = median_time(lambda: compiled(params, *device_inputs), repeats)

  tf_inputs = [tf.constant(x) for x in inputs]
  tf_fn = tf.function(lambda *xs: model(*xs))
  expected = tf_fn(*tf_inputs)
  tf_run_s = median_time(lambda: tf_fn(*tf_inputs), repeats)
  result = Profile(name, convert_s, compile_s, jax_run_s, tf_run_s,
                   max_abs_err=max_abs_error(compiled(params, *device_inputs), tree.map_structure(np.asarray, expected)))
  if tf_xla:
    xla_fn = tf.function(lambda *xs: model(*xs), jit_compile=True)
    start = time.perf_counter()
    _block(xla_fn(*tf_inputs))
    first = time.perf_counter() - start
    result.tf_xla_run_s = median_time(lambda: xla_fn(*tf_inputs), repeats, warmup=0)
    result.tf_xla_compile_s = max(first - result.tf_xla_run_s, 0.0)
  if check_grad:
    result.grad_rel_err = _grad_error(model, jax_fn, params, inputs)
  return result


def _grad_error(model, jax_fn, params, inputs) -> float:
  """Max abs difference of d(sum(out**2))/d(trainable params), JAX vs TF, relative to the largest TF gradient."""
  import tensorflow as tf

  def loss(p):
    outs = jax_fn(p, *inputs)[0]
    return sum(jax.numpy.sum(o.astype("float32") ** 2) for o in tree.flatten(outs))

  trainable = [k for k in params if jax_fn.trainable[k]]
  grads = jax.jit(jax.grad(loss))(params)
  with tf.GradientTape() as tape:
    outs = model(*inputs)
    tf_loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32) ** 2) for o in tree.flatten(outs)])
  tf_grads = tape.gradient(tf_loss, [jax_fn.tf_variables[k] for k in trainable])
  scale = max(float(np.max(np.abs(g.numpy()))) for g in tf_grads if g is not None)
  return max(max_abs_error(grads[k], g) for k, g in zip(trainable, tf_grads) if g is not None) / max(scale, 1e-12)
