"""TF-free artifacts: `jaxport.export` then `jaxport.load`, without TensorFlow on the load side.

Round trips (a Keras CNN, an LSTM, BatchNorm in training mode, a jax2tf SavedModel) must give
the converted function's outputs and new params, and work under jit/grad/vmap/jvp; the loaded
function is checked against `jax.export`'s own `Exported.call`. Tampered files raise
`ArtifactError`; loading runs with TensorFlow blocked and in a virtualenv without it.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport import artifact
from jaxport.errors import ArtifactError, DtypeMismatchError, MissingInputError, ShapeMismatchError
from import_blocker import block_imports

RNG = np.random.RandomState(0)
SRC = pathlib.Path(jaxport.__file__).resolve().parents[1]


def _normal(*shape):
  return RNG.normal(size=shape).astype(np.float32)


def _assert_tree_close(actual, expected, atol=1e-5):
  jax.tree_util.tree_map(lambda a, e: np.testing.assert_allclose(np.asarray(a), np.asarray(e), atol=atol, rtol=1e-5),
                         actual, expected)


def _round_trip(jax_fn, params, path, args, kwargs=None, rng=None, export_args=None, **options):
  """Exports (example inputs: `export_args`, else `args`/`kwargs`), loads, and checks outputs and new
  params against the converted function and jax.export's `Exported.call`."""
  kwargs = kwargs or {}
  if export_args is None:
    jaxport.export(jax_fn, params, *args, path=path, **options, **kwargs)
  else:
    jaxport.export(jax_fn, params, *export_args, path=path, **options)
  fn, loaded = jaxport.load(path)
  assert list(loaded) == list(params)
  assert all(loaded[k].trainable == bool(jax_fn.trainable[k]) == fn.trainable[k] for k in params)
  kw = dict(kwargs, **({"rng": rng} if rng is not None else {}))
  expected, expected_params = jax_fn(params, *args, **kw)
  out, new_params = fn(loaded, *args, **kw)
  _assert_tree_close(out, expected)
  _assert_tree_close(new_params, expected_params)
  # jax.export's own deserializer and XLA agree with the interpreter.
  flat = fn.flat_inputs(loaded, *args, **kw)
  via_exported = fn.exported.call(*flat)
  _assert_tree_close(list(via_exported)[:len(jax.tree_util.tree_leaves(out))], jax.tree_util.tree_leaves(out))
  return fn, loaded


# --------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
  """A tf_keras CNN converted with a free batch dim, exported batch-polymorphic."""
  import tf_keras
  tf_keras.utils.set_random_seed(0)
  model = tf_keras.Sequential([tf_keras.layers.Conv2D(3, 3, activation="relu", input_shape=(6, 6, 2)),
                               tf_keras.layers.MaxPooling2D(), tf_keras.layers.Flatten(), tf_keras.layers.Dense(4)])
  jax_fn, params = jaxport.convert(model, tf.TensorSpec([None, 6, 6, 2], tf.float32))
  path = tmp_path_factory.mktemp("cnn") / "artifact"
  x = _normal(3, 6, 6, 2)
  fn, loaded = _round_trip(jax_fn, params, path, (x,), export_args=(), batch_polymorphic=True)
  np.testing.assert_allclose(fn(loaded, x)[0], model(x).numpy(), atol=1e-5)
  return jax_fn, params, fn, loaded, path


def test_keras3_cnn_round_trip(tmp_path):
  import keras
  keras.utils.set_random_seed(0)
  inputs = keras.Input((6, 6, 2))
  x = keras.layers.Conv2D(3, 3, activation="relu")(inputs)
  x = keras.layers.Flatten()(keras.layers.MaxPooling2D()(x))
  model = keras.Model(inputs, keras.layers.Dense(4)(x))
  x = _normal(2, 6, 6, 2)
  jax_fn, params = jaxport.convert(model, tf.TensorSpec([None, 6, 6, 2], tf.float32))
  fn, loaded = _round_trip(jax_fn, params, tmp_path / "fixed", (x,), platforms=("cpu",))
  np.testing.assert_allclose(jax.jit(fn)(loaded, x)[0], model(x).numpy(), atol=1e-5)
  # Keras 3's Flatten reads the batch size with a Shape op: a symbolic dim flows through it.
  jaxport.export(jax_fn, params, path=tmp_path / "poly", batch_polymorphic=True)
  fn, loaded = jaxport.load(tmp_path / "poly")
  for batch in (1, 3):
    x = _normal(batch, 6, 6, 2)
    np.testing.assert_allclose(jax.jit(fn)(loaded, x)[0], model(x).numpy(), atol=1e-5)


