"""jax2tf round trips: real JAX programs → `jax2tf.convert` (native serialization) → jaxport → JAX.

Each program is converted from a live `tf.function` and from a restored SavedModel, and
must match the original JAX function in value, under `jax.jit`, `jax.grad`, `jax.vmap`
and `jax.jvp`. Also: platforms and strict checks, multi-platform modules, `call_tf`
inside an export, `with_gradient=False` (PreventGradient), polymorphic batch sizes,
the conversion-time check of unsupported StableHLO ops, and `_jax_compat.custom_linear`.
"""
from __future__ import annotations

import dataclasses
import functools
import tempfile
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from jax import lax
from jax.experimental import jax2tf

import jaxport
from jaxport.convert import _jax_compat
from jaxport.convert.ops import xla_call_module
from jaxport.errors import ShapeAssertionError, StableHLOError

flax_linen = pytest.importorskip("flax.linen")
optax = pytest.importorskip("optax")
nn = flax_linen

RNG = np.random.RandomState(0)


def _normal(*shape, scale=1.0):
  return (RNG.normal(size=shape) * scale).astype(np.float32)


# --------------------------------------------------------------------------- the programs


class _CNN(nn.Module):
  @nn.compact
  def __call__(self, x, train: bool):
    x = nn.Conv(4, (3, 3))(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
    x = nn.relu(x)
    x = nn.avg_pool(x, (2, 2), strides=(2, 2))
    return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def _cnn_case():
  model, x = _CNN(), _normal(2, 6, 6, 1)
  variables = jax.tree.map(np.asarray, model.init(jax.random.PRNGKey(0), x, train=False))

  def fn(variables, x):   # one training-mode forward pass: logits and the new batch statistics
    logits, updates = model.apply(variables, x, train=True, mutable=["batch_stats"])
    return logits, updates["batch_stats"]

  return fn, (variables, x), (None, 0)


class _ResNetBlock(nn.Module):
  @nn.compact
  def __call__(self, x):
    y = nn.Conv(3, (3, 3), use_bias=False)(x)
    y = nn.BatchNorm(use_running_average=True)(y)
    y = nn.relu(y)
    y = nn.Conv(3, (3, 3), use_bias=False)(y)
    y = nn.BatchNorm(use_running_average=True)(y)
    return nn.relu(y + x)


def _resnet_case():
  model, x = _ResNetBlock(), _normal(1, 5, 5, 3)
  variables = jax.tree.map(np.asarray, model.init(jax.random.PRNGKey(1), x))
  return model.apply, (variables, x), (None, 0)


class _TransformerLayer(nn.Module):
  @nn.compact
  def __call__(self, x):
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=8)(y, y)
    x = x + y
    y = nn.LayerNorm()(x)
    y = nn.Dense(8)(nn.gelu(nn.Dense(16)(y)))
    return x + y


def _transformer_case():
  model, x = _TransformerLayer(), _normal(2, 3, 8)
  variables = jax.tree.map(np.asarray, model.init(jax.random.PRNGKey(2), x))
  return model.apply, (variables, x), (None, 0)


def _lstm_case():
  n_in, n_hidden = 3, 4
  params = {"w": _normal(n_in + n_hidden, 4 * n_hidden, scale=0.5), "b": _normal(4 * n_hidden, scale=0.1)}

  def fn(params, xs):   # xs: (time, batch, features)
    def cell(carry, x):
      h, c = carry
      i, f, g, o = jnp.split(jnp.concatenate([x, h], -1) @ params["w"] + params["b"], 4, axis=-1)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (h, c), h

    zeros = jnp.zeros((xs.shape[1], n_hidden), xs.dtype)
    (h, c), hs = lax.scan(cell, (zeros, zeros), xs)
    return hs, c

  return fn, (params, _normal(4, 2, n_in)), (None, 0)


