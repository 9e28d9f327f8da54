"""StableHLO custom calls (jax's linear algebra kernels, XLA's Qr/Eigh) and the misc family.

Modules exported by jax are interpreted and compared with jax running the same export
(`exp.call`) and with the original function; CUDA exports (lowered without a GPU) are
compared with the function run here; jax's back-compatibility modules compare with the
outputs recorded on real GPUs and TPUs; TF's XLA lowering with TF.
"""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import pytest
from jax import export

import jaxport
from jaxport.convert import stablehlo

lax_linalg = jax.lax.linalg
_rng = np.random.default_rng(0)


def _mat(*shape, dtype=np.float32):
  x = _rng.standard_normal(shape)
  if np.dtype(dtype).kind == "c":
    x = x + 1j * _rng.standard_normal(shape)
  return x.astype(dtype)


def _spd(n, dtype=np.float32, batch=()):
  x = _mat(*batch, n, n, dtype=dtype)
  return (x @ np.conj(np.swapaxes(x, -1, -2)) + n * np.eye(n)).astype(dtype)


def _tridiagonal(n, dtype=np.float32):
  dl = _mat(n, dtype=dtype) * (np.arange(n) > 0)
  du = _mat(n, dtype=dtype) * (np.arange(n) < n - 1)
  return dl, _mat(n, dtype=dtype) + 5, du, _mat(n, 2, dtype=dtype)


# Targets jax only lowers to with the compatibility check off (no stability guarantee).
_UNGUARANTEED = ["cuhybrid_eig_real", "cuhybrid_eig_comp", "cusolver_geev_ffi", "cu_cholesky_update_ffi",
                 "cusolver_syrk_ffi", "cu_tridiagonal_solve_perturbed", "tridiagonal_solve_perturbed_ffi",
                 "cusolver_ormqr_ffi", "lapack_sormqr_ffi", "lapack_cunmqr_ffi", "lapack_sgesvd_ffi",
                 "lapack_cgesvd_ffi"]


def _export(f, *args, platform="cpu"):
  checks = [export.DisabledSafetyCheck.custom_call(name) for name in _UNGUARANTEED]
  exp = export.export(jax.jit(f), platforms=[platform], disabled_checks=checks)(*args)
  module = stablehlo.load_module(exp.mlir_module_serialized)
  assert stablehlo.unsupported_ops(module) == {}
  return exp, module


def _interpreted(module):
  return lambda *args: stablehlo.call_module(module, list(args))


def _assert_close(got, want, rtol=1e-5, atol=1e-5):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    g, w = np.asarray(g), np.asarray(w)
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)


SVD_QR = lax_linalg.SvdAlgorithm.QR

