"""Property-based differential fuzz of the op rules against TF (jaxport issue 14, "Fuzz").

Every family draws random shapes (0-size and 0-d included), dtypes, attributes and edge values
(NaN, ±inf, -0, extremes, denormals, integer min/max), and `fuzz_engine.run_case` compares the
rule with TF's kernel three ways: NumPy constant folding, eager jax, and `jax.jit`.
Where TF raises for an input, the rule must raise too or the case counts as filtered.
Known differences are listed in `fuzz_differences.DOCUMENTED_DIFFERENCES`, and only those cases are
excused.
"""
from __future__ import annotations

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import fuzz_engine as fz
from fuzz_engine import FLOATS, INTS, REALS, SHAPES, SINTS, Case, fill, np_dtype, sample
from fuzz_differences import documented

pytestmark = pytest.mark.slow

C64 = ("complex64",)


# --------------------------------------------------------------------------- elementwise


# op -> (dtypes TF accepts, tolerance scale: 0 exact-ish arithmetic, 8 transcendental, 64 special)
UNARY = {
    "Neg": (FLOATS + SINTS + C64, 1), "Abs": (FLOATS + SINTS, 1), "Sign": (FLOATS + SINTS, 1),
    "Square": (FLOATS + SINTS + C64, 1), "Sqrt": (FLOATS + C64, 4), "Rsqrt": (FLOATS, 4),
    "Exp": (FLOATS + C64, 8), "Expm1": (FLOATS, 8), "Log": (FLOATS + C64, 8), "Log1p": (FLOATS, 8),
    "Sin": (FLOATS, 8), "Cos": (FLOATS, 8), "Tan": (FLOATS, 8), "Asin": (FLOATS, 8),
    "Acos": (FLOATS, 8), "Atan": (FLOATS, 8), "Sinh": (FLOATS, 8), "Cosh": (FLOATS, 8),
    "Tanh": (FLOATS, 8), "Asinh": (FLOATS, 8), "Acosh": (FLOATS, 8), "Atanh": (FLOATS, 8),
    "Floor": (FLOATS, 1), "Ceil": (FLOATS, 1), "Rint": (FLOATS, 1), "Round": (FLOATS + SINTS, 1),
    "IsNan": (FLOATS, 1), "IsInf": (FLOATS, 1), "IsFinite": (FLOATS, 1),
    "Reciprocal": (FLOATS + SINTS, 1), "Inv": (FLOATS, 1), "Sigmoid": (FLOATS, 8),
    "Softplus": (FLOATS, 8), "Softsign": (FLOATS, 4), "Relu": (REALS, 1), "Relu6": (REALS, 1),
    "Elu": (FLOATS, 8), "Selu": (FLOATS, 8), "Erf": (FLOATS, 8), "Erfc": (FLOATS, 8),
    "Lgamma": (FLOATS, 64), "Digamma": (FLOATS, 64), "Erfinv": (FLOATS, 64), "Ndtri": (FLOATS, 64),
    "BesselI0e": (FLOATS, 64), "BesselI1e": (FLOATS, 64), "Invert": (INTS, 1),
    "LogicalNot": (("bool",), 1), "PopulationCount": (INTS, 1), "ZerosLike": (REALS + ("bool",), 1),
    "OnesLike": (REALS + ("bool",), 1), "Real": (C64, 1), "Imag": (C64, 1), "Conj": (C64, 1),
    "Angle": (C64, 8), "ComplexAbs": (C64, 4),
}

BINARY = {
    "Add": (REALS + C64, 1), "AddV2": (REALS + C64, 1), "Sub": (REALS + C64, 1),
    "Mul": (REALS + C64, 1), "Div": (REALS + C64, 1), "RealDiv": (FLOATS + C64, 1),
    "FloorDiv": (REALS, 1), "FloorMod": (REALS, 1), "TruncateDiv": (REALS, 1),
    "TruncateMod": (FLOATS + SINTS, 1), "Mod": (FLOATS + SINTS, 1), "Maximum": (REALS, 1),
    "Minimum": (REALS, 1), "Pow": (FLOATS + ("int32", "int64") + C64, 8), "Atan2": (FLOATS, 8),
    "SquaredDifference": (FLOATS + ("int32", "int64"), 1), "DivNoNan": (FLOATS + C64, 1),
    "MulNoNan": (FLOATS + C64, 1), "Xdivy": (FLOATS, 4), "Xlogy": (FLOATS, 8),
    "Xlog1py": (FLOATS, 8), "BitwiseAnd": (INTS, 1), "BitwiseOr": (INTS, 1),
    "BitwiseXor": (INTS, 1), "LeftShift": (INTS, 1), "RightShift": (INTS, 1),
    "LogicalAnd": (("bool",), 1), "LogicalOr": (("bool",), 1),
    "Equal": (REALS + ("bool",) + C64, 1), "NotEqual": (REALS + ("bool",) + C64, 1),
    "Less": (REALS, 1), "LessEqual": (REALS, 1), "Greater": (REALS, 1), "GreaterEqual": (REALS, 1),
    "Igamma": (("float32", "float64"), 256), "Igammac": (("float32", "float64"), 256),
    "Zeta": (("float32", "float64"), 256), "Polygamma": (("float32", "float64"), 256),
    "Complex": (("float32",), 1), "ApproximateEqual": (FLOATS, 1),
}
DIVISIONS = {"Div", "FloorDiv", "FloorMod", "TruncateDiv", "TruncateMod", "Mod"}


def _shape(rs):
  return sample(rs, SHAPES)


def unary_case(rs) -> Case:
  op = sample(rs, sorted(UNARY))
  dtypes, scale = UNARY[op]
  dtype = sample(rs, fz.dtypes_for(op, dtypes))
  x = fill(rs, dtype, _shape(rs), edges=rs.rand() < 0.5)
  attrs = {}
  if op == "LeakyRelu":
    attrs["alpha"] = float(sample(rs, [0.0, 0.2, 1.5, -0.5]))
  return Case(op, [x], attrs), scale


def binary_case(rs) -> Case:
  op = sample(rs, sorted(BINARY))
  dtypes, scale = BINARY[op]
  dtype = sample(rs, fz.dtypes_for(op, dtypes))
  edges = rs.rand() < 0.5
  shape = _shape(rs)
  a_shape, b_shape = (shape, fz.broadcast_partner(rs, shape))
  if rs.rand() < 0.5:
    a_shape, b_shape = b_shape, a_shape
  x, y = fill(rs, dtype, a_shape, edges), fill(rs, dtype, b_shape, edges)
  if op in DIVISIONS and dtype in SINTS:   # INT_MIN / -1 traps (SIGFPE) in TF's C++ kernel
    y = np.where(y == -1, np.ones_like(y), y)
  if op in ("LeftShift", "RightShift"):   # shifts within the width; TF's out-of-range shifts vary by platform
    bits = fz.range_type(np_dtype(dtype)).itemsize * 8
    y = fill(rs, dtype, b_shape, False, pool=np.arange(0, bits, 3))
  attrs = {"tolerance": float(sample(rs, [1e-5, 0.5, 2.0]))} if op == "ApproximateEqual" else {}
  return Case(op, [x, y], attrs), scale


