"""The tf2jax-compatible API: params, state updates, nesting, config, errors, SavedModels."""
import collections
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
import jaxport as tf2jax   # drop-in: existing tf2jax code only changes its import
from oracle import assert_close, check, run_rule

X = np.random.RandomState(0).normal(size=(4, 3)).astype(np.float32)


def test_tf2jax_names_exist():
  for name in ["convert", "convert_functional", "convert_from_restored", "convert_functional_from_restored",
               "get_config", "update_config", "override_config", "MissingInputError",
               "get_unsupported_operations"]:
    assert callable(getattr(tf2jax, name)) or isinstance(getattr(tf2jax, name), type), name


def test_convert_functional_pure_function():
  f = tf2jax.convert_functional(lambda x: tf.sin(tf.cos(x)), np.zeros_like(X))
  np.testing.assert_allclose(f(X), np.sin(np.cos(X)), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(f)(X), np.sin(np.cos(X)), rtol=1e-6)


def test_params_are_keyed_by_variable_name_with_trainable_flags():
  w = tf.Variable(np.ones((3, 2), np.float32), name="w")
  steps = tf.Variable(0, name="steps", trainable=False)

  def fn(x):
    return tf.matmul(x, w) + tf.cast(steps, tf.float32)

  jax_fn, params = jaxport.convert(fn, X)
  assert set(params) == {"w", "steps"}
  assert params["w"].trainable and not params["steps"].trainable
  assert jax_fn.trainable == {"w": True, "steps": False}
  out, _ = jax_fn(params, X)
  np.testing.assert_allclose(out, X @ np.ones((3, 2)), rtol=1e-6)
  # The params are inputs: new values change the output.
  out2, _ = jax_fn({**params, "w": np.zeros((3, 2), np.float32)}, X)
  np.testing.assert_allclose(out2, np.zeros((4, 2)))


def test_assign_ops_update_new_params():
  total = tf.Variable(np.zeros((3,), np.float32), name="total")
  count = tf.Variable(10, name="count")
  scale = tf.Variable(np.ones((3,), np.float32), name="scale")

  @tf.function
  def fn(x):
    total.assign_add(tf.reduce_sum(x, axis=0))
    count.assign_sub(1)
    scale.assign(scale * 2.0)
    return total.read_value() * scale

  jax_fn, params = jaxport.convert(fn, X)
  out, new = jax_fn(params, X)
  np.testing.assert_allclose(new["total"], X.sum(0), rtol=1e-6)
  assert int(new["count"]) == 9
  np.testing.assert_allclose(new["scale"], 2 * np.ones(3))
  np.testing.assert_allclose(out, X.sum(0) * 2, rtol=1e-6)
  # Functional: the TF variables are untouched and the old params are unchanged.
  np.testing.assert_allclose(params["total"], 0)
  out_again, newer = jax.jit(jax_fn)(new, X)
  np.testing.assert_allclose(newer["total"], 2 * X.sum(0), rtol=1e-6)


Pair = collections.namedtuple("Pair", ["first", "second"])


def test_outputs_keep_nesting():
  def fn(x):
    return {"b": [x, (x * 2,)], "a": Pair(x + 1, {"z": x - 1}), "n": None}

  out = jaxport.convert_functional(fn, X)(X)
  assert isinstance(out["a"], Pair) and isinstance(out["b"], list) and isinstance(out["b"][1], tuple)
  assert out["n"] is None
  np.testing.assert_allclose(out["a"].second["z"], X - 1)
  np.testing.assert_allclose(out["b"][1][0], 2 * X)


def test_nested_inputs_and_kwargs():
  def fn(inputs, scale):
    return inputs["a"] * scale + inputs["b"][0]

  f = jaxport.convert_functional(fn, {"a": X, "b": [X]}, scale=np.float32(2))
  np.testing.assert_allclose(f({"a": X, "b": [X]}, scale=np.float32(3)), 4 * X, rtol=1e-6)


def test_convert_functional_rejects_variables():
  v = tf.Variable(1.0, name="my_var")
  with pytest.raises(ValueError, match="my_var"):
    jaxport.convert_functional(lambda x: x * v, X)


def test_missing_param_and_missing_input_are_named():
  v = tf.Variable(np.ones(3, np.float32), name="kernel")
  jax_fn, params = jaxport.convert(lambda x, y: x * v + y, X, X)
  with pytest.raises(jaxport.MissingInputError, match="kernel"):
    jax_fn({}, X, X)
  with pytest.raises(jaxport.MissingInputError, match=r"args\[1\]"):
    jax_fn(params, X)


