"""TF as the oracle: differential checks shared by every converter test.

`check(fn, *args)` converts `fn`, then compares with TF:
  * outputs, without and with `jax.jit`;
  * gradients of a random projection of the outputs w.r.t. float inputs, against
    `tf.GradientTape` (when `grad=True`), under jit unless `jit=False`;
  * `jax.vmap` over a stack of inputs, against TF run per example (when `vmap=True`), under jit.

With `JAXPORT_ORACLE_VIA_ARTIFACT=1` every check runs the converted function after a round trip through
`jaxport.export` and `jaxport.load` (CPU, the example shapes) instead: an audit of the artifact path for
every op test, and for the library corpora's `library_corpus.check_program` (`make audit-artifact`); a
function that cannot be exported skips, with the reason.
"""
from __future__ import annotations

import os
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tree

import jaxport
from jaxport import config
from jaxport.convert.graph import Library, Node
from jaxport.convert.interpreter import OpContext, Runtime
from jaxport.convert.registry import get_rule


def run_rule(op, *inputs, **attrs):
  """Calls one op rule directly, outside any graph, with the default config."""
  runtime = Runtime(Library([]), config.snapshot(), {})
  return get_rule(op)(OpContext(Node("node", op, [], [], attrs), runtime), *inputs)


def _np(x):
  return np.asarray(x.numpy() if hasattr(x, "numpy") else x)


def _is_float(x) -> bool:
  return np.issubdtype(np.asarray(x).dtype, np.floating)


def assert_close(actual, expected, atol, rtol, what=""):
  tree.assert_same_structure(expected, actual, check_types=False)
  for a, e in zip(tree.flatten(actual), tree.flatten(expected)):
    a, e = _np(a), _np(e)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != TF {e.shape}"
    # Without x64, JAX holds TF's 64-bit types in 32 bits.
    assert a.dtype == jax.dtypes.canonicalize_dtype(e.dtype), f"{what}: dtype {a.dtype} != TF {e.dtype}"
    if e.dtype.kind == "c":
      for part in (np.real, np.imag):
        np.testing.assert_allclose(part(a), part(e), atol=atol, rtol=rtol, err_msg=what)
    elif e.dtype.kind == "f" or e.dtype.name == "bfloat16":
      np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), atol=atol, rtol=rtol, err_msg=what)
    else:
      np.testing.assert_array_equal(a, e, err_msg=what)


def check(fn, *args, atol=1e-5, rtol=1e-5, grad=True, vmap=True, jit=True, grad_atol=None, rng=None):
  """Converts `fn` and checks it against TF. Returns the converted function."""
  tf_fn = tf.function(fn)
  expected = tf_fn(*args)
  jax_fn, params = jaxport.convert(fn, *args)
  if VIA_ARTIFACT:
    jax_fn, params = through_artifact(jax_fn, params, args)
  call = lambda *a: jax_fn(params, *a, rng=rng)[0]
  assert_close(call(*args), expected, atol, rtol, "eager")
  if jit:
    assert_close(jax.jit(call)(*args), expected, atol, rtol, "jit")
  float_idx = [i for i, a in enumerate(args) if _is_float(a)]
  if grad and float_idx and any(_is_float(o) for o in tree.flatten(expected)):
    _check_grad(tf_fn, call, args, float_idx, expected, grad_atol or max(atol, 1e-4), rtol, jit=jit)
  if vmap:
    _check_vmap(tf_fn, call, args, atol, rtol)
  return jax_fn


VIA_ARTIFACT = os.environ.get("JAXPORT_ORACLE_VIA_ARTIFACT") == "1"


