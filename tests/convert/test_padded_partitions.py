"""DynamicPartition with traced partitions (under jit, vmap, grad): its outputs are padded to their
bound, and a stitch of one partitioning of known positions takes them back
(`convert/padded_rows.py`). That is how TF looks up rows of partitioned variables
(`tf.compat.v1` partitioners, a list of tables in `tf.nn.embedding_lookup`) and how routing code
splits a batch by a computed id. Every other use of a padded value raises `PaddedSizeError`.
TF is the oracle: TF1 Sessions, TF2 functions and `GradientTape`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from jaxport.errors import PaddedSizeError
from oracle import assert_close, check_train_steps, through_artifact

v1 = tf.compat.v1
VOCAB = 11

V1_OPTIMIZERS = {
    "GradientDescent": lambda: v1.train.GradientDescentOptimizer(0.1),   # ScatterSub at the partitioned ids
    "Adagrad": lambda: v1.train.AdagradOptimizer(0.1),   # Unique of the partitioned ids, SparseApplyAdagrad
    "Adam": lambda: v1.train.AdamOptimizer(0.1),
    "Ftrl": lambda: v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01),
    "Momentum": lambda: v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
}
PARTITIONERS = {
    "fixed3": lambda: v1.fixed_size_partitioner(3),
    "min_max": lambda: v1.min_max_variable_partitioner(max_partitions=4, min_slice_size=32),   # 2 parts
}


def _train_v1(optimizer: str, partitioner: str, strategy: str):
  """A TF1 training graph over a partitioned embedding (ref variables): three steps in a Session
  from the same start; returns the graph def, the start, the losses and the final variables."""
  from tf1_oracle import v1_graph
  ids_value = np.array([[1, 3, 3, 10], [0, 7, 2, 3]], np.int64)   # ids repeat, some parts get none twice
  y_value = np.array([[0.5], [-1.0]], np.float32)
  with v1_graph() as g:
    ids = v1.placeholder(tf.int64, [2, 4], name="ids")
    y = v1.placeholder(tf.float32, [2, 1], name="y")
    with v1.variable_scope("model", use_resource=False, initializer=v1.random_normal_initializer(seed=1)):
      table = v1.get_variable("table", [VOCAB, 4], partitioner=PARTITIONERS[partitioner]())
      w = v1.get_variable("w", [4, 1])
    rows = v1.nn.embedding_lookup(table, ids, partition_strategy=strategy)
    loss = tf.reduce_mean(tf.square(tf.matmul(tf.reduce_mean(rows, 1), w) - y))
    step = v1.train.get_or_create_global_step()
    train = V1_OPTIMIZERS[optimizer]().minimize(loss, global_step=step)
    with tf.control_dependencies([train]):
      tf.identity(loss, name="loss_after")
    variables = v1.global_variables()
  assert "DynamicPartition" in {n.op for n in g.as_graph_def().node}
  with v1.Session(graph=g) as sess:
    sess.run(v1.global_variables_initializer())
    initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
    losses = [sess.run("loss_after:0", {ids: ids_value, y: y_value}) for _ in range(3)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  return g.as_graph_def(), initial, losses, final, (ids_value, y_value)


@pytest.mark.parametrize("optimizer,partitioner,strategy", [
    *[(name, "fixed3", "mod") for name in V1_OPTIMIZERS],
    ("Adagrad", "fixed3", "div"), ("Adam", "min_max", "div"), ("GradientDescent", "min_max", "mod")])
def test_tf1_partitioned_embedding_trains_under_jit(optimizer, partitioner, strategy):
  """The lookup partitions the ids and their positions by a computed part, gathers from each part
  and stitches the rows back; the gradient gathers at the padded positions and each part's update
  (a scatter, or Unique then a sparse apply) drops the padding. Three steps under jit and eagerly
  against the Session's: the losses and every part, slot and counter."""
  graph_def, initial, losses, final, feeds = _train_v1(optimizer, partitioner, strategy)
  jax_fn, state = jaxport.convert_graph_def(graph_def, ["ids", "y"], "loss_after", variables=initial)
  for label, step_fn in (("jit", jax.jit(jax_fn)), ("eager", jax_fn)):
    params = state
    for expected in losses:
      loss, params = step_fn(params, *feeds)
      assert_close(loss, expected, 1e-5, 1e-6, f"{label} loss")
    for key, value in final.items():
      assert_close(params[key], value, 1e-5, 1e-6, f"{label} {key}")