def test_shape_check_names_argument_and_shapes():
  f = jaxport.convert_functional(lambda x: x * 2, np.zeros((10, 5), np.float32))
  with pytest.raises(jaxport.ShapeMismatchError, match=r"args\[0\].*\(10, 5\).*\(20, 5\)"):
    f(np.zeros((20, 5), np.float32))
  with tf2jax.override_config("strict_shape_check", False):
    g = jaxport.convert_functional(lambda x: x * 2, np.zeros((10, 5), np.float32))
  assert g(np.zeros((20, 5), np.float32)).shape == (20, 5)


def test_none_dims_stay_free():
  f = jaxport.convert_functional(lambda x: tf.reduce_sum(x, axis=1), tf.TensorSpec([None, 5], tf.float32))
  assert f(np.ones((7, 5), np.float32)).shape == (7,)
  with pytest.raises(jaxport.ShapeMismatchError, match="None, 5"):
    f(np.ones((7, 6), np.float32))


def test_dtype_check_is_opt_in():
  f = jaxport.convert_functional(lambda x: x + 1, np.zeros((2,), np.float32))
  f(np.zeros((2,), np.int32))   # allowed by default, like tf2jax
  with tf2jax.override_config("strict_dtype_check", True):
    g = jaxport.convert_functional(lambda x: x + 1, np.zeros((2,), np.float32))
  with pytest.raises(jaxport.DtypeMismatchError, match="float32.*int32"):
    g(np.zeros((2,), np.int32))


def test_config_api():
  assert tf2jax.get_config("strict_shape_check") is True
  assert tf2jax.get_config("infer_cumulative_reduction_from_jax2tf") is True
  assert tf2jax.get_config("xlacallmodule_strict_checks") is True
  with tf2jax.override_config("strict_dtype_check", True):
    assert tf2jax.get_config("strict_dtype_check") is True
  assert tf2jax.get_config("strict_dtype_check") is False
  tf2jax.update_config("convert_custom_gradient", False)
  try:
    assert tf2jax.get_config("convert_custom_gradient") is False
  finally:
    tf2jax.update_config("convert_custom_gradient", True)
  with pytest.raises(ValueError, match="strict_shape_check"):
    tf2jax.get_config("no_such_key")
  with pytest.raises(ValueError, match="valid keys"):
    tf2jax.update_config("no_such_key", 1)


@pytest.mark.parametrize("flag,dtype", [("force_const_float32_to_bfloat16", np.float32),
                                        ("force_const_float64_to_bfloat16", np.float64)])
def test_bfloat16_constant_flags(flag, dtype):
  fn = lambda x: x + tf.constant(3.14, dtype=tf.as_dtype(dtype))
  x = np.ones((2,), dtype)
  with tf2jax.override_config(flag, True):
    f = jaxport.convert_functional(fn, x)
  out = f(jnp.asarray(x, jnp.bfloat16))
  assert out.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out, np.float32), 4.14, atol=2e-2)


def test_prevent_gradient_raises_lookup_error_with_message():
  def prevent(x):
    return tf.raw_ops.PreventGradient(input=x * x, message="prevented")

  f = jaxport.convert_functional(prevent, 0.0)
  assert float(f(3.0)) == pytest.approx(9.0)
  with pytest.raises(LookupError, match="prevented"):
    jax.grad(f)(3.14)
  with tf2jax.override_config("raise_on_prevent_gradient", False):
    g = jaxport.convert_functional(prevent, 0.0)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert float(jax.grad(g)(3.14)) == pytest.approx(6.28, rel=1e-5)
  assert any("PreventGradient" in str(w.message) for w in caught)


def test_stop_gradient():
  f = jaxport.convert_functional(lambda x: x * tf.stop_gradient(x), 0.0)
  assert float(jax.grad(f)(3.0)) == pytest.approx(3.0)


def test_unsupported_ops_listed_before_running_including_library_functions():
  @tf.function
  def inner(s):
    return tf.strings.length(s)

  def fn(x, s):
    return tf.cast(inner(s), tf.float32) + x, tf.strings.upper(s)

  # String ops run through host callbacks by default; without them they are unsupported.
  with jaxport.override_config("allow_host_callback", False), \
       pytest.raises(jaxport.UnsupportedOperationsError) as info:
    jaxport.convert(fn, np.zeros((), np.float32), tf.TensorSpec([], tf.string))
  ops = info.value.ops
  assert "StringUpper" in ops and "StringLength" in ops
  assert any("StringLength" in n for n in ops["StringLength"])  # the node name inside `inner`
  assert "StringUpper" in str(info.value) and "StringLength" in str(info.value)


