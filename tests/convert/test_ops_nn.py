"""Convolutions, pooling, normalisation, softmax and losses against TF."""

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert.ops import nn
from oracle import assert_close, check

RAW = tf.raw_ops


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


def _fake_attrs(**attrs):
  def attr(key, default=...):
    value = attrs.get(key, default)
    if value is ...:
      raise KeyError(key)
    return value
  return attr


# --------------------------------------------------------------------------- convolutions

CONV2D_CASES = {
    "same": dict(x=(2, 6, 6, 3), w=(3, 3, 3, 4), strides=[1, 1, 1, 1], padding="SAME"),
    "valid_stride2_odd": dict(x=(2, 7, 7, 3), w=(3, 3, 3, 4), strides=[1, 2, 2, 1], padding="VALID"),
    "same_stride2_even_kernel": dict(x=(1, 7, 6, 2), w=(2, 4, 2, 3), strides=[1, 2, 2, 1], padding="SAME"),
    "explicit": dict(x=(2, 6, 6, 3), w=(3, 3, 3, 4), strides=[1, 2, 1, 1], padding="EXPLICIT",
                     explicit_paddings=[0, 0, 1, 2, 0, 3, 0, 0]),
    "dilated_strided": dict(x=(1, 9, 8, 2), w=(3, 2, 2, 3), strides=[1, 2, 2, 1], dilations=[1, 2, 3, 1],
                            padding="SAME"),
    "grouped": dict(x=(1, 5, 5, 4), w=(3, 3, 2, 6), strides=[1, 1, 1, 1], padding="SAME"),
    # groups == channels: the depthwise lowering (ConvNeXt's 7x7 convs)
    "grouped_depthwise": dict(x=(2, 7, 7, 4), w=(7, 7, 1, 4), strides=[1, 1, 1, 1], padding="SAME"),
    "grouped_depthwise_multiplier_stride2": dict(x=(1, 6, 7, 3), w=(3, 3, 1, 6), strides=[1, 2, 2, 1],
                                                 padding="VALID"),
    "grouped_depthwise_nchw": dict(x=(1, 4, 6, 6), w=(3, 3, 1, 4), strides=[1, 1, 1, 1], padding="SAME",
                                   data_format="NCHW"),
    "nchw": dict(x=(2, 3, 7, 6), w=(3, 3, 3, 4), strides=[1, 1, 2, 2], padding="SAME", data_format="NCHW"),
    "nchw_dilated_valid": dict(x=(1, 2, 8, 8), w=(3, 3, 2, 2), strides=[1, 1, 1, 1], dilations=[1, 1, 2, 2],
                               padding="VALID", data_format="NCHW"),
}


@pytest.mark.parametrize("case", CONV2D_CASES)
def test_conv2d(case):
  kw = dict(CONV2D_CASES[case])
  x, w = normal(*kw.pop("x")), normal(*kw.pop("w"), seed=1)
  check(lambda x, w: RAW.Conv2D(input=x, filter=w, **kw), x, w, atol=1e-4, rtol=1e-4)


def test_conv2d_integer():
  x = np.arange(2 * 5 * 5 * 2, dtype=np.int32).reshape(2, 5, 5, 2) % 7 - 3
  w = np.arange(3 * 3 * 2 * 3, dtype=np.int32).reshape(3, 3, 2, 3) % 5 - 2
  check(lambda x, w: RAW.Conv2D(input=x, filter=w, strides=[1, 2, 1, 1], padding="SAME"), x, w)


