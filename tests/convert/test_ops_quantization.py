"""TF's quantized types and ops (ops/quantization.py) against TF's reference CPU kernels.

Quantized tensors are compared as their storage integers (`graph.storage_array`). Integer outputs (the
quantized values, accumulations, pooling, fixed-point requantization) must match TF bit for bit, and so
must the float range outputs and eager float results. Under `jax.jit`, XLA:CPU contracts a product and
the add after it into an FMA (Dequantize's `(q + half) * scale + min`), which TF's kernels never do: jitted
float values are compared within an ulp of their magnitude.

The oracle: with oneDNN on (as conftest pins it), TF replaces some of these kernels by oneDNN's, which
give other results than the reference kernels TF documents: QuantizeV2 for qint8/quint8 in SCALED mode
with HALF_TO_EVEN and quint8 in MIN_FIRST mode (other rounding), QuantizedAvgPool (rounds the average
where the reference truncates), Dequantize of qint32 in SCALED mode (no oneDNN kernel: an error). The
in-process tests compare with TF eagerly where the reference kernel runs; `test_full_matrix_against_
reference_kernels` (slow) runs every case against TF with TF_ENABLE_ONEDNN_OPTS=0 in a subprocess.
"""
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
import zlib

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import registry
from jaxport.convert.graph import QUANTIZED_STORAGE, numpy_dtype, storage_array
from jaxport.convert.registry import Tier
from oracle import assert_close

R = tf.raw_ops
QTYPES = [tf.qint8, tf.quint8, tf.qint16, tf.quint16, tf.qint32]
MODES = ["MIN_COMBINED", "MIN_FIRST", "SCALED"]
OPS = ["QuantizeV2", "Dequantize", "QuantizedMatMul", "QuantizedConv2D", "QuantizedBiasAdd", "QuantizedRelu",
       "QuantizedRelu6", "QuantizedMaxPool", "QuantizedAvgPool", "QuantizedConcat", "QuantizedReshape",
       "Requantize", "RequantizationRange", "QuantizeDownAndShrinkRange"]
SHAPES = [(7,), (3, 4, 5), (2, 3, 4, 2)]


def _data(seed, shape, scale=2.0):
  rs = np.random.RandomState(seed)
  x = (rs.normal(size=shape) * scale).astype(np.float32)
  # halves at scales 1 and 8 (SCALED ranges of T's limits / 8), zero, tiny values
  ties = np.array([0.5, -0.5, 1.5, 2.5, -3.0, 0.0, 1e-4, -1e-4, 1 / 16, -1 / 16, 3 / 16, -5 / 16, 0.4375],
                  np.float32)
  x.flat[:min(x.size, ties.size)] = ties[:x.size]
  return x


def _quantized(seed, shape, dtype=np.uint8):
  """Random storage integers, made outside the traced function (TF and jaxport trace it separately)."""
  info = np.iinfo(dtype)
  return np.random.RandomState(seed).randint(info.min, int(info.max) + 1, size=shape).astype(dtype)


# --------------------------------------------------------------------------- cases

def _quantize_case(qtype, mode, round_mode, narrow, axis, shape):
  x = _data(zlib.crc32(f"{qtype.name}{mode}{round_mode}{narrow}{axis}".encode()) % 1000, shape)
  if mode == "SCALED" and axis < 0:   # scale 8 (unless narrow): quantizing hits exact halves
    info = np.iinfo(QUANTIZED_STORAGE[qtype.name])
    lo, hi = np.float32(info.min / 8), np.float32(info.max / 8)
  elif axis < 0:
    lo, hi = np.float32(-3.1), np.float32(2.7)
  else:
    lo = np.linspace(-3.0, -0.5, shape[axis]).astype(np.float32)
    hi = np.linspace(1.0, 3.0, shape[axis]).astype(np.float32)
    if qtype == tf.qint32:   # x86's INT_MIN for 2^31 is TF's undefined behaviour: stay inside the range
      x = np.clip(x, lo.reshape((-1,) + (1,) * (len(shape) - axis - 1)) * 0.99,
                  hi.reshape((-1,) + (1,) * (len(shape) - axis - 1)) * 0.99)

  def fn(x):
    q = R.QuantizeV2(input=x, min_range=lo, max_range=hi, T=qtype, mode=mode, round_mode=round_mode,
                     narrow_range=narrow, axis=axis)
    d = R.Dequantize(input=q.output, min_range=q.output_min, max_range=q.output_max, mode=mode,
                     narrow_range=narrow, axis=axis)
    return q.output, q.output_min, q.output_max, d
  return fn, (x,)


