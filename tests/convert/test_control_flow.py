"""TF2 control flow: While, If, Case, TensorList/TensorArray, calls."""
import dataclasses

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import registry
from oracle import assert_close, check, check_train_steps

X = np.random.RandomState(0).normal(size=(3, 4)).astype(np.float32)


def _ops(fn, *args):
  graph_def = tf.function(fn).get_concrete_function(*args).graph.as_graph_def()
  ops = {n.op for n in graph_def.node}
  for f in graph_def.library.function:
    ops |= {n.op for n in f.node_def}
  return ops


def static_loop(x):
  for i in tf.range(5):
    x = tf.sin(x) * tf.cast(i + 1, tf.float32)
  return x


def test_static_trip_count_loop_is_reverse_differentiable():
  assert "While" in _ops(static_loop, X) or "StatelessWhile" in _ops(static_loop, X)
  check(static_loop, X, atol=1e-4, rtol=1e-4)


def test_static_trip_count_uses_fori_loop_not_while():
  f = jaxport.convert_functional(static_loop, X)
  jaxpr = str(jax.make_jaxpr(f)(X))
  assert "scan" in jaxpr and "while" not in jaxpr


def dynamic_loop(x, n):
  i = tf.constant(0)
  while tf.reduce_sum(x) < n:
    x = x * 2.0 + 0.1
    i += 1
  return x, i


def test_dynamic_trip_count_loop_uses_while_loop():
  x = np.abs(X) + 0.1
  n = np.float32(100.0)
  f = check(dynamic_loop, x, n, grad=False, vmap=True)
  jaxpr = str(jax.make_jaxpr(lambda a, b: f({}, a, b)[0])(x, n))
  assert "while" in jaxpr


def test_loop_reading_variables_and_jit_grad():
  w = tf.Variable(np.full((4,), 0.5, np.float32), name="w")

  def fn(x):
    for _ in tf.range(3):
      x = tf.tanh(x * w)
    return x

  jax_fn, params = jaxport.convert(fn, X)
  assert_close(jax.jit(jax_fn)(params, X)[0], fn(X), 1e-5, 1e-5)
  g = jax.grad(lambda p: jnp.sum(jax_fn(p, X)[0]))(params)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(fn(X))
  np.testing.assert_allclose(g["w"], tape.gradient(loss, w).numpy(), rtol=1e-4, atol=1e-5)


def test_loop_assigning_variables_updates_new_params():
  acc = tf.Variable(np.zeros((4,), np.float32), name="acc")

  @tf.function
  def fn(x):
    for i in tf.range(3):
      acc.assign_add(x[i])
    return acc.read_value()

  jax_fn, params = jaxport.convert(fn, X)
  out, new = jax.jit(jax_fn)(params, X)
  np.testing.assert_allclose(new["acc"], X.sum(0), rtol=1e-6)
  np.testing.assert_allclose(out, X.sum(0), rtol=1e-6)


def tensor_array_loop(x):
  ta = tf.TensorArray(tf.float32, size=tf.shape(x)[0])
  for i in tf.range(tf.shape(x)[0]):
    ta = ta.write(i, x[i] * tf.cast(i, tf.float32))
  return ta.stack()


def test_tensor_array_in_loop():
  check(tensor_array_loop, X)


def test_tensor_array_unknown_element_shape_in_loop():
  def fn(x):
    ta = tf.TensorArray(tf.float32, size=3, element_shape=tf.TensorShape(None))
    for i in tf.range(3):
      ta = ta.write(i, tf.reduce_sum(x, axis=0) * tf.cast(i, tf.float32))
    return ta.stack()

  check(fn, tf.TensorSpec([None, 4], tf.float32) and X)


def test_tensor_array_read_unstack_in_loop():
  def fn(x):
    inputs = tf.TensorArray(tf.float32, size=3).unstack(x)
    total = tf.zeros([4])
    for i in tf.range(3):
      total += inputs.read(i) ** 2
    return total

  check(fn, X)


