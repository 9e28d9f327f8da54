"""Unique under jit: its outputs are padded to len(ids) where only sparse row updates read them
(`convert/padded_rows.py`), so optimizers' sparse gradients train under jit; every other use of a
padded value raises `PaddedSizeError` naming the node. TF is the oracle."""
import functools

import jax
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.errors import DynamicShapeError, PaddedSizeError
from oracle import assert_close, check, check_train_steps

VOCAB = 9


@functools.lru_cache(maxsize=None)
def _row_updates(length: int, dtype: str):
  """Variables updated per distinct id, as TF's optimizers do: sums, counts and first positions
  scattered at the unique ids. The padded rows would be -1 in `table` if they were not dropped."""
  table = tf.Variable(np.zeros((VOCAB, 2), np.float32))
  counts = tf.Variable(np.zeros((VOCAB,), np.float32))
  first = tf.Variable(np.full((VOCAB,), -1, np.int32))

  @tf.function
  def fn(ids, values):
    unique, position, count = tf.raw_ops.UniqueWithCounts(x=ids, out_idx=tf.int32)
    n = tf.shape(unique)[0]
    sums = tf.math.unsorted_segment_sum(values, position, n)
    table.scatter_add(tf.IndexedSlices(sums * 0.5 - 1.0, unique))
    counts.scatter_add(tf.IndexedSlices(tf.cast(count, tf.float32), unique))
    first.scatter_update(tf.IndexedSlices(tf.math.unsorted_segment_min(tf.range(tf.size(ids)), position, n),
                                          unique))
    return position

  ids, values = np.zeros(length, dtype), np.zeros((length, 2), np.float32)
  jax_fn, params = jaxport.convert(fn, ids, values)
  return fn, (table, counts, first), jax_fn, params


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([0, 1, 6, 16]).flatmap(
           lambda n: st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n)),
       st.sampled_from(["int32", "int64"]))
def test_row_updates_per_distinct_id_match_tf_under_jit(ids, dtype):
  ids = np.asarray(ids, dtype)
  values = np.random.RandomState(len(ids)).normal(size=(len(ids), 2)).astype(np.float32)
  fn, variables, jax_fn, params = _row_updates(len(ids), dtype)
  initial = [np.zeros((VOCAB, 2), np.float32), np.zeros((VOCAB,), np.float32), np.full((VOCAB,), -1, np.int32)]
  for var, value in zip(variables, initial):
    var.assign(value)
  expected_position = fn(ids, values)
  expected = {key: var.numpy() for key, var in jax_fn.tf_variables.items()}
  for run in (jax_fn, jax.jit(jax_fn)):   # eager: TF's shapes; jit: padded
    position, new_params = run(params, ids, values)
    assert_close(position, expected_position, 0, 0, "positions")
    for key, value in expected.items():
      assert_close(new_params[key], value, 1e-6, 1e-6, key)


def _refused(fn, *args, node_op: str):
  jax_fn, params = jaxport.convert(tf.function(fn), *args)
  with pytest.raises(PaddedSizeError) as info:
    jax.jit(jax_fn)(params, *args)
  error = info.value
  assert isinstance(error, DynamicShapeError) and error.op == node_op, str(error)
  assert "without jax.jit" in str(error) and "Unique node" in str(error)
  if node_op is not None:
    assert f"{node_op} node {error.node!r}" in str(error)
  jax_fn(params, *args)   # eager: TF's shapes, no padding
  return error


IDS = np.array([3, 1, 3, 0, 1], np.int32)


