"""`jaxport.inspect`: the tier of every op a conversion would run, before anything runs."""
import io
import json
import warnings

import numpy as np
import pytest
import tensorflow as tf
from rich.console import Console

import jaxport
from jaxport.convert import registry, tiers
from jaxport.convert.registry import Tier

X = np.zeros((4, 3), np.float32)
RAW = tf.raw_ops


def rows(report):
  return {r.op: r for r in report.rows}


def rendered(report) -> str:
  console = Console(file=io.StringIO(), width=120)
  report.print(console)
  return console.file.getvalue()


def test_native_ops():
  w = tf.Variable(np.ones((3, 2), np.float32))
  report = jaxport.inspect(lambda x: tf.nn.relu(tf.matmul(tf.sin(x), w)), X)
  by_op = rows(report)
  assert {"Sin", "MatMul", "Relu", "ReadVariableOp"} <= set(by_op)
  assert "Placeholder" not in by_op   # graph inputs are not converted
  assert all(r.tier == Tier.NATIVE for r in report.rows)
  assert report.converts and not report.unsupported()
  assert by_op["Sin"].nodes == 1 and by_op["Sin"].examples == ("Sin",)
  assert report.nodes == sum(r.nodes for r in report.rows)
  assert report.tier_counts()["native"] == {"op_types": len(report.rows), "nodes": report.nodes}


def test_every_row_has_the_tier_op_tier_gives():
  # Ops that only TF's XLA lowering converts today; whichever still has no native rule is tier 2.
  def fn(x, m, v):
    return RAW.Cross(a=x, b=x), RAW.DiagPart(input=m), RAW.Bucketize(input=v, boundaries=[0.0, 1.0])

  report = jaxport.inspect(fn, X, np.zeros((3, 3), np.float32), np.zeros(5, np.float32))
  conf = jaxport.config.snapshot()
  for row in report.rows:
    assert row.tier == tiers.op_tier(row.op, conf), row
  xla_only = [op for op in ("Cross", "DiagPart", "Bucketize")
              if tiers.has_xla_kernel(op) and not registry.get_rule(op)]
  if not xla_only:
    pytest.skip("every candidate op has a native rule now")
  assert all(rows(report)[op].tier == Tier.STABLEHLO for op in xla_only)
  assert report.converts
  with jaxport.override_config("allow_xla_lowering", False), \
       jaxport.override_config("allow_host_callback", False):
    report = jaxport.inspect(fn, X, np.zeros((3, 3), np.float32), np.zeros(5, np.float32))
  assert set(xla_only) <= set(report.unsupported()) and not report.converts


def test_string_op_is_a_host_callback_or_unsupported_without_callbacks():
  fn = lambda s: tf.strings.upper(s)  # noqa: E731
  report = jaxport.inspect(fn, tf.TensorSpec([2], tf.string))
  assert rows(report)["StringUpper"].tier == Tier.CALLBACK and report.converts
  with jaxport.override_config("allow_host_callback", False):
    report = jaxport.inspect(fn, tf.TensorSpec([2], tf.string))
    with pytest.raises(jaxport.UnsupportedOperationsError) as e:   # convert agrees
      jaxport.convert(fn, tf.TensorSpec([2], tf.string))
  assert rows(report)["StringUpper"].tier == Tier.UNSUPPORTED
  assert not report.converts and set(report.unsupported()) == set(e.value.ops) == {"StringUpper"}
  text = rendered(report)
  assert "does not convert" in text and "unsupported" in text


def test_ops_inside_library_functions_are_counted():
  inner = tf.function(lambda x: tf.tanh(x) * 2.0)
  report = jaxport.inspect(tf.function(lambda x: inner(x) + 1.0), X)
  tanh = rows(report)["Tanh"]
  assert tanh.tier == Tier.NATIVE and "/" in tanh.examples[0]   # `function/node`


def test_json_and_rendering():
  report = jaxport.inspect(lambda x: tf.cos(x) + tf.sin(x), X)
  data = json.loads(report.to_json())
  assert data == report.to_dict()
  assert data["converts"] is True and data["total"]["op_types"] == len(report.rows)
  assert {row["op"]: row["tier"] for row in data["rows"]}["Cos"] == "native"
  text = rendered(report)
  assert "Cos" in text and "native" in text and "total" in text
  assert f"{len(report.rows)} op types" in text
  assert "op types" in str(report)


def test_restored_function_without_args(tmp_path):
  module = tf.Module()
  module.f = tf.function(lambda x: tf.exp(x), input_signature=[tf.TensorSpec([None, 3], tf.float32)])
  tf.saved_model.save(module, str(tmp_path))
  restored = tf.saved_model.load(str(tmp_path))
  assert "Exp" in rows(jaxport.inspect(restored.f))
  assert "Exp" in rows(jaxport.inspect(restored.signatures["serving_default"]))
  assert "Exp" in rows(jaxport.inspect(module.f.get_concrete_function()))


def test_keras_model():
  import keras
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="relu")])
  report = jaxport.inspect(model, X)
  assert {"MatMul", "Relu"} <= set(rows(report)) and report.converts
  assert report.name == model.name


def test_xla_call_module_lists_its_stablehlo_ops():
  jax2tf = pytest.importorskip("jax.experimental.jax2tf")
  import jax.numpy as jnp
  try:
    from jaxport.convert import stablehlo  # noqa: F401
  except Exception as e:   # the StableHLO reader is optional for inspect
    pytest.skip(f"jaxport.convert.stablehlo does not import: {e}")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)   # native_serialization is deprecated
    fn = tf.function(jax2tf.convert(lambda x: jnp.sin(x) @ x.T, native_serialization=True), autograph=False)
  report = jaxport.inspect(fn, tf.TensorSpec([2, 2], tf.float32))
  row = rows(report)["XlaCallModule"]
  assert {"stablehlo.sine", "stablehlo.dot_general"} <= set(row.stablehlo_ops), row
  assert row.tier == tiers.op_tier("XlaCallModule", jaxport.config.snapshot())
  assert "stablehlo_ops" in row.to_dict()
  assert "sine" in rendered(report)