def _control_flow_case():
  def fn(x, n):
    # A while loop whose trip count depends on the data (JAX differentiates around it), then
    # cond, switch and a fori_loop with static bounds (a scan, differentiated through).
    def body(carry):
      i, total = carry
      return i + 1, total + i

    steps, total = lax.while_loop(lambda c: c[1] < n + jnp.sum(x > 0), body, (jnp.int32(0), jnp.int32(0)))
    y = x * steps.astype(x.dtype) + jnp.sin(x) * total.astype(x.dtype)
    y = lax.cond(jnp.sum(y) > 0, lambda v: v * 2.0, lambda v: v - 1.0, y)
    branch = jnp.argmax(x) % 3
    y = lax.switch(branch, [jnp.tanh, jnp.cos, lambda v: v ** 2], y)
    return lax.fori_loop(0, 3, lambda i, v: v + jnp.float32(i) * v * 0.1, y)

  return fn, (_normal(4), np.int32(3)), (0, None)


def _sort_cumulative_case():
  def fn(x):
    order = jnp.argsort(x[:, 0])
    return (jnp.sort(x, axis=0), x[order], jnp.cumsum(x, axis=1), jnp.cumprod(x, axis=0),
            lax.cummax(x, axis=1), lax.top_k(x[:, 1], 2)[0])

  return fn, (_normal(4, 3),), (0,)


def _reduce_window_case():
  def fn(x):
    pooled = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "VALID")
    summed = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    return pooled, summed, nn.avg_pool(x, (2, 2), strides=(1, 1), padding="SAME")

  return fn, (_normal(1, 5, 5, 2),), (0,)


def _gather_scatter_case():
  def fn(x, idx, updates):
    x = jnp.asarray(x)
    gathered = x[idx] * 2.0 + jnp.take_along_axis(x[idx], idx[:, None] % x.shape[1], axis=1)
    added = x.at[idx].add(updates)
    setted = x.at[idx[0], 1:].set(updates[0, 1:])
    maxed = x.at[:, idx % x.shape[1]].max(1.0)
    return gathered, added, setted, maxed

  return fn, (_normal(5, 3), np.array([3, 0, 3], np.int32), _normal(3, 3)), (0, None, 0)


def _random_case():
  def fn(key, x):
    k1, k2 = jax.random.split(key)
    noise = jax.random.normal(k1, x.shape)
    mask = jax.random.bernoulli(k2, 0.5, x.shape)
    return jnp.where(mask, x + noise, x * jax.random.uniform(k1, x.shape))

  return fn, (np.asarray(jax.random.PRNGKey(7)), _normal(3, 2)), (None, 0)


def _fft_case():
  def fn(x):
    spectrum = jnp.fft.fft(x.astype(jnp.complex64))
    r = jnp.fft.rfft(x)
    return jnp.real(spectrum), jnp.imag(spectrum), jnp.fft.irfft(r * 0.5, n=x.shape[-1]), jnp.abs(jnp.fft.fft2(x))

  return fn, (_normal(3, 8),), (0,)


def _optax_case():
  opt = optax.adam(1e-2)
  params = {"w": _normal(3, 2), "b": _normal(2)}
  opt_state = jax.tree.map(np.asarray, opt.init(params))

  def fn(params, opt_state, x, y):   # one Adam step on a least-squares loss
    loss = lambda p: jnp.mean((x @ p["w"] + p["b"] - y) ** 2)
    grads = jax.grad(loss)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  return fn, (params, opt_state, _normal(4, 3), _normal(4, 2)), (None, None, 0, 0)


_POLY_W = _normal(4, 3)


def _polymorphic_case():
  def fn(x):
    h = jnp.tanh(x @ _POLY_W)
    return jax.nn.softmax(h, axis=-1), jnp.mean(h, axis=0), h.reshape(-1)[: x.shape[0]]

  return fn, (_normal(3, 4),), (0,)


def _linalg_case():
  def fn(a, b):
    spd = a @ a.T + 3.0 * jnp.eye(a.shape[0], dtype=a.dtype)
    w, v = jnp.linalg.eigh(spd)
    q, r = jnp.linalg.qr(a)
    return (jnp.linalg.solve(spd, b), jnp.linalg.cholesky(spd), w, jnp.abs(v),
            jnp.linalg.svd(a, compute_uv=False), jnp.abs(jnp.diagonal(r)), q @ r)

  return fn, (_normal(3, 3), _normal(3, 2)), (0, 0)


@dataclasses.dataclass(frozen=True)
class Case:
  make: Callable               # () -> (fn, args, vmap in_axes)
  polymorphic_shapes: Any = None
  atol: float = 1e-5
  rtol: float = 1e-5


