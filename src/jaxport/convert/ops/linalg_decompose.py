"""Op rules: matrix decompositions, solves, determinants and Diag/DiagPart.

All rules work on the innermost two axes and batch over the rest, with jax.numpy.linalg
and jax.lax.linalg. Gradients are JAX's; where TF's gradient treats a triangle-reading
op specially, the rule reproduces it: Cholesky's gradient is symmetric (as TF's), and
SelfAdjointEigV2's lies in the lower triangle (the part it reads).

Known differences from TF:
  * Eig: eigenvalues come in LAPACK's order, not Eigen's, and each eigenvector's phase
    is LAPACK's (unit norm, largest component real); TF's order and phases differ.
    Eigenvector gradients assume distinct eigenvalues (as TF's do).
  * Svd and SelfAdjointEigV2: each singular vector / eigenvector is unique up to sign
    (real) or phase (complex); the sign chosen can differ from TF's. Qr, Cholesky, Lu,
    the solves and the determinants match TF's outputs.
  * Errors TF raises at run time are values here: a non-positive-definite Cholesky
    input gives NaN, a singular MatrixInverse/MatrixSolve gives inf/NaN.
  * TridiagonalSolve uses one solver whatever `partial_pivoting` says (results agree
    up to rounding); `perturb_singular` is not applied, so singular systems give
    inf/NaN where TF perturbs the pivots.
  * Outputs not asked for (Svd's u, v with compute_uv=False; Eig's and SelfAdjointEigV2's v with
    compute_v=False) are empty, of TF's declared shape [0]; TF's CPU kernel actually
    returns an uninitialized scalar there.
  * TF's gradients of MatrixDeterminant and LogMatrixDeterminant are wrong for complex
    inputs (and TF treats the sign as constant); JAX's, used here, match finite differences.
  * With JAX's x64 mode off, 64-bit results are 32-bit.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.ops._util import rounded_product, xp
from jaxport.convert.registry import register


def _adjoint(x):
  return jnp.conj(jnp.swapaxes(x, -1, -2))


def _reflect_lower(a):
  """The Hermitian matrix whose lower triangle is `a`'s (what a lower-reading op sees)."""
  return jnp.tril(a) + _adjoint(jnp.tril(a, -1))


def _empty(dtype):
  """TF's placeholder for an output that was not asked for (shape [0])."""
  return jnp.zeros((0,), dtype)


def _broadcast_batch(a, b):
  """`a` and `b` broadcast to their common batch shape (all but the two innermost axes)."""
  batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
  return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


# --------------------------------------------------------------------------- decompositions


# TF's CPU kernel is Eigen's row-major LLT; below 32 rows, its unblocked loop. While the rows it
# dots are short, each sum runs scalar by scalar, left to right (bit for bit with TF 2.21 up to
# 7x7; from 8x8 on, Eigen's packet kernels sum in another order).
_EIGEN_SCALAR_SUMS = 7


@register("Cholesky")
def cholesky(ctx, a):
  """Reads the lower triangle; the gradient is symmetric, as TF's. Real matrices up to 7x7 are
  factored in TF's operation order (bit for bit: an ill-conditioned matrix amplifies any other
  rounding), larger ones by XLA's Cholesky."""
  a = jnp.asarray(a)
  sym = 0.5 * (a + _adjoint(a))
  # The value of `a` (lower triangle read) with the derivative of its Hermitian part.
  a = export_marks.stop_gradient(a) + (sym - export_marks.stop_gradient(sym))
  n = a.shape[-1]
  if isinstance(n, int) and 0 < n <= _EIGEN_SCALAR_SUMS and jnp.issubdtype(a.dtype, jnp.floating):
    return _eigen_llt_unblocked(a)
  return lax.linalg.cholesky(a, symmetrize_input=False)


def _eigen_llt_unblocked(a):
  """Eigen's `llt_inplace::unblocked`, column k: L[k,k] = sqrt(a[k,k] - sum_j L[k,j]^2), then
  L[i,k] = (a[i,k] - sum_j L[i,j] L[k,j]) / L[k,k] for i > k, each sum from j = 0 up. A matrix
  that is not positive definite gives NaN throughout (XLA's convention; TF raises)."""
  n = a.shape[-1]
  rows = jnp.arange(n)
  cols, diag_ok = [], []
  for k in range(n):
    squares = dots = None
    for j in range(k):   # sums from j = 0 up, as Eigen's scalar loops; each product rounded (no FMA)
      l_kj = cols[j][..., k]
      square, product = rounded_product(l_kj * l_kj), rounded_product(cols[j] * l_kj[..., None])
      squares = square if j == 0 else squares + square
      dots = product if j == 0 else dots + product
    x = a[..., k, k] if squares is None else a[..., k, k] - squares
    diag_ok.append(x > 0)
    d = jnp.sqrt(x)
    below = a[..., :, k] if dots is None else a[..., :, k] - dots
    # Divided, as Eigen's `A21 /= x`: XLA would multiply by a rounded 1 / d across a broadcast.
    quotient = below / lax.optimization_barrier(jnp.broadcast_to(d[..., None], below.shape))
    cols.append(jnp.where(rows > k, quotient, jnp.where(rows == k, d[..., None], 0)))
  factor = jnp.stack(cols, axis=-1)
  ok = jnp.all(jnp.stack(diag_ok, axis=-1), axis=-1)
  return jnp.where(ok[..., None, None], factor, jnp.nan)


