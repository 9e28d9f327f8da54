"""The `Xla*` ops (jax2tf's graph serialization) against TF's XLA kernels.

These ops only have XLA kernels, so the TF oracle runs with `jit_compile=True`,
and TF registers no gradient for most of them: gradients are checked against
`tf.GradientTape` through an equivalent TF function of ordinary ops (`grad_ref`),
or numerically (`numeric_grad`) where TF has nothing to compare with.
"""
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tree
from jax.test_util import check_grads
from tensorflow.compiler.tf2xla.ops import gen_xla_ops
from tensorflow.compiler.tf2xla.python import xla

import jaxport
from jaxport.convert import _tf_compat
from jaxport.convert.graph import Library, Node
from jaxport.convert.interpreter import OpContext, Runtime
from jaxport.convert.ops import math as math_rules
from jaxport.convert.registry import supported_ops
from oracle import assert_close

pb = _tf_compat.xla_data_pb2()
RAW = tf.raw_ops


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


def body(fn, *dtypes):
  """A TF library function of scalars (a reducer, comparator or scatter update)."""
  return tf.function(fn, autograph=False).get_concrete_function(*[tf.TensorSpec([], d) for d in dtypes])


def _weights(outputs):
  rs = np.random.RandomState(0)
  return [rs.normal(size=np.shape(o)).astype(np.float32) if np.asarray(o).dtype.kind == "f" else None
          for o in tree.flatten(outputs)]


def _float_indices(args):
  return [i for i, a in enumerate(args) if np.asarray(a).dtype.kind == "f"]


def _jax_grads(converted, args, idx, weights):
  def loss(*floats):
    full = list(args)
    for i, f in zip(idx, floats):
      full[i] = f
    outs = tree.flatten(converted(*full))
    return sum(jnp.sum(o.astype(jnp.float32) * w) for o, w in zip(outs, weights) if w is not None)
  return jax.grad(loss, argnums=tuple(range(len(idx))))


def _tf_grads(tf_fn, args, idx, weights):
  @tf.function(jit_compile=True, autograph=False)
  def grads(*xs):
    with tf.GradientTape() as tape:
      for i in idx:
        tape.watch(xs[i])
      outs = tree.flatten(tf_fn(*xs))
      loss = tf.add_n([tf.reduce_sum(tf.cast(o, tf.float32) * w)
                       for o, w in zip(outs, weights) if w is not None])
    grads = tape.gradient(loss, [xs[i] for i in idx], unconnected_gradients="zero")
    return [tf.convert_to_tensor(g) for g in grads]   # IndexedSlices to dense
  return grads(*[tf.constant(a) for a in args])


def check_xla(fn, *args, atol=1e-5, rtol=1e-5, grad_ref=None, numeric_grad=False, grad_atol=1e-4):
  """Converts `fn` and checks it against TF's XLA kernels, eager and under jax.jit.

  `grad_ref`: a TF function equal to `fn` that TF can differentiate; the gradients of
  a random projection of the outputs must match its `tf.GradientTape` gradients.
  `numeric_grad`: check the converted gradients against finite differences.
  """
  expected = tf.function(fn, jit_compile=True, autograph=False)(*args)
  converted = jaxport.convert_functional(fn, *args)
  assert_close(converted(*args), expected, atol, rtol, "eager")
  assert_close(jax.jit(converted)(*args), expected, atol, rtol, "jit")
  idx = _float_indices(args)
  if grad_ref is not None and idx:
    assert_close(tf.function(grad_ref, jit_compile=True, autograph=False)(*args), expected, atol, rtol,
                 "grad_ref forward")
    weights = _weights(expected)
    want = _tf_grads(grad_ref, args, idx, weights)
    grad_fn = _jax_grads(converted, args, idx, weights)
    floats = [jnp.asarray(args[i]) for i in idx]
    assert_close(list(grad_fn(*floats)), [np.asarray(g) for g in want], grad_atol, rtol, "grad")
    assert_close(list(jax.jit(grad_fn)(*floats)), [np.asarray(g) for g in want], grad_atol, rtol, "jit grad")
  if numeric_grad and idx:
    def of_floats(*floats):
      full = list(args)
      for i, f in zip(idx, floats):
        full[i] = f
      return converted(*full)
    check_grads(of_floats, [jnp.asarray(args[i]) for i in idx], order=1, modes=["rev"],
                atol=2e-2, rtol=2e-2, eps=1e-2)
  return converted


