"""Matrix decompositions, solves, determinants and Diag/DiagPart against TF.

Where TF's output is unique (Cholesky, Qr, Lu, the solves, determinants), it is matched
exactly. Where it is unique only up to sign/phase and order (Svd, SelfAdjointEigV2, Eig
vectors), the functions below return gauge-invariant quantities, computed inside the
converted graph, so the oracle can still compare eager, jit, grad and vmap.
"""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from oracle import check, run_rule

RAW = tf.raw_ops


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


def well_conditioned(*shape, seed=0):
  """A random square matrix (batch) dominated by its diagonal."""
  return (normal(*shape, seed=seed) + 3 * np.eye(shape[-1])).astype(np.float32)


def spd(*shape, seed=0):
  a = normal(*shape, seed=seed)
  return (a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])).astype(np.float32)


def complex_of(re, im):
  return (re + 1j * im).astype(np.complex64)


def sq(x):
  """|x|^2 elementwise: invariant under the sign/phase of a singular vector or eigenvector."""
  return tf.math.square(tf.math.abs(x))


def parts(z):
  return tf.math.real(z), tf.math.imag(z)


# --------------------------------------------------------------------------- Cholesky


def test_cholesky_matches_tf_reads_lower_triangle_symmetric_gradient():
  garbage_above = spd(3, 3, seed=2) + np.triu(normal(3, 3, seed=1), 1)
  check(lambda a, b: (RAW.Cholesky(input=a), RAW.Cholesky(input=b)), spd(2, 4, 4), garbage_above,
        atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n", [2, 5, 7])
def test_cholesky_small_is_tfs_bit_for_bit_even_ill_conditioned(n):
  """Up to 7x7, TF's operation order (Eigen's unblocked LLT): an ill-conditioned matrix (a noiseless
  GP's kernel, condition ~1e6) amplifies any other rounding far past float32's epsilon."""
  points = np.random.RandomState(0).uniform(0.1, 0.9, (2, n, 1))
  kernel = np.exp(-2.0 * (points - np.swapaxes(points, -1, -2)) ** 2).astype(np.float32)
  matrices = np.concatenate([kernel + 1e-6 * np.eye(n, dtype=np.float32), spd(1, n, n)])
  expected = tf.linalg.cholesky(matrices).numpy()
  fn = jaxport.convert_functional(tf.function(tf.linalg.cholesky), matrices)
  np.testing.assert_array_equal(np.asarray(fn(matrices)), expected)
  np.testing.assert_array_equal(np.asarray(jax.jit(fn)(matrices)), expected)


def test_cholesky_complex():
  z = complex_of(normal(3, 3), normal(3, 3, seed=1))
  check(lambda a: RAW.Cholesky(input=a), (z @ z.conj().T + 3 * np.eye(3)).astype(np.complex64),
        atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- Qr


def test_qr_matches_tf_exactly():
  tall, wide, square = normal(2, 4, 3), normal(2, 3, 4, seed=1), normal(3, 3, seed=2)
  # Gradients where TF and JAX both define one: reduced with m >= n, or square.
  check(lambda tall, square: (RAW.Qr(input=tall), RAW.Qr(input=square, full_matrices=True)),
        tall, square, atol=1e-4, rtol=1e-4)
  z = complex_of(normal(4, 3), normal(4, 3, seed=1))
  check(lambda tall, wide, z: (RAW.Qr(input=tall, full_matrices=True), RAW.Qr(input=wide),
                               RAW.Qr(input=wide, full_matrices=True), RAW.Qr(input=z)),
        tall, wide, z, atol=1e-4, rtol=1e-4, grad=False, vmap=False)


# --------------------------------------------------------------------------- Svd


def svd_invariants(a, full_matrices):
  """s, the reconstruction u diag(s) v^H, and |u|^2, |v|^2 of the first min(m, n) columns."""
  s, u, v = RAW.Svd(input=a, compute_uv=True, full_matrices=full_matrices)
  k = min(a.shape[-2], a.shape[-1])
  u, v = u[..., :k], v[..., :k]
  recon = tf.linalg.matmul(u * tf.cast(s[..., None, :], u.dtype), v, adjoint_b=True)
  return s, recon, sq(u), sq(v)


@pytest.mark.slow   # ~11 s: JAX's op-by-op gradient of SVD
def test_svd_values_and_vectors_up_to_sign():
  tall, wide, square = normal(2, 4, 3), normal(3, 5, seed=1), normal(3, 3, seed=2)
  # TF's gradient with full_matrices=True needs a square matrix.
  check(lambda tall, square: (RAW.Svd(input=tall, compute_uv=False)[0], svd_invariants(tall, False),
                              svd_invariants(square, True)),
        tall, square, atol=1e-4, rtol=1e-4)
  z = complex_of(normal(4, 3), normal(4, 3, seed=1))
  check(lambda tall, wide, z: (svd_invariants(tall, True), svd_invariants(wide, True), svd_invariants(wide, False),
                               RAW.Svd(input=z, compute_uv=False)[0], svd_invariants(z, False)),
        tall, wide, z, atol=1e-4, rtol=1e-4, grad=False, vmap=False)


def test_svd_shapes_v_not_v_adjoint():
  a = normal(4, 3)
  fn = lambda a: (RAW.Svd(input=a, full_matrices=True), RAW.Svd(input=a, compute_uv=False))  # noqa: E731
  jax_fn, params = jaxport.convert(fn, a)
  (s, u, v), (_, no_u, no_v) = jax_fn(params, a)[0]
  assert (s.shape, u.shape, v.shape) == ((3,), (4, 4), (3, 3))
  assert no_u.shape == no_v.shape == (0,)   # TF's declared shape for outputs not computed
  np.testing.assert_allclose(u.T @ u, np.eye(4), atol=1e-5)
  np.testing.assert_allclose(u[:, :3] * s @ v.T, a, atol=1e-5)


# --------------------------------------------------------------------------- SelfAdjointEigV2


def test_self_adjoint_eig_reads_the_lower_triangle_with_lower_gradient():
  a = spd(2, 4, 4) + np.triu(normal(2, 4, 4, seed=1), 1)   # distinct eigenvalues, garbage above
  def fn(a):
    e, v = RAW.SelfAdjointEigV2(input=a, compute_v=True)
    return e, sq(v), RAW.SelfAdjointEigV2(input=a, compute_v=False)[0]
  check(fn, a, atol=1e-4, rtol=1e-4)


def test_self_adjoint_eig_complex():
  z = complex_of(normal(3, 3), normal(3, 3, seed=1))
  def fn(a):
    e, v = RAW.SelfAdjointEigV2(input=a)
    return e, sq(v)
  check(fn, (z + z.conj().T).astype(np.complex64), atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- Eig


def eig_invariants(a):
  """Order- and phase-invariant: sum(e), sum(e^2), sum(|v|^4)."""
  e, v = RAW.Eig(input=a, Tout=tf.complex64, compute_v=True)
  return parts(tf.reduce_sum(e, -1)), parts(tf.reduce_sum(e * e, -1)), tf.reduce_sum(sq(v) ** 2, [-2, -1])


def test_eig_invariants_and_gradient():
  check(eig_invariants, normal(2, 3, 3), atol=1e-4, rtol=1e-4)
  check(eig_invariants, complex_of(normal(3, 3), normal(3, 3, seed=1)), atol=1e-4, rtol=1e-4)


def test_eig_values_and_vectors():
  a = normal(4, 4, seed=3)   # real, with complex eigenvalue pairs
  fn = lambda a: (RAW.Eig(input=a, Tout=tf.complex64, compute_v=True),  # noqa: E731
                  RAW.Eig(input=a, Tout=tf.complex64, compute_v=False)[0])
  jax_fn, params = jaxport.convert(fn, a)
  (w, v), w_only = jax.jit(lambda a: jax_fn(params, a)[0])(a)
  (w_tf, _), _ = fn(a)
  order = lambda w: np.lexsort((np.imag(w).round(4), np.real(w).round(4)))  # noqa: E731
  np.testing.assert_allclose(np.asarray(w)[order(w)], w_tf.numpy()[order(w_tf.numpy())], atol=1e-4)
  np.testing.assert_allclose(w_only, w, atol=1e-5)
  assert w.dtype == v.dtype == np.complex64
  np.testing.assert_allclose(a @ v, v * w, atol=1e-4)
  np.testing.assert_allclose(np.linalg.norm(v, axis=0), 1, atol=1e-5)


# --------------------------------------------------------------------------- Lu


def test_lu_matches_tf():
  # TF defines no gradient for Lu.
  check(lambda a: (RAW.Lu(input=a), RAW.Lu(input=a, output_idx_type=tf.int64)), normal(2, 4, 4),
        atol=1e-4, rtol=1e-4, grad=False)


# --------------------------------------------------------------------------- solves, inverses, determinants


@pytest.mark.slow   # ~11 s: JAX's op-by-op gradient of eight solves
def test_solves_inverses_and_determinants():
  a, b = well_conditioned(2, 3, 3), normal(2, 3, 2, seed=1)
  tri, rhs = well_conditioned(2, 1, 3, 3, seed=2), normal(4, 3, 2, seed=3)   # batch dims broadcast to (2, 4)
  def fn(a, b, tri, rhs):
    return (RAW.MatrixInverse(input=a), RAW.MatrixInverse(input=a, adjoint=True),
            RAW.MatrixSolve(matrix=a, rhs=b), RAW.MatrixSolve(matrix=a, rhs=b, adjoint=True),
            RAW.MatrixDeterminant(input=a), RAW.LogMatrixDeterminant(input=-a),
            [RAW.MatrixTriangularSolve(matrix=tri, rhs=rhs, lower=lower, adjoint=adjoint)
             for lower, adjoint in ((True, False), (False, True))])
  check(fn, a, b, tri, rhs, atol=1e-4, rtol=1e-4)


def test_complex_solves_inverses_and_determinants():
  re, im, b = well_conditioned(3, 3), normal(3, 3, seed=1), normal(3, 2, seed=2)
  def fn(re, im, b):
    a, rhs = tf.complex(re, im), tf.complex(b, -b)
    return (parts(RAW.MatrixInverse(input=a, adjoint=True)), parts(RAW.MatrixSolve(matrix=a, rhs=rhs, adjoint=True)),
            parts(RAW.MatrixTriangularSolve(matrix=a, rhs=rhs, adjoint=True)))
  check(fn, re, im, b, atol=1e-4, rtol=1e-4)
  # TF's complex gradients of MatrixDeterminant and LogMatrixDeterminant are wrong (JAX's agree
  # with finite differences): values only. A singular matrix gives sign 0 and log|det| -inf.
  z = complex_of(re, im)
  check(lambda z, singular: (RAW.MatrixDeterminant(input=z), RAW.LogMatrixDeterminant(input=z),
                             RAW.LogMatrixDeterminant(input=singular)),
        z, np.ones((2, 2), np.float32), atol=1e-4, rtol=1e-4, grad=False, vmap=False)


def test_tridiagonal_solve():
  diagonals = normal(2, 3, 5)
  diagonals[:, 1] += 4   # diagonally dominant
  rhs = normal(2, 5, 2, seed=1)
  check(lambda d, b: [RAW.TridiagonalSolve(diagonals=d, rhs=b, partial_pivoting=pivoting)
                      for pivoting in (True, False)], diagonals, rhs, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- Diag / DiagPart


def test_diag_and_diag_part():
  check(lambda v, x, i: (RAW.Diag(diagonal=v), RAW.DiagPart(input=x), RAW.Diag(diagonal=i)),
        normal(2, 3), normal(3, 2, 3, 2, seed=1), np.arange(3, dtype=np.int32))


def test_diag_of_constants_stays_numpy():
  v = np.arange(4, dtype=np.int64).reshape(2, 2)
  out = run_rule("Diag", v)
  assert isinstance(out, np.ndarray) and out.shape == (2, 2, 2, 2) and out.dtype == np.int64
  back = run_rule("DiagPart", out)
  assert isinstance(back, np.ndarray)
  np.testing.assert_array_equal(back, v)