def check_train_steps(model, optimizer, x, y, steps: int = 3, **call_kwargs):
  """A converted training step (forward, `tf.GradientTape`, `apply_gradients` in a `tf.function`) run
  `steps` times, params threaded through, eagerly and under `jax.jit`, against TF's own steps from the
  same state: the last loss and every variable (slots and counters included)."""
  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((model(x, **call_kwargs) - y) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return loss

  jax_fn, params = jaxport.convert(step, x, y)
  results = {}
  for label, run in (("eager", jax_fn), ("jit", jax.jit(jax_fn))):
    state = params
    for _ in range(steps):
      loss, state = run(state, x, y)
    results[label] = (loss, state)
  expected_losses = [float(step(x, y)) for _ in range(steps)]
  for label, (loss, state) in results.items():
    assert_close(loss, expected_losses[-1], 1e-5, 1e-5, f"{label} loss")
    for key, var in jax_fn.tf_variables.items():
      assert_close(state[key], var.numpy(), 1e-5, 1e-5, f"{label} {key}")


def through_artifact(jax_fn, params, args):
  """The converted function exported and loaded back (see the module docstring); the loaded function
  answers the converted one's other attributes (`tf_variables`, `trainable`) for the TF side of a check."""
  path = tempfile.mkdtemp(prefix="oracle_artifact_")
  try:
    jaxport.export(jax_fn, params, *args, path=path, platforms=("cpu",))
  except jaxport.errors.ArtifactError as e:
    pytest.skip(f"not exportable: {str(e).splitlines()[0][:300]}")
  loaded, loaded_params = jaxport.load(path)
  return _LoadedAsConverted(loaded, jax_fn), loaded_params


class _LoadedAsConverted:
  def __init__(self, loaded, converted):
    self._loaded, self._converted = loaded, converted

  def __call__(self, *args, **kwargs):
    return self._loaded(*args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._converted, name)


def _projection(expected):
  rs = np.random.RandomState(0)
  return [rs.normal(size=np.shape(_np(e))).astype(_np(e).dtype) if _is_float(e) else None
          for e in tree.flatten(expected)]


def _check_grad(tf_fn, call, args, float_idx, expected, atol, rtol, jit=True):
  weights = _projection(expected)

  def tf_loss(*xs):
    outs = tree.flatten(tf_fn(*xs))
    return tf.add_n([tf.reduce_sum(tf.cast(o, tf.float64) * w.astype(np.float64))
                     for o, w in zip(outs, weights) if w is not None])

  tf_args = [tf.constant(a) for a in args]
  with tf.GradientTape() as tape:
    for i in float_idx:
      tape.watch(tf_args[i])
    loss = tf_loss(*tf_args)
  tf_grads = tape.gradient(loss, [tf_args[i] for i in float_idx])
  tf_grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in tf_grads]

  def jax_loss(*floats):
    full = list(args)
    for i, f in zip(float_idx, floats):
      full[i] = f
    outs = tree.flatten(call(*full))
    return sum(jnp.sum(o.astype(jnp.float64 if jax.config.jax_enable_x64 else jnp.float32) * w)
               for o, w in zip(outs, weights) if w is not None)

  floats = [jnp.asarray(args[i]) for i in float_idx]
  # Under jit (the same gradient rules, compiled once instead of op by op), unless the function
  # cannot be jitted (`jit=False`: values that decide shapes must stay concrete).
  grad_fn = jax.grad(jax_loss, argnums=tuple(range(len(floats))))
  jax_grads = (jax.jit(grad_fn) if jit else grad_fn)(*floats)
  for i, g_tf, g_jax in zip(float_idx, tf_grads, jax_grads):
    expected_g = np.zeros_like(_np(args[i])) if g_tf is None else _np(g_tf)
    assert_close(g_jax, expected_g, atol, rtol, f"grad wrt arg {i}")


def _check_vmap(tf_fn, call, args, atol, rtol, batch=3):
  rs = np.random.RandomState(1)

  def perturb(a, k):
    a = np.asarray(a)
    if k == 0:
      return a
    if a.dtype.kind == "f":
      return (a + 0.1 * k * rs.normal(size=a.shape)).astype(a.dtype)
    return a

  stacked = [np.stack([perturb(a, k) for k in range(batch)]) for a in args]
  per_example = [tf_fn(*[s[k] for s in stacked]) for k in range(batch)]
  expected = tree.map_structure(lambda *xs: np.stack([_np(x) for x in xs]), *per_example)
  assert_close(jax.jit(jax.vmap(call))(*stacked), expected, atol, rtol, "vmap")