# name: (function, arguments for a dtype); jnp.linalg / jax.scipy.linalg / lax.linalg.
CASES = {
    "solve": (jnp.linalg.solve, lambda t: (_mat(3, 3, dtype=t), _mat(3, 2, dtype=t))),
    "solve_batched": (jnp.linalg.solve, lambda t: (_mat(2, 3, 3, dtype=t), _mat(2, 3, 2, dtype=t))),
    "cholesky": (jnp.linalg.cholesky, lambda t: (_spd(3, t),)),
    "cholesky_upper": (lambda x: jnp.linalg.cholesky(x, upper=True), lambda t: (_spd(3, t, (2,)),)),
    "cholesky_not_pd": (jnp.linalg.cholesky, lambda t: (-_spd(3, t),)),
    "qr": (jnp.linalg.qr, lambda t: (_mat(4, 3, dtype=t),)),
    "qr_complete_wide": (lambda x: jnp.linalg.qr(x, mode="complete"), lambda t: (_mat(2, 3, 5, dtype=t),)),
    "qr_raw": (lambda x: jnp.linalg.qr(x, mode="raw"), lambda t: (_mat(4, 3, dtype=t),)),
    "eigh": (jnp.linalg.eigh, lambda t: (_spd(3, t, (2,)),)),
    "eigh_upper": (lambda x: jnp.linalg.eigh(x, UPLO="U"), lambda t: (_spd(3, t),)),
    "eig": (jnp.linalg.eig, lambda t: (_mat(2, 4, 4, dtype=t),)),
    "eig_left": (lambda x: lax_linalg.eig(x, compute_right_eigenvectors=False), lambda t: (_mat(4, 4, dtype=t),)),
    "eigvals": (jnp.linalg.eigvals, lambda t: (_mat(4, 4, dtype=t),)),
    "svd": (jnp.linalg.svd, lambda t: (_mat(2, 4, 3, dtype=t),)),
    "svd_reduced_wide": (lambda x: jnp.linalg.svd(x, full_matrices=False), lambda t: (_mat(3, 5, dtype=t),)),
    "svd_values": (lambda x: jnp.linalg.svd(x, compute_uv=False), lambda t: (_mat(4, 3, dtype=t),)),
    "svd_qr": (lambda x: lax_linalg.svd(x, algorithm=SVD_QR), lambda t: (_mat(3, 5, dtype=t),)),
    "lu_rectangular": (lax_linalg.lu, lambda t: (_mat(4, 3, dtype=t),)),
    "cho_solve": (lambda a, b: jsl.cho_solve(jsl.cho_factor(a), b), lambda t: (_spd(3, t), _mat(3, 2, dtype=t))),
    "solve_triangular": (lambda a, b: jsl.solve_triangular(a, b, lower=True),
                         lambda t: (_mat(3, 3, dtype=t) + 3 * np.eye(3, dtype=t), _mat(3, 2, dtype=t))),
    "solve_triangular_adjoint": (lambda a, b: jsl.solve_triangular(a, b, trans=2, unit_diagonal=True),
                                 lambda t: (_mat(3, 3, dtype=t), _mat(3, 2, dtype=t))),
    "triangular_solve_right": (lambda a, b: lax_linalg.triangular_solve(a, b, left_side=False, transpose_a=True),
                               lambda t: (_mat(3, 3, dtype=t) + 3 * np.eye(3, dtype=t), _mat(2, 3, dtype=t))),
    "schur": (jsl.schur, lambda t: (_mat(4, 4, dtype=t),)),
    "schur_form_only": (lambda x: lax_linalg.schur(x, compute_schur_vectors=False),
                        lambda t: (_mat(2, 4, 4, dtype=t),)),
    "hessenberg": (lambda x: jsl.hessenberg(x, calc_q=True), lambda t: (_mat(4, 4, dtype=t),)),
    "tridiagonal": (lax_linalg.tridiagonal, lambda t: (_spd(4, t),)),
    "tridiagonal_upper": (lambda x: lax_linalg.tridiagonal(x, lower=False), lambda t: (_spd(4, t),)),
    "tridiagonal_solve": (lax_linalg.tridiagonal_solve, lambda t: _tridiagonal(4, t)),
    "tridiagonal_solve_perturbed": (lambda *a: lax_linalg.tridiagonal_solve(*a, perturb_singular=True),
                                    lambda t: _tridiagonal(4, t)),
    "householder_product": (lax_linalg.householder_product, lambda t: (_mat(4, 3, dtype=t), _mat(3, dtype=t))),
    "ormqr": (lambda a, taus, c: lax_linalg.ormqr(a, taus, c, left=False, transpose=True),
              lambda t: (_mat(4, 3, dtype=t), _mat(3, dtype=t), _mat(2, 4, dtype=t))),
}
# Cases exported together, one module per family, so the file compiles few modules.
FAMILIES = {
    "lu": ["solve_batched", "lu_rectangular"],
    "triangular": ["cho_solve", "solve_triangular", "solve_triangular_adjoint", "triangular_solve_right"],
    "cholesky": ["cholesky", "cholesky_upper", "cholesky_not_pd"],
    "qr": ["qr", "qr_complete_wide", "qr_raw", "householder_product", "ormqr"],
    "eigh": ["eigh", "eigh_upper", "tridiagonal", "tridiagonal_upper"],
    "eig": ["eig", "eig_left", "eigvals", "schur", "schur_form_only", "hessenberg"],
    "svd": ["svd", "svd_reduced_wide", "svd_values", "svd_qr"],
    "tridiagonal_solve": ["tridiagonal_solve", "tridiagonal_solve_perturbed"],
}
_NOT_ON_CUDA = {"schur", "schur_form_only", "hessenberg"}   # jax lowers these for CPU only
# (CUDA's triangular solves are stablehlo.triangular_solve, not custom calls.)


