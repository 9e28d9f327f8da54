"""Conv2D's CPU lowerings (im2col, shifted GEMMs, Winograd) against TF and `lax.conv_general_dilated`."""
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from jax import lax

import jaxport
from jaxport import xla_options
from jaxport.convert.ops import conv_lowering as cl
from jaxport.convert.ops import nn
from oracle import check

RAW = tf.raw_ops
GEMM_LOWERINGS = ["shifted", "im2col", "base_dilated"]
WINOGRAD_LOWERINGS = ["winograd2", "winograd4"]


def normal(*shape, seed=0):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _spec(**attrs):
  return nn._ConvSpec(lambda name, default=None: attrs.get(name, default), 2)


def _lax_conv(x, w, spec):
  pads = spec.pads([x.shape[i] for i in spec.spatial], w.shape[:2])
  return lax.conv_general_dilated(x, w, spec.strides, pads, rhs_dilation=spec.dilations,
                                  dimension_numbers=spec.dimension_numbers(),
                                  precision=lax.Precision.HIGHEST)


@pytest.fixture
def force(monkeypatch):
  """Makes Conv2D pick the named lowering on CPU for every shape."""
  def use(name):
    monkeypatch.setattr(cl, "choose_cpu_lowering", lambda *_: cl.LOWERINGS[name])
  return use


# --------------------------------------------------------------------------- each lowering vs TF, via Conv2D

CASES = {
    # name: (x shape, w shape, Conv2D attrs, lowering forced); TF has no NCHW EXPLICIT gradient on CPU.
    "winograd_same_odd": ((2, 7, 5, 3), (3, 3, 3, 4), dict(strides=[1, 1, 1, 1], padding="SAME"), "winograd2"),
    "winograd_explicit_batch1": ((1, 6, 9, 2), (3, 3, 2, 3), dict(strides=[1, 1, 1, 1], padding="EXPLICIT",
                                 explicit_paddings=[0, 0, 2, 0, 1, 3, 0, 0]), "winograd2"),
    "winograd_valid_nchw": ((2, 3, 6, 5), (3, 3, 3, 2),
                            dict(strides=[1, 1, 1, 1], padding="VALID", data_format="NCHW"), "winograd2"),
    "shifted_stride2_even_kernel": ((1, 7, 6, 2), (2, 4, 2, 3), dict(strides=[1, 2, 2, 1], padding="SAME"),
                                    "shifted"),
    "im2col_dilated_nchw": ((1, 2, 9, 8), (3, 2, 2, 3), dict(strides=[1, 1, 2, 1], dilations=[1, 1, 2, 3],
                            padding="SAME", data_format="NCHW"), "im2col"),
}
PAIRS = [(case, name) for case, (*_, name) in CASES.items()]


@pytest.mark.slow
@pytest.mark.parametrize("case,name", PAIRS)
def test_lowering_matches_tf(force, case, name):
  x_shape, w_shape, kw, _ = CASES[case]
  force(name)
  x, w = normal(*x_shape), normal(*w_shape, seed=1)
  jax_fn = check(lambda x, w: RAW.Conv2D(input=x, filter=w, **kw), x, w, atol=1e-4, rtol=1e-4)
  hlo = jax.jit(lambda a, b: jax_fn({}, a, b)[0]).lower(x, w).as_text()
  assert "convolution" not in hlo


@pytest.mark.slow
@pytest.mark.parametrize("name", ["winograd2"])
def test_backprop_ops_through_lowering(force, name):
  # Conv2DBackpropInput/Filter transpose `_conv`, so they run the transposed lowering.
  force(name)
  kw = dict(strides=[1, 1, 1, 1], padding="SAME")
  x_shape, w_shape, dy = (2, 5, 6, 3), (3, 3, 3, 4), normal(2, 5, 6, 4, seed=2)
  check(lambda w, dy: RAW.Conv2DBackpropInput(input_sizes=list(x_shape), filter=w, out_backprop=dy, **kw),
        normal(*w_shape, seed=1), dy, atol=1e-4, rtol=1e-4, vmap=False)
  check(lambda x, dy: RAW.Conv2DBackpropFilter(input=x, filter_sizes=list(w_shape), out_backprop=dy, **kw),
        normal(*x_shape), dy, atol=1e-4, rtol=1e-4, vmap=False)


