"""JAX programs for the interpreter fuzz, part two: shapes, contractions, control flow, linear algebra
(custom calls) and random bits. Values and `Program` come from `hlo_fuzz_programs`."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as _P

from hlo_fuzz_programs import F32, _axes, fl, it, pick, program, shape_of, variants


# --------------------------------------------------------------------------- shapes

def shapes(rs, name=None):
  shape = shape_of(rs, rank=rs.randint(1, 4))
  name = name or pick(rs, ["pad", "pad_neg", "concat", "iota", "transpose", "reshape", "broadcast", "reverse", "slice",
                   "squeeze", "tile", "roll", "int_pad"])
  rank = len(shape)
  if name in ("pad", "pad_neg", "int_pad"):
    lo = -1 if name == "pad_neg" else 0
    config = [(int(rs.randint(lo, 3)), int(rs.randint(lo, 3)), int(rs.randint(0, 3))) for _ in range(rank)]
    config = [(a, b, i) if (d - 1) * (i + 1) + 1 + a + b >= 0 or d == 0 else (0, 0, i)
              for (a, b, i), d in zip(config, shape)]
    config = [(max(a, 0), max(b, 0), i) if d == 0 else (a, b, i) for (a, b, i), d in zip(config, shape)]
    if name == "int_pad":
      return program("shape:int_pad", lambda x: lax.pad(x, np.int32(-1), config), [it(shape)])
    return program(f"shape:{name}", lambda x, v: lax.pad(x, v, config), [fl(shape), fl(())])
  if name == "concat":
    axis = int(rs.randint(rank))
    other = tuple(int(rs.randint(0, 3)) if a == axis else d for a, d in enumerate(shape))
    return program("shape:concat", lambda x, y: jnp.concatenate([x, y * 2, x], axis=axis), [fl(shape), fl(other)])
  if name == "iota":
    return program("shape:iota", lambda x: x * jnp.arange(shape[-1], dtype=jnp.float32) +
                   lax.broadcasted_iota(jnp.int32, shape, rank - 1), [fl(shape)])
  if name == "transpose":
    perm = tuple(int(p) for p in rs.permutation(rank))
    return program("shape:transpose", lambda x: jnp.transpose(x, perm) * 2, [fl(shape)])
  if name == "reshape":
    return program("shape:reshape", lambda x: jnp.sin(x.reshape(-1)).reshape(shape[::-1]), [fl(shape)])
  if name == "broadcast":
    lead = int(rs.randint(0, 3))
    fn = lambda x: jnp.broadcast_to(x[None], (lead,) + shape) * 1.5 + jnp.broadcast_to(x[..., None], shape + (2,)).sum(-1)
    return program("shape:broadcast", fn, [fl(shape)])
  if name == "reverse":
    axes = _axes(rs, rank)
    return program("shape:reverse", lambda x: jnp.flip(x, axes), [fl(shape)])
  if name == "slice":
    return program("shape:slice", lambda x: x[..., 1::2] - x[..., ::-2][..., :1], [fl(shape)])
  if name == "squeeze":
    return program("shape:squeeze", lambda x: jnp.squeeze(x[None, ..., None], (0, -1)), [fl(shape)])
  if name == "tile":
    return program("shape:tile", lambda x: jnp.tile(x, (2,) + (1,) * (rank - 1)), [fl(shape)])
  shift = int(rs.randint(-3, 4))
  return program("shape:roll", lambda x: jnp.roll(x, shift, axis=-1), [fl(shape)])


def polymorphic(rs, name=None):
  """Exported with symbolic shapes: the dynamic_* forms, get_dimension_size, shape_assertion."""
  n = int(rs.randint(1, 4))
  name = name or pick(rs, ["concat_cumsum", "iota", "top_k", "gather", "window", "pad", "slice", "prod_window",
                           "dynamic_pad", "dynamic_gather"])
  b, = jax.export.symbolic_shape("b")
  fns = {"concat_cumsum": (lambda x: jnp.concatenate([x, jnp.cumsum(x, 0)]).reshape(-1)[::2], (b, 3), (n, 3)),
         "iota": (lambda x: x + jnp.arange(x.shape[0])[:, None], (b, 3), (n, 3)),
         "top_k": (lambda x: lax.top_k(x, x.shape[1] // 2), (3, 2 * b), (3, 2 * n)),
         "gather": (lambda x: x[jnp.argmax(x, 0)], (b, 3), (n, 3)),
         "window": (lambda x: lax.reduce_window(x, 0., lax.add, (2, 1), (1, 1), "SAME"), (b, 3), (n, 3)),
         "prod_window": (lambda x: lax.reduce_window(x, 1., lax.mul, (x.shape[0], 1), (1, 1), "VALID"), (b, 3), (n, 3)),
         "pad": (lambda x: jnp.pad(x, ((1, 2), (0, 0))), (b, 3), (n, 3)),
         "slice": (lambda x: lax.dynamic_slice_in_dim(x, 1, x.shape[0] // 2, 0), (2 * b, 3), (2 * n, 3)),
         "dynamic_pad": (lambda x: lax.pad(x, 0.5, [(0, x.shape[0], 1), (1, 0, 0)]), (b, 3), (n, 3)),
         "dynamic_gather": (lambda x: jnp.take(x, jnp.array([0, 2, 1]), axis=0) * 2, (3, b), (3, n))}
  fn, sym, concrete = fns[name]
  return program(f"poly:{name}", fn, [fl(concrete)], specs=[jax.ShapeDtypeStruct(sym, jnp.float32)],
                 rtol=1e-4, atol=1e-5)


SHAPE = (variants(shapes, ["pad", "pad_neg", "concat", "iota", "transpose", "reshape", "broadcast", "reverse", "slice",
                           "squeeze", "tile", "roll", "int_pad"]) +
         variants(polymorphic, ["concat_cumsum", "iota", "top_k", "gather", "window", "pad", "slice", "prod_window",
                                "dynamic_pad", "dynamic_gather"]))


# --------------------------------------------------------------------------- contractions

def dot_general(rs):
  batch, contract = int(rs.randint(0, 3)), int(rs.randint(0, 3))
  free_l, free_r = int(rs.randint(0, 2)), int(rs.randint(0, 2))
  size = lambda: int(pick(rs, [0, 1, 2, 3, 3]))
  b = [size() for _ in range(batch)]
  c = [size() for _ in range(contract)]
  fl_, fr = [size() for _ in range(free_l)], [size() for _ in range(free_r)]
  lhs_order = rs.permutation(batch + contract + free_l)
  rhs_order = rs.permutation(batch + contract + free_r)
  lhs_dims, rhs_dims = b + c + fl_, b + c + fr
  lhs_shape = tuple(lhs_dims[i] for i in lhs_order)
  rhs_shape = tuple(rhs_dims[i] for i in rhs_order)
  where = lambda order, k: int(np.nonzero(order == k)[0][0])
  dims = ((tuple(where(lhs_order, batch + k) for k in range(contract)),
           tuple(where(rhs_order, batch + k) for k in range(contract))),
          (tuple(where(lhs_order, k) for k in range(batch)), tuple(where(rhs_order, k) for k in range(batch))))
  precision = pick(rs, [None, lax.Precision.HIGHEST, lax.Precision.DEFAULT, (lax.Precision.HIGH, lax.Precision.HIGHEST)])
  kind = pick(rs, ["f32", "f32", "bf16_acc", "int", "complex"])
  if kind == "bf16_acc":
    fn = lambda x, y: lax.dot_general(x.astype(jnp.bfloat16), y.astype(jnp.bfloat16), dims,
                                      preferred_element_type=jnp.float32)
    return program("dot_general:bf16_acc", fn, [fl(lhs_shape), fl(rhs_shape)], rtol=1e-2, atol=1e-2,
                   grad_rtol=2e-2, grad_atol=2e-2)
  if kind == "int":
    fn = lambda x, y: lax.dot_general(x, y, dims)
    return program("dot_general:int", fn, [it(lhs_shape, np.int32, -9, 9), it(rhs_shape, np.int32, -9, 9)])
  if kind == "complex":
    fn = lambda x, y: lax.dot_general(x, y, dims, precision=precision)
    return program("dot_general:complex", fn, [fl(lhs_shape, dtype=np.complex64), fl(rhs_shape, dtype=np.complex64)],
                   rtol=1e-4, atol=1e-4, grad_rtol=1e-3, grad_atol=1e-3)
  fn = lambda x, y: lax.dot_general(x, y, dims, precision=precision)
  return program(f"dot_general:{precision}", fn, [fl(lhs_shape), fl(rhs_shape)], rtol=1e-4, atol=1e-4,
                 grad_rtol=1e-3, grad_atol=1e-3)


def convolution(rs):
  spatial = int(rs.randint(1, 3))
  fgc = int(pick(rs, [1, 1, 2]))
  bgc = 1 if fgc > 1 else int(pick(rs, [1, 1, 2]))
  cin = fgc * int(rs.randint(1, 3))
  cout = fgc * bgc * int(rs.randint(1, 3))
  n = bgc * int(rs.randint(1, 3))
  sizes = [int(rs.randint(1, 5)) for _ in range(spatial)]
  ksizes = [int(rs.randint(1, 3)) for _ in range(spatial)]
  strides = tuple(int(rs.randint(1, 3)) for _ in range(spatial))
  lhs_dil = tuple(int(pick(rs, [1, 1, 2])) for _ in range(spatial))
  rhs_dil = tuple(int(pick(rs, [1, 1, 2])) for _ in range(spatial))
  padding = pick(rs, ["SAME", "VALID", [(int(rs.randint(-1, 3)), int(rs.randint(0, 3))) for _ in range(spatial)]])
  if isinstance(padding, str) and lhs_dil != (1,) * spatial:
    padding = [(1, 1)] * spatial
  layouts = {1: [("NCH", "OIH", "NCH"), ("NHC", "HIO", "NHC")], 2: [("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC")]}
  dn = pick(rs, layouts[spatial])
  lhs_shape = [n, cin] + sizes if dn[0][1] == "C" else [n] + sizes + [cin]
  kernel = [cout, cin // fgc] + ksizes if dn[1][0] == "O" else ksizes + [cin // fgc, cout]
  fn = lambda x, k: lax.conv_general_dilated(x, k, strides, padding, lhs_dil, rhs_dil, dn, fgc, bgc,
                                             precision=lax.Precision.HIGHEST)
  try:
    jax.eval_shape(fn, jax.ShapeDtypeStruct(lhs_shape, F32), jax.ShapeDtypeStruct(kernel, F32))
  except Exception:   # noqa: BLE001 - an invalid combination: a plain one instead
    padding = "VALID"
    lhs_shape = [d if i < 2 or dn[0][1] != "C" else max(d, 3) for i, d in enumerate(lhs_shape)]
    fn = lambda x, k: lax.conv_general_dilated(x, k, strides, padding, lhs_dil, rhs_dil, dn, fgc, bgc)
    jax.eval_shape(fn, jax.ShapeDtypeStruct(lhs_shape, F32), jax.ShapeDtypeStruct(kernel, F32))
  # vmap of a batch-grouped conv: JAX's batching rule folds the vmapped axis into the batch groups through
  # zero kernel blocks, so a NaN in one value set reaches all: compared with JAX's own vmap.
  return program(f"conv:{spatial}d:fgc{fgc}:bgc{bgc}", fn, [fl(lhs_shape), fl(kernel)], rtol=1e-4, atol=1e-4,
                 grad_rtol=1e-3, grad_atol=1e-3, vmap_ref=bgc > 1)


def fft(rs, name=None):
  n = int(rs.randint(1, 5))
  name = name or pick(rs, ["fft", "ifft", "rfft", "irfft", "fft2"])
  if name == "irfft" and n == 1:   # an empty result length: jnp divides by it
    n = 2
  shape = shape_of(rs, rank=rs.randint(0, 2), empty=0.0) + (n,)
  if name == "fft2":
    shape = shape + (int(rs.randint(1, 4)),)
  fns = {"fft": lambda x, y: jnp.fft.fft(lax.complex(x, y)), "ifft": lambda x, y: jnp.fft.ifft(lax.complex(x, y)),
         "rfft": lambda x, y: jnp.fft.rfft(x) + y[..., :n // 2 + 1], "irfft": lambda x, y: jnp.fft.irfft(lax.complex(x, y)),
         "fft2": lambda x, y: jnp.fft.fft2(lax.complex(x, y))}
  return program(f"fft:{name}", fns[name], [fl(shape), fl(shape)], rtol=1e-4, atol=1e-4, grad_rtol=1e-3,
                 grad_atol=1e-3)


CONTRACTION = [dot_general, dot_general, convolution, convolution, fft]


# --------------------------------------------------------------------------- control flow

@jax.jit
def _inner(x):   # a nested jit: func.call
  return jnp.sin(x) * 2.0


def control(rs, name=None):
  shape = shape_of(rs, rank=rs.randint(0, 3), empty=0.05)
  name = name or pick(rs, ["fori", "fori_dynamic", "while", "cond", "switch", "nested", "composite", "barrier", "call",
                   "scan", "remat", "sharding"])
  x = fl(shape)
  if name == "fori":
    trips = int(rs.randint(0, 4))
    fn = lambda x: lax.fori_loop(0, trips, lambda i, c: jnp.sin(c) * (i + 1.0) + c, x)
    return program(f"control:fori:{trips}", fn, [x])
  if name == "fori_dynamic":
    fn = lambda x, n: lax.fori_loop(0, n, lambda i, c: c * 0.5 + 1.0, x)
    return program("control:fori_dynamic", fn, [x, it((), np.int32, -1, 4, edges=False)])
  if name == "while":
    fn = lambda x: lax.while_loop(lambda c: (jnp.sum(jnp.abs(c[0])) < 50.0) & (c[1] < 6),
                                  lambda c: (c[0] * 2.0 + 0.5, c[1] + 1), (x, 0))
    return program("control:while", fn, [x], grad=False)
  if name == "cond":
    fn = lambda x, p: lax.cond(p > 0, lambda v: jnp.sin(v) * p, lambda v: v - 1.0, x)
    return program("control:cond", fn, [x, fl(())])
  if name == "switch":
    fn = lambda x, i: lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * 3.0, lambda v: jnp.where(v > 0, v, 0.0)], x)
    return program("control:switch", fn, [x, it((), np.int32, -2, 5, edges=False)])
  if name == "nested":
    fn = lambda x, p: lax.fori_loop(0, 3, lambda i, c: lax.cond(p * i > 1.0, jnp.tanh, lambda v: v * 1.1, c), x)
    return program("control:nested", fn, [x, fl(())])
  if name == "composite":
    comp = lax.composite(lambda v, scale: jnp.tanh(v) * scale, name="jaxport.fuzz_scaled_tanh")
    return program("control:composite", lambda v: comp(v, scale=2.0), [x])
  if name == "barrier":
    return program("control:barrier", lambda v: lax.optimization_barrier((v * 2, v + 1))[0] * 3, [x])
  if name == "call":
    return program("control:call", lambda v: _inner(v) + _inner(v * 2), [x])
  if name == "scan":
    fn = lambda xs, c: lax.scan(lambda c, v: (c * 0.9 + v, jnp.sin(c)), c, xs)
    return program("control:scan", fn, [fl((int(rs.randint(0, 4)),) + shape), x])
  if name == "remat":
    return program("control:remat", jax.checkpoint(lambda v: jnp.sin(jnp.sin(v)) * v), [x])
  if name in _COLLECTIVES:
    mesh = jax.make_mesh((1,), ("i",))
    body = jax.shard_map(_COLLECTIVES[name], mesh=mesh, in_specs=_P(), out_specs=_P(), check_vma=False)
    return program(f"control:{name}", body, [fl((2,) + shape)])
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return program("control:sharding", lambda v: lax.with_sharding_constraint(v * 2, sharding), [x])


# Collectives of a one-device mesh (shard_map): all_reduce, all_gather, reduce_scatter, collective_permute,
# partition_id.
_COLLECTIVES = {
    "psum": lambda v: lax.psum(v * 2, "i"), "all_gather": lambda v: lax.all_gather(v, "i", tiled=True) + 1,
    "psum_scatter": lambda v: lax.psum_scatter(v, "i", tiled=True), "ppermute": lambda v: lax.ppermute(v, "i", [(0, 0)]),
    "axis_index": lambda v: v * (lax.axis_index("i") + 1.0),
}
CONTROL_KINDS = ("fori", "fori_dynamic", "while", "cond", "switch", "nested", "composite", "barrier", "call", "scan",
                 "remat", "sharding") + tuple(_COLLECTIVES)


CONTROL = variants(control, CONTROL_KINDS)


# --------------------------------------------------------------------------- linear algebra (custom calls)

def _spd(n, batch=()):
  def make(rs, edges):
    a = rs.normal(size=batch + (n, n))
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(F32)
  return make


def _well(n, batch=(), extra=0):
  def make(rs, edges):
    return (rs.normal(size=batch + (n, n + extra)) + 3 * np.eye(n, n + extra)).astype(F32)
  return make


def linalg(rs, name=None):
  n = int(rs.randint(1, 4))
  batch = pick(rs, [(), (), (2,)])
  name = name or pick(rs, ["cholesky", "triangular_solve", "lu", "qr", "qr_complete", "eigh", "svd", "solve", "inv", "det",
                   "slogdet", "eigvals", "schur", "hessenberg", "tridiagonal", "svdvals", "lu_factor"])
  if name.startswith(("tpu_", "cuda_")):   # exported for another platform: XLA's (TPU) or cuSOLVER's kernels
    platform, base = name.split("_", 1)
    return dataclasses.replace(linalg(rs, base), name=f"linalg:{name}", platform=platform)
  tol = dict(rtol=2e-3, atol=2e-3, grad_rtol=2e-2, grad_atol=2e-2)
  la, jsl = jnp.linalg, jax.scipy.linalg
  if name == "cholesky":
    return program("linalg:cholesky", la.cholesky, [_spd(n, batch)], **tol)
  if name == "triangular_solve":
    left, lower, trans = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
    unit = bool(rs.rand() < 0.3)
    m = int(rs.randint(1, 3))
    bshape = batch + ((n, m) if left else (m, n))
    fn = lambda a, b: lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=trans,
                                                  unit_diagonal=unit)
    return program(f"linalg:trsm:{left}{lower}{trans}{unit}", fn, [_well(n, batch), fl(bshape)], **tol)
  if name == "qr_complete":
    m = n + int(rs.randint(0, 2))
    return program("linalg:qr_complete", lambda a: la.qr(a, mode="complete")[1], [fl(batch + (m, n))], **tol,
                   edges=False)
  if name == "lu":
    return program("linalg:lu", jsl.lu, [_well(n)], **tol)
  if name == "lu_factor":
    return program("linalg:lu_factor", lambda a: jsl.lu_factor(a), [_well(n)], **tol)
  if name == "eigh":
    return program("linalg:eigh", lambda a: la.eigh(a)[0], [_spd(n, batch)], **tol)
  fns = {"qr": (lambda a: la.qr(a), _well(n, batch, int(rs.randint(0, 2))), True),
         "svd": (lambda a: la.svd(a, compute_uv=False), _well(n, batch), True),
         "svdvals": (lambda a: la.svd(a)[1], _well(n, batch), True),
         "solve": (lambda a, b: la.solve(a, b), None, True), "inv": (la.inv, _well(n, batch), True),
         "det": (la.det, _well(n, batch), True), "slogdet": (lambda a: la.slogdet(a)[1], _well(n, batch), True),
         "eigvals": (la.eigvals, _well(n, batch), False), "schur": (lambda a: jsl.schur(a)[0], _well(n), False),
         "hessenberg": (lambda a: jsl.hessenberg(a)[0], _well(n), False),
         "tridiagonal": (lambda dl, d, du, b: lax.linalg.tridiagonal_solve(dl, d, du, b), None, False)}
  fn, maker, grad = fns[name]
  if name == "solve":
    return program("linalg:solve", fn, [_well(n, batch), fl(batch + (n, 2))], **tol)
  if name == "tridiagonal":
    lower = lambda rs, e: np.concatenate([[0.0], rs.normal(size=n - 1)]).astype(F32)
    upper = lambda rs, e: np.concatenate([rs.normal(size=n - 1), [0.0]]).astype(F32)
    return program("linalg:tridiagonal", fn, [lower, lambda rs, e: (4 + rs.rand(n)).astype(F32), upper,
                                              fl((n, 2))], grad=False, **tol)
  return program(f"linalg:{name}", fn, [maker], grad=grad, **tol)


LINALG = variants(linalg, ["cholesky", "triangular_solve", "lu", "qr", "qr_complete", "eigh", "svd", "solve", "inv",
                          "det", "slogdet", "eigvals", "schur", "hessenberg", "tridiagonal", "svdvals", "lu_factor",
                          "tpu_cholesky", "tpu_triangular_solve", "tpu_qr", "tpu_lu", "tpu_eigh", "cuda_lu", "cuda_qr",
                          "cuda_eigh", "cuda_svdvals", "cuda_cholesky"])


# --------------------------------------------------------------------------- random bits

def _rbg_key(rs, edges):
  return rs.randint(0, 2**32, size=(4,), dtype=np.uint64).astype(np.uint32)


def _threefry_key(rs, edges):
  return rs.randint(0, 2**32, size=(2,), dtype=np.uint64).astype(np.uint32)


def random_bits(rs, name=None):
  shape = shape_of(rs, rank=rs.randint(0, 3), empty=0.05)
  name = name or pick(rs, ["bit_generator", "rbg_normal", "rbg_uniform", "rbg_split", "threefry_uniform",
                   "threefry_normal", "threefry_bits", "poly_rbg"])
  if name == "bit_generator":
    alg = pick(rs, ["RNG_DEFAULT", "RNG_THREE_FRY", "RNG_PHILOX"])
    dtype = pick(rs, [np.uint32, np.uint8, np.uint16])
    fn = lambda k: lax.rng_bit_generator(k, shape, dtype, algorithm=lax.RandomAlgorithm[alg])
    return program(f"random:bits:{alg}", fn, [_rbg_key], grad=False, vmap_ref=True)
  if name.startswith("rbg"):
    impl = pick(rs, ["rbg", "unsafe_rbg"])
    wrap = lambda k: jax.random.wrap_key_data(k, impl=impl)
    fns = {"rbg_normal": lambda k, x: jax.random.normal(wrap(k), shape) * x,
           "rbg_uniform": lambda k, x: jax.random.uniform(wrap(k), shape, minval=-x, maxval=x),
           "rbg_split": lambda k, x: jax.random.key_data(jax.random.split(wrap(k), 3))}
    return program(f"random:{name}:{impl}", fns[name], [_rbg_key, fl(())], rtol=1e-5, vmap_ref=True,
                   grad=name != "rbg_split")
  if name == "poly_rbg":
    b, = jax.export.symbolic_shape("b")
    fn = lambda k, x: jax.random.bits(jax.random.wrap_key_data(k, impl="rbg"), x.shape) + 0 * x.astype(jnp.uint32)
    m = int(rs.randint(1, 4))
    return program("random:poly_rbg", fn, [_rbg_key, fl((m, 3))], grad=False, vmap_ref=True,
                   specs=[jax.ShapeDtypeStruct((4,), jnp.uint32), jax.ShapeDtypeStruct((b, 3), jnp.float32)])
  wrap = lambda k: jax.random.wrap_key_data(k, impl="threefry2x32")
  fns = {"threefry_uniform": lambda k, x: jax.random.uniform(wrap(k), shape) * x,
         "threefry_normal": lambda k, x: jax.random.normal(wrap(k), shape) + x,
         "threefry_bits": lambda k, x: (jax.random.bits(wrap(k), shape), jax.random.randint(wrap(k), shape, -5, 9))}
  return program(f"random:{name}", fns[name], [_threefry_key, fl(())], rtol=1e-5, grad=name != "threefry_bits")


RANDOM = variants(random_bits, ["bit_generator", "rbg_normal", "rbg_uniform", "rbg_split", "threefry_uniform",
                               "threefry_normal", "threefry_bits", "poly_rbg"])
