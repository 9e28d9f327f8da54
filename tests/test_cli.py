"""The `jaxport` command."""
import json
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import tensorflow as tf

import jaxport
from jaxport import cli


def test_ops_lists_native_rules(capsys):
  assert cli.main(["ops"]) == 0
  out = capsys.readouterr().out
  assert "Conv2D" in out and "While" in out and "TensorListSetItem" in out


# --------------------------------------------------------------------------- inspect


pytestmark = pytest.mark.usefixtures("restore_cli_env")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """A SavedModel with signatures, one without, a .keras file (Keras 3) and a .h5 file (tf_keras)."""
  root = tmp_path_factory.mktemp("models")
  module = tf.Module()
  module.ok = tf.function(lambda x: tf.sin(x), input_signature=[tf.TensorSpec([2], tf.float32)])
  module.text = tf.function(lambda s: tf.strings.upper(s), input_signature=[tf.TensorSpec([], tf.string)])
  tf.saved_model.save(module, str(root / "signatures"), signatures={"ok": module.ok, "text": module.text})

  plain = tf.Module()
  plain.f = tf.function(lambda x: tf.nn.relu(x) * 2.0)
  plain.f(tf.zeros([3]))
  plain.f(tf.zeros([2, 2]))
  plain.inner = tf.Module()
  plain.inner.g = tf.function(lambda x: tf.tanh(x), input_signature=[tf.TensorSpec([None], tf.float32)])
  tf.saved_model.save(plain, str(root / "no_signatures"), signatures={})

  import keras
  inputs = keras.Input((4,))
  keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs)).save(str(root / "model.keras"))
  tf_keras = pytest.importorskip("tf_keras")
  legacy = tf_keras.Sequential([tf_keras.layers.Dense(3, activation="tanh", input_shape=(5,))])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)   # "HDF5 is a legacy format"
    legacy.save(str(root / "model.h5"))
  return root


def test_inspect_saved_model_with_signatures(models, capsys):
  assert cli.main(["inspect", str(models / "signatures")]) == 0
  out = capsys.readouterr().out
  assert "ok: converts" in out and "text: converts" in out
  assert "StringUpper" in out and "callback" in out and "Sin" in out and "total" in out
  with jaxport.override_config("allow_host_callback", False):
    assert cli.main(["inspect", str(models / "signatures")]) == 1
  out = capsys.readouterr().out
  assert "text: does not convert" in out and "unsupported" in out


def test_inspect_one_signature_as_json(models, capsys):
  assert cli.main(["inspect", str(models / "signatures"), "--signature", "ok", "--json"]) == 0
  data = json.loads(capsys.readouterr().out)
  assert data["converts"] is True and [f["name"] for f in data["functions"]] == ["ok"]
  assert {row["op"]: row["tier"] for row in data["functions"][0]["rows"]}["Sin"] == "native"
  assert cli.main(["inspect", str(models / "signatures"), "--signature", "nope"]) == 2
  err = capsys.readouterr().err
  assert "'nope'" in err and "ok, text" in err and len(err.strip().splitlines()) == 1


def test_inspect_saved_model_without_signatures(models, capsys):
  # `jaxport check` used to print an empty table for it and exit 0.
  assert cli.main(["inspect", str(models / "no_signatures"), "--json"]) == 0
  data = json.loads(capsys.readouterr().out)
  names = [f["name"] for f in data["functions"]]
  assert names == ["f#0 (float32[3])", "f#1 (float32[2,2])", "inner.g"]
  assert all(f["rows"] for f in data["functions"])
  assert "Tanh" in {row["op"] for row in data["functions"][2]["rows"]}


