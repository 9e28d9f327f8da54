"""StableHLO reduce, reduce_window, select_and_scatter and sort, from jax.export and TF modules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxport
from hlo_support import as_fn, exported
from jaxport.convert import stablehlo
from jaxport.convert.stablehlo import reduce as reduce_family



def _module(f, *args):
  return exported(f, *args)[0]


_as_fn = as_fn


def _same(got, want, tol=0.0):
  got, want = jax.tree.leaves(got), jax.tree.leaves(want)   # the module's results are flat
  assert len(got) == len(want), (len(got), len(want))
  for a, b in zip(got, want):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    if tol:
      np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
    else:
      np.testing.assert_array_equal(a, b)


def _check(f, *args, ops=(), grad=False, vmap=False, jvp=False, tol=0.0):
  """The interpreted module matches f eager and under jit; optionally grad, jvp (arg 0) and vmap (over arg 0)."""
  module = _module(f, *args)
  for op in ops:
    assert op in module.op_names(), module.op_names()
  g = _as_fn(module)
  args = [jnp.asarray(a) for a in args]   # NumPy args would be trace-time constants to the interpreter
  jf = jax.jit(f)   # the reference: one compile (eager f would compile op by op)
  want = jf(*args)
  _same(g(*args), want, tol)
  _same(jax.jit(g)(*args), want, tol)
  shapes = lambda out: [(o.shape, o.dtype) for o in jax.tree.leaves(out)]
  assert shapes(jax.eval_shape(g, *args)) == shapes(want)
  both = lambda transform: (jax.jit(transform(g)), jax.jit(transform(f)))   # jit: one compile, not op by op
  if grad:
    loss = lambda fn: jax.grad(lambda *a: sum(jnp.sum(jnp.sin(o)) for o in jax.tree.leaves(fn(*a))))
    got, want = both(loss)
    _same(got(*args), want(*args), tol or 1e-6)
  if jvp:
    t = jnp.cos(args[0])
    got, want = both(lambda fn: lambda x: jax.jvp(lambda x: fn(x, *args[1:]), (x,), (t,)))
    _same(got(args[0]), want(args[0]), tol or 1e-6)
  if vmap:
    batch = jnp.stack([args[0], args[0][::-1] if args[0].ndim else args[0]])
    got = jax.jit(jax.vmap(lambda x: g(x, *args[1:])))(batch)
    _same(got, jax.tree.map(lambda *r: jnp.stack(r), *[jf(x, *args[1:]) for x in batch]), tol)
  return g, module


def _jaxpr(g, *args) -> str:
  return str(jax.make_jaxpr(g)(*[jnp.asarray(a) for a in args]))


X = np.array([[1.5, -2.0, 3.0, 0.25], [0.5, 4.0, -1.0, 2.0], [3.0, 3.0, -0.5, 1.0]], np.float32)
XI = np.array([[3, -7, 3, 1], [0, 5, 5, -2], [9, 9, -4, 0]], np.int32)
TIES = np.array([[1.0, 3.0, 3.0, np.nan, 3.0], [2.0, 2.0, -1.0, 2.0, -1.0], [np.nan, 0.0, np.nan, -0.0, 0.0]],
                np.float32)


# --------------------------------------------------------------------------- reduce

_REDUCTIONS = (jnp.sum, jnp.prod, jnp.max, jnp.min)


def test_float_reductions_are_jax_reductions():
  f = lambda x: [(fn(x, axis=0), fn(x, axis=1), fn(x)) for fn in _REDUCTIONS]
  g, _ = _check(f, X, ops=["stablehlo.reduce"], grad=True, vmap=True)
  jaxpr = _jaxpr(g, X)
  assert all(f"reduce_{op}" in jaxpr for op in ("sum", "prod", "max", "min")) and "reduce[" not in jaxpr, jaxpr
  _check(lambda x: (jnp.mean(x, axis=1), jnp.sum(x.astype(jnp.float16), axis=0)), X, grad=True, tol=1e-6)


def test_integer_reductions():
  _check(lambda x: [(fn(x, axis=(0, 1)), fn(x.astype(jnp.uint8), axis=0)) for fn in _REDUCTIONS], XI)


def test_any_all_and_bitwise_reductions():
  _check(lambda x: (jnp.any(x > 2, axis=1), jnp.all(x > -3, axis=0)), X)
  _check(lambda x: (lax.reduce_xor(x, (1,)), lax.reduce_and(x, (0,)), lax.reduce_or(x, (0, 1))), XI)


def test_non_identity_init_is_combined_once():
  _check(lambda x: (jnp.max(x, axis=1, initial=2.5), jnp.sum(x, axis=0, where=x > 0)), X)
  _check(lambda x: lax.reduce(x, np.float32(10.0), lax.add, (0,)), X)


def test_constant_reductions_stay_numpy():
  module = _module(lambda: (jnp.sum(jnp.arange(6).reshape(2, 3), axis=0), jnp.max(jnp.arange(5))))
  out = stablehlo.call_module(module, [])
  assert all(isinstance(o, np.ndarray) for o in out), out
  np.testing.assert_array_equal(out[0], [3, 5, 7])
  assert out[1] == 4


def test_generic_reduce_body_runs_the_region():
  # (1 + a)(1 + b) - 1: associative, identity 0, but no monoid jax knows.
  f = lambda x: lax.reduce(x, np.float32(0), lambda a, b: a + b + a * b, (1,))
  g, _ = _check(f, X / 4, grad=True, tol=1e-6)
  assert "reduce[" in _jaxpr(g, X)


def test_variadic_monoids():
  f = lambda x, y: lax.reduce((x, y), (np.float32(0), np.int32(np.iinfo(np.int32).min)),
                              lambda a, b: (a[0] + b[0], lax.max(a[1], b[1])), (0,))
  _check(f, X, XI)


# --------------------------------------------------------------------------- argmax / argmin

def test_argmax_argmin_ties_and_nans():
  f = lambda x: [(fn(x, axis=0), fn(x, axis=1)) for fn in (jnp.argmax, jnp.argmin)]
  g, _ = _check(f, TIES, ops=["stablehlo.reduce"], vmap=True)
  assert "argmax" in _jaxpr(g, TIES) and "argmin" in _jaxpr(g, TIES)
  _check(f, XI)


def test_argmax_of_all_minus_inf_and_max_with_argmax():
  x = np.array([[-np.inf, -np.inf], [1.0, np.inf]], np.float32)
  _check(lambda x: (jnp.argmax(x, axis=1), jnp.argmin(-x, axis=1)), x)
  _check(lambda x: (jnp.max(x, axis=1), jnp.argmax(x, axis=1)), X)


_VALUE_INDEX_MODULE = """
func.func @main(%x: tensor<2x3xf32>, %i: tensor<2x3xi32>) -> (tensor<3xf32>, tensor<3xi32>) {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %r:2 = stablehlo.reduce(%x init: %ninf), (%i init: %zero) across dimensions = [0]
      : (tensor<2x3xf32>, tensor<2x3xi32>, tensor<f32>, tensor<i32>) -> (tensor<3xf32>, tensor<3xi32>)
   reducer(%a: tensor<f32>, %b: tensor<f32>) (%ia: tensor<i32>, %ib: tensor<i32>) {
    %gt = stablehlo.compare GT, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %nan = stablehlo.compare NE, %a, %a, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %p = stablehlo.or %gt, %nan : tensor<i1>
    %eq = stablehlo.compare EQ, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
    %lt = stablehlo.compare LT, %ia, %ib, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %tie = stablehlo.and %eq, %lt : tensor<i1>
    %q = stablehlo.or %p, %tie : tensor<i1>
    %v = stablehlo.select %p, %a, %b : tensor<i1>, tensor<f32>
    %j = stablehlo.select %q, %ia, %ib : tensor<i1>, tensor<i32>
    stablehlo.return %v, %j : tensor<f32>, tensor<i32>
  }
  return %r#0, %r#1 : tensor<3xf32>, tensor<3xi32>
}"""


def test_value_index_reduce_with_any_index_operand():
  g = _as_fn(stablehlo.load_module(_VALUE_INDEX_MODULE))
  x = np.array([[1.0, np.nan, 2.0], [1.0, 5.0, 7.0]], np.float32)
  i = np.array([[7, 3, 4], [2, 9, -1]], np.int32)
  for fn in (g, jax.jit(g)):
    v, j = fn(jnp.asarray(x), jnp.asarray(i))
    np.testing.assert_array_equal(v, [1.0, np.nan, 7.0])
    np.testing.assert_array_equal(j, [2, 3, -1])   # ties take the smaller index value


# --------------------------------------------------------------------------- cumulative windows

_CUMULATIVE = (lax.cumsum, lax.cumprod, lax.cummax, lax.cummin)


def test_cumulative_windows_become_cumulative_ops():
  f = lambda x: [(fn(x, axis=1), fn(x, axis=0, reverse=True)) for fn in _CUMULATIVE]
  g, _ = _check(f, X, ops=["stablehlo.reduce_window"], grad=True, vmap=True, tol=1e-6)
  jaxpr = _jaxpr(g, X)
  assert all(fn.__name__ in jaxpr for fn in _CUMULATIVE) and "reduce_window" not in jaxpr, jaxpr


def test_jnp_cumulative_functions_along_axes():
  _check(lambda x: (jnp.cumsum(x, axis=0), jnp.cumprod(x), jnp.cumsum(x, axis=1, dtype=jnp.int32)), X, tol=1e-6)
  _check(lambda x: (jnp.cumsum(x, axis=0), lax.cummax(x, axis=1, reverse=True)), XI)


def test_cumlogsumexp_is_recognised():
  g, _ = _check(lambda x: lax.cumlogsumexp(x, axis=1, reverse=True), X, grad=True, tol=1e-5)
  assert "cumlogsumexp" in _jaxpr(g, X) and "reduce_window" not in _jaxpr(g, X)


# --------------------------------------------------------------------------- pooling

def _pool(x, init, op, window, strides, padding, **kw):
  return lax.reduce_window(x, init, op, window, strides, padding, **kw)


IMG = (np.arange(2 * 5 * 5 * 1, dtype=np.float32).reshape(2, 5, 5, 1) * 0.37) % 3 - 1


def test_avg_and_max_pooling():
  avg = lambda x: _pool(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9.0
  mx = lambda x: _pool(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 2, 1), "VALID")
  mn = lambda x: _pool(x, jnp.inf, lax.min, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")
  _check(lambda x: (avg(x), mx(x), mn(x)), IMG, ops=["stablehlo.reduce_window"], grad=True, jvp=True, vmap=True,
         tol=1e-6)


def test_flax_pooling():
  nn = pytest.importorskip("flax.linen")
  x = IMG
  _check(lambda x: (nn.avg_pool(x, (2, 2), strides=(2, 2), padding="SAME"),
                    nn.max_pool(x, (3, 3), strides=(1, 1), padding="SAME")), x, grad=True, tol=1e-6)


def test_dilated_windows_and_non_identity_init():
  x = X[0]
  _check(lambda x: _pool(x, 0.0, lax.add, (2,), (1,), [(1, 2)], base_dilation=(2,), window_dilation=(2,)), x,
         grad=True)
  _check(lambda x: (_pool(x, 1.0, lax.add, (2,), (1,), [(1, 1)], base_dilation=(2,)),    # init once a window
                    _pool(x, 10.0, lax.add, (4,), (1,), [(3, 0)]),
                    _pool(x, -1.0, lambda a, b: a + b, (4,), (1,), [(0, 4)])), x)
  _check(lambda x: (_pool(x, 2, lax.max, (1, 3), (1, 1), [(0, 0), (2, 1)]),
                    _pool(x, 5, lax.min, (1, 4), (1, 1), [(0, 0), (4, 0)])), XI)


def test_generic_window_body_runs_the_region():
  f = lambda x: _pool(x, -jnp.inf, jnp.logaddexp, (1, 2), (1, 1), [(0, 0), (1, 0)])
  _check(f, X, jvp=True, tol=1e-6)


# --------------------------------------------------------------------------- select_and_scatter

def _grad(f):
  return jax.grad(lambda x: jnp.sum(jnp.sin(f(x)) * jnp.arange(f(x).size).reshape(f(x).shape)))


@pytest.mark.parametrize("window, strides, padding", [((1, 2, 2, 1), (1, 2, 2, 1), "SAME"),
                                                      ((1, 3, 2, 1), (1, 2, 1, 1), [(0, 0), (1, 1), (0, 1), (0, 0)])])
def test_max_pool_gradient_is_select_and_scatter(window, strides, padding):
  ties = jnp.round(IMG)   # many ties: the first maximum of each window takes the gradient
  f = lambda x: (_grad(lambda x: _pool(x, -jnp.inf, lax.max, window, strides, padding))(x),
                 _grad(lambda x: _pool(x, jnp.inf, lax.min, window, strides, padding))(x))
  _check(f, ties, ops=["stablehlo.select_and_scatter"], tol=1e-6, vmap=padding == "SAME")


def test_flax_max_pool_gradient():
  nn = pytest.importorskip("flax.linen")
  f = _grad(lambda x: nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME"))
  _check(f, IMG, ops=["stablehlo.select_and_scatter"], tol=1e-6)


def _select_and_scatter_module(direction: str, scatter: str, init: str) -> str:
  return f"""