@pytest.mark.parametrize("kw", [
    dict(strides=[1, 2, 2, 2, 1], padding="SAME"),
    dict(strides=[1, 1, 1, 1, 1], dilations=[1, 1, 2, 2, 1], padding="VALID"),
    dict(strides=[1, 1, 1, 2, 1], padding="SAME", data_format="NCDHW"),
], ids=["same_stride2", "dilated_valid", "ncdhw"])
def test_conv3d(kw):
  shape = (1, 2, 5, 5, 4) if kw.get("data_format") == "NCDHW" else (1, 5, 5, 4, 2)
  x, w = normal(*shape), normal(2, 3, 2, 2, 3, seed=1)
  check(lambda x, w: RAW.Conv3D(input=x, filter=w, **kw), x, w, atol=1e-4, rtol=1e-4)


BACKPROP_CASES = {
    # input shape, kwargs; the out_backprop shape follows from the forward conv.
    "same_stride2_odd": ((2, 7, 7, 3), dict(strides=[1, 2, 2, 1], padding="SAME")),
    "valid_stride2_unused_row": ((1, 8, 7, 3), dict(strides=[1, 2, 2, 1], padding="VALID")),
    "explicit": ((1, 6, 6, 3), dict(strides=[1, 2, 1, 1], padding="EXPLICIT",
                                   explicit_paddings=[0, 0, 1, 2, 2, 0, 0, 0])),
    "dilated": ((1, 8, 8, 3), dict(strides=[1, 1, 1, 1], dilations=[1, 2, 2, 1], padding="SAME")),
    "nchw": ((2, 3, 7, 6), dict(strides=[1, 1, 2, 2], padding="SAME", data_format="NCHW")),
}


def _out_shape(x_shape, w_shape, kw, op=RAW.Conv2D):
  return tuple(op(input=tf.zeros(x_shape), filter=tf.zeros(w_shape), **kw).shape)


@pytest.mark.parametrize("case", BACKPROP_CASES)
def test_conv2d_backprop_input(case):
  x_shape, kw = BACKPROP_CASES[case]
  w_shape = (3, 3, 3, 4)
  dy = normal(*_out_shape(x_shape, w_shape, kw))
  w = normal(*w_shape, seed=1)
  check(lambda w, dy: RAW.Conv2DBackpropInput(input_sizes=list(x_shape), filter=w, out_backprop=dy, **kw),
        w, dy, atol=1e-4, rtol=1e-4)


def test_conv2d_backprop_input_spatial_sizes_only():
  w, dy = normal(3, 3, 2, 4, seed=1), normal(2, 4, 4, 4)
  check(lambda w, dy: RAW.Conv2DBackpropInput(input_sizes=[7, 8], filter=w, out_backprop=dy,
                                               strides=[1, 2, 2, 1], padding="SAME"),
        w, dy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", ["same_stride2_odd", "valid_stride2_unused_row", "nchw"])
def test_conv2d_backprop_filter(case):
  x_shape, kw = BACKPROP_CASES[case]
  w_shape = (3, 3, 3, 4)
  x, dy = normal(*x_shape), normal(*_out_shape(x_shape, w_shape, kw), seed=1)
  check(lambda x, dy: RAW.Conv2DBackpropFilter(input=x, filter_sizes=list(w_shape), out_backprop=dy, **kw),
        x, dy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kw", [dict(strides=[1, 2, 2, 2, 1], padding="SAME"),
                                dict(strides=[1, 1, 2, 1, 1], padding="VALID", data_format="NCDHW")],
                         ids=["same", "ncdhw_valid"])
def test_conv3d_backprops(kw):
  x_shape = (1, 2, 5, 5, 4) if kw.get("data_format") == "NCDHW" else (1, 5, 5, 4, 2)
  w_shape = (2, 3, 2, 2, 3)
  x, w = normal(*x_shape), normal(*w_shape, seed=1)
  dy = normal(*_out_shape(x_shape, w_shape, kw, RAW.Conv3D), seed=2)
  check(lambda w, dy: RAW.Conv3DBackpropInputV2(input_sizes=list(x_shape), filter=w, out_backprop=dy, **kw),
        w, dy, atol=1e-4, rtol=1e-4)
  check(lambda x, dy: RAW.Conv3DBackpropFilterV2(input=x, filter_sizes=list(w_shape), out_backprop=dy, **kw),
        x, dy, atol=1e-4, rtol=1e-4)


