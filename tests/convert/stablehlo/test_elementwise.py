"""StableHLO elementwise handlers: regressions found by the interpreter fuzz (test_fuzz_interpreter.py).

Eager calls with NumPy inputs run the handlers' constant (NumPy) paths; `jax.jit` runs their lax paths.
Both must give XLA's values.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxport.convert import stablehlo


def _interpreted(f, *args):
  exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
  module = stablehlo.load_module(exp.mlir_module_serialized)
  return lambda *a: stablehlo.call_module(module, list(a))[0]


@pytest.mark.parametrize("scalar_bounds", [True, False])
def test_clamp_derivative_at_its_bounds_is_jaxs(scalar_bounds):
  # Emitted as max then min, clamp split the derivative between x and a bound equal to it (0.5 each).
  f = lambda lo, x, hi: lax.clamp(lo, x, hi)
  x = np.float32([-1.0, 0.0, 0.5, 1.0, 2.0])
  lo, hi = (np.float32(0.0), np.float32(1.0)) if scalar_bounds else (np.zeros(5, np.float32), np.ones(5, np.float32))
  g = _interpreted(f, lo, x, hi)
  loss = lambda fn: lambda lo, x, hi: jnp.sum(fn(lo, x, hi) * np.arange(1, 6, dtype=np.float32))
  # JAX cannot transpose lax.clamp with scalar bounds and an array x: its reference broadcasts them.
  ref = lambda lo, x, hi: lax.clamp(jnp.broadcast_to(lo, x.shape), x, jnp.broadcast_to(hi, x.shape))
  want = jax.grad(loss(ref), (0, 1, 2))(lo, x, hi)
  for got in (jax.grad(loss(g), (0, 1, 2))(lo, x, hi), jax.jit(jax.grad(loss(g), (0, 1, 2)))(lo, x, hi)):
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(jax.jit(g)(lo, x, hi), f(lo, x, hi))


@pytest.mark.parametrize("src, dst", [(np.float16, np.int16), (np.float16, np.uint16), (np.float32, np.int32),
                                      (np.float32, np.uint8)])
def test_float_to_int_convert_of_constants_saturates_as_xla(src, dst):
  # The NumPy path clipped in the source type: f16 rounds int16's max 32767 to 32768, which wrapped to -32768.
  x = np.array([np.inf, -np.inf, np.nan, 1e9, -1e9, 65504, -136.5, 0.9], src)
  f = lambda x: lax.convert_element_type(x, dst)
  g = _interpreted(f, x)
  want = np.asarray(jax.jit(f)(x))
  np.testing.assert_array_equal(g(x), want)          # NumPy constants in, the constant path
  np.testing.assert_array_equal(jax.jit(g)(x), want)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.int8, np.int32])
def test_arithmetic_right_shift_of_unsigned_constants_shifts_in_the_sign_bit(dtype):
  # XLA's arithmetic shift treats the bits as signed for unsigned types too; NumPy's >> on them is logical.
  bits = np.dtype(dtype).itemsize * 8
  x = np.array([np.iinfo(dtype).max, np.iinfo(dtype).min, 74, 27, 1, 0]).astype(dtype)
  y = np.array([4, 1, 0, bits, bits - 1, 3]).astype(dtype)
  f = lambda x, y: lax.shift_right_arithmetic(x, y)
  g = _interpreted(f, x, y)
  want = np.asarray(jax.jit(f)(x, y))
  np.testing.assert_array_equal(g(x, y), want)
  np.testing.assert_array_equal(jax.jit(g)(x, y), want)


@pytest.mark.parametrize("sigmoid", [lax.logistic, jax.nn.sigmoid, jax.nn.silu, jax.nn.log_sigmoid])
def test_logistic_gradient_where_exp_overflows_is_finite(sigmoid):
  # jax.export writes lax.logistic as 1 / (1 + exp(-x)); below x = -88 exp(-x) is inf and that expansion's
  # derivative inf / inf is NaN. patterns.py runs it as lax.logistic (derivative 0 there).
  x = np.array([-100.0, -1e30, -np.inf, -20.0, 0.0, 3.0, 100.0], np.float32)
  g = _interpreted(sigmoid, x)
  np.testing.assert_array_equal(jax.jit(g)(x), jax.jit(sigmoid)(x))
  want = jax.grad(lambda x: sigmoid(x).sum())(x)
  for grad in (jax.grad(lambda x: g(x).sum()), jax.jit(jax.grad(lambda x: g(x).sum()))):
    np.testing.assert_allclose(grad(x), want, rtol=1e-6)
  t = np.linspace(-1, 1, x.size).astype(np.float32)
  np.testing.assert_allclose(jax.jvp(g, (x,), (t,))[1], jax.jvp(sigmoid, (x,), (t,))[1], rtol=1e-6)


def test_max_with_zero_differentiates_as_relu():
  # jax.nn.relu and TF's Relu export as max(x, 0); at x = 0 their derivative is 0 (lax.max's tie rule: 1/2).
  # A converted CNN's zero-initialised biases put many inputs exactly there: fine-tuning from the artifact must
  # see the converted function's (and TF's) gradient.
  x = np.float32([-1.0, 0.0, -0.0, 2.0])
  for f in (jax.nn.relu, lambda x: lax.max(x, jnp.zeros_like(x)), lambda x: lax.max(np.float32(0), x)):
    g = _interpreted(lambda x: jnp.sum(f(x) * np.arange(1, 5, dtype=np.float32)), x)
    np.testing.assert_array_equal(jax.grad(g)(x), [0, 0, 0, 4])
    np.testing.assert_array_equal(jax.jit(g)(x), 8.0)
  nan = np.float32([np.nan, 1.0])
  g = _interpreted(lambda x: jax.nn.relu(x), nan)
  np.testing.assert_array_equal(jax.jit(g)(nan), jax.nn.relu(nan))   # NaN propagates as lax.max's does


def test_a_value_times_itself_differentiates_as_one_square():
  # jnp.square (Keras 3's BatchNorm variance, SquaredDifference) exports as multiply(x, x). Differentiated
  # as a product, its gradient is two terms summed (x*g + g*x), which XLA:CPU fused into slower loops:
  # a BatchNorm + depthwise block's loaded training step ran 1.7x the converted one.
  x = np.float32([-2.0, -0.5, 0.0, 1.5, 3.0])
  g = _interpreted(lambda x: jnp.square(x - 0.25), x)
  np.testing.assert_array_equal(jax.jit(g)(x), np.square(x - np.float32(0.25)))
  loss = lambda x: jnp.sum(g(x) * np.arange(1, 6, dtype=np.float32))
  np.testing.assert_allclose(jax.grad(loss)(x), 2 * (x - 0.25) * np.arange(1, 6), rtol=1e-6)
  t = np.ones_like(x)
  np.testing.assert_allclose(jax.jvp(g, (x,), (t,))[1], 2 * (x - 0.25), rtol=1e-6)
  np.testing.assert_array_equal(jax.vmap(g)(x[:, None])[:, 0], np.square(x - np.float32(0.25)))
  primitives = [e.primitive.name for e in jax.make_jaxpr(jax.grad(loss))(x).jaxpr.eqns]
  assert "add_any" not in primitives, primitives   # one term
  big = np.float32([-3e38, 3e38])   # the tangent overflows where the product rule's does, no sooner
  np.testing.assert_array_equal(jax.jvp(lambda x: x * x, (big,), (np.float32([0.5, 0.5]),))[1],
                                jax.jvp(_interpreted(lambda x: x * x, big), (big,), (np.float32([0.5, 0.5]),))[1])


def test_logaddexp_and_softplus_keep_jaxs_derivative_at_a_tie():
  # jnp.logaddexp's custom_jvp rule is not in the module; at a == b its ops' derivative is max's tie plus abs's
  # kink (softplus'(0) = -1/2). patterns.py runs the expansion as jnp.logaddexp.
  x = np.array([0.0, -0.0, 1.0, -30.0, 80.0, -np.inf], np.float32)
  g = _interpreted(jax.nn.softplus, x)
  want = jax.grad(lambda x: jax.nn.softplus(x).sum())(x)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: g(x).sum()))(x), want, rtol=1e-6)
  a, b = np.float32([0.5, 2.0, -1.0]), np.float32([0.5, -3.0, 4.0])
  h = _interpreted(jnp.logaddexp, a, b)
  grads = jax.grad(lambda a, b: h(a, b).sum(), argnums=(0, 1))(a, b)
  for got, expected in zip(grads, jax.grad(lambda a, b: jnp.logaddexp(a, b).sum(), argnums=(0, 1))(a, b)):
    np.testing.assert_allclose(got, expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(h)(a, b), jnp.logaddexp(a, b), rtol=1e-6)
