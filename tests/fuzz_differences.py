"""The documented differences of the op fuzz (`test_fuzz_ops.py`): each a condition, as narrow as the
difference, under which a rule may disagree with TF's kernel, and why. Only the cases a predicate
accepts are excused."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from fuzz_engine import Case

# (op, condition, reason). `matches(case, mode)` is the condition, as narrow as the difference.
DOCUMENTED_DIFFERENCES: list[tuple[str, str, str]] = []


_PREDICATES: list = []


def documented(case: Case, mode: str) -> bool:
  return any((case.op in ops or ops == ["*"]) and pred(case, mode) for ops, pred in _PREDICATES)


def difference(ops: str, condition: str, reason: str):
  """Declares a documented difference of `ops` (space-separated); the decorated predicate
  `pred(case, mode)` is the condition, and excuses only the cases it accepts."""
  def decorator(pred):
    DOCUMENTED_DIFFERENCES.append((ops, condition, reason))
    _PREDICATES.append((ops.split(), pred))
    return pred
  return decorator


def _floats(case):
  return [np.asarray(x).astype(np.complex128 if np.asarray(x).dtype.kind == "c" else np.float64)
          for x in case.inputs if np.asarray(x).dtype.kind in "fcV"]


def _has_extreme(case, big=1e30):
  """Some float input is NaN, ±inf, denormal, or of magnitude >= `big`."""
  for x in _floats(case):
    mag = np.abs(x)
    if (~np.isfinite(mag) | (mag >= big) | ((mag > 0) & (mag < 1.2e-38))).any():
      return True
  return False


@difference("MatMul BatchMatMulV2 Conv2D DepthwiseConv2dNative AvgPool",
            "an input is NaN, ±inf, denormal or |x| >= 1e30",
            "Eigen and XLA sum products in different orders (and TF multiplies padding zeros "
            "by the filter), so inf - inf, 0 * inf and overflow give NaN vs ±inf vs finite")
def _contraction_edges(case, mode):
  return _has_extreme(case)


@difference("MaxPool", "NaN in the input",
            "TF's Eigen max skips NaN depending on its position in the window; XLA's propagates it")
def _maxpool_nan(case, mode):
  return any(np.isnan(x).any() for x in _floats(case))


@difference("Softmax LogSoftmax CumulativeLogsumexp",
            "an input is NaN, ±inf, denormal or |x| >= 1e30",
            "TF's kernels subtract the max differently, so a NaN or inf leaks into other "
            "entries (or not) and extreme values overflow differently")
def _softmax_edges(case, mode):
  return _has_extreme(case)


@difference("RealDiv Div", "complex division by exactly 0",
            "TF's kernel gives nan+nanj; NumPy and XLA give infinities (a nonzero / 0, as C99's Annex G), "
            "and the rule follows them")
def _complex_div_zero(case, mode):
  y = np.asarray(case.inputs[1])
  return y.dtype.kind == "c" and (y == 0).any()


@difference("UnsortedSegmentMin UnsortedSegmentMax SegmentMin SegmentMax", "NaN in the data",
            "TF's segment min/max kernels keep or drop a NaN depending on its position in the segment "
            "(a comparison select); the rule propagates it, like NumPy's minimum/maximum")
def _segment_extrema_nan(case, mode):
  return any(np.isnan(x).any() for x in _floats(case))


@difference("LowerBound UpperBound", "NaN in an input",
            "the position of NaN in a binary search is undefined; TF and the rule search differently")
def _search_nan(case, mode):
  return any(np.isnan(x).any() for x in _floats(case))


@difference("*", "a float input holds a denormal (0 < |x| < smallest normal)",
            "TF's CPU kernels run with flush-to-zero (a denormal counts as 0, e.g. in Where, "
            "FloorMod, Xlogy); NumPy and XLA keep denormals")
def _denormal(case, mode):
  for x in _floats(case):
    for part in (x.real, x.imag):   # flushed per component
      mag = np.abs(part)
      if ((mag > 0) & (mag < 1.2e-38)).any():
        return True
  return False


@difference("Mean", "complex input, empty reduction",
            "TF's complex Mean of nothing is 0 (Eigen's complex 0 / 0); the rule gives NaN, like "
            "NumPy and like TF's real Mean")
def _complex_empty_mean(case, mode):
  return np.asarray(case.inputs[0]).dtype.kind == "c" and np.size(case.inputs[0]) == 0


@difference("Igamma Igammac", "an argument is <= 0 (incl. -0)",
            "outside the domain (a > 0, x >= 0) Eigen and XLA return different limits (NaN vs 0/1)")
def _igamma_domain(case, mode):
  return any((x.real <= 0).any() for x in _floats(case))


@difference("MaxPool", "-inf in the input",
            "TF's window max starts from the lowest finite value, so an all -inf window gives "
            "that value instead of -inf")
def _maxpool_neg_inf(case, mode):
  return any(np.isneginf(x).any() for x in _floats(case))


@difference("ApproximateEqual", "|x - y| exactly equal to the tolerance",
            "TF's kernel answers True at the boundary; the rule uses |x - y| < tolerance as documented")
def _approx_boundary(case, mode):
  x, y = (np.asarray(v).astype(np.float64) for v in case.inputs)
  return (np.abs(x - y) == case.attrs.get("tolerance")).any()


@difference("Round", "integer input", "TF 2.21's CPU Round kernel returns 0 for int32/int64; "
            "the rule returns the input unchanged (what rounding an integer means, and TF's XLA kernel)")
def _round_ints(case, mode):
  return np.asarray(case.inputs[0]).dtype.kind == "i"


@difference("Igamma Igammac Zeta Polygamma Digamma Lgamma Erfinv Ndtri BesselI0e BesselI1e",
            "an input is NaN, ±inf, denormal or |x| >= 1e30",
            "at the edges of their domains Eigen's and XLA's special-function algorithms "
            "choose different limits (NaN vs 0 vs ±inf)")
def _special_edges(case, mode):
  return _has_extreme(case)


@difference("RealDiv Div DivNoNan Pow MulNoNan Mul Prod BatchMatMulV2 MatMul Exp Log Sqrt EuclideanNorm",
            "complex input with a non-finite part or a part of magnitude >= 1e30",
            "complex arithmetic on infinities/overflow: NumPy/XLA and Eigen use different "
            "formulas, so components come out NaN vs ±inf")
def _complex_edges(case, mode):
  return any(np.asarray(x).dtype.kind == "c" for x in case.inputs) and _has_extreme(case)


@difference("ResizeArea ResizeBicubic ResizeBilinear ScaleAndTranslate",
            "an input is NaN, ±inf, denormal or |x| >= 1e30",
            "the kernels weight neighbours in a different order: overflow and 0 * inf come "
            "out differently")
def _resize_edges(case, mode):
  return _has_extreme(case)


@difference("EuclideanNorm", "jit, float16/bfloat16 input whose sum of squares overflows the dtype",
            "XLA's CPU fusion keeps half-precision intermediates in float32, so x * x does not "
            "overflow to inf as in TF's half kernel (eager jax rounds each op and matches)")
def _half_norm_overflow(case, mode):
  x = np.asarray(case.inputs[0])
  if mode != "jit" or x.dtype.name not in ("float16", "bfloat16"):
    return False
  with np.errstate(all="ignore"):
    return float(np.nansum(x.astype(np.float64) ** 2)) > float(ml_dtypes.finfo(x.dtype).max)


@difference("Pow", "complex input with a base of exactly 0 (or -0)",
            "TF computes exp(y * log(0)): 0 ** (-9+1j) is inf+nanj, 0 ** 0 is NaN, 0 ** 2j is NaN; "
            "NumPy gives NaN or 1 (0 ** 0), XLA NaN or 1; the rule follows NumPy/XLA")
def _complex_pow_zero_base(case, mode):
  x = np.asarray(case.inputs[0])
  return x.dtype.kind == "c" and (x == 0).any()


@difference("Zeta", "q is a non-positive integer (a pole)",
            "at the poles of the Hurwitz zeta Eigen returns NaN, XLA and SciPy inf")
def _zeta_pole(case, mode):
  q = np.asarray(case.inputs[1]).astype(np.float64)
  return ((q <= 0) & (q == np.floor(q))).any()


@difference("MulNoNan", "complex input whose exact product has a component cancelling to "
            "below 1e-6 * |x| * |y|",
            "Eigen and NumPy/XLA round a*c - b*d differently (fused or not): the leftover of the "
            "cancellation is 0 in one and ~1 ulp of the operands in the other")
def _complex_mul_cancel(case, mode):
  x, y = (np.asarray(v).astype(np.complex128) for v in case.inputs[:2])
  if np.asarray(case.inputs[0]).dtype.kind != "c":
    return False
  exact, scale = x * y, np.abs(x) * np.abs(y)
  with np.errstate(all="ignore"):
    return (((np.abs(exact.real) < 1e-6 * scale) | (np.abs(exact.imag) < 1e-6 * scale)) & (scale > 0)).any()


@difference("ResizeBicubic", "float16 input holding ±65504 (its largest value)",
            "the kernels sum the weighted neighbours in a different order: cancelling values "
            "near ±65504 leaves an absolute error ~1e-3, above the tolerance of a small output")
def _bicubic_half_max(case, mode):
  x = np.asarray(case.inputs[0])
  return x.dtype == np.float16 and (np.abs(x.astype(np.float64)) >= 65504).any()


@difference("ReverseV2", "0-d input with axis [0] or [-1]",
            "TF ignores the axis of a scalar; the rule raises (axis out of bounds)")
def _reverse_scalar(case, mode):
  return np.ndim(case.inputs[0]) == 0 and np.size(case.inputs[1]) > 0


@difference("SparseAdd", "traced values (jit) whose overlapping entries sum to NaN, thresh 0",
            "TF drops a sum that fails |sum| >= thresh, and NaN fails it; which sums are NaN is known only "
            "at run time, so a traced sum is kept (the output size cannot depend on values)")
def _sparse_add_nan_sum(case, mode):
  return mode == "jit" and any(np.isnan(x).any() for x in _floats(case))


@difference("SparseReduceMax SparseReduceMaxSparse", "NaN in the values",
            "TF's Eigen max skips a NaN depending on its position in the group; the rule's scatter-max "
            "propagates it (as MaxPool's)")
def _sparse_reduce_max_nan(case, mode):
  return any(np.isnan(x).any() for x in _floats(case))


@difference("NthElement", "NaN in the input",
            "TF's std::nth_element has no order for NaN (its result depends on where the NaN sits); the rule "
            "sorts NaN last, as jnp.sort does")
def _nth_element_nan(case, mode):
  return any(np.isnan(x).any() for x in _floats(case))


@difference("LSTMBlockCell GRUBlockCell", "non-finite inputs, or float16 values that overflow the gate matmul",
            "an infinity in the gate matmul meets one of the other sign in an order that depends on the "
            "accumulation (Eigen's blocked GEMM vs XLA's dot), so which gates turn NaN differs")
def _rnn_cell_non_finite(case, mode):
  floats = [np.asarray(x) for x in case.inputs if np.asarray(x).dtype.kind == "f"]
  return any((~np.isfinite(x)).any() or (x.dtype == np.float16 and np.abs(x).max(initial=0) > 1e3)
             for x in floats)