func.func @main(%x: tensor<6xf32>, %s: tensor<3xf32>) -> tensor<6xf32> {{
  %init = stablehlo.constant dense<{init}> : tensor<f32>
  %0 = "stablehlo.select_and_scatter"(%x, %s, %init) <{{window_dimensions = array<i64: 3>,
      window_strides = array<i64: 2>, padding = dense<[[1, 0]]> : tensor<1x2xi64>}}> ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %c = stablehlo.compare {direction}, %a, %b, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
  }}, {{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %c = stablehlo.{scatter} %a, %b : tensor<f32>
      stablehlo.return %c : tensor<f32>
  }}) : (tensor<6xf32>, tensor<3xf32>, tensor<f32>) -> tensor<6xf32>
  return %0 : tensor<6xf32>
}}"""


def _select_and_scatter_reference(x, s, init, select, scatter):
  """XLA's definition: each window (padding skipped) keeps its first element unless select says otherwise."""
  out = np.full_like(x, init)
  padded = [None] + list(x)   # low padding 1
  for w in range(len(s)):
    best = None
    for k in range(2 * w, 2 * w + 3):
      if k < len(padded) and padded[k] is not None and (best is None or not select(padded[best], padded[k])):
        best = k
    out[best - 1] = scatter(out[best - 1], s[w])
  return out


