"""`jaxport convert` (model file → TF-free artifact) and `jaxport bench` (converted vs TF graph vs TF XLA)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport import cli


pytestmark = pytest.mark.usefixtures("restore_cli_env")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """A tiny Keras 3 CNN (.keras) and a SavedModel whose signature has a free batch dim."""
  import keras
  root = tmp_path_factory.mktemp("models")
  keras.utils.set_random_seed(0)
  inputs = keras.Input((6, 6, 1))
  x = keras.layers.Flatten()(keras.layers.Conv2D(2, 3, activation="relu")(inputs))
  model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
  model.save(str(root / "cnn.keras"))
  inputs = keras.Input((6, 6, 2))
  x = keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(4, 3, activation="relu")(inputs))
  pooled = keras.Model(inputs, keras.layers.Dense(3)(x))   # no Flatten: the batch dim can stay symbolic
  pooled.save(str(root / "pooled.keras"))

  module = tf.Module()
  module.w = tf.Variable(np.arange(8, dtype=np.float32).reshape(4, 2) / 8)
  module.f = tf.function(lambda x: {"y": tf.tanh(tf.matmul(x, module.w))},
                         input_signature=[tf.TensorSpec([None, 4], tf.float32)])
  module.g = tf.function(lambda x: x * 2.0, input_signature=[tf.TensorSpec([3], tf.float32)])
  tf.saved_model.save(module, str(root / "saved"), signatures={"serving_default": module.f, "double": module.g})

  sized = tf.Module()   # a size computed in floats from the batch: no symbolic batch dim can flow through it
  sized.f = tf.function(lambda x: tf.reduce_sum(x, axis=1) + tf.reduce_sum(
      tf.ones([tf.cast(tf.sqrt(tf.cast(tf.shape(x)[0], tf.float32)), tf.int32)])),
                        input_signature=[tf.TensorSpec([None, 2], tf.float32)])
  tf.saved_model.save(sized, str(root / "batch_sized"), signatures={"serving_default": sized.f})
  return root, model, pooled


def test_convert_keras_file(models, tmp_path, capsys):
  root, model, _ = models
  out = tmp_path / "cnn"
  assert cli.main(["convert", str(root / "cnn.keras"), str(out), "--platforms", "cpu"]) == 0
  captured = capsys.readouterr()
  printed = captured.out
  assert captured.err == ""   # Keras 3's Flatten reads the batch size with a Shape op: it stays symbolic
  for text in ("jaxport convert", "function", "cnn.keras", "args[0]", "float32[b, 6, 6, 1]", "params",
               "function.jaxexport", "params.safetensors", "native", "jaxport.load"):
    assert text in printed, text
  fn, params = jaxport.load(out)
  for batch in (1, 3):
    x = np.random.RandomState(batch).normal(size=(batch, 6, 6, 1)).astype(np.float32)
    np.testing.assert_allclose(jax.jit(fn)(params, x)[0], model(x).numpy(), atol=1e-6)


def test_convert_splits_params_over_shard_files(models, tmp_path, capsys):
  root, model, _ = models
  out = tmp_path / "cnn"
  assert cli.main(["convert", str(root / "cnn.keras"), str(out), "--platforms", "cpu", "--max-shard-bytes", "64B",
                   "--json"]) == 0
  files = sorted(p.name for p in out.iterdir())
  shards = [f for f in files if f.startswith("params-")]
  assert len(shards) > 1 and jaxport.artifact.PARAMS_INDEX in files and jaxport.artifact.PARAMS_FILE not in files
  fn, params = jaxport.load(out)
  x = np.random.RandomState(0).normal(size=(2, 6, 6, 1)).astype(np.float32)
  np.testing.assert_allclose(jax.jit(fn)(params, x)[0], model(x).numpy(), atol=1e-6)
  assert cli.main(["convert", str(root / "cnn.keras"), str(tmp_path / "o"), "--max-shard-bytes", "lots"]) == 2
  assert "--max-shard-bytes 'lots'" in capsys.readouterr().err


def test_convert_falls_back_to_batch_1_with_a_note(models, tmp_path, capsys):
  root, *_ = models
  out = tmp_path / "sized"
  assert cli.main(["convert", str(root / "batch_sized"), str(out), "--platforms", "cpu"]) == 0
  note, = capsys.readouterr().err.strip().splitlines()
  for text in ("jaxport convert: note:", "cannot keep a symbolic batch dim (while converting Fill node",
               "wrote an artifact for batch 1", "--batch N"):
    assert text in note, note
  fn, params = jaxport.load(out)
  x = np.float32([[1.0, 2.0]])
  out, _ = fn(params, x=x)
  np.testing.assert_allclose(jax.tree.leaves(out)[0], [4.0], atol=1e-6)


def test_convert_saved_model_as_json_batch_polymorphic(models, tmp_path, capsys):
  root, *_ = models
  out = tmp_path / "saved"
  assert cli.main(["convert", str(root / "saved"), str(out), "--batch-polymorphic", "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary["function"] == "serving_default" and summary["platforms"] == ["cpu", "cuda"]
  assert summary["inputs"] == [{"name": "x", "shape": ["b", 4], "dtype": "float32"}]
  assert summary["outputs"][0]["shape"] == ["b", 2] and summary["params"]["tensors"] == 1
  assert set(summary["files"]) == {"function.jaxexport", "params.safetensors"}
  assert set(summary["seconds"]) == {"load", "convert", "lower", "write"}
  fn, params = jaxport.load(out)
  w = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
  for batch in (1, 3):
    x = np.ones((batch, 4), np.float32)
    np.testing.assert_allclose(fn(params, x=x)[0]["y"], np.tanh(x @ w), atol=1e-6)
  # the other signature, by name; a second run replaces the artifact
  assert cli.main(["convert", str(root / "saved"), str(out), "--signature", "double", "--platforms", "cpu"]) == 0
  fn, params = jaxport.load(out)
  np.testing.assert_allclose(fn(params, x=np.ones(3, np.float32))[0]["output_0"], 2 * np.ones(3))


def test_convert_keras_file_keeps_an_unknown_batch_dim_symbolic(models, tmp_path, capsys):
  root, _, model = models
  out = tmp_path / "pooled"
  assert cli.main(["convert", str(root / "pooled.keras"), str(out), "--platforms", "cpu", "--json"]) == 0
  captured = capsys.readouterr()
  summary = json.loads(captured.out)
  assert captured.err == "" and summary["batch_polymorphic"] and summary["batch_fallback"] is None
  assert summary["inputs"][0]["shape"] == ["b", 6, 6, 2] and summary["outputs"][0]["shape"] == ["b", 3]
  fn, params = jaxport.load(out)
  for batch in (1, 4, 7):
    x = np.random.RandomState(batch).normal(size=(batch, 6, 6, 2)).astype(np.float32)
    np.testing.assert_allclose(jax.jit(fn)(params, x)[0], model(x).numpy(), atol=1e-5)
  # --batch N: that fixed batch instead
  assert cli.main(["convert", str(root / "pooled.keras"), str(tmp_path / "fixed"), "--batch", "3", "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert not summary["batch_polymorphic"] and summary["inputs"][0]["shape"] == [3, 6, 6, 2]


def test_a_converted_artifact_runs_any_batch_without_tensorflow(models, tmp_path):
  """`jaxport convert` here, then load and call in a process where TensorFlow cannot be imported."""
  from test_artifact import _BLOCK_TF
  root, _, model = models
  out = tmp_path / "pooled"
  assert cli.main(["convert", str(root / "pooled.keras"), str(out), "--platforms", "cpu"]) == 0
  script = _BLOCK_TF + """