def test_inspect_keras_files(models, capsys):
  for name, ops in (("model.keras", {"MatMul", "Softmax"}), ("model.h5", {"MatMul", "Tanh"})):
    assert cli.main(["inspect", str(models / name), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert ops <= {row["op"] for row in data["functions"][0]["rows"]}, name
  assert cli.main(["inspect", str(models / "model.keras")]) == 0
  out = capsys.readouterr().out
  assert "model.keras" in out and "MatMul" in out and "total" in out


def test_check_is_an_alias_of_inspect(models, capsys):
  assert cli.main(["check", str(models / "signatures")]) == 0
  captured = capsys.readouterr()
  assert captured.err.strip() == f"jaxport check is now jaxport inspect; running: jaxport inspect {models / 'signatures'}"
  assert "StringUpper" in captured.out


def _run_cli(*args, env=None):
  return subprocess.Popen([sys.executable, "-m", "jaxport.cli", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)


def test_cli_as_a_module_prints_no_tensorflow_noise(models):
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  proc = _run_cli("inspect", str(models / "model.keras"), "--json", env=env)
  out, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err
  assert json.loads(out)["converts"] is True
  assert err == ""


def test_bad_inputs_give_one_line_and_exit_2(models, tmp_path):
  (tmp_path / "empty").mkdir()
  pb = (models / "signatures" / "saved_model.pb").read_bytes()
  flipped = bytes(b ^ 0xFF if i % 97 == 0 else b for i, b in enumerate(pb))
  cases = {"missing": (tmp_path / "missing", "does not exist"),
           "empty": (tmp_path / "empty", "is empty"),
           "truncated": (_saved_model_copy(models, tmp_path / "truncated", pb[:len(pb) // 2]), "corrupt"),
           "bit flips": (_saved_model_copy(models, tmp_path / "flipped", flipped), "corrupt")}
  procs = {name: _run_cli("inspect", str(path)) for name, (path, _) in cases.items()}   # concurrently
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=300)
    path, expected = cases[name]
    assert proc.returncode == 2 and out == "", (name, out, err)
    assert len(err.strip().splitlines()) == 1, (name, err)
    assert err.startswith(f"jaxport inspect: {path}") and expected in err, (name, err)


def test_more_bad_inputs_in_process(models, tmp_path, capsys):
  pb = (models / "signatures" / "saved_model.pb").read_bytes()
  (tmp_path / "notes.txt").write_text("not a model")
  (tmp_path / "broken.keras").write_bytes((models / "model.keras").read_bytes()[:200])
  cases = {"text file": (tmp_path / "notes.txt", "not a model file"),
           "op name flipped": (_saved_model_copy(models, tmp_path / "renamed",
                                                 pb.replace(b"StringUpper", b"StrinwUpper")), "cannot load"),
           "broken .keras file": (tmp_path / "broken.keras", "cannot be loaded as a Keras model"),
           "no saved_model.pb": (models, "has no saved_model.pb")}
  for name, (path, expected) in cases.items():
    assert cli.main(["inspect", str(path)]) == 2, name
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1, (name, captured)
    assert captured.err.startswith(f"jaxport inspect: {path}") and expected in captured.err, (name, captured)
  assert cli.main(["inspect", str(tmp_path / "renamed"), "--debug"]) == 2
  err = capsys.readouterr().err
  assert "Traceback" in err and err.strip().splitlines()[-1].startswith("jaxport inspect:")


def _saved_model_copy(models, target, saved_model_pb: bytes):
  shutil.copytree(models / "signatures", target)
  (target / "saved_model.pb").write_bytes(saved_model_pb)
  return target


@pytest.mark.slow
def test_demo_runs_and_matches_tf(capsys):
  assert cli.main(["demo", "--batch", "2", "--repeats", "2"]) == 0
  out = capsys.readouterr().out
  assert "max abs error" in out and "match TensorFlow" in out


# --------------------------------------------------------------------------- GraphDef files


def _v1_graph_def():
  from tf1_oracle import v1_graph
  with v1_graph() as graph:
    x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
    i = tf.constant(0)
    _, y = tf.compat.v1.while_loop(lambda i, y: i < 4, lambda i, y: (i + 1, y * 2.0), [i, x])
    tf.identity(tf.compat.v1.cond(tf.reduce_sum(y) > 0, lambda: y, lambda: -y), name="out")
  return graph.as_graph_def()


def test_inspect_reports_a_graph_def_file_with_v1_control_flow(tmp_path, capsys):
  tf.io.write_graph(_v1_graph_def(), str(tmp_path), "model.pb", as_text=False)
  tf.io.write_graph(_v1_graph_def(), str(tmp_path), "model.pbtxt", as_text=True)
  for name in ("model.pb", "model.pbtxt"):
    assert cli.main(["inspect", str(tmp_path / name), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    ops = {row["op"]: row["tier"] for r in report["functions"] for row in r["rows"]}
    assert {"Switch", "Merge", "Enter", "Exit", "NextIteration", "LoopCond"} <= set(ops), ops
    assert set(ops.values()) == {"native"}, ops


def test_graph_def_file_errors(tmp_path, capsys):
  (tmp_path / "junk.pb").write_bytes(b"\xff\x00not a graph")
  (tmp_path / "empty.pb").write_bytes(b"")
  assert cli.main(["inspect", str(tmp_path / "junk.pb")]) == 2
  assert "not a readable GraphDef" in capsys.readouterr().err
  assert cli.main(["inspect", str(tmp_path / "empty.pb")]) == 2
  assert "no graph nodes" in capsys.readouterr().err
  tf.io.write_graph(_v1_graph_def(), str(tmp_path), "model.pb", as_text=False)
  assert cli.main(["convert", str(tmp_path / "model.pb"), str(tmp_path / "art")]) == 2
  assert "convert_graph_def" in capsys.readouterr().err