def leaky_relu_case(rs):
  dtype = sample(rs, FLOATS)
  x = fill(rs, dtype, _shape(rs), edges=rs.rand() < 0.5)
  return Case("LeakyRelu", [x], {"alpha": float(sample(rs, [0.0, 0.2, 1.5, -0.5]))}), 1


def cast_case(rs):
  src = sample(rs, fz.dtypes_for("Cast", REALS + ("bool",) + C64, "SrcT"))
  dst = sample(rs, fz.dtypes_for("Cast", REALS + ("bool",) + C64, "DstT"))
  x = fill(rs, src, _shape(rs), edges=rs.rand() < 0.5)
  if src in FLOATS + C64 and np_dtype(dst).kind in "iu":
    # float -> int of NaN, inf or out-of-range values is undefined behaviour in TF's C++ kernel.
    info = np.iinfo(np_dtype(dst))
    real = np.real(x).astype(np.float64)
    ok = np.isfinite(real) & (real > float(info.min) - 1) & (real < float(info.max) + 1)
    x = np.where(ok, x, np.zeros_like(x))
  return Case("Cast", [x], {"DstT": np_dtype(dst), "Truncate": bool(rs.rand() < 0.5)},
              vary=() if np_dtype(dst).kind in "iu" else None), 1


def clip_case(rs):
  dtype = sample(rs, FLOATS + ("int32", "int64", "uint8"))
  shape = _shape(rs)
  x = fill(rs, dtype, shape, rs.rand() < 0.5)
  lo = fill(rs, dtype, sample(rs, [(), shape]), False)
  hi = np.maximum(lo, fill(rs, dtype, np.shape(lo), False))
  return Case("ClipByValue", [x, lo, hi]), 1


def addn_case(rs):
  dtype = sample(rs, FLOATS + ("int32", "int64") + C64)
  shape, n = _shape(rs), int(rs.randint(1, 4))
  xs = [fill(rs, dtype, shape, rs.rand() < 0.5) for _ in range(n)]
  return Case("AddN", xs, layout=(("inputs", n),)), 1


def elementwise_case(rs):
  pick = rs.rand()
  if pick < 0.4:
    return unary_case(rs)
  if pick < 0.8:
    return binary_case(rs)
  return sample(rs, [cast_case, cast_case, clip_case, addn_case, leaky_relu_case])(rs)


# --------------------------------------------------------------------------- reductions


def _axes(rs, rank, allow_empty=True):
  if rank == 0:
    return np.array([], np.int32) if rs.rand() < 0.5 else np.array(sample(rs, [0, -1]), np.int32)
  k = rs.randint(0 if allow_empty else 1, rank + 1)
  axes = rs.choice(rank, size=k, replace=False)
  axes = np.where(rs.rand(k) < 0.5, axes - rank, axes)   # negative axes too
  if k == 1 and rs.rand() < 0.5:
    return np.array(axes[0], sample(rs, [np.int32, np.int64]))
  return np.asarray(axes, sample(rs, [np.int32, np.int64]))


REDUCTIONS = {"Sum": REALS + C64, "Prod": REALS + C64, "Max": REALS, "Min": REALS,
              "Mean": REALS + C64, "EuclideanNorm": FLOATS + SINTS + C64, "All": ("bool",),
              "Any": ("bool",)}


def reduction_case(rs):
  pick = rs.rand()
  shape = _shape(rs)
  edges = rs.rand() < 0.4
  if pick < 0.55:
    op = sample(rs, sorted(REDUCTIONS))
    dtype = sample(rs, REDUCTIONS[op])
    x = fill(rs, dtype, shape, edges)
    case = Case(op, [x, _axes(rs, len(shape))], {"keep_dims": bool(rs.rand() < 0.5)},
                static=frozenset({1}))
    return case, (16 if op in ("Mean", "EuclideanNorm", "Sum", "Prod") else 1)
  if pick < 0.75:
    op = sample(rs, ["ArgMax", "ArgMin"])
    shape = sample(rs, [s for s in SHAPES if s and 0 not in s])
    x = fill(rs, sample(rs, REALS), shape, edges)
    axis = np.array(rs.randint(-len(shape), len(shape)), sample(rs, [np.int32, np.int64]))
    return Case(op, [x, axis], {"output_type": sample(rs, [np.dtype(np.int32), np.dtype(np.int64)])},
                static=frozenset({1})), 1
  op = sample(rs, ["Cumsum", "Cumprod", "CumulativeLogsumexp"])
  dtypes = FLOATS if op == "CumulativeLogsumexp" else REALS
  shape = sample(rs, [s for s in SHAPES if s])
  x = fill(rs, sample(rs, dtypes), shape, edges)
  axis = np.array(rs.randint(-len(shape), len(shape)), np.int32)
  attrs = {"exclusive": bool(rs.rand() < 0.5), "reverse": bool(rs.rand() < 0.5)}
  return Case(op, [x, axis], attrs, static=frozenset({1})), 16


# --------------------------------------------------------------------------- array ops

ANY_DTYPES = REALS + ("bool",) + C64


def _data(rs, shape, dtype=None):
  return fill(rs, dtype or sample(rs, ANY_DTYPES), shape, rs.rand() < 0.3)


def array_case(rs):
  op = sample(rs, ARRAY_OPS)
  return ARRAY_BUILDERS[op](rs), 1


def _transpose(rs):
  shape = sample(rs, SHAPES[1:])   # TF's oneDNN Transpose aborts the process on a 0-d input
  perm = rs.permutation(len(shape)).astype(np.int32)
  return Case(sample(rs, ["Transpose", "ConjugateTranspose"]), [_data(rs, shape), perm],
              static=frozenset({1}))


def _reshape(rs):
  shape = _shape(rs)
  size = int(np.prod(shape))
  options = {0: [(0,), (0, 5), (3, 0), (-1, 0)], 1: [(), (1, 1), (-1,)], 3: [(3, 1), (-1,), (1, -1)],
             6: [(6,), (3, 2), (-1, 2), (1, 2, 3)], 4: [(4,), (2, 2), (-1, 1)]}[size]
  return Case("Reshape", [_data(rs, shape), np.array(sample(rs, options), np.int32)],
              static=frozenset({1}))


