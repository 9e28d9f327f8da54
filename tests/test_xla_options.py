"""`jaxport.jit`: jax.jit with the XLA options jaxport picks per converted function (jaxport.xla_options)."""
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from jax import lax

import jaxport
from jaxport import xla_options


def _conv_chain(x, k1, k2):
  """Two 3x3 convs, a ReLU and a max-pool: the chain XLA:CPU outlines into one YNNPACK fusion."""
  conv = lambda a, k: lax.conv_general_dilated(a, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  y = jax.nn.relu(conv(jax.nn.relu(conv(x, k1)), k2))
  return lax.reduce_window(y, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")


def _chain_args():
  rs = np.random.RandomState(0)
  return (rs.randn(1, 32, 32, 32).astype(np.float32), rs.randn(3, 3, 32, 32).astype(np.float32) * 0.1,
          rs.randn(3, 3, 32, 32).astype(np.float32) * 0.1)


def _library_fusions(hlo_text: str) -> int:
  """How many YNNPACK (library) fusions an optimised HLO module runs."""
  return len(re.findall(r'"kind":"__ynn_fusion"', hlo_text))


def _converted(tf_fn, *args):
  jax_fn, params = jaxport.convert(tf.function(tf_fn), *args)
  return jax_fn, params


@pytest.fixture(scope="module")
def conv_net():
  x, k1, k2 = _chain_args()
  fn = lambda x: tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME")), k2, 1, "SAME")),
                                  2, 2, "VALID")
  return _converted(fn, x) + (x,)


def test_conv_net_gets_the_conv_options_and_matches_jax_jit(conv_net):
  jax_fn, params, x = conv_net
  assert "Conv2D" in jax_fn.op_types
  for form in (jax_fn, jax_fn.outputs_only, jax_fn.with_changed_params, jax_fn.returning("outputs")):
    assert xla_options.compiler_options(form) == xla_options.CONV_NET_CPU_OPTIONS
  np.testing.assert_allclose(jaxport.jit(jax_fn.outputs_only)(params, x), jax.jit(jax_fn.outputs_only)(params, x),
                             rtol=1e-5, atol=1e-5)


def test_other_functions_keep_xla_defaults():
  jax_fn, _ = _converted(lambda a, b: tf.nn.relu(tf.matmul(a, b)), np.ones((2, 3), np.float32),
                         np.ones((3, 4), np.float32))
  assert xla_options.compiler_options(jax_fn) == {}
  assert xla_options.compiler_options(_conv_chain) == {}   # not a converted function
  assert xla_options.compiler_options(None) == {}


def test_conv_options_take_convolutions_away_from_ynnpack(conv_net):
  jax_fn, params, x = conv_net
  default_text = jax.jit(jax_fn.outputs_only).lower(params, x).compile().as_text()
  if jax.default_backend() != "cpu" or _library_fusions(default_text) == 0:
    pytest.skip("this backend/jaxlib runs no YNNPACK fusions")
  tuned_text = jaxport.jit(jax_fn.outputs_only).lower(params, x).compile().as_text()
  assert _library_fusions(tuned_text) == 0


def test_caller_options_win(monkeypatch, conv_net):
  seen = {}
  real_jit = jax.jit

  def spy(fun, **kwargs):
    seen.update(kwargs.get("compiler_options") or {})
    return real_jit(fun, **kwargs)

  monkeypatch.setattr(xla_options.jax, "jit", spy)
  key = next(iter(xla_options.CONV_NET_CPU_OPTIONS))
  xla_options.jit(conv_net[0], compiler_options={key: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"})
  assert seen == {key: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def test_refused_option_warns_and_falls_back(monkeypatch, conv_net):
  monkeypatch.setattr(xla_options, "CONV_NET_CPU_OPTIONS", {"xla_cpu_no_such_option_for_jaxport_tests": True})
  with pytest.warns(RuntimeWarning, match="refuses the tuned XLA options"):
    assert xla_options.compiler_options(conv_net[0]) == {}
  jax_fn, params, x = conv_net
  assert jaxport.jit(jax_fn.outputs_only)(params, x).shape == (1, 16, 16, 32)


def test_xla_flags_line_sets_the_options_process_wide():
  """The documented XLA_FLAGS route, in a fresh process (flags are read once, at JAX start)."""
  code = textwrap.dedent(f"""
      import jax, sys
      sys.path.insert(0, {os.path.dirname(__file__)!r})
      from test_xla_options import _chain_args, _conv_chain, _library_fusions
      print("FUSIONS", _library_fusions(jax.jit(_conv_chain).lower(*_chain_args()).compile().as_text()))
  """)
  env = dict(os.environ, XLA_FLAGS=xla_options.xla_flags_line(), JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "FUSIONS 0" in result.stdout, result.stdout


def test_a_loaded_conv_net_gets_the_same_options(conv_net, tmp_path):
  jax_fn, params, x = conv_net
  jaxport.export(jax_fn, params, path=tmp_path / "net", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "net")
  assert loaded.has_convolutions
  for form in (loaded, loaded.outputs_only, loaded.with_changed_params, loaded.returning("outputs")):
    assert xla_options.compiler_options(form) == xla_options.CONV_NET_CPU_OPTIONS
  step = jaxport.jit(loaded.outputs_only)
  hlo = step.lower(loaded_params, x).compile().as_text()
  assert _library_fusions(hlo) == 0
  np.testing.assert_allclose(step(loaded_params, x), jax_fn.outputs_only(params, x), rtol=1e-5, atol=1e-5)


def test_a_loaded_function_without_convolutions_keeps_xla_defaults(tmp_path):
  jax_fn, params = _converted(lambda a, b: tf.nn.relu(tf.matmul(a, b)), np.ones((2, 3), np.float32),
                              np.ones((3, 4), np.float32))
  jaxport.export(jax_fn, params, path=tmp_path / "mlp", platforms=("cpu",))
  loaded, _ = jaxport.load(tmp_path / "mlp")
  assert not loaded.has_convolutions and xla_options.compiler_options(loaded.outputs_only) == {}


def _fusions_holding_conv_and_dot(hlo_text: str) -> int:
  """How many YNNPACK fusions of an optimised HLO module hold both a convolution and a dot."""
  bodies = dict(re.findall(r"^(%[\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo_text, re.S | re.M))
  called = re.findall(r"calls=(%[\w.\-]+)[^\n]*\"kind\":\"__ynn_fusion\"", hlo_text)
  return sum(1 for name in called if " convolution(" in bodies.get(name, "") and " dot(" in bodies.get(name, ""))


def _conv_trunk_with_dense_head():
  """Two convs, a max-pool, then two dense layers: a tiny VGG."""
  rs = np.random.RandomState(1)
  x = rs.randn(2, 16, 16, 3).astype(np.float32)
  k1, k2 = rs.randn(3, 3, 3, 32).astype(np.float32) * 0.2, rs.randn(3, 3, 32, 32).astype(np.float32) * 0.1
  w1, w2 = rs.randn(8 * 8 * 32, 64).astype(np.float32) * 0.05, rs.randn(64, 32).astype(np.float32) * 0.1

  def fn(x):
    y = tf.nn.relu(tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME")), k2, 1, "SAME"))
    y = tf.reshape(tf.nn.max_pool2d(y, 2, 2, "VALID"), (2, -1))
    return tf.nn.relu(tf.matmul(tf.nn.relu(tf.matmul(y, w1)), w2))
  return fn, x


def test_dense_layers_are_not_fused_with_the_conv_trunk_under_plain_jit(monkeypatch):
  """The speed of a plain `jax.jit` (XLA's default options): YNNPACK runs a conv trunk outlined
  together with the dense layers after it ~10x slower, so each MatMul's input is a fusion boundary."""
  fn, x = _conv_trunk_with_dense_head()
  jax_fn, params = _converted(fn, x)
  plain = jax.jit(jax_fn.outputs_only)
  np.testing.assert_allclose(plain(params, x), fn(x).numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jaxport.jit(jax_fn.outputs_only)(params, x), plain(params, x), rtol=1e-5, atol=1e-6)
  hlo = plain.lower(params, x).compile().as_text()
  assert _fusions_holding_conv_and_dot(hlo) == 0
  if jax.default_backend() != "cpu":
    return
  assert "reduce-precision(" in hlo
  # The control: without the boundary this jaxlib outlines convs and dots together (else nothing to show).
  monkeypatch.setattr(xla_options, "fusion_boundary", lambda a: a)
  unbounded, params = _converted(fn, x)
  if _fusions_holding_conv_and_dot(jax.jit(unbounded.outputs_only).lower(params, x).compile().as_text()) == 0:
    pytest.skip("this jaxlib does not outline convolutions and dots into one YNNPACK fusion")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_fusion_boundary_is_exact_under_every_transform(dtype):
  info = jnp.finfo(dtype)
  special = [0.0, -0.0, np.inf, -np.inf, np.nan, float(info.max), float(info.tiny), float(info.smallest_subnormal),
             -float(info.smallest_subnormal), 1 + float(info.eps), -3.25]
  x = jnp.asarray(np.array(special + list(np.random.RandomState(0).randn(21) * 1e3), np.float32)).astype(dtype)
  bits = lambda v: np.asarray(lax.bitcast_convert_type(v, jnp.uint16 if dtype != jnp.float32 else jnp.uint32))
  for run in (xla_options.fusion_boundary, jax.jit(xla_options.fusion_boundary)):
    np.testing.assert_array_equal(bits(run(x)), bits(x))
  finite = jnp.where(jnp.isfinite(x), x, 0).astype(jnp.float32)
  np.testing.assert_array_equal(jax.grad(lambda v: jnp.sum(xla_options.fusion_boundary(v) * v))(finite), 2 * finite)
  np.testing.assert_array_equal(jax.jvp(xla_options.fusion_boundary, (finite,), (finite * 3,))[1], finite * 3)
  np.testing.assert_array_equal(jax.vmap(xla_options.fusion_boundary)(finite.reshape(4, -1)), finite.reshape(4, -1))
  ints = np.arange(4, dtype=np.int32)
  assert xla_options.fusion_boundary(ints) is ints   # concrete and non-float values pass through
