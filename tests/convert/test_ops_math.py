"""Elementwise math, activations, comparisons, logic and casts against TF.

Every op is checked through `oracle.check` (eager, jit, gradients, vmap) and, for
the rules that fold constants, once more on NumPy inputs: that path must return
NumPy (so shape arithmetic stays static) with TF's values.
"""
import platform
import subprocess
import sys

import hypothesis
import hypothesis.strategies as st
import jax
import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
nan, inf = np.nan, np.inf

ANY = np.array([[-1.7, -0.6, 0.3], [0.8, 1.4, 2.3]], np.float32)
POSITIVE = np.array([[0.3, 0.7, 1.2], [1.9, 2.6, 3.4]], np.float32)
UNIT = np.array([[-0.8, -0.45, -0.1], [0.2, 0.55, 0.85]], np.float32)
ROW = np.array([0.9, -1.3, 1.6], np.float32)   # broadcasts against the (2, 3) inputs
POSITIVE_ROW = np.array([0.5, 1.5, 2.5], np.float32)


def raw_op(op, names, **attrs):
  """`tf.raw_ops.<op>` called with positional inputs."""
  return lambda *xs: getattr(raw, op)(**dict(zip(names, xs)), **attrs)


def check_op(op, names, *args, attrs=None, folds=True, atol=1e-5, rtol=1e-5, **check_kwargs):
  """`oracle.check` of the raw op, then the rule on NumPy constants against TF eager."""
  attrs = attrs or {}
  fn = raw_op(op, names, **attrs)
  check(fn, *args, atol=atol, rtol=rtol, **check_kwargs)
  folded = run_rule(op, *args, **attrs)
  if folds:
    assert type(folded) is np.ndarray, f"{op} of constants gave {type(folded)}"
  expected = fn(*args).numpy()
  assert_close(folded, expected, atol, rtol, "constants")
  assert np.asarray(folded).dtype == expected.dtype