@pytest.mark.parametrize("direction, select", [("GE", np.greater_equal), ("GT", np.greater), ("LT", np.less)])
@pytest.mark.parametrize("scatter, init, combine", [("add", "0.0", np.add), ("add", "1.5", np.add),
                                                    ("maximum", "-1.0", np.maximum)])
def test_select_and_scatter_general(direction, select, scatter, init, combine):
  g = _as_fn(stablehlo.load_module(_select_and_scatter_module(direction, scatter, init)))
  x = np.array([2.0, 5.0, 5.0, 1.0, 1.0, 3.0], np.float32)
  s = np.array([10.0, 20.0, 30.0], np.float32)
  want = _select_and_scatter_reference(x, s, np.float32(init), select, combine)
  _same(g(jnp.asarray(x), jnp.asarray(s)), want)
  _same(jax.jit(g)(x, s), want)
  _same(jax.vmap(g, in_axes=(None, 0))(x, jnp.stack([s, s])), np.stack([want, want]))
  if scatter == "add":   # linear in the source: each window's weight is its selected element's
    picked = [np.argmax(_select_and_scatter_reference(x, np.eye(3, dtype=np.float32)[k], 0, select, np.add))
              for k in range(3)]
    _same(jax.grad(lambda s: jnp.sum(g(x, s) * jnp.arange(6.0)))(jnp.asarray(s)), np.asarray(picked, np.float32))


