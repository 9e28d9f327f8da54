"""TF1 control flow (Switch/Merge/Enter/Exit/NextIteration/LoopCond), v1 TensorArrays and ref
variables, from `tf.compat.v1` graphs built with control flow v1, against a TF Session."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from tf_keras.src.layers.rnn.legacy_cells import LSTMCell   # the tf.compat.v1.nn.rnn_cell cells
from tf_keras.src.legacy_tf_layers.core import dense   # tf.compat.v1.layers
from tf_keras.src.legacy_tf_layers.normalization import batch_normalization
from tf1_oracle import check_graph, session_run, v1_graph

V1 = tf.compat.v1
X = np.random.RandomState(0).normal(size=(4, 3)).astype(np.float32)


def _ops(graph) -> set[str]:
  return {n.op for n in graph.as_graph_def().node}


@pytest.mark.slow
def test_cond_case_and_nested_conds():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    k = V1.placeholder(tf.int32, [], name="k")
    y = V1.cond(tf.reduce_sum(x) > 0, lambda: tf.sin(x) * 2.0, lambda: tf.cos(x) + 1.0)
    nested = V1.cond(x[0, 0] > 0,
                     lambda: V1.cond(x[1, 0] > 0, lambda: y * 3.0, lambda: y - x),
                     lambda: tf.constant(7.0) + y)
    case = V1.case([(tf.equal(k, 0), lambda: x * 2.0), (tf.equal(k, 1), lambda: tf.exp(x))],
                   default=lambda: -x, exclusive=True)
  assert {"Switch", "Merge"} <= _ops(g)
  check_graph(g, {x: X, k: np.int32(1)}, [y, nested, case], grad=True, eager=True)
  check_graph(g, {x: -X, k: np.int32(5)}, [y, nested, case], grad=True)   # the other branches


def test_dead_branch_never_runs():
  """The branch not taken would fail its assert; lax.cond must not evaluate it."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")

    def failing():
      with tf.control_dependencies([V1.assert_less(tf.reduce_sum(x), -1e9)]):
        return tf.identity(x)
    y = V1.cond(tf.reduce_sum(tf.abs(x)) > 0, lambda: x * 2.0, failing)
  fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x"], y.name)
  np.testing.assert_allclose(fn(params, X)[0], X * 2.0)


@pytest.mark.slow
def test_while_loops_nested_with_tensor_arrays_and_conds():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    i, acc = V1.while_loop(lambda i, a: i < 5, lambda i, a: (i + 1, a * 1.1 + tf.reduce_sum(x, 0)),
                           [tf.constant(0), tf.zeros([3])])
    ta = tf.TensorArray(tf.float32, size=4)

    def body(t, ta, s):
      inner = V1.while_loop(lambda j, r: j < 3, lambda j, r: (j + 1, tf.sin(r) * 0.5 + x[t]), [0, x[t]])[1]
      return t + 1, ta.write(t, V1.cond(s > 0, lambda: inner * s, lambda: -inner)), s + 1.0
    _, ta_out, _ = V1.while_loop(lambda t, ta, s: t < 4, body, [0, ta, -1.5])
    stacked = ta_out.stack()
  ops = _ops(g)
  assert {"Enter", "Exit", "NextIteration", "LoopCond", "TensorArrayV3", "TensorArrayWriteV3"} <= ops
  check_graph(g, {x: X}, [acc, stacked], grad=True)


def test_while_with_data_dependent_trip_count():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    n = V1.placeholder(tf.int32, [], name="n")
    doubled = V1.while_loop(lambda k, v: k < n, lambda k, v: (k + 1, v * 2.0), [0, x])[1]
    # stops when the values pass a threshold: the trip count depends on x
    steps, grown = V1.while_loop(lambda k, v: tf.reduce_max(v) < 50.0, lambda k, v: (k + 1, v * 1.5 + 1.0),
                                 [0, tf.abs(x)])
  for nv in (0, 3):
    check_graph(g, {x: X, n: np.int32(nv)}, [doubled, grown, steps])


def test_in_graph_gradients_of_conds_convert():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    y = V1.cond(tf.reduce_sum(x) > 0, lambda: tf.sin(x) * x, lambda: tf.cos(x))
    dy, = tf.gradients(tf.reduce_sum(y), x)   # a v1 cond again (loops: test_tf1_loop_gradients.py)
  check_graph(g, {x: X}, [dy])


def test_tensor_array_ops_and_their_gradients():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    ta = tf.TensorArray(tf.float32, size=4, element_shape=[3]).unstack(x)           # ScatterV3
    read = ta.read(2) * ta.read(0)                                                  # ReadV3
    gathered = ta.gather([3, 1])                                                    # GatherV3
    split = tf.TensorArray(tf.float32, size=2).split(tf.reshape(x, [12]), [6, 6])   # SplitV3
    concat = split.concat()                                                         # ConcatV3
    size = tf.cast(ta.size(), tf.float32)                                           # SizeV3
    grown = tf.TensorArray(tf.float32, size=0, dynamic_size=True).write(0, x[0]).write(2, x[1]).stack()
    loss = tf.reduce_sum(read) + tf.reduce_sum(gathered * 2.0) + tf.reduce_sum(concat ** 2)
    dx, = tf.gradients(loss, x)   # TensorArrayGradV3; the flows of its writes meet in _TensorArrayFlowAddN
    with tf.control_dependencies([tf.TensorArray(tf.float32, size=1).close()]):   # CloseV3
      grown = tf.identity(grown)
  ops = _ops(g)
  assert {"TensorArrayScatterV3", "TensorArrayReadV3", "TensorArrayGatherV3", "TensorArraySplitV3",
          "TensorArrayConcatV3", "TensorArraySizeV3", "TensorArrayGradV3", "TensorArrayCloseV3"} <= ops
  check_graph(g, {x: X}, [read, gathered, concat, size, grown, dx])   # dx is the gradient