CASES = {
    "cnn_batchnorm": Case(_cnn_case, atol=1e-4, rtol=1e-4),
    "resnet_block": Case(_resnet_case, atol=1e-4, rtol=1e-4),
    "transformer_layer": Case(_transformer_case, atol=1e-4, rtol=1e-4),
    "lstm_scan": Case(_lstm_case),
    "while_cond_switch": Case(_control_flow_case),
    "sort_cumulative": Case(_sort_cumulative_case),
    "reduce_window": Case(_reduce_window_case),
    "gather_scatter": Case(_gather_scatter_case),
    "random_key": Case(_random_case),
    "fft": Case(_fft_case, atol=1e-4, rtol=1e-4),
    "optax_adam_step": Case(_optax_case),
    "polymorphic_batch": Case(_polymorphic_case, polymorphic_shapes=["(b, 4)"]),
    "linalg": Case(_linalg_case, atol=1e-4, rtol=1e-4),
}


# --------------------------------------------------------------------------- conversion


def _spec(x, shape=None):
  x = np.asarray(x)
  return tf.TensorSpec(x.shape if shape is None else shape, tf.as_dtype(x.dtype))


def _signature(args, polymorphic_shapes) -> list:
  specs = [jax.tree.map(_spec, a) for a in args]
  for i, poly in enumerate(polymorphic_shapes or []):
    if poly is not None:   # "(b, 4)": every named dimension is free
      dims = [d.strip() for d in poly.strip("()").split(",")]
      specs[i] = _spec(args[i], [int(d) if d.isdigit() else None for d in dims])
  return specs


def _jax2tf(fn, signature, **kwargs):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return tf.function(jax2tf.convert(fn, **kwargs), autograph=False, input_signature=signature)


@functools.lru_cache(maxsize=None)
def _saved_models() -> tempfile.TemporaryDirectory:
  return tempfile.TemporaryDirectory(prefix="jaxport_roundtrip_")   # removed when the process exits


def _restored(tf_fn):
  module = tf.Module()
  module.f = tf_fn
  path = tempfile.mkdtemp(dir=_saved_models().name)
  tf.saved_model.save(module, path)
  return tf.saved_model.load(path)


def _from_restored(restored_fn):
  jax_fn, params = jaxport.convert_from_restored(restored_fn)
  assert params == {}
  return lambda *args: jax_fn(params, *args)[0]


@functools.lru_cache(maxsize=None)
def _program(name: str):
  """(original JAX fn, its jax2tf tf.function, input signature, args, vmap in_axes)."""
  case = CASES[name]
  fn, args, in_axes = case.make()
  signature = _signature(args, case.polymorphic_shapes)
  return fn, _jax2tf(fn, signature, polymorphic_shapes=case.polymorphic_shapes), signature, args, in_axes


@functools.lru_cache(maxsize=None)
def _converted(name: str, source: str):
  """The jaxport conversion of a corpus program, from the live tf.function or a SavedModel."""
  _, tf_fn, signature, _, _ = _program(name)
  if source == "live":
    return jaxport.convert_functional(tf_fn, *signature)
  return _from_restored(_restored(tf_fn).f)


# --------------------------------------------------------------------------- checks


def _assert_close(actual, expected, case: Case, what: str):
  actual, expected = jax.tree.leaves(actual), jax.tree.leaves(expected)
  assert len(actual) == len(expected), what
  for k, (a, e) in enumerate(zip(actual, expected)):
    a, e = np.asarray(a), np.asarray(e)
    assert a.shape == e.shape, f"{what}: leaf {k} has shape {a.shape}, expected {e.shape}"
    if e.dtype == jax.dtypes.float0:
      continue
    if np.issubdtype(e.dtype, np.inexact):
      np.testing.assert_allclose(a, e, atol=case.atol, rtol=case.rtol, err_msg=f"{what}: leaf {k}")
    else:
      np.testing.assert_array_equal(a, e, err_msg=f"{what}: leaf {k}")


def _is_float(x) -> bool:
  return np.issubdtype(np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype, np.inexact)


