"""StableHLO gather, scatter, dynamic_slice and dynamic_update_slice, from jax.export modules."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hlo_support import as_fn, exported
from jaxport.convert import stablehlo




def _module(f, *args):
  return exported(f, *args)[0]


def _interpreted(f, *args):
  module = _module(f, *args)
  return as_fn(module), module


def _check(f, *args, ops=(), grad=None, vmap=True):
  """g matches f under jit and eagerly on NumPy args (constants to the interpreter); optionally its
  gradient in the `grad` args, and vmap over args[0]. Traced runs are jitted: op-by-op dispatch is slow."""
  g, module = _interpreted(f, *args)
  for op in ops:
    assert op in module.op_names(), module.op_names()
  args = [jnp.asarray(a) for a in args]
  want = f(*args)
  for got in (jax.jit(g)(*args), g(*[np.asarray(a) for a in args])):
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), got, want)
  if grad is not None:
    loss = lambda fn: jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(fn(*a))), grad))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), loss(g)(*args),
                 loss(f)(*args))
  if vmap:
    batch = jnp.stack([args[0], args[0] * 2 if args[0].dtype != jnp.bool_ else ~args[0]])
    mapped = lambda fn: jax.jit(jax.vmap(lambda x: fn(x, *args[1:])))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), mapped(g)(batch),
                 mapped(f)(batch))
  return g


X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
IDX = np.array([2, 0, 2], np.int32)


def test_integer_array_index_is_a_gather():
  _check(lambda x, i: x[i], X, IDX, ops=["stablehlo.gather"], grad=0)


def test_take_and_take_along_axis():
  _check(lambda x, i: jnp.take(x, i, axis=1, mode="clip"), X, IDX, ops=["stablehlo.gather"], grad=0)
  idx = np.array([[0, 3], [1, 1], [2, 0]], np.int32)
  _check(lambda x, i: jnp.take_along_axis(x, i, axis=1, mode="clip"), X, idx, ops=["stablehlo.gather"], grad=0)


def test_take_fill_mode():   # jnp.take's default: out-of-range reads give NaN (a gather plus a mask)
  _check(lambda x, i: jnp.take(x, i, axis=1), X, np.array([1, 7], np.int32), grad=0)


def test_gather_clamps_out_of_range_starts_and_its_gradient_clamps_too():
  # mode="clip" lowers to a bare stablehlo.gather: StableHLO itself clamps.
  f = lambda x, i: x.at[i].get(mode="clip")
  idx = np.array([5, -3, 1], np.int32)
  g = _check(f, X, idx, ops=["stablehlo.gather"], grad=0)
  np.testing.assert_array_equal(g(X, idx), X[[2, 0, 1]])


def test_vmapped_indexing_has_batching_dims():
  f = jax.vmap(lambda x, i: x[i])
  idx = np.array([1, 3, 0], np.int32)
  g, module = _interpreted(f, X, idx)
  gather = [op for m in [module] for fn in m.functions.values() for op in fn.block.ops
            if op.name == "stablehlo.gather"]
  assert gather and gather[0].attrs["dimension_numbers"]["operand_batching_dims"] == [0]
  _check(f, X, idx, grad=0)


def test_traced_indices_under_vmap_and_jvp():
  g, _ = _interpreted(lambda x, i: x[i], X, IDX)
  idxs = np.array([[0, 1, 2], [2, 2, 0]], np.int32)
  np.testing.assert_array_equal(jax.jit(jax.vmap(g, (None, 0)))(X, idxs), X[idxs])
  t = np.ones_like(X)
  primal, tangent = jax.jit(lambda x, t: jax.jvp(lambda x: g(x, IDX), (x,), (t,)))(X, t)
  np.testing.assert_array_equal(tangent, t[IDX])


@pytest.mark.parametrize("method", ["set", "add", "multiply", "min", "max"])
def test_scatter_combiners(method):
  f = lambda x, i, u: getattr(x.at[i], method)(u)
  u = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
  _check(f, X, IDX, u, ops=["stablehlo.scatter"], grad=(0, 2) if method in ("set", "add") else None)


def test_scatter_drops_out_of_range_updates():
  f = lambda x, i, u: x.at[i].add(u, mode="drop")
  idx = np.array([7, 1, -9], np.int32)
  u = np.ones((3, 4), np.float32)
  g = _check(f, X, idx, u, ops=["stablehlo.scatter"], grad=(0, 2))
  want = X.copy()
  want[1] += 1
  np.testing.assert_array_equal(g(X, idx, u), want)


def test_integer_and_bool_scatters():
  x = np.arange(6, dtype=np.int32)
  _check(lambda x, i: x.at[i].add(3), x, np.array([1, 1, 4], np.int32), ops=["stablehlo.scatter"])
  b = np.zeros(5, np.bool_)
  _check(lambda b, i: b.at[i].set(True), b, np.array([0, 3], np.int32))
  _check(lambda b, i: b.at[i].max(True), b, np.array([0, 3], np.int32))
  _check(lambda b, i: (~b).at[i].min(False), b, np.array([4, 1], np.int32))
  dnums = lax.ScatterDimensionNumbers((), (0,), (0,))
  _check(lambda x, i, u: lax.scatter_sub(x, i, u, dnums), x, np.array([[1], [1], [5]], np.int32),
         np.array([3, 4, 5], np.int32))


@pytest.mark.parametrize("dtype, want", [("i1", [True, True, False, True]), ("i32", [1, 7, 0, 9])])
def test_or_regions(dtype, want):   # TF's forms: a bool `or` is scatter_max; an int `or` runs as the loop
  np_dtype = np.bool_ if dtype == "i1" else np.int32
  module = stablehlo.load_module(f"""
    func.func @main(%x: tensor<4x{dtype}>, %i: tensor<3x1xi32>, %u: tensor<3x{dtype}>) -> tensor<4x{dtype}> {{
      %0 = "stablehlo.scatter"(%x, %i, %u) <{{scatter_dimension_numbers = #stablehlo.scatter<
          inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}}> ({{
        ^bb0(%a: tensor<{dtype}>, %b: tensor<{dtype}>):
          %o = stablehlo.or %b, %a : tensor<{dtype}>
          stablehlo.return %o : tensor<{dtype}>
      }}) : (tensor<4x{dtype}>, tensor<3x1xi32>, tensor<3x{dtype}>) -> tensor<4x{dtype}>
      return %0 : tensor<4x{dtype}>
    }}""")
  x = np.array([1, 0, 0, 8]).astype(np_dtype)
  i, u = np.array([[1], [1], [3]], np.int32), np.array([3, 4, 1]).astype(np_dtype)
  run = lambda *a: stablehlo.call_module(module, list(a))[0]
  for fn in (run, jax.jit(run)):
    np.testing.assert_array_equal(fn(x, i, u), np.array(want).astype(np_dtype))


def test_one_hot_via_scatter():
  f = lambda i: jnp.zeros((3, 5), jnp.float32).at[jnp.arange(3), i].set(1.0)
  g, _ = _interpreted(f, IDX)
  np.testing.assert_array_equal(g(IDX), np.eye(5, dtype=np.float32)[IDX])
  np.testing.assert_array_equal(jax.jit(g)(IDX), np.eye(5, dtype=np.float32)[IDX])


def test_vmapped_scatter_has_batching_dims():
  f = jax.vmap(lambda x, i, u: x.at[i].add(u))
  idx = np.array([1, 3, 1], np.int32)
  u = np.array([10.0, 20.0, 30.0], np.float32)
  _check(f, X, idx, u, ops=["stablehlo.scatter"], grad=(0, 2))


def test_general_update_region_runs_as_a_loop():
  f = lambda x, i: x.at[i].apply(lambda v: v * v + 1.0)
  idx = np.array([0, 2], np.int32)
  g = _check(f, X, idx)
  same = lambda x: x.at[idx].set(x[idx] * x[idx] + 1.0)   # jax has no scatter_apply gradient; we do
  np.testing.assert_allclose(jax.jit(jax.grad(lambda x: jnp.sin(g(x, idx)).sum()))(X),
                             jax.grad(lambda x: jnp.sin(same(x)).sum())(X), rtol=1e-6)
  # Written by hand: a region jax never emits (a - b * 2), with a repeated index.
  text = """
    func.func @main(%x: tensor<4xf32>, %i: tensor<3x1xi32>, %u: tensor<3xf32>) -> tensor<4xf32> {
      %0 = "stablehlo.scatter"(%x, %i, %u) <{scatter_dimension_numbers = #stablehlo.scatter<
          inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
        ^bb0(%a: tensor<f32>, %b: tensor<f32>):
          %c = stablehlo.constant dense<2.0> : tensor<f32>
          %m = stablehlo.multiply %b, %c : tensor<f32>
          %s = stablehlo.subtract %a, %m : tensor<f32>
          stablehlo.return %s : tensor<f32>
      }) : (tensor<4xf32>, tensor<3x1xi32>, tensor<3xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
  module = stablehlo.load_module(text)
  x, i, u = np.ones(4, np.float32), np.array([[1], [3], [1]], np.int32), np.array([1, 2, 3], np.float32)
  g = lambda x, u: stablehlo.call_module(module, [x, i, u])[0]
  np.testing.assert_array_equal(g(x, u), [1, -7, 1, -3])
  np.testing.assert_array_equal(jax.jit(jax.grad(lambda u: g(x, u).sum()))(u), [-2, -2, -2])


def test_variadic_scatter():
  text = """
    func.func @main(%x: tensor<3xf32>, %y: tensor<3xi32>, %i: tensor<2xi32>, %u: tensor<2xf32>, %v: tensor<2xi32>)
        -> (tensor<3xf32>, tensor<3xi32>) {
      %0:2 = "stablehlo.scatter"(%x, %y, %i, %u, %v) <{scatter_dimension_numbers = #stablehlo.scatter<
          inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}> ({
        ^bb0(%a: tensor<f32>, %b: tensor<i32>, %c: tensor<f32>, %d: tensor<i32>):
          %s = stablehlo.add %a, %c : tensor<f32>
          %t = stablehlo.maximum %b, %d : tensor<i32>
          stablehlo.return %s, %t : tensor<f32>, tensor<i32>
      }) : (tensor<3xf32>, tensor<3xi32>, tensor<2xi32>, tensor<2xf32>, tensor<2xi32>) -> (tensor<3xf32>, tensor<3xi32>)
      return %0#0, %0#1 : tensor<3xf32>, tensor<3xi32>
    }"""
  module = stablehlo.load_module(text)
  args = [np.zeros(3, np.float32), np.array([5, 5, 5], np.int32), np.array([2, 2], np.int32),
          np.array([1.5, 2.0], np.float32), np.array([9, 1], np.int32)]
  x, y = jax.jit(lambda *a: stablehlo.call_module(module, list(a)))(*args)
  np.testing.assert_array_equal(x, [0, 0, 3.5])
  np.testing.assert_array_equal(y, [5, 5, 9])


def test_dynamic_slice_with_traced_starts_clamps():
  f = lambda x, i: lax.dynamic_slice(x, (i, i + 1), (2, 2))
  g = _check(f, X, np.int32(1), ops=["stablehlo.dynamic_slice"], grad=0)
  for i in (-5, 0, 2, 9):
    np.testing.assert_array_equal(g(X, np.int32(i)), f(X, np.int32(i)))   # constants
    np.testing.assert_array_equal(jax.jit(g)(X, np.int32(i)), f(X, np.int32(i)))


def test_dynamic_update_slice():
  f = lambda x, u, i: lax.dynamic_update_slice(x, u, (i, np.int32(2)))
  u = np.full((2, 2), -1.0, np.float32)
  g = _check(f, X, u, np.int32(2), ops=["stablehlo.dynamic_update_slice"], grad=(0, 1))
  for i in (-3, 1, 5):
    np.testing.assert_array_equal(g(X, u, np.int32(i)), f(X, u, np.int32(i)))   # constants
    np.testing.assert_array_equal(jax.jit(g)(X, u, np.int32(i)), f(X, u, np.int32(i)))


def test_roll():
  _check(lambda x: jnp.roll(x, 1, 0), X, grad=0)
  _check(lambda x, s: jnp.roll(x, s, 1), X, np.int32(3), grad=0)


def test_constant_operands_stay_numpy():
  text = """
    func.func @main() -> (tensor<2xi64>, tensor<2xi32>) {
      %x = stablehlo.constant dense<[10, 20, 30, 40]> : tensor<4xi64>
      %i = stablehlo.constant dense<[[3], [9]]> : tensor<2x1xi32>
      %0 = "stablehlo.gather"(%x, %i) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0],
          start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1>}>
          : (tensor<4xi64>, tensor<2x1xi32>) -> tensor<2xi64>
      %s = stablehlo.constant dense<1> : tensor<i32>
      %y = stablehlo.constant dense<[1, 2, 3]> : tensor<3xi32>
      %1 = stablehlo.dynamic_slice %y, %s, sizes = [2] : (tensor<3xi32>, tensor<i32>) -> tensor<2xi32>
      return %0, %1 : tensor<2xi64>, tensor<2xi32>
    }"""
  module = stablehlo.load_module(text)
  def run():
    out = stablehlo.call_module(module, [])
    assert all(isinstance(v, np.ndarray) for v in out)   # even under jit
    return out
  out = jax.jit(run)()
  np.testing.assert_array_equal(out[0], [40, 40])
  np.testing.assert_array_equal(out[1], [2, 3])


@pytest.mark.parametrize("index_vector_dim, indices", [
    (0, np.array([[2, 0, 1], [3, 1, 0]], np.int32)),   # index vectors along the first axis
    (2, np.array([[2, 0], [1, 1]], np.int32)),   # index_vector_dim == rank: scalar indices
])
def test_gather_index_vector_dim_anywhere(index_vector_dim, indices):
  rank = indices.ndim
  start_index_map = "[0, 1]" if index_vector_dim == 0 else "[0]"
  collapsed = "[0, 1]" if index_vector_dim == 0 else "[0]"
  sizes = "1, 1" if index_vector_dim == 0 else "1, 4"
  out_shape = [3] if index_vector_dim == 0 else list(indices.shape) + [4]
  offset = "" if index_vector_dim == 0 else f"offset_dims = [{rank}], "
  ivd = index_vector_dim if index_vector_dim == 0 else rank
  ty = lambda shape, t: f"tensor<{'x'.join(map(str, shape))}x{t}>"
  module = stablehlo.load_module(f"""
    func.func @main(%x: tensor<3x4xf32>, %i: {ty(indices.shape, 'i32')}) -> {ty(out_shape, 'f32')} {{
      %0 = "stablehlo.gather"(%x, %i) <{{dimension_numbers = #stablehlo.gather<{offset}collapsed_slice_dims =
          {collapsed}, start_index_map = {start_index_map}, index_vector_dim = {ivd}>,
          slice_sizes = array<i64: {sizes}>}}> : (tensor<3x4xf32>, {ty(indices.shape, 'i32')}) -> {ty(out_shape, 'f32')}
      return %0 : {ty(out_shape, 'f32')}
    }}""")
  run = jax.jit(lambda x, i: stablehlo.call_module(module, [x, i])[0])
  want = X[indices[0], indices[1]] if index_vector_dim == 0 else X[indices]
  np.testing.assert_array_equal(run(X, indices), want)
  np.testing.assert_array_equal(stablehlo.call_module(module, [X, indices])[0], want)


def test_vmapped_general_region_loop_with_batching_dims():
  f = jax.vmap(lambda x, i: x.at[i].apply(lambda v: v * v + 1.0))
  idx = np.array([1, 3, 1], np.int32)
  g, module = _interpreted(f, X, idx)
  scatter, = [op for fn in module.functions.values() for op in fn.block.ops if op.name == "stablehlo.scatter"]
  assert scatter.attrs["scatter_dimension_numbers"]["input_batching_dims"] == [0]
  np.testing.assert_array_equal(jax.jit(g)(X, idx), f(X, idx))
  np.testing.assert_array_equal(g(X, idx), f(X, idx))