# --------------------------------------------------------------------------- sort

def test_sort_and_argsort_with_nans_zeros_and_ties():
  _check(lambda x: (jnp.sort(x, axis=0), jnp.argsort(x, axis=1, stable=True), jnp.sort(x, axis=1, descending=True),
                    jnp.argsort(x, axis=0, descending=True)), TIES, ops=["stablehlo.sort"], vmap=True)
  _check(lambda x: (jnp.sort(x, axis=1), jnp.argsort(-x, axis=0)), XI)


def test_sort_is_lax_sort_and_differentiable():
  g, _ = _check(lambda x: jnp.sort(x, axis=1), X, grad=True, jvp=True, vmap=True)
  jaxpr = _jaxpr(g, X)
  assert jaxpr.count("sort[") == 1 and "num_keys=1" in jaxpr and "reduce_sum" not in jaxpr, jaxpr


def test_lexsort_and_multi_key_sort():
  keys = np.array([[1.0, 0.0, 1.0, 0.0, 1.0], [3.0, 2.0, 1.0, 2.0, 3.0]], np.float32)
  _check(lambda k: jnp.lexsort((k[1], k[0])), keys)
  f = lambda a, b: lax.sort((a, b, jnp.arange(5, dtype=jnp.int32)), num_keys=2)
  g, _ = _check(f, keys[0], keys[1])
  jaxpr = _jaxpr(g, keys[0], keys[1])
  assert "num_keys=2" in jaxpr and "reduce_sum" not in jaxpr, jaxpr
  _check(lambda a, b: lax.sort((a, b), num_keys=2)[1], keys[0], keys[1], grad=True)