def jaxpr_text(fn, *args) -> str:
  return str(jax.make_jaxpr(jaxport.convert_functional(fn, *args))(*args))


def test_every_xla_rule_is_named_in_this_file():
  text = pathlib.Path(__file__).read_text()
  missing = sorted(op for op in supported_ops() if op.startswith("Xla") and op != "XlaCallModule"
                   and f'"{op}"' not in text)
  assert not missing


def test_tf_compat_xla_data_pb2_parses_dimension_numbers():
  dn = pb.DotDimensionNumbers(lhs_contracting_dimensions=[1], rhs_contracting_dimensions=[0])
  assert list(pb.DotDimensionNumbers.FromString(dn.SerializeToString()).lhs_contracting_dimensions) == [1]
  assert pb.PrecisionConfig.HIGHEST == 2 and pb.OpSharding.MANUAL == 4


# --------------------------------------------------------------------------- convolutions
# Ops: "XlaConv", "XlaConvV2"


def nhwc_dims():
  return pb.ConvolutionDimensionNumbers(
      input_batch_dimension=0, input_feature_dimension=3, input_spatial_dimensions=[1, 2],
      kernel_input_feature_dimension=2, kernel_output_feature_dimension=3, kernel_spatial_dimensions=[0, 1],
      output_batch_dimension=0, output_feature_dimension=3, output_spatial_dimensions=[1, 2])


def nchw_dims():
  return pb.ConvolutionDimensionNumbers(
      input_batch_dimension=0, input_feature_dimension=1, input_spatial_dimensions=[2, 3],
      kernel_input_feature_dimension=1, kernel_output_feature_dimension=0, kernel_spatial_dimensions=[2, 3],
      output_batch_dimension=0, output_feature_dimension=1, output_spatial_dimensions=[2, 3])


def test_xla_conv_strided_padded_dilated():
  x, w = normal(2, 7, 6, 3), normal(3, 2, 3, 4, seed=1)
  fn = lambda x, w: xla.conv(x, w, [2, 1], [[1, 2], [0, 1]], [1, 1], [1, 2], nhwc_dims())
  ref = lambda x, w: tf.nn.conv2d(x, w, [1, 2, 1, 1], [[0, 0], [1, 2], [0, 1], [0, 0]],
                                  dilations=[1, 1, 2, 1])
  check_xla(fn, x, w, atol=1e-4, rtol=1e-4, grad_ref=ref)


def test_xla_conv_grouped_lhs_dilated_nchw_highest_precision():
  x, w = normal(1, 4, 5, 5), normal(6, 2, 3, 3, seed=1)
  precision = pb.PrecisionConfig(operand_precision=[pb.PrecisionConfig.HIGHEST] * 2)
  fn = lambda x, w: xla.conv(x, w, [1, 1], [[2, 2], [1, 2]], [2, 2], [1, 1], nchw_dims(),
                             feature_group_count=2, precision_config=precision)
  check_xla(fn, x, w, atol=1e-4, rtol=1e-4, numeric_grad=True)
  assert "HIGHEST" in jaxpr_text(fn, x, w)