def _quantize_combinations():
  for i, (qtype, mode, round_mode, narrow, axis) in enumerate(itertools.product(
      QTYPES, MODES, ["HALF_AWAY_FROM_ZERO", "HALF_TO_EVEN"], [False, True], [-1, 1])):
    if (round_mode == "HALF_TO_EVEN" and mode != "SCALED") or (mode == "MIN_FIRST" and axis >= 0):
      continue
    shape = SHAPES[1 + i % 2] if axis >= 0 else SHAPES[i % 3]
    yield f"quantize-{qtype.name}-{mode}-{round_mode}-{'narrow' if narrow else 'full'}-axis{axis}", (
        functools.partial(_quantize_case, qtype, mode, round_mode, narrow, axis, shape))


def _dequantize_case(qtype, mode, narrow, axis, shape):
  """Dequantize alone, of a constant, with ranges QuantizeV2 would not produce (its SCALED ranges make
  narrow_range irrelevant to Dequantize)."""
  storage = QUANTIZED_STORAGE[qtype.name]
  q = _quantized(zlib.crc32(f"{qtype.name}{mode}{narrow}{axis}".encode()) % 1000, shape, storage)
  if axis < 0:
    lo, hi = np.float32(-1.3), np.float32(0.7)
  else:
    lo = np.linspace(-1.3, -0.2, shape[axis]).astype(np.float32)
    hi = np.linspace(0.4, 2.0, shape[axis]).astype(np.float32)

  def fn(scale):
    return R.Dequantize(input=tf.constant(q, dtype=qtype), min_range=lo * scale, max_range=hi * scale, mode=mode,
                        narrow_range=narrow, axis=axis)
  return fn, (np.float32(1.0),)


def _dequantize_combinations():
  for i, (qtype, mode, narrow, axis) in enumerate(itertools.product(QTYPES, MODES, [False, True], [-1, 2])):
    if mode == "MIN_FIRST" and axis >= 0:
      continue
    yield f"dequantize-{qtype.name}-{mode}-{'narrow' if narrow else 'full'}-axis{axis}", (
        functools.partial(_dequantize_case, qtype, mode, narrow, axis, SHAPES[2]))


def _onednn_rewrites(name: str) -> bool:
  """Cases whose TF kernel oneDNN replaces (see the module docstring)."""
  return (("-SCALED-HALF_TO_EVEN-" in name and ("-qint8-" in name or "-quint8-" in name))
          or "-quint8-MIN_FIRST-" in name or ("-qint32-SCALED-" in name) or name.startswith("avg_pool"))


def _q(x, lo, hi, qtype=tf.quint8):
  return R.QuantizeV2(input=x, min_range=lo, max_range=hi, T=qtype)


def _relu_case(qtype):
  x = _data(1, (2, 5, 4, 3))

  def fn(x):
    q = _q(x, -1.5, 2.0, qtype)
    relu = R.QuantizedRelu(features=q.output, min_features=q.output_min, max_features=q.output_max, out_type=qtype)
    relu6 = R.QuantizedRelu6(features=q.output, min_features=np.float32(-1.5), max_features=np.float32(8.0),
                             out_type=qtype)
    return tuple(relu) + tuple(relu6)
  return fn, (x,)


