"""In-graph gradients of v1 conds (`tf.gradients` through `tf.compat.v1.cond`), against a TF Session.

TF's gradient of a v1 cond is a second cond on the same predicate that starts after the first one's
Merge and reads its branch values directly; here it becomes a second If, and the values it reads are
outputs of the first (the untaken side gives zeros nobody reads). TF1 training graphs hit this with
every `training` placeholder: batch norm and dropout switch on it, and `static_rnn` with sequence
lengths nests two conds per step.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from tf1_oracle import check_graph, session_run, v1_graph
from tf_keras.src.layers.rnn.legacy_cells import LSTMCell   # tf.compat.v1.nn.rnn_cell.LSTMCell
from tf_keras.src.legacy_tf_layers import convolutional, core, normalization   # tf.compat.v1.layers

V1 = tf.compat.v1
X = np.random.RandomState(0).normal(size=(4, 3)).astype(np.float32)


def _cond_graph(nested: bool):
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    p = V1.placeholder(tf.bool, [], name="p")
    q = V1.placeholder(tf.bool, [], name="q")
    inner = lambda: V1.cond(q, lambda: tf.sin(x) * x, lambda: x * 2.0)   # noqa: E731
    y = V1.cond(p, inner if nested else (lambda: tf.sin(x) * x), lambda: tf.cos(x) + x)
    dy, = tf.gradients(tf.reduce_sum(y * y), x)   # the gradient reads y: it runs after the cond
  return g, (x, p, q), (y, dy)


@pytest.mark.parametrize("nested", [False, True], ids=["cond", "nested_conds"])
def test_gradients_that_read_the_conds_output(nested):
  g, (x, p, q), outputs = _cond_graph(nested)
  for pv, qv in itertools.product([True, False], repeat=2):
    check_graph(g, {x: X, p: pv, q: qv}, list(outputs), eager=True)


def test_vmap_over_the_predicate():
  """A batched predicate runs both branches: the stand-ins of the untaken side are selected away."""
  g, (x, p, q), (y, dy) = _cond_graph(nested=True)
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "p", "q"], [y.name, dy.name])
  xs, ps = np.stack([X, -X, X * 0.5]), np.array([True, False, True])
  got = jax.jit(jax.vmap(lambda a, b: jax_fn(params, a, b, np.bool_(False))[0]))(xs, ps)
  for i in range(3):
    expected = session_run(g, [y, dy], {x: xs[i], p: ps[i], q: False}, init=False)
    for a, e in zip(got, expected):
      np.testing.assert_allclose(a[i], e, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_static_rnn_with_sequence_lengths():
  """static_rnn copies state past each sequence's end with two nested conds per step."""
  seq = np.random.RandomState(1).normal(size=(2, 5, 3)).astype(np.float32)
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [2, 5, 3], name="x")
    with V1.variable_scope("rnn", use_resource=False, initializer=V1.glorot_uniform_initializer(seed=4)):
      outputs, _ = V1.nn.static_rnn(LSTMCell(4), tf.unstack(x, axis=1), sequence_length=[5, 3], dtype=tf.float32)
    loss = tf.reduce_mean(tf.stack(outputs, 1) ** 2)
    grads = tf.gradients(loss, [x] + V1.trainable_variables())
  check_graph(g, {x: seq}, [loss] + grads)


def _classifier(fused: bool, dropout: bool):
  """A TF1 training graph as tf.compat.v1.layers code wrote them: conv, batch norm and dropout switched
  by a `training` placeholder, Adam's minimize after UPDATE_OPS, the loss fetched after the step."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 8, 8, 3], name="x")
    y = V1.placeholder(tf.int32, [4], name="y")
    training = V1.placeholder_with_default(False, [], name="training")
    h = convolutional.conv2d(x, 6, 3, use_bias=False, name="conv",
                             kernel_initializer=V1.glorot_uniform_initializer(seed=1))
    h = tf.nn.relu(normalization.batch_normalization(h, training=training, name="bn", fused=fused))
    h = tf.reduce_mean(h, [1, 2])
    if dropout:
      h = core.dropout(h, 0.3, training=training)
    logits = core.dense(h, 5, name="head", kernel_initializer=V1.glorot_uniform_initializer(seed=2))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    with tf.control_dependencies(V1.get_collection(V1.GraphKeys.UPDATE_OPS)):
      train = V1.train.AdamOptimizer(0.01).minimize(loss)
    with tf.control_dependencies([train]):
      loss_after = tf.identity(loss, name="loss_after")
    variables = V1.global_variables()
  return g, (x, y, training), loss, loss_after, variables


IMAGES = np.random.RandomState(2).normal(size=(4, 8, 8, 3)).astype(np.float32)
LABELS = np.random.RandomState(3).randint(0, 5, size=(4,)).astype(np.int32)


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["fused_bn", "bn"])
def test_batch_norm_training_steps(fused, tmp_path):
  g, (x, y, training), loss, loss_after, variables = _classifier(fused, dropout=False)
  with V1.Session(graph=g) as sess:
    sess.run(V1.global_variables_initializer())
    initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
    eval_loss = sess.run(loss, {x: IMAGES, y: LABELS})
    losses = [sess.run(loss_after, {x: IMAGES, y: LABELS, training: True}) for _ in range(3)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "y", "training"], "loss_after",
                                             variables=initial)
  rng = jax.random.key(0)   # the variables' initializers are random ops of the graph
  jaxport.export(jax_fn, params, IMAGES, LABELS, np.bool_(True), path=tmp_path, platforms=("cpu",))
  loaded, _ = jaxport.load(tmp_path)
  for run in (jax_fn, jax.jit(jax_fn), loaded):
    state = params
    for expected in losses:
      got, state = run(state, IMAGES, LABELS, np.bool_(True), rng=rng)
      np.testing.assert_allclose(got, expected, rtol=1e-5)
    for key, value in final.items():   # moving statistics and Adam's slots included
      np.testing.assert_allclose(state[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
  eval_fn, eval_params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "y", "training"], loss.name,
                                                   variables=initial)
  np.testing.assert_allclose(eval_fn(eval_params, IMAGES, LABELS, np.bool_(False), rng=rng)[0], eval_loss,
                             rtol=1e-5)


@pytest.mark.slow
def test_dropout_gradient_uses_the_forward_mask():
  """TF's mask cannot be replayed, so the check is internal: TF's in-graph gradient, converted, equals
  jax.grad of the converted loss under the same key (a mask drawn again would differ)."""
  g, (x, y, training), loss, _, variables = _classifier(fused=True, dropout=True)
  with g.as_default():
    dx, = tf.gradients(loss, x)
  initial = {v.op.name: value for v, value in zip(variables, session_run(g, variables, {}))}
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "y", "training"], [loss.name, dx.name],
                                             variables=initial)
  for k in range(3):
    rng = jax.random.key(k)
    loss_of = lambda images: jax_fn(params, images, LABELS, np.bool_(True), rng=rng)[0][0]   # noqa: E731
    value, in_graph = jax.jit(lambda images: jax_fn(params, images, LABELS, np.bool_(True), rng=rng)[0])(IMAGES)
    np.testing.assert_allclose(value, loss_of(IMAGES), rtol=1e-6)
    np.testing.assert_allclose(in_graph, jax.jit(jax.grad(loss_of))(IMAGES), rtol=1e-5, atol=1e-7)
    assert float(jnp.max(jnp.abs(in_graph))) > 0