def test_xla_conv_v2_preferred_element_type_and_batch_groups():
  x, w = normal(4, 5, 5, 2, dtype=tf.bfloat16.as_numpy_dtype), normal(3, 3, 2, 6, seed=1)
  fn = lambda x, w: xla.conv(x, w, [1, 1], [[1, 1], [1, 1]], [1, 1], [1, 1], nhwc_dims(),
                             preferred_element_type=tf.float32)
  check_xla(fn, x, w, atol=3e-2, rtol=3e-2)
  xb = normal(4, 5, 5, 2)
  grouped = lambda x, w: xla.conv(x, w, [1, 1], [[0, 0], [0, 0]], [1, 1], [1, 1], nhwc_dims(),
                                  batch_group_count=2, use_v2=True)
  check_xla(grouped, xb, normal(3, 3, 2, 4, seed=2), atol=1e-4, rtol=1e-4, numeric_grad=True)


# --------------------------------------------------------------------------- dot products
# Ops: "XlaDot", "XlaDotV2", "XlaEinsum"


def test_xla_dot_batched_highest_precision():
  x, y = normal(2, 3, 4), normal(2, 4, 5, seed=1)
  dn = pb.DotDimensionNumbers(lhs_contracting_dimensions=[2], rhs_contracting_dimensions=[1],
                              lhs_batch_dimensions=[0], rhs_batch_dimensions=[0])
  precision = pb.PrecisionConfig(operand_precision=[pb.PrecisionConfig.HIGHEST] * 2)
  fn = lambda x, y: xla.dot_general(x, y, dn, precision)
  check_xla(fn, x, y, atol=1e-5, grad_ref=lambda x, y: tf.einsum("bij,bjk->bik", x, y))


def test_xla_dot_v2_int8_to_int32_and_mixed_floats():
  rs = np.random.RandomState(0)
  a, b = rs.randint(-100, 100, (3, 4)).astype(np.int8), rs.randint(-100, 100, (5, 4)).astype(np.int8)
  dn = pb.DotDimensionNumbers(lhs_contracting_dimensions=[1], rhs_contracting_dimensions=[1])
  check_xla(lambda a, b: xla.dot_general(a, b, dn, preferred_element_type=tf.int32), a, b)
  x, y = normal(3, 4, dtype=np.float16), normal(5, 4, seed=1)
  check_xla(lambda x, y: xla.dot_general(x, y, dn), x, y, atol=1e-3, rtol=1e-3)


def test_xla_einsum():
  a, b = normal(3, 4), normal(4, 5, seed=1)
  fn = lambda a, b: xla.einsum(a, b, equation="ab,bc->ac")
  check_xla(fn, a, b, atol=1e-5, grad_ref=fn)


# --------------------------------------------------------------------------- gather and scatter
# Ops: "XlaGather", "XlaScatter"


def test_xla_gather_rows_clamps_out_of_bounds_starts():
  x, idx = normal(5, 3), np.array([[0], [4], [7], [-2]], np.int32)
  dn = pb.GatherDimensionNumbers(offset_dims=[1], collapsed_slice_dims=[0], start_index_map=[0],
                                 index_vector_dim=1)
  fn = lambda x: xla.gather(x, idx, dn, [1, 3])
  check_xla(fn, x, grad_ref=lambda x: tf.gather(x, np.clip(idx[:, 0], 0, 4)))


def test_xla_gather_windows_with_leading_index_vector():
  x = normal(6, 5)
  idx = np.array([[0, 3, 5], [1, 4, 0]], np.int32)   # index vector on axis 0
  dn = pb.GatherDimensionNumbers(offset_dims=[1, 2], start_index_map=[0, 1], index_vector_dim=0)
  check_xla(lambda x, i: xla.gather(x, i, dn, [2, 2]), x, idx, numeric_grad=True)


def scatter_dims():
  return pb.ScatterDimensionNumbers(update_window_dims=[1], inserted_window_dims=[0],
                                    scatter_dims_to_operand_dims=[0], index_vector_dim=1)