# --------------------------------------------------------------------------- dispatch


def test_dispatch_picks_by_shape():
  same = lambda s: _spec(strides=[1, s, s, 1], padding="SAME")

  def choose(x, w, spec=same(1), dtype=np.float32):
    with xla_options.tracing_without_ynn():   # Winograd is for XLA's own kernels
      return cl.choose_cpu_lowering(jax.ShapeDtypeStruct(x, dtype), jax.ShapeDtypeStruct(w, dtype), spec)
  assert choose((2, 56, 56, 64), (3, 3, 64, 64)) is cl.conv_winograd
  # Under YNNPACK (a plain jax.jit) the base-dilated conv beats Winograd.
  assert cl.choose_cpu_lowering(np.zeros((2, 56, 56, 64), np.float32), np.zeros((3, 3, 64, 64), np.float32),
                                same(1)) is None
  assert choose((2, 56, 56, 64), (3, 3, 64, 64), dtype=np.int32) is None
  assert choose((2, 56, 56, 64), (3, 3, 64, 64), dtype=np.float16) is None
  assert choose((2, 7, 7, 512), (3, 3, 512, 512)) is not cl.conv_winograd
  dilated = _spec(strides=[1, 1, 1, 1], dilations=[1, 2, 2, 1], padding="SAME")
  assert choose((2, 56, 56, 64), (3, 3, 64, 64), dilated) is not cl.conv_winograd
  assert choose((2, 56, 56, 64), (3, 3, 64, 64, 2), same(1)) is None  # not 2-D


@pytest.mark.slow
def test_dispatch_real_shape_matches_tf():
  # Big enough to take the Winograd path without forcing it; NCHW; bias and relu around it.
  x, w = normal(1, 64, 16, 16), normal(3, 3, 64, 8, seed=1) / 20
  spec = _spec(strides=[1, 1, 1, 1], padding="SAME", data_format="NCHW")
  with xla_options.tracing_without_ynn():
    assert cl.choose_cpu_lowering(x, w, spec) is cl.conv_winograd
  fn = lambda x, w: tf.nn.relu(RAW.Conv2D(input=x, filter=w, strides=[1, 1, 1, 1], padding="SAME",
                                          data_format="NCHW") + 1.0)
  jax_fn = check(fn, x, w, atol=1e-4, rtol=1e-4)   # plain jax.jit: the base-dilated conv
  assert "lhs_dilate" in jax.jit(jax_fn).lower({}, x, w).compile().as_text()
  ours = jaxport.jit(jax_fn)
  assert "gather" in ours.lower({}, x, w).as_text()   # YNNPACK off: Winograd
  np.testing.assert_allclose(ours({}, x, w)[0], fn(x, w), atol=1e-4, rtol=1e-4)


CALL_FORMS = {
    "plain jax.jit": lambda f: jax.jit(f),
    "jaxport.jit": lambda f: jaxport.jit(f),
    "eager": lambda f: f,
}


