"""Op rules: BandedTriangularSolve and MatrixSquareRoot (before these rules, both ran in TF through a
host callback).

BandedTriangularSolve: `matrix` [..., K, N] holds the K diagonals of a triangular N x N matrix in TF's
band storage (cuSPARSE's LEFT_RIGHT alignment). lower=True: row d is the d-th subdiagonal, right-aligned
(band[d, j] = A[j, j - d], the first d entries unused); lower=False: row K-1-d is the d-th superdiagonal,
left-aligned (band[K-1-d, j] = A[j, j + d], the last d entries unused). Rows past the N-th are unused.
The solve is a substitution over the N rows (`lax.scan`), O(N K M). Measured on the CPU (jit, N=256,
K=4, M=8): 20-40 us forward, ~0.3 ms with its gradient; expanding the band to the dense O(N^2) matrix
(a gather) for `lax.linalg.triangular_solve` took 0.2-11 ms forward and 1.4-4 ms with the gradient.
Unused entries are never read, so they get no gradient, as in TF's gradient (which
keeps the band of the dense gradient); NaN there does not leak into the result.

MatrixSquareRoot: the principal square root (eigenvalues in the open right half plane). On the CPU,
the Schur method (Bjorck & Hammarling) on the complex Schur form; elsewhere (no Schur kernel on GPU/TPU),
the scaled product-form Denman-Beavers iteration, until M_k is the identity to rounding. The derivative
solves the Sylvester equation X dX + dX X = dA (as TF's gradient, which builds the N^2 x N^2 Kronecker
sum) with `lax.custom_linear_solve`, whose solve is the square root's Frechet derivative: the upper
right block of sqrt([[A, dA], [0, A]]), O(N^3).

Known differences from TF:
  * A zero on the diagonal: TF raises "Input matrix is not invertible" when the first matrix of the
    batch has one (zero or subnormal, TF flushes those); here it does too when the matrix is known at
    trace time (a constant, or a concrete array without jit), and gives inf/NaN otherwise, as TF does
    for the other matrices of a batch.
  * A real matrix with a negative real eigenvalue has no real square root: TF (Eigen's real Schur)
    returns NaN throughout, and so does this rule, for each such matrix of a batch. The test is on the
    computed root: its imaginary part larger than sqrt(eps) of its magnitude (so a negative eigenvalue
    below ~eps of the matrix's norm can go either way, in TF as well). Off the CPU, a matrix the
    iteration does not converge on (a negative eigenvalue, real or complex input) gives NaN.
  * A complex matrix with an eigenvalue on the negative real axis: either root of it is principal up
    to rounding; TF and this rule may pick different ones.
  * TF's gradient of MatrixSquareRoot is wrong for complex inputs (it solves with R^T, not R^H); this
    rule's agrees with finite differences.
  * A complex 1 x 1 matrix with an infinite part: TF's Schur form gives NaN in some parts (inf + nanj for
    inf + 0j); this rule gives `sqrt`'s value.
  * With JAX's x64 mode off, 64-bit results are 32-bit.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.ops._util import known_value
from jaxport.convert.ops.linalg_decompose import _broadcast_batch
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_HIGHEST = lax.Precision.HIGHEST


# --------------------------------------------------------------------------- BandedTriangularSolve


@register("BandedTriangularSolve")
def banded_triangular_solve(ctx, matrix, rhs):
  """Solves op(A) X = rhs, A triangular with its diagonals in `matrix` [..., K, N] (module note); rhs
  [..., N, M]; batch dims broadcast. `adjoint`: op(A) = A^H."""
  lower, adjoint = ctx.attr("lower", True), ctx.attr("adjoint", False)
  _check_banded_shapes(ctx, matrix, rhs)
  _refuse_known_zero_diagonal(ctx, matrix, lower)
  bands, rhs = _broadcast_batch(jnp.asarray(matrix), jnp.asarray(rhs))
  coefficients = _substitution_coefficients(bands, lower, adjoint)
  # op(A) is upper triangular when lower == adjoint: substitute from the last row up.
  backward = lower == adjoint
  if backward:
    rhs = jnp.flip(rhs, -2)
  solution = _forward_substitution(coefficients, rhs)
  return jnp.flip(solution, -2) if backward else solution


def _check_banded_shapes(ctx, matrix, rhs):
  """TF's kernel checks (its shape function lets empty inputs through; the kernel refuses them)."""
  def refuse(problem):
    raise InvalidNodeError(f"BandedTriangularSolve node {ctx.name!r}: {problem} (matrix {tuple(matrix.shape)}, "
                           f"rhs {tuple(rhs.shape)})")
  if matrix.ndim < 2 or rhs.ndim < 2:
    refuse("matrix and rhs need rank >= 2")
  if matrix.shape[-1] != rhs.shape[-2]:
    refuse("matrix's last dimension must be rhs's number of rows")
  if np.size(matrix) == 0 or np.size(rhs) == 0:
    refuse("TF refuses empty inputs")
  try:
    np.broadcast_shapes(matrix.shape[:-2], rhs.shape[:-2])
  except ValueError:
    refuse("batch dimensions do not broadcast")