def _zero_point_tie_case():
  """Ranges whose zero point is an exact half step (C++'s round takes it away from zero)."""
  q = _quantized(16, (3, 8))
  w = _quantized(17, (8, 2))

  def fn(lo):
    k = tf.constant(q, tf.quint8)
    relu = R.QuantizedRelu(features=k, min_features=lo, max_features=np.float32(252.5), out_type=tf.quint8)
    mm = R.QuantizedMatMul(a=k, b=tf.constant(w, tf.quint8), min_a=lo, max_a=np.float32(252.5),
                           min_b=np.float32(-0.5), max_b=np.float32(254.5))
    return tuple(relu) + tuple(mm)
  return fn, (np.float32(-2.5),)


def _pool_case(op, padding, ksize, strides):
  x = _data(2, (2, 7, 6, 3))

  def fn(x):
    q = _q(x, -2.0, 2.0)
    return tuple(getattr(R, op)(input=q.output, min_input=q.output_min, max_input=q.output_max, ksize=ksize,
                                strides=strides, padding=padding))
  return fn, (x,)


def _reshape_concat_case(qtype):
  x = _data(3, (2, 3, 6))
  fixed = _quantized(4, (2, 2, 6), QUANTIZED_STORAGE[qtype.name])

  def fn(x):
    a, b, c = _q(x, -2.0, 2.0, qtype), _q(2 * x, -1.0, 3.0, qtype), _q(x, -2.0, 2.0, qtype)
    r = R.QuantizedReshape(tensor=a.output, shape=[2, -1], input_min=a.output_min, input_max=a.output_max)
    k = tf.constant(fixed, dtype=qtype)
    cat = R.QuantizedConcat(concat_dim=1, values=[a.output, b.output, c.output, k],
                            input_mins=[a.output_min, b.output_min, c.output_min, np.float32(-0.5)],
                            input_maxes=[a.output_max, b.output_max, c.output_max, np.float32(1.5)])
    return tuple(r) + tuple(cat)
  return fn, (x,)


def _matmul_case(m, k, n):
  x = _data(5, (m, k))
  w = _quantized(6, (k, n))
  wt = _quantized(7, (k, n))

  def fn(x):
    a = _q(x, -2.0, 3.0)
    out = R.QuantizedMatMul(a=a.output, b=tf.constant(w, tf.quint8), min_a=a.output_min, max_a=a.output_max,
                            min_b=np.float32(-0.7), max_b=np.float32(0.9), Toutput=tf.qint32)
    out_t = R.QuantizedMatMul(a=tf.constant(wt, tf.quint8), b=a.output, min_a=np.float32(-0.3), max_a=np.float32(0.9),
                              min_b=a.output_min, max_b=a.output_max, transpose_a=True, transpose_b=True)
    return tuple(out) + tuple(out_t)
  return fn, (x,)


def _conv_case(padding, stride, shape):
  x = _data(8, (2, 9, 8, 3))
  w = _quantized(9, shape)

  def fn(x):
    a = _q(x, -2.0, 3.0)
    return tuple(R.QuantizedConv2D(input=a.output, filter=tf.constant(w, tf.quint8), min_input=a.output_min,
                                   max_input=a.output_max, min_filter=np.float32(-0.5), max_filter=np.float32(0.6),
                                   strides=[1, stride, stride, 1], padding=padding))
  return fn, (x,)


def _bias_add_case():
  x = _data(10, (2, 5, 4))
  bias = _quantized(11, (4,))

  def fn(x):
    a = _q(x, -2.0, 3.0)
    return tuple(R.QuantizedBiasAdd(input=a.output, bias=tf.constant(bias, tf.quint8), min_input=a.output_min,
                                    max_input=a.output_max, min_bias=np.float32(-0.4), max_bias=np.float32(0.5),
                                    out_type=tf.qint32))
  return fn, (x,)


