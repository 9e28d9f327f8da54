"""`stablehlo.custom_call`: the targets jaxport knows, each mapped to `jax.lax`.

Targets register with `@target("name")` and are called as `fn(ctx, *operands)`.
Besides jax.export's own markers (shape assertions, shardings), these are the linear
algebra kernels of jax's CPU/GPU lowerings and XLA's TPU/TF ones (see below).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.stablehlo.elementwise import canon, is_const
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.convert.stablehlo.module import TUPLE
from jaxport.errors import ShapeAssertionError, StableHLOError

_TARGETS: dict[str, Callable] = {}


def target(*names: str):
  def decorator(fn):
    for name in names:
      _TARGETS[name] = fn
    return fn
  return decorator


def handled_targets() -> frozenset[str]:
  return frozenset(_TARGETS)


@handler("stablehlo.custom_call")
def custom_call(ctx, *operands):
  name = ctx.attr("call_target_name")
  fn = _TARGETS.get(name)
  if fn is None:
    raise StableHLOError(f"custom_call @{name} in StableHLO module {ctx.call.name!r} cannot be interpreted")
  return fn(ctx, *operands)


@target("shape_assertion")
def shape_assertion(ctx, ok, *values):
  """jax.export's check that the actual input shapes satisfy the module's shape constraints."""
  if not is_const(ok):
    return []   # decided by traced values: nothing to check at trace time
  if not bool(np.asarray(ok)):
    message = ctx.attrs.get("error_message", "shape assertion failed")
    try:
      message = message.format(*[int(np.asarray(v)) for v in values])
    except (IndexError, ValueError, KeyError):
      pass
    raise ShapeAssertionError(f"the inputs do not satisfy the exported function's shape constraints: {message}")
  return []


@target("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement")
def identity(ctx, x, *_):
  return x


# --------------------------------------------------------------------------- linear algebra
#
# The LAPACK (CPU), cuSOLVER/cuBLAS/cuSPARSE (CUDA) and hipSOLVER (ROCm) kernels that
# `jax.lax.linalg` lowers to, and the XLA targets of TPU and TF lowerings (`Qr`, `Eigh`,
# ...). Each maps back to the `lax.linalg` function behind it, so `grad` and `vmap` use
# its rules, and results are laid out as the kernel lays them out: 1-based pivots,
# packed eigenvectors, `info` last. Operand/result layouts are physical only (the
# logical values are what the module sees), so they are ignored. `info` is 0, except
# that a batch element which `lax.linalg` NaN-filled (its own lowering does that when
# the kernel fails) reports 1 — the module around the call then NaN-fills it as jax
# would; `getrf` reports LAPACK's index of the first zero pivot. Scratch outputs the
# kernel leaves unspecified (the overwritten input, vectors not asked for) are the
# input or zeros.

_CHAR_FLAGS = frozenset({"uplo", "side", "trans_x", "diag", "mode", "compute_left", "compute_right", "sort"})


def _flags(ctx) -> dict:
  """The kernel's FFI attributes (`mhlo.backend_config`), LAPACK's char flags as letters."""
  config = ctx.attrs.get("mhlo.backend_config", {})
  if not isinstance(config, dict):
    return {}
  return {k: chr(v) if k in _CHAR_FLAGS and isinstance(v, int) and not isinstance(v, bool) else v
          for k, v in config.items()}


def _lower(flags: dict) -> bool:
  return bool(flags["lower"]) if "lower" in flags else flags.get("uplo", "L") == "L"


def _zeros(ctx, index: int):
  t = ctx.result_types[index]
  return np.zeros(t.shape, t.dtype)


def _info(ctx, primary):
  """The kernel's status (its last result): 1 where `primary` is all NaN in a batch element, else 0."""
  shape = ctx.result_types[-1].shape
  axes = tuple(range(len(shape), jnp.ndim(primary)))
  return jnp.all(jnp.isnan(primary), axis=axes).astype(jnp.int32)


def _diagonal(x, offset: int = 0):
  return jnp.diagonal(x, offset, axis1=-2, axis2=-1)


def _adjoint(x):
  return jnp.conj(jnp.swapaxes(x, -1, -2))


