"""Loaded artifacts differentiate like the converted function where `jax.export` would lose the rule.

`jax.export` writes values only: `stop_gradient` becomes nothing, a `custom_jvp` rule becomes its primal
ops and a `@tf.custom_gradient` its forward ops. Each program below has points where that changes the
derivative (a stopped factor, a ReLU at 0, a Maximum tie, a norm at 0, ...); the loaded artifact must give
TF's gradient there under grad, jit, vmap and jvp, exported with a fixed batch (for CPU) and with a
symbolic batch (for CPU and CUDA: every function then also takes the platform index).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import export_marks

_X = np.array([[-2.0, 0.0, 1.5, 3.0, 6.0, 7.0], [0.0, 6.0, -0.0, 2.0, 0.5, 1.0]], np.float32)
_Y = np.array([[-2.0, 0.0, 0.5, 3.0, 0.0, 2.0], [1.0, 6.0, 0.0, 2.0, 0.0, 1.0]], np.float32)
_SEGMENTS = np.array([0, 0, 1, 2, 2, 2], np.int32)   # of the 6 columns

@tf.custom_gradient
def _clipped_gradient(x):
  return tf.identity(x), lambda dy: tf.clip_by_value(dy, -0.1, 0.1)


@tf.custom_gradient
def _safe_norm(x):   # its forward ops' derivative at 0 is NaN; the recorded gradient is 0
  norm = tf.sqrt(tf.reduce_sum(x * x, -1, keepdims=True))
  return norm, lambda dy: dy * x / tf.maximum(norm, 1e-6)


# name: (TF program of x and y, x, y); x and y hold the points where the exported ops' derivative differs.
PROGRAMS = {
    "stop_gradient": (lambda x, y: x * tf.stop_gradient(x) + y * tf.stop_gradient(x * y), _X, _Y),
    "relu": (lambda x, y: tf.nn.relu(x) * y, _X, _Y),
    "relu6": (lambda x, y: tf.nn.relu6(x) * y, _X, _Y),
    "abs": (lambda x, y: tf.abs(x) * y, _X, _Y),
    "maximum_tie": (lambda x, y: tf.maximum(x, y), _X, _Y),
    "minimum_tie": (lambda x, y: tf.minimum(x, y), _X, _Y),
    "pow_nonpositive_base": (lambda x, y: tf.pow(x, y), _X, np.abs(_Y) + 1.0),
    "mul_no_nan": (lambda x, y: tf.math.multiply_no_nan(x, y), _X, _Y),
    "spence_above_one": (lambda x, y: tf.math.special.spence(x) * y, np.abs(_X) + 0.5, _Y),
    "custom_gradient_clipped": (lambda x, y: _clipped_gradient(x * y) * 3.0, _X, _Y),
    "custom_gradient_safe_norm": (lambda x, y: _safe_norm(x * tf.cast(y > 10.0, x.dtype)) * y + _safe_norm(x),
                                  _X, _Y),
    "rgb_to_hsv": (lambda x, y: tf.reshape(tf.image.rgb_to_hsv(tf.reshape(tf.abs(x) / 7.0, [-1, 2, 3])), [-1, 6]) * y,
                   _X, _Y),
    "softmax_cross_entropy_unnormalized_labels": (
        lambda x, y: tf.nn.softmax_cross_entropy_with_logits(labels=tf.abs(y), logits=x)[:, None] * x, _X, _Y),
    # JAX has no derivative for a multiplying scatter with repeated indices; zeros take TF's rule
    "unsorted_segment_prod": (lambda x, y: tf.transpose(tf.gather(
        tf.math.unsorted_segment_prod(tf.transpose(x * y), _SEGMENTS, 3), _SEGMENTS)), _X, _Y),
    "segment_prod": (lambda x, y: tf.transpose(tf.gather(tf.math.segment_prod(tf.transpose(x * y), _SEGMENTS),
                                                         _SEGMENTS)), _X, _Y),
    # nearest sampling, whose TF gradient for the boxes is the bilinear one; boxes partly outside the image
    "crop_and_resize_nearest": (lambda x, y: tf.reshape(tf.image.crop_and_resize(
        tf.reshape(x, [-1, 2, 3, 1]), y[:, :4] * 0.3, tf.range(tf.shape(x)[0]), [2, 3], method="nearest",
        extrapolation_value=0.25), [-1, 6]), _X, _Y),
}
_REVERSE_ONLY = {"rgb_to_hsv", "crop_and_resize_nearest"}


def _tf_gradients(program, x, y, weights):
  xs, ys = tf.constant(x), tf.constant(y)
  with tf.GradientTape() as tape:
    tape.watch([xs, ys])
    loss = tf.reduce_sum(program(xs, ys) * weights)
  return [g.numpy() for g in tape.gradient(loss, [xs, ys])]


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def exported(request, tmp_path_factory):
  program, x, y = PROGRAMS[request.param]
  spec = tf.TensorSpec([None, x.shape[1]], tf.float32)
  jax_fn, params = jaxport.convert(tf.function(program), spec, spec)
  loaded = {}
  for polymorphic in (False, True):
    path = tmp_path_factory.mktemp(request.param) / ("polymorphic" if polymorphic else "fixed")
    if polymorphic:   # both platforms: every function also takes the platform index
      jaxport.export(jax_fn, params, path=path, platforms=("cpu", "cuda"), batch_polymorphic=True)
    else:
      jaxport.export(jax_fn, params, x, y, path=path, platforms=("cpu",))
    loaded[polymorphic] = jaxport.load(path)
  return request.param, program, x, y, jax_fn, params, loaded


@pytest.mark.parametrize("polymorphic", [False, True], ids=["fixed_batch", "symbolic_batch"])
def test_loaded_gradient_is_tfs(exported, polymorphic):
  name, program, x, y, jax_fn, params, loaded = exported
  fn, loaded_params = loaded[polymorphic]
  weights = np.random.RandomState(0).uniform(0.5, 1.5, x.shape).astype(np.float32)
  expected = _tf_gradients(program, x, y, weights)

  def loss(f, p):
    return lambda x, y: jnp.sum(f(p, x, y)[0] * weights)
  converted = jax.grad(loss(jax_fn, params), argnums=(0, 1))(x, y)
  for got in (jax.grad(loss(fn, loaded_params), argnums=(0, 1))(x, y),
              jax.jit(jax.grad(loss(fn, loaded_params), argnums=(0, 1)))(x, y)):
    for g, c, e in zip(got, converted, expected):
      np.testing.assert_allclose(c, e, rtol=1e-5, atol=1e-6, err_msg=f"{name}: converted vs TF")
      np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"{name}: loaded vs TF")

  # vmap over a new leading axis, and forward mode, against the converted function
  def batched(f, p):
    return jax.vmap(jax.grad(lambda x, y: jnp.sum(f(p, x, y)[0] * weights), argnums=(0, 1)))
  xs, ys = np.stack([x, x[::-1]]), np.stack([y, y[::-1]])
  for g, c in zip(batched(fn, loaded_params)(xs, ys), batched(jax_fn, params)(xs, ys)):
    np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-6, err_msg=f"{name}: vmap of grad")
  tangents = (np.ones_like(x), np.full_like(y, 0.5))
  if name in _REVERSE_ONLY:   # a jax.custom_vjp rule: forward mode refuses it, loaded or not
    for f, p in ((jax_fn, params), (fn, loaded_params)):
      with pytest.raises(TypeError, match="forward-mode"):
        jax.jvp(lambda x, y: f(p, x, y)[0], (x, y), tangents)
    return
  _, jvp_loaded = jax.jvp(lambda x, y: fn(loaded_params, x, y)[0], (x, y), tangents)
  _, jvp_converted = jax.jvp(lambda x, y: jax_fn(params, x, y)[0], (x, y), tangents)
  np.testing.assert_allclose(jvp_loaded, jvp_converted, rtol=1e-5, atol=1e-6, err_msg=f"{name}: jvp")


def test_marks_exist_only_in_the_exported_module(tmp_path):
  f = tf.function(lambda x: tf.nn.relu(x) * tf.stop_gradient(x))
  x = _X
  jax_fn, params = jaxport.convert(f, x)
  jaxpr = str(jax.make_jaxpr(lambda x: jax_fn(params, x)[0])(x))
  assert export_marks.PREFIX not in jaxpr   # the converted function runs the rules with no call in the way
  lowered = jaxport.artifact.lower(jax_fn, params, x, platforms=("cpu",))
  text = lowered.exported.mlir_module()
  assert f"@{export_marks.PREFIX}stop_gradient" in text


def test_a_stopped_constant_stays_static():
  """StopGradient of a shape feeds a Reshape: under export it must stay a constant, not a traced call."""
  f = tf.function(lambda x: tf.reshape(x, tf.stop_gradient(tf.shape(x)[::-1])))
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  jax_fn, params = jaxport.convert(f, x)
  np.testing.assert_array_equal(jax.jit(jax_fn)(params, x)[0], f(x).numpy())
  lowered = jaxport.artifact.lower(jax_fn, params, x, platforms=("cpu",))
  assert export_marks.PREFIX not in lowered.exported.mlir_module()


def test_rule_for_names():
  assert export_marks.rule_for("jaxport_mark__stop_gradient") is not None
  assert export_marks.rule_for("jaxport_mark__relu_six_3") is export_marks.rule_for("jaxport_mark__relu_six")
  assert export_marks.rule_for("jaxport_mark__unknown") is None and export_marks.rule_for("main") is None
  static = {"crop_size": [2, 3], "extrapolation_value": -0.25}   # static arguments ride in the name
  for suffix in ("", "_4"):
    rule = export_marks.rule_for(export_marks.PREFIX + "crop_nearest" + export_marks._encoded(static) + suffix)
    assert rule.func is export_marks.rule_for("jaxport_mark__crop_nearest") and rule.keywords == static
  with pytest.raises(ValueError, match="taken"):
    export_marks.marked("stop_gradient")(lambda x: x)


def test_prevent_gradient_still_refuses_after_export(tmp_path):
  f = tf.function(lambda x: tf.raw_ops.PreventGradient(input=x * 2.0, message="no second derivative") + x)
  x = _X
  jax_fn, params = jaxport.convert(f, x)
  with pytest.raises(LookupError, match="no second derivative"):
    jax.grad(lambda x: jnp.sum(jax_fn(params, x)[0]))(x)
  jaxport.export(jax_fn, params, x, path=tmp_path / "a", platforms=("cpu",))
  fn, loaded = jaxport.load(tmp_path / "a")
  np.testing.assert_array_equal(jax.jit(fn)(loaded, x)[0], f(x).numpy())
  with pytest.raises(LookupError, match="PreventGradient"):
    jax.grad(lambda x: jnp.sum(fn(loaded, x)[0]))(x)


_LOAD_WITHOUT_TF = """
import sys
import jax, jax.numpy as jnp, numpy as np
import jaxport
fn, params = jaxport.load(sys.argv[1])
x = np.load(sys.argv[2])
g = jax.jit(jax.grad(lambda x: jnp.sum(fn(params, x, x)[0])))(x)
np.save(sys.argv[3], np.asarray(g))
assert not [m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "tf_keras", "keras")]
"""


def test_marked_artifact_differentiates_without_tensorflow(tmp_path):
  """The interpreter reads the marks back with TensorFlow blocked (the rules live in TF-free modules)."""
  import os
  import subprocess
  import sys
  from import_blocker import block_imports
  program = lambda x, y: (tf.nn.relu6(x) * tf.stop_gradient(y) + _safe_norm(x * 0.0) + tf.maximum(x, y))
  jax_fn, params = jaxport.convert(tf.function(program), _X, _X)
  jaxport.export(jax_fn, params, _X, _X, path=tmp_path / "a", platforms=("cpu",))
  np.save(tmp_path / "x.npy", _X)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["JAX_PLATFORMS"] = "cpu"
  result = subprocess.run([sys.executable, "-c", block_imports("tensorflow", "tf_keras", "keras") + _LOAD_WITHOUT_TF,
                           str(tmp_path / "a"), str(tmp_path / "x.npy"), str(tmp_path / "g.npy")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  expected = jax.grad(lambda x: jnp.sum(jax_fn(params, x, x)[0]))(_X)
  np.testing.assert_allclose(np.load(tmp_path / "g.npy"), expected, rtol=1e-6)
  assert np.all(np.isfinite(expected))


@pytest.mark.parametrize("polymorphic", [False, True], ids=["fixed_batch", "symbolic_batch"])
def test_loaded_depthwise_filter_gradient_keeps_the_variadic_reduce(tmp_path, polymorphic):
  # The depthwise taps' filter gradient (the taps reduced together, `conv_lowering.depthwise_taps`) is a rule
  # `jax.export` would write as plain slices and products; the mark keeps it in the loaded artifact.
  x = np.random.RandomState(0).normal(size=(2, 8, 8, 4)).astype(np.float32)
  w = tf.Variable(np.random.RandomState(1).normal(size=(3, 3, 4, 1)).astype(np.float32))
  fn = tf.function(lambda x: tf.nn.depthwise_conv2d(x, w, [1, 1, 1, 1], "SAME"))
  jax_fn, params = jaxport.convert(fn, tf.TensorSpec([None, 8, 8, 4], tf.float32))
  if polymorphic:
    jaxport.export(jax_fn, params, path=tmp_path / "dw", platforms=("cpu", "cuda"), batch_polymorphic=True)
  else:
    jaxport.export(jax_fn, params, x, path=tmp_path / "dw", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "dw")
  loss = lambda p: (loaded(p, x)[0] ** 2).sum()
  with tf.GradientTape() as tape:
    value = tf.reduce_sum(fn(tf.constant(x)) ** 2)
  (got,) = jax.tree.leaves(jax.jit(jax.grad(loss))(loaded_params))
  np.testing.assert_allclose(got, tape.gradient(value, w), rtol=1e-4, atol=1e-4)
  reduces = [line for line in jax.jit(jax.grad(loss)).lower(loaded_params).as_text().splitlines()
             if "stablehlo.reduce(" in line]
  assert any(line.count("%") >= 18 for line in reduces), reduces


@pytest.mark.parametrize("polymorphic", [False, True], ids=["fixed_batch", "symbolic_batch"])
def test_loaded_winograd_conv_differentiates_without_scatters(tmp_path, polymorphic):
  # The Winograd conv's values are gathers; its derivatives are those of the sliced form (transposed to
  # pads, `conv_lowering._winograd`). Exported as plain gathers, the loaded artifact would transpose them to
  # scatter-adds, which XLA:CPU runs serially; the mark keeps the rule.
  rs = np.random.RandomState(0)
  x = rs.normal(size=(2, 16, 16, 64)).astype(np.float32)
  w = tf.Variable((rs.normal(size=(3, 3, 64, 8)) / 24).astype(np.float32))
  fn = tf.function(lambda x: tf.nn.conv2d(x, w, 1, "SAME"))
  jax_fn, params = jaxport.convert(fn, tf.TensorSpec([None, 16, 16, 64], tf.float32))
  # The Winograd path was taken where YNNPACK is off (an export traces so too).
  assert "stablehlo.gather" in jaxport.jit(jax_fn).lower(params, x).as_text()
  if polymorphic:
    jaxport.export(jax_fn, params, path=tmp_path / "wino", platforms=("cpu", "cuda"), batch_polymorphic=True)
  else:
    jaxport.export(jax_fn, params, x, path=tmp_path / "wino", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "wino")
  np.testing.assert_allclose(jax.jit(loaded)(loaded_params, x)[0], fn(x), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(jaxport.jit(loaded)(loaded_params, x)[0], fn(x), rtol=1e-4, atol=1e-4)
  # The reader picks as the converter does: Winograd with YNNPACK off, the base-dilated conv under it.
  assert "stablehlo.gather" in jaxport.jit(loaded).lower(loaded_params, x).as_text()
  assert "lhs_dilate=2x2" in jax.jit(loaded).lower(loaded_params, x).compile().as_text()
  loss = lambda p, x: (loaded(p, x)[0] ** 2).sum()
  x_tf = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x_tf)
    value = tf.reduce_sum(fn(x_tf) ** 2)
  want_x, want_w = tape.gradient(value, [x_tf, w])
  got_p, got_x = jax.jit(jax.grad(loss, (0, 1)))(loaded_params, x)
  (got_w,) = jax.tree.leaves(got_p)
  np.testing.assert_allclose(got_w, want_w, rtol=1e-4, atol=1e-4 * float(np.abs(want_w).max()))
  np.testing.assert_allclose(got_x, want_x, rtol=1e-4, atol=1e-4 * float(np.abs(want_x).max()))
  for jit in (jax.jit, jaxport.jit):
    assert "scatter" not in jit(jax.grad(loss, (0, 1))).lower(loaded_params, x).as_text()
  got_p, got_x = jaxport.jit(jax.grad(loss, (0, 1)))(loaded_params, x)
  np.testing.assert_allclose(jax.tree.leaves(got_p)[0], want_w, rtol=1e-4, atol=1e-4 * float(np.abs(want_w).max()))
  np.testing.assert_allclose(got_x, want_x, rtol=1e-4, atol=1e-4 * float(np.abs(want_x).max()))


def test_loaded_conv_computes_values_base_dilated_under_plain_jit(tmp_path):
  # The artifact keeps XLA's plain conv; its reader computes the values base-dilated under YNNPACK (a
  # plain jax.jit), as the converter does, and differentiates the plain conv.
  rs = np.random.RandomState(0)
  x = rs.normal(size=(2, 12, 12, 16)).astype(np.float32)
  w = tf.Variable((rs.normal(size=(5, 5, 16, 8)) / 24).astype(np.float32))
  fn = tf.function(lambda x: tf.nn.conv2d(x, w, 1, "SAME"))
  jax_fn, params = jaxport.convert(fn, x)
  jaxport.export(jax_fn, params, x, path=tmp_path / "conv", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "conv")
  assert "lhs_dilation" not in loaded.exported.mlir_module()
  plain = jax.jit(loaded)
  assert "lhs_dilate=2x2" in plain.lower(loaded_params, x).compile().as_text()
  assert "lhs_dilate" not in jaxport.jit(loaded).lower(loaded_params, x).compile().as_text()
  np.testing.assert_allclose(plain(loaded_params, x)[0], fn(x), rtol=1e-4, atol=1e-4)
  with tf.GradientTape() as tape:
    value = tf.reduce_sum(fn(tf.constant(x)) ** 2)
  (got,) = jax.tree.leaves(jax.jit(jax.grad(lambda p: (loaded(p, x)[0] ** 2).sum()))(loaded_params))
  want = tape.gradient(value, w)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_loaded_max_pool_routes_tied_gradients_as_tf(tmp_path):
  # Pools compute values from strided slices, whose max would split a tied gradient; the mark keeps the
  # converter's rule (reduce_window's derivative) in the artifact.
  x = (np.round(np.random.RandomState(0).normal(size=(2, 8, 8, 4)) * 2) / 2).astype(np.float32)
  fn = tf.function(lambda x: tf.nn.max_pool2d(x, 3, 2, "SAME") + tf.nn.avg_pool2d(x, 3, 1, "SAME")[:, ::2, ::2])
  jax_fn, params = jaxport.convert(fn, x)
  jaxport.export(jax_fn, params, x, path=tmp_path / "pool", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "pool")
  assert f"{export_marks.PREFIX}pool_by_taps" in loaded.exported.mlir_module()
  weights = np.arange(2 * 4 * 4 * 4, dtype=np.float32).reshape(2, 4, 4, 4)
  x_tf = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x_tf)
    value = tf.reduce_sum(fn(x_tf) * weights)
  want = tape.gradient(value, x_tf)
  got = jax.jit(jax.grad(lambda x: (loaded(loaded_params, x)[0] * weights).sum()))(x)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(jax.jit(loaded)(loaded_params, x)[0], fn(x), rtol=1e-6, atol=1e-6)