def _concat(rs):
  shape = sample(rs, [s for s in SHAPES if s])
  axis = rs.randint(-len(shape), len(shape))
  dtype = sample(rs, ANY_DTYPES)
  n = rs.randint(1, 4)
  xs = []
  for _ in range(n):
    s = list(shape)
    s[axis] = rs.randint(0, 3)
    xs.append(_data(rs, tuple(s), dtype))
  return Case("ConcatV2", xs + [np.array(axis, np.int32)], static=frozenset({n}),
              layout=(("values", n), ("axis", None)))


def _pad(rs):
  shape = _shape(rs)
  op = sample(rs, ["Pad", "PadV2", "MirrorPad"])
  if op == "MirrorPad":
    mode = sample(rs, ["REFLECT", "SYMMETRIC"])
    limit = [d - (mode == "REFLECT") for d in shape]
    pads = np.array([[rs.randint(0, max(l, 0) + 1), rs.randint(0, max(l, 0) + 1)] for l in limit],
                    np.int32).reshape(len(shape), 2)
    return Case(op, [_data(rs, shape), pads], {"mode": mode}, static=frozenset({1}))
  pads = rs.randint(0, 3, size=(len(shape), 2)).astype(sample(rs, [np.int32, np.int64]))
  x = _data(rs, shape)
  inputs = [x, pads] + ([fill(rs, x.dtype, (), True)] if op == "PadV2" else [])
  return Case(op, inputs, static=frozenset({1}))


def _slice(rs):
  shape = _shape(rs)
  begin = [rs.randint(0, d + 1) for d in shape]
  size = [sample(rs, [-1, rs.randint(0, d - b + 1)]) for d, b in zip(shape, begin)]
  return Case("Slice", [_data(rs, shape), np.array(begin, np.int32).reshape(len(shape)),
                        np.array(size, np.int32).reshape(len(shape))], static=frozenset({1, 2}))