def _results(ctx, values: list) -> list:
  """`values` as the op's results: one tuple where the op returns a tuple (TF's XLA targets)."""
  if len(ctx.result_types) == 1 and ctx.result_types[0].dtype == TUPLE:
    return [tuple(values)]
  return values


@target("lapack_sgetrf_ffi", "lapack_dgetrf_ffi", "lapack_cgetrf_ffi", "lapack_zgetrf_ffi",
        "cusolver_getrf_ffi", "hipsolver_getrf_ffi")
def getrf(ctx, a):
  """LU with partial pivoting: (lu, 1-based row swaps, info = 1-based index of the first zero pivot)."""
  a = jnp.asarray(canon(a))
  # `* 1` makes a NumPy tangent a jax array: lu's JVP rule indexes it with a traced permutation
  lu, pivots, _ = lax.linalg.lu(a * jnp.ones((), a.dtype))
  zero = _diagonal(lu) == 0
  info = jnp.where(zero.any(-1), jnp.argmax(zero, axis=-1) + 1, 0).astype(jnp.int32)
  return [lu, pivots + 1, info]


@target("LuDecomposition")
def lu_decomposition(ctx, a):
  """XLA's LU (TPU): (lu, 0-based row swaps, permutation)."""
  return _results(ctx, list(lax.linalg.lu(canon(a))))


@target("cu_lu_pivots_to_permutation", "hip_lu_pivots_to_permutation")
def lu_pivots_to_permutation(ctx, pivots):
  """The permutation of 0-based row swaps; the GPU kernel skips swaps out of range."""
  size, pivots = ctx.result_type.shape[-1], jnp.asarray(canon(pivots))
  rows = lax.broadcasted_iota(pivots.dtype, pivots.shape, pivots.ndim - 1)
  pivots = jnp.where((pivots < 0) | (pivots >= size), rows, pivots)
  return lax.linalg.lu_pivots_to_permutation(pivots, size)


@target("lapack_strsm_ffi", "lapack_dtrsm_ffi", "lapack_ctrsm_ffi", "lapack_ztrsm_ffi")
def trsm(ctx, a, b):
  """Triangular solve op(a) x = b (side L) or x op(a) = b (side R); alpha is 1."""
  flags = _flags(ctx)
  trans = flags.get("trans_x", "N")
  return lax.linalg.triangular_solve(canon(a), canon(b), left_side=flags.get("side", "L") == "L",
                                     lower=flags.get("uplo", "L") == "L", transpose_a=trans != "N",
                                     conjugate_a=trans == "C", unit_diagonal=flags.get("diag", "N") == "U")


@target("lapack_spotrf_ffi", "lapack_dpotrf_ffi", "lapack_cpotrf_ffi", "lapack_zpotrf_ffi",
        "cusolver_potrf_ffi", "hipsolver_potrf_ffi")
def potrf(ctx, a):
  """Cholesky of the triangle `uplo` names; the other triangle keeps the input, as LAPACK leaves it."""
  a = canon(a)
  if _lower(_flags(ctx)):
    factor = lax.linalg.cholesky(a, symmetrize_input=False)
    out = factor + jnp.triu(a, 1)
  else:   # a = U^H U from the upper triangle: the lower Cholesky factor of a^H, adjoined
    factor = _adjoint(lax.linalg.cholesky(_adjoint(a), symmetrize_input=False))
    out = factor + jnp.tril(a, -1)
  return [out, _info(ctx, _diagonal(factor))]


@target("lapack_sgeqrf_ffi", "lapack_dgeqrf_ffi", "lapack_cgeqrf_ffi", "lapack_zgeqrf_ffi",
        "cusolver_geqrf_ffi", "hipsolver_geqrf_ffi", "Qr")
def geqrf(ctx, a):
  """Householder QR: (R above the diagonal with the reflectors below, taus)."""
  return _results(ctx, list(_geqrf(canon(a))))


@target("lapack_sorgqr_ffi", "lapack_dorgqr_ffi", "lapack_cungqr_ffi", "lapack_zungqr_ffi",
        "cusolver_orgqr_ffi", "hipsolver_orgqr_ffi", "ProductOfElementaryHouseholderReflectors")
