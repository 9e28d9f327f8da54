"""While loops that TF rewrote for a gradient, and loops whose shapes change per step (issue 22).

Once a tf.function holding a `tf.while_loop` has been differentiated, while_v2 rewrites the
forward While in place: TensorList accumulators (EmptyTensorList in, TensorListPushBack per
step) carry intermediates for the gradient. The converter drops them (nothing it returns reads
them). Loops whose carries change shape, or that slice with a loop counter, run step by step.
"""
import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import DynamicLoopError
from oracle import assert_close, check

X = np.random.RandomState(0).normal(size=(3, 4)).astype(np.float32)
SEQ = np.random.RandomState(1).normal(size=(2, 5, 3)).astype(np.float32)


def _graph_ops(tf_fn, *args):
  graph_def = tf_fn.get_concrete_function(*args).graph.as_graph_def()
  ops = {n.op for n in graph_def.node}
  for f in graph_def.library.function:
    ops |= {n.op for n in f.node_def}
  return ops


def _differentiated(tf_fn, x, variables):
  """Calls `tf_fn` under a tape and takes the gradient (which rewrites its forward While);
  returns the TF gradients of sum(output * weights) w.r.t. `x` and `variables`, and the weights."""
  x = tf.constant(x)
  weights = np.random.RandomState(2).normal(size=tf_fn(x).shape).astype(np.float32)
  with tf.GradientTape() as tape:
    tape.watch(x)
    loss = tf.reduce_sum(tf_fn(x) * weights)
  grads = tape.gradient(loss, [x] + list(variables))
  assert {"TensorListPushBack", "EmptyTensorList"} <= _graph_ops(tf_fn, x), "TF did not add accumulators"
  return [np.asarray(g) for g in grads], weights


def _check_after_gradient(tf_fn, x, variables, while_in_jaxpr="scan", atol=1e-5):
  """Converts `tf_fn` after a gradient: values eager and jit, and jit(grad) against the tape."""
  expected_grads, weights = _differentiated(tf_fn, x, variables)
  jax_fn, params = jaxport.convert(tf_fn, x)
  expected = tf_fn(x).numpy()
  assert_close(jax_fn(params, x)[0], expected, atol, atol, "eager")
  assert_close(jax.jit(jax_fn)(params, x)[0], expected, atol, atol, "jit")
  jaxpr = str(jax.make_jaxpr(lambda p, a: jax_fn(p, a)[0])(params, x))
  assert while_in_jaxpr in jaxpr   # one lax loop, not unrolled
  names = [getattr(v, "path", None) or v.name.split(":")[0] for v in variables]   # Keras 3: `path`
  assert sorted(params) == sorted(names)
  loss = lambda a, p: jnp.sum(jax_fn(p, a)[0] * weights)
  gx, gp = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), params)
  np.testing.assert_allclose(gx, expected_grads[0], atol=1e-4, rtol=1e-4)
  for name, g in zip(names, expected_grads[1:]):
    np.testing.assert_allclose(gp[name], g, atol=1e-4, rtol=1e-4, err_msg=name)
  return jax_fn, params


def test_while_loop_differentiated_before_conversion():
  v = tf.Variable(1.5, name="v")

  @tf.function
  def f(x):
    return tf.while_loop(lambda i, a: i < 5, lambda i, a: (i + 1, tf.sin(a * v)), (0, x))[1]
  _check_after_gradient(f, np.array([0.3, 0.7], np.float32), [v])


def test_while_loop_with_a_traced_bound_differentiated_before_conversion():
  @tf.function
  def f(x, n):
    return tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, tf.sin(a) * 1.1), (0, x))[1]
  n = tf.constant(4)
  with tf.GradientTape() as tape:
    x = tf.constant(X)
    tape.watch(x)
    y = f(x, n)
  tape.gradient(y, x)
  assert "TensorListPushBack" in _graph_ops(f, X, n)
  jax_fn, params = jaxport.convert(f, X, n)
  assert_close(jax.jit(jax_fn)(params, X, np.int32(4))[0], y, 1e-5, 1e-5, "jit")   # a lax.while_loop


