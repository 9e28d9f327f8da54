"""In-graph gradients of v1 while loops (`tf.gradients` through `tf.compat.v1.while_loop`), against a
TF Session: the forward loop pushes each step's intermediates onto v1 stacks (StackV2/StackPushV2)
and the gradient loop pops them (StackPopV2); both loops carry them here as TensorLists."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import DynamicLoopError
from tf_keras.src.layers.rnn.legacy_cells import GRUCell, LSTMCell   # the tf.compat.v1.nn.rnn_cell cells
from tf1_oracle import check_graph, session_run, v1_graph

V1 = tf.compat.v1
X = np.random.RandomState(0).normal(size=(4, 3)).astype(np.float32)
SEQ = np.random.RandomState(1).normal(size=(2, 5, 3)).astype(np.float32)
STACK_OPS = {"StackV2", "StackPushV2", "StackPopV2"}


def _ops(graph) -> set[str]:
  return {n.op for n in graph.as_graph_def().node}


def test_a_loop_and_its_gradient_in_one_graph():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    z = V1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.sin(v) * v + x), [0, x])[1]
    dz, = tf.gradients(tf.reduce_sum(z * z), x)   # the steps' order matters: x enters each
  assert STACK_OPS <= _ops(g)
  check_graph(g, {x: X}, [z, dz], eager=True)   # the trip count is static: unrolled under jit


def test_a_gradient_loop_with_a_fed_trip_count():
  """Eagerly the loops run step by step, as many as fed (none too); under jit the pushed lists would
  need a size known at trace time, and the error says so."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    n = V1.placeholder(tf.int32, [], name="n")
    w = V1.get_variable("w", initializer=np.float32(0.8), use_resource=False)
    z = V1.while_loop(lambda i, v: i < n, lambda i, v: (i + 1, tf.tanh(v * w) + x), [0, x])[1]
    dx, dw = tf.gradients(tf.reduce_sum(z), [x, w])
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "n"], [z.name, dx.name, dw.name],
                                             variables={"w": np.float32(0.8)})
  for steps in (0, 1, 4):
    expected = session_run(g, [z, dx, dw], {x: X, n: np.int32(steps)})
    got, _ = jax_fn(params, X, np.int32(steps))
    for a, e in zip(got, expected):
      np.testing.assert_allclose(np.asarray(a), e, rtol=1e-5, atol=1e-6)
  with pytest.raises(DynamicLoopError, match=r"While node .*without jax.jit"):
    jax.jit(jax_fn)(params, X, np.int32(4))