@pytest.mark.slow
def test_dynamic_rnn_with_an_lstm_cell():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [2, 5, 3], name="x")
    cell = LSTMCell(4)
    outputs, state = V1.nn.dynamic_rnn(cell, x, dtype=tf.float32)
  assert {"LoopCond", "TensorArrayReadV3"} <= _ops(g)
  xs = np.random.RandomState(1).normal(size=(2, 5, 3)).astype(np.float32)
  check_graph(g, {x: xs}, [outputs, state.c, state.h], grad=True)


def test_ref_variables_assign_in_conds_and_loops():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [4, 3], name="x")
    with V1.variable_scope("m", use_resource=False):
      w = V1.get_variable("w", initializer=np.full((3,), 0.5, np.float32))
      count = V1.get_variable("count", initializer=np.float32(0.0))
      table = V1.get_variable("table", initializer=np.arange(12, dtype=np.float32).reshape(4, 3))
    y = tf.matmul(x, tf.reshape(w, [3, 1]))                                       # Identity on a ref
    bump = V1.cond(tf.reduce_sum(x) > 0, lambda: V1.assign_add(count, 1.0),        # RefSwitch
                   lambda: V1.assign_sub(count, 2.0))
    with tf.control_dependencies([bump]):
      scattered = V1.scatter_add(table, [0, 2], x[:2])
      loop = V1.while_loop(lambda i: i < 3, lambda i: i + 1, [0])
    # y reads the ref w: ordered before the assign, or TF's executor may read either value.
    with tf.control_dependencies([scattered, loop, y]):
      assigned = V1.assign(w, w * 2.0 + 1.0)
      out = tf.identity(y, name="out")
  assert {"VariableV2", "Assign", "AssignAdd", "ScatterAdd", "RefSwitch"} <= _ops(g)
  with g.as_default():
    fetched = session_run(g, [out, assigned, w, count, table], {x: X})
  fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x"], [out.name, assigned.name])
  assert set(params) == {"m/w", "m/count", "m/table"}   # from the constant initializers
  outs, new = fn(params, X)
  np.testing.assert_allclose(outs[0], fetched[0], rtol=1e-6)
  np.testing.assert_allclose(outs[1], fetched[1], rtol=1e-6)
  for key, value in zip(["m/w", "m/count", "m/table"], fetched[2:]):
    np.testing.assert_allclose(new[key], value, rtol=1e-6)


@pytest.mark.slow
def test_batch_norm_training_step():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [8, 3], name="x")
    labels = V1.placeholder(tf.float32, [8, 2], name="labels")
    with V1.variable_scope("net", use_resource=False):
      h = dense(x, 4, kernel_initializer=V1.constant_initializer(np.linspace(-1, 1, 12).reshape(3, 4)))
      h = batch_normalization(h, training=True, fused=False)
      logits = dense(tf.nn.relu(h), 2, kernel_initializer=V1.constant_initializer(0.3))
    loss = tf.reduce_mean(tf.square(logits - labels))
    with tf.control_dependencies(V1.get_collection(V1.GraphKeys.UPDATE_OPS)):
      train = V1.train.GradientDescentOptimizer(0.1).minimize(loss)
    with tf.control_dependencies([train]):
      loss_out = tf.identity(loss, name="loss_out")
    variables = V1.global_variables()
  xs = np.random.RandomState(2).normal(size=(8, 3)).astype(np.float32)
  ys = np.random.RandomState(3).normal(size=(8, 2)).astype(np.float32)
  with tf.compat.v1.Session(graph=g) as sess:
    sess.run(V1.global_variables_initializer())
    expected_loss = sess.run(loss_out, {x: xs, labels: ys})
    expected_vars = dict(zip([v.op.name for v in variables], sess.run(variables)))
  assert {"ApplyGradientDescent", "AssignSub"} <= _ops(g)
  fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x", "labels"], "loss_out")
  step, _ = jaxport.convert_graph_def(g.as_graph_def(), ["x", "labels"], [loss.name, "^" + train.name])
  got_loss, new = jax.jit(fn)(params, xs, ys)
  (step_loss,), step_new = jax.jit(step)(params, xs, ys)   # "^train": the train op runs, loss comes back
  for loss_value, new_params in ((got_loss, new), (step_loss, step_new)):
    np.testing.assert_allclose(loss_value, expected_loss, rtol=1e-5, atol=1e-6)
    for key, value in expected_vars.items():
      np.testing.assert_allclose(new_params[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_v1_control_flow_ops_are_registered_and_rewritten_before_they_run():
  # The v1 pass (convert/v1_control_flow.py) turns them into While/If; a node it missed fails loudly.
  from jaxport import config
  from jaxport.convert import registry, tiers
  from jaxport.convert.registry import Tier
  from jaxport.convert.v1_control_flow import V1ControlFlowError
  from oracle import run_rule
  for op in ("Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
             "NextIteration", "RefNextIteration", "LoopCond", "StackV2", "StackPushV2", "StackPopV2", "StackCloseV2"):
    assert registry.get_rule(op).structural and tiers.op_tier(op, config.snapshot()) == Tier.NATIVE
    with pytest.raises(V1ControlFlowError, match=op):
      run_rule(op, np.float32(1))