@pytest.mark.parametrize("bounds", [lambda b: (b,), lambda b: (1, b + 1, 2), lambda b: (b, -1, -1),
                                    lambda b: (2 * b, 0, -3)], ids=["to_b", "odd_steps", "down", "down_by_3"])
def test_a_range_over_the_batch_stays_symbolic(tmp_path, bounds):
  """`tf.range` of the batch size (box indices, per-example positions) in a batch-polymorphic export."""
  f = tf.function(lambda x: tf.cast(tf.range(*bounds(tf.shape(x)[0])), tf.float32)[:, None] * tf.reduce_sum(x))
  jax_fn, params = jaxport.convert(f, tf.TensorSpec([None, 2], tf.float32))
  jaxport.export(jax_fn, params, path=tmp_path / "poly", batch_polymorphic=True)
  fn, loaded = jaxport.load(tmp_path / "poly")
  for batch in (1, 4, 7):
    x = _normal(batch, 2)
    np.testing.assert_allclose(jax.jit(fn)(loaded, x)[0], f(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize("draw", [
    lambda x: tf.random.stateless_normal([3, 4], seed=[1, 2]),
    lambda x: tf.random.stateless_uniform([3, 4], seed=tf.cast(tf.stack([tf.reduce_sum(x) * 0 + 7, 2]), tf.int32)),
    lambda x: tf.random.stateless_uniform([3, 4], seed=[3, 4], minval=-5, maxval=9, dtype=tf.int32),
    lambda x: tf.random.stateless_truncated_normal([3, 4], seed=[5, 6]),
], ids=["normal", "uniform_traced_seed", "uniform_int", "truncated_normal"])
def test_stateless_random_is_bit_exact_after_export(tmp_path, draw):
  """TF's stateless random runs Philox in uint64 (scoped x64 in the converter): the loaded artifact must
  draw TF's very numbers too, though the caller has x64 off (it drew others when the interpreter narrowed)."""
  f, x = tf.function(draw), _normal(3, 4)
  jax_fn, params = jaxport.convert(f, x)
  jaxport.export(jax_fn, params, x, path=tmp_path / "random", platforms=("cpu",))
  fn, loaded = jaxport.load(tmp_path / "random")
  for got in (fn(loaded, x)[0], jax.jit(fn)(loaded, x)[0]):
    np.testing.assert_array_equal(got, f(x).numpy())


def test_a_value_dependent_shape_cannot_be_exported(tmp_path):
  """tf.where(cond) has as many rows as true elements: no static shape, a typed error naming the node."""
  jax_fn, params = jaxport.convert(tf.function(lambda x: tf.where(x > 0)), _normal(3, 2))
  with pytest.raises(ArtifactError, match="output size here depends on input values .*Where node 'Where'"):
    jaxport.export(jax_fn, params, _normal(3, 2), path=tmp_path / "where", platforms=("cpu",))
  assert not (tmp_path / "where").exists()


def test_a_range_stepping_by_the_batch_needs_a_fixed_batch(tmp_path):
  f = tf.function(lambda x: tf.cast(tf.range(0, 12, tf.shape(x)[0]), tf.float32) * tf.reduce_sum(x))
  jax_fn, params = jaxport.convert(f, tf.TensorSpec([None, 2], tf.float32))
  with pytest.raises(ArtifactError, match="symbolic batch dim: .*Range node 'range' needs its `bounds`"):
    jaxport.export(jax_fn, params, path=tmp_path / "poly", batch_polymorphic=True)


def _batch_sized_function():
  """A function whose shapes need the batch size as a number: a size computed in floats from it."""
  @tf.function
  def f(x):
    n = tf.cast(tf.sqrt(tf.cast(tf.shape(x)[0], tf.float32)), tf.int32)
    return tf.reduce_sum(x, axis=1) + tf.reduce_sum(tf.ones([n]))
  return f


def test_a_function_that_needs_a_concrete_batch_fails_batch_polymorphic_export(tmp_path):
  jax_fn, params = jaxport.convert(_batch_sized_function(), tf.TensorSpec([None, 2], tf.float32))
  with pytest.raises(ArtifactError, match="symbolic batch dim: while converting Fill node"):
    jaxport.export(jax_fn, params, path=tmp_path / "poly", batch_polymorphic=True)


def test_keras_cnn_round_trip_under_jit_grad_vmap_jvp(cnn):
  jax_fn, params, fn, loaded, _ = cnn
  x = _normal(3, 6, 6, 2)
  np.testing.assert_allclose(jax.jit(fn)(loaded, x)[0], jax_fn(params, x)[0], atol=1e-5)

  def loss(f, p):
    return jnp.sum(f(p, x)[0] ** 2)
  _assert_tree_close(jax.jit(jax.grad(lambda p: loss(fn, p)))(loaded), jax.grad(lambda p: loss(jax_fn, p))(params),
                     atol=1e-4)
  rows = jax.vmap(lambda row: fn(loaded, row[None])[0][0])(x)
  np.testing.assert_allclose(rows, jax_fn(params, x)[0], atol=1e-5)
  t = _normal(3, 6, 6, 2)
  out, tangent = jax.jvp(lambda v: fn(loaded, v)[0], (x,), (t,))
  _, expected_tangent = jax.jvp(lambda v: jax_fn(params, v)[0], (x,), (t,))
  np.testing.assert_allclose(tangent, expected_tangent, atol=1e-4)


def test_batch_polymorphic_export_runs_at_two_batch_sizes(cnn):
  jax_fn, params, fn, loaded, path = cnn
  manifest = json.loads((path / artifact.MANIFEST).read_text())
  assert manifest["batch_polymorphic"] and manifest["inputs"]["leaves"][0]["shape"] == ["b", 6, 6, 2]
  assert manifest["outputs"]["leaves"][0]["shape"] == ["b", 4]
  for batch in (1, 5):
    x = _normal(batch, 6, 6, 2)
    out = jax.jit(fn)(loaded, x)[0]
    assert out.shape == (batch, 4)
    np.testing.assert_allclose(out, jax_fn(params, x)[0], atol=1e-5)
    np.testing.assert_allclose(fn.exported.call(*fn.flat_inputs(loaded, x))[0], out, atol=1e-5)
  with pytest.raises(ShapeMismatchError, match=r"args\[0\].*\(b, 6, 6, 2\)"):
    fn(loaded, _normal(2, 6, 6, 3))


def test_lstm_round_trip(tmp_path):
  import tf_keras
  tf_keras.utils.set_random_seed(0)
  model = tf_keras.Sequential([tf_keras.layers.LSTM(5, input_shape=(4, 3)), tf_keras.layers.Dense(2)])
  x = _normal(2, 4, 3)
  jax_fn, params = jaxport.convert(model, x)
  fn, loaded = _round_trip(jax_fn, params, tmp_path / "lstm", (x,), platforms=("cpu",))
  np.testing.assert_allclose(jax.jit(fn)(loaded, x)[0], model(x).numpy(), atol=1e-5)
  grads = jax.grad(lambda p: jnp.sum(fn(p, x)[0]))(loaded)
  expected = jax.grad(lambda p: jnp.sum(jax_fn(p, x)[0]))(params)
  _assert_tree_close(grads, expected, atol=1e-4)


def test_batchnorm_training_mode_carries_moving_statistics(tmp_path):
  import tf_keras
  tf_keras.utils.set_random_seed(0)
  model = tf_keras.Sequential([tf_keras.layers.Dense(4, input_shape=(3,)), tf_keras.layers.BatchNormalization(),
                               tf_keras.layers.Dropout(0.5)])
  x = _normal(8, 3)
  jax_fn, params = jaxport.convert(lambda t: model(t, training=True), x)
  assert jax_fn.requires_rng
  fn, loaded = _round_trip(jax_fn, params, tmp_path / "bn", (x,), rng=jax.random.key(3))
  manifest = fn.manifest
  mean, = [k for k in params if k.endswith("moving_mean")]
  kernel, = [k for k in params if k.endswith("kernel")]
  assert sorted(manifest["state_outputs"]) == sorted(k for k in params if "moving_" in k)
  assert manifest["rng"]["dtype"] == "uint32"
  assert not loaded[mean].trainable and loaded[kernel].trainable
  _, new = jax.jit(fn)(loaded, x, rng=jax.random.key(3))
  assert not np.allclose(new[mean], loaded[mean])
  assert fn(loaded, x, rng=jax.random.key(3))[1][kernel] is loaded[kernel]   # params it only reads pass through
  # a raw uint32 key works too; no key is a clear error
  fn(loaded, x, rng=jax.random.key_data(jax.random.key(3)))
  with pytest.raises(MissingInputError, match="rng"):
    fn(loaded, x)
  # an example key given to export is not an input; it sets the implementation the artifact takes
  jaxport.export(jax_fn, params, x, path=tmp_path / "rbg", platforms=("cpu",), rng=jax.random.key(3, impl="rbg"))
  rbg, rbg_params = jaxport.load(tmp_path / "rbg")
  assert rbg.manifest["rng"]["impl"] == "rbg" and len(rbg.manifest["inputs"]["leaves"]) == 1
  key = jax.random.key(5, impl="rbg")
  _assert_tree_close(rbg(rbg_params, x, rng=key), jax_fn(params, x, rng=key))


def test_jax2tf_saved_model_round_trip(tmp_path):
  from jax.experimental import jax2tf
  w, b = _normal(4, 3), _normal(3)

  def jax_model(params, x):
    return jax.nn.gelu(x @ params["w"] + params["b"])

  module = tf.Module()
  module.w, module.b = tf.Variable(w), tf.Variable(b)
  tf_model = jax2tf.convert(jax_model, with_gradient=True)
  module.f = tf.function(lambda x: tf_model({"w": module.w, "b": module.b}, x), autograph=False,
                         input_signature=[tf.TensorSpec([2, 4], tf.float32)])
  tf.saved_model.save(module, str(tmp_path / "saved"))
  restored = tf.saved_model.load(str(tmp_path / "saved"))
  jax_fn, params = jaxport.convert_from_restored(restored.f)
  x = _normal(2, 4)
  fn, loaded = _round_trip(jax_fn, params, tmp_path / "artifact", (x,), platforms=("cpu",))
  np.testing.assert_allclose(fn(loaded, x)[0], jax_model({"w": w, "b": b}, x), atol=1e-5)
  rows = fn.manifest["conversion"]["rows"]
  assert any(r["op"] == "XlaCallModule" for r in rows)


def test_nested_structures_kwargs_and_fixed_values(tmp_path):
  v = tf.Variable(_normal(3))

  @tf.function
  def f(pair, scale, flag=True):
    a, b = pair
    return {"sum": a + b * v * scale, "parts": (a * 2.0, [b - v]), "flag": flag, "nothing": None}

  x, y = _normal(2, 3), _normal(2, 3)
  jax_fn, params = jaxport.convert(f, (x, y), scale=np.float32(2.0), flag=True)
  fn, loaded = _round_trip(jax_fn, params, tmp_path / "nested", ((x, y),),
                           {"scale": np.float32(2.0), "flag": True})
  out, _ = fn(loaded, (x, y), scale=np.float32(2.0), flag=True)
  assert set(out) == {"sum", "parts", "flag", "nothing"} and isinstance(out["parts"][1], list)
  assert bool(out["flag"]) and out["nothing"] is None
  with pytest.raises(MissingInputError, match="flag"):
    fn(loaded, (x, y), scale=np.float32(2.0), flag=False)
  with pytest.raises(MissingInputError, match="pair|args"):
    fn(loaded, (x,), scale=np.float32(2.0), flag=True)
  with pytest.raises(DtypeMismatchError, match="int32"):
    fn(loaded, (x, y), scale=np.int32(2), flag=True)
  with pytest.raises(MissingInputError, match="Variable"):
    fn({}, (x, y), scale=np.float32(2.0), flag=True)


# --------------------------------------------------------------------------- platforms


def test_multi_platform_module_takes_the_platform_index(cnn):
  _, _, fn, loaded, path = cnn
  assert fn.platforms == ("cpu", "cuda")
  x = _normal(2, 6, 6, 2)
  here = fn(loaded, x)[0]
  other = jaxport.load(path, platform="cuda")[0]   # interpret the CUDA lowering on this backend
  np.testing.assert_allclose(other(loaded, x)[0], here, atol=1e-5)


def test_a_platform_not_exported_is_a_clear_error(tmp_path):
  jax_fn, params = jaxport.convert(lambda t: tf.sin(t), _normal(2))
  jaxport.export(jax_fn, params, path=tmp_path / "a", platforms=("tpu",))
  if jax.default_backend() == "tpu":
    pytest.skip("this backend is the exported one")
  with pytest.raises(ArtifactError, match=r"exported for tpu and this is .*platform='tpu'"):
    jaxport.load(tmp_path / "a")
  fn, p = jaxport.load(tmp_path / "a", platform="tpu")
  np.testing.assert_allclose(fn(p, np.ones(2, np.float32))[0], np.sin(np.ones(2)), atol=1e-6)


def test_host_callback_ops_cannot_be_exported(tmp_path):
  with jaxport.override_config("force_tier", "callback"):
    jax_fn, params = jaxport.convert(lambda t: tf.sin(t), _normal(2))
  with pytest.raises(ArtifactError, match="Sin.*host callbacks"):
    jaxport.export(jax_fn, params, path=tmp_path / "cb")


def test_batch_polymorphic_needs_an_unknown_batch_dim_at_conversion(tmp_path):
  x = _normal(2, 3)
  jax_fn, params = jaxport.convert(lambda t: tf.reduce_sum(t, axis=1), x)
  with pytest.raises(ArtifactError, match="TensorSpec"):
    jaxport.export(jax_fn, params, x, path=tmp_path / "p", batch_polymorphic=True)
  spec_fn, spec_params = jaxport.convert(lambda t: tf.reduce_sum(t, axis=1), tf.TensorSpec([None, 3]))
  with pytest.raises(ShapeMismatchError, match="batch_polymorphic"):
    jaxport.export(spec_fn, spec_params, path=tmp_path / "q", batch_polymorphic=False)


def test_an_unknown_batch_dim_stays_symbolic_by_default(tmp_path):
  w = _normal(3, 2)
  jax_fn, params = jaxport.convert(lambda t, n: tf.tanh(tf.matmul(t, w)) * n, tf.TensorSpec([None, 3]),
                                   tf.TensorSpec([], tf.float32))
  with warnings.catch_warnings():
    warnings.simplefilter("error", artifact.BatchFallbackWarning)
    manifest = jaxport.export(jax_fn, params, path=tmp_path / "a", platforms=("cpu",))
  assert manifest["batch_polymorphic"]
  assert [leaf["shape"] for leaf in manifest["inputs"]["leaves"]] == [["b", 3], []]   # scalars stay scalars
  fn, loaded = jaxport.load(tmp_path / "a")
  for batch in (1, 4, 7):
    x = _normal(batch, 3)
    np.testing.assert_allclose(jax.jit(fn)(loaded, x, np.float32(2))[0], np.tanh(x @ w) * 2, atol=1e-6)
  # example inputs given: their shapes, as before
  manifest = jaxport.export(jax_fn, params, _normal(5, 3), np.float32(1), path=tmp_path / "b", platforms=("cpu",))
  assert not manifest["batch_polymorphic"] and manifest["inputs"]["leaves"][0]["shape"] == [5, 3]


def test_a_function_that_cannot_be_batch_polymorphic_falls_back_with_a_warning(tmp_path):
  f = _batch_sized_function()
  jax_fn, params = jaxport.convert(f, tf.TensorSpec([None, 2], tf.float32))
  with pytest.warns(artifact.BatchFallbackWarning, match=r"symbolic batch dim \(while converting Fill node.*"
                    r"exported for batch 1.*jaxport convert --batch N"):
    lowered = artifact.lower(jax_fn, params, platforms=("cpu",))
  assert "Fill node" in lowered.batch_fallback and not lowered.manifest["batch_polymorphic"]
  lowered.write(tmp_path / "a")
  fn, loaded = jaxport.load(tmp_path / "a")
  x = _normal(1, 2)
  np.testing.assert_allclose(fn(loaded, x)[0], f(x).numpy(), atol=1e-6)
  with pytest.raises(ShapeMismatchError, match=r"\(1, 2\)"):
    fn(loaded, _normal(3, 2))


def test_the_batch_fallback_does_not_hide_other_errors(tmp_path):
  # an unknown dim other than the batch: no fixed batch helps, the shape error is raised
  jax_fn, params = jaxport.convert(lambda t: tf.reduce_sum(t, axis=1), tf.TensorSpec([None, None]))
  with warnings.catch_warnings():
    warnings.simplefilter("error", artifact.BatchFallbackWarning)
    with pytest.raises(ShapeMismatchError, match=r"unknown dims \(1, None\)"):
      jaxport.export(jax_fn, params, path=tmp_path / "a")
    with jaxport.override_config("force_tier", "callback"):
      cb_fn, cb_params = jaxport.convert(lambda t: tf.sin(t), tf.TensorSpec([None, 2]))
    with pytest.raises(ArtifactError, match="host callbacks"):
      jaxport.export(cb_fn, cb_params, path=tmp_path / "b")


# --------------------------------------------------------------------------- tampering


@pytest.fixture
def small(tmp_path):
  """A small artifact (a Dense layer, 2 params) and a second one with other shapes."""
  import tf_keras
  dense = tf_keras.Sequential([tf_keras.layers.Dense(2, input_shape=(3,))])
  jax_fn, params = jaxport.convert(dense, _normal(1, 3))
  jaxport.export(jax_fn, params, path=tmp_path / "a", platforms=("cpu",))
  other = tf_keras.Sequential([tf_keras.layers.Dense(5, input_shape=(3,))])
  jax_fn, params = jaxport.convert(other, _normal(1, 3))
  jaxport.export(jax_fn, params, path=tmp_path / "b", platforms=("cpu",))
  return tmp_path / "a", tmp_path / "b"


def _edit_manifest(path, edit):
  manifest = json.loads((path / artifact.MANIFEST).read_text())
  edit(manifest)
  (path / artifact.MANIFEST).write_text(json.dumps(manifest))


def _rehash(path, name):
  import hashlib
  digest = hashlib.sha256((path / name).read_bytes()).hexdigest()
  _edit_manifest(path, lambda m: m["files"][name].update(sha256=digest))


def _set(keys, value):
  def edit(m):
    target = m
    for k in keys[:-1]:
      target = target[k]
    target[keys[-1]] = value
  return edit


TAMPERING = {
    "bad JSON": (lambda a, b: (a / artifact.MANIFEST).write_text('{"format": '), "jaxport.json.*not valid JSON"),
    "not an object": (lambda a, b: (a / artifact.MANIFEST).write_text("[1, 2]"), "jaxport.json.*not a JSON object"),
    "wrong version": (lambda a, b: _edit_manifest(a, _set(["format_version"], 99)), "format_version 99"),
    "unknown dtype": (lambda a, b: _edit_manifest(a, lambda m: m["params"][0].update(dtype="object")),
                      r"params\[0\].dtype = 'object'"),
    "bad shape": (lambda a, b: _edit_manifest(a, lambda m: m["params"][0].update(shape=[-1])), r"params\[0\].shape"),
    "leaf out of range": (lambda a, b: _edit_manifest(a, _set(["outputs", "structure"], {"kind": "leaf", "index": 7})),
                          "outputs.structure names array 7"),
    "unknown structure kind": (lambda a, b: _edit_manifest(a, _set(["outputs", "structure"], {"kind": "pickle"})),
                               "unknown kind 'pickle'"),
    "structure for other inputs": (lambda a, b: _edit_manifest(a, _set(["inputs", "structure"], {
        "kind": "tuple", "items": [{"kind": "tuple", "items": []}, {"kind": "dict", "keys": [], "items": []}]})),
        "inputs.structure does not use each"),
    "namedtuple with code": (lambda a, b: _edit_manifest(a, _set(["outputs", "structure"], {
        "kind": "namedtuple", "name": "T", "fields": ["x=__import__('os')"], "items": [{"kind": "leaf", "index": 0}]})),
        "not plain identifiers"),
    "extra payload": (lambda a, b: _edit_manifest(a, lambda m: m["files"].update({"../x": {"sha256": "0" * 64}})),
                      "field files lists"),
    "params changed": (lambda a, b: (a / artifact.PARAMS_FILE).write_bytes(
        (a / artifact.PARAMS_FILE).read_bytes()[:-4] + b"\0\0\0\0"), "params.safetensors: its SHA-256"),
    "function truncated": (lambda a, b: (a / artifact.FUNCTION_FILE).write_bytes(
        (a / artifact.FUNCTION_FILE).read_bytes()[:100]), "function.jaxexport: its SHA-256"),
    "params file missing": (lambda a, b: (a / artifact.PARAMS_FILE).unlink(), "params.safetensors is missing"),
    "manifest missing": (lambda a, b: (a / artifact.MANIFEST).unlink(), "jaxport.json is missing"),
    "params from another artifact": (lambda a, b: ((a / artifact.PARAMS_FILE).write_bytes(
        (b / artifact.PARAMS_FILE).read_bytes()), _rehash(a, artifact.PARAMS_FILE)), "params.safetensors: (tensor|its tensors)"),
    "function from another artifact": (lambda a, b: ((a / artifact.FUNCTION_FILE).write_bytes(
        (b / artifact.FUNCTION_FILE).read_bytes()), _rehash(a, artifact.FUNCTION_FILE)), "function.jaxexport: the"),
    "param renamed": (lambda a, b: _edit_manifest(a, lambda m: m["params"][0].update(name="other")),
                      "params.safetensors: its tensors do not match.*missing: other"),
    "param shape edited": (lambda a, b: _edit_manifest(a, lambda m: m["params"][0].update(shape=[3, 7])),
                           "function.jaxexport: the argument for .* manifest says float32\\[3, 7\\]"),
    "state output unknown": (lambda a, b: _edit_manifest(a, _set(["state_outputs"], ["nope"])), "state_outputs"),
}


@pytest.mark.parametrize("case", sorted(TAMPERING))
def test_tampered_artifacts_raise_artifact_error(small, case):
  a, b = small
  tamper, message = TAMPERING[case]
  tamper(a, b)
  with pytest.raises(ArtifactError, match=message) as info:
    jaxport.load(a)
  assert isinstance(info.value, ValueError)
  assert str(a) in str(info.value) and ("export" in str(info.value) or "restore" in str(info.value))


def test_export_refuses_a_directory_of_other_files_and_replaces_an_artifact(small, tmp_path):
  a, _ = small
  fn, params = jaxport.load(a)
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("keep me")
  jax_fn, p = jaxport.convert(lambda t: tf.cos(t), _normal(2))
  with pytest.raises(ArtifactError, match="holds other files"):
    jaxport.export(jax_fn, p, path=other)
  jaxport.export(jax_fn, p, path=a, platforms=("cpu",))   # an earlier artifact is replaced
  fn, params = jaxport.load(a)
  np.testing.assert_allclose(fn(params, np.zeros(2, np.float32))[0], np.ones(2))


def test_a_failed_export_leaves_an_earlier_artifact_and_no_new_directory(small, tmp_path):
  # The params are written while the function lowers; a lowering that fails must undo that.
  a, _ = small
  before = sorted(p.name for p in a.iterdir())
  jax_fn, p = jaxport.convert(lambda t: tf.cos(t), _normal(2))
  with pytest.raises(ArtifactError, match="vjp_order"):
    jaxport.export(jax_fn, p, path=a, vjp_order=7)
  assert sorted(p.name for p in a.iterdir()) == before
  fn, params = jaxport.load(a)
  assert fn(params, _normal(1, 3))[0].shape == (1, 2)
  with pytest.raises(ArtifactError, match="vjp_order"):
    jaxport.export(jax_fn, p, path=tmp_path / "new", vjp_order=7)
  assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- without TensorFlow

_BLOCK_TF = block_imports("tensorflow", "tf_keras", "keras")

_LOAD_AND_CALL = """
import sys
import jax, numpy as np
import jaxport
fn, params = jaxport.load(sys.argv[1])
x = np.load(sys.argv[2])
out, _ = jax.jit(fn)(params, x)
grads = jax.grad(lambda p: (fn(p, x)[0] ** 2).sum())(params)
np.save(sys.argv[3], np.asarray(out))
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "tf_keras", "keras"))
assert not loaded, loaded
print("OK", out.shape, len(grads))
"""


def _run_loader(python, cnn, tmp_path, prelude=""):
  _, _, fn, loaded, path = cnn
  x = _normal(2, 6, 6, 2)
  np.save(tmp_path / "x.npy", x)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["JAX_PLATFORMS"] = "cpu"
  result = subprocess.run([python, "-c", prelude + _LOAD_AND_CALL, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "OK (2, 4)" in result.stdout
  np.testing.assert_allclose(np.load(tmp_path / "y.npy"), fn(loaded, x)[0], atol=1e-5)


def test_load_works_with_tensorflow_imports_blocked(cnn, tmp_path):
  _run_loader(sys.executable, cnn, tmp_path, prelude=_BLOCK_TF)


# What `pip install jaxport` brings without the tf extra (pyproject dependencies and theirs).
_TF_FREE_PACKAGES = ("jax", "jaxlib", "numpy", "numpy.libs", "ml_dtypes", "opt_einsum", "scipy", "scipy.libs",
                     "safetensors", "flatbuffers", "tree", "absl", "attr", "attrs", "wrapt", "rich", "markdown_it",
                     "mdurl", "pygments", "typing_extensions.py")


@pytest.mark.slow
def test_load_works_in_a_virtualenv_without_tensorflow(cnn, tmp_path):
  """A fresh venv (no system site-packages) whose path holds links to jaxport's TF-free dependencies only."""
  import sysconfig
  site_packages = pathlib.Path(sysconfig.get_paths()["purelib"])
  deps = tmp_path / "deps"
  deps.mkdir()
  for name in _TF_FREE_PACKAGES:
    if (site_packages / name).exists():
      (deps / name).symlink_to(site_packages / name)
  base = getattr(sys, "_base_executable", sys.executable)
  venv = tmp_path / "venv"
  subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
  python = str(venv / "bin" / "python")
  venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
  pathlib.Path(venv_site, "jaxport_deps.pth").write_text(f"{deps}\n{SRC}\n")
  for module in ("tensorflow", "keras", "tf_keras"):
    probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
    assert probe.returncode != 0 and "ModuleNotFoundError" in probe.stderr, module
  _run_loader(python, cnn, tmp_path)


def test_export_records_versions_hashes_and_the_conversion_report(cnn):
  path = cnn[-1]
  manifest = json.loads((path / artifact.MANIFEST).read_text())
  assert manifest["format"] == "jaxport.artifact" and manifest["format_version"] == artifact.FORMAT_VERSION
  assert manifest["made_by"]["jax"] == jax.__version__ and manifest["made_by"]["tensorflow"] == tf.__version__
  assert manifest["made_by"]["jaxport"] == jaxport.__version__
  assert set(manifest["files"]) == {artifact.FUNCTION_FILE, artifact.PARAMS_FILE}
  assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
  assert manifest["conversion"]["converts"] and manifest["conversion"]["total"]["tiers"]["native"]["nodes"] > 0
  assert manifest["vjp_order"] == 0 and manifest["platforms"] == ["cpu", "cuda"]   # load's fn differentiates itself
  assert {p["name"] for p in manifest["params"]} == set(cnn[1])
  for name, entry in manifest["files"].items():
    assert entry["sha256"] == hashlib.sha256((path / name).read_bytes()).hexdigest()


@pytest.mark.parametrize("windows", [0, 0.5, 1, 1.5, 3])
def test_file_hashes_match_hashlib_across_window_bounds(tmp_path, monkeypatch, windows):
  import mmap
  from jaxport.artifact import _manifest
  monkeypatch.setattr(_manifest, "_HASH_WINDOW", mmap.ALLOCATIONGRANULARITY)   # windows of the smallest size
  data = np.random.default_rng(0).bytes(int(windows * mmap.ALLOCATIONGRANULARITY))
  (tmp_path / "f").write_bytes(data)
  assert _manifest.sha256_file(str(tmp_path / "f")) == hashlib.sha256(data).hexdigest()


def test_vjp_order_1_serializes_the_vjp_for_exported_call(tmp_path):
  w = _normal(3, 2)
  jax_fn, params = jaxport.convert(lambda t: tf.tanh(tf.matmul(t, w)), _normal(2, 3))
  x = _normal(2, 3)
  for order in (0, 1):
    manifest = jaxport.export(jax_fn, params, path=tmp_path / str(order), platforms=("cpu",), vjp_order=order)
    assert manifest["vjp_order"] == order
    fn, loaded = jaxport.load(tmp_path / str(order))
    expected = jax.grad(lambda v: jnp.sum(jax_fn(params, v)[0]))(x)
    np.testing.assert_allclose(jax.grad(lambda v: jnp.sum(fn(loaded, v)[0]))(x), expected, atol=1e-6)
    via_exported = lambda v: jnp.sum(fn.exported.call(*fn.flat_inputs(loaded, v))[0])
    if order:
      np.testing.assert_allclose(jax.grad(via_exported)(x), expected, atol=1e-6)
    else:
      with pytest.raises(ValueError, match="No VJP"):
        jax.grad(via_exported)(x)
  with pytest.raises(ArtifactError, match="vjp_order=2"):
    jaxport.export(jax_fn, params, path=tmp_path / "2", vjp_order=2)


def test_scalar_params_keep_their_shape(tmp_path):
  v = tf.Variable(2.0)
  x = _normal(3)
  jax_fn, params = jaxport.convert(tf.function(lambda t: t * v), x)
  jaxport.export(jax_fn, params, path=tmp_path / "a", platforms=("cpu",))
  fn, loaded = jaxport.load(tmp_path / "a")
  assert [p["shape"] for p in fn.manifest["params"]] == [[]]
  np.testing.assert_allclose(fn(loaded, x)[0], x * 2)
  np.testing.assert_allclose(jax_fn(loaded, x)[0], x * 2)   # the loaded params fit the converted function too


def test_complex128_params_inputs_and_outputs_round_trip_under_x64(tmp_path):
  """safetensors has no complex128: such params are stored as float64 (real, imag) pairs and read back bit
  for bit (infinite and NaN parts included), sharded reads too."""
  phase = tf.Variable(np.array([[1 + 2j, np.inf - 1j], [np.nan + 0.5j, -0.0 + 0j]], np.complex128))
  scale = tf.Variable(np.complex128(0.25 - 1j))   # 0-d

  @tf.function
  def spectrum(z):
    return tf.signal.fft(z * scale) + tf.reduce_sum(phase)

  z = (RNG.normal(size=(3, 4)) + 1j * RNG.normal(size=(3, 4))).astype(np.complex128)
  with jax.enable_x64(True):
    jax_fn, params = jaxport.convert(spectrum, z)
    jaxport.export(jax_fn, params, z, path=tmp_path / "c128", platforms=("cpu",))
    fn, loaded = jaxport.load(tmp_path / "c128")
    for key, value in params.items():
      assert loaded[key].dtype == np.complex128
      np.testing.assert_array_equal(_parts(loaded[key]), _parts(value))
    stored = fn.manifest["params"]
    assert sorted(p["dtype"] for p in stored) == ["complex128", "complex128"]
    out = fn(loaded, z)[0]
    assert out.dtype == np.complex128
    np.testing.assert_allclose(out, spectrum(z).numpy(), rtol=1e-12)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
    _, sharded = jaxport.load(tmp_path / "c128", sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    for key, value in params.items():
      np.testing.assert_array_equal(_parts(sharded[key]), _parts(value))


def _parts(z):
  """A complex array's (real, imag) bits, where NaN == NaN."""
  return np.asarray(z).reshape(-1).view(np.float64).view(np.uint64)