def _refuse_known_zero_diagonal(ctx, matrix, lower: bool):
  """TF's check: the diagonal of the batch's FIRST matrix has no zero (nor subnormal) entry."""
  values = known_value(matrix)
  if values is None:
    return
  first = values.reshape((-1,) + values.shape[-2:])[0]
  diagonal = first[0 if lower else -1]
  if np.any(np.abs(diagonal) < np.finfo(diagonal.dtype).tiny):
    raise InvalidNodeError(f"BandedTriangularSolve node {ctx.name!r}: Input matrix is not invertible "
                           "(a zero on the diagonal)")


def _substitution_coefficients(bands, lower: bool, adjoint: bool):
  """C [..., K', N] with K' = min(K, N): C[d, i] = L[i, i - d] for the lower triangular L that
  op(A) is (in reversed row order when op(A) is upper); zero where i < d (unused band entries)."""
  num_bands, n = bands.shape[-2:]
  kept = min(num_bands, n)
  d = np.arange(kept)[:, None]
  i = np.arange(n)[None, :]
  # Where C[d, i] lies in the band storage (module note), per case.
  if lower and not adjoint:      # L = A
    rows, cols = d, i
  elif not lower and not adjoint:  # A upper, rows reversed
    rows, cols = num_bands - 1 - d, n - 1 - i
  elif lower:                    # A^H upper, rows reversed
    rows, cols = d, n - 1 - i + d
  else:                          # A^H lower
    rows, cols = num_bands - 1 - d, i - d
  used = np.broadcast_to(i >= d, (kept, n))
  rows, cols = np.broadcast_to(rows, (kept, n)), np.clip(np.broadcast_to(cols, (kept, n)), 0, n - 1)
  gathered = bands[..., rows, cols]
  if adjoint:
    gathered = jnp.conj(gathered)
  return jnp.where(used, gathered, jnp.zeros((), bands.dtype))


def _forward_substitution(coefficients, rhs):
  """x_i = (b_i - sum_{d >= 1} C[d, i] x_{i-d}) / C[0, i], a scan over the rows."""
  kept = coefficients.shape[-2]
  if kept == 1:   # diagonal
    return rhs / coefficients[..., 0, :, None]
  per_row = jnp.moveaxis(coefficients, -1, 0)   # [N, ..., K']
  rhs_rows = jnp.moveaxis(rhs, -2, 0)            # [N, ..., M]

  def step(previous, row):                      # previous[d - 1] = x_{i-d}
    c, b = row
    x = (b - jnp.einsum("...d,d...m->...m", c[..., 1:], previous, precision=_HIGHEST)) / c[..., :1]
    return jnp.concatenate([x[None], previous[:-1]]), x

  start = jnp.zeros((kept - 1,) + rhs_rows.shape[1:], rhs.dtype)
  _, rows = lax.scan(step, start, (per_row, rhs_rows))
  return jnp.moveaxis(rows, 0, -2)


# --------------------------------------------------------------------------- MatrixSquareRoot