def assert_exact(actual, expected):
  """Values (complex included) and dtype, NaNs equal."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
  if actual.dtype in (ml_dtypes.bfloat16, np.float16):   # NumPy's NaN-aware comparison needs float32
    actual, expected = actual.astype(np.float32), expected.astype(np.float32)
  np.testing.assert_array_equal(actual, expected)


def tf_runs(fn, *args) -> bool:
  """Whether TF has a CPU kernel for `fn` on these dtypes (we only compare where it has)."""
  try:
    fn(*args)
    return True
  except (TypeError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError):
    return False


# --------------------------------------------------------------------------- unary float ops

UNARY = [
    ("Abs", ANY), ("Neg", ANY), ("Sign", ANY), ("Sqrt", POSITIVE), ("Rsqrt", POSITIVE),
    ("Square", ANY), ("Reciprocal", ANY), ("Inv", ANY), ("Exp", ANY), ("Expm1", ANY),
    ("Log", POSITIVE), ("Log1p", POSITIVE), ("Sin", ANY), ("Cos", ANY), ("Tan", UNIT),
    ("Asin", UNIT), ("Acos", UNIT), ("Atan", ANY), ("Sinh", ANY), ("Cosh", ANY), ("Tanh", ANY),
    ("Asinh", ANY), ("Acosh", 1 + POSITIVE), ("Atanh", UNIT), ("Floor", ANY), ("Ceil", ANY),
    ("Round", ANY), ("Rint", ANY), ("IsNan", ANY), ("IsInf", ANY), ("IsFinite", ANY),
    ("OnesLike", ANY), ("ZerosLike", ANY),
]


@pytest.mark.parametrize("op,x", UNARY, ids=[u[0] for u in UNARY])
def test_unary(op, x):
  check_op(op, ["x"], x)


SIGMOID_AND_SPECIAL = [
    ("Sigmoid", ANY, 1e-5), ("Erf", ANY, 1e-5), ("Erfc", ANY, 1e-5), ("Erfinv", UNIT, 1e-4),
    ("Lgamma", POSITIVE, 1e-4), ("Digamma", POSITIVE, 1e-4), ("Ndtri", (UNIT + 1) / 2, 1e-4),
    ("BesselI0", ANY, 1e-4), ("BesselI0e", ANY, 1e-4), ("BesselI1", ANY, 1e-4),
    ("BesselI1e", ANY, 1e-4), ("Dawsn", ANY, 1e-4), ("Expint", POSITIVE, 1e-4),
    ("Spence", POSITIVE, 1e-4), ("FresnelSin", ANY, 1e-4), ("FresnelCos", ANY, 1e-4),
]


@pytest.mark.parametrize("op,x,tol", SIGMOID_AND_SPECIAL, ids=[s[0] for s in SIGMOID_AND_SPECIAL])
def test_sigmoid_and_special_functions(op, x, tol):
  check_op(op, ["x"], x, folds=False, atol=tol, rtol=tol)


@pytest.mark.parametrize("op,names,constants", [
    ("Igamma", ["a", "x"], None), ("Igammac", ["a", "x"], None),
    ("Zeta", ["x", "q"], {"x": 1 + 2 * POSITIVE}),          # TF has no gradient in x
    ("Polygamma", ["a", "x"], {"a": np.array([[0., 1., 2.]] * 2, np.float32)}),
    ("Betainc", ["a", "b", "x"], {"a": POSITIVE, "b": POSITIVE[::-1]}),
])
def test_special_functions_of_several_arguments(op, names, constants):
  """Arguments TF does not differentiate are constants; the others are inputs."""
  constants = constants or {}
  inputs = [n for n in names if n not in constants]
  values = {"a": POSITIVE, "x": (UNIT + 1) / 2 if op == "Betainc" else POSITIVE + 0.5, "q": POSITIVE}

  def fn(*xs):
    kwargs = dict(zip(inputs, xs))
    kwargs.update({n: tf.constant(v) for n, v in constants.items()})
    return getattr(raw, op)(**kwargs)

  check(fn, *[values[n] for n in inputs], atol=1e-4, rtol=1e-4)


def test_abs_neg_sign_square_of_integers():
  ints = np.array([[-2**31, -7, 0], [1, 5, 2**31 - 1]], np.int32)
  for op in ("Abs", "Neg", "Sign", "Square", "OnesLike", "ZerosLike"):
    check_op(op, ["x"], ints)
  # tf.round keeps integers (it emits no op); the raw Round kernel returns zeros, a TF bug not copied.
  assert_exact(run_rule("Round", ints), ints)


# --------------------------------------------------------------------------- activations

ACTIVATIONS = [("Relu", {}), ("Relu6", {}), ("Elu", {}), ("Selu", {}), ("Softplus", {}),
               ("Softsign", {}), ("LeakyRelu", {"alpha": 0.3}), ("LeakyRelu", {"alpha": 2.0})]


@pytest.mark.parametrize("op,attrs", ACTIVATIONS, ids=[f"{a[0]}{a[1]}" for a in ACTIVATIONS])
def test_activations(op, attrs):
  check_op(op, ["features"], 4 * ANY, attrs=attrs, folds=op != "Softplus")


@pytest.mark.parametrize("op,attrs", ACTIVATIONS, ids=[f"{a[0]}{a[1]}" for a in ACTIVATIONS])
def test_activation_gradients_at_kinks_and_nan(op, attrs):
  """TF's gradient at 0 (and 6 for Relu6); NaN passes through."""
  x = np.array([0., 6., -1., 7.], np.float32)
  check(raw_op(op, ["features"], **attrs), x)
  with_nan = np.array([nan, -1., 7.], np.float32)
  assert_close(jaxport.convert_functional(raw_op(op, ["features"], **attrs), with_nan)(with_nan),
               raw_op(op, ["features"], **attrs)(with_nan), 1e-6, 1e-6)


@pytest.mark.parametrize("dtype", [tf.int32, tf.int8])
def test_relu_relu6_of_integers(dtype):
  x = tf.constant([-3, 0, 4, 9], dtype)
  for op in ("Relu", "Relu6"):
    check_op(op, ["features"], x.numpy())


@pytest.mark.parametrize("name,fn", [
    ("gelu_exact", lambda x: keras.activations.gelu(x, approximate=False)),
    ("gelu_tanh", lambda x: keras.activations.gelu(x, approximate=True)),
    ("silu", keras.activations.silu), ("mish", keras.activations.mish),
    ("hard_silu", keras.activations.hard_silu), ("log_sigmoid", keras.activations.log_sigmoid),
    ("celu", keras.activations.celu), ("tf_gelu", lambda x: tf.nn.gelu(x)),
])
def test_keras_activations(name, fn):
  check(fn, 3 * ANY, atol=1e-5)


