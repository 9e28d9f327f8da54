"""BandedTriangularSolve and MatrixSquareRoot against TF: values, gradients, batching, edge cases.

64-bit cases run under `jax.enable_x64` and are held to 1e-10. Complex gradients go through
tf.complex of real inputs (the oracle differentiates real inputs only); TF's MatrixSquareRoot
gradient is wrong for complex inputs, so its complex derivative is checked against TF's own
Frechet derivative (the corner block of sqrtm([[A, E], [0, A]])) instead.
"""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport import config
from jaxport.convert import tiers
from jaxport.convert.host_callback import HostCallbackWarning
from jaxport.convert.ops import linalg_special
from jaxport.convert.registry import Tier
from jaxport.errors import InvalidNodeError
from oracle import VIA_ARTIFACT, check, run_rule

RAW = tf.raw_ops
TIGHT = dict(atol=1e-10, rtol=1e-10)


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


def complex_normal(*shape, seed=0, dtype=np.complex64):
  re, im = normal(*shape, seed=seed, dtype=np.float64), normal(*shape, seed=seed + 1, dtype=np.float64)
  return (re + 1j * im).astype(dtype)


def parts(z):
  return tf.math.real(z), tf.math.imag(z)


def bands_of(*shape, lower=True, seed=0, dtype=np.float32):
  """Random bands [..., K, N] with a diagonal (row 0 lower, row K-1 upper) kept away from zero."""
  bands = normal(*shape, seed=seed, dtype=dtype)
  diagonal_row = 0 if lower else shape[-2] - 1
  bands[..., diagonal_row, :] = np.sign(bands[..., diagonal_row, :]) * (2 + np.abs(bands[..., diagonal_row, :]))
  return bands


def banded(lower, adjoint):
  return lambda m, r: RAW.BandedTriangularSolve(matrix=m, rhs=r, lower=lower, adjoint=adjoint)


def positive_spectrum(*shape, seed=0, dtype=np.float32, spd=False):
  """Well-conditioned matrices with eigenvalues in the right half plane (general: complex pairs too)."""
  n = shape[-1]
  g = normal(*shape, seed=seed, dtype=np.float64)
  a = g @ np.swapaxes(g, -1, -2) + n * np.eye(n) if spd else g + 2.5 * np.sqrt(n) * np.eye(n)
  return a.astype(dtype)


def sqrtm(a):
  return RAW.MatrixSquareRoot(input=a)


