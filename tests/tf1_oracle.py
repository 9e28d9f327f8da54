"""TF as the oracle for TF1 graphs: build a `tf.compat.v1` graph, run it in a Session, compare.

`v1_graph()` builds with control flow v1 (a process-wide TF switch, restored on exit).
`check_graph(graph, feeds, outputs)` converts the graph with `convert_graph_def`, compares
its outputs under jit (and eagerly with `eager=True`) with the Session's, and (with `grad=True`) compares
`jax.grad` of a random projection of the outputs with `tf.gradients` of the same, with
respect to the float feeds and the graph's variables.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import tensorflow as tf

import jaxport


@contextlib.contextmanager
def v1_control_flow():
  """Builds with v1 control flow (a process-wide TF switch) inside, restored on exit."""
  was_v2 = tf.compat.v1.control_flow_v2_enabled()
  tf.compat.v1.disable_control_flow_v2()
  try:
    yield
  finally:
    if was_v2:
      tf.compat.v1.enable_control_flow_v2()


@contextlib.contextmanager
def v1_graph():
  """A fresh `tf.Graph` built with v1 control flow."""
  graph = tf.Graph()
  with v1_control_flow(), graph.as_default():
    yield graph


def session_run(graph, fetches, feeds, init=True):
  with tf.compat.v1.Session(graph=graph) as sess:
    if init:
      sess.run(tf.compat.v1.global_variables_initializer())
    return sess.run(fetches, feeds)


def variable_values(graph) -> dict:
  """The initialized values of the graph's variables, keyed as jaxport keys them."""
  with graph.as_default():
    variables = tf.compat.v1.global_variables()
  values = session_run(graph, variables, {})
  return {v.op.name: np.asarray(x) for v, x in zip(variables, values)}


def check_graph(graph, feeds: dict, outputs: list, *, grad=False, eager=False, atol=1e-5, rtol=1e-5,
                grad_atol=1e-4):
  """Converts `graph` from the placeholders in `feeds` to `outputs` and checks it against TF
  (under jit; also eagerly with `eager=True`: each loop then compiles on its own, which is slow)."""
  with v1_control_flow(), graph.as_default():
    variables = tf.compat.v1.global_variables()
    floats = [o for o in outputs if o.dtype == tf.float32]
    weight_feeds = [tf.compat.v1.placeholder(tf.float32) for _ in floats]
    loss = tf.add_n([tf.reduce_sum(o * w) for o, w in zip(floats, weight_feeds)])
    float_feeds = [t for t in feeds if t.dtype == tf.float32]
    grads = tf.gradients(loss, float_feeds + variables) if grad else []
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      var_values = sess.run(variables)
      expected = sess.run(list(outputs), feeds)
      weights = [np.random.RandomState(i).normal(size=np.shape(e)).astype(np.float32)
                 for i, (o, e) in enumerate(zip(outputs, expected)) if o.dtype == tf.float32]
      expected_grads = sess.run(grads, {**feeds, **dict(zip(weight_feeds, weights))}) if grad else []
  params = {v.op.name: x for v, x in zip(variables, var_values)}
  names = list(feeds)
  jax_fn, converted = jaxport.convert_graph_def(graph.as_graph_def(), [t.name for t in names],
                                                [o.name for o in outputs], variables=params)
  args = [feeds[t] for t in names]
  for call in ((jax_fn, jax.jit(jax_fn)) if eager else (jax.jit(jax_fn),)):
    got, _ = call(converted, *args)
    for a, e in zip(got, expected):
      np.testing.assert_allclose(np.asarray(a), e, atol=atol, rtol=rtol)
  if grad:
    keys = [v.op.name for v in variables]
    float_idx = [i for i, t in enumerate(names) if t.dtype == tf.float32]

    def jax_loss(floats, var_values):
      full = list(args)
      for i, f in zip(float_idx, floats):
        full[i] = f
      outs, _ = jax_fn({**converted, **dict(zip(keys, var_values))}, *full)
      return sum(jnp.sum(o * w) for o, w in zip([o for o in outs if o.dtype == jnp.float32], weights))

    got = jax.jit(jax.grad(jax_loss, argnums=(0, 1)))([args[i] for i in float_idx], [params[k] for k in keys])
    for a, e in zip(list(got[0]) + list(got[1]), expected_grads):
      np.testing.assert_allclose(np.asarray(a), e, atol=grad_atol, rtol=rtol)
  return jax_fn, converted