def _requantize_case():
  """quantize_graph's chain: QuantizedMatMul, then RequantizationRange and Requantize (data-dependent
  range), Requantize into a fixed range, and QuantizeDownAndShrinkRange."""
  x = _data(12, (6, 7), scale=3.0)
  w = _quantized(13, (7, 5))

  def fn(x):
    a = _q(x, -4.0, 6.0)
    mm = R.QuantizedMatMul(a=a.output, b=tf.constant(w, tf.quint8), min_a=a.output_min, max_a=a.output_max,
                           min_b=np.float32(-0.7), max_b=np.float32(0.9), Toutput=tf.qint32)
    rr = R.RequantizationRange(input=mm.out, input_min=mm.min_out, input_max=mm.max_out)
    rq = R.Requantize(input=mm.out, input_min=mm.min_out, input_max=mm.max_out, requested_output_min=rr.output_min,
                      requested_output_max=rr.output_max, out_type=tf.quint8)
    fixed = R.Requantize(input=mm.out, input_min=mm.min_out, input_max=mm.max_out,
                         requested_output_min=np.float32(-3.0), requested_output_max=np.float32(4.0),
                         out_type=tf.quint8)
    shrink = R.QuantizeDownAndShrinkRange(input=mm.out, input_min=mm.min_out, input_max=mm.max_out,
                                          out_type=tf.quint8)
    back = R.Dequantize(input=rq.output, min_range=rq.output_min, max_range=rq.output_max, mode="MIN_FIRST")
    return tuple(rr) + tuple(rq) + tuple(fixed) + tuple(shrink) + (back,)
  return fn, (x,)


def _round_trip_case(qtype, mode):
  x = _data(14, (4, 6))

  def fn(x):
    q = tf.quantization.quantize(x, -2.5, 2.5, qtype, mode=mode)
    return tf.quantization.dequantize(q.output, q.output_min, q.output_max, mode=mode)
  return fn, (x,)


CASES = dict(_quantize_combinations())
CASES.update(_dequantize_combinations())
CASES.update({
    "relu-quint8": functools.partial(_relu_case, tf.quint8),
    "relu-qint32": functools.partial(_relu_case, tf.qint32),
    "zero_point_ties": _zero_point_tie_case,
    "max_pool-SAME": functools.partial(_pool_case, "QuantizedMaxPool", "SAME", [1, 3, 2, 1], [1, 2, 2, 1]),
    "max_pool-VALID": functools.partial(_pool_case, "QuantizedMaxPool", "VALID", [1, 2, 2, 1], [1, 1, 2, 1]),
    "avg_pool-SAME": functools.partial(_pool_case, "QuantizedAvgPool", "SAME", [1, 3, 2, 1], [1, 2, 2, 1]),
    "avg_pool-VALID": functools.partial(_pool_case, "QuantizedAvgPool", "VALID", [1, 2, 3, 1], [1, 1, 2, 1]),
    "reshape_concat-quint8": functools.partial(_reshape_concat_case, tf.quint8),
    "reshape_concat-qint32": functools.partial(_reshape_concat_case, tf.qint32),
    "matmul-5x6x4": functools.partial(_matmul_case, 5, 6, 4),
    "matmul-1x33x7": functools.partial(_matmul_case, 1, 33, 7),
    "conv-SAME-1": functools.partial(_conv_case, "SAME", 1, (3, 2, 3, 4)),
    "conv-VALID-2": functools.partial(_conv_case, "VALID", 2, (3, 3, 3, 2)),
    "conv-SAME-3": functools.partial(_conv_case, "SAME", 3, (1, 1, 3, 5)),
    "bias_add": _bias_add_case,
    "requantize": _requantize_case,
    "round_trip-quint8-MIN_COMBINED": functools.partial(_round_trip_case, tf.quint8, "MIN_COMBINED"),
    "round_trip-qint8-SCALED": functools.partial(_round_trip_case, tf.qint8, "SCALED"),
    "round_trip-qint16-MIN_FIRST": functools.partial(_round_trip_case, tf.qint16, "MIN_FIRST"),
})


def _tf_outputs(fn, args):
  """TF's outputs, eagerly, quantized ones as their storage integers."""
  out = fn(*args)
  return [storage_array(t.numpy()) for t in (out if isinstance(out, (tuple, list)) else [out])]


def _flat(out):
  return list(out) if isinstance(out, (tuple, list)) else [out]