def _sharded_model(tf_keras):
  class ShardedEmbedding(tf_keras.layers.Layer):
    """A table in three shards, looked up as `tf.nn.embedding_lookup(list_of_shards, ids)`."""

    def build(self, _):
      self.shards = [self.add_weight(f"shard_{k}", (4, 3)) for k in range(3)]

    def call(self, ids):
      return tf.nn.embedding_lookup(self.shards, ids)

  tf_keras.utils.set_random_seed(0)
  model = tf_keras.Sequential([ShardedEmbedding(), tf_keras.layers.Flatten(), tf_keras.layers.Dense(1)])
  model(np.zeros((1, 4), np.int32))
  return model


@pytest.mark.parametrize("name", ["SGD", "Adam", "Adagrad"])
def test_tf2_sharded_embedding_train_step_under_jit(name):
  """A tf_keras layer over a list of shards, trained by a tf_keras optimizer in a `tf.function`
  (GradientTape's IndexedSlices per shard, deduplicated by Unique): three steps eagerly and under
  jit against TF's."""
  tf_keras = pytest.importorskip("tf_keras")
  model = _sharded_model(tf_keras)
  optimizer = getattr(tf_keras.optimizers, name)(0.05)
  optimizer.build(model.trainable_variables)
  x = np.array([[1, 5, 11, 5], [0, 3, 3, 7], [9, 2, 2, 2]], np.int32)
  y = np.array([[0.5], [-1.0], [2.0]], np.float32)
  check_train_steps(model, optimizer, x, y)


def _routed(weights):
  @tf.function
  def route(x, expert):
    """Rows split by a computed expert, each expert's dense layer, stitched back in order."""
    parts = tf.dynamic_partition(x, expert, len(weights))
    positions = tf.dynamic_partition(tf.range(tf.shape(x)[0]), expert, len(weights))
    return tf.dynamic_stitch(positions, [tf.nn.relu(tf.matmul(p, w)) for p, w in zip(parts, weights)])
  return route


def test_routing_by_a_computed_partition_matches_tf_under_jit_grad_and_vmap():
  rs = np.random.RandomState(0)
  weights = [tf.Variable(rs.normal(size=(4, 5)).astype(np.float32)) for _ in range(3)]
  route = _routed(weights)
  x = rs.normal(size=(7, 4)).astype(np.float32)
  expert = np.array([2, 0, 2, 1, 0, 2, 2], np.int32)   # expert 1 gets one row
  expected = route(x, expert).numpy()
  jax_fn, params = jaxport.convert(route, x, expert)
  assert_close(jax_fn(params, x, expert)[0], expected, 1e-6, 1e-6, "eager")
  assert_close(jax.jit(jax_fn)(params, x, expert)[0], expected, 1e-6, 1e-6, "jit")
  loaded, loaded_params = through_artifact(jax_fn, params, (x, expert))
  assert_close(jax.jit(loaded)(loaded_params, x, expert)[0], expected, 1e-6, 1e-6, "loaded artifact")
  loaded_grad = jax.grad(lambda x: jnp.sum(loaded(loaded_params, x, expert)[0] ** 2))(x)

  with tf.GradientTape() as tape:
    tape.watch(x_tf := tf.constant(x))
    loss = tf.reduce_sum(route(x_tf, expert) ** 2)
  tf_grads = tape.gradient(loss, [x_tf, *weights])
  keys = [k for k in params if k in jax_fn.tf_variables]
  grads = jax.jit(jax.grad(lambda p, x: jnp.sum(jax_fn(p, x, expert)[0] ** 2), argnums=(0, 1)))(params, x)
  assert_close(grads[1], tf_grads[0].numpy(), 1e-5, 1e-5, "d/dx")
  assert_close(loaded_grad, tf_grads[0].numpy(), 1e-5, 1e-5, "loaded artifact d/dx")
  by_variable = {jax_fn.tf_variables[k].ref(): grads[0][k] for k in keys}
  for w, g in zip(weights, tf_grads[1:]):
    assert_close(by_variable[w.ref()], g.numpy(), 1e-5, 1e-5, f"d/d{w.name}")

  experts = np.stack([expert, expert[::-1], np.zeros_like(expert)])   # one batch row routes all to expert 0
  xs = np.stack([x, x * 2, x])
  batched = jax.jit(jax.vmap(lambda x, e: jax_fn(params, x, e)[0]))(xs, experts)
  for b in range(3):
    assert_close(batched[b], route(xs[b], experts[b]).numpy(), 1e-6, 1e-6, f"vmap row {b}")


