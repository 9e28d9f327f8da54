"""The `jaxport` command."""
import pytest
import tensorflow as tf

from jaxport import cli


def test_ops_lists_native_rules(capsys):
  assert cli.main(["ops"]) == 0
  out = capsys.readouterr().out
  assert "Conv2D" in out and "While" in out and "TensorListSetItem" in out


def test_check_reports_unsupported_ops_of_a_saved_model(tmp_path, capsys):
  module = tf.Module()
  module.ok = tf.function(lambda x: tf.sin(x), input_signature=[tf.TensorSpec([2], tf.float32)])
  module.bad = tf.function(lambda s: tf.strings.upper(s), input_signature=[tf.TensorSpec([], tf.string)])
  tf.saved_model.save(module, str(tmp_path), signatures={"ok": module.ok, "bad": module.bad})
  assert cli.main(["check", str(tmp_path)]) == 1
  out = capsys.readouterr().out
  assert "StringUpper" in out and "none" in out


@pytest.mark.slow
def test_demo_runs_and_matches_tf(capsys):
  assert cli.main(["demo", "--batch", "2", "--repeats", "2"]) == 0
  out = capsys.readouterr().out
  assert "max abs error" in out and "match TensorFlow" in out