def test_xla_scatter_add():
  x, u, idx = normal(5, 3), normal(3, 3, seed=1), np.array([[1], [3], [1]], np.int32)
  add = body(lambda a, b: a + b, tf.float32, tf.float32)
  fn = lambda x, u: xla.scatter(x, idx, u, add, scatter_dims())
  check_xla(fn, x, u, grad_ref=lambda x, u: tf.tensor_scatter_nd_add(x, idx, u))
  assert "scatter-add" in jaxpr_text(fn, x, u)


def test_xla_scatter_replace_and_drop_out_of_bounds():
  x, u = normal(5, 3), normal(3, 3, seed=1)
  replace = body(lambda a, b: b, tf.float32, tf.float32)
  idx = np.array([[4], [0], [2]], np.int32)
  check_xla(lambda x, u: xla.scatter(x, idx, u, replace, scatter_dims()), x, u,
            grad_ref=lambda x, u: tf.tensor_scatter_nd_update(x, idx, u))
  out_of_bounds = np.array([[4], [9], [-1]], np.int32)
  check_xla(lambda x, u: xla.scatter(x, out_of_bounds, u, replace, scatter_dims()), x, u)


@pytest.mark.parametrize("name,fn", [("max", tf.maximum), ("min", tf.minimum), ("mul", tf.multiply)])
def test_xla_scatter_monoids(name, fn):
  x, u, idx = normal(5, 3), normal(4, 3, seed=1), np.array([[1], [3], [1], [0]], np.int32)
  update = body(fn, tf.float32, tf.float32)
  check_xla(lambda x, u: xla.scatter(x, idx, u, update, scatter_dims()), x, u)


def test_xla_scatter_other_update_bodies_raise():
  x, u, idx = normal(5, 3), normal(1, 3, seed=1), np.array([[1]], np.int32)
  update = body(lambda a, b: a + 2 * b, tf.float32, tf.float32)
  converted = jaxport.convert_functional(lambda x, u: xla.scatter(x, idx, u, update, scatter_dims()), x, u)
  with pytest.raises(NotImplementedError, match="force_tier"):
    converted(x, u)


# --------------------------------------------------------------------------- windows
# Ops: "XlaReduceWindow", "XlaSelectAndScatter"


def test_xla_reduce_window_max_pool():
  x = normal(1, 6, 6, 2)
  fmax = body(tf.maximum, tf.float32, tf.float32)
  fn = lambda x: xla.reduce_window(x, np.float32(-np.inf), fmax, [1, 2, 2, 1], [1, 2, 2, 1])
  check_xla(fn, x, grad_ref=lambda x: tf.nn.max_pool2d(x, 2, 2, "VALID"))
  assert "reduce_window_max" in jaxpr_text(fn, x)


def test_xla_reduce_window_sum_with_init_padding_and_dilations():
  x = normal(1, 5, 4, 2)
  add = body(lambda a, b: a + b, tf.float32, tf.float32)
  fn = lambda x: xla.reduce_window(x, np.float32(0.5), add, [1, 2, 2, 1], [1, 1, 2, 1],
                                   base_dilations=[1, 2, 1, 1], window_dilations=[1, 1, 2, 1],
                                   padding=[(0, 0), (1, 2), (2, 1), (0, 0)])
  check_xla(fn, x, atol=1e-5, numeric_grad=True)


def test_xla_reduce_window_integer_min():
  x = np.random.RandomState(0).randint(-50, 50, (4, 7)).astype(np.int32)
  fmin = body(tf.minimum, tf.int32, tf.int32)
  check_xla(lambda x: xla.reduce_window(x, np.int32(2 ** 31 - 1), fmin, [2, 3], [1, 2],
                                        padding=[(1, 0), (1, 1)]), x)


def test_xla_reduce_window_general_body():
  x = normal(3, 8)
  select_max = body(lambda a, b: tf.where(a > b, a, b), tf.float32, tf.float32)
  check_xla(lambda x: xla.reduce_window(x, np.float32(-np.inf), select_max, [1, 3], [1, 2],
                                        padding=[(0, 0), (1, 1)]), x)


