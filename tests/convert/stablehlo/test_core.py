"""The StableHLO interpreter's core: loading, constants, regions, loops, errors."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxport
from jaxport.convert import stablehlo


def _exported(f, *args):
  exp = jax.export.export(jax.jit(f))(*args)
  return stablehlo.load_module(exp.mlir_module_serialized)


def _run(module, *args):
  return stablehlo.call_module(module, list(args))


def test_loads_portable_artifact_bytecode_and_text():
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  exp = jax.export.export(jax.jit(lambda x: jnp.sin(x) * 2))(x)
  from_artifact = stablehlo.load_module(exp.mlir_module_serialized)
  from_text = stablehlo.load_module(exp.mlir_module())
  for module in (from_artifact, from_text):
    np.testing.assert_allclose(_run(module, x)[0], np.sin(x) * 2, rtol=1e-6)


def test_bad_module_bytes_raise_a_typed_error():
  with pytest.raises(jaxport.StableHLOError, match="cannot read"):
    stablehlo.load_module(b"not a module")


@pytest.mark.parametrize("literal, dtype, expected", [
    ("dense<[1.0, 2.5]> : tensor<2xbf16>", ml_dtypes.bfloat16, [1.0, 2.5]),
    ("dense<[true, false]> : tensor<2xi1>", np.bool_, [True, False]),
    ("dense<[(1.0, 2.0), (3.0, -4.0)]> : tensor<2xcomplex<f32>>", np.complex64, [1 + 2j, 3 - 4j]),
    ("dense<0x7FC00000> : tensor<f32>", np.float32, np.nan),
    ("dense<0xFF80> : tensor<bf16>", ml_dtypes.bfloat16, -np.inf),
    ("dense<[200, 3]> : tensor<2xui8>", np.uint8, [200, 3]),
    ("dense<-7> : tensor<2x2xi64>", np.int64, np.full((2, 2), -7)),
])
def test_constants_of_every_dtype(literal, dtype, expected):
  ty = literal.split(" : ")[1]
  module = stablehlo.load_module(f"""
      func.func @main() -> {ty} {{
        %0 = stablehlo.constant {literal}
        return %0 : {ty}
      }}""")
  out = _run(module)[0]
  assert isinstance(out, np.ndarray) and out.dtype == np.dtype(dtype)   # constants stay NumPy
  np.testing.assert_array_equal(out.astype(np.complex128 if out.dtype.kind == "c" else np.float64),
                                np.asarray(expected, np.complex128 if out.dtype.kind == "c" else np.float64))


def test_counter_loops_run_as_scans_so_reverse_mode_works():
  f = lambda x: jax.lax.fori_loop(0, 4, lambda i, c: jnp.sin(c) * (i + 1), x)
  x = np.linspace(-1, 1, 5).astype(np.float32)
  module = _exported(f, x)
  g = lambda x: _run(module, x)[0]
  np.testing.assert_allclose(jax.jit(g)(x), f(x), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: g(x).sum())(x), jax.grad(lambda x: f(x).sum())(x), rtol=1e-5)
  assert "scan" in str(jax.make_jaxpr(g)(x))


def test_data_dependent_loops_run_as_while_loops():
  f = lambda x: jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0, x)
  x = np.ones(3, np.float32)
  module = _exported(f, x)
  g = lambda x: _run(module, x)[0]
  np.testing.assert_allclose(jax.jit(g)(x), f(x))
  tangent = jax.jvp(g, (x,), (x,))[1]
  np.testing.assert_allclose(tangent, jax.jvp(f, (x,), (x,))[1])


def test_cond_switch_and_calls_under_jit_vmap_jvp():
  def f(x, i):
    y = jax.lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * 3.0], x)
    return jax.lax.cond(y.sum() > 0, lambda: y + 1.0, lambda: y - 1.0)

  x, i = np.linspace(-2, 2, 4).astype(np.float32), np.int32(1)
  module = _exported(f, x, i)
  g = lambda x, i: _run(module, x, i)[0]
  for index in (0, 1, 2, 5):   # out-of-range indices clamp, as lax.switch does
    np.testing.assert_allclose(jax.jit(g)(x, np.int32(index)), f(x, np.int32(index)), rtol=1e-6)
  xs = np.stack([x, -x])
  np.testing.assert_allclose(jax.vmap(g, (0, None))(xs, i), jax.vmap(f, (0, None))(xs, i), rtol=1e-6)
  np.testing.assert_allclose(jax.jvp(lambda x: g(x, i), (x,), (x,))[1], jax.jvp(lambda x: f(x, i), (x,), (x,))[1],
                             rtol=1e-6)


def test_shape_polymorphic_modules_run_at_the_callers_shapes():
  f = lambda x: jnp.concatenate([x, jnp.flip(x) * 2.0]).reshape(-1, 2) * 3.0
  b, = jax.export.symbolic_shape("b")
  exp = jax.export.export(jax.jit(f))(jax.ShapeDtypeStruct((2 * b,), jnp.float32))
  module = stablehlo.load_module(exp.mlir_module_serialized)
  for n in (2, 6):
    x = np.arange(n, dtype=np.float32)
    np.testing.assert_allclose(jax.jit(lambda x: _run(module, x)[0])(x), f(x))
  with pytest.raises(jaxport.errors.ShapeAssertionError):
    _run(module, np.arange(3, dtype=np.float32))


def test_unknown_op_is_named_before_running():
  # MLIR refuses unregistered ops when parsing; an op without a handler is reported by name.
  module = stablehlo.load_module("""
      func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
        %0 = stablehlo.custom_call @some_vendor_kernel(%x) : (tensor<2xf32>) -> tensor<2xf32>
        return %0 : tensor<2xf32>
      }""")
  assert stablehlo.unsupported_ops(module) == {"stablehlo.custom_call @some_vendor_kernel": 1}
  with pytest.raises(jaxport.StableHLOError, match="some_vendor_kernel"):
    stablehlo.check_module(module)