def test_uses_that_the_padding_would_change_are_refused():
  table = tf.Variable(np.zeros((VOCAB, 2), np.float32))
  other = tf.Variable(np.zeros((VOCAB,), np.int32))
  rows = np.ones((5, 2), np.float32)

  def sums(ids):
    unique, position = tf.unique(ids)
    return unique, tf.math.unsorted_segment_sum(rows, position, tf.shape(unique)[0])

  error = _refused(lambda ids: tf.unique(ids)[0], IDS, node_op=None)
  assert "padded to 5" in str(error) and f"function {error.node!r} returns one" in str(error)
  _refused(lambda ids: tf.reduce_sum(tf.unique(ids)[0]), IDS, node_op="Sum")
  _refused(lambda ids: tf.reduce_sum(sums(ids)[1]), IDS, node_op="Sum")
  # arithmetic on the ids themselves could overflow the out-of-range padding into range
  _refused(lambda ids: table.scatter_add(tf.IndexedSlices(sums(ids)[1], sums(ids)[0] + 1)).read_value(), IDS,
           node_op="AddV2")
  # broadcasting that moves the padded axis off axis 0
  _refused(lambda ids: table.scatter_add(tf.IndexedSlices(
      tf.reduce_sum(sums(ids)[1] * tf.ones((3, 1, 1)), 0), sums(ids)[0])).read_value(), IDS, node_op="Mul")
  # a padded vector broadcast against a column: the padded axis becomes axis 1 (here its length
  # equals the padded length, so only the rank tells)
  wide = tf.Variable(np.zeros((VOCAB, 5), np.float32))
  _refused(lambda ids: wide.scatter_add(tf.IndexedSlices(
      tf.cast(tf.raw_ops.UniqueWithCounts(x=ids)[2], tf.float32) * tf.ones((5, 1)), tf.unique(ids)[0])).read_value(),
      np.array([3, 1, 0, 4, 2], np.int32), node_op="Mul")
  # rows of one Unique scattered at another's ids (here both saw the same ids; not assumed)
  _refused(lambda ids: table.scatter_add(tf.IndexedSlices(sums(ids)[1], tf.unique(ids)[0])).read_value(), IDS,
           node_op="ResourceScatterAdd")
  # the unique ids written as values, not used as row indices
  _refused(lambda ids: other.scatter_update(tf.IndexedSlices(tf.unique(ids)[0], tf.range(tf.size(tf.unique(
      ids)[0])))).read_value(), IDS, node_op="Range")
  _refused(lambda ids: tf.cast(tf.shape(tf.unique(ids)[0])[0], tf.float32), IDS, node_op="Cast")


def test_float_unique_under_jit_still_names_its_node():
  values = IDS.astype(np.float32)
  jax_fn, params = jaxport.convert(tf.function(lambda x: tf.unique(x)[0] * 2.0), values)
  with pytest.raises(DynamicShapeError) as info:
    jax.jit(jax_fn)(params, values)
  assert (info.value.op, info.value.operand) == ("Unique", "input values")


def test_row_updates_through_an_artifact(tmp_path):
  """Exported (jit-traced, so padded) and loaded: the loaded function updates the rows as TF does."""
  ids = np.array([5, 2, 5, 5, 0, 2], np.int32)
  values = np.random.RandomState(0).normal(size=(6, 2)).astype(np.float32)
  fn, variables, jax_fn, params = _row_updates(len(ids), "int32")
  jaxport.export(jax_fn, params, ids, values, path=tmp_path / "artifact", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "artifact")
  for var in variables:
    var.assign(tf.zeros_like(var) - (1 if var.dtype == tf.int32 else 0))
  expected_position = fn(ids, values)
  for run in (loaded, jax.jit(loaded)):
    position, new_params = run(loaded_params, ids, values)
    assert_close(position, expected_position, 0, 0, "positions")
    for key, var in jax_fn.tf_variables.items():
      assert_close(new_params[key], var.numpy(), 1e-6, 1e-6, key)


def _adagrad_rows(ids, values, accumulator, table):
  """tf_keras' new Adagrad on a sparse gradient: sums per id, then the slot's rows gathered at the ids."""
  unique, position = tf.unique(ids)
  sums = tf.math.unsorted_segment_sum(values, position, tf.shape(unique)[0])
  accumulator.scatter_add(tf.IndexedSlices(tf.square(sums), unique))
  denominator = tf.sqrt(tf.gather(accumulator, unique) + 1e-7)
  table.scatter_add(tf.IndexedSlices(-0.1 * sums / denominator, unique))
  return position