def test_sort_other_dtypes():
  c = (X + 1j * X[::-1]).astype(np.complex64)
  c[0, 1] = c[0, 0]
  _check(lambda c: jnp.sort(c, axis=1), c)
  _check(lambda x: (jnp.sort(x > 1, axis=1), jnp.sort(x.astype(jnp.bfloat16), axis=0)), X)


def test_top_k():
  _check(lambda x: lax.top_k(x, 3), TIES, vmap=True)
  _check(lambda x: lax.top_k(x, 2)[0], X, grad=True)
  _check(lambda x: lax.top_k(x, 2), XI)


_ABS_SORT = """
func.func @main(%x: tensor<2x5xf32>, %i: tensor<2x5xi32>) -> (tensor<2x5xf32>, tensor<2x5xi32>) {
  %0:2 = "stablehlo.sort"(%x, %i) <{dimension = 1 : i64, is_stable = true}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>, %ia: tensor<i32>, %ib: tensor<i32>):
      %aa = stablehlo.abs %a : tensor<f32>
      %ab = stablehlo.abs %b : tensor<f32>
      %c = stablehlo.compare LT, %aa, %ab, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      stablehlo.return %c : tensor<i1>
  }) : (tensor<2x5xf32>, tensor<2x5xi32>) -> (tensor<2x5xf32>, tensor<2x5xi32>)
  return %0#0, %0#1 : tensor<2x5xf32>, tensor<2x5xi32>
}"""


def _abs_sorted(x):
  order = np.argsort(np.abs(x), axis=-1, kind="stable")
  return np.take_along_axis(x, order, -1), order.astype(np.int32)


def test_unrecognised_comparators_rank_sort_small_sorts(monkeypatch):
  g = _as_fn(stablehlo.load_module(_ABS_SORT))
  x = np.array([[3.0, -1.0, 1.0, -3.0, 0.5], [2.0, -2.0, 2.0, 0.0, -0.0]], np.float32)
  i = np.tile(np.arange(5, dtype=np.int32), (2, 1))
  _same(g(jnp.asarray(x), jnp.asarray(i)), _abs_sorted(x))
  _same(jax.jit(g)(x, i), _abs_sorted(x))
  batch = np.stack([x, x[::-1] * 2])
  _same(jax.vmap(g)(jnp.asarray(batch), jnp.stack([i, i])), _abs_sorted(batch))
  grad = jax.grad(lambda x: jnp.sum(g(x, i)[0] * jnp.arange(5.0)))(jnp.asarray(x))
  inverse = np.argsort(_abs_sorted(x)[1], axis=1)   # where each element lands
  _same(grad, inverse.astype(np.float32))
  monkeypatch.setattr(reduce_family, "_RANK_SORT_LIMIT", 10)
  with pytest.raises(jaxport.StableHLOError, match=r"comparator \(stablehlo.abs"):
    g(jnp.asarray(x), jnp.asarray(i))