import sys
import jax, numpy as np
import jaxport
fn, params = jaxport.load(sys.argv[1])
for batch in (1, 4, 7):
  x = np.random.RandomState(batch).normal(size=(batch, 6, 6, 2)).astype(np.float32)
  np.save(f"{sys.argv[2]}/y{batch}.npy", np.asarray(jax.jit(fn)(params, x)[0]))
assert not [m for m in sys.modules if m.partition(".")[0] in ("tensorflow", "tf_keras", "keras")]
print("OK")
"""
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  env["JAX_PLATFORMS"] = "cpu"
  result = subprocess.run([sys.executable, "-c", script, str(out), str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
  assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
  for batch in (1, 4, 7):
    x = np.random.RandomState(batch).normal(size=(batch, 6, 6, 2)).astype(np.float32)
    np.testing.assert_allclose(np.load(tmp_path / f"y{batch}.npy"), model(x).numpy(), atol=1e-5)


@pytest.mark.parametrize("case", ["missing", "not a model", "platform", "out not empty", "signature", "bench missing",
                                  "batch and polymorphic"])
def test_bad_input_gives_one_line_and_exit_2(models, tmp_path, capsys, case):
  root, *_ = models
  (tmp_path / "notes.txt").write_text("x")
  full = tmp_path / "full"
  full.mkdir()
  (full / "keep.txt").write_text("x")
  argv, expected = {
      "missing": (["convert", str(tmp_path / "nope.keras"), str(tmp_path / "o")], "does not exist"),
      "not a model": (["convert", str(tmp_path / "notes.txt"), str(tmp_path / "o")], "not a model file"),
      "platform": (["convert", str(root / "cnn.keras"), str(tmp_path / "o"), "--platforms", "cpu,gpu2"], "gpu2"),
      "out not empty": (["convert", str(root / "cnn.keras"), str(full)], "not an empty directory"),
      "signature": (["convert", str(root / "saved"), str(tmp_path / "o"), "--signature", "nope"],
                    "pick one of: serving_default, double"),
      "bench missing": (["bench", str(tmp_path / "nope")], "does not exist"),
      "batch and polymorphic": (["convert", str(root / "cnn.keras"), str(tmp_path / "o"), "--batch", "2",
                                 "--batch-polymorphic"], "not with --batch-polymorphic"),
  }[case]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert expected in err and len(err.strip().splitlines()) == 1, err
  assert err.startswith(f"jaxport {argv[0]}: ")
  assert not (tmp_path / "o").exists()


def test_a_model_that_cannot_be_exported_gives_one_line_and_exit_1(models, tmp_path, capsys):
  root, *_ = models
  assert cli.main(["convert", str(root / "batch_sized"), str(tmp_path / "o"), "--batch-polymorphic"]) == 1
  err = capsys.readouterr().err
  assert "symbolic batch dim" in err and "Fill node" in err and len(err.strip().splitlines()) == 1


def test_convert_as_a_process_exits_2_for_a_missing_path(tmp_path):
  result = subprocess.run([sys.executable, "-m", "jaxport", "convert", str(tmp_path / "nope"), str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2 and result.stdout == ""
  assert result.stderr.strip().splitlines() == [
      f"jaxport convert: {tmp_path / 'nope'} does not exist; pass a SavedModel directory or a .keras / .h5 file."]


def test_bench_prints_a_table_and_writes_a_png(models, tmp_path, capsys):
  root, *_ = models
  png = tmp_path / "bench.png"
  assert cli.main(["bench", str(root / "cnn.keras"), "--batch", "2", "--repeats", "2", "--plot", str(png)]) == 0
  printed = capsys.readouterr().out
  for text in ("jaxport bench", "jaxport (jit)", "TF graph", "TF XLA", "steady state ms", "plot written"):
    assert text in printed, text
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_as_json(models, capsys):
  root, *_ = models
  assert cli.main(["bench", str(root / "saved"), "--batch", "2", "--repeats", "1", "--json"]) == 0
  row = json.loads(capsys.readouterr().out)
  assert row["name"] == "serving_default" and row["batch"] == 2 and row["max_abs_err"] < 1e-5
  assert all(row[k] > 0 for k in ("convert_s", "compile_s", "jax_run_s", "tf_run_s", "tf_xla_run_s"))


def test_inspect_still_works_beside_the_new_commands(models, capsys):
  root, *_ = models
  assert cli.main(["inspect", str(root / "cnn.keras"), "--json"]) == 0
  assert json.loads(capsys.readouterr().out)["converts"] is True
