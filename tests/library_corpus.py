"""Shared checks for the corpora of programs from TF libraries (TFP, Sonnet, TFRS, TF-Agents).

`check_program(name, fn, *args)` converts `fn` (a Python function of TF ops that may close over
tf.Variables) and compares with TF:
  * outputs and assigned variables, converted eager and under `jax.jit`;
  * gradients of a random projection of the outputs w.r.t. trainable params and float inputs,
    against `tf.GradientTape` (when `grad=True`).
`check_eager_program` does the same for programs whose shapes depend on input values: outputs and
gradients without jit, and under `jax.jit` the converter's `DynamicShapeError` naming the node.
Timings (convert s, eager s, TF s, jit s) land in `TIMINGS`, which the benchmark prints.
"""
from __future__ import annotations

import contextlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf
import tree

import jaxport
from jaxport.errors import DynamicShapeError

import oracle

RTOL = 1e-5
TIMINGS: dict[str, dict] = {}


@contextlib.contextmanager
def legacy_tf_keras():
  """Routes `tf.keras` to tf_keras (Keras 2) while the block runs, as `TF_USE_LEGACY_KERAS=1` would
  for a whole process: TFRS and TF-Agents are written for Keras 2, the rest of the suite uses Keras 3."""
  import importlib
  import tensorflow as tf_module
  saved = tf_module.__dict__.get("keras")
  tf_module.keras = importlib.import_module("tf_keras.api._v2.keras")
  try:
    yield
  finally:
    tf_module.keras = saved


def _np(x):
  return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def _magnitude(leaves) -> float:
  finite = [np.abs(_np(x).astype(np.float64)) for x in leaves]
  return max([float(x[np.isfinite(x)].max(initial=0)) for x in finite] + [0.0])


def assert_close(actual, expected, what, rtol=RTOL, exact=False, atol=0.0):
  """Each leaf within rtol of TF's, with an absolute floor of rtol times the output's magnitude
  (or `atol`, if larger)."""
  tree.assert_same_structure(expected, actual, check_types=False)
  floor = max(atol, rtol * _magnitude(tree.flatten(expected)))
  for a, e in zip(tree.flatten(actual), tree.flatten(expected)):
    a, e = _np(a), _np(e)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != TF {e.shape}"
    if exact or e.dtype.kind not in "fc":
      np.testing.assert_array_equal(a, e, err_msg=what)
    else:
      np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=floor, err_msg=what)


def _timed(fn, *args):
  start = time.perf_counter()
  out = fn(*args)
  jax.block_until_ready(tree.map_structure(lambda x: x if isinstance(x, jax.Array) else 0, out))
  return out, time.perf_counter() - start


def _best_of(fn, *args, n=3):
  return min(_timed(fn, *args)[1] for _ in range(n))


def _is_float(x) -> bool:
  return np.issubdtype(np.asarray(_np(x)).dtype, np.floating)


def check_program(name: str, library: str, fn, *args, grad=True, exact=False, rtol=RTOL, grad_rtol=None,
                  variables_changed=False, variables_atol=0.0, config=None):
  """Converts `fn(*args)` and checks it against TF; returns (jax_fn, params). `exact`: outputs must be
  bit-equal (stateless sampling). `variables_changed`: `fn` assigns variables; compare them too, each
  within rtol of its magnitude or `variables_atol` (for updates that are float noise in TF too).
  `config`: jaxport settings in force while converting (e.g. `tf_random_streams` for seeded draws)."""
  tf_fn = tf.function(fn)
  with jaxport.override_configs(config or {}):
    jax_fn, convert_s = _timed(lambda: jaxport.convert(tf_fn, *args))
  jax_fn, params = jax_fn
  tf_vars = jax_fn.tf_variables
  if oracle.VIA_ARTIFACT:
    jax_fn, params = oracle.through_artifact(jax_fn, params, args)
  before = {k: v.numpy() for k, v in tf_vars.items()}
  expected = tree.map_structure(_np, tf_fn(*args))
  expected_vars = {k: tf_vars[k].numpy() for k in tf_vars}
  changed = [k for k in tf_vars if not np.array_equal(before[k], expected_vars[k])]
  for k, v in before.items():        # back to the state the converted function starts from
    tf_vars[k].assign(v)
  checks = ["values"]

  (out, new_params), eager_s = _timed(lambda: jax_fn(params, *args))
  assert_close(out, expected, f"{name}: eager", rtol, exact)
  jitted = jax.jit(lambda p, *a: jax_fn(p, *a))
  (jit_out, jit_params), _ = _timed(jitted, params, *args)
  assert_close(jit_out, expected, f"{name}: jit", rtol, exact)
  checks.append("jit")
  if variables_changed:
    assert changed, f"{name}: TF assigned no variable"
    for k in changed:
      assert_close(new_params[k], expected_vars[k], f"{name}: variable {k} (eager)", rtol, atol=variables_atol)
      assert_close(jit_params[k], expected_vars[k], f"{name}: variable {k} (jit)", rtol, atol=variables_atol)
    checks.append("state")
  if exact:
    checks.append("exact")
  if grad:
    _check_grad(name, tf_fn, jax_fn, params, args, grad_rtol or rtol)
    checks.append("grad")

  tf_s = _best_of(tf_fn, *args)
  for k, v in before.items():
    tf_vars[k].assign(v)
  TIMINGS[name] = dict(library=library, checks="+".join(checks), convert_s=convert_s, eager_s=eager_s,
                       tf_s=tf_s, jit_s=_best_of(jitted, params, *args))
  return jax_fn, params