def _strided_slice(rs):
  shape = _shape(rs)
  n = rs.randint(0, len(shape) + 2)
  begin = rs.randint(-4, 5, size=n)
  end = rs.randint(-4, 5, size=n)
  strides = np.array([sample(rs, [1, 1, 2, -1, -2, 3]) for _ in range(n)], np.int64).reshape(n)
  masks = {k: int(rs.randint(0, 1 << max(n, 1))) if rs.rand() < 0.4 else 0
           for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
  if bin(masks["ellipsis_mask"]).count("1") > 1:
    masks["ellipsis_mask"] = masks["ellipsis_mask"] & -masks["ellipsis_mask"]
  dtype = sample(rs, [np.int32, np.int64])
  return Case("StridedSlice", [_data(rs, shape), begin.astype(dtype), end.astype(dtype),
                               strides.astype(dtype)], masks, static=frozenset({1, 2, 3}))


def _tile(rs):
  shape = _shape(rs)
  return Case("Tile", [_data(rs, shape), rs.randint(0, 3, size=len(shape)).astype(np.int32)],
              static=frozenset({1}))


def _reverse(rs):
  shape = _shape(rs)
  return Case("ReverseV2", [_data(rs, shape), _axes(rs, len(shape)).reshape(-1)], static=frozenset({1}))


def _expand_squeeze(rs):
  shape = _shape(rs)
  if rs.rand() < 0.5:
    axis = np.array(rs.randint(-len(shape) - 1, len(shape) + 1), np.int32)
    return Case("ExpandDims", [_data(rs, shape), axis], static=frozenset({1}))
  ones = [i for i, d in enumerate(shape) if d == 1]
  dims = [i - len(shape) if rs.rand() < 0.5 else i for i in ones if rs.rand() < 0.5]
  return Case("Squeeze", [_data(rs, shape)], {"squeeze_dims": dims})


def _one_hot(rs):
  shape = sample(rs, [(), (0,), (3,), (2, 3)])
  depth = rs.randint(0, 4)
  idx = fill(rs, sample(rs, ["int32", "int64", "uint8"]), shape, False, pool=[0, 1, 2, 3, 5, 100])
  if idx.dtype.kind == "i":
    idx = np.where(rs.rand(*shape) < 0.2, -1, idx).astype(idx.dtype)
  dtype = sample(rs, REALS + ("bool",))
  on, off = fill(rs, dtype, (), True), fill(rs, dtype, (), True)
  axis = int(rs.randint(-1, len(shape) + 1))
  return Case("OneHot", [idx, np.array(depth, np.int32), on, off], {"axis": axis},
              static=frozenset({1}))


def _range(rs):
  dtype = sample(rs, ["int32", "int64", "float32", "float64"])
  start, delta = rs.randint(-5, 5), sample(rs, [1, 2, -1, -3, 0.5, -0.75])
  if "int" in dtype:
    delta = int(np.sign(delta) * max(1, abs(int(delta))))
  limit = start + delta * rs.randint(0, 5) + (0.25 if "float" in dtype and rs.rand() < 0.5 else 0)
  vals = [np.array(v).astype(dtype) for v in (start, limit, delta)]
  return Case("Range", vals, static=frozenset({0, 1, 2}))


def _fill(rs):
  dims = np.array(sample(rs, [s for s in SHAPES]), np.int32).reshape(-1)
  return Case("Fill", [dims, _data(rs, ())], static=frozenset({0}))


def _topk(rs):
  shape = sample(rs, [(3,), (2, 3), (1, 4, 1), (0,), (2, 0, 3)])
  dtype = sample(rs, [d for d in REALS if d not in ("uint32", "uint64")])
  x = fill(rs, dtype, shape, rs.rand() < 0.3)
  if np_dtype(dtype).kind in "fV":   # V: bfloat16
    x = np.where(np.isnan(x.astype(np.float64)), np.zeros_like(x), x)   # NaN order: TF unspecified
  k = np.array(rs.randint(0, shape[-1] + 1), np.int32)
  return Case("TopKV2", [x, k], {"sorted": True}, static=frozenset({1}), vary=())


def _where(rs):
  shape = _shape(rs)
  return Case("Where", [_data(rs, shape, sample(rs, ["bool", "float32", "int32", "complex64"]))], jit=False)


def _select(rs):
  shape = _shape(rs)
  dtype = sample(rs, ANY_DTYPES)
  if rs.rand() < 0.5:
    cond_shape = sample(rs, [shape, ()] + ([shape[:1]] if shape else []))
    return Case("Select", [_data(rs, cond_shape, "bool"), _data(rs, shape, dtype), _data(rs, shape, dtype)])
  return Case("SelectV2", [_data(rs, fz.broadcast_partner(rs, shape), "bool"),
                           _data(rs, shape, dtype), _data(rs, fz.broadcast_partner(rs, shape), dtype)])


def _pack_unpack(rs):
  shape = _shape(rs)
  dtype = sample(rs, ANY_DTYPES)
  if rs.rand() < 0.5 or not shape:
    n = rs.randint(1, 4)
    axis = rs.randint(-len(shape) - 1, len(shape) + 1)
    return Case("Pack", [_data(rs, shape, dtype) for _ in range(n)], {"axis": int(axis)},
                layout=(("values", n),))
  axis = rs.randint(-len(shape), len(shape))
  return Case("Unpack", [_data(rs, shape, dtype)], {"num": shape[axis], "axis": int(axis)})


def _split(rs):
  shape = sample(rs, [s for s in SHAPES if s])
  axis = rs.randint(-len(shape), len(shape))
  d = shape[axis]
  if rs.rand() < 0.5:
    num = sample(rs, [n for n in (1, 2, 3) if d % n == 0])
    return Case("Split", [np.array(axis, np.int32), _data(rs, shape)], {"num_split": num},
                static=frozenset({0}))
  cut = sorted(rs.randint(0, d + 1, size=2))
  sizes = np.array([cut[0], cut[1] - cut[0], d - cut[1]], np.int64)
  if rs.rand() < 0.5:
    sizes[rs.randint(3)] = -1
  return Case("SplitV", [_data(rs, shape), sizes, np.array(axis, np.int32)], {"num_split": 3},
              static=frozenset({1, 2}))


def _roll(rs):
  shape = sample(rs, [s for s in SHAPES if s])
  axes = rs.choice(len(shape), size=rs.randint(1, len(shape) + 1), replace=False)
  shifts = rs.randint(-5, 6, size=len(axes))
  return Case("Roll", [_data(rs, shape), shifts.astype(np.int32), axes.astype(np.int32)],
              static=frozenset({1, 2}))


def _broadcast_to(rs):
  shape = _shape(rs)
  src = fz.broadcast_partner(rs, shape)
  return Case("BroadcastTo", [_data(rs, src), np.array(shape, np.int32).reshape(-1)],
              static=frozenset({1}))


ARRAY_BUILDERS = {
    "Transpose": _transpose, "Reshape": _reshape, "ConcatV2": _concat, "Pad": _pad,
    "Slice": _slice, "StridedSlice": _strided_slice, "Tile": _tile, "ReverseV2": _reverse,
    "ExpandDims": _expand_squeeze, "OneHot": _one_hot, "Range": _range, "Fill": _fill,
    "TopKV2": _topk, "Where": _where, "Select": _select, "Pack": _pack_unpack, "Split": _split,
    "Roll": _roll, "BroadcastTo": _broadcast_to,
}
ARRAY_OPS = sorted(ARRAY_BUILDERS)


# --------------------------------------------------------------------------- gather / scatter


def gather_case(rs):
  op = sample(rs, ["GatherV2", "GatherNd", "ScatterNd", "TensorScatterUpdate", "TensorScatterAdd",
                   "TensorScatterSub", "UnsortedSegmentSum", "UnsortedSegmentMax", "SegmentSum",
                   "Bincount_skip"])
  shape = sample(rs, [(3,), (2, 3), (1, 4, 1), (2, 0, 3), (4,)])
  idx_dtype = sample(rs, [np.int32, np.int64])
  dtype = sample(rs, FLOATS + ("int32", "int64"))
  if op == "GatherV2":
    axis = rs.randint(-len(shape), len(shape))
    batch_dims = 0
    ind = rs.randint(0, shape[axis], size=sample(rs, [(), (2,), (2, 2), (0,)])) if shape[axis] else np.zeros((0,))
    return Case(op, [_data(rs, shape, dtype), ind.astype(idx_dtype), np.array(axis, np.int32)],
                {"batch_dims": batch_dims}, static=frozenset({2})), 1
  if op == "GatherNd" or op.startswith("TensorScatter") or op == "ScatterNd":
    depth = rs.randint(1, len(shape) + 1)
    n = sample(rs, [(), (2,), (3,), (0,)])
    if any(d == 0 for d in shape[:depth]) and int(np.prod(n)) > 0:
      n = (0,)
    ind = np.stack([rs.randint(0, max(d, 1), size=n) for d in shape[:depth]], -1).astype(idx_dtype)
    if op == "GatherNd":
      return Case(op, [_data(rs, shape, dtype), ind]), 1
    upd_shape = tuple(n) + shape[depth:]
    updates = fill(rs, dtype, upd_shape, rs.rand() < 0.3)
    if op == "TensorScatterUpdate" and ind.size:   # duplicate indices: TF picks an unspecified one
      _, first = np.unique(ind.reshape(-1, depth), axis=0, return_index=True)
      ind = ind.reshape(-1, depth)[np.sort(first)]
      updates = updates.reshape((-1,) + shape[depth:])[np.sort(first)]
    if op == "ScatterNd":
      return Case(op, [ind, updates, np.array(shape, idx_dtype)], static=frozenset({2})), 1
    return Case(op, [_data(rs, shape, dtype), ind, updates]), 1
  if op == "Bincount_skip":
    op = "UnsortedSegmentMin"
  n = shape[0]
  num = rs.randint(1, 4)
  seg = np.sort(rs.randint(0, num, size=n)).astype(idx_dtype)
  if op == "SegmentSum":
    return Case(op, [_data(rs, shape, dtype), seg], jit=False), 4
  if rs.rand() < 0.3:
    seg = np.where(rs.rand(n) < 0.3, -1, seg).astype(idx_dtype)   # dropped entries
  return Case(op, [_data(rs, shape, dtype), seg, np.array(num, np.int32)], static=frozenset({2})), 4


# --------------------------------------------------------------------------- sparse


SPARSE_OPS = ["SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN", "SparseSegmentSumWithNumSegments",
              "SparseSegmentMeanWithNumSegments", "SparseTensorDenseMatMul", "SparseReduceSum", "SparseReduceMax",
              "SparseSoftmax", "SparseDenseCwiseMul", "SparseDenseCwiseAdd", "SparseReorder", "SparseReshape",
              "SparseFillEmptyRows", "SparseAdd"]


def _coords(rs, shape, most: int, shuffle=False):
  """Up to `most` distinct coordinates in `shape`, row-major sorted (or shuffled), as [n, rank] int64."""
  size = int(np.prod(shape))
  flat = np.sort(rs.choice(size, min(most, size), replace=False)) if size else np.zeros(0, np.int64)
  if shuffle:
    flat = rs.permutation(flat)
  return np.stack(np.unravel_index(flat, shape), -1).astype(np.int64).reshape(len(flat), len(shape))


def sparse_case(rs):
  op = sample(rs, SPARSE_OPS)
  edges = rs.rand() < 0.3
  if op.startswith("SparseSegment"):
    ints = ("int32", "int64") if op.startswith("SparseSegmentSum") else ()
    dtype = sample(rs, fz.dtypes_for(op, FLOATS + ints))
    rows, k = rs.randint(1, 5), rs.randint(0, 6)
    data = fill(rs, dtype, (rows,) + sample(rs, [(), (2,), (0,), (2, 1)]), edges)
    indices = rs.randint(0, rows, k).astype(sample(rs, [np.int32, np.int64]))
    ids = np.sort(rs.randint(0, 4, k)).astype(sample(rs, [np.int32, np.int64]))
    if op.endswith("WithNumSegments"):   # the ids may be traced: the output has num_segments rows
      segments = np.array((ids.max() + 1 if k else 0) + rs.randint(0, 2), np.int32)
      return Case(op, [data, indices, ids, segments], static=frozenset({3})), 4
    return Case(op, [data, indices, ids], static=frozenset({2})), 4
  shape = sample(rs, [(4,), (3, 4), (2, 3, 2), (1, 5), (3, 0)])
  coords = _coords(rs, shape, rs.randint(0, 7), shuffle=op == "SparseReorder")
  dims = np.array(shape, np.int64)
  if op == "SparseTensorDenseMatMul":
    shape = sample(rs, [(3, 4), (1, 5), (2, 2)])
    coords = _coords(rs, shape, rs.randint(0, 7), shuffle=True)
    dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "int32", "complex64")))
    adjoint_a, adjoint_b = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
    inner, cols = shape[0] if adjoint_a else shape[1], rs.randint(1, 4)
    b = fill(rs, dtype, (cols, inner) if adjoint_b else (inner, cols), edges)
    values = fill(rs, dtype, (len(coords),), edges)
    return Case(op, [coords, values, np.array(shape, np.int64), b], {"adjoint_a": adjoint_a, "adjoint_b": adjoint_b},
                static=frozenset({2})), 8
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "float16", "int32")))
  values = fill(rs, dtype, (len(coords),), edges)
  if op in ("SparseReduceSum", "SparseReduceMax"):
    axes = np.array([a for a in range(len(shape)) if rs.rand() < 0.5] or [rs.randint(-len(shape), len(shape))],
                    np.int32)
    return Case(op, [coords, values, dims, axes], {"keep_dims": bool(rs.rand() < 0.5)},
                static=frozenset({2, 3})), 8
  if op == "SparseSoftmax":
    dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "float16")))
    return Case(op, [coords, fill(rs, dtype, (len(coords),), edges), dims], static=frozenset({2})), 16
  if op in ("SparseDenseCwiseMul", "SparseDenseCwiseAdd"):
    dense_shape = tuple(1 if rs.rand() < 0.3 else d for d in shape[rs.randint(0, len(shape) + 1):])
    return Case(op, [coords, values, dims, fill(rs, dtype, dense_shape, edges)], static=frozenset({2})), 1
  if op == "SparseReorder":
    return Case(op, [coords, values, dims]), 1
  if op == "SparseReshape":
    size = int(np.prod(shape))
    target = sample(rs, [[size], [-1], [1, -1], [-1, 2] if size % 2 == 0 else [size, 1], list(shape)[::-1]])
    return Case(op, [coords, dims, np.array(target, np.int64)], static=frozenset({1, 2})), 1
  if op == "SparseFillEmptyRows":
    return Case(op, [coords, values, dims, fill(rs, dtype, (), edges)], static=frozenset({0, 2})), 1
  other = _coords(rs, shape, rs.randint(0, 7))
  return Case(op, [coords, values, dims, other, fill(rs, dtype, (len(other),), edges), dims,
                   np.zeros((), np.float32 if dtype.startswith("float") else dtype)],
              static=frozenset({0, 2, 3, 5, 6})), 1