GRADIENT_OPS = [
    ("ReluGrad", ["gradients", "features"], {}), ("Relu6Grad", ["gradients", "features"], {}),
    ("EluGrad", ["gradients", "outputs"], {}), ("SeluGrad", ["gradients", "outputs"], {}),
    ("SoftplusGrad", ["gradients", "features"], {}), ("SoftsignGrad", ["gradients", "features"], {}),
    ("LeakyReluGrad", ["gradients", "features"], {"alpha": 0.25}),
    ("SigmoidGrad", ["y", "dy"], {}), ("TanhGrad", ["y", "dy"], {}), ("SqrtGrad", ["y", "dy"], {}),
    ("RsqrtGrad", ["y", "dy"], {}), ("ReciprocalGrad", ["y", "dy"], {}), ("InvGrad", ["y", "dy"], {}),
]


@pytest.mark.parametrize("op,names,attrs", GRADIENT_OPS, ids=[g[0] for g in GRADIENT_OPS])
def test_gradient_ops(op, names, attrs):
  """The ops themselves, and their own gradients where TF defines them."""
  first = POSITIVE if names[0] == "y" else ANY
  second = 4 * ANY if names[1] == "features" else ANY
  if names[1] == "outputs":
    second = raw_op(op[:-4], ["features"])(4 * ANY).numpy()   # outputs of Elu/Selu
  check_op(op, names, first, second, attrs=attrs, folds=op != "SoftplusGrad", grad=op != "SoftsignGrad")


def test_gradient_taken_inside_the_traced_function():
  """TF emits the *Grad ops; the converted function computes the same gradient."""
  def grad_of(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = tf.reduce_sum(tf.nn.relu(x) * tf.tanh(x) + tf.sigmoid(x) * tf.sqrt(x * x + 1.) + tf.nn.elu(x)
                        + tf.nn.softplus(x) + tf.math.reciprocal(x + 3.) + tf.nn.relu6(3 * x) + tf.nn.selu(x))
    return tape.gradient(y, x)

  ops = {n.op for n in tf.function(grad_of).get_concrete_function(ANY).graph.as_graph_def().node}
  assert {"ReluGrad", "TanhGrad", "SigmoidGrad", "EluGrad", "SeluGrad", "Relu6Grad"} <= ops
  check(grad_of, ANY, grad=False)


# --------------------------------------------------------------------------- binary float ops

BINARY = [
    ("Add", ANY, ROW), ("AddV2", ANY, ROW), ("Sub", ANY, ROW), ("Mul", ANY, ROW), ("Div", ANY, ROW),
    ("RealDiv", ANY, ROW), ("DivNoNan", ANY, ROW), ("MulNoNan", ANY, ROW),
    ("Pow", POSITIVE, ROW), ("Maximum", ANY, ROW), ("Minimum", ANY, ROW),
    ("SquaredDifference", ANY, ROW), ("Xlogy", ANY, POSITIVE_ROW), ("Xdivy", ANY, ROW),
    ("Xlog1py", ANY, POSITIVE_ROW), ("FloorDiv", ANY, ROW), ("FloorMod", ANY, ROW),
    ("TruncateDiv", ANY, ROW),
]


@pytest.mark.parametrize("op,x,y", BINARY, ids=[b[0] for b in BINARY])
def test_binary(op, x, y):
  check_op(op, ["x", "y"], x, y)


@pytest.mark.parametrize("op", ["Mod", "TruncateMod"])
def test_truncated_modulo_of_floats(op):
  check_op(op, ["x", "y"], 3 * ANY, ROW, grad=False)   # TF registers no gradient


def test_atan2():
  check_op("Atan2", ["y", "x"], ANY, ROW)


def test_float_floor_division_is_floor_of_quotient():
  """TF: floor(1 / 0.1) = 10 where Python's 1 // 0.1 = 9; FloorMod follows the divisor's sign."""
  x = np.array([1., -7., 7., -4., 5.5, 3.], np.float32)
  y = np.array([0.1, 2., -2., 2., -0., 0.], np.float32)
  for op in ("FloorDiv", "FloorMod", "TruncateDiv", "Mod"):
    check_op(op, ["x", "y"], x, y, grad=False)


TIES = [
    ("Maximum", np.array([1., 2., -1.], np.float32), np.array([1., 1., -1.], np.float32)),
    ("Minimum", np.array([1., 2., -1.], np.float32), np.array([1., 1., -1.], np.float32)),
    ("Pow", np.array([-2., 0., 0., 3.], np.float32), np.array([2., 2., 0.5, 0.], np.float32)),
    ("DivNoNan", np.array([1., 2., inf, 0.], np.float32), np.array([0., 2., 0., 0.], np.float32)),
    ("MulNoNan", np.array([1., 2., inf, nan], np.float32), np.array([0., 2., 0., 0.], np.float32)),
    ("Xlogy", np.array([0., 0., 0., 1.], np.float32), np.array([0., nan, 2., 0.], np.float32)),
    ("Xdivy", np.array([0., 0., 1., 2.], np.float32), np.array([0., 2., 0., 4.], np.float32)),
    ("Xlog1py", np.array([0., 0., 1., 2.], np.float32), np.array([-1., 2., -1., 1.], np.float32)),
]


@pytest.mark.parametrize("op,x,y", TIES, ids=[t[0] for t in TIES])
def test_values_and_gradients_at_ties_zeros_and_nan(op, x, y):
  """Tie-breaking, 0/NaN/inf handling and TF's gradients at those points."""
  check_op(op, ["x", "y"], x, y, vmap=False)


def test_abs_gradient_at_zero():
  check(lambda x: raw.Abs(x=x), np.array([0., -1., 2.], np.float32))


def test_clip_by_value():
  x = np.array([[-2., 0., 0.5], [1., 3., nan]], np.float32)
  check_op("ClipByValue", ["t", "clip_value_min", "clip_value_max"], x, np.float32(0.), np.float32(1.),
           vmap=False)
  lo, hi = np.full((2, 3), -0.5, np.float32), np.array([[0.2, 1., 2.]] * 2, np.float32)
  check_op("ClipByValue", ["t", "clip_value_min", "clip_value_max"], ANY, lo, hi)


def test_add_n():
  check(lambda a, b, c: raw.AddN(inputs=[a, b, c]), ANY, POSITIVE, UNIT)
  ints = [np.array([2**31 - 1, 5], np.int32), np.array([1, -6], np.int32)]
  assert_exact(run_rule("AddN", *ints), raw.AddN(inputs=ints).numpy())


def test_add_concatenates_string_constants():
  assert_exact(run_rule("Add", np.array([b"ab", b"c"], object), np.array([b"x", b"yz"], object)),
               np.array([b"abx", b"cyz"], object))


# --------------------------------------------------------------------------- integer arithmetic

INT_X = np.array([-7, 7, -7, 7, -8, 0, 2**31 - 1, -2**31], np.int32)
INT_Y = np.array([2, -2, -2, 2, 3, -5, 3, -1], np.int32)


@pytest.mark.parametrize("op", ["FloorDiv", "FloorMod", "TruncateDiv", "TruncateMod", "Mod", "Div",
                                "Add", "Sub", "Mul", "Maximum", "Minimum", "SquaredDifference"])
def test_integer_binary(op):
  check_op(op, ["x", "y"], INT_X, INT_Y)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32])
