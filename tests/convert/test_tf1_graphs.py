"""TF1 graphs from files and SavedModels: frozen GraphDefs (.pb/.pbtxt), plain GraphDefs with
variables, TF1 SavedModels (simple_save, Builder) and the TF1 Hub format, against a TF Session."""
import numpy as np
import pytest
import tensorflow as tf

import jax
import jaxport
from tf_keras.src.layers.rnn.legacy_cells import GRUCell   # the tf.compat.v1.nn.rnn_cell cells
from tf_keras.src.legacy_tf_layers.convolutional import conv2d   # tf.compat.v1.layers
from tf_keras.src.legacy_tf_layers.core import dense
from tf_keras.src.legacy_tf_layers.pooling import max_pooling2d
from tf1_oracle import session_run, v1_graph

V1 = tf.compat.v1
IMAGES = np.random.RandomState(0).normal(size=(2, 8, 8, 3)).astype(np.float32)
SEQ = np.random.RandomState(1).normal(size=(2, 6, 3)).astype(np.float32)


def _frozen(graph, outputs):
  """The graph with its variables folded into constants (what a frozen .pb holds)."""
  with graph.as_default(), V1.Session(graph=graph) as sess:
    sess.run(V1.global_variables_initializer())
    return V1.graph_util.convert_variables_to_constants(sess, graph.as_graph_def(), outputs)


def _assert_close(got, expected, tol=1e-5):
  for a, e in zip(got, expected):
    np.testing.assert_allclose(np.asarray(a), e, atol=tol, rtol=tol)


def test_frozen_cnn_from_pb_and_pbtxt(tmp_path):
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [None, 8, 8, 3], name="images")
    h = conv2d(x, 4, 3, padding="same", activation=tf.nn.relu)
    h = max_pooling2d(h, 2, 2)
    logits = dense(tf.reshape(h, [-1, 4 * 4 * 4]), 5)
    tf.nn.softmax(logits, name="probs")
  frozen = _frozen(g, ["probs"])
  assert not {"VariableV2", "VarHandleOp"} & {n.op for n in frozen.node}
  expected = session_run(g, "probs:0", {"images:0": IMAGES})
  tf.io.write_graph(frozen, str(tmp_path), "cnn.pb", as_text=False)
  tf.io.write_graph(frozen, str(tmp_path), "cnn.pbtxt", as_text=True)
  for name in ("cnn.pb", "cnn.pbtxt"):
    fn = jaxport.convert_functional_graph_def(tmp_path / name, ["images:0"], "probs:0")
    assert fn.structured_inputs[0][0].shape.as_list() == [None, 8, 8, 3]   # tf2jax's metadata
    _assert_close([fn(IMAGES), jax.jit(fn)(IMAGES)], [expected, expected])


@pytest.mark.slow
def test_frozen_v1_rnn_from_pb(tmp_path):
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [2, 6, 3], name="seq")
    lengths = V1.placeholder_with_default(tf.constant([6, 4]), [2], name="lengths")
    outputs, state = V1.nn.dynamic_rnn(GRUCell(5), x, sequence_length=lengths, dtype=tf.float32)
    tf.identity(outputs, name="outputs")
    tf.identity(state, name="state")
  frozen = _frozen(g, ["outputs", "state"])
  assert {"Enter", "LoopCond", "TensorArrayV3", "PlaceholderWithDefault"} <= {n.op for n in frozen.node}
  path = tmp_path / "rnn.pb"
  path.write_bytes(frozen.SerializeToString())
  expected = session_run(g, ["outputs:0", "state:0"], {"seq:0": SEQ})
  fn = jaxport.convert_functional_graph_def(str(path), ["seq"], ["outputs", "state"])   # lengths keeps its default
  _assert_close(fn(SEQ), expected)
  _assert_close(jax.jit(fn)(SEQ), expected)
  fed = jaxport.convert_functional_graph_def(str(path), ["seq", "lengths"], ["outputs", "state"])
  short = np.array([3, 5], np.int32)
  _assert_close(jax.jit(fed)(SEQ, short), session_run(g, ["outputs:0", "state:0"], {"seq:0": SEQ, "lengths:0": short}))