def _weights(out):
  """Fixed weights that project every float output leaf (or its shape) to a scalar loss."""
  return jax.tree.map(lambda o: np.linspace(-1.0, 1.0, int(np.prod(o.shape)), dtype=np.float32).reshape(o.shape), out)


def _loss(fn, args, weights, diff):
  def loss(*float_args):
    full = list(args)
    for i, a in zip(diff, float_args):
      full[i] = a
    leaves = jax.tree.leaves(fn(*full))
    return sum(jnp.sum(jnp.real(o) * w) for o, w in zip(leaves, jax.tree.leaves(weights)) if _is_float(o))
  return loss


def _float_args(args) -> list[int]:
  return [i for i, a in enumerate(args) if all(_is_float(x) for x in jax.tree.leaves(a))]


def _tangent(x):
  x = np.asarray(x)
  if not _is_float(x):
    return np.zeros(x.shape, jax.dtypes.float0)
  return np.cos(np.arange(x.size, dtype=np.float32)).reshape(x.shape).astype(x.dtype)


def _batched(args, in_axes):
  def stack(x):
    x = np.asarray(x)
    return np.stack([x, x * 0.5 + 0.25 if _is_float(x) else x])
  return tuple(jax.tree.map(stack, a) if axis == 0 else a for a, axis in zip(args, in_axes))


TRANSFORMS = ("value", "jit", "grad", "vmap", "jvp")


def _transformed(name: str, fn, transform: str):
  """`transform` of `fn` applied to the program's inputs (grad, vmap and jvp run under jit:
  one compilation instead of one per eager op)."""
  _, _, _, args, in_axes = _program(name)
  if transform == "value":
    return fn(*args)
  if transform == "jit":
    return jax.jit(fn)(*args)
  if transform == "grad":
    original = _program(name)[0]
    diff = _float_args(args)
    loss = _loss(fn, args, _weights(jax.eval_shape(original, *args)), diff)
    return jax.jit(jax.grad(loss, argnums=tuple(range(len(diff)))))(*[args[i] for i in diff])
  if transform == "vmap":
    return jax.jit(jax.vmap(fn, in_axes=in_axes))(*_batched(args, in_axes))
  tangents = jax.tree.map(_tangent, args)
  return jax.jit(lambda args, tangents: jax.jvp(fn, args, tangents))(args, tangents)


@functools.lru_cache(maxsize=None)
def _expected(name: str, transform: str):
  # The original's value is taken under jit: eager, it would compile each of its ops once more.
  return _transformed(name, _program(name)[0], "jit" if transform == "value" else transform)


@pytest.mark.slow
@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("source", ["live", "saved_model"])
@pytest.mark.parametrize("name", list(CASES))
def test_roundtrip(name, source, transform):
  actual = _transformed(name, _converted(name, source), transform)
  _assert_close(actual, _expected(name, transform), CASES[name], f"{name} ({source}, {transform})")


# --------------------------------------------------------------------------- the op itself


def _sin_cos(x):
  return jnp.sin(x) * jnp.cos(2.0 * x)


X = np.linspace(-1.0, 1.0, 5, dtype=np.float32)


def _nodes(tf_fn, op):
  cf = tf_fn.get_concrete_function()
  return [n for n in cf.graph.as_graph_def().node if n.op == op]


def test_value_grad_jvp_vmap_jit():
  f = jaxport.convert_functional(_jax2tf(_sin_cos, [_spec(X)]), X)
  np.testing.assert_allclose(f(X), _sin_cos(X), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(f)(X), _sin_cos(X), rtol=1e-6)
  assert jax.eval_shape(f, X).shape == X.shape
  loss = lambda g: lambda x: jnp.sum(g(x))
  np.testing.assert_allclose(jax.grad(loss(f))(X), jax.grad(loss(_sin_cos))(X), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(loss(f)))(X), jax.grad(loss(_sin_cos))(X), rtol=1e-6)
  np.testing.assert_allclose(jax.jvp(f, (X,), (X,))[1], jax.jvp(_sin_cos, (X,), (X,))[1], rtol=1e-6)
  xs = np.stack([X, X * 2])
  np.testing.assert_allclose(jax.vmap(f)(xs), jax.vmap(_sin_cos)(xs), rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(loss(f)))(xs), jax.vmap(jax.grad(loss(_sin_cos)))(xs), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda xs: jnp.sum(jax.vmap(f)(xs)))(xs),
                             jax.grad(lambda xs: jnp.sum(jax.vmap(_sin_cos)(xs)))(xs), rtol=1e-6)
  # Second order: jax.hessian differentiates the converted gradient (its VJP module).
  np.testing.assert_allclose(jax.jit(jax.hessian(loss(f)))(X), jax.hessian(loss(_sin_cos))(X), rtol=1e-5, atol=1e-6)