# --------------------------------------------------------------------------- ragged


def _splits(rs, rows: int, most: int) -> np.ndarray:
  return np.concatenate([[0], np.cumsum(rs.randint(0, most + 1, rows))]).astype(sample(rs, [np.int32, np.int64]))


def ragged_case(rs):
  op = sample(rs, ["RaggedTensorToTensor", "RaggedGather", "RaggedRange"])
  dtype = sample(rs, ("float32", "float64", "int32", "float16"))
  if op == "RaggedRange":
    kind = sample(rs, [np.int32, np.int64, np.float32])
    starts, limits = rs.randint(-4, 5, 3).astype(kind), rs.randint(-4, 9, 3).astype(kind)
    deltas = np.where(rs.rand(3) < 0.3, -1, 1) * rs.randint(1, 4, 3).astype(kind)
    if kind == np.float32:
      deltas = deltas * np.float32(sample(rs, [0.5, 0.7, 1.3]))
    return Case(op, [starts, limits, deltas.astype(kind)], {"Tsplits": sample(rs, [np.int32, np.int64])},
                static=frozenset({0, 1, 2})), 4
  outer = _splits(rs, rs.randint(1, 4), 3)
  levels = [outer] + ([_splits(rs, int(outer[-1]), 2).astype(outer.dtype)] if rs.rand() < 0.4 else [])
  inner = sample(rs, [(), (2,)])
  values = fill(rs, dtype, (int(levels[-1][-1]),) + inner, rs.rand() < 0.3)
  if op == "RaggedGather":
    indices = rs.randint(0, len(outer) - 1, size=sample(rs, [(3,), (2, 2), (0,)])).astype(np.int32)
    return Case(op, levels + [values, indices], {"OUTPUT_RAGGED_RANK": len(levels) + indices.ndim - 1},
                layout=(("params_nested_splits", len(levels)), ("params_dense_values", None), ("indices", None)),
                static=frozenset(range(len(levels))) | {len(levels) + 1}), 1
  rank = 1 + len(levels) + len(inner)
  shape = np.array([sample(rs, [-1, -1, 1, 2, 4]) for _ in range(rank)], np.int64)
  shape[1 + len(levels):] = np.where(shape[1 + len(levels):] == -1, -1, inner) if inner else shape[1 + len(levels):]
  default = fill(rs, dtype, sample(rs, [(), inner]), False)
  # a width left to the data (-1) is the longest row: then the splits must be known
  known_splits = range(3, 3 + len(levels)) if (shape[1:1 + len(levels)] == -1).any() else ()
  return Case(op, [shape, values, default] + levels, {"row_partition_types": ["ROW_SPLITS"] * len(levels)},
              layout=(("shape", None), ("values", None), ("default_value", None),
                      ("row_partition_tensors", len(levels))), static=frozenset({0, *known_splits})), 1