def test_chlo_top_k_op():
  text = """
func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x2xf32>, tensor<2x2xi32>) {
  %v, %i = chlo.top_k(%x, k = 2) : tensor<2x4xf32> -> (tensor<2x2xf32>, tensor<2x2xi32>)
  return %v, %i : tensor<2x2xf32>, tensor<2x2xi32>
}"""
  g = _as_fn(stablehlo.load_module(text))
  _same(g(jnp.asarray(X[:2])), lax.top_k(jnp.asarray(X[:2]), 2))


def test_approx_top_k_runs_exactly_as_on_cpu():
  _check(lambda x: (lax.approx_max_k(x, 2), lax.approx_min_k(x, 2, reduction_dimension=0)), X)


def test_shape_polymorphic_windows_and_top_k():
  """Symbolic shapes make jax emit custom_calls dynamic_reduce_window and dynamic_top_k."""
  f = lambda x: (jnp.cumsum(x, axis=1), _pool(x, -jnp.inf, lax.max, (1, 2), (1, 1), "SAME"),
                 lax.top_k(x, x.shape[1]))
  specs = jax.export.symbolic_args_specs((X,), "b, n")
  module = stablehlo.load_module(jax.export.export(jax.jit(f), platforms=["cpu"])(*specs).mlir_module_serialized)
  assert stablehlo.unsupported_ops(module) == {}
  g = _as_fn(module)
  for x in (X, X[:2, :3]):
    _same(g(jnp.asarray(x)), f(jnp.asarray(x)))
    _same(jax.jit(g)(x), f(jnp.asarray(x)))
  grad = jax.grad(lambda x: jnp.sum(jnp.sin(g(x)[0])))(jnp.asarray(X))
  _same(grad, jax.grad(lambda x: jnp.sum(jnp.sin(f(x)[0])))(jnp.asarray(X)), 1e-6)


# --------------------------------------------------------------------------- TF's lowering

def _tf_module(f, *specs):
  tf = pytest.importorskip("tensorflow")
  fn = tf.function(f, jit_compile=True, autograph=False)
  module = stablehlo.load_module(fn.experimental_get_compiler_ir(*specs)(stage="stablehlo_serialized"))
  missing = stablehlo.unsupported_ops(module)
  assert not missing, missing
  return fn, _as_fn(module)


def _tf_check(f, *args):
  import tensorflow as tf
  fn, g = _tf_module(f, *[tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in args])
  want = [np.asarray(t) for t in tf.nest.flatten(fn(*args))]
  got = g(*[jnp.asarray(a) for a in args])
  got = list(got) if isinstance(got, tuple) else [got]
  for a, b in zip(got, want):
    np.testing.assert_allclose(np.asarray(a), b.astype(np.asarray(a).dtype), rtol=1e-6)
  return g


def test_tf_lowerings():
  import tensorflow as tf  # noqa: F401  (skipped inside when missing)
  nans = np.array([[1.0, np.nan, 3.0, 0.0], [np.nan, 2.0, 2.0, 1.0], [2.0, 5.0, 0.0, np.nan],
                   [np.nan, np.nan, -1.0, -1.0]], np.float32)   # XLA folds in order: a NaN lasts one step
  _tf_check(lambda x, y: (tf.argmax(x, axis=1), tf.argmin(x, axis=1), tf.argmax(x, axis=0),
                          tf.argmax(y, axis=1, output_type=tf.int32), tf.argmin(y, axis=0, output_type=tf.int32),
                          tf.sort(y, axis=1), tf.argsort(y, axis=1, direction="DESCENDING"), tf.math.top_k(y, 2)),
            nans, np.round(X))
  _tf_check(lambda x: (tf.cumsum(x, axis=1, exclusive=True), tf.cumsum(x, axis=0, reverse=True),
                       tf.math.cumprod(x, axis=1), tf.math.cumulative_logsumexp(x, axis=1)), X)
  x, g = np.round(IMG[:1]), np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
  _tf_check(lambda x, g: (tf.raw_ops.MaxPoolGrad(orig_input=x, orig_output=tf.nn.max_pool2d(x, 2, 2, "SAME"), grad=g,
                                                 ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="SAME"),
                          tf.nn.avg_pool2d(x, 2, 2, "SAME")), x, g)