@pytest.mark.parametrize("checkify_asserts", [False, True])
def test_rows_gathered_at_the_ids_match_tf_under_jit(checkify_asserts):
  """Gathers at the padded ids read clamped rows for the padding; with checkify on, bounds checks
  skip the padding (a real out-of-range id is still reported)."""
  from jax.experimental import checkify
  accumulator = tf.Variable(np.full((VOCAB, 2), 0.1, np.float32))
  table = tf.Variable(np.random.RandomState(1).normal(size=(VOCAB, 2)).astype(np.float32))
  fn = tf.function(lambda ids, values: _adagrad_rows(ids, values, accumulator, table))
  ids = np.array([4, 8, 4, 4, 1, 8, 0], np.int32)
  values = np.random.RandomState(2).normal(size=(7, 2)).astype(np.float32)
  with jaxport.override_config("enable_checkify_for_asserts", checkify_asserts):
    jax_fn, params = jaxport.convert(fn, ids, values)
  before = {key: var.numpy() for key, var in jax_fn.tf_variables.items()}
  expected_position = fn(ids, values)
  expected = {key: var.numpy() for key, var in jax_fn.tf_variables.items()}
  for key, var in jax_fn.tf_variables.items():   # back to the state the converted function starts from
    var.assign(before[key])
  run = jax.jit(checkify.checkify(jax_fn) if checkify_asserts else jax_fn)
  result = run(params, ids, values)
  if checkify_asserts:
    error, result = result
    assert error.get() is None, error.get()
    bad_error, _ = run(params, np.array([4, 8, 4, 4, 1, 8, VOCAB + 3], np.int32), values)
    assert "not in [0, 9)" in bad_error.get(), bad_error.get()
  position, new_params = result
  assert_close(position, expected_position, 0, 0, "positions")
  for key, value in expected.items():
    assert_close(new_params[key], value, 1e-6, 1e-6, key)


def test_lookup_deduplicated_first_matches_tf():
  """`tf.gather(f(tf.gather(table, unique)), idx)`: each distinct id looked up once, then spread back
  by Unique's `idx`, which reads real rows only. Values, jit, grad (to the table) and vmap against TF."""
  table = np.random.RandomState(3).normal(size=(VOCAB, 4)).astype(np.float32)

  def lookup(table, ids):
    unique, idx = tf.unique(ids)
    rows = tf.tanh(tf.gather(table, unique)) * 2.0
    return tf.gather(rows, idx)

  check(lookup, table, np.array([5, 2, 5, 7, 2, 2], np.int32))
  check(lookup, table, np.array([0, 1, 2, 3], np.int32))   # all distinct: no padding


def test_deduplicated_sparse_gradient_made_dense_matches_tf():
  """An IndexedSlices of per-id sums made dense (`2.0 * g`: TF writes an UnsortedSegmentSum of the padded
  rows at the padded ids into the table's rows): the padding ids fall outside and are dropped. Values,
  jit, grad and vmap against TF; with int16 ids the padding id (32767) would land inside 40000 segments,
  so that use is refused under jit."""
  def dense_step(values, ids, rows=VOCAB):
    unique, position = tf.unique(ids)
    sums = tf.math.unsorted_segment_sum(values, position, tf.shape(unique)[0])
    return tf.constant(2.0) * tf.IndexedSlices(tf.tanh(sums), unique, tf.constant([rows, 3]))

  values = np.random.RandomState(4).normal(size=(6, 3)).astype(np.float32)
  check(dense_step, values, np.array([1, 3, 1, 5, 3, 0], np.int32))
  check(dense_step, values, np.array([1, 3, 1, 5, 3, 0], np.int64))
  error = _refused(lambda ids: dense_step(values, ids, rows=40000), np.array([1, 3, 1, 5, 3, 0], np.int16),
                   node_op="UnsortedSegmentSum")
  assert "padded to 6" in str(error)