def orgqr(ctx, a, taus):
  return _householder_product(canon(a), canon(taus))


# LAPACK's QR kernels have no JVP in JAX (jax differentiates `qr` above them). Their tangents come
# from the same algorithm written in lax (LAPACK's dgeqrf/dorgqr conventions, real dtypes), which JAX
# differentiates in both modes; the values stay the fast kernels'.

@jax.custom_jvp
def _geqrf(a):
  h, taus = jnp.linalg.qr(a, mode="raw")   # geqrf, its output transposed
  return jnp.swapaxes(h, -1, -2), taus


@_geqrf.defjvp
def _geqrf_jvp(primals, tangents):
  (a,), (da,) = primals, tangents
  _require_real(a, "geqrf")
  return _geqrf(a), jax.jvp(_householder_qr, (a,), (da,))[1]


@jax.custom_jvp
def _householder_product(h, taus):
  return lax.linalg.householder_product(h, taus)


@_householder_product.defjvp
def _householder_product_jvp(primals, tangents):
  _require_real(primals[0], "orgqr")
  return _householder_product(*primals), jax.jvp(_householder_product_lax, primals, tangents)[1]


def _require_real(a, what: str) -> None:
  if jnp.issubdtype(a.dtype, jnp.complexfloating):
    raise StableHLOError(f"the derivative of LAPACK {what} is available for real matrices only")


def _safe_norm(sq):
  """sqrt(sq) with a finite derivative where sq == 0 (those entries are masked by the caller)."""
  return jnp.sqrt(jnp.where(sq > 0, sq, 1.0))


def _householder_qr(a):
  """dgeqrf in lax: column j's reflector v (v[j] = 1) and tau zero the entries below the diagonal."""
  m, n = a.shape[-2:]
  rows, cols = jnp.arange(m), jnp.arange(n)
  taus = []
  for j in range(min(m, n)):
    x = a[..., :, j]
    below = rows > j
    alpha = x[..., j]
    norm_sq = jnp.sum(jnp.where(below, x, 0) ** 2, axis=-1)
    reflect = norm_sq > 0
    length = _safe_norm(alpha ** 2 + norm_sq)
    beta = jnp.where(alpha >= 0, -length, length)
    tau = jnp.where(reflect, (beta - alpha) / beta, 0)
    scale = jnp.where(reflect, 1 / jnp.where(reflect, alpha - beta, 1), 0)
    v = jnp.where(below, x * scale[..., None], 0) + (rows == j).astype(a.dtype)
    w = jnp.einsum("...m,...mn->...n", v, a)
    applied = a - tau[..., None, None] * v[..., :, None] * w[..., None, :]
    a = jnp.where(cols > j, applied, a)
    column = jnp.where(rows == j, jnp.where(reflect, beta, alpha)[..., None], jnp.where(below, v, x))
    a = a.at[..., :, j].set(column)
    taus.append(tau)
  return a, jnp.stack(taus, axis=-1)


def _householder_product_lax(h, taus):
  """dorgqr in lax: the first n columns of H_0 H_1 ... H_{k-1}."""
  m, n = h.shape[-2:]
  rows = jnp.arange(m)
  q = jnp.broadcast_to(jnp.eye(m, n, dtype=h.dtype), h.shape)
  for j in reversed(range(taus.shape[-1])):
    v = jnp.where(rows > j, h[..., :, j], 0) + (rows == j).astype(h.dtype)
    w = jnp.einsum("...m,...mn->...n", v, q)
    q = q - taus[..., j, None, None] * v[..., :, None] * w[..., None, :]
  return q


@target("lapack_sormqr_ffi", "lapack_dormqr_ffi", "lapack_cunmqr_ffi", "lapack_zunmqr_ffi",
        "cusolver_ormqr_ffi", "hipsolver_ormqr_ffi")
def ormqr(ctx, a, taus, c):
  """Q c, Q^H c, c Q or c Q^H without forming Q."""
  flags = _flags(ctx)
  return lax.linalg.ormqr(canon(a), canon(taus), canon(c), left=bool(flags.get("left", True)),
                          transpose=bool(flags.get("transpose", False)))