def check_eager_program(name: str, library: str, fn, *args, grad=True, rtol=RTOL, grad_rtol=None):
  """For programs whose shapes depend on input values (`tf.where` counts, `tf.range` of a reduced mask):
  outputs and gradients of the converted `fn(*args)` match TF without jit, and under `jax.jit` the
  converter raises `DynamicShapeError` naming the node and the way out. Returns (jax_fn, params, error)."""
  tf_fn = tf.function(fn)
  (jax_fn, params), convert_s = _timed(lambda: jaxport.convert(tf_fn, *args))
  expected = tree.map_structure(_np, tf_fn(*args))
  (out, _), eager_s = _timed(lambda: jax_fn(params, *args))
  assert_close(out, expected, f"{name}: eager", rtol)
  checks = ["values"]
  if grad:
    _check_grad(name, tf_fn, jax_fn, params, args, grad_rtol or rtol, jit=False)
    checks.append("grad")
  try:
    jax.jit(jax_fn)(params, *args)
  except DynamicShapeError as e:
    error = e
  else:
    raise AssertionError(f"{name}: jax.jit ran; use check_program")
  assert error.node and f"{error.op} node {error.node!r}" in str(error), str(error)
  assert "without jax.jit" in str(error), str(error)
  checks.append("jit raises")
  tf_args = [tf.constant(a) for a in args]
  TIMINGS[name] = dict(library=library, checks="+".join(checks), convert_s=convert_s, eager_s=eager_s,
                       tf_s=_best_of(tf_fn, *args), tf_eager_s=_best_of(fn, *tf_args),
                       jit=f"{type(error).__name__} at {error.op} {error.node}")
  return jax_fn, params, error


def _check_grad(name, tf_fn, jax_fn, params, args, rtol, jit=True):
  trainable = [k for k in params if jax_fn.trainable[k] and _is_float(params[k])]
  float_idx = [i for i, a in enumerate(args) if _is_float(a)]
  expected = jax_fn(params, *args)[0]   # only its structure and shapes: a TF call could assign variables
  rng = np.random.RandomState(1)
  weights = [rng.normal(size=np.shape(_np(t))).astype(np.float32) if _is_float(t) else None
             for t in tree.flatten(expected)]
  assert trainable or float_idx, f"{name}: nothing to differentiate"

  def loss(trained, floats):
    full = list(args)
    for i, f in zip(float_idx, floats):
      full[i] = f
    out = jax_fn({**params, **trained}, *full)[0]
    return sum(jnp.vdot(jnp.asarray(o, jnp.float32), w) for o, w in zip(tree.flatten(out), weights)
               if w is not None)

  grad_fn = jax.grad(loss, argnums=(0, 1))
  grads = (jax.jit(grad_fn) if jit else grad_fn)({k: params[k] for k in trainable},
                                                 [jnp.asarray(args[i]) for i in float_idx])
  tf_args = [tf.constant(a) for a in args]
  for k, v in jax_fn.tf_variables.items():
    v.assign(params[k])
  with tf.GradientTape() as tape:
    for i in float_idx:
      tape.watch(tf_args[i])
    out = tf_fn(*tf_args)
    tf_loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32) * w)
                        for o, w in zip(tree.flatten(out), weights) if w is not None])
  sources = [jax_fn.tf_variables[k] for k in trainable] + [tf_args[i] for i in float_idx]
  tf_grads = tape.gradient(tf_loss, sources)
  for k, v in jax_fn.tf_variables.items():   # the tape's call may have assigned variables
    v.assign(params[k])
  actual = [grads[0][k] for k in trainable] + list(grads[1])
  labels = trainable + [f"arg {i}" for i in float_idx]
  expected_grads = [np.zeros(np.shape(a), np.float32) if g is None else tf.convert_to_tensor(g).numpy()
                    for a, g in zip(actual, tf_grads)]
  floor = rtol * _magnitude(expected_grads)
  for label, a, e in zip(labels, actual, expected_grads):
    np.testing.assert_allclose(np.asarray(a, np.float64), e.astype(np.float64), rtol=rtol, atol=floor,
                               err_msg=f"{name}: d/d{label}")