def test_grad_uses_the_recorded_vjp_and_jvp_the_module():
  """stop_gradient and a dynamic while loop vanish in StableHLO: reverse mode still matches
  JAX through the recorded VJP; forward mode differentiates the interpreted module."""
  def fn(x):
    frozen = lax.stop_gradient(x)
    y = lax.while_loop(lambda c: c[1] < jnp.sum(frozen > 0), lambda c: (c[0] * 1.5 + jnp.sin(c[0]), c[1] + 1),
                       (frozen, 0))[0]
    return jnp.sum(y * x)

  f = jaxport.convert_functional(_jax2tf(fn, [_spec(X)]), X)
  np.testing.assert_allclose(f(X), fn(X), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(f)(X), jax.grad(fn)(X), rtol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(f))(X), jax.grad(fn)(X), rtol=1e-6)
  # jvp: the module's own derivative, which also differentiates through the frozen copy.
  def unfrozen(x):
    y = lax.while_loop(lambda c: c[1] < jnp.sum(x > 0), lambda c: (c[0] * 1.5 + jnp.sin(c[0]), c[1] + 1), (x, 0))[0]
    return jnp.sum(y * x)
  t = np.ones_like(X)
  np.testing.assert_allclose(jax.jvp(f, (X,), (t,))[1], jax.jvp(unfrozen, (X,), (t,))[1], rtol=1e-5)
  assert not np.allclose(jax.jvp(f, (X,), (t,))[1], jax.jvp(fn, (X,), (t,))[1])


def test_tf_custom_gradient_keeps_forward_mode():
  """A plain @tf.custom_gradient: reverse mode uses it, forward mode differentiates the forward pass."""
  def forward(x):
    @tf.custom_gradient
    def inner(x):
      def grad(dy):
        return dy * 7.0
      return tf.sin(x), grad
    return inner(x) * 2.0

  # autograph=False: autograph's source lookup can pick the enclosing test function under xdist.
  f = jaxport.convert_functional(tf.function(forward, autograph=False), X)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x)))(X), 14.0 * np.ones_like(X))
  np.testing.assert_allclose(jax.jvp(f, (X,), (np.ones_like(X),))[1], 2.0 * np.cos(X), rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: jnp.sum(f(x))))(np.stack([X, X])), 14.0 * np.ones((2, 5)))


def test_platforms_and_strict_checks():
  tf_fn = _jax2tf(_sin_cos, [_spec(X)], native_serialization_platforms=("tpu",))
  node, = _nodes(tf_fn, "XlaCallModule")
  assert list(node.attr["platforms"].list.s) == [b"TPU"]
  f = jaxport.convert_functional(tf_fn, X)   # converting is fine; calling checks the platform
  with pytest.raises(ValueError, match=r"TPU.*CPU|cpu.*tpu") as e:
    f(X)
  assert "xlacallmodule_strict_checks" in str(e.value)
  with jaxport.override_config("xlacallmodule_strict_checks", False):   # at call time, as in tf2jax
    np.testing.assert_allclose(f(X), _sin_cos(X), rtol=1e-6)
  with jaxport.override_config("xlacallmodule_strict_checks", False):   # or at conversion time
    g = jaxport.convert_functional(tf_fn, X)
  np.testing.assert_allclose(g(X), _sin_cos(X), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(g(x)))(X), jax.grad(lambda x: jnp.sum(_sin_cos(x)))(X),
                             rtol=1e-6)


