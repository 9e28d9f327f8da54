"""Bessel functions J0, J1, Y0, Y1, K0, K0e, K1, K1e against TF's CPU kernels.

Values per dtype on both sides of every branch point (2 for float, 5 for double, 8 for the I series),
edge values (zeros, negatives, infinities, NaN, subnormals, huge arguments), gradients against
`tf.GradientTape` (first and second order, and where TF's formulas give 0.5, NaN or infinities), jit and
vmap through `oracle.check`, and a property test over the whole float range. Tolerances are a few ulps:
float16 results are float ones rounded (1 ulp), float32 within 8 ulps (or 1 ulp of 1 near a zero of
the function), float64 within ~50 ulps.
"""
import warnings

import hypothesis
import hypothesis.strategies as st
import jax
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport import config
from jaxport.convert import host_callback, tiers
from jaxport.convert.registry import Tier
from jaxport.errors import InvalidNodeError
from oracle import check, run_rule

OPS = ["BesselJ0", "BesselJ1", "BesselY0", "BesselY1", "BesselK0", "BesselK0e", "BesselK1", "BesselK1e"]
EVEN_OR_ODD = {"BesselJ0", "BesselJ1"}   # defined for negative x; the others are -inf, inf or NaN there
DTYPES = [np.float16, np.float32, np.float64]
# (atol, rtol) per dtype, and the atol of gradients (as large as K1'(0.02) ~ -2500 in float32)
TOLERANCE = {np.float16: (1e-7, 1e-3), np.float32: (1e-7, 1e-6), np.float64: (1e-16, 1e-14)}
GRAD_ATOL = {np.float16: 1e-3, np.float32: 1e-6, np.float64: 1e-14}

POSITIVE = np.array([0.02, 0.4, 1.3, 1.999, 2.001, 3.7, 4.999, 5.001, 7.9, 8.1, 15.0, 42.0])
SIGNED = np.concatenate([-POSITIVE[::3], POSITIVE])


def raw(op):
  return lambda x: getattr(tf.raw_ops, op)(x=x)


def assert_like_tf(actual, expected, dtype, what=""):
  """Within the dtype's tolerance, NaNs and infinities (with their signs) in the same places."""
  actual, expected = np.asarray(actual), np.asarray(expected)
  assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
  atol, rtol = TOLERANCE[dtype]
  np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), atol=atol, rtol=rtol,
                             err_msg=what)