# TF's depthwise gradient kernels refuse unequal strides and ignore dilations; those cases
# check gradients against the grouped lowering (plain lax convolution) instead.
TF_DEPTHWISE_GRAD_WRONG = {"explicit_unequal_strides", "dilated_strided"}
DEPTHWISE_CASES = {
    "same": dict(x=(2, 6, 6, 3), w=(3, 3, 3, 1), strides=[1, 1, 1, 1], padding="SAME"),
    "multiplier_valid_stride2": dict(x=(1, 7, 7, 2), w=(3, 3, 2, 3), strides=[1, 2, 2, 1], padding="VALID"),
    "explicit": dict(x=(1, 6, 5, 3), w=(3, 2, 3, 2), strides=[1, 2, 2, 1], padding="EXPLICIT",
                     explicit_paddings=[0, 0, 1, 2, 0, 3, 0, 0]),
    "explicit_unequal_strides": dict(x=(1, 6, 5, 3), w=(3, 2, 3, 2), strides=[1, 1, 2, 1], padding="EXPLICIT",
                                     explicit_paddings=[0, 0, 2, 0, 1, 1, 0, 0]),
    "dilated_strided": dict(x=(1, 9, 9, 2), w=(3, 3, 2, 2), strides=[1, 2, 2, 1], dilations=[1, 2, 2, 1],
                            padding="SAME"),
    "nchw": dict(x=(2, 3, 6, 7), w=(3, 3, 3, 2), strides=[1, 1, 2, 2], padding="SAME", data_format="NCHW"),
}


@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_depthwise_conv2d(case):
  kw = dict(DEPTHWISE_CASES[case])
  x, w = normal(*kw.pop("x")), normal(*kw.pop("w"), seed=1)
  check(lambda x, w: RAW.DepthwiseConv2dNative(input=x, filter=w, **kw), x, w, atol=1e-4, rtol=1e-4,
        grad=case not in TF_DEPTHWISE_GRAD_WRONG)