def test_a_loop_reading_and_writing_tensor_arrays_has_no_index_wrapping():
  # TF raises on an index outside [0, size): the loop index needs no negative wrap or bounds
  # select, which would cost kernels on every step (the Keras LSTM's loop).
  def fn(x):
    inputs = tf.TensorArray(tf.float32, size=3).unstack(x)
    outputs = tf.TensorArray(tf.float32, size=3)
    for i in tf.range(3):
      outputs = outputs.write(i, tf.tanh(inputs.read(i)))
    return outputs.stack()

  check(fn, X)
  converted, params = jaxport.convert(fn, X)
  jaxpr = jax.make_jaxpr(lambda x: converted(params, x)[0])(X)
  def primitives_in(jaxpr):
    for eqn in jaxpr.eqns:
      yield eqn.primitive.name
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        yield from primitives_in(sub)

  loop, = (e for e in jaxpr.jaxpr.eqns if e.primitive.name in ("scan", "while"))
  primitives = set(primitives_in(loop.params["jaxpr" if loop.primitive.name == "scan" else "body_jaxpr"].jaxpr))
  assert primitives >= {"dynamic_slice", "dynamic_update_slice"}, primitives
  assert not primitives & {"select_n", "scatter", "lt"}, primitives


def test_tensor_array_constant_indices_outside_loop():
  def fn(x):
    ta = tf.TensorArray(tf.float32, size=2)
    ta = ta.write(0, x)
    ta = ta.write(1, x * 3.0)
    return ta.stack(), ta.read(1), ta.size()

  check(fn, X)


def test_dynamic_size_tensor_array_outside_loop():
  def fn(x):
    ta = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
    ta = ta.write(0, x)
    ta = ta.write(1, -x)
    ta = ta.write(2, 2 * x)
    return ta.stack()

  check(fn, X)


def cond_fn(x, flag):
  return tf.cond(flag > 0, lambda: tf.sin(x) * 2.0, lambda: tf.cos(x) - 1.0)


@pytest.mark.parametrize("flag", [1, -1])
def test_if_with_traced_predicate(flag):
  assert {"If", "StatelessIf"} & _ops(cond_fn, X, np.int32(flag))
  check(cond_fn, X, np.int32(flag))


def test_if_with_constant_predicate_traces_only_taken_branch(monkeypatch):
  traced = []
  original = registry.get_rule("Cos")

  def spy(ctx, x):
    traced.append(ctx.name)
    return original(ctx, x)

  monkeypatch.setitem(registry._RULES, "Cos", dataclasses.replace(original, fn=spy))

  def fn(x):
    return tf.cond(tf.constant(True), lambda: tf.sin(x), lambda: tf.cos(x))

  f = jaxport.convert_functional(fn, X)
  np.testing.assert_allclose(jax.jit(f)(X), np.sin(X), rtol=1e-6)
  assert traced == []


def test_if_assigning_variables_in_branches():
  v = tf.Variable(np.zeros((4,), np.float32), name="v")

  @tf.function
  def fn(x, flag):
    def yes():
      v.assign_add(x[0])
      return tf.constant(1.0)

    def no():
      v.assign_sub(x[1])
      return tf.constant(0.0)

    return tf.cond(flag, yes, no)

  jax_fn, params = jaxport.convert(fn, X, np.bool_(True))
  for flag, expected in [(True, X[0]), (False, -X[1])]:
    out, new = jax.jit(jax_fn)(params, X, np.bool_(flag))
    np.testing.assert_allclose(new["v"], expected, rtol=1e-6)
    assert float(out) == float(flag)


def case_fn(x, i):
  return tf.switch_case(i, [lambda: x * 1.0, lambda: x * 2.0, lambda: tf.sin(x)])


@pytest.mark.parametrize("index", [0, 1, 2, 7, -3])
def test_case_including_out_of_range_runs_last_branch(index):
  assert {"Case", "StatelessCase"} & _ops(case_fn, X, np.int32(0))
  check(case_fn, X, np.int32(index))


def test_nested_function_calls_are_inlined():
  @tf.function
  def inner(x):
    return tf.nn.relu(x) * 3.0

  @tf.function
  def middle(x):
    return inner(x) + inner(-x)

  assert {"PartitionedCall", "StatefulPartitionedCall"} & _ops(middle, X)
  check(middle, X)