def edge_values(dtype):
  info = np.finfo(dtype)
  values = [0.0, -0.0, info.smallest_subnormal, info.tiny, 1e-3, 1.0, -1.0, 2.0, 5.0, 8.0, -8.5, 1e4,
            info.max, -info.max, np.inf, -np.inf, np.nan]
  if dtype != np.float16:
    values += [1e-30, 1e20, -1e20, 3.3e7]
  return np.array(values, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
def test_values_and_gradients_match_tf(op, dtype):
  x = (SIGNED if op in EVEN_OR_ODD else POSITIVE).astype(dtype)
  atol, rtol = TOLERANCE[dtype]
  with jax.enable_x64(dtype == np.float64):
    check(raw(op), x, atol=atol, rtol=rtol, grad_atol=GRAD_ATOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
def test_edge_values_match_tf(op, dtype):
  x = edge_values(dtype)
  expected = raw(op)(x).numpy()
  with jax.enable_x64(dtype == np.float64):
    fn = jaxport.convert_functional(raw(op), x)
    for label, run in (("eager", fn), ("jit", jax.jit(fn))):
      assert_like_tf(run(x), expected, dtype, f"{op} {label} at {x}")


def test_special_values_are_tfs():
  """A few of TF's choices, spelled out: J even and odd, Y -inf (and float's Y1(0) NaN), K inf."""
  x = np.array([-2.0, 0.0, np.inf, np.nan], np.float32)
  got = {op: np.asarray(run_rule(op, x)) for op in OPS}
  np.testing.assert_array_equal(got["BesselJ0"][:2], [raw("BesselJ0")(np.float32([2.0])).numpy()[0], 1.0])
  np.testing.assert_array_equal(got["BesselJ1"][1], 0.0)
  np.testing.assert_array_equal(got["BesselY0"], [-np.inf, -np.inf, np.nan, np.nan])
  np.testing.assert_array_equal(got["BesselY1"], [-np.inf, np.nan, np.nan, np.nan])
  with jax.enable_x64(True):
    np.testing.assert_array_equal(run_rule("BesselY1", np.float64([0.0])), [-np.inf])   # double: -inf
  for op in ("BesselK0", "BesselK0e", "BesselK1", "BesselK1e"):
    np.testing.assert_array_equal(got[op], [np.inf, np.inf, 0.0, np.nan])


FIRST_ZEROS_BEYOND_2 = {"BesselJ0": 2.404825557695773, "BesselJ1": 3.8317059702075125,
                        "BesselY0": 3.957678419314858, "BesselY1": 2.197141326031017}


@pytest.mark.parametrize("op", sorted(FIRST_ZEROS_BEYOND_2))
def test_float_products_are_rounded_like_tfs_near_zeros(op):
  """Near a zero of the function, TF's float values come within 1/8 ulp of 1 only if every product is
  rounded before it is summed: XLA fusing them into multiply-adds (as it would) is off by up to 1 ulp."""
  zero = FIRST_ZEROS_BEYOND_2[op]
  x = np.linspace(zero - 0.05, zero + 0.05, 801).astype(np.float32)
  expected = raw(op)(x).numpy()
  fn = jax.jit(jaxport.convert_functional(raw(op), x))
  np.testing.assert_allclose(np.asarray(fn(x)), expected, atol=1.5e-8, rtol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_bfloat16_is_float_rounded(op):
  """TF has no CPU kernel for bfloat16 (its graphs still convert): the rule computes in float and rounds,
  as Eigen's bfloat16 overloads do."""
  x = np.concatenate([SIGNED, edge_values(np.float32)]).astype(ml_dtypes.bfloat16)
  expected = raw(op)(x.astype(np.float32)).numpy().astype(ml_dtypes.bfloat16)
  fn = jaxport.convert_functional(raw(op), x)
  for label, run in (("eager", fn), ("jit", jax.jit(fn))):
    got = np.asarray(run(x))
    assert got.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=2**-8, atol=0,
                               err_msg=f"{op} {label}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", OPS)
def test_gradients_at_edges_match_tf(op, dtype):
  """TF's formulas where they give 0.5 (J1 at 0), NaN or infinities, and at both sides of the branches."""
  x = np.array([0.0, 1e-3, 1.5, 2.0, 5.0, 8.0, 1e4, -1.5, np.inf], dtype)
  tf_x = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(tf_x)
    total = tf.reduce_sum(raw(op)(tf_x))
  expected = tape.gradient(total, tf_x).numpy()
  with jax.enable_x64(dtype == np.float64):
    fn = jaxport.convert_functional(raw(op), x)
    got = np.asarray(jax.jit(jax.grad(lambda v: fn(v).sum()))(x))
  assert_like_tf(got, expected, dtype, op)
  if op == "BesselJ1":
    assert got[0] == 0.5


@pytest.mark.parametrize("op", OPS)
def test_second_derivatives_match_tf(op):
  x = np.array([0.3, 1.5, 3.0, 6.0, 12.0] + ([-2.5, -7.0] if op in EVEN_OR_ODD else []), np.float64)
  tf_x = tf.constant(x)
  with tf.GradientTape() as outer:
    outer.watch(tf_x)
    with tf.GradientTape() as inner:
      inner.watch(tf_x)
      total = tf.reduce_sum(raw(op)(tf_x))
    slope = tf.reduce_sum(inner.gradient(total, tf_x))
  expected = outer.gradient(slope, tf_x).numpy()
  with jax.enable_x64(True):
    fn = jaxport.convert_functional(raw(op), x)
    first = jax.grad(lambda v: fn(v).sum())
    got = np.asarray(jax.jit(jax.grad(lambda v: first(v).sum()))(x))
  np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)


_CONVERTED_ALL = {}


def _all_ops(dtype):
  """The eight ops of one input, converted once per dtype (inputs of any length)."""
  if dtype not in _CONVERTED_ALL:
    spec = tf.TensorSpec((None,), tf.as_dtype(dtype))
    _CONVERTED_ALL[dtype] = jax.jit(jaxport.convert_functional(lambda x: tuple(raw(op)(x) for op in OPS), spec))
  return _CONVERTED_ALL[dtype]


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]))
def test_whole_float_range_property(data, dtype):
  width = 32 if dtype == np.float32 else 64
  finite = st.floats(width=width, allow_nan=False, allow_infinity=False)
  moderate = st.floats(-60, 60, width=width)
  values = data.draw(st.lists(st.one_of(finite, moderate, st.floats(width=width)), min_size=1, max_size=16))
  x = np.array(values, dtype)
  with jax.enable_x64(dtype == np.float64):
    got = _all_ops(dtype)(x)
  for op, value in zip(OPS, got):
    assert_like_tf(value, raw(op)(x).numpy(), dtype, f"{op} at {x}")


@pytest.mark.parametrize("op", OPS)
def test_rules_are_native_and_fold_constants(op):
  assert tiers.op_tier(op, config.snapshot()) == Tier.NATIVE
  x = POSITIVE.astype(np.float32)
  with warnings.catch_warnings():
    warnings.simplefilter("error", host_callback.HostCallbackWarning)
    fn = jaxport.convert_functional(lambda v: raw(op)(v) + raw(op)(tf.constant(x)), x)
    assert_like_tf(fn(x), 2 * raw(op)(x).numpy(), np.float32, op)
  assert_like_tf(run_rule(op, x), raw(op)(x).numpy(), np.float32, f"{op} of a NumPy constant")


def test_integer_input_is_refused():
  with pytest.raises(InvalidNodeError, match="BesselK0 node .*float input"):
    run_rule("BesselK0", np.arange(3, dtype=np.int32))