def test_get_unsupported_operations():
  with jaxport.override_config("allow_host_callback", False):
    assert jaxport.get_unsupported_operations(["Sin", "AddV2", "StringUpper", "MatMul"]) == {"StringUpper"}
  # An op TF does not know has no tier at all, whatever the config.
  assert jaxport.get_unsupported_operations(["Sin", "StringUpper", "NoSuchTensorFlowOp"]) == {"NoSuchTensorFlowOp"}


def test_jit_grad_vmap_on_mlp():
  rs = np.random.RandomState(1)
  w1 = tf.Variable(rs.normal(size=(3, 8)).astype(np.float32), name="w1")
  b1 = tf.Variable(np.zeros(8, np.float32), name="b1")
  w2 = tf.Variable(rs.normal(size=(8, 2)).astype(np.float32), name="w2")

  def mlp(x):
    return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2)

  jax_fn, params = jaxport.convert(mlp, tf.TensorSpec([None, 3], tf.float32))
  batched, _ = jax_fn(params, X)
  single = jax.vmap(lambda x: jax_fn(params, x[None])[0][0])(X)
  np.testing.assert_allclose(single, batched, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(batched, mlp(X), rtol=1e-5, atol=1e-6)

  def loss(p):
    return jnp.sum(jax_fn(p, X)[0] ** 2)

  grads = jax.jit(jax.grad(loss))(params)
  with tf.GradientTape() as tape:
    tf_loss = tf.reduce_sum(mlp(X) ** 2)
  tf_grads = tape.gradient(tf_loss, [w1, b1, w2])
  for key, g in zip(["w1", "b1", "w2"], tf_grads):
    np.testing.assert_allclose(grads[key], g.numpy(), rtol=1e-4, atol=1e-5)


def _save(module, tmp_path):
  path = str(tmp_path / "saved")
  tf.saved_model.save(module, path)
  return tf.saved_model.load(path)


def test_saved_model_convert_and_convert_from_restored(tmp_path):
  module = tf.Module()
  module.w = tf.Variable(np.arange(3, dtype=np.float32), name="w")
  module.f = tf.function(lambda x: tf.sin(x) * module.w)
  module.f(X)
  restored = _save(module, tmp_path)
  expected = restored.f(X).numpy()

  jax_fn, params = jaxport.convert(restored.f, np.zeros_like(X))
  assert_close(jax_fn(params, X)[0], expected, 1e-6, 1e-6)
  jax_fn2, params2 = jaxport.convert_from_restored(restored.f)
  assert_close(jax_fn2(params2, X)[0], expected, 1e-6, 1e-6)
  assert_close(jax.jit(jax_fn2)(params2, X)[0], expected, 1e-6, 1e-6)


def test_convert_functional_from_restored(tmp_path):
  module = tf.Module()
  module.f = tf.function(lambda x: tf.cos(x) * 2.0)
  module.f(X)
  restored = _save(module, tmp_path)
  f = jaxport.convert_functional_from_restored(restored.f)
  assert_close(f(X), np.cos(X) * 2.0, 1e-6, 1e-6)


def test_ambiguous_restored_signature_lists_signatures(tmp_path):
  module = tf.Module()
  module.f = tf.function(lambda x: x * 2)
  module.f(np.zeros((2,), np.float32))
  module.f(np.zeros((3, 3), np.int32))
  restored = _save(module, tmp_path)
  with pytest.raises(jaxport.SignatureError, match=r"Found 2 concrete functions(.|\n)*int32"):
    jaxport.convert_from_restored(restored.f)


def test_tf1_saved_model_signature(tmp_path):
  path = str(tmp_path / "tf1")
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
    w = tf.compat.v1.get_variable("w", initializer=np.full((3, 2), 0.5, np.float32), use_resource=True)
    y = tf.matmul(x, w, name="y")
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.saved_model.simple_save(sess, path, inputs={"x": x}, outputs={"y": y})
  restored = tf.saved_model.load(path)
  sig = restored.signatures["serving_default"]
  jax_fn, params = jaxport.convert_from_restored(sig)
  out, _ = jax_fn(params, x=X)
  np.testing.assert_allclose(out["y"], X @ np.full((3, 2), 0.5), rtol=1e-6)


def test_python_scalar_example_becomes_float32_input():
  f = jaxport.convert_functional(lambda x: x * x, 0.0)
  assert float(jax.grad(f)(3.0)) == pytest.approx(6.0)


def test_function_closing_over_arrays_converts():
  table = np.arange(12, dtype=np.float32).reshape(4, 3)   # closed over, not a Keras object

  def fn(x):
    return x * table

  np.testing.assert_allclose(jaxport.convert_functional(fn, X)(X), X * table)


# --------------------------------------------------------------------------- graph plumbing and variable ops by name

RAW = tf.raw_ops


def _graph_ops(fn, *args):
  return {op.type for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


def plumbing(x):
  with tf.control_dependencies([RAW.NoOp()]):
    a = RAW.Identity(input=x)
  b, c = RAW.IdentityN(input=[x, x * 2.0])
  d = RAW.StopGradient(input=tf.sin(x))
  e = RAW.StopGradient(input=x * x) * tf.constant(0.5)
  f = RAW.PlaceholderWithDefault(input=x * 3.0, shape=[4, 3])
  return a * b + c * d + e + f + tf.constant([1.0, 2.0, 3.0])


def test_graph_plumbing_ops():
  assert {"NoOp", "Identity", "IdentityN", "StopGradient", "PlaceholderWithDefault", "Const"} <= _graph_ops(plumbing, X)
  check(plumbing, X)
  check(lambda x: RAW.Snapshot(input=tf.sin(x)), X, grad=False)   # TF has no gradient for Snapshot


def test_variable_assign_ops_update_new_params_like_tf():
  total = tf.Variable(np.zeros((3,), np.float32), name="total")
  count = tf.Variable(10, name="count")
  table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3), name="table")

  # Variables' methods emit the ops (raw ops on `v.handle` would hide the variable from tf.function).
  def fn(x):
    total.assign_add(tf.reduce_sum(x, axis=0))   # AssignAddVariableOp
    count.assign_sub(3)                          # AssignSubVariableOp
    table.assign(table * x[0])                   # ReadVariableOp, AssignVariableOp
    return total.read_value() * 2.0, tf.gather_nd(table, [[3], [1]]), total.is_initialized()

  assert {"AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp", "ReadVariableOp",
          "ResourceGatherNd", "VarIsInitializedOp"} <= _graph_ops(fn, X)
  jax_fn, params = jaxport.convert(fn, X)
  eager, new = jax_fn(params, X)
  jitted, new_jit = jax.jit(jax_fn)(params, X)
  expected = tf.function(fn)(X)   # updates the TF variables
  for outs, state in ((eager, new), (jitted, new_jit)):
    assert_close(outs, expected, 1e-6, 1e-6)
    assert_close([state["total"], state["count"], state["table"]], [total, count, table], 1e-6, 1e-6)