def _program_with_implementations(cpu_scale, cpu_extra=lambda x: x):
  """A call of a function marked `api_implements`, whose sibling for CPU multiplies by `cpu_scale`."""
  api = f"scale_{cpu_scale}_{id(cpu_extra)}"
  spec = [tf.TensorSpec([3], tf.float32)]
  default = tf.function(lambda x: x * 2.0, input_signature=spec, experimental_attributes={"api_implements": api})
  on_cpu = tf.function(lambda x: cpu_extra(x) * cpu_scale, input_signature=spec,
                       experimental_attributes={"api_implements": api, "api_preferred_device": "CPU"})

  @tf.function
  def program(x):
    on_cpu.get_concrete_function().add_to_graph()   # as TFP's samplers and Keras' RNNs do
    return default(x) + 1.0
  return program


def test_a_call_runs_the_implementation_tf_selects_for_cpu():
  """Grappler's implementation selector swaps in the CPU sibling of an `api_implements` function (TFP's
  gamma/Poisson/binomial samplers); the converted call runs that sibling too."""
  x = np.arange(3, dtype=np.float32)
  program = _program_with_implementations(3.0)
  np.testing.assert_array_equal(program(x), x * 3 + 1)
  check(program, x, grad=False)   # TF's tape differentiates the function the graph names (x * 2)


def test_a_cpu_implementation_without_native_rules_is_not_selected():
  """A CPU sibling using an op without a native rule is passed over: the function the graph names runs."""
  x = np.arange(3, dtype=np.float32)
  program = _program_with_implementations(3.0, cpu_extra=lambda x: x + 0.0 * tf.math.nextafter(x, x))
  assert registry.get_rule("NextAfter") is None
  jax_fn, params = jaxport.convert(program, x)
  np.testing.assert_array_equal(jax_fn(params, x)[0], x * 2 + 1)


def test_random_op_in_loop_gives_fresh_values_each_iteration():
  def fn(x):
    ta = tf.TensorArray(tf.float32, size=3)
    for i in tf.range(3):
      ta = ta.write(i, tf.random.uniform([4]) + x[0] * 0)
    return ta.stack()

  jax_fn, params = jaxport.convert(fn, X)
  assert jax_fn.requires_rng
  out = np.asarray(jax_fn(params, X, rng=jax.random.key(0))[0])
  assert not np.allclose(out[0], out[1]) and not np.allclose(out[1], out[2])
  with pytest.raises(jaxport.MissingInputError, match="rng"):
    jax_fn(params, X)


def test_stateless_random_op_in_loop_repeats_like_tf():
  def fn(x):
    ta = tf.TensorArray(tf.float32, size=3)
    for i in tf.range(3):
      ta = ta.write(i, tf.random.stateless_uniform([4], seed=[1, 2]) + x[0] * 0)
    return ta.stack()

  tf_out = tf.function(fn)(X).numpy()
  assert np.allclose(tf_out[0], tf_out[1])   # TF: equal seeds, equal values
  jax_fn, params = jaxport.convert(fn, X)
  out = np.asarray(jax.jit(jax_fn)(params, X, rng=jax.random.key(0))[0])
  np.testing.assert_array_equal(out[0], out[1])
  np.testing.assert_array_equal(out[1], out[2])


# --------------------------------------------------------------------------- TensorList ops by name

RAW = tf.raw_ops
F32 = tf.float32


def _stack(lst, shape=(4,)):
  return RAW.TensorListStack(input_handle=lst, element_shape=list(shape), element_dtype=F32)


def test_tensor_list_from_tensor_get_item_length_element_shape_stack_gather():
  def fn(x):
    lst = RAW.TensorListFromTensor(tensor=x, element_shape=[4])
    return (RAW.TensorListGetItem(input_handle=lst, index=1, element_shape=[4], element_dtype=F32),
            RAW.TensorListLength(input_handle=lst),
            RAW.TensorListElementShape(input_handle=lst, shape_type=tf.int32),
            _stack(lst) * 2.0,
            RAW.TensorListGather(input_handle=lst, indices=[2, 0], element_shape=[4], element_dtype=F32))

  check(fn, X)