def test_tf_scan_differentiated_before_conversion():
  w = tf.Variable(0.7, name="w")

  @tf.function
  def f(x):
    return tf.scan(lambda a, e: tf.tanh(a * w + e), tf.transpose(x, [1, 0, 2]), initializer=tf.zeros([2, 3]))
  _check_after_gradient(f, SEQ, [w])


def test_keras_lstm_differentiated_before_conversion():
  model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4, unroll=False), keras.layers.Dense(1)])

  @tf.function
  def f(x):
    return model(x)
  _check_after_gradient(f, SEQ, model.trainable_variables, atol=1e-5)


def test_nested_function_differentiated_before_conversion():
  v = tf.Variable(0.9, name="v")

  @tf.function
  def inner(x):
    return tf.while_loop(lambda i, a: i < 4, lambda i, a: (i + 1, tf.cos(a) * v), (0, x))[1]

  @tf.function
  def f(x):
    return inner(x) * 2.0
  _check_after_gradient(f, X, [v])


# --------------------------------------------------------------------------- shapes from a loop counter


def prefix_sums(x):
  return tf.while_loop(lambda i, acc: i < 4, lambda i, acc: (i + 1, acc + tf.reduce_sum(x[:, : i + 1])),
                       (0, 0.0))[1]


def growing_concat(x):
  return tf.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, tf.concat([acc, x[:, i:i + 1] * 2.0], 1)),
                       (0, x[:, :1]), shape_invariants=(tf.TensorShape([]), tf.TensorShape([3, None])))[1]


def pushed_back(x):
  """A TensorList that grows by one element per step and is read after the loop."""
  empty = tf.raw_ops.EmptyTensorList(element_shape=tf.constant([4]), max_num_elements=-1, element_dtype=tf.float32)
  push = lambda i, lst: (i + 1, tf.raw_ops.TensorListPushBack(input_handle=lst, tensor=tf.sin(x[i]) * 2.0))
  _, lst = tf.while_loop(lambda i, lst: i < 3, push, (0, empty))
  return tf.raw_ops.TensorListStack(input_handle=lst, element_dtype=tf.float32, element_shape=[4])


@pytest.mark.parametrize("fn", [prefix_sums, growing_concat, pushed_back])
def test_loop_counter_shapes_with_a_static_trip_count(fn):
  check(fn, X)   # eager, jit (unrolled), jit(grad) against GradientTape, vmap


def bounded_prefix_sums(x, n):
  return tf.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, acc + tf.reduce_sum(x[:, : i + 1])),
                       (0, 0.0))[1]


def test_loop_counter_shapes_with_a_traced_trip_count_run_eagerly():
  n = np.int32(3)
  check(bounded_prefix_sums, X, n, jit=False, vmap=False)
  jax_fn, params = jaxport.convert(bounded_prefix_sums, X, n)
  with pytest.raises(DynamicLoopError, match=r"While node .*without jax.jit.*bound a constant"):
    jax.jit(jax_fn)(params, X, n)


def test_errors_unrelated_to_shapes_are_not_hidden():
  def fn(x, n):
    return tf.while_loop(lambda i, a: i < n, lambda i, a: (i + 1, a + tf.random.normal([4])), (0, x))[1]
  jax_fn, params = jaxport.convert(fn, X[0], np.int32(2))
  with pytest.raises(jaxport.errors.MissingInputError, match="PRNG key"):
    jax.jit(jax_fn)(params, X[0], np.int32(2))


# --------------------------------------------------------------------------- gradients inside the function


def loop_and_its_gradient(x):
  """The loop and its gradient in one function: the gradient While pops what the forward pushed, and
  the variable's gradient is shaped by `VariableShape`."""
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.while_loop(lambda i, s: i < 4, lambda i, s: (i + 1, tf.sin(x * LOOP_SCALE + s)), (0, tf.zeros_like(x)))[1]
    loss = tf.reduce_sum(y * y)
  return (loss, *tape.gradient(loss, [x, LOOP_SCALE]))


LOOP_SCALE = tf.Variable(0.7, name="loop_scale")


def test_a_loop_differentiated_inside_the_function():
  assert {"VariableShape", "TensorListPopBack"} <= _graph_ops(tf.function(loop_and_its_gradient), X)
  check(loop_and_its_gradient, X)   # eager, jit, second-order grad against GradientTape, vmap