def test_variable_reads_differentiate_like_tf():
  table = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3), name="table")

  def fn(x):   # ReadVariableOp, ResourceGatherNd
    return tf.gather_nd(table, [[3], [1], [3]]) * x[:3] + tf.reduce_sum(table.read_value() ** 2)

  assert {"ReadVariableOp", "ResourceGatherNd"} <= _graph_ops(fn, X)
  jax_fn, params = jaxport.convert(fn, X)
  loss = lambda t, x: jnp.sum(jax_fn({"table": t}, x)[0])
  grads = [jax.grad(loss, argnums=(0, 1))(params["table"], X), jax.jit(jax.grad(loss))(params["table"], X)]
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    tf_loss = tf.reduce_sum(fn(x))
  tf_grads = [tf.convert_to_tensor(g) for g in tape.gradient(tf_loss, [table, x])]
  assert_close(grads[0], tf_grads, 1e-5, 1e-5)
  assert_close(grads[1], tf_grads[0], 1e-5, 1e-5)


def test_var_handle_op_refers_to_its_shared_name():
  ref = run_rule("VarHandleOp", shared_name="model/w", dtype=np.float32, shape=[3])
  assert ref.key == "model/w"
  assert run_rule("VarHandleOp", shared_name="", dtype=np.float32, shape=[3]).key == "node"   # the node name


def test_graph_level_var_handle_reads_params_by_shared_name():
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.float32, [4, 3], name="x")
    w = tf.compat.v1.get_variable("w", initializer=np.full((3,), 0.5, np.float32), use_resource=True)
    tf.identity(x * w, name="y")
  graph_def = graph.as_graph_def()
  fn = tf.compat.v1.wrap_function(
      lambda x: tf.graph_util.import_graph_def(graph_def, {"x:0": x}, return_elements=["y:0"]),
      [tf.TensorSpec([4, 3], tf.float32)])
  assert "VarHandleOp" in {n.op for n in fn.graph.as_graph_def().node}
  jax_fn, _ = jaxport.convert(fn, X)
  out, _ = jax_fn({"w": np.full((3,), 2.0, np.float32)}, X)
  np.testing.assert_allclose(out[0], X * 2.0, rtol=1e-6)