def _assert_matches(actual, expected, label, jitted):
  actual = _flat(actual)
  assert len(actual) == len(expected), label
  for i, (a, e) in enumerate(zip(actual, expected)):
    # jitted float arrays: XLA's FMA contraction moves a result by an ulp of the operands
    fused = jitted and e.dtype.kind == "f" and e.ndim
    atol = 3e-7 * float(np.max(np.abs(e), initial=1.0)) if fused else 0.0
    assert_close(np.asarray(a), e, atol, 3e-7 if fused else 0.0, f"{label} output {i}")


def _check_converted(fn, args, expected):
  jax_fn, params = jaxport.convert(fn, *args)
  call = lambda *a: jax_fn(params, *a)[0]
  _assert_matches(call(*args), expected, "eager", False)
  _assert_matches(jax.jit(call)(*args), expected, "jit", True)
  return call


IN_PROCESS = sorted(name for name in CASES if not _onednn_rewrites(name))


@pytest.mark.parametrize("name", IN_PROCESS)
def test_matches_tf(name):
  fn, args = CASES[name]()
  _check_converted(fn, args, _tf_outputs(fn, args))


# --------------------------------------------------------------------------- the reference kernels, oneDNN off

_REFERENCE_SCRIPT = """
import json, sys
import numpy as np
import test_ops_quantization as t
names = json.loads(sys.argv[1])
out = {}
for name in names:
  fn, args = t.CASES[name]()
  for i, value in enumerate(t._tf_outputs(t.tf.function(fn), args)):
    out[f"{name}|{i}"] = value
np.savez(sys.argv[2], **out)
"""