def _family(names, dtype, cases=None):
  """(one function computing every case, its flat arguments)."""
  cases = cases or CASES
  fns, arity, args = [], [], []
  for name in names:
    f, make = cases[name]
    case_args = make(dtype)
    fns.append(f)
    arity.append(len(case_args))
    args.extend(case_args)
  def f(*flat):
    outs, i = [], 0
    for fn, n in zip(fns, arity):
      outs.append(fn(*flat[i:i + n]))
      i += n
    return outs
  return f, args


_COMPLEX_FAMILIES = ["triangular", "qr", "eigh", "eig", "svd"]


@pytest.mark.parametrize("family, dtype", [(f, np.float32) for f in FAMILIES]
                         + [(f, np.complex64) for f in _COMPLEX_FAMILIES])
def test_cpu_export_matches_jax(family, dtype):
  f, args = _family(FAMILIES[family], dtype)
  exp, module = _export(f, *args)
  _assert_close(jax.jit(_interpreted(module))(*args), exp.call(*args), rtol=1e-6, atol=1e-6)


def test_cpu_export_eager_and_float64():
  f, args = _family(["cholesky_upper", "qr", "eigh"], np.float32)
  exp, module = _export(f, *args)
  _assert_close(_interpreted(module)(*args), exp.call(*args))
  with jax.enable_x64(True):
    f, args = _family(["solve", "eigh"], np.float64)
    exp, module = _export(f, *args)
    _assert_close(jax.jit(_interpreted(module))(*args), exp.call(*args), rtol=1e-12, atol=1e-12)


_CUDA_CASES = {
    **CASES,
    "svd_qr_tall_reduced": (lambda x: lax_linalg.svd(x, full_matrices=False, algorithm=SVD_QR),
                            lambda t: (_mat(5, 3, dtype=t),)),
    "svd_qr_wide_values": (lambda x: lax_linalg.svd(x, compute_uv=False, algorithm=SVD_QR),
                           lambda t: (_mat(3, 5, dtype=t),)),
    "svd_jacobi_economic": (lambda x: jnp.linalg.svd(x, full_matrices=False), lambda t: (_mat(36, 34, dtype=t),)),
    "cholesky_update": (lax_linalg.cholesky_update,
                        lambda t: (np.linalg.cholesky(_spd(3, t)).T.copy(), _mat(3, dtype=t))),
    "symmetric_product": (lambda a, c: lax_linalg.symmetric_product(a, c, alpha=2.0, beta=0.5),
                          lambda t: (_mat(3, 5, dtype=t), _spd(3, t))),
}
_CUDA_FAMILIES = {
    **{k: [n for n in v if n not in _NOT_ON_CUDA] for k, v in FAMILIES.items() if k != "triangular"},
    "svd": FAMILIES["svd"] + ["svd_qr_tall_reduced", "svd_qr_wide_values", "svd_jacobi_economic"],
    "real_only": ["cholesky_update", "symmetric_product"],
}


@pytest.mark.parametrize("family, dtype", [(f, np.float32) for f in _CUDA_FAMILIES]
                         + [(f, np.complex64) for f in ("qr", "eigh", "svd")])
def test_cuda_export_runs_here(family, dtype):
  """Lowered for CUDA (cuSOLVER layouts: Jacobi SVD's v, transposed gesvd, ...), run on this machine."""
  f, args = _family(_CUDA_FAMILIES[family], dtype, _CUDA_CASES)
  _, module = _export(f, *args, platform="cuda")
  _assert_close(jax.jit(_interpreted(module))(*args), jax.jit(f)(*args), rtol=2e-5, atol=2e-5)


def test_cusolver_geev_packs_real_eigenvectors():
  """cuSOLVER's geev returns real vectors in LAPACK's (re, im) pair layout; the module unpacks them."""
  from unittest import mock
  import jax._src.lax.linalg as jax_linalg   # pretend cuSOLVER is new enough to get cusolver_geev_ffi
  x = _mat(5, 5)
  f = lambda x: lax_linalg.eig(x, compute_left_eigenvectors=False)
  with mock.patch.object(jax_linalg, "cuda_versions", mock.Mock(cusolver_get_version=lambda: 11701)):
    exp, module = _export(f, x, platform="cuda")
  assert "cusolver_geev_ffi" in exp.mlir_module()
  _assert_close(jax.jit(_interpreted(module))(x), jax.jit(f)(x), rtol=1e-6, atol=1e-6)


