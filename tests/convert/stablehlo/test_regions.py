"""Elementwise regions differentiated through their forward derivative (`stablehlo/regions.py`), and
composites that run as the op they name."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxport.convert import stablehlo
from jaxport.convert.stablehlo import regions

# Each is written by jax.export as pieces chosen by select (erfc: exact GELU).
SELECT_EXPANDED = {
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "erfc": lax.erfc,
    "erf_inv": lambda x: lax.erf_inv(0.99 * jnp.tanh(x)),
    "lgamma": lambda x: lax.lgamma(jnp.abs(x) + 0.1),
    "digamma": lambda x: lax.digamma(jnp.abs(x) + 0.1),
    "log_ndtr": jax.scipy.special.log_ndtr,
}
# Zeros, tiny and large magnitudes: where the piece not taken overflows or divides by zero.
X = np.array([0.0, 1e-30, -1e-20, 0.3, -0.7, 1.5, -3.0, 6.0, -9.0, 30.0, -40.0, 1e4], np.float32)
W = np.linspace(-1, 1, X.size).astype(np.float32)


def _interpreted(f, x):
  module = stablehlo.load_module(jax.export.export(jax.jit(f))(x).mlir_module_serialized)
  return lambda *args: stablehlo.call_module(module, list(args))[0]


@pytest.mark.parametrize("name", sorted(SELECT_EXPANDED))
def test_select_expanded_functions_differentiate_like_jax(name):
  f = lambda x: SELECT_EXPANDED[name](x) * W
  g = _interpreted(f, X)
  np.testing.assert_allclose(g(X), f(X), rtol=1e-6, atol=1e-30)
  loss, loss_g = (lambda x: jnp.sum(f(x))), (lambda x: jnp.sum(g(x)))
  expected = jax.grad(loss)(X)
  assert np.all(np.isfinite(expected))
  for grad in (jax.grad(loss_g), jax.jit(jax.grad(loss_g))):
    np.testing.assert_allclose(grad(X), expected, rtol=2e-5, atol=1e-6)
  t = np.cos(X)
  np.testing.assert_allclose(jax.jvp(g, (X,), (t,))[1], jax.jvp(f, (X,), (t,))[1], rtol=2e-5, atol=1e-6)
  batch = np.stack([X, X[::-1]])
  np.testing.assert_allclose(jax.vmap(jax.grad(loss_g))(batch), jax.vmap(jax.grad(loss))(batch), rtol=2e-5, atol=1e-6)


def test_second_derivative_of_exact_gelu():
  f = lambda x: jnp.sum(jax.nn.gelu(x, approximate=False))
  g = _interpreted(f, X)
  np.testing.assert_allclose(jax.grad(jax.grad(lambda x: g(x[None] * X).sum()))(np.float32(1.0)),
                             jax.grad(jax.grad(lambda x: f(x[None] * X)))(np.float32(1.0)), rtol=1e-4)


def test_region_is_one_custom_jvp_call_and_other_users_still_see_its_values():
  # |x| is read by the region's select and, later, by a reduction outside it.
  def f(x):
    x = jnp.asarray(x)
    y = jnp.where(jnp.abs(x) < 1, jnp.sqrt(jnp.abs(x)), 1 / x)
    return y * 2, jnp.sum(jnp.abs(x))
  x = np.array([0.0, 0.5, -2.0, 4.0], np.float32)
  module = stablehlo.load_module(jax.export.export(jax.jit(f))(x).mlir_module_serialized)
  before, skipped = regions.block_regions(module.main.block, module)
  assert [len(r) for r in before.values()] == [1] and skipped
  run = lambda x: stablehlo.call_module(module, [x])
  jaxpr = str(jax.make_jaxpr(run)(x))
  assert jaxpr.count("custom_jvp_call") == 1
  np.testing.assert_allclose(run(x)[0], f(x)[0])
  np.testing.assert_allclose(run(x)[1], f(x)[1])
  # JAX's own gradient is NaN at 0 (0 * inf from the sqrt piece's derivative); the region's is the derivative
  # of the piece taken (the sqrt's, infinite at 0 itself) and finite elsewhere.
  grad = jax.grad(lambda x: run(x)[0].sum())(np.array([1e-3, 0.5, -2.0, 4.0], np.float32))
  np.testing.assert_allclose(grad, jax.grad(lambda x: f(x)[0].sum())(np.array([1e-3, 0.5, -2.0, 4.0], np.float32)),
                             rtol=1e-5)


def test_regions_of_two_traced_values_are_left_alone():
  f = lambda x, m: jnp.where(m > 0, jnp.log(x), -jnp.inf)   # attention-style mask: two roots
  x, m = np.ones(4, np.float32), np.array([1, 0, 1, 0], np.float32)
  module = stablehlo.load_module(jax.export.export(jax.jit(f))(x, m).mlir_module_serialized)
  assert regions.block_regions(module.main.block, module) == ({}, set())


@pytest.mark.parametrize("fn, primitive", [(lax.erf, "erf"), (jnp.sinh, "sinh"), (jnp.arcsinh, "asinh"),
                                           (jnp.arctanh, "atanh"), (jnp.arccos, "acos")])
def test_chlo_composites_run_as_the_op_they_name(fn, primitive):
  x = np.linspace(-0.9, 0.9, 7).astype(np.float32)
  exported = jax.export.export(jax.jit(fn))(x)
  assert "stablehlo.composite" in exported.mlir_module()
  module = stablehlo.load_module(exported.mlir_module_serialized)
  run = lambda x: stablehlo.call_module(module, [x])[0]
  assert f"{primitive} " in str(jax.make_jaxpr(run)(x))   # lax's own op, not the decomposition
  np.testing.assert_allclose(run(x), fn(x), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: run(x).sum())(x), jax.grad(lambda x: fn(x).sum())(x), rtol=1e-5)


def test_regions_that_start_at_the_same_op_all_run():
  # Both regions read the constant %c1, defined after their first ops: both start just after it.
  module = stablehlo.load_module("""
      func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
        %a = stablehlo.abs %x : tensor<4xf32>
        %b = stablehlo.abs %y : tensor<4xf32>
        %c1 = stablehlo.constant dense<1.0> : tensor<4xf32>
        %p = stablehlo.compare LT, %a, %c1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
        %r1 = stablehlo.select %p, %x, %a : tensor<4xi1>, tensor<4xf32>
        %q = stablehlo.compare LT, %b, %c1 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
        %r2 = stablehlo.select %q, %y, %b : tensor<4xi1>, tensor<4xf32>
        return %r1, %r2 : tensor<4xf32>, tensor<4xf32>
      }""")
  before, _ = regions.block_regions(module.main.block, module)
  assert sorted(len(r) for r in before.values()) == [2]
  x = np.float32([-2, 0.5, 3, -0.1])
  f = lambda x, y: (jnp.where(jnp.abs(x) < 1, x, jnp.abs(x)), jnp.where(jnp.abs(y) < 1, y, jnp.abs(y)))
  for got, want in zip(stablehlo.call_module(module, [x, -x]), f(x, -x)):
    np.testing.assert_array_equal(got, want)
  grads = jax.grad(lambda x, y: sum(o.sum() for o in stablehlo.call_module(module, [x, y])), argnums=(0, 1))(x, -x)
  for got, want in zip(grads, jax.grad(lambda x, y: sum(o.sum() for o in f(x, y)), argnums=(0, 1))(x, -x)):
    np.testing.assert_array_equal(got, want)


def test_region_over_a_large_input_whose_splat_constants_are_staged():
  # Splat constants over more than a few KiB run as broadcast ops (traced values under jit); the region
  # must still run as one custom_jvp (the pieces not taken overflow near 0: NaN through select's transpose).
  x = np.linspace(-0.01, 0.01, 100_000, dtype=np.float32)
  f = lambda x: jnp.sum(jax.nn.gelu(x, approximate=False) * jnp.cos(x))
  g = _interpreted(f, x)
  expected = jax.grad(f)(x)
  for grad in (jax.grad(g), jax.jit(jax.grad(g))):
    np.testing.assert_allclose(grad(x), expected, rtol=2e-5, atol=1e-6)
  t = np.sin(x)
  np.testing.assert_allclose(jax.jit(lambda x, t: jax.jvp(g, (x,), (t,))[1])(x, t), jax.jvp(f, (x,), (t,))[1],
                             rtol=1e-4)
  np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(g)))(np.stack([x, -x])),
                             jax.vmap(jax.grad(f))(np.stack([x, -x])), rtol=2e-5, atol=1e-6)