def former_callbacks_case(rs):
  """Ops that were host callbacks until the families above were written: order statistics, index
  arithmetic, sparse structure, argmax pooling and dilation, TF's fused RNN cells."""
  op = sample(rs, ["NthElement", "UnravelIndex", "SparseSlice", "SparseConcat", "SparseSplit",
                   "SparseSparseMaximum", "SparseSparseMinimum", "RaggedTensorToSparse",
                   "MaxPoolWithArgmax", "Dilation2D", "LSTMBlockCell", "GRUBlockCell"])
  if op in ("MaxPoolWithArgmax", "Dilation2D"):
    return _window_case(rs, op)
  if op in ("LSTMBlockCell", "GRUBlockCell"):
    return _rnn_cell_case(rs, op)
  if op == "NthElement":   # NaN has no order in TF's nth_element: finite and infinite values only
    dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "int32", "float16", "int64")))
    x = fill(rs, dtype, sample(rs, [(1,), (5,), (2, 4), (2, 1, 3)]), False, pool=[-1, 0, 2, 2, 3, -np.inf, np.inf]
             if rs.rand() < 0.3 and dtype.startswith("float") else None)
    n = np.int32(rs.randint(0, x.shape[-1]))
    return Case(op, [x, n], {"reverse": bool(rs.rand() < 0.5)}, static=frozenset({1})), 1
  if op == "UnravelIndex":
    kind = sample(rs, [np.int32, np.int64])
    dims = np.array([rs.randint(1, 5) for _ in range(rs.randint(1, 4))], kind)
    indices = rs.randint(0, int(np.prod(dims)), size=sample(rs, [(), (4,), (0,)])).astype(kind)
    return Case(op, [indices, dims], vary=(0,)), 1
  dtype = sample(rs, ("float32", "float64", "int32", "float16"))
  edges = rs.rand() < 0.3
  if op == "RaggedTensorToSparse":
    outer = _splits(rs, rs.randint(1, 4), 3)
    levels = [outer] + ([_splits(rs, int(outer[-1]), 2).astype(outer.dtype)] if rs.rand() < 0.4 else [])
    values = fill(rs, dtype, (int(levels[-1][-1]),) + sample(rs, [(), (2,), (1, 2)]), edges)
    return Case(op, levels + [values], layout=(("rt_nested_splits", len(levels)), ("rt_dense_values", None)),
                static=frozenset(range(len(levels))) if rs.rand() < 0.5 else frozenset()), 1
  shape = sample(rs, [(4,), (3, 4), (2, 3, 2), (1, 5), (3, 0)])
  dims = np.array(shape, np.int64)
  coords = _coords(rs, shape, rs.randint(0, 7), shuffle=op != "SparseSparseMaximum" and rs.rand() < 0.3)
  values = fill(rs, dtype, (len(coords),), edges)
  if op == "SparseSlice":
    start = np.array([rs.randint(-1, d + 1) for d in shape], np.int64)
    size = np.array([rs.randint(0, d + 2) for d in shape], np.int64)
    return Case(op, [coords, values, dims, start, size], static=frozenset({0, 2, 3, 4})), 1
  if op == "SparseSplit":
    axis = rs.randint(-len(shape), len(shape))
    if shape[axis] == 0:
      axis, shape = 0, (3,) + shape[1:]
      dims = np.array(shape, np.int64)
      coords = _coords(rs, shape, rs.randint(0, 7))
      values = fill(rs, dtype, (len(coords),), edges)
    return Case(op, [np.int64(axis), coords, values, dims], {"num_split": int(rs.randint(1, shape[axis] + 1))},
                static=frozenset({0, 1, 3})), 1
  if op == "SparseConcat":
    count, axis = rs.randint(1, 4), rs.randint(-len(shape), len(shape))
    shapes = [tuple(rs.randint(0, 3) if k == axis % len(shape) else d for k, d in enumerate(shape))
              for _ in range(count)]
    parts = [_coords(rs, s, rs.randint(0, 4), shuffle=rs.rand() < 0.3) for s in shapes]
    vals = [fill(rs, dtype, (len(c),), edges) for c in parts]
    return Case(op, parts + vals + [np.array(s, np.int64) for s in shapes], {"concat_dim": int(axis)},
                layout=(("indices", count), ("values", count), ("shapes", count)),
                static=frozenset(range(count)) | frozenset(range(2 * count, 3 * count))), 1
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "int32", "float16")))
  values = fill(rs, dtype, (len(coords),), edges)
  other = _coords(rs, shape, rs.randint(0, 7))
  return Case(op, [coords, values, dims, other, fill(rs, dtype, (len(other),), edges), dims],
              static=frozenset({0, 2, 3, 5})), 1


def _window_case(rs, op):
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "float16", "int32")))
  n, h, w, c = rs.randint(1, 3), rs.randint(1, 6), rs.randint(1, 6), rs.randint(1, 3)
  x = fill(rs, dtype, (n, h, w, c), rs.rand() < 0.3)
  kh, kw = rs.randint(1, 4), rs.randint(1, 4)
  strides = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1]
  padding = sample(rs, ["SAME", "VALID"])
  if op == "MaxPoolWithArgmax":
    if padding == "VALID":
      kh, kw = min(kh, h), min(kw, w)
    return Case(op, [x], {"ksize": [1, int(kh), int(kw), 1], "strides": strides, "padding": padding,
                          "Targmax": np.dtype(np.int64), "include_batch_in_index": bool(rs.rand() < 0.5)}), 1
  rates = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1]
  if padding == "VALID":
    kh, kw = min(kh, (h - 1) // rates[1] + 1), min(kw, (w - 1) // rates[2] + 1)
  return Case(op, [x, fill(rs, dtype, (kh, kw, c), rs.rand() < 0.3)],
              {"strides": strides, "rates": rates, "padding": padding}), 4


def _rnn_cell_case(rs, op):
  batch, inputs, cell = rs.randint(1, 4), rs.randint(1, 4), rs.randint(1, 4)
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float16")))
  draw = lambda *shape: fill(rs, dtype, shape, False) * np.asarray(0.5, dtype)   # noqa: E731
  x, h_prev = draw(batch, inputs), draw(batch, cell)
  if op == "GRUBlockCell":
    return Case(op, [x, h_prev, draw(inputs + cell, 2 * cell), draw(inputs + cell, cell), draw(2 * cell),
                     draw(cell)]), 64
  peephole = bool(rs.rand() < 0.5)
  return Case(op, [x, draw(batch, cell), h_prev, draw(inputs + cell, 4 * cell), draw(cell), draw(cell), draw(cell),
                   draw(4 * cell)],
              {"forget_bias": float(sample(rs, [0.0, 1.0, 0.5])), "cell_clip": float(sample(rs, [-1.0, 0.0, 0.7, 3.0])),
               "use_peephole": peephole}), 64


# --------------------------------------------------------------------------- nn


def nn_case(rs):
  op = sample(rs, ["Softmax", "LogSoftmax", "BiasAdd", "Conv2D", "MaxPool", "AvgPool", "L2Loss",
                   "DepthwiseConv2dNative", "Relu6", "Selu", "Elu"])
  dtype = sample(rs, ("float32", "float16", "bfloat16", "float64"))
  edges = rs.rand() < 0.3
  if op in ("Softmax", "LogSoftmax"):
    return Case(op, [fill(rs, dtype, sample(rs, [(3,), (2, 3), (1, 4, 1), (2, 0, 3), (0, 2)]), edges)]), 16
  if op in ("Relu6", "Selu", "Elu", "L2Loss"):
    return Case(op, [fill(rs, dtype, _shape(rs), edges)]), 16
  if op == "BiasAdd":
    shape = sample(rs, [(2, 3), (1, 4, 1), (2, 0, 3), (2, 3, 2, 2)])
    fmt = sample(rs, ["NHWC", "NCHW"]) if len(shape) >= 3 else "NHWC"
    c = shape[1] if fmt == "NCHW" else shape[-1]
    return Case(op, [fill(rs, dtype, shape, edges), fill(rs, dtype, (c,), edges)],
                {"data_format": fmt}), 1
  dtype = sample(rs, ("float32", "float64", "float16", "bfloat16"))
  n, h, w, c = rs.randint(1, 3), rs.randint(1, 6), rs.randint(1, 6), rs.randint(1, 3)
  x = fill(rs, dtype, (n, h, w, c), False)
  strides = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1]
  padding = sample(rs, ["SAME", "VALID"])
  kh, kw = rs.randint(1, 3), rs.randint(1, 3)
  if padding == "VALID":
    kh, kw = min(kh, h), min(kw, w)
  if op in ("MaxPool", "AvgPool"):
    x = fill(rs, dtype, (n, h, w, c), edges)
    return Case(op, [x], {"ksize": [1, int(kh), int(kw), 1], "strides": strides, "padding": padding,
                          "data_format": "NHWC"}), 64
  dil = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1] if strides == [1, 1, 1, 1] else [1, 1, 1, 1]
  if op == "Conv2D":
    f = fill(rs, dtype, (kh, kw, c, rs.randint(1, 3)), False)
    return Case(op, [x, f], {"strides": strides, "padding": padding, "dilations": dil,
                             "data_format": "NHWC"}), 256
  f = fill(rs, dtype, (kh, kw, c, rs.randint(1, 3)), False)
  return Case(op, [x, f], {"strides": strides, "padding": padding, "dilations": dil,
                           "data_format": "NHWC"}), 256