def test_multi_platform_module_gets_the_platform_index():
  def fn(x):   # a different result per platform shows which branch ran
    return lax.platform_dependent(x, cpu=lambda x: x + 1.0, default=lambda x: x - 1.0)

  tf_fn = _jax2tf(fn, [_spec(X)], native_serialization_platforms=("tpu", "cpu"))
  node, = _nodes(tf_fn, "XlaCallModule")
  assert list(node.attr["platforms"].list.s) == [b"TPU", b"CPU"]
  f = jaxport.convert_functional(tf_fn, X)
  assert xla_call_module.current_platform() == "CPU"
  np.testing.assert_allclose(f(X), X + 1.0)
  np.testing.assert_allclose(jax.jit(f)(X), X + 1.0)
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x)))(X), np.ones_like(X))


def test_call_tf_inside_an_export():
  tf_part = tf.function(lambda x: tf.math.cos(x) * 3.0 + 1.0, autograph=False)

  def fn(x):
    return jnp.sin(jax2tf.call_tf(tf_part, call_tf_graph=True)(x * 2.0))

  tf_fn = _jax2tf(fn, [_spec(X)], with_gradient=False)
  node, = _nodes(tf_fn, "XlaCallModule")
  assert len(node.attr["function_list"].list.func) == 1
  expected = np.sin(np.cos(X * 2.0) * 3.0 + 1.0)
  f = jaxport.convert_functional(tf_fn, X)
  np.testing.assert_allclose(f(X), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(f)(X), expected, rtol=1e-6)
  np.testing.assert_allclose(jax.vmap(f)(np.stack([X, X])), np.stack([expected, expected]), rtol=1e-6)
  with jaxport.override_config("raise_on_prevent_gradient", False):
    g = jaxport.convert_functional(tf_fn, X)
  with pytest.warns(UserWarning, match="PreventGradient"):
    grad = jax.grad(lambda x: jnp.sum(g(x)))(X)
  expected_grad = np.cos(np.cos(2 * X) * 3 + 1) * -3.0 * np.sin(2 * X) * 2.0
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-6)


def test_with_gradient_false_keeps_prevent_gradient():
  tf_fn = _jax2tf(_sin_cos, [_spec(X)], with_gradient=False)
  assert _nodes(tf_fn, "PreventGradient")
  f = jaxport.convert_functional(tf_fn, X)
  np.testing.assert_allclose(f(X), _sin_cos(X), rtol=1e-6)
  with pytest.raises(LookupError, match="Gradient explicitly disabled"):
    jax.grad(lambda x: jnp.sum(f(x)))(X)
  with pytest.raises((LookupError, TypeError)):   # TF's forward mode goes through the gradient too
    jax.jvp(f, (X,), (X,))
  np.testing.assert_allclose(jax.vmap(f)(np.stack([X, -X])), np.stack([_sin_cos(X), _sin_cos(-X)]), rtol=1e-6)
  with jaxport.override_config("raise_on_prevent_gradient", False):
    g = jaxport.convert_functional(tf_fn, X)
  with pytest.warns(UserWarning, match="PreventGradient"):
    grad = jax.grad(lambda x: jnp.sum(g(x)))(X)
  np.testing.assert_allclose(grad, jax.grad(lambda x: jnp.sum(_sin_cos(x)))(X), rtol=1e-6)


def test_polymorphic_shapes_at_several_batch_sizes():
  w = _normal(4, 2)

  def fn(x):
    return jnp.tanh(x @ w) * x.shape[0], jnp.sum(x, axis=0)

  signature = [tf.TensorSpec((None, 4), tf.float32)]
  tf_fn = _jax2tf(fn, signature, polymorphic_shapes=["(b, 4)"])
  live = jaxport.convert_functional(tf_fn, *signature)
  restored = _from_restored(_restored(tf_fn).f)
  loss = lambda g: jax.jit(jax.grad(lambda x: jnp.sum(g(x)[0]) + jnp.sum(g(x)[1] ** 2)))
  for f in (live, restored):
    jit_f, grad_f = jax.jit(f), loss(f)
    for b in (1, 2, 5):   # one conversion serves every batch size; jit traces once per size
      x = _normal(b, 4)
      _assert_close(f(x), fn(x), Case(None), f"batch {b}")
      _assert_close(jit_f(x), fn(x), Case(None), f"jit, batch {b}")
      _assert_close(grad_f(x), loss(fn)(x), Case(None), f"grad, batch {b}")
    assert jit_f._cache_size() == 3


