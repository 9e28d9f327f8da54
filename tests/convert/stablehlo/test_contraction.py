"""StableHLO dot_general, convolution, fft, cholesky and triangular_solve, from jax.export modules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hlo_support import as_fn, exported
from jaxport.convert import stablehlo



def _interpreted(f, *args, platforms=("cpu",)):
  module, _ = exported(f, *args, platforms=platforms)
  return as_fn(module), module


def _close(a, b, tol):
  np.testing.assert_allclose(np.asarray(a, np.float64 if np.asarray(a).dtype.kind != "c" else np.complex128),
                             np.asarray(b, np.float64 if np.asarray(b).dtype.kind != "c" else np.complex128),
                             rtol=tol, atol=tol)


def _check(f, *args, ops=(), grad=None, vmap=True, tol=1e-5, platforms=("cpu",)):
  """g matches f under jit, in dtype too; optionally its gradient and jvp, and vmap over args[0].

  Everything runs under jit: eager op-by-op dispatch compiles every op separately (slow).
  """
  g, module = _interpreted(f, *args, platforms=platforms)
  for op in ops:
    assert op in module.op_names(), module.op_names()
  args = [jnp.asarray(a) for a in args]
  want, got = f(*args), jax.jit(g)(*args)
  assert got.dtype == want.dtype and got.shape == want.shape
  _close(got, want, tol)
  if grad is not None:
    loss = lambda fn: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.abs(jnp.sin(fn(*a)))), grad))
    jax.tree.map(lambda a, b: _close(a, b, tol), loss(g)(*args), loss(f)(*args))
    tangents = tuple(jnp.ones_like(a) for a in args)
    jvp = lambda fn: jax.jit(lambda *a: jax.jvp(fn, a, tangents)[1])
    _close(jvp(g)(*args), jvp(f)(*args), tol)
  if vmap:
    batch = jnp.stack([args[0], args[0] * 2])
    mapped = lambda fn: jax.jit(jax.vmap(lambda x: fn(x, *args[1:])))
    _close(mapped(g)(batch), mapped(f)(batch), tol)
  return g


rng = np.random.default_rng(0)


def _rand(*shape, dtype=np.float32):
  return rng.standard_normal(shape).astype(dtype)


# --------------------------------------------------------------------------- dots

def test_matmul():
  _check(lambda a, b: a @ b, _rand(2, 3), _rand(3, 4), ops=["stablehlo.dot_general"], grad=(0, 1))


def test_batched_einsum():
  f = lambda a, b: jnp.einsum("bij,bjk->bki", a, b)
  _check(f, _rand(2, 3, 4), _rand(2, 4, 5), ops=["stablehlo.dot_general"], grad=(0, 1))


def test_bf16_inputs_accumulate_in_f32():
  f = lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
  a, b = _rand(2, 8).astype(jnp.bfloat16), _rand(8, 3).astype(jnp.bfloat16)
  g = _check(f, a, b, grad=(0, 1), tol=1e-2)
  assert g(a, b).dtype == jnp.float32


def test_int8_dot_to_int32():
  f = lambda a, b: lax.dot(a, b, preferred_element_type=jnp.int32)
  a = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
  g = _check(f, a, a.T.copy(), vmap=False)
  np.testing.assert_array_equal(g(a, a.T.copy()), a.astype(np.int32) @ a.T.astype(np.int32))


def test_precision_and_algorithm_attributes():
  _check(lambda a, b: jnp.dot(a, b, precision="highest"), _rand(2, 3), _rand(3, 2))
  g, module = _interpreted(lambda a, b: lax.dot(a, b, precision=lax.DotAlgorithmPreset.BF16_BF16_F32),
                           _rand(2, 3), _rand(3, 2))
  op, = [op for op in module.main.block.ops if op.name == "stablehlo.dot_general"]
  assert "bf16" in op.attrs["algorithm"]
  a, b = _rand(2, 3), _rand(3, 2)
  _close(jax.jit(g)(a, b), lax.dot(a, b, precision=lax.DotAlgorithmPreset.BF16_BF16_F32), 1e-6)


def test_legacy_dot_and_einsum_ops():
  module = stablehlo.load_module("""
    func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x4xf32>) -> (tensor<2x4xf32>, tensor<4x2xf32>, tensor<2xf32>) {
      %0 = stablehlo.dot %a, %b : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32>
      %1 = "stablehlo.einsum"(%a, %b) {einsum_config = "ij,jk->ki"}
          : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<4x2xf32>
      %2 = "stablehlo.unary_einsum"(%a) {einsum_config = "ij->i"} : (tensor<2x3xf32>) -> tensor<2xf32>
      return %0, %1, %2 : tensor<2x4xf32>, tensor<4x2xf32>, tensor<2xf32>
    }""")
  a, b = _rand(2, 3), _rand(3, 4)
  out = jax.jit(lambda a, b: stablehlo.call_module(module, [a, b]))(a, b)
  for got, want in zip(out, (a @ b, (a @ b).T, a.sum(1))):
    _close(got, want, 1e-5)


# --------------------------------------------------------------------------- convolutions

def _conv(lhs_spec, rhs_spec, out_spec, **kw):
  return lambda x, w: lax.conv_general_dilated(x, w, dimension_numbers=(lhs_spec, rhs_spec, out_spec), **kw)


@pytest.mark.parametrize("spec, x_shape, w_shape, kw", [
    (("NWC", "WIO", "NWC"), (1, 7, 2), (3, 2, 3), dict(window_strides=(2,), padding="SAME")),
    (("NHWC", "HWIO", "NHWC"), (1, 6, 5, 2), (3, 3, 2, 4), dict(window_strides=(1, 1), padding="SAME")),
    (("NCHW", "OIHW", "NCHW"), (2, 2, 6, 5), (4, 2, 3, 2), dict(window_strides=(2, 1), padding=((1, 0), (0, 2)))),
    (("NHWC", "HWIO", "NHWC"), (1, 7, 7, 2), (3, 3, 2, 2), dict(window_strides=(1, 1), padding="VALID",
                                                                rhs_dilation=(2, 2))),
    (("NHWC", "HWIO", "NHWC"), (1, 5, 5, 4), (3, 3, 2, 6), dict(window_strides=(1, 1), padding="SAME",
                                                                feature_group_count=2)),
    (("NHWC", "HWIO", "NHWC"), (1, 5, 5, 3), (3, 3, 1, 3), dict(window_strides=(2, 2), padding="SAME",
                                                                feature_group_count=3)),   # depthwise
    (("NDHWC", "DHWIO", "NDHWC"), (1, 4, 4, 4, 1), (2, 2, 2, 1, 2), dict(window_strides=(1, 2, 1),
                                                                        padding="SAME")),
    # Mixed layouts and negative padding: the filter tangent's tap GEMMs transpose to NHWC/HWIO and back.
    (("NHWC", "OHWI", "NCHW"), (2, 7, 6, 3), (4, 3, 2, 3), dict(window_strides=(2, 1), padding=((-1, 1), (0, -1)),
                                                                rhs_dilation=(1, 2))),
    (("CHWN", "IHWO", "HWCN"), (3, 6, 6, 2), (3, 2, 2, 5), dict(window_strides=(1, 2), padding="SAME")),
])
def test_convolutions_and_their_gradients(spec, x_shape, w_shape, kw):
  # The gradients are convolutions with lhs dilation, batch_group_count and swapped dims.
  _check(_conv(*spec, **kw), _rand(*x_shape), _rand(*w_shape), ops=["stablehlo.convolution"], grad=(0, 1),
         tol=1e-4)


def test_loaded_conv_filter_gradient_is_dots_not_a_conv_on_cpu():
  # As converted TF convs differentiate (conv_lowering.with_tap_filter_grad): an exported 2-D conv's
  # filter gradient is one dot per tap on CPU, not XLA:CPU's slower filter-gradient conv.
  f = _conv("NHWC", "HWIO", "NHWC", window_strides=(2, 2), padding="SAME")
  x, w = _rand(2, 16, 16, 3), _rand(7, 7, 3, 8)
  g, _ = _interpreted(f, x, w)
  lowered = lambda argnums: jax.jit(jax.grad(lambda x, w: jnp.sum(g(x, w) ** 2), argnums)).lower(x, w).as_text()
  only_w = lowered(1)
  assert only_w.count("stablehlo.convolution") == 1 and only_w.count("stablehlo.dot_general") >= 49
  assert lowered((0, 1)).count("stablehlo.convolution") == 2
  for got, want in zip(jax.grad(lambda x, w: jnp.sum(g(x, w) ** 2), (0, 1))(x, w),
                       jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), (0, 1))(x, w)):
    _close(got, want, 1e-4)


def test_gradient_module_conv_keeps_xla_filter_gradient():
  # A filter-gradient conv read back from a module has the output gradient as its window (16x16 here):
  # differentiated again, it stays one conv rather than 256 traced taps.
  f = _conv("NHWC", "HWIO", "NHWC", window_strides=(1, 1), padding="VALID")
  x, w = _rand(1, 18, 18, 2), _rand(3, 3, 2, 4)
  wgrad = jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), 1)
  g, _ = _interpreted(wgrad, x, w)
  second = lambda fn: jax.jit(jax.grad(lambda x, w: jnp.sum(fn(x, w) ** 2), 0))
  assert second(g).lower(x, w).as_text().count("stablehlo.dot_general") == 0
  _close(second(g)(x, w), second(wgrad)(x, w), 1e-4)


def test_gradient_modules_interpret_directly():
  f = _conv("NHWC", "HWIO", "NHWC", window_strides=(2, 2), padding="SAME", feature_group_count=2)
  x, w = _rand(2, 5, 5, 4), _rand(3, 3, 2, 4)
  grad = jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), (0, 1))
  g, module = _interpreted(grad, x, w)
  convs = [op for fn in module.functions.values() for op in fn.block.ops if op.name == "stablehlo.convolution"]
  assert any(op.attrs.get("batch_group_count", 1) > 1 for op in convs)
  assert any(op.attrs.get("lhs_dilation") for op in convs)
  for got, want in zip(g(x, w), grad(x, w)):
    _close(got, want, 1e-4)


def test_conv_transpose():
  f = lambda x, w: lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
  _check(f, _rand(1, 3, 3, 2), _rand(3, 3, 2, 3), ops=["stablehlo.convolution"], grad=(0, 1), tol=1e-4)


def test_window_reversal():
  module = stablehlo.load_module("""
    func.func @main(%x: tensor<1x5x1xf32>, %w: tensor<3x1x1xf32>) -> tensor<1x3x1xf32> {
      %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, f]x[0, i, o]->[b, 0, f],
          window = {stride = [1], pad = [[0, 0]], reverse = [true]}
          {batch_group_count = 1 : i64, feature_group_count = 1 : i64}
          : (tensor<1x5x1xf32>, tensor<3x1x1xf32>) -> tensor<1x3x1xf32>
      return %0 : tensor<1x3x1xf32>
    }""")
  x = np.arange(5, dtype=np.float32).reshape(1, 5, 1)
  w = np.array([1, 10, 100], np.float32).reshape(3, 1, 1)
  got = stablehlo.call_module(module, [x, w])[0]
  want = _conv("NWC", "WIO", "NWC", window_strides=(1,), padding="VALID")(x, w[::-1])
  np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- fft

@pytest.mark.parametrize("name, fn, dtype, shape", [
    ("fft", jnp.fft.fft, np.complex64, (3, 8)),
    ("ifft", jnp.fft.ifft, np.complex64, (8,)),
    ("rfft", jnp.fft.rfft, np.float32, (2, 8)),
    ("irfft", jnp.fft.irfft, np.complex64, (2, 5)),
    ("fft2", jnp.fft.fft2, np.complex64, (4, 6)),
    ("rfftn", jnp.fft.rfftn, np.float32, (2, 4, 6)),
    ("irfftn", jnp.fft.irfftn, np.complex64, (2, 4, 4)),
])
def test_fft(name, fn, dtype, shape):
  x = _rand(*shape).astype(dtype)
  if dtype == np.complex64:
    x = x + 1j * _rand(*shape)
  _check(fn, x.astype(dtype), ops=["stablehlo.fft"], grad=0 if dtype == np.float32 else None, tol=1e-4)


# --------------------------------------------------------------------------- cholesky, triangular_solve
# jax lowers these to LAPACK custom calls on CPU, to the StableHLO ops for TPU: export for TPU.

def _spd(n, batch=()):
  a = _rand(*batch, n, n)
  return a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=np.float32)


def test_cholesky():
  f = lambda a: lax.linalg.cholesky(a, symmetrize_input=False)
  g, module = _interpreted(f, _spd(3, (2,)), platforms=["tpu"])
  assert "stablehlo.cholesky" in module.op_names()
  a = _spd(3, (2,))
  _close(g(a), np.linalg.cholesky(a), 1e-5)
  _close(jax.jit(g)(a), np.linalg.cholesky(a), 1e-5)
  tangent = _spd(3, (2,))
  _close(jax.jvp(g, (a,), (tangent,))[1], jax.jvp(f, (a,), (tangent,))[1], 1e-4)


def test_cholesky_upper_reads_the_upper_triangle():
  module = stablehlo.load_module("""
    func.func @main(%a: tensor<3x3xf32>) -> tensor<3x3xf32> {
      %0 = stablehlo.cholesky %a, lower = false : tensor<3x3xf32>
      return %0 : tensor<3x3xf32>
    }""")
  a = _spd(3)
  got = np.asarray(stablehlo.call_module(module, [np.triu(a)])[0])
  _close(np.triu(got), np.linalg.cholesky(a).T, 1e-5)


@pytest.mark.parametrize("left_side, lower, transpose_a, conjugate_a, unit_diagonal", [
    (True, True, False, False, False),
    (True, False, True, False, True),
    (False, True, True, True, False),
    (False, False, False, False, False),
])
def test_triangular_solve(left_side, lower, transpose_a, conjugate_a, unit_diagonal):
  f = lambda a, b: lax.linalg.triangular_solve(a, b, left_side=left_side, lower=lower, transpose_a=transpose_a,
                                               conjugate_a=conjugate_a, unit_diagonal=unit_diagonal)
  a = _spd(3, (2,))
  b = _rand(2, 3, 2) if left_side else _rand(2, 2, 3)
  g, module = _interpreted(f, a, b, platforms=["tpu"])
  assert "stablehlo.triangular_solve" in module.op_names()
  _close(g(a, b), f(a, b), 1e-5)
  _close(jax.jit(g)(a, b), f(a, b), 1e-5)
  grads = jax.grad(lambda a, b: jnp.sum(g(a, b) ** 2), (0, 1))(a, b)
  want = jax.grad(lambda a, b: jnp.sum(f(a, b) ** 2), (0, 1))(a, b)
  jax.tree.map(lambda x, y: _close(x, y, 1e-4), grads, want)


def test_triangular_solve_adjoint_complex():
  f = lambda a, b: lax.linalg.triangular_solve(a, b, left_side=True, lower=True, transpose_a=True,
                                               conjugate_a=True)
  a = (_spd(3) + 1j * np.tril(_rand(3, 3), -1)).astype(np.complex64)
  b = (_rand(3, 2) + 1j * _rand(3, 2)).astype(np.complex64)
  g, _ = _interpreted(f, a, b, platforms=["tpu"])
  _close(g(a, b), f(a, b), 1e-5)