def test_grad_and_vmap_through_interpreted_solve_inv_cholesky_eigh_svd():
  def f(a, b, spd, tall):
    return (jnp.sum(jnp.linalg.solve(a, b) ** 2) + jnp.sum(jnp.sin(jnp.linalg.inv(a)))
            + jnp.sum(jnp.linalg.cholesky(spd) * jnp.arange(3.0))
            + jnp.sum(jnp.linalg.eigvalsh(spd) * jnp.arange(3.0)) + jnp.sum(jnp.abs(jnp.linalg.eigh(spd)[1][:, 0]))
            + jnp.sum(jnp.linalg.svd(tall, compute_uv=False) * jnp.arange(3.0))
            + jnp.sum(jnp.abs(jnp.linalg.svd(tall, full_matrices=False)[0])))
  args = (_mat(3, 3), _mat(3, 2), _spd(3), _mat(4, 3))
  _, module = _export(f, *args)
  g = lambda *a: _interpreted(module)(*a)[0]
  argnums = tuple(range(len(args)))
  _assert_close(jax.jit(jax.grad(g, argnums))(*args), jax.jit(jax.grad(f, argnums))(*args), rtol=1e-4, atol=1e-5)
  batched = [np.stack([x, x * 1.1]) for x in args]
  _assert_close(jax.jit(jax.vmap(g))(*batched), jax.jit(jax.vmap(f))(*batched), rtol=1e-5)


def test_jvp_through_interpreted_solve_with_numpy_tangents():
  a, b = _mat(3, 3), _mat(3, 2)
  f = lambda a, b: jnp.linalg.solve(a, b)
  _, module = _export(f, a, b)
  g = lambda *args: _interpreted(module)(*args)[0]
  tangents = (np.full_like(a, 0.1), np.full_like(b, -0.2))   # NumPy tangents reach lu's JVP rule
  _assert_close(jax.jit(lambda a, b: jax.jvp(g, (a, b), tangents))(a, b), jax.jvp(f, (a, b), tangents),
                rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- the kernels themselves

def _column_major(ndim):   # major-to-minor, as jax.ffi.ffi_call takes layouts
  return tuple(reversed((ndim - 2, ndim - 1, *range(ndim - 3, -1, -1)))) if ndim >= 2 else tuple(range(ndim))


def _kernel(target, results, *operands, **attrs):
  """(the LAPACK kernel's outputs, the interpreted call's), for one bare custom call."""
  shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in results]
  call = jax.ffi.ffi_call(target, shapes, input_layouts=[_column_major(np.ndim(x)) for x in operands],
                          output_layouts=[_column_major(len(s.shape)) for s in shapes])
  exp, module = _export(lambda *xs: call(*xs, **attrs), *operands)
  return exp.call(*operands), jax.jit(_interpreted(module))(*operands)


def _flag(letter):
  return np.uint8(ord(letter))


def test_getrf_pivots_are_one_based_and_info_names_the_first_zero_pivot():
  singular = np.array([[1, 2, 3], [2, 4, 6], [1, 0, 1]], np.float32)
  want, got = _kernel("lapack_sgetrf_ffi", [((3, 3), np.float32), ((3,), np.int32), ((), np.int32)], singular)
  _assert_close(got, want)
  assert int(got[2]) == 3 and got[1].min() >= 1


def test_potrf_keeps_the_other_triangle_and_reports_failure():
  a = _spd(3)
  for uplo in "LU":
    want, got = _kernel("lapack_spotrf_ffi", [((3, 3), np.float32), ((), np.int32)], a, uplo=_flag(uplo))
    _assert_close(got, want)
  not_pd = np.array([[4, 1, 1], [1, -3, 0], [1, 0, 2]], np.float32)
  want, got = _kernel("lapack_spotrf_ffi", [((3, 3), np.float32), ((), np.int32)], not_pd, uplo=_flag("L"))
  assert int(want[1]) > 0 and int(got[1]) > 0   # LAPACK names the minor; jaxport reports 1
  np.testing.assert_array_equal(np.triu(got[0], 1), np.triu(not_pd, 1))