def test_polymorphic_module_traced_with_symbolic_dims():
  """JAX -> TF -> jaxport -> TF: jax2tf traces jaxport's function (an XlaCallModule) with a symbolic dim."""
  def fn(x, y):
    return jnp.broadcast_to(x, y.shape), x + y

  polys = ["(b, _)", "(_, b, _)"]
  signature = [tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((2, None, 4), tf.float32)]
  f = jaxport.convert_functional(_jax2tf(fn, signature, polymorphic_shapes=polys), *signature)
  back = _jax2tf(jax.jit(f), signature, polymorphic_shapes=polys)
  for b in (1, 3):
    x, y = _normal(b, 4), _normal(2, b, 4)
    _assert_close([o.numpy() for o in back(x, y)], list(fn(x, y)), Case(None), f"batch {b}")


def test_polymorphic_shape_constraints_are_asserted():
  def fn(x):   # "2*b": the batch must be even
    return jnp.reshape(x, (2, -1, 3)).sum(axis=0)

  signature = [tf.TensorSpec((None, 3), tf.float32)]
  tf_fn = _jax2tf(fn, signature, polymorphic_shapes=["(2*b, 3)"])
  f = jaxport.convert_functional(tf_fn, *signature)
  x = _normal(4, 3)
  np.testing.assert_allclose(f(x), fn(x), rtol=1e-6)
  with pytest.raises(ShapeAssertionError):
    f(_normal(3, 3))


def _handmade(text: str, version: int, sout, **attrs):
  """A tf.function holding one XlaCallModule node with the StableHLO module `text`."""
  gen_xla_ops = pytest.importorskip("tensorflow.compiler.tf2xla.ops.gen_xla_ops")
  from jaxlib.mlir.dialects import stablehlo
  data = stablehlo.serialize_portable_artifact_str(text, stablehlo.get_minimum_version())

  @tf.function(autograph=False, input_signature=[tf.TensorSpec(sout, tf.float32)])
  def fn(x):
    return gen_xla_ops.xla_call_module(args=[x], version=version, module=data, Sout=[tf.TensorShape(sout)],
                                       Tout=[tf.float32], **attrs)[0]
  return fn


_TOKEN_MODULE = """
module @tokens {
  func.func public @main(%token: !stablehlo.token, %x: tensor<4xf32>) -> (!stablehlo.token, tensor<4xf32>) {
    %0 = stablehlo.sine %x : tensor<4xf32>
    return %token, %0 : !stablehlo.token, tensor<4xf32>
  }
}
"""

_DIM_ARGS_MODULE = """
module @dim_args {
  func.func public @main(%n: tensor<i32>, %x: tensor<?xf32>) -> tensor<?xf32> {
    %0 = stablehlo.convert %n : (tensor<i32>) -> tensor<f32>
    %1 = stablehlo.get_dimension_size %x, dim = 0 : (tensor<?xf32>) -> tensor<i32>
    %2 = stablehlo.reshape %1 : (tensor<i32>) -> tensor<1xi32>
    %3 = stablehlo.dynamic_broadcast_in_dim %0, %2, dims = [] : (tensor<f32>, tensor<1xi32>) -> tensor<?xf32>
    %4 = stablehlo.multiply %x, %3 : tensor<?xf32>
    return %4 : tensor<?xf32>
  }
}
"""


def test_token_arguments_and_results():
  tf_fn = _handmade(_TOKEN_MODULE, 9, [4], platforms=["CPU"], has_token_input_output=True)
  x = X[:4]
  f = jaxport.convert_functional(tf_fn, x)
  np.testing.assert_allclose(f(x), tf_fn(x).numpy(), rtol=1e-6)   # TF runs it too
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: jnp.sum(f(x))))(x), np.cos(x), rtol=1e-6)


def test_dim_args_spec_of_old_versions():
  # TF 2.21 no longer runs dim_args_spec modules; jaxport feeds dimension 0 of argument 0.
  tf_fn = _handmade(_DIM_ARGS_MODULE, 4, [None], dim_args_spec=["0.0"])
  f = jaxport.convert_functional(tf_fn, tf.TensorSpec([None], tf.float32))
  for n in (2, 5):
    x = _normal(n)
    np.testing.assert_allclose(f(x), x * n, rtol=1e-6)