@pytest.mark.parametrize("form", CALL_FORMS)
def test_base_dilated_values_with_plain_conv_derivatives(form):
  # A 5x5 conv (no Winograd) of 16+ channels: under YNNPACK its values come from the base-dilated conv,
  # its tangents and gradients from XLA's plain conv and the filter taps, in every call form.
  kw = dict(strides=[1, 2, 1, 1], padding="SAME")
  f = tf.function(lambda x, w: tf.nn.relu(RAW.Conv2D(input=x, filter=w, **kw)))
  x, w = normal(2, 9, 8, 16), normal(5, 5, 16, 4, seed=1) / 10
  jax_fn, params = jaxport.convert(f, x, w)
  run = CALL_FORMS[form](lambda x, w: jax_fn(params, x, w)[0])
  np.testing.assert_allclose(run(x, w), f(x, w), atol=1e-5, rtol=1e-5)
  plain = jax.jit(lambda x, w: jax_fn(params, x, w)[0])
  hlo = plain.lower(x, w).compile().as_text()
  assert "lhs_dilate=2x2" in hlo
  grad_hlo = jax.jit(jax.grad(lambda x, w: plain(x, w).sum(), (0, 1))).lower(x, w).compile().as_text()
  assert "lhs_dilate=2x2" in grad_hlo   # the forward ...
  assert grad_hlo.count("lhs_dilate=2x2") == hlo.count("lhs_dilate=2x2")   # ... only
  with tf.GradientTape() as tape:
    xv, wv = tf.constant(x), tf.constant(w)
    tape.watch([xv, wv])
    loss = tf.reduce_sum(f(xv, wv) * np.arange(2 * 5 * 8 * 4).reshape(2, 5, 8, 4) / 100)
  expected = tape.gradient(loss, [xv, wv])
  weights = np.arange(2 * 5 * 8 * 4).reshape(2, 5, 8, 4) / 100
  got = jax.grad(lambda x, w: (run(x, w) * weights).sum(), (0, 1))(x, w)
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, atol=1e-4, rtol=1e-4)
  dx, dw = normal(*x.shape, seed=3), normal(*w.shape, seed=4)
  _, tangent = jax.jvp(run, (x, w), (dx, dw))
  _, expected_tangent = jax.jvp(lambda x, w: jax.nn.relu(_lax_conv(x, w, _spec(**kw))), (x, w), (dx, dw))
  np.testing.assert_allclose(tangent, expected_tangent, atol=1e-4, rtol=1e-4)
  batched = jax.vmap(run, in_axes=(0, None))(np.stack([x, 2 * x]), w)
  np.testing.assert_allclose(batched[1], f(2 * x, w), atol=1e-5, rtol=1e-5)


def test_small_or_wide_convs_keep_the_plain_conv():
  pays = cl.base_dilation_pays
  assert pays(np.float32, 16, 35 * 35 * 16) and pays(np.float32, 80, 73 * 73 * 80)
  assert not pays(np.float32, 3, 224 * 224 * 3)            # a stem: XLA's conv is faster
  assert not pays(np.float32, 64, 224 * 224 * 64)          # wide inputs: YNNPACK's conv is faster
  assert not pays(np.float16, 64, 35 * 35 * 64)
  with xla_options.tracing_without_ynn():
    assert not pays(np.float32, 80, 73 * 73 * 80)           # jaxport.jit: XLA's kernel takes the plain conv


# --------------------------------------------------------------------------- direct, vs lax


@pytest.mark.slow
@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(
    name=st.sampled_from(GEMM_LOWERINGS + WINOGRAD_LOWERINGS),
    n=st.integers(1, 2), h=st.integers(1, 9), w=st.integers(1, 9), cin=st.integers(1, 4),
    cout=st.integers(1, 4), kh=st.integers(1, 3), kw=st.integers(1, 3), stride=st.integers(1, 2),
    dilation=st.integers(1, 2), padding=st.sampled_from(["SAME", "VALID"]),
    nchw=st.booleans())