@register("MatrixSquareRoot")
def matrix_square_root(ctx, a):
  """The principal square root of each matrix [..., N, N] (module note)."""
  a = jnp.asarray(a)
  if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
    raise InvalidNodeError(f"MatrixSquareRoot node {ctx.name!r}: input must be square matrices, got "
                           f"shape {tuple(a.shape)}")
  n = a.shape[-1]
  if n == 0 or a.size == 0:
    return a
  if n == 1:   # a real negative number gives NaN, and so does a real infinity (TF's Schur form of it)
    root = jnp.sqrt(a)
    return root if jnp.iscomplexobj(a) else jnp.where(jnp.isinf(a), jnp.nan, root).astype(a.dtype)
  if a.dtype == jnp.float16:   # no half-precision Schur; TF declares half but has no CPU kernel for it
    return principal_sqrtm(a.astype(jnp.float32)).astype(a.dtype)
  return principal_sqrtm(a)


def _differentiable_sqrtm(method):
  """`method` (a -> its principal square root, batched), with the Sylvester-equation derivative."""
  @jax.custom_jvp
  def square_root(a):
    return method(a)

  @square_root.defjvp
  def square_root_jvp(primals, tangents):
    (a,), (da,) = primals, tangents
    x = square_root(a)
    return x, _solve_sylvester_sum(method, a, x, da)

  return square_root


def _solve_sylvester_sum(method, a, x, c):
  """dX with x dX + dX x = c (x = sqrt(a)), linear in c for JAX's transposition: the transposed
  system x^T Z + Z x^T = g is the same equation for a^T."""
  def matvec(y):
    return jnp.matmul(x, y, precision=_HIGHEST) + jnp.matmul(y, x, precision=_HIGHEST)
  return lax.custom_linear_solve(matvec, c,
                                 solve=lambda _, b: _frechet_derivative(method, a, b),
                                 transpose_solve=lambda _, b: _frechet_derivative(method, jnp.swapaxes(a, -1, -2), b))


def _frechet_derivative(method, a, c):
  """The derivative of sqrt at `a` in direction `c`: the upper right block of sqrt([[a, c], [0, a]])
  (its square is [[a, x y + y x], [0, a]]). `c` is scaled to `a`'s norm first (the block's root is
  linear in it), which keeps the block's Schur form / iteration as accurate as `a`'s."""
  n = a.shape[-1]
  a_norm, c_norm = _frobenius(a), _frobenius(c)
  scale = jnp.where(c_norm > 0, a_norm / jnp.where(c_norm > 0, c_norm, 1), 1)[..., None, None]
  zeros = jnp.zeros_like(a)
  block = jnp.concatenate([jnp.concatenate([a, c * scale], -1), jnp.concatenate([zeros, a], -1)], -2)
  return method(block)[..., :n, n:] / scale


def _frobenius(x):
  return jnp.sqrt(jnp.sum(jnp.abs(x) ** 2, axis=(-2, -1)))


def _not_real_tolerance(dtype) -> float:
  return float(np.sqrt(np.finfo(dtype).eps))


def sqrtm_schur(a):
  """The Schur method (CPU only: LAPACK's gees): a = Z T Z^H, R = sqrt(T) upper triangular, Z R Z^H.
  A real input whose root is not real (a negative real eigenvalue) gives NaN, as Eigen's real Schur."""
  t, z = _complex_schur(a)
  r = _sqrt_upper_triangular(t)
  root = jnp.matmul(jnp.matmul(z, r, precision=_HIGHEST), jnp.conj(jnp.swapaxes(z, -1, -2)), precision=_HIGHEST)
  if jnp.iscomplexobj(a):
    return root
  magnitude = jnp.max(jnp.abs(root), axis=(-2, -1), keepdims=True)
  imaginary = jnp.max(jnp.abs(root.imag), axis=(-2, -1), keepdims=True)
  not_real = imaginary > _not_real_tolerance(a.dtype) * magnitude
  return jnp.where(not_real, jnp.nan, root.real).astype(a.dtype)


def _complex_schur(a):
  """(T, Z), T upper triangular, a = Z T Z^H. A real matrix goes through its real Schur form first:
  LAPACK's real gees and then a complex gees on the quasi-triangular result are ~8x faster than a
  complex gees on the matrix."""
  if jnp.iscomplexobj(a):
    return lax.linalg.schur(a)
  quasi_triangular, q = lax.linalg.schur(a)
  complex_dtype = jnp.result_type(a.dtype, jnp.complex64)
  t, u = lax.linalg.schur(quasi_triangular.astype(complex_dtype))
  return t, jnp.matmul(q.astype(complex_dtype), u, precision=_HIGHEST)