# --------------------------------------------------------------------------- image, matmul, fft


def image_case(rs):
  op = sample(rs, ["ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic", "ResizeArea",
                   "RGBToHSV", "HSVToRGB", "AdjustContrastv2", "AdjustSaturation", "AdjustHue"])
  dtype = sample(rs, ("float32", "float16", "float64", "uint8", "int32"))
  if op in ("RGBToHSV", "HSVToRGB"):
    x = fill(rs, sample(rs, ("float32", "float64")), sample(rs, [(3,), (2, 3), (1, 2, 3), (0, 3)]),
             False, pool=np.linspace(0, 1, 9))
    return Case(op, [x], vary=()), 64
  if op.startswith("Adjust"):
    x = fill(rs, "float32", sample(rs, [(2, 2, 3), (1, 3, 2, 3), (0, 2, 3)]), False,
             pool=np.linspace(0, 1, 9))
    factor = np.array(sample(rs, [0.0, 0.5, 1.3, -0.2]), np.float32)
    return Case(op, [x, factor], vary=()), 256
  x = fill(rs, dtype, (rs.randint(1, 3), rs.randint(1, 5), rs.randint(1, 5), rs.randint(1, 3)),
           False)
  size = np.array([rs.randint(1, 7), rs.randint(1, 7)], np.int32)
  attrs = {"align_corners": bool(rs.rand() < 0.3)}
  if op != "ResizeArea":
    attrs["half_pixel_centers"] = bool(not attrs["align_corners"] and rs.rand() < 0.6)
  return Case(op, [x, size], attrs, static=frozenset({1})), 256


def matmul_case(rs):
  op = sample(rs, ["MatMul", "BatchMatMulV2", "Einsum_skip"])
  dtype = sample(rs, ("float32", "float64", "float16", "bfloat16", "int32", "complex64"))
  m, k, n = rs.randint(0, 4), rs.randint(0, 4), rs.randint(0, 4)
  edges = rs.rand() < 0.2
  if op == "MatMul":
    ta, tb = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
    a = fill(rs, dtype, (k, m) if ta else (m, k), edges)
    b = fill(rs, dtype, (n, k) if tb else (k, n), edges)
    return Case(op, [a, b], {"transpose_a": ta, "transpose_b": tb}), 64
  batch = sample(rs, [(), (2,), (1,), (2, 1)])
  adj_x, adj_y = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
  a = fill(rs, dtype, batch + ((k, m) if adj_x else (m, k)), edges)
  b = fill(rs, dtype, batch[-1:] + ((n, k) if adj_y else (k, n)), edges)
  return Case("BatchMatMulV2", [a, b], {"adj_x": adj_x, "adj_y": adj_y}), 64