@pytest.mark.parametrize("cumulative", [lax.cumlogsumexp, lax.cummax, lax.cummin, lax.cumsum])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumulative_ops_over_an_axis_of_one_differentiate_as_jax(cumulative, reverse):
  # Found by test_fuzz_interpreter. One-element windows: logaddexp's body (no monoid) went to the generic
  # lax.reduce_window, which JAX cannot reverse-differentiate ("Linearization failed"); max's went to a
  # window max whose derivative drops the tangent of an element equal to its -inf init.
  f = lambda x: cumulative(x, axis=1, reverse=reverse) * 2.0
  x = np.array([[0.5], [-1.0], [-np.inf], [np.inf]], np.float32)
  g = _as_fn(_module(f, x))
  _same(jax.jit(g)(x), f(x))
  loss = lambda fn: lambda x: jnp.sum(fn(x) * np.arange(1, 5, dtype=np.float32)[:, None])
  _same(jax.grad(loss(g))(x), jax.grad(loss(f))(x), tol=1e-6)
  _same(jax.jit(jax.grad(loss(g)))(x), jax.grad(loss(f))(x), tol=1e-6)
  t = np.arange(4, dtype=np.float32)[:, None] + 1
  _same(jax.jvp(g, (x,), (t,))[1], jax.jvp(f, (x,), (t,))[1], tol=1e-6)


def test_max_tangent_survives_a_recomputed_operand():
  # XLA may recompute max's operand in another fusion with other rounding; a row where no element then
  # equals the max took JAX's 0/0 (DeBERTa-v3's softmax under jit(jvp): NaN on every output).
  from jaxport.convert.stablehlo.reduce import chooser_tangent
  x = np.array([[1.0, 3.0, 2.0], [5.0, 5.0, -1.0], [np.nan, 0.0, 1.0]], np.float32)
  t = np.array([[10.0, 20.0, 30.0], [1.0, 3.0, 7.0], [4.0, 5.0, 6.0]], np.float32)
  out = np.max(x, axis=1)
  # Consistent: JAX's rule (ties averaged).
  np.testing.assert_allclose(chooser_tangent("maximum", (1,), x, out, t), [20.0, 2.0, 0.0])
  # Row 0's max rounded differently: its arg-max's tangent, finite.
  drifted = out + np.array([1e-6, 0, 0], np.float32)
  np.testing.assert_allclose(chooser_tangent("maximum", (1,), x, drifted, t), [20.0, 2.0, 0.0])
  np.testing.assert_allclose(chooser_tangent("minimum", (0, 1), x[:2], np.float32(-1.0 - 1e-6), t[:2]), 7.0)


def test_softmax_of_an_exported_module_differentiates_like_jax():
  def f(s):
    s = jnp.where(np.arange(8) < 6, s, -1e9)
    return jax.nn.softmax(s, axis=-1) * np.cos(np.arange(8, dtype=np.float32))
  s = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32)
  module = stablehlo.load_module(jax.export.export(jax.jit(f))(s).mlir_module_serialized)
  g = lambda s: stablehlo.call_module(module, [s])[0]
  t = np.sin(s)
  np.testing.assert_allclose(jax.jit(lambda s, t: jax.jvp(g, (s,), (t,))[1])(s, t), jax.jvp(f, (s,), (t,))[1],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jit(jax.grad(lambda s: g(s).sum()))(s), jax.grad(lambda s: f(s).sum())(s),
                             rtol=1e-5, atol=1e-6)
  batch = np.stack([s, -s])
  np.testing.assert_allclose(jax.vmap(jax.grad(lambda s: g(s).sum()))(batch),
                             jax.vmap(jax.grad(lambda s: f(s).sum()))(batch), rtol=1e-5, atol=1e-6)