def test_a_loop_differentiated_inside_the_function_with_a_traced_trip_count():
  def fn(x, n):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.while_loop(lambda i, s: i < n, lambda i, s: (i + 1, tf.sin(x + s)), (0, tf.zeros_like(x)))[1]
      loss = tf.reduce_sum(y)
    return tape.gradient(loss, x)
  check(fn, X, np.int32(3), jit=False, vmap=False)   # the accumulators grow step by step: eager only
  jax_fn, params = jaxport.convert(fn, X, np.int32(3))
  with pytest.raises(DynamicLoopError, match=r"While node .*without jax.jit"):
    jax.jit(jax_fn)(params, X, np.int32(3))


def _single(layer):
  return keras.Sequential([keras.Input((5, 3)), getattr(keras.layers, layer)(4), keras.layers.Dense(1)]), \
      keras.optimizers.Adam(0.01)


def _stacked_keras3():
  """Masked steps, a bidirectional LSTM feeding a GRU: the second layer's loop gradient needs the
  first's sequence (TensorListGetItem's gradient, sized by a length the forward loop pushed), and the
  bidirectional layer's gradients meet in an AddN of lists."""
  return keras.Sequential([keras.Input((5, 3)), keras.layers.Masking(0.0),
                           keras.layers.Bidirectional(keras.layers.LSTM(4, return_sequences=True)),
                           keras.layers.GRU(3), keras.layers.Dense(1)]), keras.optimizers.Adam(0.01)


def _stacked_tf_keras():
  import tf_keras
  layers = tf_keras.layers
  return tf_keras.Sequential([layers.Bidirectional(layers.LSTM(4, return_sequences=True), input_shape=(5, 3)),
                              layers.SimpleRNN(3), layers.Dense(1)]), tf_keras.optimizers.Adam(0.01)


RECURRENT_MODELS = {"LSTM": lambda: _single("LSTM"), "GRU": lambda: _single("GRU"),
                    "SimpleRNN": lambda: _single("SimpleRNN"), "stacked_keras3": _stacked_keras3,
                    "stacked_tf_keras": _stacked_tf_keras}


@pytest.mark.parametrize("name", RECURRENT_MODELS)
def test_keras_recurrent_training_steps(name):
  """A recurrent model's training step (forward, tape, optimizer in one tf.function): the gradient
  While reads the forward While's accumulators (and ZerosLike of a TensorList starts them)."""
  from oracle import check_train_steps
  keras.utils.set_random_seed(0)
  tf.random.set_seed(0)
  model, optimizer = RECURRENT_MODELS[name]()
  x = SEQ.copy()
  x[1, 3:] = 0.0   # masked steps, where the model masks
  y = np.random.RandomState(3).normal(size=(2, 1)).astype(np.float32)
  check_train_steps(model, optimizer, x, y)


def test_lists_add_element_wise_and_constants_pushed_stay_constants():
  """AddN of TensorLists against TF's (an unwritten list adds nothing); pushing a NumPy constant onto
  a constant list keeps it NumPy, so a gradient loop can pop a size it needs at trace time."""
  from jaxport.convert.ops.tensor_list import TensorList
  from oracle import run_rule
  a, b = X[:2], X[1:3] * 2.0
  lists = [tf.raw_ops.TensorListFromTensor(tensor=v, element_shape=[4]) for v in (a, b)]
  expected = tf.raw_ops.TensorListStack(input_handle=tf.raw_ops.AddN(inputs=lists), element_dtype=tf.float32,
                                        element_shape=[4])
  ours = [TensorList(v, np.float32, (4,)) for v in (a, b)]
  total = run_rule("AddN", *ours, TensorList(None, np.float32, (4,), 2))
  np.testing.assert_allclose(total.items, expected.numpy(), rtol=1e-6)
  with pytest.raises(jaxport.errors.InvalidNodeError, match="sizes"):
    run_rule("AddN", ours[0], TensorList(X[:3], np.float32, (4,)))
  pushed = run_rule("TensorListPushBack", TensorList(None, np.int32, (), 0), np.int32(5))
  assert isinstance(pushed.items, np.ndarray) and pushed.items.tolist() == [5]
  traced = jax.jit(lambda v: run_rule("TensorListPushBack", pushed, v).items)(np.int32(7))
  assert traced.tolist() == [5, 7]