def test_real_schur_and_eig_give_lapacks_wr_wi():
  x = np.array([[0, -1, 0, 0], [1, 0, 0, 0], [0, 0, 2, 1], [0, 0, 0, 3]], np.float32) + 0.1
  vec, val = ((4, 4), np.float32), ((4,), np.float32)
  want, got = _kernel("lapack_sgees_ffi", [vec, vec, val, val, ((), np.int32), ((), np.int32)], x,
                      mode=_flag("V"), sort=_flag("N"))
  _assert_close(got[2:], want[2:])   # wr, wi (a conjugate pair, +im first), sdim, info
  assert float(got[3][0]) > 0 > float(got[3][1])
  cvec = ((4, 4), np.complex64)
  want, got = _kernel("lapack_sgeev_ffi", [val, val, cvec, cvec, ((), np.int32)], x,
                      compute_left=_flag("N"), compute_right=_flag("V"))
  _assert_close([got[0], got[1], got[3], got[4]], [want[0], want[1], want[3], want[4]])


def test_svd_without_vectors_and_sorted_schur_error():
  x = _mat(4, 3)
  results = [((4, 3), np.float32), ((3,), np.float32), ((4, 4), np.float32), ((3, 3), np.float32), ((), np.int32)]
  want, got = _kernel("lapack_sgesdd_ffi", results, x, mode=_flag("N"))
  _assert_close([got[1], got[4]], [want[1], want[4]])
  module = stablehlo.load_module("""
      func.func @main(%a: tensor<2x2xf32>) -> tensor<2x2xf32> {
        %0:6 = stablehlo.custom_call @lapack_sgees_ffi(%a)
            {mhlo.backend_config = {mode = 86 : ui8, sort = 83 : ui8}} : (tensor<2x2xf32>)
            -> (tensor<2x2xf32>, tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>, tensor<i32>, tensor<i32>)
        return %0#0 : tensor<2x2xf32>
      }""")
  with pytest.raises(jaxport.StableHLOError, match="sorts eigenvalues"):
    stablehlo.call_module(module, [np.eye(2, dtype=np.float32)])


# --------------------------------------------------------------------------- recorded on devices

_BACK_COMPAT = "jax._src.internal_test_util.export_back_compat_test_data."
_RECORDED = [
    ("cuda_lu_cusolver_getrf", "data_2024_08_19", "f32"),
    ("cuda_lu_pivots_to_permutation", "data_2025_04_01", None),   # out-of-range swaps are skipped
    ("cuda_cholesky_solver_potrf", "data_2025_10_15", "c64"),
    ("cuda_qr_cusolver_geqrf", "data_2024_09_26", "f32"),
    ("cuda_eigh_cusolver_syev", "data_2024_09_30", "f32"),
    ("cuda_svd_cusolver_gesvd", "data_2024_10_08", "jacobi/f32"),
    ("cuda_svd_cusolver_gesvd", "data_2024_10_08", "qr/c64"),
    ("cuda_tridiagonal_cusolver_sytrd", "data_2025_01_09", "f32"),
    ("rocm_svd_hipsolver_gesvd", "data_2026_02_04", "gesdd/f32"),
    ("tpu_Lu", "data_2023_03_21", None),
    ("tpu_Qr", "data_2023_03_17", None),
    ("tpu_Eigh", "data", None),
    ("cpu_schur_lapack_gees", "data_2024_11_29", "f32"),
]


def _reconstruct(name, outs):
  """What the decomposition determines uniquely: eigen/singular vectors vary by device."""
  if "eigh" in name or "Eigh" in name:
    v, w = outs
    return [w, (v * w[..., None, :]) @ np.conj(np.swapaxes(v, -1, -2))]
  if "svd" in name:
    u, s, vh = outs
    k = s.shape[-1]
    return [s, (u[..., :k] * s[..., None, :]) @ vh[..., :k, :]]
  if "schur" in name:
    t, z = outs
    return [z @ t @ np.conj(z.T)]
  return list(outs)


@pytest.mark.parametrize("source, data, key", _RECORDED)
def test_recorded_device_outputs(source, data, key):
  data = getattr(pytest.importorskip(_BACK_COMPAT + source), data)
  for part in (key.split("/") if key else []):
    data = data[part]
  module = stablehlo.load_module(data["mlir_module_text"])
  assert stablehlo.unsupported_ops(module) == {}
  with jax.enable_x64(True):
    got = jax.jit(_interpreted(module))(*data["inputs"])
  want = [np.asarray(w) for w in data["expected_outputs"]]
  got = [np.asarray(g).astype(w.dtype) for g, w in zip(got, want)]
  tol = 2e-3 if "tpu" in source else 2e-5   # TPUs multiply in bf16 passes
  for g, w in zip(_reconstruct(source, got), _reconstruct(source, want)):
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())))