def test_map_fn_gradient_pushes_tensor_array_flows():
  """map_fn's gradient pushes the TensorArray flows only to order its steps, and sums its gradient
  array's flows over the steps with an `Add` from a scalar zero."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    z = tf.map_fn(lambda row: tf.reduce_sum(tf.sin(row) * row), x)
    dz, = tf.gradients(tf.reduce_sum(z * z), x)
  assert STACK_OPS <= _ops(g)
  check_graph(g, {x: X}, [z, dz], eager=True)


@pytest.mark.slow
def test_dynamic_rnn_training_steps(tmp_path):
  """A TF1 training graph: an LSTM by dynamic_rnn with ref variables, Adam's minimize, the loss fetched
  after the train op. Three steps, params threaded through, eager, jit and as a loaded artifact, against
  a Session's steps."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [2, 5, 3], name="x")
    y = V1.placeholder(tf.float32, [2, 4], name="y")
    with V1.variable_scope("rnn_model", use_resource=False, initializer=V1.glorot_uniform_initializer(seed=3)):
      outputs, state = V1.nn.dynamic_rnn(LSTMCell(4), x, dtype=tf.float32)
    loss = tf.reduce_mean(tf.square(state.h - y))
    train = V1.train.AdamOptimizer(0.05).minimize(loss)
    with tf.control_dependencies([train]):
      loss_after = tf.identity(loss, name="loss_after")
    variables = V1.global_variables()
  assert STACK_OPS <= _ops(g) and "ApplyAdam" in _ops(g)
  ys = np.random.RandomState(2).normal(size=(2, 4)).astype(np.float32)
  with tf.compat.v1.Session(graph=g) as sess:
    sess.run(V1.global_variables_initializer())
    initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
    losses = [sess.run(loss_after, {x: SEQ, y: ys}) for _ in range(3)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "y"], "loss_after", variables=initial)
  jaxport.export(jax_fn, params, SEQ, ys, path=tmp_path / "step")
  loaded, loaded_params = jaxport.load(tmp_path / "step")
  for run, state in ((jax_fn, params), (jax.jit(jax_fn), params), (jax.jit(loaded), loaded_params)):
    for expected_loss in losses:
      loss_value, state = run(state, SEQ, ys)
      np.testing.assert_allclose(loss_value, expected_loss, rtol=1e-5, atol=1e-6)
    for key, value in final.items():
      np.testing.assert_allclose(state[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.slow
def test_dynamic_rnn_gradient_with_sequence_lengths():
  """A GRU over sequences of lengths 5 and 3 (tf.where masks the steps past each end)."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [2, 5, 3], name="x")
    with V1.variable_scope("gru", use_resource=False, initializer=V1.glorot_uniform_initializer(seed=4)):
      outputs, _ = V1.nn.dynamic_rnn(GRUCell(4), x, sequence_length=[5, 3], dtype=tf.float32)
    loss = tf.reduce_mean(outputs ** 2)
    grads = tf.gradients(loss, [x] + V1.trainable_variables())
  check_graph(g, {x: SEQ}, [loss] + grads)


def _refusal(build, why):
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    dz, = tf.gradients(tf.reduce_sum(build(x)), x)
  with pytest.raises(jaxport.UnsupportedOperationsError, match="StackV2") as error:
    jaxport.convert_graph_def(g.as_graph_def(), ["x"], dz.name)
  note = "".join(error.value.__notes__)
  assert why in note and "jax.grad" in note and "control flow v2" in note


def test_stacks_of_nested_loops_are_refused_before_anything_runs():
  inner = lambda v: V1.while_loop(lambda j, u: j < 2, lambda j, u: (j + 1, tf.sin(u) * u), [0, v])[1]
  _refusal(lambda x: V1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, inner(v)), [0, x])[1],
           "nested in other loops")


@pytest.mark.parametrize("nested", [False, True], ids=["cond", "nested_conds"])
def test_a_loop_with_conds_and_its_gradient(nested):
  """The forward loop pushes a value only in the branch taken; here every step pushes (the cond gives
  zeros on the other side) and the gradient loop pops every step, before its cond, so the steps line up."""
  def branch(i, v):
    inner = lambda: V1.cond(i < 2, lambda: tf.sin(v) * v, lambda: tf.exp(-v) * v)   # noqa: E731
    return V1.cond(tf.equal(i % 2, 0), inner if nested else (lambda: tf.sin(v) * v), lambda: tf.cos(v) * v)

  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    z = V1.while_loop(lambda i, v: i < 5, lambda i, v: (i + 1, branch(i, v)), [0, x])[1]
    dz, = tf.gradients(tf.reduce_sum(z * z), x)
  assert STACK_OPS <= _ops(g)
  check_graph(g, {x: X}, [z, dz], eager=True)


def test_zoneout_cell_trained_with_a_training_placeholder():
  """A TF1 recurrent cell with a `tf.cond` on a `training` placeholder in its step (zoneout), a fed
  number of steps, trained by Adam: the loss after each of three steps and every variable."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [2, 5, 3], name="x")
    n = V1.placeholder(tf.int32, [], name="n")
    training = V1.placeholder_with_default(False, [], name="training")
    w = V1.get_variable("w", initializer=V1.glorot_uniform_initializer(seed=5)([7, 4]), use_resource=False)

    def step(t, h):
      new = tf.tanh(tf.matmul(tf.concat([x[:, t], h], 1), w))
      keep = tf.cast(tf.range(4) % 2 == 0, tf.float32)   # zoneout with a fixed mask
      return t + 1, V1.cond(training, lambda: keep * h + (1 - keep) * new, lambda: 0.5 * h + 0.5 * new)

    h = V1.while_loop(lambda t, h: t < n, step, [0, tf.zeros([2, 4])])[1]
    loss = tf.reduce_mean(tf.square(h - 0.3))
    train = V1.train.AdamOptimizer(0.05).minimize(loss)
    with tf.control_dependencies([train]):
      loss_after = tf.identity(loss, name="loss_after")
    variables = V1.global_variables()
  feeds = {x: SEQ, n: np.int32(5), training: True}
  with tf.compat.v1.Session(graph=g) as sess:
    sess.run(V1.global_variables_initializer())
    initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
    losses = [sess.run(loss_after, feeds) for _ in range(3)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  jax_fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "n", "training"], "loss_after",
                                             variables=initial)
  state = params
  for expected in losses:   # a fed trip count: eagerly (under jit, DynamicLoopError)
    loss_value, state = jax_fn(state, SEQ, np.int32(5), np.bool_(True))
    np.testing.assert_allclose(loss_value, expected, rtol=1e-5, atol=1e-6)
  for key, value in final.items():
    np.testing.assert_allclose(state[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