@target("lapack_ssyevd_ffi", "lapack_dsyevd_ffi", "lapack_cheevd_ffi", "lapack_zheevd_ffi",
        "cusolver_syevd_ffi", "hipsolver_syevd_ffi")
def syevd(ctx, a):
  """Hermitian eigendecomposition of one triangle: (eigenvectors, ascending eigenvalues, info)."""
  v, w = lax.linalg.eigh(canon(a), lower=_lower(_flags(ctx)), symmetrize_input=False, sort_eigenvalues=True)
  return [v, w, _info(ctx, w)]


@target("Eigh")
def xla_eigh(ctx, a):
  """XLA's Hermitian eigendecomposition (TPU, TF): backend_config "lower,sort,max_iter,tol"."""
  config = str(ctx.attrs.get("backend_config", "")).split(",")
  lower = config[0].strip() != "0"
  sort = len(config) < 2 or config[1].strip() != "0"
  v, w = lax.linalg.eigh(canon(a), lower=lower, symmetrize_input=False, sort_eigenvalues=sort)
  return _results(ctx, [v, w])


def _eig(ctx, a, left: bool, right: bool):
  outs = lax.linalg.eig(canon(a), compute_left_eigenvectors=left, compute_right_eigenvectors=right)
  w = outs[0]
  vl = outs[1] if left else None
  vr = outs[-1] if right else None
  return w, vl, vr


@target("lapack_sgeev_ffi", "lapack_dgeev_ffi", "lapack_cgeev_ffi", "lapack_zgeev_ffi",
        "cuhybrid_eig_real", "cuhybrid_eig_comp", "hiphybrid_eig_real", "hiphybrid_eig_comp")
def geev(ctx, a):
  """General eigendecomposition: ([wr, wi] for real input or [w], vl, vr, info), vectors complex."""
  flags = _flags(ctx)
  left = flags.get("compute_left") == "V" or flags.get("left") is True
  right = flags.get("compute_right") == "V" or flags.get("right") is True
  w, vl, vr = _eig(ctx, a, left, right)
  n = len(ctx.result_types)
  vl = vl if left else _zeros(ctx, n - 3)
  vr = vr if right else _zeros(ctx, n - 2)
  head = [jnp.real(w), jnp.imag(w)] if n == 5 else [w]
  return [*head, vl, vr, _info(ctx, w)]


def _pack_conjugate_pairs(w, v):
  """LAPACK's real layout of complex eigenvectors: a conjugate pair's columns hold (re, im) of the first."""
  is_real = jnp.imag(w) == 0
  pair_start = jnp.cumsum(~is_real, axis=-1) % 2 == 1
  first = (is_real | pair_start)[..., None, :]
  return jnp.where(first, jnp.real(v), -jnp.imag(v))


@target("cusolver_geev_ffi", "hipsolver_geev_ffi")
def cusolver_geev(ctx, a):
  """cuSOLVER's eigendecomposition: (a, w, vl, vr, info); real input gets packed real vectors."""
  flags = _flags(ctx)
  left, right = bool(flags.get("left", False)), bool(flags.get("right", True))
  w, vl, vr = _eig(ctx, a, left, right)
  real = np.dtype(ctx.result_types[2].dtype).kind != "c"
  vectors = []
  for v, index in ((vl, 2), (vr, 3)):
    if v is None:
      vectors.append(_zeros(ctx, index))
    else:
      vectors.append(_pack_conjugate_pairs(w, v) if real else v)
  return [a, w, *vectors, _info(ctx, w)]


@target("lapack_sgees_ffi", "lapack_dgees_ffi", "lapack_cgees_ffi", "lapack_zgees_ffi")
def gees(ctx, a):
  """Schur decomposition, unsorted: (T, Z, [wr, wi] or [w], sdim = 0, info)."""
  flags = _flags(ctx)
  if flags.get("sort", "N") != "N":
    raise StableHLOError(f"custom_call @{ctx.attr('call_target_name')} in StableHLO module {ctx.call.name!r} "
                         "sorts eigenvalues, which jaxport cannot do; export the Schur form unsorted")
  vectors = flags.get("mode", "V") == "V"
  outs = lax.linalg.schur(canon(a), compute_schur_vectors=vectors)
  t = outs[0]
  z = outs[1] if vectors else _zeros(ctx, 1)
  diag = _diagonal(t)
  sdim = _zeros(ctx, -2)
  if len(ctx.result_types) == 5:   # complex: T is triangular
    return [t, z, diag, sdim, _info(ctx, diag)]
  return [t, z, *_quasi_triangular_eigenvalues(t), sdim, _info(ctx, diag)]