@settings(max_examples=25, deadline=None)
@given(parts=st.lists(st.integers(0, 3), min_size=0, max_size=9), k=st.integers(1, 4),
       positions=st.sampled_from(["range", "repeats"]))
def test_partition_then_stitch_matches_tf_for_any_partitions(parts, k, positions):
  """Any partitions (empty ones included) and known positions, repeated positions too (the last one
  wins, in TF's order: partition by partition): jit against TF's graph."""
  parts = np.asarray([p % k for p in parts], np.int32)
  n = len(parts)
  where = np.arange(n, dtype=np.int32) if positions == "range" else (np.arange(n, dtype=np.int32) * 7) % max(n // 2, 1)

  @tf.function
  def fn(x, p):
    values = tf.dynamic_partition(x * 2.0 + 1.0, p, k)
    return tf.dynamic_stitch(tf.dynamic_partition(tf.constant(where), p, k), values)

  x = np.arange(n * 2, dtype=np.float32).reshape(n, 2) + 0.5
  expected = fn(x, parts).numpy()
  jax_fn, params = jaxport.convert(fn, x, parts)
  assert_close(jax.jit(jax_fn)(params, x, parts)[0], expected, 0, 0, "jit")


def _refused(fn, *args, node_op):
  jax_fn, params = jaxport.convert(tf.function(fn), *args)
  with pytest.raises(PaddedSizeError) as info:
    jax.jit(jax_fn)(params, *args)
  assert info.value.op == node_op and "DynamicPartition node" in str(info.value)
  return info.value


def test_uses_the_padding_would_change_are_refused_under_jit_and_run_eagerly():
  x = np.arange(12, dtype=np.float32).reshape(6, 2)
  p = np.array([1, 0, 1, 1, 0, 0], np.int32)

  def some_partitions(x, p):   # a stitch of part of a partitioning: TF's size is not known
    idx, parts = tf.dynamic_partition(tf.range(6), p, 2), tf.dynamic_partition(x, p, 2)
    return tf.dynamic_stitch(idx[:1], parts[:1])

  def traced_positions(x, p):   # positions partitioned from traced values: no known size
    idx, parts = tf.dynamic_partition(tf.cast(x[:, 0], tf.int32), p, 2), tf.dynamic_partition(x, p, 2)
    return tf.dynamic_stitch(idx, parts)

  def reduced(x, p):   # a sum over a padded partition's rows would count the padding's length
    return tf.reduce_mean(tf.dynamic_partition(x, p, 2)[0], 0)

  def returned(x, p):   # its size would differ from TF's
    return tf.dynamic_partition(x, p, 2)[1] * 2.0

  _refused(some_partitions, x, p, node_op="DynamicStitch")
  _refused(traced_positions, x, p, node_op="DynamicStitch")
  _refused(reduced, x, p, node_op="Mean")
  error = _refused(returned, x, p, node_op=None)
  assert "padded to 6" in str(error)
  for fn in (some_partitions, traced_positions, reduced, returned):   # eagerly: TF's shapes and values
    jax_fn, params = jaxport.convert(tf.function(fn), x, p)
    # (XLA divides a mean's sum by its count as a product with 1/count: an ulp from TF)
    assert_close(jax_fn(params, x, p)[0], tf.function(fn)(x, p).numpy(), 0, 1e-7, fn.__name__)