def test_integer_division_family_by_dtype(dtype):
  info = np.iinfo(dtype)
  x = np.array([info.min, info.max, 5, 9, info.min + 1, 0], dtype)
  y = np.array([3, -4 if info.min < 0 else 4, 2, 7, 5, 3], dtype)
  for op in ("FloorDiv", "FloorMod", "TruncateDiv", "TruncateMod", "Div"):
    if tf_runs(raw_op(op, ["x", "y"]), x, y):
      check_op(op, ["x", "y"], x, y)


def test_integer_pow():
  check_op("Pow", ["x", "y"], np.array([-2, 3, 5, -1], np.int32), np.array([3, 0, 2, 5], np.int32))


def test_integer_pow_wraps_like_tf():
  # Regression (fuzz): jnp.power reads only 6 bits of the exponent, so 7 ** 100 wrapped wrongly.
  check_op("Pow", ["x", "y"], np.array([7, 3, -7, 2], np.int32), np.array([100, 100, 99, 64], np.int32),
           grad=False)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(data=st.data(), dtype=st.sampled_from([np.int32, np.int16]))
def test_integer_division_property(data, dtype):
  """Random integers of both signs against TF, through one converted function per dtype."""
  info = np.iinfo(dtype)
  n = data.draw(st.integers(1, 6))
  x = np.array(data.draw(st.lists(st.integers(info.min, info.max), min_size=n, max_size=n)), dtype)
  y = np.array(data.draw(st.lists(st.integers(info.min, info.max).filter(bool), min_size=n, max_size=n)),
               dtype)
  hypothesis.assume(not np.any((x == info.min) & (y == -1)))   # overflow: TF's CPU kernels disagree
  ops = DIVISION_FAMILY if dtype == np.int32 else DIVISION_FAMILY[:3]   # no int16 TruncateMod in TF
  for op, got in zip(ops, _division_family(np.dtype(dtype), ops)(x, y)):
    assert_exact(got, getattr(raw, op)(x=x, y=y).numpy())