# --------------------------------------------------------------------------- BandedTriangularSolve


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("adjoint", [False, True])
def test_banded_solve_layouts_with_broadcast_batch(lower, adjoint):
  """3 bands of a 5x5 matrix; matrix batch (2, 1) against rhs batch (4,): eager, jit, grad, vmap."""
  check(banded(lower, adjoint), bands_of(2, 1, 3, 5, lower=lower), normal(4, 5, 2, seed=1),
        atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_bands", [1, 2, 6])
@pytest.mark.parametrize("lower", [True, False])
def test_banded_solve_band_counts(num_bands, lower):
  """A diagonal matrix, a bidiagonal one, and the full triangle (K == N). TF cannot differentiate
  K == 1 (its gradient's diagonal part drops the band axis): there, the gradient is compared with
  TF's for the same matrix stored as two bands (a zero subdiagonal or superdiagonal)."""
  fn = lambda m, r: [banded(lower, adjoint)(m, r) for adjoint in (False, True)]  # noqa: E731
  m, r = bands_of(num_bands, 6, lower=lower), normal(6, 3, seed=1)
  weights = normal(6, 3, seed=2), normal(6, 3, seed=3)
  check(fn, m, r, atol=1e-5, rtol=1e-5, grad=num_bands > 1)
  if num_bands == 1:
    two_bands = np.concatenate([m, np.zeros_like(m)] if lower else [np.zeros_like(m), m])
    mt, rt = tf.constant(two_bands), tf.constant(r)
    with tf.GradientTape() as tape:
      tape.watch([mt, rt])
      loss = tf.add_n([tf.reduce_sum(x * w) for x, w in zip(fn(mt, rt), weights)])
    grad_m, grad_r = tape.gradient(loss, [mt, rt])
    jax_fn, params = jaxport.convert(fn, m, r)
    got = jax.jit(jax.grad(lambda m, r: sum(jnp.sum(x * w) for x, w in zip(jax_fn(params, m, r)[0], weights)),
                           argnums=(0, 1)))(m, r)
    np.testing.assert_allclose(np.asarray(got[0]), grad_m.numpy()[0 if lower else 1:][:1], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), grad_r.numpy(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lower", [True, False])
def test_banded_solve_float64(lower):
  with jax.enable_x64(True):
    m, r = bands_of(3, 4, 7, lower=lower, dtype=np.float64), normal(3, 7, 2, seed=1, dtype=np.float64)
    check(lambda m, r: [banded(lower, adjoint)(m, r) for adjoint in (False, True)], m, r, **TIGHT)


@pytest.mark.parametrize("dtype,tolerance", [(np.complex64, dict(atol=1e-5, rtol=1e-5)), (np.complex128, TIGHT)])
@pytest.mark.parametrize("lower", [True, False])
def test_banded_solve_complex_adjoint_conjugates(dtype, tolerance, lower):
  m = (bands_of(2, 3, 5, lower=lower, dtype=np.float64) + 1j * normal(2, 3, 5, seed=2, dtype=np.float64)).astype(dtype)
  r = complex_normal(2, 5, 2, seed=3, dtype=dtype)
  with jax.enable_x64(dtype == np.complex128):
    check(lambda m, r: [banded(lower, adjoint)(m, r) for adjoint in (False, True)], m, r, grad=False, **tolerance)
    # Gradients w.r.t. the real and imaginary parts, against tf.GradientTape.
    real = np.float32 if dtype == np.complex64 else np.float64
    re, im, rhs = np.real(m).astype(real), np.imag(m).astype(real), np.real(r).astype(real)
    def fn(re, im, rhs):
      matrix, b = tf.complex(re, im), tf.complex(rhs, -rhs)
      return [parts(banded(lower, adjoint)(matrix, b)) for adjoint in (False, True)]
    check(fn, re, im, rhs, vmap=False, **tolerance)


@pytest.mark.parametrize("lower", [True, False])
def test_banded_solve_ignores_unused_band_entries(lower):
  """The entries the band layout leaves unused (NaN here) change nothing, and get no gradient (TF's
  gradient keeps the band only)."""
  m = bands_of(3, 5, lower=lower)
  for d in range(1, 3):   # lower: the first d entries of row d; upper: the last d of row K-1-d
    if lower:
      m[d, :d] = np.nan
    else:
      m[2 - d, 5 - d:] = np.nan
  rhs = normal(5, 2, seed=1)
  check(lambda m, r: [banded(lower, adjoint)(m, r) for adjoint in (False, True)], m, rhs, atol=1e-5, rtol=1e-5)
  assert not np.isnan(np.asarray(run_rule("BandedTriangularSolve", m, rhs, lower=lower))).any()


def test_banded_solve_more_bands_than_rows():
  """TF's graph shape function refuses K > N; its kernel (eager TF) ignores the extra rows, as here."""
  for lower in (True, False):
    m, r = bands_of(6, 4, lower=lower), normal(4, 2, seed=1)
    if not lower:
      m[:2] = np.nan   # the two rows past the 4th superdiagonal
    expected = tf.linalg.banded_triangular_solve(m, r, lower=lower).numpy()
    np.testing.assert_allclose(np.asarray(run_rule("BandedTriangularSolve", m, r, lower=lower)), expected,
                               atol=1e-5, rtol=1e-5)


def test_banded_solve_zero_diagonal():
  """TF refuses a zero (or subnormal) on the first matrix's diagonal, and solves the others to inf/NaN.
  Known at trace time the rule refuses as TF; under jit it cannot, and gives inf/NaN."""
  m, r = bands_of(2, 2, 3), normal(3, 1, seed=1)
  zero_first, zero_second = m.copy(), m.copy()
  zero_first[0, 0, 1] = 1e-40   # flushed to zero by TF
  zero_second[1, 0, 1] = 0
  fn = tf.function(banded(True, False))
  with pytest.raises(tf.errors.InvalidArgumentError, match="not invertible"):
    fn(zero_first, r)
  with pytest.raises(InvalidNodeError, match="BandedTriangularSolve node .*not invertible"):
    run_rule("BandedTriangularSolve", zero_first, r)
  jax_fn, params = jaxport.convert(fn, m, r)
  with pytest.raises(InvalidNodeError, match="not invertible"):
    jax_fn(params, zero_first, r)
  under_jit = np.asarray(jax.jit(lambda m, r: jax_fn(params, m, r)[0])(zero_first, r))
  assert not np.isfinite(under_jit[0]).all() and np.isfinite(under_jit[1]).all()
  expected = fn(zero_second, r).numpy()
  assert np.isinf(expected[1]).any()
  np.testing.assert_allclose(np.asarray(jax_fn(params, zero_second, r)[0]), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("matrix_shape,rhs_shape,message", [
    ((0, 3), (3, 1), "empty"), ((2, 3), (3, 0), "empty"), ((0, 2, 3), (3, 1), "empty"),
    ((3,), (3, 1), "rank"), ((2, 4), (3, 1), "rows"), ((2, 2, 3), (3, 3, 1), "broadcast")])
def test_banded_solve_refuses_what_tf_refuses(matrix_shape, rhs_shape, message):
  m, r = np.ones(matrix_shape, np.float32), np.ones(rhs_shape, np.float32)
  with pytest.raises(tf.errors.InvalidArgumentError):
    tf.linalg.banded_triangular_solve(m, r)
  with pytest.raises(InvalidNodeError, match=message):
    run_rule("BandedTriangularSolve", m, r)


# --------------------------------------------------------------------------- MatrixSquareRoot


@pytest.mark.parametrize("spd", [True, False])
def test_sqrtm_float32_with_batch_dims(spd):
  """SPD and general matrices (real input with complex eigenvalue pairs: a real root)."""
  a = positive_spectrum(2, 3, 4, 4, spd=spd)
  check(sqrtm, a, atol=1e-5, rtol=1e-5, grad_atol=1e-5)
  check(sqrtm, positive_spectrum(7, 7, seed=1, spd=spd), atol=1e-5, rtol=1e-5, grad_atol=1e-5)


def test_sqrtm_float64():
  with jax.enable_x64(True):
    check(sqrtm, positive_spectrum(2, 5, 5, dtype=np.float64), **TIGHT)
    check(sqrtm, positive_spectrum(3, 3, seed=1, dtype=np.float64, spd=True), **TIGHT)


@pytest.mark.parametrize("dtype,tolerance", [(np.complex64, dict(atol=1e-5, rtol=1e-5)), (np.complex128, TIGHT)])
def test_sqrtm_complex_values(dtype, tolerance):
  n = 4
  a = (complex_normal(2, n, n, dtype=np.complex128) + 2.5 * np.sqrt(n) * np.eye(n)).astype(dtype)
  with jax.enable_x64(dtype == np.complex128):
    check(sqrtm, a, grad=False, **tolerance)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_sqrtm_complex_gradient_is_the_frechet_derivative(dtype):
  """d sqrt(A)[E] is the corner block of sqrt([[A, E], [0, A]]) (TF computes it here); the gradient of
  <W, sqrt(A)> w.r.t. Re A and Im A must give the same directional derivative along E."""
  n = 3
  real = np.float32 if dtype == np.complex64 else np.float64
  a = complex_normal(n, n, dtype=np.complex128) + 3 * np.eye(n)
  e, w = complex_normal(n, n, seed=4, dtype=np.complex128), complex_normal(n, n, seed=6, dtype=np.complex128)
  block = np.block([[a, e], [np.zeros_like(a), a]])
  expected = np.sum(np.real(tf.linalg.sqrtm(block).numpy()[:n, n:] * w))
  loss = lambda re, im: tf.reduce_sum(tf.math.real(sqrtm(tf.complex(re, im)) * w.astype(dtype)))  # noqa: E731
  with jax.enable_x64(dtype == np.complex128):
    jax_fn, params = jaxport.convert(loss, a.real.astype(real), a.imag.astype(real))
    grads = jax.jit(jax.grad(lambda re, im: jax_fn(params, re, im)[0], argnums=(0, 1)))(
        a.real.astype(real), a.imag.astype(real))
  directional = np.sum(np.asarray(grads[0]) * e.real) + np.sum(np.asarray(grads[1]) * e.imag)
  np.testing.assert_allclose(directional, expected, rtol=1e-4 if dtype == np.complex64 else 1e-10)


def test_sqrtm_negative_real_eigenvalue_is_nan_per_matrix():
  """No real root: TF gives NaN throughout that matrix; the other matrices of the batch are solved."""
  negative = np.diag([4.0, -1.0, 9.0]) + 0.1 * normal(3, 3, dtype=np.float64)
  a = np.stack([positive_spectrum(3, 3, dtype=np.float64), negative]).astype(np.float32)
  expected = tf.linalg.sqrtm(a).numpy()
  assert np.isnan(expected[1]).all() and not np.isnan(expected[0]).any()
  check(sqrtm, a, atol=1e-5, rtol=1e-5, grad=False, vmap=False)


def test_sqrtm_small_and_empty():
  """1x1: sqrt (NaN for a real negative or infinite number, the principal root for a complex one);
  0x0: empty."""
  real = np.array([[[4.0]], [[-4.0]], [[0.0]], [[np.inf]], [[-np.inf]], [[np.nan]]], np.float32)
  check(sqrtm, real, grad=False, vmap=False)
  check(sqrtm, np.array([[-4.0 + 0j]], np.complex64), grad=False, vmap=False)
  for shape in [(0, 0), (2, 0, 0)]:
    empty = np.zeros(shape, np.float32)
    np.testing.assert_array_equal(np.asarray(run_rule("MatrixSquareRoot", empty)), tf.linalg.sqrtm(empty).numpy())
    assert run_rule("MatrixSquareRoot", empty).shape == shape


def test_sqrtm_singular_with_one_zero_eigenvalue():
  """TF's Schur method handles one zero eigenvalue (and gives NaN for a zero matrix); so does the CPU rule."""
  a = np.array([[[1.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]], np.float32)
  expected = tf.linalg.sqrtm(a).numpy()
  np.testing.assert_allclose(np.asarray(run_rule("MatrixSquareRoot", a)), expected, atol=1e-6)


def test_sqrtm_refuses_non_square():
  with pytest.raises(InvalidNodeError, match="MatrixSquareRoot node .*square"):
    run_rule("MatrixSquareRoot", np.ones((2, 3), np.float32))


@pytest.fixture
def iteration_everywhere(monkeypatch):
  """The rule as it runs off the CPU (no Schur kernel there): the Denman-Beavers iteration."""
  monkeypatch.setattr(linalg_special, "principal_sqrtm", linalg_special.iterative_sqrtm)


def test_sqrtm_off_cpu_path_matches_tf(iteration_everywhere):
  grad = not VIA_ARTIFACT   # through an artifact, only the rule's own square root keeps its derivative (a mark)
  check(sqrtm, positive_spectrum(2, 3, 4, 4), atol=1e-5, rtol=1e-5, grad_atol=1e-5, grad=grad)
  with jax.enable_x64(True):
    check(sqrtm, positive_spectrum(2, 4, 4, seed=2, dtype=np.float64), grad=grad, **TIGHT)
    z = complex_normal(3, 3, dtype=np.complex128) + 3 * np.eye(3)
    check(sqrtm, z, grad=False, **TIGHT)


def test_sqrtm_off_cpu_path_gives_nan_where_it_cannot_converge():
  negative = np.diag([4.0, -1.0, 9.0]) + 0.1 * normal(3, 3, dtype=np.float64)
  a = np.stack([positive_spectrum(3, 3, dtype=np.float64), negative]).astype(np.float32)
  got = np.asarray(jax.jit(linalg_special.sqrtm_denman_beavers)(a))
  assert np.isnan(got[1]).all()
  np.testing.assert_allclose(got[0], tf.linalg.sqrtm(a[0]).numpy(), atol=1e-5, rtol=1e-5)


def test_sqrtm_jvp_solves_the_sylvester_equation():
  """Forward mode (not in the TF oracle): X dX + dX X = dA."""
  with jax.enable_x64(True):
    a, da = positive_spectrum(2, 5, 5, dtype=np.float64), normal(2, 5, 5, seed=3, dtype=np.float64)
    x, dx = jax.jvp(linalg_special.principal_sqrtm, (a,), (da,))
    np.testing.assert_allclose(x @ dx + dx @ x, da, atol=1e-12)


# --------------------------------------------------------------------------- native, exportable


@pytest.mark.parametrize("op", ["BandedTriangularSolve", "MatrixSquareRoot"])
def test_rules_are_native_without_host_callback_and_export(op, tmp_path):
  assert tiers.op_tier(op, config.snapshot()) == Tier.NATIVE
  if op == "BandedTriangularSolve":
    fn, args = banded(True, True), (bands_of(2, 4), normal(4, 2, seed=1))
  else:
    fn, args = sqrtm, (positive_spectrum(3, 3),)
  with warnings.catch_warnings():
    warnings.simplefilter("error", HostCallbackWarning)
    jax_fn, params = jaxport.convert(fn, *args)
  jaxport.export(jax_fn, params, *args, path=tmp_path / "artifact", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "artifact")
  np.testing.assert_allclose(np.asarray(loaded(loaded_params, *args)[0]), fn(*args).numpy(), atol=1e-5, rtol=1e-5)


def test_banded_solve_gradient_under_vmap_matches_tf():
  """Per-example gradients (vmap of grad) against tf.GradientTape run per example."""
  m, r = bands_of(3, 2, 5), normal(3, 5, 2, seed=1)
  fn = banded(True, False)
  jax_fn, params = jaxport.convert(fn, m[0], r[0])
  grads = jax.vmap(jax.grad(lambda m, r: jnp.sum(jax_fn(params, m, r)[0] ** 2), argnums=(0, 1)))(m, r)
  for k in range(3):
    mk, rk = tf.constant(m[k]), tf.constant(r[k])
    with tf.GradientTape() as tape:
      tape.watch([mk, rk])
      loss = tf.reduce_sum(fn(mk, rk) ** 2)
    for got, want in zip(grads, tape.gradient(loss, [mk, rk])):
      np.testing.assert_allclose(np.asarray(got[k]), want.numpy(), atol=1e-4, rtol=1e-4)