@functools.lru_cache(maxsize=None)
def _reference_outputs(names: tuple) -> dict:
  """TF's outputs of `names` from its reference kernels: a subprocess with oneDNN off."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "expected.npz")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, TF_ENABLE_ONEDNN_OPTS="0", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", _REFERENCE_SCRIPT, json.dumps(list(names)), path], env=env, check=True,
                   cwd=here, timeout=600)
    with np.load(path) as data:
      found = {key: data[key] for key in data.files}
  return {name: [found[f"{name}|{i}"] for i in range(sum(k.startswith(name + "|") for k in found))]
          for name in names}


@pytest.mark.slow
def test_full_matrix_against_reference_kernels():
  names = tuple(sorted(CASES))
  reference = _reference_outputs(names)
  for name in names:
    fn, args = CASES[name]()
    _check_converted(fn, args, reference[name])


# --------------------------------------------------------------------------- traced ranges, vmap, x64


@pytest.mark.parametrize("qtype,mode,round_mode", [
    (tf.qint8, "MIN_COMBINED", "HALF_AWAY_FROM_ZERO"), (tf.quint16, "MIN_COMBINED", "HALF_AWAY_FROM_ZERO"),
    (tf.qint16, "MIN_FIRST", "HALF_AWAY_FROM_ZERO"), (tf.quint8, "SCALED", "HALF_AWAY_FROM_ZERO"),
    (tf.qint16, "SCALED", "HALF_TO_EVEN")], ids=str)
def test_ranges_as_inputs(qtype, mode, round_mode):
  """Ranges that are traced values (not constants) take the jax.numpy path of the range arithmetic."""
  def fn(x, lo, hi):
    q = R.QuantizeV2(input=x, min_range=lo, max_range=hi, T=qtype, mode=mode, round_mode=round_mode)
    return q.output, q.output_min, q.output_max, R.Dequantize(input=q.output, min_range=q.output_min,
                                                              max_range=q.output_max, mode=mode)
  args = (_data(15, (3, 4, 5)), np.float32(-1.7), np.float32(2.9))
  _check_converted(fn, args, _tf_outputs(fn, args))


@hypothesis.settings(max_examples=25, deadline=None, derandomize=True)
@hypothesis.given(lo=st.floats(-100, 1, width=32), width=st.floats(0, 200, width=32),
                  seed=st.integers(0, 2 ** 16))
def test_quantize_dequantize_any_range(lo, width, seed):
  """Any range (empty, tiny, not containing 0, huge) through one conversion with the ranges as inputs."""
  hi = np.float32(lo + width)
  x = (np.random.RandomState(seed).uniform(-1.5, 1.5, size=(16,)) * max(abs(lo), abs(hi), 1e-3)).astype(np.float32)
  args = (x, np.float32(lo), hi)
  for name, call in _any_range_calls().items():
    _assert_matches(call(*args), _tf_outputs(_ANY_RANGE_FNS[name], args), name, name.endswith("jit"))


def _any_range_fn(qtype, mode):
  def fn(x, lo, hi):
    q = R.QuantizeV2(input=x, min_range=lo, max_range=hi, T=qtype, mode=mode)
    return q.output, q.output_min, q.output_max, R.Dequantize(input=q.output, min_range=q.output_min,
                                                              max_range=q.output_max, mode=mode)
  return fn


_ANY_RANGE_FNS = {f"{qtype.name}-{mode}-{how}": _any_range_fn(qtype, mode)
                  for qtype, mode in [(tf.quint8, "MIN_COMBINED"), (tf.qint8, "SCALED"), (tf.qint16, "MIN_FIRST")]
                  for how in ("eager", "jit")}


@functools.lru_cache(maxsize=None)
def _any_range_calls():
  spec = (tf.TensorSpec([16], tf.float32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))
  calls = {}
  for name, fn in _ANY_RANGE_FNS.items():
    jax_fn, params = jaxport.convert(fn, *spec)
    call = lambda *a, jax_fn=jax_fn, params=params: jax_fn(params, *a)[0]
    calls[name] = jax.jit(call) if name.endswith("jit") else call
  return calls


@pytest.mark.parametrize("qtype,mode,axis", [(tf.quint8, "MIN_COMBINED", -1), (tf.qint8, "SCALED", 1),
                                             (tf.qint16, "MIN_FIRST", -1)], ids=str)
def test_vmap(qtype, mode, axis):
  lo = np.float32(-2.0) if axis < 0 else np.array([-2.0, -1.0, -0.5], np.float32)
  hi = np.float32(2.5) if axis < 0 else np.array([1.0, 2.0, 3.0], np.float32)

  def fn(x):
    q = R.QuantizeV2(input=x, min_range=lo, max_range=hi, T=qtype, mode=mode, axis=axis)
    return q.output, R.Dequantize(input=q.output, min_range=q.output_min, max_range=q.output_max, mode=mode,
                                  axis=axis)
  batch = np.stack([_data(20 + k, (4, 3)) for k in range(3)])
  jax_fn, params = jaxport.convert(fn, batch[0])
  got = jax.jit(jax.vmap(lambda row: jax_fn(params, row)[0]))(batch)
  expected = [np.stack(parts) for parts in zip(*[_tf_outputs(fn, (row,)) for row in batch])]
  _assert_matches(got, expected, "vmap", True)


def test_requantize_with_x64():
  """With JAX's x64 mode, the double and int64 arithmetic of the traced ranges is TF's own."""
  fn, args = CASES["requantize"]()
  expected = _tf_outputs(fn, args)
  with jax.enable_x64(True):
    _check_converted(fn, args, expected)


def test_fixed_point_requantize_extremes():
  """The two-word int64 emulation against NumPy's int64, over the whole int32 range and large scales."""
  from jaxport.convert.ops.quantization import _fixed_point_requantize
  rs = np.random.RandomState(0)
  x = np.concatenate([rs.randint(-2 ** 31, 2 ** 31, size=2000, dtype=np.int64),
                      [-2 ** 31, 2 ** 31 - 1, 0, -1, 1, 65535, -65536]]).astype(np.int32)
  for scale, offset in [(1, 0), (255 << 16, 1 << 15), (123456789012, -98765), (2 ** 40 + 17, 2 ** 33),
                        (3, -(2 ** 35)), (2 ** 61, 5)]:
    want = np.clip(((x.astype(object) * scale) >> 32) + offset >> 16, 0, 255).astype(np.uint8)
    got = np.asarray(jax.jit(lambda v: _fixed_point_requantize(v, scale, offset))(x))
    np.testing.assert_array_equal(got, want, err_msg=f"scale {scale} offset {offset}")