DIVISION_FAMILY = ("FloorDiv", "FloorMod", "TruncateDiv", "TruncateMod")
_CONVERTED_DIVISION_FAMILY = {}


def _division_family(dtype, ops):
  """One conversion per dtype (inputs of any length), reused by every hypothesis example."""
  if dtype not in _CONVERTED_DIVISION_FAMILY:
    spec = tf.TensorSpec((None,), tf.as_dtype(dtype))
    _CONVERTED_DIVISION_FAMILY[dtype] = jaxport.convert_functional(
        lambda x, y: tuple(getattr(raw, op)(x=x, y=y) for op in ops), spec, spec)
  return _CONVERTED_DIVISION_FAMILY[dtype]


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint16])
def test_bitwise(dtype):
  info = np.iinfo(dtype)
  x = np.array([info.min, info.max, 5, 12, 0, 1], dtype)
  y = np.array([3, 1, 6, 10, 7, info.max], dtype)
  for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    check_op(op, ["x", "y"], x, y)
  check_op("Invert", ["x"], x)
  check_op("PopulationCount", ["x"], x, folds=False)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint32])
def test_shifts_clamp_the_amount_like_tf(dtype):
  bits = 8 * np.dtype(dtype).itemsize
  x = np.array([1, 1, 1, 5, np.iinfo(dtype).max, 3, 200 % np.iinfo(dtype).max], dtype)
  amounts = [0, 1, bits - 1, bits, bits + 3, 2, 9]
  if np.iinfo(dtype).min < 0:
    x[-2] = -8
    amounts[-2] = -1
  shift = np.array(amounts, dtype)
  for op in ("LeftShift", "RightShift"):
    check_op(op, ["x", "y"], x, shift)


# --------------------------------------------------------------------------- comparisons and logic

@pytest.mark.parametrize("op", ["Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual"])
def test_comparisons(op):
  x = np.array([[1., nan, 3.], [0., -1., 2.]], np.float32)
  y = np.array([1., nan, 2.], np.float32)
  check_op(op, ["x", "y"], x, y)
  check_op(op, ["x", "y"], INT_X, INT_Y)


@pytest.mark.parametrize("op,expected", [("Equal", False), ("NotEqual", True)])
def test_equality_of_incompatible_shapes(op, expected):
  x, y = np.ones((2, 3), np.float32), np.ones((4,), np.float32)
  fn = raw_op(op, ["x", "y"], incompatible_shape_error=False)
  assert fn(x, y).numpy() == expected
  check(fn, x, y, vmap=False)
  check_op(op, ["x", "y"], x, y[:3], attrs={"incompatible_shape_error": False})


def test_equality_of_strings():
  words = np.array([b"a", b"bc", b""], object)
  others = np.array([b"a", b"b", b""], object)
  for op in ("Equal", "NotEqual"):
    assert_exact(run_rule(op, words, others), getattr(raw, op)(x=words, y=others).numpy())


def test_logical():
  a = np.array([[True, False, True], [False, False, True]])
  b = np.array([True, True, False])
  check_op("LogicalAnd", ["x", "y"], a, b)
  check_op("LogicalOr", ["x", "y"], a, b)
  check_op("LogicalNot", ["x"], a)


def test_approximate_equal():
  x = np.array([1., 1., 2., nan], np.float32)
  y = np.array([1.05, 1.2, 2., nan], np.float32)
  check_op("ApproximateEqual", ["x", "y"], x, y, attrs={"tolerance": 0.1})


# --------------------------------------------------------------------------- complex numbers

Z = (ANY + 1j * ROW).astype(np.complex64)