def _quasi_triangular_eigenvalues(t):
  """(wr, wi) of a real Schur form, its 2x2 blocks standardized as LAPACK's dlanv2 leaves them."""
  sub, sup = _diagonal(t, -1), _diagonal(t, 1)
  im = jnp.where(sub != 0, jnp.sqrt(jnp.abs(sup)) * jnp.sqrt(jnp.abs(sub)), 0)
  pad = [(0, 0)] * (im.ndim - 1)
  return _diagonal(t), jnp.pad(im, pad + [(0, 1)]) - jnp.pad(im, pad + [(1, 0)])


@target("lapack_sgehrd_ffi", "lapack_dgehrd_ffi", "lapack_cgehrd_ffi", "lapack_zgehrd_ffi")
def gehrd(ctx, a):
  """Hessenberg reduction (rows/columns low..high = 1..n): (h with reflectors below, taus, info)."""
  flags, n = _flags(ctx), np.shape(a)[-1]
  if flags.get("low", 1) != 1 or flags.get("high", n) != n:
    raise StableHLOError(f"custom_call @{ctx.attr('call_target_name')} in StableHLO module {ctx.call.name!r} "
                         f"reduces rows {flags.get('low')}..{flags.get('high')} only; jaxport supports 1..{n}")
  h, taus = lax.linalg.hessenberg(canon(a))
  return [h, taus, _info(ctx, _diagonal(h))]


@target("lapack_ssytrd_ffi", "lapack_dsytrd_ffi", "lapack_chetrd_ffi", "lapack_zhetrd_ffi",
        "cusolver_sytrd_ffi", "hipsolver_sytrd_ffi")
def sytrd(ctx, a):
  """Tridiagonal reduction of one triangle: (reflectors, diagonal, off-diagonal, taus, info)."""
  arr, d, e, taus = lax.linalg.tridiagonal(canon(a), lower=_lower(_flags(ctx)))
  return [arr, d, e, taus, _info(ctx, d)]


@target("lapack_sgtsv_ffi", "lapack_dgtsv_ffi", "lapack_cgtsv_ffi", "lapack_zgtsv_ffi")
def gtsv(ctx, dl, d, du, b):
  """Tridiagonal solve: (dl, d, du as given — LAPACK's factors are scratch —, x, info)."""
  x = lax.linalg.tridiagonal_solve(canon(dl), canon(d), canon(du), canon(b))
  return [dl, d, du, x, _info(ctx, x)]


@target("cusparse_gtsv2_ffi", "hipsparse_gtsv2_ffi")
def gtsv2(ctx, dl, d, du, b):
  return lax.linalg.tridiagonal_solve(canon(dl), canon(d), canon(du), canon(b))


@target("tridiagonal_solve_perturbed_ffi", "cu_tridiagonal_solve_perturbed", "hip_tridiagonal_solve_perturbed")
def tridiagonal_solve_perturbed(ctx, dl, d, du, b):
  return lax.linalg.tridiagonal_solve(canon(dl), canon(d), canon(du), canon(b), perturb_singular=True)


def _svd(ctx, a, full_matrices: bool, compute_uv: bool, qr: bool):
  """(s, u, vh), or (s, None, None)."""
  algorithm = lax.linalg.SvdAlgorithm.QR if qr else None
  if not compute_uv:
    return lax.linalg.svd(canon(a), compute_uv=False, algorithm=algorithm), None, None
  u, s, vh = lax.linalg.svd(canon(a), full_matrices=full_matrices, compute_uv=True, algorithm=algorithm)
  return s, u, vh


@target("lapack_sgesdd_ffi", "lapack_dgesdd_ffi", "lapack_cgesdd_ffi", "lapack_zgesdd_ffi",
        "lapack_sgesvd_ffi", "lapack_dgesvd_ffi", "lapack_cgesvd_ffi", "lapack_zgesvd_ffi")