def test_tensor_list_gather_repeated_indices_forward():
  # TF's gradient of TensorListGather scatters back and keeps one of repeated indices' cotangents
  # (jaxport sums them, as for tf.gather), so only the forward pass is compared.
  def fn(x):
    lst = RAW.TensorListFromTensor(tensor=x, element_shape=[4])
    return RAW.TensorListGather(input_handle=lst, indices=[2, 0, 2], element_shape=[4], element_dtype=F32)

  check(fn, X, grad=False)


def test_tensor_list_get_item_traced_index():
  def fn(x, i):
    lst = RAW.TensorListFromTensor(tensor=x, element_shape=[4])
    return RAW.TensorListGetItem(input_handle=lst, index=i, element_shape=[4], element_dtype=F32)

  check(fn, X, np.int32(2))


def test_empty_tensor_list_push_back_pop_back():
  def fn(x):
    lst = RAW.EmptyTensorList(element_shape=[4], max_num_elements=-1, element_dtype=F32)
    lst = RAW.TensorListPushBack(input_handle=lst, tensor=x[0])
    lst = RAW.TensorListPushBack(input_handle=lst, tensor=x[1] * 2.0)
    lst = RAW.TensorListPushBack(input_handle=lst, tensor=tf.sin(x[2]))
    lst, last = RAW.TensorListPopBack(input_handle=lst, element_shape=[4], element_dtype=F32)
    return last, _stack(lst), RAW.TensorListLength(input_handle=lst)

  check(fn, X)