def test_results_must_match_sout():
  tf_fn = _handmade(_TOKEN_MODULE.replace("4xf32", "?xf32"), 9, [None], has_token_input_output=True)
  f = jaxport.convert_functional(tf_fn, tf.TensorSpec([None], tf.float32))
  np.testing.assert_allclose(f(X), np.sin(X), rtol=1e-6)   # Sout -1: any size
  tf_fn = _handmade(_DIM_ARGS_MODULE, 4, [3], dim_args_spec=["0.0"])
  f = jaxport.convert_functional(tf_fn, X[:3])
  np.testing.assert_allclose(f(X[:3]), X[:3] * 3, rtol=1e-6)
  with jaxport.override_config("strict_shape_check", False):
    g = jaxport.convert_functional(tf_fn, X[:3])
  with pytest.raises(StableHLOError, match="declares"):
    g(X)


def test_unsupported_op_raises_at_conversion(monkeypatch):
  from jaxport.convert.stablehlo import interpreter
  tf_fn = _jax2tf(_sin_cos, [_spec(X)])
  interpreter.handled_ops()
  monkeypatch.delitem(interpreter._HANDLERS, "stablehlo.sine")
  with pytest.raises(StableHLOError, match=r"stablehlo\.sine.*") as e:
    jaxport.convert_functional(tf_fn, X)
  assert "XlaCallModule" in str(e.value) + "".join(getattr(e.value, "__notes__", []))


def test_old_versions_raise_at_conversion():
  from jaxport.convert.graph import Node
  node = Node("call", "XlaCallModule", [], [], {"version": 3, "module": b""})
  with pytest.raises(StableHLOError, match="version 3"):
    xla_call_module.check(node)


def test_custom_linear_pins_jax_internals():
  """`_jax_compat.custom_linear`: fwd forward, bwd as the transpose, batching, jit, residual derivatives."""
  def f(x, r):
    return _jax_compat.custom_linear(lambda res, lin: [lin[0] * res[0]],
                                     lambda res, cts: [cts[0] * 7.0 * res[0]],   # deliberately not fwd's transpose
                                     [r], [x], [jax.typeof(x)])[0]

  x, r = jnp.arange(3.0), jnp.float32(2.0)
  np.testing.assert_allclose(f(x, r), x * 2)
  np.testing.assert_allclose(jax.jit(f)(x, r), x * 2)
  np.testing.assert_allclose(jax.jvp(lambda x: f(x, r), (x,), (jnp.ones(3),))[1], 2 * np.ones(3))
  np.testing.assert_allclose(jax.grad(lambda x: jnp.sum(f(x, r)))(x), 14 * np.ones(3))
  np.testing.assert_allclose(jax.vmap(jax.grad(lambda x: jnp.sum(f(x, r))))(jnp.ones((2, 3))), 14 * np.ones((2, 3)))
  np.testing.assert_allclose(jax.grad(lambda xs: jnp.sum(jax.vmap(lambda x: f(x, r))(xs)))(jnp.ones((2, 3))),
                             14 * np.ones((2, 3)))
  # Through the residual: d/dr of f is x (fwd), of the transposed map 7 * ct.
  np.testing.assert_allclose(jax.grad(lambda r: jnp.sum(f(x, r)))(r), np.sum(x))


def test_restored_saved_model_uses_the_recorded_gradient(tmp_path):
  """A restored function calls its body through a library function: its custom gradient is used too."""
  x = np.array([-1.0, 0.0, 1.0], np.float32)
  module = tf.Module()
  module.f = tf.function(jax2tf.convert(jax.nn.relu, with_gradient=True), autograph=False,
                         input_signature=[tf.TensorSpec((3,), tf.float32)])
  tf.saved_model.save(module, str(tmp_path))
  restored = tf.saved_model.load(str(tmp_path))
  f = jaxport.convert_functional(restored.f, x)
  expected = jax.grad(lambda x: jax.nn.relu(x).sum())(x)   # 0 at x = 0, as JAX defines relu's
  np.testing.assert_array_equal(jax.grad(lambda x: f(x).sum())(x), expected)
  np.testing.assert_array_equal(jax.jit(jax.grad(lambda x: f(x).sum()))(x), expected)