@pytest.mark.parametrize("infer", [True, False], ids=["infer", "no_infer"])
def test_infer_cumulative_reduction_from_jax2tf(infer):
  x = normal(3, 5)
  add = body(lambda a, b: a + b, tf.float32, tf.float32)
  fmax = body(tf.maximum, tf.float32, tf.float32)
  cumsum = lambda x: xla.reduce_window(x, np.float32(0), add, [1, 5], padding=[(0, 0), (4, 0)])
  reverse_cummax = lambda x: xla.reduce_window(x, np.float32(-np.inf), fmax, [5, 1], padding=[(0, 4), (0, 0)])
  xt = x.T.copy()
  with jaxport.override_config("infer_cumulative_reduction_from_jax2tf", infer):
    check_xla(cumsum, x, grad_ref=lambda x: tf.cumsum(x, axis=1))
    check_xla(reverse_cummax, xt, numeric_grad=True)
    text = jaxpr_text(cumsum, x) + jaxpr_text(reverse_cummax, xt)
  assert ("cumsum" in text and "cummax" in text) == infer
  assert ("reduce_window_sum" in text and "reduce_window_max" in text) != infer


def test_xla_select_and_scatter_max_pool_gradient():
  x, source = normal(1, 4, 6, 1), normal(1, 2, 3, 1, seed=1)
  ge = body(tf.greater_equal, tf.float32, tf.float32)
  add = body(lambda a, b: a + b, tf.float32, tf.float32)
  fn = lambda s: xla.select_and_scatter(x, [1, 2, 2, 1], [1, 2, 2, 1], np.zeros((4, 2), np.int32), s,
                                        np.float32(0), select=ge, scatter=add)
  ref = lambda s: RAW.MaxPoolGrad(orig_input=x, orig_output=tf.nn.max_pool2d(x, 2, 2, "VALID"), grad=s,
                                  ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID")
  check_xla(fn, source, grad_ref=ref)


def test_xla_select_and_scatter_min_with_init_and_padding():
  x, source = normal(1, 5, 4, 2), normal(1, 3, 3, 2, seed=1)
  le = body(tf.less_equal, tf.float32, tf.float32)
  add = body(lambda a, b: a + b, tf.float32, tf.float32)
  pads = np.array([[0, 0], [1, 0], [1, 1], [0, 0]], np.int32)
  fn = lambda x, s: xla.select_and_scatter(x, [1, 2, 2, 1], [1, 2, 2, 1], pads, s, np.float32(0.5),
                                           select=le, scatter=add)
  check_xla(fn, x, source)


# --------------------------------------------------------------------------- reductions
# Ops: "XlaReduce", "XlaVariadicReduceV2", "XlaVariadicReduce"


def test_xla_reduce_sum():
  x = normal(2, 3, 4)
  add = body(lambda a, b: a + b, tf.float32, tf.float32)
  fn = lambda x: xla.reduce(x, np.float32(0), dimensions_to_reduce=[0, 2], reducer=add)
  check_xla(fn, x, grad_ref=lambda x: tf.reduce_sum(x, [0, 2]))
  assert "reduce_sum" in jaxpr_text(fn, x)


def test_xla_reduce_max_with_init_and_bool_and():
  x = normal(3, 4)
  fmax = body(tf.maximum, tf.float32, tf.float32)
  check_xla(lambda x: xla.reduce(x, np.float32(0.25), dimensions_to_reduce=[1], reducer=fmax), x)
  b = np.array([[True, False, True], [True, True, True]])
  fand = body(tf.logical_and, tf.bool, tf.bool)
  check_xla(lambda b: xla.reduce(b, np.True_, dimensions_to_reduce=[1], reducer=fand), b)


def test_xla_variadic_reduce_v2_argmax_body():
  x = np.array([[1, 3, 3, 0], [2, -1, 5, 5], [0, 0, 0, 0]], np.float32)
  iota = np.broadcast_to(np.arange(4, dtype=np.int32), x.shape).copy()

  def argmax_body(av, ai, bv, bi):
    take_a = (av > bv) | ((av == bv) & (ai < bi))
    return tf.where(take_a, av, bv), tf.where(take_a, ai, bi)

  reducer = body(argmax_body, tf.float32, tf.int32, tf.float32, tf.int32)
  fn = lambda x, i: xla.variadic_reduce([x, i], [np.float32(-np.inf), np.int32(0)], dimensions_to_reduce=[1],
                                        reducer=reducer)
  check_xla(fn, x, iota)


def test_xla_variadic_reduce_v1_sums():
  x, y = normal(3, 4), normal(3, 4, seed=1)
  reducer = body(lambda a0, a1, b0, b1: (a0 + b0, a1 + b1), *[tf.float32] * 4)
  fn = lambda x, y: gen_xla_ops.xla_variadic_reduce(input=[x, y], init_value=[np.float32(0)] * 2,
                                                    dimensions_to_reduce=[0], reducer=reducer)
  check_xla(fn, x, y, atol=1e-5)


# --------------------------------------------------------------------------- sorting
# Ops: "XlaVariadicSort", "XlaSort", "XlaKeyValueSort"


def lexicographic_less(a0, b0, a1, b1, a2, b2):
  del a2, b2
  return (a0 < b0) | ((a0 == b0) & (a1 < b1))


SORT_DTYPES = (tf.int32, tf.int32, tf.float32, tf.float32, tf.float32, tf.float32)


def sort_operands():
  rs = np.random.RandomState(0)
  keys = rs.randint(0, 3, (2, 7)).astype(np.int32)
  return keys, rs.normal(size=(2, 7)).astype(np.float32), normal(2, 7, seed=2)


def test_xla_variadic_sort_two_keys_uses_lax_sort():
  keys, minor, values = sort_operands()
  comparator = body(lexicographic_less, *SORT_DTYPES)
  fn = lambda k, m, v: xla.variadic_sort([k, m, v], 1, comparator, is_stable=True)
  check_xla(fn, keys, minor, values, numeric_grad=True)
  assert "num_keys=2" in jaxpr_text(fn, keys, minor, values)


def test_xla_variadic_sort_descending_comparator_runs_general_sort():
  keys, minor, values = sort_operands()
  comparator = body(lambda a0, b0, a1, b1, a2, b2: a0 > b0, *SORT_DTYPES)
  fn = lambda k, m, v: xla.variadic_sort([k, m, v], 1, comparator, is_stable=True)
  check_xla(fn, keys, minor, values, numeric_grad=True)
  ascending_on_axis0 = lambda k, m, v: xla.variadic_sort([k, m, v], 0, comparator, is_stable=True)
  check_xla(ascending_on_axis0, keys.T.copy(), minor.T.copy(), values.T.copy())


def test_xla_sort_and_key_value_sort():
  x = normal(3, 6)
  check_xla(lambda x: xla.sort(x), x, numeric_grad=True)
  keys = np.random.RandomState(0).permutation(12).reshape(2, 6).astype(np.int32)
  check_xla(lambda k, v: xla.key_value_sort(k, v), keys, normal(2, 6), numeric_grad=True)


# --------------------------------------------------------------------------- padding and slices
# Ops: "XlaPad", "XlaDynamicSlice", "XlaDynamicUpdateSlice"


def test_xla_pad_negative_and_interior():
  x = normal(3, 4)
  fn = lambda x: xla.pad(x, np.float32(9), [1, -1], [2, 0], [1, 2])
  check_xla(fn, x, numeric_grad=True)
  i = np.arange(6, dtype=np.int32).reshape(2, 3)
  check_xla(lambda i: xla.pad(i, np.int32(-1), [0, 2], [1, 0], [0, 1]), i)


def test_xla_dynamic_slice_traced_and_clamped_starts():
  x = normal(5, 6)
  fn = lambda x, s: xla.dynamic_slice(x, s, [2, 3])
  for start in ([1, 2], [4, 5], [-3, 1]):
    check_xla(fn, x, np.array(start, np.int32), numeric_grad=True)
  check_xla(lambda x: xla.dynamic_slice(x, np.array([2, 1], np.int32), [3, 4]), x)


def test_xla_dynamic_update_slice():
  x, u = normal(5, 6), normal(2, 3, seed=1)
  fn = lambda x, u, i: xla.dynamic_update_slice(x, u, i)
  for start in ([1, 2], [4, -1]):
    check_xla(fn, x, u, np.array(start, np.int32), numeric_grad=True)


# --------------------------------------------------------------------------- numerics, barriers, random bits
# Ops: "XlaOptimizationBarrier", "XlaReducePrecision", "XlaRngBitGenerator"


def test_xla_optimization_barrier():
  x, i = normal(3, 2), np.arange(4, dtype=np.int32)
  check_xla(lambda x, i: [2 * o for o in xla.optimization_barrier(x, i)], x, i, numeric_grad=True)
  assert "optimization_barrier" in jaxpr_text(lambda x, i: xla.optimization_barrier(x, i), x, i)


@pytest.mark.parametrize("bits", [(8, 7), (5, 10), (3, 2)])
def test_xla_reduce_precision(bits):
  x = np.concatenate([normal(50) * 100, [np.inf, -np.inf, np.nan, 1e-30, 65520.0]]).astype(np.float32)
  check_xla(lambda x: xla.reduce_precision(x, *bits), x, atol=0, rtol=0)


@pytest.mark.parametrize("algorithm", [1, 2, 3], ids=["philox", "threefry", "auto"])
def test_xla_rng_bit_generator_is_bit_exact(algorithm):
  state = np.array([1, 2], np.uint64)
  check_xla(lambda: xla.rng_bit_generator(algorithm, state, [3, 4], tf.uint32))


def test_xla_rng_bit_generator_needs_x64_for_64_bit_values():
  state = np.array([1, 2], np.uint64)
  traced_state = jaxport.convert_functional(lambda s: xla.rng_bit_generator(1, s, [3], tf.uint32), state)
  with pytest.raises(TypeError, match="jax_enable_x64"):
    traced_state(state)
  wide = jaxport.convert_functional(lambda: xla.rng_bit_generator(1, state, [3], tf.uint64))
  with pytest.raises(TypeError, match="jax_enable_x64"):
    wide()


# --------------------------------------------------------------------------- sharding
# Ops: "XlaSharding", "XlaSpmdFullToShardShape", "XlaSpmdShardToFullShape"


def test_xla_sharding_is_identity():
  x = normal(4, 2)
  sharding = pb.OpSharding(type=pb.OpSharding.REPLICATED).SerializeToString()
  fn = lambda x: 3 * xla.sharding(x, sharding=sharding)
  check_xla(fn, x, grad_ref=fn)


def test_xla_spmd_shape_ops_on_one_device():
  x = normal(4, 2)
  manual = pb.OpSharding(type=pb.OpSharding.MANUAL).SerializeToString()
  fn = lambda x: xla.spmd_shard_to_full_shape(2 * xla.spmd_full_to_shard_shape(x, manual_sharding=manual),
                                              manual_sharding=manual, full_shape=[4, 2])
  check_xla(fn, x, grad_ref=fn)


def test_xla_spmd_full_to_shard_shape_with_several_shards_raises():
  x = normal(4, 2)
  tiled = pb.OpSharding(type=pb.OpSharding.OTHER, tile_assignment_dimensions=[2, 1],
                        tile_assignment_devices=[0, 1]).SerializeToString()
  converted = jaxport.convert_functional(lambda x: xla.spmd_full_to_shard_shape(x, manual_sharding=tiled), x)
  with pytest.raises(NotImplementedError, match="one device"):
    converted(x)


# --------------------------------------------------------------------------- linear algebra
# Ops: "XlaSelfAdjointEig", "XlaSvd"


def assert_same_columns_up_to_sign(actual, expected, atol):
  dots = np.abs(np.sum(np.asarray(actual) * np.asarray(expected), axis=-2))
  np.testing.assert_allclose(dots, np.ones_like(dots), atol=atol)


@pytest.mark.parametrize("lower", [True, False])
def test_xla_self_adjoint_eig(lower):
  m = normal(2, 4, 4)
  m = m + np.swapaxes(m, -1, -2)
  m[:, 0, 3] += 5.0   # one triangle differs: only the chosen one is read
  fn = lambda m: xla.self_adjoint_eig(m, lower, 100, 1e-7)
  w_tf, v_tf = tf.function(fn, jit_compile=True)(m)
  for converted in (jaxport.convert_functional(fn, m), jax.jit(jaxport.convert_functional(fn, m))):
    w, v = converted(m)
    assert_close(w, w_tf, 1e-4, 1e-4, "eigenvalues")
    assert_same_columns_up_to_sign(v, v_tf, 1e-4)


def test_xla_svd():
  a = normal(2, 5, 3)
  fn = lambda a: xla.svd(a, 100, 1e-7)
  s_tf, u_tf, v_tf = tf.function(fn, jit_compile=True)(a)
  for converted in (jaxport.convert_functional(fn, a), jax.jit(jaxport.convert_functional(fn, a))):
    s, u, v = converted(a)
    assert_close(s, s_tf, 1e-4, 1e-4, "singular values")
    assert u.shape == u_tf.shape and v.shape == v_tf.shape
    assert_same_columns_up_to_sign(u[..., :3], np.asarray(u_tf)[..., :3], 1e-4)
    assert_same_columns_up_to_sign(v, v_tf, 1e-4)
    np.testing.assert_allclose(np.einsum("bik,bk,bjk->bij", u[..., :3], s, v), a, atol=1e-4)


# --------------------------------------------------------------------------- infer_relu_from_jax2tf


def maximum_context(name: str, infer: bool) -> OpContext:
  config = {"infer_relu_from_jax2tf": infer}
  return OpContext(Node(name, "Maximum", [], [], {}), Runtime(Library([]), config, {}))


@pytest.mark.parametrize("infer", [True, False], ids=["infer", "no_infer"])
def test_infer_relu_from_jax2tf_hook(infer):
  x = jnp.array([-1.0, 0.0, 2.0])
  ctx = maximum_context("jax2tf_f_/jax2tf_relu_/Maximum", infer)
  relu = math_rules.jax2tf_relu(ctx, x, np.float32(0))
  if not infer:
    assert relu is None
    return
  np.testing.assert_array_equal(relu, [0.0, 0.0, 2.0])
  grad = jax.grad(lambda x: jnp.sum(math_rules.jax2tf_relu(ctx, x, np.float32(0))))(x)
  np.testing.assert_array_equal(grad, [0.0, 0.0, 1.0])   # relu's gradient at 0, not Maximum's
  assert math_rules.jax2tf_relu(maximum_context("plain/Maximum", infer), x, np.float32(0)) is None
  assert math_rules.jax2tf_relu(ctx, x, np.float32(1)) is None


def test_infer_relu_from_jax2tf_end_to_end():
  def jax2tf_style_relu(x):
    with tf.name_scope("jax2tf_relu_"):
      return tf.maximum(x, tf.cast(0, tf.float32))

  x = np.array([-1.0, 0.0, 2.0], np.float32)
  with jaxport.override_config("infer_relu_from_jax2tf", True):
    converted = jaxport.convert_functional(jax2tf_style_relu, x)
  np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(converted(x)))(x), [0.0, 0.0, 1.0])