def test_lowering_matches_lax(name, n, h, w, cin, cout, kh, kw, stride, dilation, padding, nchw):
  if name.startswith("winograd"):
    kh = kw = 3
    stride = dilation = 1
  if padding == "VALID" and (h < (kh - 1) * dilation + 1 or w < (kw - 1) * dilation + 1):
    padding = "SAME"
  fmt = "NCHW" if nchw else "NHWC"
  spec = _spec(strides=[1, 1, stride, stride] if nchw else [1, stride, stride, 1], padding=padding,
               dilations=[1, 1, dilation, dilation] if nchw else [1, dilation, dilation, 1], data_format=fmt)
  x = normal(n, cin, h, w) if nchw else normal(n, h, w, cin)
  k = normal(kh, kw, cin, cout, seed=1)
  expected = _lax_conv(x, k, spec)
  actual = jax.jit(lambda x, k: cl.LOWERINGS[name](x, k, spec))(x, k)
  np.testing.assert_allclose(actual, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@hypothesis.settings(max_examples=10, deadline=None)
@hypothesis.given(n=st.integers(1, 2), h=st.integers(1, 9), w=st.integers(1, 9), cin=st.integers(1, 5),
                  cout=st.integers(1, 4), padding=st.sampled_from(["SAME", "VALID"]), nchw=st.booleans(),
                  special=st.sampled_from([None, np.inf, np.nan]))
def test_winograd_gathered_values_and_sliced_derivatives(n, h, w, cin, cout, padding, nchw, special):
  # The Winograd conv's values come from constant-index gathers (cheaper to compile), its derivatives from
  # the strided-slice form: both equal to the sliced form's own, infs and NaNs included.
  if padding == "VALID" and min(h, w) < 3:
    padding = "SAME"
  spec = _spec(strides=[1, 1, 1, 1], padding=padding, data_format="NCHW" if nchw else "NHWC")
  x = normal(n, cin, h, w) if nchw else normal(n, h, w, cin)
  if special is not None:
    x.flat[len(x.flat) // 2] = special
  k = normal(3, 3, cin, cout, seed=1)

  def sliced(x, k):
    padded, (oh, ow) = cl._padded_nhwc(x, k, spec)
    padded = jnp.pad(padded, [(0, 0), (0, -(-oh // 2) * 2 + 2 - padded.shape[1]),
                              (0, -(-ow // 2) * 2 + 2 - padded.shape[2]), (0, 0)])
    return cl._from_nhwc(cl._winograd_sliced(padded, k, 2)[:, :oh, :ow], spec)

  winograd = lambda x, k: cl.conv_winograd(x, k, spec)
  # XLA may contract a product and a sum differently in the two forms (a 1-channel case differed by an ulp).
  close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
  close(jax.jit(winograd)(x, k), jax.jit(sliced)(x, k))
  close(jax.jit(jax.vmap(winograd))(x[None], k[None])[0], jax.jit(sliced)(x, k))
  tangents = (normal(*x.shape, seed=2), normal(*k.shape, seed=3))
  jvp = lambda f: jax.jit(lambda x, k, dx, dk: jax.jvp(f, (x, k), (dx, dk)))
  for got, want in zip(jvp(winograd)(x, k, *tangents), jvp(sliced)(x, k, *tangents)):
    close(got, want)
  loss = lambda f: lambda x, k: (jnp.nan_to_num(f(x, k)) ** 2).sum()
  grads = lambda f, argnums: jax.jit(jax.grad(loss(f), argnums))(x, k)
  for got, want in zip(grads(winograd, (0, 1)), grads(sliced, (0, 1))):
    close(got, want)
  close(grads(winograd, 1), grads(sliced, 1))   # a symbolic zero tangent for x


def test_winograd_compiles_gathers_forward_and_no_scatter_backward():
  # Forward: the tiles and both transforms are gathers, not 16 strided slices (one XLA:CPU fusion per
  # slice, ~20 ms of compile each); backward: pads and slices (a gather's transpose, scatter-add, runs
  # serially on XLA:CPU).
  spec = _spec(strides=[1, 1, 1, 1], padding="SAME")
  x, k = normal(2, 16, 16, 64), normal(3, 3, 64, 8, seed=1)
  forward = jax.jit(lambda x, k: cl.conv_winograd(x, k, spec)).lower(x, k).as_text()
  assert forward.count("stablehlo.gather") >= 6 and forward.count("stablehlo.slice") <= 1, forward
  backward = jax.jit(jax.grad(lambda x, k: (cl.conv_winograd(x, k, spec) ** 2).sum(), (0, 1))).lower(x, k)
  assert "scatter" not in backward.as_text() and backward.as_text().count("stablehlo.slice") >= 16


def test_winograd4_float32_error_bound():
  # F(4x4, 3x3)'s transforms amplify rounding; at realistic magnitudes (unit-variance activations,
  # He-scaled weights, 256 channels) it must stay well inside 1e-4 of the exact result.
  rs = np.random.RandomState(0)
  x = rs.normal(size=(1, 12, 12, 256)).astype(np.float32)
  w = (rs.normal(size=(3, 3, 256, 16)) * np.sqrt(2 / (9 * 256))).astype(np.float32)
  spec = _spec(strides=[1, 1, 1, 1], padding="SAME")
  exact = tf.nn.conv2d(x.astype(np.float64), w.astype(np.float64), 1, "SAME").numpy()
  scale = np.max(np.abs(exact))
  for name, bound in [("winograd2", 5e-6), ("winograd4", 5e-5)]:
    actual = jax.jit(lambda x, w: cl.LOWERINGS[name](x, w, spec))(x, w)
    err = np.max(np.abs(np.asarray(actual, np.float64) - exact)) / scale
    assert err < bound, (name, err)


# --------------------------------------------------------------------------- gradients of the filter on CPU

FILTER_GRAD_CASES = {
    # name: (x shape, w shape, Conv2D attrs): convs XLA's conv runs forward (not Winograd, not 1x1)
    "stem_7x7_stride2": ((2, 15, 15, 3), (7, 7, 3, 8), dict(strides=[1, 2, 2, 1], padding="SAME")),
    "3x2_valid": ((2, 9, 11, 4), (3, 2, 4, 5), dict(strides=[1, 1, 1, 1], padding="VALID")),
    "3x3_stride2_explicit": ((2, 10, 10, 16), (3, 3, 16, 8), dict(strides=[1, 2, 2, 1], padding="EXPLICIT",
                             explicit_paddings=[0, 0, 1, 2, 0, 1, 0, 0])),
    "5x5_same_batch1": ((1, 6, 6, 4), (5, 5, 4, 3), dict(strides=[1, 1, 1, 1], padding="SAME")),
}


@pytest.mark.parametrize("case", sorted(FILTER_GRAD_CASES))
def test_filter_tangent_by_tap_gemms_matches_tf(case):
  # Values, jit, the gradient of x and of the filter (vs GradientTape) and vmap; jvp of the filter vs
  # TF's ForwardAccumulator (forward mode runs the shifted GEMMs themselves).
  x_shape, w_shape, kw = FILTER_GRAD_CASES[case]
  x, w = normal(*x_shape), normal(*w_shape, seed=1)
  fn = lambda x, w: RAW.Conv2D(input=x, filter=w, **kw)
  jax_fn = check(fn, x, w, atol=1e-4, rtol=1e-4)
  dw = normal(*w_shape, seed=2)
  _, tangent = jax.jvp(lambda w: jax_fn({}, x, w)[0], (w,), (dw,))
  w_tf = tf.constant(w)
  with tf.autodiff.ForwardAccumulator(w_tf, tf.constant(dw)) as acc:
    y = fn(tf.constant(x), w_tf)
  np.testing.assert_allclose(tangent, acc.jvp(y), atol=1e-4, rtol=1e-4)


def _lowered_grad(x, w, kw, argnums):
  import jaxport
  jax_fn, _ = jaxport.convert(lambda x, w: RAW.Conv2D(input=x, filter=w, **kw), x, w)
  loss = lambda x, w: (jax_fn({}, x, w)[0] ** 2).sum()
  return jax.jit(jax.grad(loss, argnums)).lower(x, w).as_text()


def test_filter_gradient_is_dots_not_a_conv_on_cpu():
  # XLA:CPU's filter-gradient conv (YNNPACK) ran 1.1-2.8x slower than one dot per tap; the forward
  # conv stays XLA's, and the input's gradient is XLA's transposed conv.
  x, w = normal(2, 15, 15, 3), normal(7, 7, 3, 8, seed=1)
  kw = dict(strides=[1, 2, 2, 1], padding="SAME")
  only_w = _lowered_grad(x, w, kw, 1)
  assert only_w.count("stablehlo.convolution") == 1 and only_w.count("stablehlo.dot_general") >= 49
  assert _lowered_grad(x, w, kw, (0, 1)).count("stablehlo.convolution") == 2


def test_large_window_keeps_xla_filter_gradient():
  # Past 7x7 the taps are not measured to pay and their trace grows with the window: XLA's conv.
  x, w = normal(1, 12, 12, 2), normal(9, 9, 2, 3, seed=1)
  only_w = _lowered_grad(x, w, dict(strides=[1, 1, 1, 1], padding="SAME"), 1)
  assert only_w.count("stablehlo.convolution") == 2 and only_w.count("stablehlo.dot_general") == 0


def test_pointwise_kernel_gradient_contracts_one_dim():
  # A 1x1 conv is one GEMM over rows: its kernel's gradient contracts one dim, so XLA:CPU makes no
  # transposing copy of the output gradient (it did to contract N, H and W).
  x, w = normal(2, 6, 6, 8), normal(1, 1, 8, 4, seed=1)
  lowered = _lowered_grad(x, w, dict(strides=[1, 1, 1, 1], padding="VALID"), 1)
  dots = [line for line in lowered.splitlines() if "stablehlo.dot_general" in line]
  assert dots and all("contracting_dims = [0] x [0]" in line or "contracting_dims = [1] x [0]" in line
                      for line in dots), dots


# --------------------------------------------------------------------------- depthwise filter gradient on CPU

DEPTHWISE_GRAD_CASES = {
    "3x3_same": ((2, 7, 7, 4), (3, 3, 4, 1), dict(strides=[1, 1, 1, 1], padding="SAME")),
    "5x5_stride2_multiplier": ((2, 9, 9, 3), (5, 5, 3, 2), dict(strides=[1, 2, 2, 1], padding="SAME")),
    "3x2_valid_multiplier3": ((1, 9, 8, 3), (3, 2, 3, 3), dict(strides=[1, 1, 1, 1], padding="VALID")),
}


def _depthwise_tf(kw):
  return lambda x, w: RAW.DepthwiseConv2dNative(input=x, filter=w, **kw)


@pytest.mark.parametrize("case", sorted(DEPTHWISE_GRAD_CASES))
def test_depthwise_filter_tangent_matches_tf(case):
  # The filter's tangent is a custom linear map (its transpose variadic reduces): values, jit,
  # both gradients against GradientTape and vmap (check); jvp in the filter against TF's
  # ForwardAccumulator; the second derivative in x and w against nested tapes.
  x_shape, w_shape, kw = DEPTHWISE_GRAD_CASES[case]
  x, w = normal(*x_shape), normal(*w_shape, seed=1)
  fn = _depthwise_tf(kw)
  jax_fn = check(fn, x, w, atol=1e-4, rtol=1e-4)
  dw = normal(*w_shape, seed=2)
  _, tangent = jax.jvp(lambda w: jax_fn({}, x, w)[0], (w,), (dw,))
  x_tf, w_tf = tf.constant(x), tf.constant(w)
  with tf.autodiff.ForwardAccumulator(w_tf, tf.constant(dw)) as acc:
    y = fn(x_tf, w_tf)
  np.testing.assert_allclose(tangent, acc.jvp(y), atol=1e-4, rtol=1e-4)

  def loss(x, w):  # a gradient that depends on x and w both, so its own derivative is not zero
    return (jax_fn({}, x, w)[0] ** 2).sum()
  second = jax.jit(jax.grad(lambda x, w: (jax.grad(loss, 1)(x, w) ** 2).sum(), (0, 1)))(x, w)
  with tf.GradientTape() as outer:
    outer.watch([x_tf, w_tf])
    with tf.GradientTape() as inner:
      inner.watch(w_tf)
      value = tf.reduce_sum(fn(x_tf, w_tf) ** 2)
    g = inner.gradient(value, w_tf)
    total = tf.reduce_sum(g ** 2)
  expected = outer.gradient(total, [x_tf, w_tf])
  for got, want in zip(second, expected):
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3 * float(np.abs(want).max()))


def test_depthwise_filter_gradient_reduces_the_taps_together():
  # XLA:CPU's YNNPACK pass takes single-output reduces, writing each tap's input slice out; the
  # taps' products reduced together stay one XLA fusion.
  import jaxport
  x, w = normal(2, 8, 8, 4), normal(3, 3, 4, 1, seed=1)
  jax_fn, _ = jaxport.convert(_depthwise_tf(dict(strides=[1, 1, 1, 1], padding="SAME")), x, w)
  lowered = jax.jit(jax.grad(lambda x, w: (jax_fn({}, x, w)[0] ** 2).sum(), 1)).lower(x, w).as_text()
  reduces = [line for line in lowered.splitlines() if "stablehlo.reduce(" in line]
  assert any(line.count("%") >= 18 for line in reduces), reduces


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_depthwise_backprop_filter_op_reduces_the_taps_together(dtype):
  # A TF training graph's own DepthwiseConv2dNativeBackpropFilter takes the same filter gradient
  # (it was the transpose of the taps' sum: a reduce per tap), accumulating half precision in f32.
  import jaxport
  x, dy = normal(2, 9, 9, 3).astype(dtype), normal(2, 5, 5, 6, seed=1).astype(dtype)
  kw = dict(filter_sizes=[3, 3, 3, 2], strides=[1, 2, 2, 1], padding="SAME")
  fn = tf.function(lambda x, dy: RAW.DepthwiseConv2dNativeBackpropFilter(input=x, out_backprop=dy, **kw))
  jax_fn, params = jaxport.convert(fn, x, dy)
  got = jax.jit(lambda x, dy: jax_fn(params, x, dy)[0])(x, dy)
  assert got.dtype == dtype
  np.testing.assert_allclose(np.asarray(got, np.float32), fn(x, dy).numpy().astype(np.float32),
                             rtol=2e-2 if dtype == np.float16 else 1e-5, atol=2e-2 if dtype == np.float16 else 1e-5)
  lowered = jax.jit(lambda x, dy: jax_fn(params, x, dy)[0]).lower(x, dy).as_text()
  reduces = [line for line in lowered.splitlines() if "stablehlo.reduce(" in line]
  assert reduces and all(line.count("%") >= 18 for line in reduces), reduces


def test_depthwise_filter_gradient_accuracy_after_batch_norm():
  # After a training-mode BatchNorm, dy sums to zero per channel: the filter gradient cancels heavily.
  # Summing all N*H*W terms in one in-order pass erred 3.6e-6 (relative to a float64 reference; TF's
  # float32 kernel 0.9-2.7e-6, by its thread count); the innermost positions first, then the rest, 5.3e-7.
  import jaxport
  rs = np.random.RandomState(0)
  x = np.clip(rs.randn(8, 56, 56, 144), 0, 6).astype(np.float32)
  dy = rs.randn(8, 56, 56, 144).astype(np.float32)
  dy = (dy - dy.mean((0, 1, 2))) * 1e-3
  op = lambda x, dy: RAW.DepthwiseConv2dNativeBackpropFilter(input=x, out_backprop=dy, filter_sizes=[3, 3, 144, 1],
                                                             strides=[1, 1, 1, 1], padding="SAME")
  exact = op(x.astype(np.float64), dy.astype(np.float64)).numpy()
  jax_fn, params = jaxport.convert(tf.function(op), x, dy)
  got = np.asarray(jax.jit(lambda x, dy: jax_fn(params, x, dy)[0])(x, dy), np.float64)
  assert np.abs(got - exact).max() / np.abs(exact).max() < 1.5e-6
