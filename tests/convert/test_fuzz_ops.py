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
from fuzz_engine import (ANY_DTYPES, C64, FLOATS, INTS, REALS, SHAPES, SINTS, Case, fill, np_dtype, random_data,
                         random_shape, sample)
from fuzz_differences import documented
from fuzz_structured import (former_callbacks_case, gather_case, image_case, matmul_case, nn_case, ragged_case,
                             sparse_case, special_functions_case, spectral_case)

pytestmark = pytest.mark.slow

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


def unary_case(rs) -> Case:
  op = sample(rs, sorted(UNARY))
  dtypes, scale = UNARY[op]
  dtype = sample(rs, fz.dtypes_for(op, dtypes))
  x = fill(rs, dtype, random_shape(rs), edges=rs.rand() < 0.5)
  attrs = {}
  if op == "LeakyRelu":
    attrs["alpha"] = float(sample(rs, [0.0, 0.2, 1.5, -0.5]))
  return Case(op, [x], attrs), scale


def binary_case(rs) -> Case:
  op = sample(rs, sorted(BINARY))
  dtypes, scale = BINARY[op]
  dtype = sample(rs, fz.dtypes_for(op, dtypes))
  edges = rs.rand() < 0.5
  shape = random_shape(rs)
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
  x = fill(rs, dtype, random_shape(rs), edges=rs.rand() < 0.5)
  return Case("LeakyRelu", [x], {"alpha": float(sample(rs, [0.0, 0.2, 1.5, -0.5]))}), 1


def cast_case(rs):
  src = sample(rs, fz.dtypes_for("Cast", REALS + ("bool",) + C64, "SrcT"))
  dst = sample(rs, fz.dtypes_for("Cast", REALS + ("bool",) + C64, "DstT"))
  x = fill(rs, src, random_shape(rs), edges=rs.rand() < 0.5)
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
  shape = random_shape(rs)
  x = fill(rs, dtype, shape, rs.rand() < 0.5)
  lo = fill(rs, dtype, sample(rs, [(), shape]), False)
  hi = np.maximum(lo, fill(rs, dtype, np.shape(lo), False))
  return Case("ClipByValue", [x, lo, hi]), 1


def addn_case(rs):
  dtype = sample(rs, FLOATS + ("int32", "int64") + C64)
  shape, n = random_shape(rs), int(rs.randint(1, 4))
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
  shape = random_shape(rs)
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

def array_case(rs):
  op = sample(rs, ARRAY_OPS)
  return ARRAY_BUILDERS[op](rs), 1


def _transpose(rs):
  shape = sample(rs, SHAPES[1:])   # TF's oneDNN Transpose aborts the process on a 0-d input
  perm = rs.permutation(len(shape)).astype(np.int32)
  return Case(sample(rs, ["Transpose", "ConjugateTranspose"]), [random_data(rs, shape), perm],
              static=frozenset({1}))