def test_graph_def_with_variables_takes_their_initial_values():
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [None, 3], name="x")
    with V1.variable_scope("m", use_resource=False):
      w = V1.get_variable("w", initializer=np.arange(6, dtype=np.float32).reshape(3, 2))
    with V1.variable_scope("r"):   # resource variables (VarHandleOp)
      b = V1.get_variable("b", initializer=np.float32([0.5, -1.0]))
    y = tf.identity(tf.matmul(x, w) + b, name="y")
  fn, params = jaxport.convert_graph_def(g.as_graph_def(), ["x"], "y")
  assert set(params) == {"m/w", "r/b"}
  xs = np.ones((2, 3), np.float32)
  out, _ = fn(params, xs)
  np.testing.assert_allclose(out, session_run(g, y, {x: xs}))
  out, _ = fn({**params, "m/w": np.zeros((3, 2), np.float32)}, xs)   # params drive the graph
  np.testing.assert_allclose(out, np.broadcast_to([0.5, -1.0], (2, 2)))
  with pytest.raises(jaxport.MissingInputError, match="r/b"):
    fn({"m/w": params["m/w"]}, xs)


def _tf1_saved_model(path, *, use_resource: bool, tags, signature_key: str):
  """A TF1 SavedModel with a cond and a while loop; returns the expected output for IMAGES."""
  with v1_graph() as g:
    x = V1.placeholder(tf.float32, [None, 3], name="x")
    with V1.variable_scope("model", use_resource=use_resource):
      w = V1.get_variable("w", initializer=np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2))
    y = V1.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, w), lambda: -tf.matmul(x, w))
    y = V1.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.tanh(v) + 0.5), [0, y])[1]
    xs = np.random.RandomState(2).normal(size=(4, 3)).astype(np.float32)
    with V1.Session(graph=g) as sess:
      sess.run(V1.global_variables_initializer())
      sess.run(w.assign(w * 2.0))   # the saved value differs from the initializer's
      expected = sess.run(y, {x: xs})
      builder = V1.saved_model.Builder(str(path))
      signature = V1.saved_model.predict_signature_def({"x": x}, {"y": y})
      builder.add_meta_graph_and_variables(sess, tags, signature_def_map={signature_key: signature})
      builder.save()
  return xs, expected


@pytest.mark.parametrize("use_resource", [False, True])
def test_tf1_saved_model(tmp_path, use_resource):
  xs, expected = _tf1_saved_model(tmp_path / "sm", use_resource=use_resource, tags=[V1.saved_model.SERVING],
                                  signature_key="serving_default")
  loaded = tf.saved_model.load(str(tmp_path / "sm"))
  fn, params = jaxport.convert_from_restored(loaded.signatures["serving_default"])
  assert list(params) == ["model/w"]
  for call in (fn, jax.jit(fn)):
    out, _ = call(params, x=xs)
    np.testing.assert_allclose(out["y"], expected, atol=1e-5, rtol=1e-5)


def test_tf1_hub_format_module(tmp_path):
  """Hub's TF1 format: a TF1 SavedModel whose untagged graph has a "default" signature."""
  xs, expected = _tf1_saved_model(tmp_path / "hub", use_resource=False, tags=[], signature_key="default")
  module = tf.saved_model.load(str(tmp_path / "hub"), tags=[])
  fn, params = jaxport.convert(module.signatures["default"], x=xs)
  out, _ = jax.jit(fn)(params, x=xs)
  np.testing.assert_allclose(out["y"], expected, atol=1e-5, rtol=1e-5)
  report = jaxport.inspect(module.signatures["default"])
  assert report.converts
  assert {"While", "If", "MatMul", "Tanh"} <= {row.op for row in report.rows}