def spectral_case(rs):
  op = sample(rs, ["FFT", "IFFT", "RFFT", "IRFFT", "FFT2D", "RFFT2D", "LowerBound", "UpperBound",
                   "Bucketize", "MatrixInverse", "MatrixDeterminant", "Cholesky", "DiagPart",
                   "MatrixBandPart", "InvertPermutation", "Unique", "DepthToSpace", "SpaceToDepth"])
  if op in ("FFT", "IFFT", "FFT2D"):
    x = fill(rs, "complex64", sample(rs, [(4,), (2, 3), (1, 4), (3, 2, 2)]), False)
    return Case(op, [x]), 256
  if op in ("RFFT", "RFFT2D"):
    rank = 1 if op == "RFFT" else 2
    x = fill(rs, "float32", sample(rs, [(4,), (2, 3), (1, 4), (3, 2, 2)]), False)
    length = np.array([rs.randint(1, 6) for _ in range(rank)], np.int32)
    if len(x.shape) < rank:
      x = x.reshape((1,) + x.shape)
    return Case(op, [x, length], static=frozenset({1})), 256
  if op == "IRFFT":
    x = fill(rs, "complex64", sample(rs, [(3,), (2, 3), (1, 4)]), False)
    return Case(op, [x, np.array([rs.randint(1, 7)], np.int32)], static=frozenset({1})), 256
  if op in ("LowerBound", "UpperBound"):
    dtype = sample(rs, ("float32", "int32", "int64", "float64"))
    sorted_in = np.sort(fill(rs, dtype, (2, rs.randint(0, 5)), False), axis=-1)
    values = fill(rs, dtype, (2, rs.randint(0, 4)), False)
    return Case(op, [sorted_in, values], vary=(1,), attrs={"out_type": sample(rs, [np.dtype(np.int32), np.dtype(np.int64)])}), 1
  if op == "Bucketize":
    dtype = sample(rs, ("float32", "int32", "int64", "float64"))
    bounds = sorted(float(v) for v in rs.choice([-3.0, -1.0, 0.0, 0.5, 2.0, 7.0], size=rs.randint(0, 4), replace=False))
    return Case(op, [fill(rs, dtype, _shape(rs), rs.rand() < 0.3)], {"boundaries": bounds}), 1
  if op in ("MatrixInverse", "MatrixDeterminant", "Cholesky"):
    dtype = sample(rs, ("float32", "float64"))
    n = rs.randint(0, 4)
    a = rs.normal(size=(2, n, n))
    a = a @ np.swapaxes(a, -1, -2) + n * np.eye(n)   # well conditioned, positive definite
    return Case(op, [a.astype(dtype)], vary=()), 4096
  if op == "DiagPart":
    n = rs.randint(0, 4)
    return Case(op, [_data(rs, (n, n))]), 1
  if op == "MatrixBandPart":
    x = _data(rs, sample(rs, [(2, 3), (3, 3), (2, 0, 3), (1, 4, 1)]))
    lo, hi = sample(rs, [-1, 0, 1, 2]), sample(rs, [-1, 0, 1, 2])
    t = sample(rs, [np.int32, np.int64])
    return Case(op, [x, np.array(lo, t), np.array(hi, t)]), 1
  if op == "InvertPermutation":
    return Case(op, [rs.permutation(rs.randint(0, 6)).astype(sample(rs, [np.int32, np.int64]))]), 1
  if op == "Unique":
    x = fill(rs, sample(rs, ("int32", "int64", "float32")), (rs.randint(0, 7),), False,
             pool=[0, 1, 2, -1, 5])
    return Case(op, [x], {"out_idx": sample(rs, [np.dtype(np.int32), np.dtype(np.int64)])}, jit=False), 1
  block = int(rs.randint(1, 3))
  if op == "DepthToSpace":
    x = _data(rs, (1, rs.randint(1, 3), rs.randint(1, 3), block * block * rs.randint(1, 3)))
  else:
    x = _data(rs, (1, block * rs.randint(1, 3), block * rs.randint(1, 3), rs.randint(1, 3)))
  return Case(op, [x], {"block_size": block, "data_format": "NHWC"}), 1


def special_functions_case(rs):
  """Bessel functions (Eigen's float and double algorithms) over the whole float range; banded
  triangular solves and matrix square roots of well-conditioned matrices."""
  op = sample(rs, ["BesselJ0", "BesselJ1", "BesselY0", "BesselY1", "BesselK0", "BesselK0e", "BesselK1",
                   "BesselK1e", "BandedTriangularSolve", "MatrixSquareRoot"])
  if op in ("BandedTriangularSolve", "MatrixSquareRoot"):
    return _well_conditioned_case(rs, op)
  dtype = sample(rs, fz.dtypes_for(op, FLOATS))
  pool = [0.0, 1e-6, 0.3, 0.89, 1.5, 2.0, 2.4048, 3.8317, 5.0, 7.5, 30.0, 1e4, -0.7, -4.0]
  x = fill(rs, dtype, _shape(rs), rs.rand() < 0.3, pool=None if rs.rand() < 0.5 else pool)
  return Case(op, [x]), 256


def _well_conditioned_case(rs, op):
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "complex64")))
  batch, n = sample(rs, [(), (2,), (1, 3)]), int(rs.randint(1, 6))
  if op == "MatrixSquareRoot":   # eigenvalues near n: a principal root, far from the negative axis
    x = rs.uniform(-0.5, 0.5, batch + (n, n)) + n * np.eye(n)
    if dtype.startswith("complex"):
      x = x + 0.3j * rs.uniform(-1, 1, x.shape)
    return Case(op, [x.astype(dtype)]), 64
  bands = int(rs.randint(1, n + 2))
  lower = bool(rs.rand() < 0.5)
  matrix = rs.uniform(-1, 1, batch + (bands, n))
  matrix[..., 0 if lower else bands - 1, :] += np.where(rs.rand(n) < 0.5, 4, -4)   # the diagonal
  rhs = rs.uniform(-2, 2, sample(rs, [batch, ()]) + (n, int(rs.randint(1, 4))))
  return Case(op, [matrix.astype(dtype), rhs.astype(dtype)],
              {"lower": lower, "adjoint": bool(rs.rand() < 0.5)}), 16


# --------------------------------------------------------------------------- the tests

# Each hypothesis example draws a signature (op, dtypes, shapes, attrs) and runs it with up to
# VALUES value sets (fresh floats, edge values included), sharing TF's trace and the jit cache.
# A case is one value set, run in TF and three ways.
VALUES = 50
# family -> (case builder, hypothesis examples, cases at least)
FAMILIES = {
    "elementwise_a": (elementwise_case, 60, 1500),
    "elementwise_b": (elementwise_case, 60, 1500),
    "elementwise_c": (elementwise_case, 60, 1500),
    "reduction": (reduction_case, 60, 1100),
    "array": (array_case, 100, 1300),
    "gather_scatter": (gather_case, 40, 1000),
    "nn": (nn_case, 32, 1400),
    "image": (image_case, 25, 250),
    "matmul": (matmul_case, 25, 900),
    "spectral_linalg_search": (spectral_case, 40, 1000),
    # appended: a family's seeds come from its position (_SALT), so new ones go last
    "sparse": (sparse_case, 40, 800),
    "ragged": (ragged_case, 30, 500),
    "former_callbacks": (former_callbacks_case, 50, 900),
    "special_functions": (special_functions_case, 30, 500),
}
_SALT = {name: i for i, name in enumerate(FAMILIES)}


def test_total_case_count():
  # Issue 14 asks for at least 10,000 cases; each family asserts it ran its share.
  assert sum(n for _, _, n in FAMILIES.values()) >= 10_000


def test_kernel_dtypes_pins_tf():
  # `_tf_compat.kernel_dtypes` (private `kernels` API) decides which dtypes the fuzz draws.
  from jaxport.convert._tf_compat import kernel_dtypes
  assert {"float32", "int32"} <= kernel_dtypes("Add") and "complex64" not in kernel_dtypes("Relu")
  assert kernel_dtypes("Identity") is None   # a kernel that takes any dtype


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fuzz(family):
  build, examples, min_cases = FAMILIES[family]
  ran = []

  # No shrinking: the seed is not a meaningful size; the failure message shows the case.
  @hypothesis.settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                       phases=(hypothesis.Phase.explicit, hypothesis.Phase.generate),
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(seed=st.integers(0, 2**32 - 1))
  def run(seed):
    rs = np.random.RandomState((seed + 7919 * _SALT[family]) % 2**32)
    case, scale = build(rs)
    ran.append(fz.run_cases(case, rs, VALUES, documented, rtol_scale=scale))

  run()
  print(f"\n{family}: {len(ran)} signatures, {sum(ran)} cases; {fz.report()}")
  assert sum(ran) >= min_cases