def _reshape(rs):
  shape = random_shape(rs)
  size = int(np.prod(shape))
  options = {0: [(0,), (0, 5), (3, 0), (-1, 0)], 1: [(), (1, 1), (-1,)], 3: [(3, 1), (-1,), (1, -1)],
             6: [(6,), (3, 2), (-1, 2), (1, 2, 3)], 4: [(4,), (2, 2), (-1, 1)]}[size]
  return Case("Reshape", [random_data(rs, shape), np.array(sample(rs, options), np.int32)],
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
    xs.append(random_data(rs, tuple(s), dtype))
  return Case("ConcatV2", xs + [np.array(axis, np.int32)], static=frozenset({n}),
              layout=(("values", n), ("axis", None)))


def _pad(rs):
  shape = random_shape(rs)
  op = sample(rs, ["Pad", "PadV2", "MirrorPad"])
  if op == "MirrorPad":
    mode = sample(rs, ["REFLECT", "SYMMETRIC"])
    limit = [d - (mode == "REFLECT") for d in shape]
    pads = np.array([[rs.randint(0, max(l, 0) + 1), rs.randint(0, max(l, 0) + 1)] for l in limit],
                    np.int32).reshape(len(shape), 2)
    return Case(op, [random_data(rs, shape), pads], {"mode": mode}, static=frozenset({1}))
  pads = rs.randint(0, 3, size=(len(shape), 2)).astype(sample(rs, [np.int32, np.int64]))
  x = random_data(rs, shape)
  inputs = [x, pads] + ([fill(rs, x.dtype, (), True)] if op == "PadV2" else [])
  return Case(op, inputs, static=frozenset({1}))


def _slice(rs):
  shape = random_shape(rs)
  begin = [rs.randint(0, d + 1) for d in shape]
  size = [sample(rs, [-1, rs.randint(0, d - b + 1)]) for d, b in zip(shape, begin)]
  return Case("Slice", [random_data(rs, shape), np.array(begin, np.int32).reshape(len(shape)),
                        np.array(size, np.int32).reshape(len(shape))], static=frozenset({1, 2}))


def _strided_slice(rs):
  shape = random_shape(rs)
  n = rs.randint(0, len(shape) + 2)
  begin = rs.randint(-4, 5, size=n)
  end = rs.randint(-4, 5, size=n)
  strides = np.array([sample(rs, [1, 1, 2, -1, -2, 3]) for _ in range(n)], np.int64).reshape(n)
  masks = {k: int(rs.randint(0, 1 << max(n, 1))) if rs.rand() < 0.4 else 0
           for k in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")}
  if bin(masks["ellipsis_mask"]).count("1") > 1:
    masks["ellipsis_mask"] = masks["ellipsis_mask"] & -masks["ellipsis_mask"]
  dtype = sample(rs, [np.int32, np.int64])
  return Case("StridedSlice", [random_data(rs, shape), begin.astype(dtype), end.astype(dtype),
                               strides.astype(dtype)], masks, static=frozenset({1, 2, 3}))


def _tile(rs):
  shape = random_shape(rs)
  return Case("Tile", [random_data(rs, shape), rs.randint(0, 3, size=len(shape)).astype(np.int32)],
              static=frozenset({1}))


def _reverse(rs):
  shape = random_shape(rs)
  return Case("ReverseV2", [random_data(rs, shape), _axes(rs, len(shape)).reshape(-1)], static=frozenset({1}))


def _expand_squeeze(rs):
  shape = random_shape(rs)
  if rs.rand() < 0.5:
    axis = np.array(rs.randint(-len(shape) - 1, len(shape) + 1), np.int32)
    return Case("ExpandDims", [random_data(rs, shape), axis], static=frozenset({1}))
  ones = [i for i, d in enumerate(shape) if d == 1]
  dims = [i - len(shape) if rs.rand() < 0.5 else i for i in ones if rs.rand() < 0.5]
  return Case("Squeeze", [random_data(rs, shape)], {"squeeze_dims": dims})


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
  return Case("Fill", [dims, random_data(rs, ())], static=frozenset({0}))


def _topk(rs):
  shape = sample(rs, [(3,), (2, 3), (1, 4, 1), (0,), (2, 0, 3), (2, 9), (3, 17)])
  dtype = sample(rs, [d for d in REALS if d not in ("uint32", "uint64")])
  x = fill(rs, dtype, shape, rs.rand() < 0.3)
  in_order = bool(rs.rand() < 0.5)   # unsorted: the order of TF's heap, NaNs included
  if in_order and np_dtype(dtype).kind in "fV":   # V: bfloat16
    x = np.where(np.isnan(x.astype(np.float64)), np.zeros_like(x), x)   # NaN order: TF unspecified
  k = np.array(rs.randint(0, shape[-1] + 1), np.int32)
  return Case("TopKV2", [x, k], {"sorted": in_order}, static=frozenset({1}), vary=())


def _where(rs):
  shape = random_shape(rs)
  return Case("Where", [random_data(rs, shape, sample(rs, ["bool", "float32", "int32", "complex64"]))], jit=False)


def _select(rs):
  shape = random_shape(rs)
  dtype = sample(rs, ANY_DTYPES)
  if rs.rand() < 0.5:
    cond_shape = sample(rs, [shape, ()] + ([shape[:1]] if shape else []))
    return Case("Select", [random_data(rs, cond_shape, "bool"), random_data(rs, shape, dtype), random_data(rs, shape, dtype)])
  return Case("SelectV2", [random_data(rs, fz.broadcast_partner(rs, shape), "bool"),
                           random_data(rs, shape, dtype), random_data(rs, fz.broadcast_partner(rs, shape), dtype)])


def _pack_unpack(rs):
  shape = random_shape(rs)
  dtype = sample(rs, ANY_DTYPES)
  if rs.rand() < 0.5 or not shape:
    n = rs.randint(1, 4)
    axis = rs.randint(-len(shape) - 1, len(shape) + 1)
    return Case("Pack", [random_data(rs, shape, dtype) for _ in range(n)], {"axis": int(axis)},
                layout=(("values", n),))
  axis = rs.randint(-len(shape), len(shape))
  return Case("Unpack", [random_data(rs, shape, dtype)], {"num": shape[axis], "axis": int(axis)})


def _split(rs):
  shape = sample(rs, [s for s in SHAPES if s])
  axis = rs.randint(-len(shape), len(shape))
  d = shape[axis]
  if rs.rand() < 0.5:
    num = sample(rs, [n for n in (1, 2, 3) if d % n == 0])
    return Case("Split", [np.array(axis, np.int32), random_data(rs, shape)], {"num_split": num},
                static=frozenset({0}))
  cut = sorted(rs.randint(0, d + 1, size=2))
  sizes = np.array([cut[0], cut[1] - cut[0], d - cut[1]], np.int64)
  if rs.rand() < 0.5:
    sizes[rs.randint(3)] = -1
  return Case("SplitV", [random_data(rs, shape), sizes, np.array(axis, np.int32)], {"num_split": 3},
              static=frozenset({1, 2}))


def _roll(rs):
  shape = sample(rs, [s for s in SHAPES if s])
  axes = rs.choice(len(shape), size=rs.randint(1, len(shape) + 1), replace=False)
  shifts = rs.randint(-5, 6, size=len(axes))
  return Case("Roll", [random_data(rs, shape), shifts.astype(np.int32), axes.astype(np.int32)],
              static=frozenset({1, 2}))


def _broadcast_to(rs):
  shape = random_shape(rs)
  src = fz.broadcast_partner(rs, shape)
  return Case("BroadcastTo", [random_data(rs, src), np.array(shape, np.int32).reshape(-1)],
              static=frozenset({1}))


ARRAY_BUILDERS = {
    "Transpose": _transpose, "Reshape": _reshape, "ConcatV2": _concat, "Pad": _pad,
    "Slice": _slice, "StridedSlice": _strided_slice, "Tile": _tile, "ReverseV2": _reverse,
    "ExpandDims": _expand_squeeze, "OneHot": _one_hot, "Range": _range, "Fill": _fill,
    "TopKV2": _topk, "Where": _where, "Select": _select, "Pack": _pack_unpack, "Split": _split,
    "Roll": _roll, "BroadcastTo": _broadcast_to,
}
ARRAY_OPS = sorted(ARRAY_BUILDERS)


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