# --------------------------------------------------------------------------- dtypes, errors, inspect


def test_quantized_dtypes_are_their_storage_integers():
  for qtype in QTYPES:
    want = QUANTIZED_STORAGE[qtype.name]
    assert numpy_dtype(qtype) == numpy_dtype(qtype.as_datatype_enum) == numpy_dtype(qtype.name) == want
    value = tf.constant(np.arange(4).astype(want), dtype=qtype).numpy()
    assert storage_array(value).dtype == want
    np.testing.assert_array_equal(storage_array(value), np.arange(4))
  assert numpy_dtype(tf.float32) == np.float32 and numpy_dtype(tf.bfloat16) == tf.bfloat16.as_numpy_dtype


def test_quantized_constant_and_bfloat16_output():
  k = _quantized(30, (2, 3), np.int8)

  def fn(x):
    q = tf.constant(k, dtype=tf.qint8)
    return (R.Dequantize(input=q, min_range=np.float32(-1.0), max_range=x, mode="MIN_COMBINED",
                         dtype=tf.bfloat16), q)
  args = (np.float32(2.0),)
  expected = _tf_outputs(fn, args)
  assert expected[0].dtype == tf.bfloat16.as_numpy_dtype and expected[1].dtype == np.int8
  _check_converted(fn, args, expected)


def test_invalid_attributes_raise():
  x = np.zeros((2, 3), np.float32)

  def min_first_per_axis(x):
    return R.QuantizeV2(input=x, min_range=[-1.0, -1.0, -1.0], max_range=[1.0, 1.0, 1.0], T=tf.quint8,
                        mode="MIN_FIRST", axis=1).output
  with pytest.raises(Exception, match="MIN_FIRST"):
    jaxport.convert(min_first_per_axis, x)[0]({}, x)


def test_ops_are_native_in_inspect():
  for op in OPS:
    assert registry.get_rule(op) is not None and registry.get_rule(op).tier == Tier.NATIVE, op
  fn, args = CASES["requantize"]()
  report = jaxport.inspect(fn, *args)
  tiers = {row.op: row.tier for row in report.rows}
  assert {"QuantizeV2", "QuantizedMatMul", "RequantizationRange", "Requantize", "QuantizeDownAndShrinkRange",
          "Dequantize"} <= set(tiers)
  assert all(tier == Tier.NATIVE for tier in tiers.values()), tiers
  assert report.converts and not report.unsupported()


@pytest.mark.filterwarnings("ignore::jaxport.errors.DtypeCastWarning")
def test_quantized_placeholder_input():
  def fn(q):
    return R.Dequantize(input=q, min_range=np.float32(-1.0), max_range=np.float32(1.0))
  jax_fn, params = jaxport.convert(fn, tf.TensorSpec([3], tf.qint8))
  q = np.array([1, -2, 127], np.int8)
  np.testing.assert_array_equal(jax_fn(params, q)[0], _tf_outputs(fn, (tf.constant(q, tf.qint8),))[0])


@pytest.mark.filterwarnings("ignore::jaxport.convert.host_callback.HostCallbackWarning")
def test_host_callback_takes_and_gives_quantized_tensors():
  """An op without a native rule (QuantizedAdd) runs in TF through the host callback, its quantized
  operands and result passed as their storage integers."""
  k = _quantized(31, (3, 4))

  def fn(x):
    q = _q(x, -1.0, 2.0)
    return tuple(R.QuantizedAdd(x=q.output, y=tf.constant(k, tf.quint8), min_x=q.output_min, max_x=q.output_max,
                                min_y=np.float32(-0.5), max_y=np.float32(0.5)))
  args = (_data(32, (3, 4)),)
  assert {row.op: row.tier for row in jaxport.inspect(fn, *args).rows}["QuantizedAdd"] == Tier.CALLBACK
  _check_converted(fn, args, _tf_outputs(fn, args))