def test_complex_ops():
  """oracle compares real parts only, so complex results are compared here in full."""
  cases = {
      "Real": (raw_op("Real", ["input"]), Z), "Imag": (raw_op("Imag", ["input"]), Z),
      "Conj": (raw_op("Conj", ["input"]), Z), "Angle": (raw_op("Angle", ["input"]), Z),
      "ComplexAbs": (raw_op("ComplexAbs", ["x"]), Z), "Sign": (raw_op("Sign", ["x"]), Z),
      "Complex": (raw_op("Complex", ["real", "imag"], Tout=tf.complex64), ANY, ROW),
      "SquaredDifference": (raw_op("SquaredDifference", ["x", "y"]), Z, Z[::-1]),
      "Exp": (raw_op("Exp", ["x"]), Z), "Sigmoid": (raw_op("Sigmoid", ["x"]), Z),
      "Xlogy": (raw_op("Xlogy", ["x", "y"]), Z, Z[::-1]), "DivNoNan": (raw_op("DivNoNan", ["x", "y"]), Z, Z),
  }
  for name, (fn, *args) in cases.items():
    expected = fn(*args).numpy()
    converted = jaxport.convert_functional(fn, *args)
    for got in (converted(*args), jax.jit(converted)(*args)):
      assert got.dtype == expected.dtype, name
      np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-6, err_msg=name)
    folded = run_rule(name, *args, **({"Tout": np.dtype(np.complex64)} if name == "Complex" else {}))
    np.testing.assert_allclose(folded, expected, rtol=1e-5, atol=1e-6, err_msg=name)


# --------------------------------------------------------------------------- dtypes and constants

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float64, np.int8, np.uint8, np.int16, np.int32]


@pytest.mark.parametrize("dtype", DTYPES, ids=[np.dtype(d).name for d in DTYPES])
def test_output_dtypes_match_tf(dtype):
  is_float = np.dtype(dtype).kind == "f" or dtype == ml_dtypes.bfloat16
  x = np.array([[1, 2, 3], [4, 5, 6]]).astype(dtype)
  y = np.array([3, 2, 1]).astype(dtype)
  ops = ["Add", "Sub", "Mul", "Maximum", "Minimum", "FloorDiv", "FloorMod", "TruncateDiv", "Div",
         "SquaredDifference", "Less", "Equal"]
  unary = ["Neg", "Abs", "Sign", "Square", "ZerosLike", "OnesLike"]
  if is_float:
    ops += ["RealDiv", "Pow", "DivNoNan", "Xlogy", "Atan2"]
    unary += ["Sqrt", "Exp", "Tanh", "Sigmoid", "Floor", "Round", "Relu", "Elu", "Erf", "Reciprocal"]
  else:
    ops += ["BitwiseAnd", "LeftShift", "RightShift", "TruncateMod"]
    unary += ["Invert", "PopulationCount"]
  checked = []
  with jax.enable_x64(dtype == np.float64):
    for op in ops:
      checked += _assert_dtype_like_tf(raw_op(op, ["y", "x"] if op == "Atan2" else ["x", "y"]), x, y)
    for op in unary:
      checked += _assert_dtype_like_tf(raw_op(op, ["features" if op.startswith(("Relu", "Elu")) else "x"]), x)
  assert len(checked) >= 10


def _assert_dtype_like_tf(fn, *args):
  if not tf_runs(fn, *args):
    return []
  expected = fn(*args)
  got = jaxport.convert_functional(fn, *args)(*args)
  assert np.dtype(got.dtype) == np.dtype(expected.dtype.as_numpy_dtype), (fn, got.dtype, expected.dtype)
  tol = 1e-2 if np.dtype(got.dtype).itemsize <= 2 else 1e-6
  np.testing.assert_allclose(np.asarray(got, np.float64), expected.numpy().astype(np.float64), rtol=tol)
  return [fn]


def test_constant_arithmetic_stays_numpy():
  two, three = np.asarray(2, np.int32), np.asarray(3, np.int32)
  for op in ("Mul", "Add", "Sub", "FloorDiv", "FloorMod", "Maximum", "Minimum", "Div", "Pow", "Equal"):
    value = run_rule(op, two, three)
    assert type(value) is np.ndarray, op
  as_float = run_rule("Cast", np.asarray([4, 9], np.int64), DstT=np.dtype(np.float32))
  root = run_rule("Sqrt", as_float)
  assert type(root) is np.ndarray and root.dtype == np.float32
  np.testing.assert_array_equal(root, [2., 3.])