# --------------------------------------------------------------------------- TF's XLA lowering

def _tf_module(tf, f, *args):
  tf_fn = tf.function(f, jit_compile=True)
  text = tf_fn.experimental_get_compiler_ir(*[tf.constant(a) for a in args])(stage="stablehlo")
  module = stablehlo.load_module(text)
  assert stablehlo.unsupported_ops(module) == {}
  return module, [np.asarray(x) for x in tf.nest.flatten(tf_fn(*[tf.constant(a) for a in args]))]


def test_tf_linalg_lowering_qr_eigh_solve():
  tf = pytest.importorskip("tensorflow")
  def f(x, s, a, b):
    q, r = tf.linalg.qr(x, full_matrices=True)
    w, v = tf.linalg.eigh(s)
    return q, r, w, tf.matmul(v * w, v, transpose_b=True), tf.linalg.solve(a, b)
  args = (_mat(4, 3), _spd(3), _mat(3, 3), _mat(3, 2))
  module, want = _tf_module(tf, f, *args)
  assert {"Qr", "ProductOfElementaryHouseholderReflectors", "Eigh"} <= {
      op.attrs.get("call_target_name") for op in _all_ops(module)}
  _assert_close(jax.jit(_interpreted(module))(*args), want, rtol=2e-5, atol=2e-5)


def _all_ops(module):
  ops = []
  def walk(block):
    for op in block.ops:
      ops.append(op)
      for region in op.regions:
        walk(region)
  for fn in module.functions.values():
    walk(fn.block)
  return ops