@register("SelfAdjointEigV2")
def self_adjoint_eig_v2(ctx, a):
  """Eigenvalues ascending (in `a`'s dtype) and eigenvectors as columns; reads the lower triangle."""
  a = jnp.asarray(a)
  w, v = jnp.linalg.eigh(_reflect_lower(a), symmetrize_input=True)
  w = w.astype(a.dtype)
  return (w, v) if ctx.attr("compute_v", True) else (w, _empty(a.dtype))


@export_marks.marked("eig_with_vector_derivatives")
def _eig_with_vectors(a):
  """Eigenvalues and right eigenvectors, differentiable like TF's Eig (JAX asks to opt in; an exported
  artifact keeps the opt-in through the mark)."""
  return tuple(lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=True,
                              enable_eigvec_derivs=True))


@register("Eig")
def eig(ctx, a):
  """Eigenvalues and right eigenvectors as `Tout` (complex); see the module note on order."""
  a = jnp.asarray(a)
  out_dtype = jax.dtypes.canonicalize_dtype(ctx.attr("Tout", np.result_type(a.dtype, np.complex64)))
  compute_v = ctx.attr("compute_v", True)
  results = (_eig_with_vectors(a) if compute_v else
             lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=False))
  w = results[0].astype(out_dtype)
  return (w, results[1].astype(out_dtype)) if compute_v else (w, _empty(out_dtype))


@register("Qr")
def qr(ctx, a):
  return tuple(jnp.linalg.qr(jnp.asarray(a), mode="complete" if ctx.attr("full_matrices", False) else "reduced"))


@register("Svd")
def svd(ctx, a):
  """TF's (s, u, v) with a = u diag(s) v^H: v itself, not v^H; s in `a`'s dtype."""
  a = jnp.asarray(a)
  if not ctx.attr("compute_uv", True):
    s = jnp.linalg.svd(a, compute_uv=False)
    return s.astype(a.dtype), _empty(a.dtype), _empty(a.dtype)
  u, s, vh = jnp.linalg.svd(a, full_matrices=ctx.attr("full_matrices", False))
  return s.astype(a.dtype), u, _adjoint(vh)


@register("Lu")
def lu(ctx, a):
  """Packed L (unit diagonal, below) and U, and `p` with a[..., p, :] = L @ U."""
  packed, _, permutation = lax.linalg.lu(jnp.asarray(a))
  index_dtype = jax.dtypes.canonicalize_dtype(ctx.attr("output_idx_type", np.dtype(np.int32)))
  return packed, permutation.astype(index_dtype)


# --------------------------------------------------------------------------- solves and inverses


@register("MatrixTriangularSolve")
def matrix_triangular_solve(ctx, matrix, rhs):
  """Reads one triangle of `matrix`; batch dims broadcast (as MatrixTriangularSolve does since TF 2.2)."""
  matrix, rhs = _broadcast_batch(jnp.asarray(matrix), jnp.asarray(rhs))
  adjoint = ctx.attr("adjoint", False)
  return lax.linalg.triangular_solve(matrix, rhs, left_side=True, lower=ctx.attr("lower", True),
                                     transpose_a=adjoint, conjugate_a=adjoint)


@register("MatrixSolve")
def matrix_solve(ctx, matrix, rhs):
  matrix = jnp.asarray(matrix)
  if ctx.attr("adjoint", False):
    matrix = _adjoint(matrix)
  return jnp.linalg.solve(matrix, jnp.asarray(rhs))


@register("MatrixInverse")
def matrix_inverse(ctx, a):
  a = jnp.asarray(a)
  return jnp.linalg.inv(_adjoint(a) if ctx.attr("adjoint", False) else a)


@register("TridiagonalSolve")
def tridiagonal_solve(ctx, diagonals, rhs):
  """`diagonals` is TF's compact [..., 3, M]: superdiagonal (last entry unused), diagonal,
  subdiagonal (first entry unused); `rhs` is [..., M, K]."""
  diagonals, rhs = jnp.asarray(diagonals), jnp.asarray(rhs)
  upper = diagonals[..., 0, :].at[..., -1].set(0)
  lower = diagonals[..., 2, :].at[..., 0].set(0)
  return lax.linalg.tridiagonal_solve(lower, diagonals[..., 1, :], upper, rhs)


# --------------------------------------------------------------------------- determinants


@register("MatrixDeterminant")
def matrix_determinant(ctx, a):
  return jnp.linalg.det(jnp.asarray(a))


@register("LogMatrixDeterminant")
def log_matrix_determinant(ctx, a):
  """(sign, log|det|); for complex input, sign has modulus 1 and log|det| is complex with zero imaginary part."""
  a = jnp.asarray(a)
  sign, log_abs = jnp.linalg.slogdet(a)
  return sign.astype(a.dtype), log_abs.astype(a.dtype)


# --------------------------------------------------------------------------- Diag / DiagPart


@register("Diag")
def diag(ctx, diagonal):
  """Rank k -> rank 2k: out[i1..ik, i1..ik] = diagonal[i1..ik], zero elsewhere."""
  m = xp(diagonal)
  shape = tuple(diagonal.shape)
  n = math.prod(shape)
  flat = m.reshape(diagonal, (n,))
  out = m.where(np.eye(n, dtype=bool), flat[:, None], m.zeros((), diagonal.dtype))
  return m.reshape(out, shape + shape)


@register("DiagPart")
def diag_part(ctx, x):
  """Rank 2k -> rank k: the inverse of Diag."""
  m = xp(x)
  shape = tuple(x.shape[:x.ndim // 2])
  n = math.prod(shape)
  return m.reshape(m.diagonal(m.reshape(x, (n, n))), shape)