def _sqrt_upper_triangular(t):
  """R upper triangular with R R = T (T upper triangular), principal roots on the diagonal.
  Column j above the diagonal solves (R[:j, :j] + R[j, j] I) r = T[:j, j]: a scan over the columns,
  each a triangular solve on the full N x N (R's columns from j on are still diagonal; an identity
  there keeps the shapes static)."""
  n = t.shape[-1]
  index = jnp.arange(n)
  eye = jnp.eye(n, dtype=bool)
  diagonal = jnp.sqrt(jnp.diagonal(t, axis1=-2, axis2=-1))
  r = jnp.where(eye, diagonal[..., None, :], 0)

  def column(r, j):
    above = index < j                                  # the rows solved for
    r_jj = lax.dynamic_index_in_dim(diagonal, j, axis=-1)
    system = jnp.where(eye, jnp.where(above, diagonal + r_jj, 1)[..., None, :], r)
    target = jnp.where(above, lax.dynamic_index_in_dim(t, j, axis=-1, keepdims=False), 0)
    solved = lax.linalg.triangular_solve(system, target[..., None], left_side=True, lower=False)
    solved = jnp.where(above[:, None], solved, lax.dynamic_index_in_dim(r, j, axis=-1))
    return lax.dynamic_update_index_in_dim(r, solved, j, axis=-1), None

  r, _ = lax.scan(column, r, jnp.arange(1, n))
  return r


_DB_MAX_STEPS = 40
_DB_SCALING_UNTIL = 1e-2   # determinant scaling while ||M - I|| is above this (Higham, Functions of Matrices 6.5)


def sqrtm_denman_beavers(a):
  """The scaled product-form Denman-Beavers iteration (Higham, Functions of Matrices, (6.17), (6.29)):
  M_0 = X_0 = A; X <- mu X (I + M^-1 / mu^2) / 2, M <- (I + (mu^2 M + M^-1 / mu^2) / 2) / 2 with
  mu = |det M|^(-1/(2N)), until M is the identity to rounding (or stops improving). Matrices it does
  not converge on (an eigenvalue on the closed negative real axis) give NaN. Inverses and products
  only: works on every platform."""
  n = a.shape[-1]
  eye = jnp.eye(n, dtype=a.dtype)
  eps = float(np.finfo(a.dtype).eps)

  def distance(m):
    return jnp.max(_frobenius(m - eye))

  def not_done(state):
    step, _, _, error, previous = state
    improving = (error < previous) | (error > _DB_SCALING_UNTIL)
    return (step < _DB_MAX_STEPS) & (error > n * eps) & improving

  def iterate(state):
    step, x, m, error, _ = state
    m_inverse = jnp.linalg.inv(m)
    _, log_det = jnp.linalg.slogdet(m)
    mu = jnp.where(_frobenius(m - eye) > _DB_SCALING_UNTIL, jnp.exp(-log_det / (2 * n)), 1)
    mu = mu.astype(a.dtype)[..., None, None]
    x = 0.5 * mu * jnp.matmul(x, eye + m_inverse / mu ** 2, precision=_HIGHEST)
    m = 0.5 * (eye + 0.5 * (mu ** 2 * m + m_inverse / mu ** 2))
    return step + 1, x, m, distance(m), error

  inf = jnp.asarray(np.inf, jnp.finfo(a.dtype).dtype)
  _, x, m, _, _ = lax.while_loop(not_done, iterate, (0, a, a, distance(a), inf))
  converged = _frobenius(m - eye) <= np.sqrt(eps)
  return jnp.where(converged[..., None, None], x, jnp.nan)


def _by_platform(a):
  return lax.platform_dependent(a, cpu=sqrtm_schur, default=sqrtm_denman_beavers)


# The rule's square root. Marked: `jax.export` keeps values only, so a loaded artifact would otherwise
# differentiate the Schur decomposition (no JAX derivative) instead of solving the Sylvester equation.
principal_sqrtm = export_marks.marked("matrix_square_root")(_differentiable_sqrtm(_by_platform))
# The method off the CPU, callable anywhere (tests run it on the CPU).
iterative_sqrtm = _differentiable_sqrtm(sqrtm_denman_beavers)