@pytest.mark.parametrize("name", ["Nadam", "Adadelta", "Adafactor", "Ftrl"])
def test_tf_keras_optimizers_that_densify_sparse_gradients_train_under_jit(name):
  """tf_keras' Nadam, Adadelta, Adafactor and Ftrl on an Embedding's gradient, three steps threaded
  through params, eagerly and under jit, against TF's own steps from the same start."""
  tf_keras = pytest.importorskip("tf_keras")
  tf_keras.utils.set_random_seed(0)
  model = tf_keras.Sequential([tf_keras.layers.Embedding(10, 4, input_length=5), tf_keras.layers.Flatten(),
                               tf_keras.layers.Dense(1)])
  model.build((None, 5))
  optimizer = getattr(tf_keras.optimizers, name)(0.05)
  optimizer.build(model.trainable_variables)
  x = np.random.RandomState(1).randint(0, 6, (16, 5)).astype(np.int32)   # ids repeat within the batch
  y = np.random.RandomState(2).normal(size=(16, 1)).astype(np.float32)
  check_train_steps(model, optimizer, x, y, training=True)


V1_OPTIMIZERS = {
    "Adam": lambda: tf.compat.v1.train.AdamOptimizer(0.1),   # ScatterAdd into its ref slots
    "Adagrad": lambda: tf.compat.v1.train.AdagradOptimizer(0.1),
    "Momentum": lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
    "RMSProp": lambda: tf.compat.v1.train.RMSPropOptimizer(0.1, momentum=0.5, centered=True),
    "Ftrl": lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01,
                                                     l2_shrinkage_regularization_strength=0.1),
    "Adadelta": lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0),
    "ProximalAdagrad": lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.1, l1_regularization_strength=0.01),
    "AdagradDA": lambda: tf.compat.v1.train.AdagradDAOptimizer(0.1, tf.compat.v1.train.get_global_step()),
    "GradientDescent": lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1),   # ScatterSub, no Unique
}


@pytest.mark.parametrize("name", list(V1_OPTIMIZERS))
def test_tf1_optimizers_train_ref_embeddings_under_jit(name):
  """A TF1 training graph with ref variables (`tf.compat.v1`'s default): the embedding's sparse
  gradient goes through Unique into the ref forms of the sparse updates (`SparseApply*`, `ScatterAdd`).
  Three steps under jit against a Session's, every variable and slot compared."""
  from tf1_oracle import v1_graph
  v1 = tf.compat.v1
  ids_value = np.array([[1, 3, 3], [0, 7, 2]], np.int64)
  y_value = np.array([[0.5], [-1.0]], np.float32)
  with v1_graph() as g:
    ids = v1.placeholder(tf.int64, [2, 3], name="ids")
    y = v1.placeholder(tf.float32, [2, 1], name="y")
    with v1.variable_scope("model", use_resource=False, initializer=v1.random_normal_initializer(seed=1)):
      table, w = v1.get_variable("table", [VOCAB + 1, 4]), v1.get_variable("w", [4, 1])
    pred = tf.matmul(tf.reduce_mean(tf.nn.embedding_lookup(table, ids), 1), w)
    loss = tf.reduce_mean(tf.square(pred - y))
    step = v1.train.get_or_create_global_step()
    train = V1_OPTIMIZERS[name]().minimize(loss, global_step=step)
    with tf.control_dependencies([train]):
      loss_after = tf.identity(loss, name="loss_after")
    variables = v1.global_variables()
  ops = {n.op for n in g.as_graph_def().node}
  assert ("Unique" in ops) == (name != "GradientDescent") and not any(op.startswith("Resource") for op in ops)
  with v1.Session(graph=g) as sess:
    sess.run(v1.global_variables_initializer())
    initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
    losses = [sess.run(loss_after, {ids: ids_value, y: y_value}) for _ in range(3)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  jax_fn, state = jaxport.convert_graph_def(g.as_graph_def(), ["ids", "y"], "loss_after", variables=initial)
  step_fn = jax.jit(jax_fn)
  for expected in losses:
    loss_value, state = step_fn(state, ids_value, y_value)
    np.testing.assert_allclose(loss_value, expected, rtol=1e-5, atol=1e-6)
  for key, value in final.items():
    np.testing.assert_allclose(state[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