def test_tensor_list_pop_back_comes_from_the_gradient_of_push_back():
  def fn(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      lst = RAW.EmptyTensorList(element_shape=[4], max_num_elements=-1, element_dtype=F32)
      lst = RAW.TensorListPushBack(input_handle=lst, tensor=x[0] * x[1])
      y = tf.reduce_sum(_stack(lst) ** 2)
    return tape.gradient(y, x)

  assert {"TensorListPushBack", "TensorListPopBack"} <= _ops(fn, X)
  check(fn, X)


def test_tensor_list_reserve_set_item_resize_scatter_into_existing():
  def fn(x):
    lst = RAW.TensorListReserve(element_shape=[4], num_elements=2, element_dtype=F32)
    lst = RAW.TensorListSetItem(input_handle=lst, index=1, item=x[0])
    grown = RAW.TensorListResize(input_handle=lst, size=3)
    grown = RAW.TensorListScatterIntoExistingList(input_handle=grown, tensor=x[1:] * 3.0, indices=[2, 0])
    shrunk = RAW.TensorListResize(input_handle=lst, size=1)
    return _stack(grown), _stack(shrunk), RAW.TensorListLength(input_handle=grown)

  check(fn, X)


def test_tensor_list_scatter_v1_v2():
  def fn(x):
    v1 = RAW.TensorListScatter(tensor=x, indices=[2, 0, 4], element_shape=[4])
    v2 = RAW.TensorListScatterV2(tensor=x, indices=[1, 0, 2], element_shape=[4], num_elements=5)
    return _stack(v1), _stack(v2), RAW.TensorListLength(input_handle=v2)

  check(fn, X)


def test_tensor_list_split_concat_v1_v2():
  x6 = np.concatenate([X, X[::-1] * 2]).astype(np.float32)   # [6, 4]

  def fn(x):
    lst = RAW.TensorListSplit(tensor=x, element_shape=[-1, 4], lengths=tf.constant([2, 2, 2], tf.int64))
    v2, lengths = RAW.TensorListConcatV2(input_handle=lst, element_shape=[-1, 4],
                                         leading_dims=tf.constant([], tf.int64), element_dtype=F32)
    v1, _ = RAW.TensorListConcat(input_handle=lst, element_dtype=F32, element_shape=[2, 4])
    return RAW.TensorListGetItem(input_handle=lst, index=1, element_shape=[2, 4], element_dtype=F32), v2, v1, lengths

  check(fn, x6)


def test_tensor_array_api_emits_the_tensor_list_ops():
  def fn(x):
    ta = tf.TensorArray(tf.float32, size=3, element_shape=[4]).unstack(x)
    parts = tf.TensorArray(tf.float32, size=3, element_shape=[1, 4]).split(x, [1, 1, 1])
    fixed = tf.TensorArray(tf.float32, size=3).scatter([2, 0], x[:2] * 2.0)
    return ta.read(2), ta.gather([0, 2]), parts.concat(), fixed.stack(), ta.size()

  assert {"TensorListFromTensor", "TensorListGetItem", "TensorListGather", "TensorListSplit",
          "TensorListConcatV2", "TensorListScatterIntoExistingList", "TensorListStack"} <= _ops(fn, X)
  check(fn, X)


def test_tensor_list_scatter_into_existing_list_grows_the_list():
  def fn(x):
    lst = RAW.EmptyTensorList(element_shape=[4], max_num_elements=-1, element_dtype=F32)
    lst = RAW.TensorListScatterIntoExistingList(input_handle=lst, tensor=x[:2], indices=[1, 0])
    return _stack(lst)

  def reserved(x):   # a list of 2 grows to 4
    lst = RAW.TensorListReserve(element_shape=[4], num_elements=2, element_dtype=F32)
    lst = RAW.TensorListScatterIntoExistingList(input_handle=lst, tensor=x[:2], indices=[3, 2])
    return _stack(lst)

  check(fn, X)
  check(reserved, X)


def test_tensor_list_scatter_into_existing_list_gap_is_zero():
  # An element the growth adds but no index writes reads as zeros, as a reserved one does. TF 2.21's
  # TensorListStack instead packs the written elements together and leaves the rest uninitialized
  # (eagerly, [3, 0] into an empty list stacks [x1, x0, garbage, garbage]), so TF is no oracle here.
  def fn(x):
    lst = RAW.EmptyTensorList(element_shape=[4], max_num_elements=-1, element_dtype=F32)
    lst = RAW.TensorListScatterIntoExistingList(input_handle=lst, tensor=x[:2], indices=[3, 0])
    return _stack(lst)

  jax_fn, params = jaxport.convert(tf.function(fn), X)
  want = np.zeros((4, 4), np.float32)
  want[3], want[0] = X[0], X[1]
  np.testing.assert_array_equal(jax_fn(params, X)[0], want)
  np.testing.assert_array_equal(jax.jit(jax_fn)(params, X)[0], want)


def test_tensor_list_scatter_into_existing_list_with_traced_indices():
  # Indices that are inputs size the list eagerly (as TF); under jit they cannot, and a list too short
  # for the scattered rows is refused with the node named rather than dropping rows.
  def fn(x, indices):
    lst = RAW.EmptyTensorList(element_shape=[4], max_num_elements=-1, element_dtype=F32)
    lst = RAW.TensorListScatterIntoExistingList(input_handle=lst, tensor=x[:2], indices=indices)
    return _stack(lst)

  indices = np.array([1, 0], np.int32)
  jax_fn, params = jaxport.convert(tf.function(fn), X, indices)
  np.testing.assert_array_equal(jax_fn(params, X, indices)[0], fn(X, indices).numpy())
  with pytest.raises(jaxport.errors.DynamicShapeError, match="TensorListScatterIntoExistingList"):
    jax.jit(jax_fn)(params, X, indices)


def _sum_of_negatives_or_all(x):
  """A cond whose rare branch has a value-dependent size (`tf.where`), like Keras 3's sparse division."""
  return tf.cond(tf.reduce_any(x < 0), lambda: tf.reduce_sum(tf.gather(x, tf.where(x < 0)[:, 0])) * 10.0,
                 lambda: tf.reduce_sum(tf.sin(x)))


def test_a_branch_jit_cannot_trace_is_a_run_time_error_taken_only_with_it():
  fn = tf.function(_sum_of_negatives_or_all)
  positive, mixed = np.array([0.5, 1.0, 2.0], np.float32), np.array([0.5, -1.0, -2.0], np.float32)
  jax_fn, params = jaxport.convert(fn, positive)
  with pytest.warns(jaxport.RunTimeBranchWarning, match=r"StatelessIf node .*\(Where node"):
    jitted = jax.jit(jax_fn.outputs_only)
    assert_close(jitted(params, positive), fn(positive), 1e-6, 1e-6, "jit, common branch")
  with pytest.raises(Exception, match=r"StatelessIf node .*cond.* needs its `predicate`.*without jax.jit"):
    jax.block_until_ready(jitted(params, mixed))
  for x in (positive, mixed):   # without jit both branches compute, as in TF
    assert_close(jax_fn.outputs_only(params, x), fn(x), 1e-6, 1e-6, "eager")
  # derivatives and vmap of the branch that runs
  grad = jax.jit(jax.grad(lambda x: jax_fn.outputs_only(params, x)))(positive)
  assert_close(grad, np.cos(positive), 1e-6, 1e-6, "grad")
  assert_close(jax.vmap(lambda x: jax_fn.outputs_only(params, x))(np.stack([positive, positive * 2])),
               np.array([fn(positive), fn(positive * 2)]), 1e-6, 1e-6, "vmap")
  with pytest.raises(Exception, match="needs its `predicate`"):   # one element takes the rare branch
    jax.block_until_ready(jax.vmap(lambda x: jax_fn.outputs_only(params, x))(np.stack([positive, mixed])))


def test_a_branch_jit_cannot_trace_still_cannot_be_exported(tmp_path):
  positive = np.array([0.5, 1.0, 2.0], np.float32)
  jax_fn, params = jaxport.convert(tf.function(_sum_of_negatives_or_all), positive)
  with pytest.raises(jaxport.ArtifactError, match="Where"):
    jaxport.export(jax_fn, params, positive, path=tmp_path / "a")


@pytest.mark.parametrize("name", ["Adagrad", "RMSprop", "Adafactor", "ScheduleFreeAdamW"])
def test_keras3_optimizers_dividing_sparse_gradients_train_under_jit(name):
  """Keras 3 divides an Embedding's IndexedSlices gradient inside a cond whose rare branch (a zero or NaN
  denominator) uses `tf.where`: under jit the common branch runs. Three steps, eager and jit, vs TF."""
  keras = pytest.importorskip("keras")
  if keras.backend.backend() != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow")
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(10, 4),
                            keras.layers.Flatten(), keras.layers.Dense(1)])
  optimizer = getattr(keras.optimizers, name)(learning_rate=0.05)
  optimizer.build(model.trainable_variables)
  x = np.random.RandomState(1).randint(0, 6, (16, 5)).astype(np.int32)   # ids repeat within the batch
  y = np.random.RandomState(2).normal(size=(16, 1)).astype(np.float32)
  with pytest.warns(jaxport.RunTimeBranchWarning):
    check_train_steps(model, optimizer, x, y)


def test_a_branch_jit_cannot_trace_that_only_assigns_still_raises_when_taken():
  """No outputs: the variables the stand-in passes on keep its check alive (XLA would drop it otherwise)."""
  total = tf.Variable(np.zeros((), np.float32))

  @tf.function
  def fn(x):
    tf.cond(tf.reduce_any(x < 0), lambda: total.assign_add(tf.reduce_sum(tf.gather(x, tf.where(x < 0)[:, 0]))),
            lambda: total.assign_add(tf.reduce_sum(x)))
    return tf.constant(0.0)

  positive, mixed = np.array([0.5, 1.0], np.float32), np.array([0.5, -1.0], np.float32)
  jax_fn, params = jaxport.convert(fn, positive)
  with pytest.warns(jaxport.RunTimeBranchWarning):
    run = jax.jit(jax_fn)
    _, new_params = run(params, positive)
  assert_close(new_params[list(params)[0]], 1.5, 1e-6, 1e-6, "common branch")
  with pytest.raises(Exception, match="needs its `predicate`"):
    jax.block_until_ready(run(params, mixed))