def test_reshape_target_from_shape_arithmetic_under_jit():
  """Mul/FloorDiv/Sub/Cast/Sqrt/Maximum of shapes fold to NumPy, so the reshape is static."""
  def fn(x):
    s = tf.shape(x)
    side = tf.cast(tf.sqrt(tf.cast(s[1] * s[2], tf.float32)), tf.int32)
    rows = tf.maximum(s[0] * s[1] * s[2] // side, 1)
    return tf.reshape(x, tf.stack([rows, side])) * 2.
  x = np.arange(2 * 4 * 9, dtype=np.float32).reshape(2, 4, 9)
  check(fn, x)


# --------------------------------------------------------------------------- casts

def _cast_both_ways(x, dst, truncate=False):
  """Cast through a converted function (traced input) and on the constant; both must equal TF."""
  expected = raw.Cast(x=x, DstT=dst, Truncate=truncate).numpy()
  fn = jaxport.convert_functional(lambda v: raw.Cast(x=v, DstT=dst, Truncate=truncate), x)
  folded = run_rule("Cast", x, DstT=np.dtype(dst.as_numpy_dtype), Truncate=truncate)
  assert type(folded) is np.ndarray
  for got in (fn(x), jax.jit(fn)(x), folded):
    assert_exact(got, expected)


CASTS = [
    (np.float32, tf.int32), (np.float32, tf.int8), (np.float32, tf.uint8), (np.float32, tf.int16),
    (np.float32, tf.uint16), (np.float32, tf.bool), (np.float32, tf.float16), (np.float32, tf.bfloat16),
    (np.float16, tf.int32), (ml_dtypes.bfloat16, tf.int32), (np.float16, tf.uint8), (np.int32, tf.float32),
    (np.int32, tf.int8), (np.int32, tf.uint8), (np.int32, tf.bool), (np.bool_, tf.float32),
    (np.bool_, tf.int32), (np.uint8, tf.int8), (np.int8, tf.uint16), (np.int32, tf.float16),
]


@pytest.mark.parametrize("src,dst", CASTS, ids=[f"{np.dtype(s).name}-{d.name}" for s, d in CASTS])
def test_cast_in_range(src, dst):
  values = [-3.7, -1., -0.5, 0., 0.5, 1.5, 2.5, 7.9, 100.]
  if np.dtype(src).kind in "ub":
    values = [0, 1, 5, 100, 255] if src != np.bool_ else [0, 1, 1, 0, 1]
  _cast_both_ways(np.array(values).astype(src), dst)


def test_cast_gradient():
  check(lambda x: tf.cast(tf.cast(x, tf.float16), tf.float32) * x + tf.cast(tf.cast(x, tf.int32), tf.float32),
        ANY, atol=1e-3, rtol=1e-3)


X86 = platform.machine().lower() in ("x86_64", "amd64")
OUT_OF_RANGE = np.array([nan, inf, -inf, 3e9, -3e9, 5e9, 70000., -129., 300., -1., 2.**31, -2.**31, 1e19],
                        np.float32)


@pytest.mark.skipif(not X86, reason="TF casts NaN/out-of-range floats with x86 conversion semantics")
@pytest.mark.parametrize("dst", [tf.int32, tf.int16, tf.int8, tf.uint8, tf.uint16])
def test_cast_float_out_of_range_like_tf(dst):
  _cast_both_ways(OUT_OF_RANGE, dst)
  with np.errstate(over="ignore"):
    as_half = OUT_OF_RANGE.astype(np.float16)
  _cast_both_ways(as_half, dst)


@pytest.mark.skipif(not X86, reason="TF casts NaN/out-of-range floats with x86 conversion semantics")
@pytest.mark.parametrize("dst", [tf.int64, tf.uint64])
def test_cast_float_to_64_bit_like_tf(dst):
  with jax.enable_x64(True):
    _cast_both_ways(OUT_OF_RANGE, dst)
    _cast_both_ways(OUT_OF_RANGE.astype(np.float64), dst)


@pytest.mark.parametrize("x64", [False, True])
def test_cast_float_to_uint32(x64):
  """Whole range, negatives wrapping. (TF's out-of-range results for uint32 depend on the
  element's position in its vectorised loop, so they are not compared.)"""
  x = np.array([-2.**31, -3e5, -1.5, -0., 0.7, 2.**31 - 128, 2.**31, 3e9, 2.**32 - 256], np.float32)
  with jax.enable_x64(x64):
    _cast_both_ways(x, tf.uint32)


@pytest.mark.parametrize("dst", [tf.bfloat16, tf.float16])
def test_cast_truncate_zeroes_mantissa_bits(dst):
  x = np.array([1.0000001, 1.00390625, 1.0078125 - 1e-6, -1.0078125 + 1e-6, 3.14159, 65519., 70000., nan,
                -inf, 4e-8, 3.4e38], np.float32)
  _cast_both_ways(x, dst, truncate=True)
  _cast_both_ways(x, dst, truncate=False)


def test_cast_truncate_float64_to_float32():
  x = np.array([1 + 2**-30, 1 - 2**-30, -1 - 2**-30, 1e-300, nan], np.float64)
  with jax.enable_x64(True):
    _cast_both_ways(x, tf.float32, truncate=True)


def test_cast_complex():
  z = np.array([2.7 + 1j, 0 + 1j, 0j, -1.5 - 2j], np.complex64)
  for dst in (tf.float32, tf.int32, tf.bool, tf.complex64):
    _cast_both_ways(z, dst)
  _cast_both_ways(np.array([1.5, -2.], np.float32), tf.complex64)


@pytest.mark.parametrize("src,dst,shape", [
    (np.float32, tf.uint8, (2, 3)), (np.float32, tf.int32, (3,)), (np.int16, tf.uint8, ()),
    (np.uint8, tf.float32, (2, 4)), (np.uint8, tf.int16, (3, 2)), (np.float16, tf.int16, (2,)),
])
def test_bitcast(src, dst, shape):
  x = np.arange(1, 1 + int(np.prod(shape)), dtype=np.float64).reshape(shape)
  x = (x * 37 % 251).astype(src)
  fn = lambda v: raw.Bitcast(input=v, type=dst)
  expected = fn(x).numpy()
  folded = run_rule("Bitcast", x, type=np.dtype(dst.as_numpy_dtype))
  for got in (jaxport.convert_functional(fn, x)(x), folded):
    assert_exact(got, expected)


def test_selu_folded_keeps_bfloat16():
  # Found by test_fuzz_ops: NumPy turned bfloat16 times a Python float into float32.
  x = np.array([-2.5, 1.0, 3.0, -0.5], ml_dtypes.bfloat16)
  folded = run_rule("Selu", x)
  assert folded.dtype == x.dtype
  np.testing.assert_allclose(folded.astype(np.float32), raw.Selu(features=x).numpy().astype(np.float32),
                             rtol=1e-2)


@pytest.mark.parametrize("op", ["Igamma", "Igammac", "Polygamma"])
def test_binary_special_functions_broadcast(op):
  # Found by test_fuzz_ops: lax's igamma/polygamma need operands of one shape; TF broadcasts.
  a = np.array([[1.0], [2.0]], np.float32)
  x = np.array([0.5, 1.5, 3.0], np.float32)
  expected = getattr(raw, op)(a=a, x=x).numpy()
  np.testing.assert_allclose(run_rule(op, a, x), expected, rtol=1e-5)


def test_float64_log1p_with_x64_is_accurate_where_xlas_is_not():
  """XLA's float64 log1p is up to 128 ulp off near x = -0.4; the rule's is within 1.5 ulp of the exact value
  (TF's own, Eigen's, is 2.2 ulp off at worst), so within 4 ulp of TF's, with TF's gradient (a subprocess:
  x64 on)."""
  code = """
import jax; jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp, numpy as np, tensorflow as tf, jaxport
x = np.concatenate([np.linspace(-0.49, 0.49, 20001), np.linspace(-0.999, 40, 2001), [-1.0, -2.0, 1e-300, -1e-17,
                    np.inf, np.nan, 5e-324, 1e300]])
fn = tf.function(lambda x: tf.math.log1p(x))
jax_fn, params = jaxport.convert(fn, x)
want = fn(x).numpy()
finite = np.isfinite(want)
exact = np.log1p(x[finite].astype(np.longdouble))   # x87 extended precision: 11 more bits
for got in (jax_fn(params, x)[0], jax.jit(jax_fn)(params, x)[0]):
  got = np.asarray(got)
  assert got.dtype == np.float64
  np.testing.assert_array_equal(got[~finite], want[~finite])
  ulps = np.abs(got[finite] - want[finite]) / np.spacing(np.abs(want[finite]))
  assert ulps.max() <= 4, (ulps.max(), x[finite][ulps.argmax()])
  to_exact = np.abs(got[finite].astype(np.longdouble) - exact) / np.spacing(np.abs(want[finite]))
  assert to_exact.max() <= 1.5, (to_exact.max(), x[finite][to_exact.argmax()])
plain = np.asarray(jax.jit(jnp.log1p)(x))   # what the rule avoids
assert (np.abs(plain - want)[finite] / np.spacing(np.abs(want[finite]))).max() > 8
xt = tf.constant(x[:20001])
with tf.GradientTape() as tape:
  tape.watch(xt)
  y = tf.reduce_sum(tf.math.log1p(xt))
grad = jax.grad(lambda x: jax_fn(params, x)[0].sum())(x)[:20001]
np.testing.assert_allclose(grad, tape.gradient(y, xt).numpy(), rtol=4e-16)
print("ok")
"""
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]