def lapack_svd(ctx, a):
  """SVD, mode A (full), S (reduced) or N (values only): (a, s, u, vt, info)."""
  mode = _flags(ctx).get("mode", "A")
  if mode not in ("A", "S", "N"):
    raise StableHLOError(f"custom_call @{ctx.attr('call_target_name')} in StableHLO module {ctx.call.name!r} "
                         f"has SVD mode {mode!r}; jaxport supports A, S and N")
  s, u, vh = _svd(ctx, a, mode == "A", mode != "N", "gesvd" in ctx.attr("call_target_name"))
  u = _zeros(ctx, 2) if u is None else u
  vh = _zeros(ctx, 3) if vh is None else vh
  return [a, s, u, vh, _info(ctx, s)]


@target("cusolver_gesvd_ffi", "cusolver_gesvdj_ffi", "cusolver_gesvdp_ffi",
        "hipsolver_gesvd_ffi", "hipsolver_gesvdj_ffi", "hipsolver_gesdd_ffi")
def gpu_svd(ctx, a):
  """GPU SVD: (a, s, u, vt, info); Jacobi/polar give v, not vt; `transposed` gesvd gives (vt, u)."""
  flags, name = _flags(ctx), ctx.attr("call_target_name")
  compute_uv = bool(flags.get("compute_uv", True))
  s, u, vh = _svd(ctx, a, bool(flags.get("full_matrices", True)), compute_uv, name.endswith("gesvd_ffi"))
  if not compute_uv:
    return [a, s, _zeros(ctx, 2), _zeros(ctx, 3), _info(ctx, s)]
  if name.endswith(("gesvdj_ffi", "gesvdp_ffi")):
    vectors = [u, _adjoint(vh)]
  elif flags.get("transposed", False):   # the kernel factored a^T: its u is our vt and its vt our u
    vectors = [vh, u]
  else:
    vectors = [u, vh]
  return [a, s, *vectors, _info(ctx, s)]


@target("cu_cholesky_update_ffi")
def cholesky_update(ctx, r, w):
  """Rank-1 update of an upper Cholesky factor; the vector is the kernel's scratch."""
  return [lax.linalg.cholesky_update(canon(r), canon(w)), w]


@target("cusolver_syrk_ffi", "hipsolver_syrk_ffi")
def syrk(ctx, a, c, alpha, beta):
  """alpha a a^T + beta c (a^T a with `transpose`)."""
  a = canon(a)
  at = jnp.swapaxes(a, -1, -2)
  pair = (at, a) if _flags(ctx).get("transpose", False) else (a, at)
  product = jnp.matmul(*pair, precision=lax.Precision.HIGHEST)
  return canon(alpha) * product + canon(beta) * canon(c)


@target("tf.call_tf_function")
def call_tf_function(ctx, *operands):
  """jax2tf `call_tf(..., call_tf_graph=True)`: TF function `called_index` of the enclosing
  XlaCallModule's `function_list`, run by jaxport's converter (ops/xla_call_module.py)."""
  config = ctx.attrs.get("tf.backend_config")
  config = config if isinstance(config, dict) else {}
  index = config.get("called_index", ctx.attrs.get("called_index"))
  call_tf = ctx.call.call_tf_function
  if call_tf is None or index is None:
    raise StableHLOError(f"custom_call @tf.call_tf_function in StableHLO module {ctx.call.name!r} calls a TF "
                         "function, which only an XlaCallModule node (with its function_list) provides")
  has_token = bool(config.get("has_token_input_output", ctx.attrs.get("has_token_input_output", False)))
  tokens = list(operands[:1]) if has_token else []
  outs = call_tf(int(index), list(operands[len(tokens):]))
  types = ctx.result_types[len(tokens):]
  if len(outs) != len(types):
    raise StableHLOError(f"custom_call @tf.call_tf_function in module {ctx.call.name!r}: the TF function returns "
                         f"{len(outs)} values, the call expects {len(types)}")
  return tokens + [x if np.dtype(x.dtype) == t.dtype else jnp.asarray(x, jax.dtypes.canonicalize_dtype(t.dtype))
                   for x, t in zip(outs, types)]