def test_tf_fused_batch_norm_training_inference_and_grad():
  tf = pytest.importorskip("tensorflow")
  x, scale, offset = _mat(2, 3, 3, 4), _mat(4), _mat(4)
  mean, variance = _mat(4), np.abs(_mat(4)) + 0.5
  weights = np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)
  def forward(x, s, o, m, v):
    train = tf.compat.v1.nn.fused_batch_norm(x, s, o, is_training=True)[:3]
    infer = tf.compat.v1.nn.fused_batch_norm(x, s, o, m, v, is_training=False)[0]
    return (*train, infer)
  def loss(x, s, o):   # NCHW: feature_index 1
    y = tf.compat.v1.nn.fused_batch_norm(x, s, o, is_training=True, data_format="NCHW")[0]
    return tf.reduce_sum(y * y * weights)
  def grads(x, s, o):
    with tf.GradientTape() as tape:
      tape.watch([x, s, o])
      value = loss(x, s, o)
    return tape.gradient(value, [x, s, o])
  module, want = _tf_module(tf, forward, x, scale, offset, mean, variance)
  assert {"stablehlo.batch_norm_training", "stablehlo.batch_norm_inference"} <= module.op_names()
  _assert_close(jax.jit(_interpreted(module))(x, scale, offset, mean, variance), want, rtol=1e-4, atol=2e-5)
  nchw = (np.moveaxis(x, 3, 1).copy(), scale, offset)
  module, want = _tf_module(tf, grads, *nchw)
  assert "stablehlo.batch_norm_grad" in module.op_names()
  _assert_close(jax.jit(_interpreted(module))(*nchw), want, rtol=1e-4, atol=1e-4)
  # jax's gradient through the interpreted forward pass matches TF's batch_norm_grad
  module, _ = _tf_module(tf, loss, *nchw)
  g = lambda *a: _interpreted(module)(*a)[0]
  _assert_close(jax.jit(jax.grad(g, (0, 1, 2)))(*nchw), want, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- misc

def test_map_runs_its_region_elementwise_under_jit_vmap_and_grad():
  module = stablehlo.load_module("""
      func.func @main(%x: tensor<2x3xf32>, %y: tensor<2x3xf32>) -> tensor<2x3xf32> {
        %0 = "stablehlo.map"(%x, %y) ({
          ^bb0(%a: tensor<f32>, %b: tensor<f32>):
            %m = stablehlo.maximum %a, %b : tensor<f32>
            %p = stablehlo.multiply %m, %a : tensor<f32>
            stablehlo.return %p : tensor<f32>
        }) {dimensions = array<i64: 0, 1>} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>
        return %0 : tensor<2x3xf32>
      }""")
  x, y = _mat(2, 3), _mat(2, 3)
  f = lambda x, y: jnp.maximum(x, y) * x
  g = lambda x, y: _interpreted(module)(x, y)[0]
  _assert_close(g(x, y), f(x, y))
  _assert_close(jax.jit(g)(x, y), f(x, y))
  xs, ys = np.stack([x, y]), np.stack([y, x])
  _assert_close(jax.jit(jax.vmap(g))(xs, ys), jax.vmap(f)(xs, ys))
  _assert_close(jax.jit(jax.grad(lambda x: g(x, y).sum()))(x), jax.grad(lambda x: f(x, y).sum())(x))


def test_one_device_collectives_and_ids_match_jax():
  mesh = jax.make_mesh((1,), ("i",))
  def body(x):
    return (jax.lax.psum(x, "i") + jax.lax.all_gather(x, "i", tiled=True) + jax.lax.psum_scatter(x, "i", tiled=True)
            + jax.lax.ppermute(x, "i", [(0, 0)]) + jax.lax.axis_index("i") + jax.lax.pmax(x, "i"))
  f = lambda x: jax.shard_map(body, mesh=mesh, in_specs=jax.P(), out_specs=jax.P(), check_vma=False)(x)
  x = np.arange(4, dtype=np.float32)
  exp, module = _export(f, x)
  assert {"stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
          "stablehlo.collective_permute", "stablehlo.partition_id"} <= module.op_names()
  _assert_close(_interpreted(module)(x), [exp.call(x)])
  _assert_close(jax.jit(_interpreted(module))(x), [f(x)])


def test_collectives_across_processes_raise_and_unsent_permute_is_zero():
  many = stablehlo.load_module("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = "stablehlo.all_reduce"(%x) ({
          ^bb0(%a: tensor<f32>, %b: tensor<f32>):
            %s = stablehlo.add %a, %b : tensor<f32>
            stablehlo.return %s : tensor<f32>
        }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }""")
  x = np.arange(4, dtype=np.float32)
  with pytest.raises(jaxport.StableHLOError, match="one process"):
    stablehlo.call_module(many, [x])
  permute = stablehlo.load_module("""
      func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>, tensor<ui32>) {
        %0 = "stablehlo.collective_permute"(%x) {source_target_pairs = dense<> : tensor<0x2xi64>}
            : (tensor<4xf32>) -> tensor<4xf32>
        %1 = "stablehlo.all_to_all"(%x) {split_dimension = 0 : i64, concat_dimension = 0 : i64, split_count = 1 : i64,
            replica_groups = dense<[[0]]> : tensor<1x1xi64>} : (tensor<4xf32>) -> tensor<4xf32>
        %2 = stablehlo.replica_id : tensor<ui32>
        return %0, %1, %2 : tensor<4xf32>, tensor<4xf32>, tensor<ui32>
      }""")
  zeros, same, replica = stablehlo.call_module(permute, [x])
  _assert_close([zeros, same, replica], [np.zeros(4, np.float32), x, np.uint32(0)])


@pytest.mark.parametrize("shape", [(4, 3), (3, 3), (2, 5, 2)])
def test_qr_kernels_differentiate_in_both_modes(shape):
  """LAPACK geqrf/orgqr have no JAX derivative; the interpreter gives them lax-written tangents."""
  a = np.random.RandomState(0).normal(size=shape).astype(np.float32)
  da = np.random.RandomState(1).normal(size=shape).astype(np.float32)
  f = lambda a: jnp.linalg.qr(a)
  exp = jax.export.export(jax.jit(f), platforms=["cpu"])(a)
  module = stablehlo.load_module(exp.mlir_module_serialized)
  g = lambda a: tuple(stablehlo.call_module(module, [a]))
  for got, want in zip(jax.tree.leaves(jax.jvp(g, (a,), (da,))), jax.tree.leaves(jax.jvp(f, (a,), (da,)))):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
  loss = lambda fn: (lambda a: sum(jnp.sum(jnp.sin(o)) for o in fn(a)))
  np.testing.assert_allclose(jax.grad(loss(g))(a), jax.grad(loss(f))(a), atol=2e-5, rtol=2e-5)