@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_depthwise_lowerings_agree(case):
  # On CPU the rule runs the shifted lowering; the grouped one (other backends) must agree
  # with it and with TF, gradients included.
  kw = dict(DEPTHWISE_CASES[case])
  x, w = normal(*kw.pop("x")), normal(*kw.pop("w"), seed=1)
  spec = nn._ConvSpec(_fake_attrs(**kw), 2)
  expected = tf.function(lambda x, w: RAW.DepthwiseConv2dNative(input=x, filter=w, **kw))(x, w)
  weights = normal(*expected.shape, seed=2)
  results = []
  for lowering in (nn._depthwise_shifted, nn._depthwise_grouped):
    loss = lambda x, w: (lowering(x, w, spec) * weights).sum()  # noqa: E731
    results.append((jax.jit(lowering, static_argnums=2)(x, w, spec), jax.grad(loss, argnums=(0, 1))(x, w)))
  (shifted, shifted_grads), (grouped, grouped_grads) = results
  np.testing.assert_allclose(shifted, expected, atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(grouped, expected, atol=1e-4, rtol=1e-4)
  for a, b in zip(shifted_grads, grouped_grads):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(size=st.integers(3, 8), kernel=st.integers(1, 4), stride=st.integers(1, 3),
                  dilation=st.integers(1, 2), multiplier=st.integers(1, 2),
                  padding=st.sampled_from(["SAME", "VALID"]))
def test_depthwise_shifted_matches_tf(size, kernel, stride, dilation, multiplier, padding):
  hypothesis.assume((kernel - 1) * dilation + 1 <= size)
  x, w = normal(1, size, size + 1, 2), normal(kernel, kernel, 2, multiplier, seed=1)
  kw = dict(strides=[1, stride, stride, 1], dilations=[1, dilation, dilation, 1], padding=padding)
  try:
    expected = RAW.DepthwiseConv2dNative(input=x, filter=w, **kw)
  except tf.errors.InvalidArgumentError:   # TF's CPU kernel refuses strides > 1 with dilations > 1
    hypothesis.assume(False)
  spec = nn._ConvSpec(_fake_attrs(**kw), 2)
  np.testing.assert_allclose(nn._depthwise_shifted(x, w, spec), expected, atol=1e-4, rtol=1e-4)


def test_depthwise_half_precision():
  x, w = normal(1, 5, 5, 4, dtype=np.float16), normal(3, 3, 4, 1, seed=1, dtype=np.float16)
  check(lambda x, w: RAW.DepthwiseConv2dNative(input=x, filter=w, strides=[1, 1, 1, 1], padding="SAME"),
        x, w, atol=2e-2, rtol=2e-2, grad=False)


# --------------------------------------------------------------------------- pooling

POOL_CASES = {
    "same_odd": dict(x=(2, 7, 7, 3), ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME"),
    "valid": dict(x=(2, 6, 7, 2), ksize=[1, 2, 3, 1], strides=[1, 2, 2, 1], padding="VALID"),
    "same_overlap": dict(x=(1, 5, 6, 2), ksize=[1, 3, 2, 1], strides=[1, 1, 1, 1], padding="SAME"),
    "nchw": dict(x=(2, 3, 7, 6), ksize=[1, 1, 3, 2], strides=[1, 1, 2, 2], padding="SAME", data_format="NCHW"),
}


@pytest.mark.parametrize("case", POOL_CASES)
@pytest.mark.parametrize("op", ["MaxPool", "AvgPool"])
def test_pool2d(op, case):
  kw = dict(POOL_CASES[case])
  x = normal(*kw.pop("x"))
  arg = "input" if op == "MaxPool" else "value"
  tf_has_grad = not (op == "MaxPool" and kw.get("data_format") == "NCHW")   # MaxPoolGrad is NHWC-only on CPU
  check(lambda x: getattr(RAW, op)(**{arg: x}, **kw), x, grad=tf_has_grad)


def test_max_pool_explicit_padding_and_v2():
  x = normal(2, 6, 6, 3)
  check(lambda x: RAW.MaxPool(input=x, ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="EXPLICIT",
                              explicit_paddings=[0, 0, 1, 1, 2, 0, 0, 0]), x)
  check(lambda x: RAW.MaxPoolV2(input=x, ksize=[1, 3, 2, 1], strides=[1, 2, 2, 1], padding="SAME"), x)


def test_max_pool_integer():
  x = (np.arange(2 * 5 * 5 * 2, dtype=np.int32) * 7919 % 23).reshape(2, 5, 5, 2) - 11
  check(lambda x: RAW.MaxPool(input=x, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME"), x)


@pytest.mark.parametrize("op", ["MaxPool3D", "AvgPool3D"])
@pytest.mark.parametrize("kw", [
    dict(ksize=[1, 2, 3, 2, 1], strides=[1, 2, 2, 1, 1], padding="SAME"),
    dict(ksize=[1, 1, 2, 2, 2], strides=[1, 1, 1, 2, 2], padding="VALID", data_format="NCDHW"),
], ids=["same", "ncdhw_valid"])
def test_pool3d(op, kw):
  x = normal(*((1, 2, 5, 5, 4) if kw.get("data_format") == "NCDHW" else (1, 5, 5, 4, 2)))
  tf_has_grad = not (op == "MaxPool3D" and kw.get("data_format") == "NCDHW")
  check(lambda x: getattr(RAW, op)(input=x, **kw), x, grad=tf_has_grad)


@hypothesis.settings(max_examples=20, deadline=None)
@hypothesis.given(size=st.integers(1, 7), kernel=st.integers(1, 4), stride=st.integers(1, 4))
def test_avg_pool_same_divides_by_valid_count(size, kernel, stride):
  x = normal(1, size, size + 2, 1)
  kw = dict(ksize=[1, kernel, kernel, 1], strides=[1, stride, stride, 1], padding="SAME")
  jax_fn, params = jaxport.convert(lambda x: RAW.AvgPool(value=x, **kw), x)
  assert_close(jax_fn(params, x)[0], RAW.AvgPool(value=x, **kw), 1e-5, 1e-5)


@pytest.mark.parametrize("op", ["MaxPool", "AvgPool"])
def test_pool_with_ties_matches_tf_gradient_in_every_form(op):
  # Pool values come from the window's strided slices on CPU; derivatives stay reduce_window's: a max's
  # gradient goes to one of tied maxima, as TF's does, under jit, grad, jvp and vmap.
  x = np.round(normal(2, 8, 9, 3) * 2) / 2   # many ties
  kw = dict(ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME")
  arg = "input" if op == "MaxPool" else "value"
  jax_fn = check(lambda x: getattr(RAW, op)(**{arg: x}, **kw), x)
  hlo = jax.jit(lambda x: jax_fn({}, x)[0]).lower(x).as_text()
  assert "reduce_window" not in hlo and "slice" in hlo
  grad_hlo = jax.jit(jax.grad(lambda x: jax_fn({}, x)[0].sum())).lower(x).as_text()
  assert ("select_and_scatter" if op == "MaxPool" else "reduce_window") in grad_hlo


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(shape=st.lists(st.integers(1, 6), min_size=3, max_size=5), data=st.data(),
                  kind=st.sampled_from(["max", "sum"]))
def test_pool_by_taps_equals_reduce_window(shape, data, kind):
  window = [data.draw(st.integers(1, min(3, n + 1))) for n in shape]
  strides = [data.draw(st.integers(1, 3)) for _ in shape]
  pads = [(data.draw(st.integers(0, k - 1)), data.draw(st.integers(0, k - 1))) for k in window]
  hypothesis.assume(all(n + lo + hi >= k for n, k, (lo, hi) in zip(shape, window, pads)))
  x = np.round(normal(*shape) * 2) / 2
  plain = lambda x: nn._reduce_window(x, kind, window, strides, pads)
  taps = lambda x: nn._pool_by_taps(x, kind=kind, window=window, strides=strides, pads=[list(p) for p in pads])
  np.testing.assert_allclose(jax.jit(taps)(x), plain(x), rtol=1e-6, atol=1e-6)
  dx = normal(*shape, seed=1)
  np.testing.assert_array_equal(jax.jvp(taps, (x,), (dx,))[1], jax.jvp(plain, (x,), (dx,))[1])
  ct = normal(*jax.eval_shape(plain, x).shape, seed=2)
  np.testing.assert_array_equal(jax.vjp(taps, x)[1](ct)[0], jax.vjp(plain, x)[1](ct)[0])


# --------------------------------------------------------------------------- normalisation


def _bn_inputs(shape, channel_axis=-1, dtype=np.float32):
  c = shape[channel_axis]
  x = normal(*shape, dtype=dtype) * 2 + 0.5
  return (x.astype(dtype), normal(c, seed=1) + 1, normal(c, seed=2), normal(c, seed=3),
          np.abs(normal(c, seed=4)) + 0.5)


@pytest.mark.parametrize("op", ["FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"])
def test_fused_batch_norm_inference(op):
  # The reserve-space outputs are not defined by TF's CPU kernel in inference mode.
  def fn(x, scale, offset, mean, variance):
    return getattr(RAW, op)(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                            epsilon=1e-3, is_training=False)[:3]
  check(fn, *_bn_inputs((2, 3, 4, 3)), atol=1e-4, rtol=1e-4)


# reserve_space_3 (V3's sixth output) is an opaque placeholder whose shape differs between
# TF's kernels; it is not compared.
@pytest.mark.parametrize("factor", [1.0, 0.25])
@pytest.mark.parametrize("op", ["FusedBatchNorm", "FusedBatchNormV3"])
def test_fused_batch_norm_training(op, factor):
  kw = dict(exponential_avg_factor=factor) if op == "FusedBatchNormV3" else {}

  def fn(x, scale, offset, mean, variance):
    return getattr(RAW, op)(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                            epsilon=1e-3, is_training=True, **kw)[:5]
  check(fn, *_bn_inputs((2, 3, 4, 3)), atol=1e-4, rtol=1e-4)


def test_fused_batch_norm_training_nchw_half():
  def fn(x, scale, offset, mean, variance):
    return RAW.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=mean, variance=variance,
                                exponential_avg_factor=0.5, data_format="NCHW", is_training=True)[:5]
  inputs = _bn_inputs((2, 3, 4, 5), channel_axis=1, dtype=np.float16)
  check(fn, *inputs, atol=1e-2, rtol=1e-2, grad=False)


def test_fused_batch_norm_training_ndhwc_with_empty_statistics():
  def fn(x, scale, offset):
    empty = tf.zeros([0])
    return RAW.FusedBatchNormV3(x=x, scale=scale, offset=offset, mean=empty, variance=empty,
                                data_format="NDHWC", is_training=True)[:5]
  x, scale, offset, _, _ = _bn_inputs((2, 2, 3, 2, 4))
  check(fn, x, scale, offset, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kw", [{}, dict(depth_radius=2, bias=2.0, alpha=0.5, beta=0.75)],
                         ids=["default", "custom"])
def test_lrn(kw):
  check(lambda x: RAW.LRN(input=x, **kw), normal(2, 3, 3, 7), atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- bias, softmax, losses


@pytest.mark.parametrize("shape,data_format", [((4, 3), "NHWC"), ((2, 3, 4, 5), "NHWC"), ((2, 3, 4), "NCHW"),
                                               ((2, 3, 4, 5), "NCHW"), ((1, 3, 2, 2, 2), "NCHW")])
def test_bias_add(shape, data_format):
  channels = shape[-1] if data_format == "NHWC" else shape[1]
  check(lambda x, b: RAW.BiasAdd(value=x, bias=b, data_format=data_format),
        normal(*shape), normal(channels, seed=1))


def test_bias_add_v1():
  check(lambda x, b: RAW.BiasAddV1(value=x, bias=b), normal(2, 3, 4), normal(4, seed=1))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op):
  check(lambda x: getattr(RAW, op)(logits=x), normal(2, 3, 5) * 3)


def test_softmax_cross_entropy_unnormalised_labels_and_broadcast():
  # Labels that do not sum to 1 expose TF's gradient convention (d loss/d logits = backprop).
  logits, labels = normal(4, 5) * 2, np.abs(normal(4, 5, seed=1))
  check(lambda f, l: RAW.SoftmaxCrossEntropyWithLogits(features=f, labels=l), logits, labels)
  # TF's own gradient fails for broadcast labels: forward only.
  check(lambda f, l: RAW.SoftmaxCrossEntropyWithLogits(features=f, labels=l), logits, labels[:1], grad=False,
        vmap=False)


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64])
def test_sparse_softmax_cross_entropy(label_dtype):
  logits, labels = normal(4, 5) * 2, np.array([0, 4, 2, 2], label_dtype)
  check(lambda f, l: RAW.SparseSoftmaxCrossEntropyWithLogits(features=f, labels=l), logits, labels)


def test_sparse_softmax_cross_entropy_invalid_label_is_nan():
  logits = normal(3, 4)
  jax_fn, params = jaxport.convert(
      lambda f, l: RAW.SparseSoftmaxCrossEntropyWithLogits(features=f, labels=l), logits, np.zeros(3, np.int32))
  loss, backprop = jax.jit(lambda f, l: jax_fn(params, f, l)[0])(logits, np.array([1, 4, -1], np.int32))
  assert np.isfinite(loss[0]) and np.isnan(loss[1:]).all()
  assert np.isfinite(backprop[0]).all() and np.isnan(backprop[1:]).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_l2_loss(dtype):
  check(lambda x: RAW.L2Loss(t=x), normal(3, 4, dtype=dtype), atol=1e-2 if dtype == np.float16 else 1e-5,
        rtol=1e-3 if dtype == np.float16 else 1e-5, grad=dtype == np.float32)


# --------------------------------------------------------------------------- gradient ops (training steps)


@pytest.mark.parametrize("shape,data_format", [((2, 3, 4, 5), "NHWC"), ((2, 3, 4), "NCHW"), ((4, 3), "NHWC")])
def test_bias_add_grad(shape, data_format):
  check(lambda g: RAW.BiasAddGrad(out_backprop=g, data_format=data_format), normal(*shape))


# TF's MaxPoolGrad is NHWC-only on CPU.
@pytest.mark.parametrize("op,case", [("MaxPool", "same_odd"), ("MaxPool", "valid"),
                                     ("AvgPool", "same_odd"), ("AvgPool", "valid"), ("AvgPool", "nchw")])
def test_pool_grad(op, case):
  kw = dict(POOL_CASES[case])
  x = normal(*kw.pop("x"))
  dy = normal(*RAW.MaxPool(input=x, **kw).shape, seed=1)
  def fn(x, dy):
    if op == "MaxPool":
      return RAW.MaxPoolGrad(orig_input=x, orig_output=RAW.MaxPool(input=x, **kw), grad=dy, **kw)
    return RAW.AvgPoolGrad(orig_input_shape=tf.shape(x), grad=dy, **kw)
  check(fn, x, dy)


def test_max_pool_grad_v2_and_3d():
  x = normal(1, 5, 6, 2)
  kw = dict(ksize=[1, 3, 2, 1], strides=[1, 2, 2, 1], padding="SAME")
  dy = normal(*RAW.MaxPool(input=x, **kw).shape, seed=1)
  check(lambda x, dy: RAW.MaxPoolGradV2(orig_input=x, orig_output=RAW.MaxPool(input=x, **kw), grad=dy, **kw),
        x, dy)
  x3 = normal(1, 4, 5, 4, 2)
  kw3 = dict(ksize=[1, 2, 3, 2, 1], strides=[1, 2, 2, 1, 1], padding="SAME")
  dy3 = normal(*RAW.MaxPool3D(input=x3, **kw3).shape, seed=1)
  check(lambda x, dy: RAW.MaxPool3DGrad(orig_input=x, orig_output=RAW.MaxPool3D(input=x, **kw3), grad=dy,
                                         **kw3), x3, dy3)
  check(lambda x, dy: RAW.AvgPool3DGrad(orig_input_shape=tf.shape(x), grad=dy, **kw3), x3, dy3)


@pytest.mark.parametrize("case", ["same", "multiplier_valid_stride2", "explicit"])
def test_depthwise_backprops(case):
  kw = dict(DEPTHWISE_CASES[case])
  x_shape, w_shape = kw.pop("x"), kw.pop("w")
  x, w = normal(*x_shape), normal(*w_shape, seed=1)
  dy = normal(*RAW.DepthwiseConv2dNative(input=x, filter=w, **kw).shape, seed=2)
  check(lambda w, dy: RAW.DepthwiseConv2dNativeBackpropInput(input_sizes=list(x_shape), filter=w,
                                                             out_backprop=dy, **kw),
        w, dy, atol=1e-4, rtol=1e-4)
  check(lambda x, dy: RAW.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=list(w_shape),
                                                              out_backprop=dy, **kw),
        x, dy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("is_training", [True, False])
@pytest.mark.parametrize("op", ["FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"])
def test_fused_batch_norm_grad(op, is_training):
  forward = op.replace("Grad", "")

  def fn(dy, x, scale, mean, variance):
    outs = getattr(RAW, forward)(x=x, scale=scale, offset=tf.zeros_like(scale), mean=mean, variance=variance,
                                 epsilon=1e-3, is_training=is_training)
    # TF's own gradient passes the batch statistics in training, the population ones otherwise.
    reserve = list(outs[3:]) if is_training else [mean, variance] + list(outs[5:])
    extra = {"reserve_space_3": reserve[2]} if op.endswith("V3") else {}
    return getattr(RAW, op)(y_backprop=dy, x=x, scale=scale, reserve_space_1=reserve[0],
                            reserve_space_2=reserve[1], epsilon=1e-3, is_training=is_training, **extra)[:3]
  x, scale, _, mean, variance = _bn_inputs((2, 3, 4, 3))
  check(fn, normal(*x.shape, seed=9), x, scale, mean, variance, atol=1e-4, rtol=1e-4, grad=False)


def test_gradient_of_fused_batch_norm_v2_is_fused_batch_norm_grad_v2():
  x, scale, offset, _, _ = _bn_inputs((2, 3, 4, 3))
  dy = normal(*x.shape, seed=9)

  def fn(x, scale, offset):
    with tf.GradientTape() as tape:
      tape.watch([x, scale, offset])
      y = RAW.FusedBatchNormV2(x=x, scale=scale, offset=offset, mean=tf.constant([], tf.float32),
                               variance=tf.constant([], tf.float32), epsilon=1e-3, is_training=True)[0]
      loss = tf.reduce_sum(y * dy)
    return tape.gradient(loss, [x, scale, offset])

  graph = tf.function(fn).get_concrete_function(x, scale, offset).graph
  assert "FusedBatchNormGradV2" in {op.type for op in graph.get_operations()}
  check(fn, x, scale, offset, atol=1e-4, rtol=1e-4, grad=False, vmap=False)


def test_lrn_grad():
  x, dy = normal(2, 3, 3, 7), normal(2, 3, 3, 7, seed=1)
  kw = dict(depth_radius=2, bias=2.0, alpha=0.5, beta=0.75)
  check(lambda dy, x: RAW.LRNGrad(input_grads=dy, input_image=x, output_image=RAW.LRN(input=x, **kw), **kw),
        dy, x, atol=1e-4, rtol=1e-4, grad=False)


def test_resource_gather_from_variable():
  table = tf.Variable(normal(5, 3), name="table")
  fn = lambda i: tf.gather(table, i)   # a gather from a resource variable reads with ResourceGather
  graph = tf.function(fn).get_concrete_function(np.array([4, 0, 4])).graph.as_graph_def()
  assert "ResourceGather" in {n.op for n in graph.node}
  jax_fn, params = jaxport.convert(fn, np.array([4, 0, 4]))
  np.testing.assert_allclose(jax.jit(jax_fn)(params, np.array([4, 0, 4]))[0], table.numpy()[[4, 0, 4]])


@pytest.mark.parametrize("data_format,strides", [("NHWC", [1, 1, 1, 1]), ("NHWC", [1, 2, 2, 1]),
                                                 ("NCHW", [1, 1, 2, 2])])
def test_pointwise_conv_lowers_to_a_dot(data_format, strides):
  shape = (2, 5, 7, 6) if data_format == "NHWC" else (2, 6, 5, 7)
  x, w = normal(*shape), normal(1, 1, 6, 4, seed=1)
  fn = lambda x, w: RAW.Conv2D(input=x, filter=w, strides=strides, padding="SAME", data_format=data_format)
  jax_fn = check(fn, x, w, atol=1e-4, rtol=1e-4)
  hlo = jax.jit(lambda a, b: jax_fn({}, a, b)[0]).lower(x, w).as_text()
  assert "dot_general" in hlo and "convolution" not in hlo
