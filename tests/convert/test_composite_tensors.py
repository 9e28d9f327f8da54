"""Sparse and ragged tensors as inputs and outputs of converted functions (`jaxport.SparseArrays`,
`jaxport.RaggedArrays`): every call form users write (TF objects, the tuples, a BCOO, plain `jax.jit`,
`jax.grad`), a tf_keras model with a sparse input, and an exported artifact loaded back."""
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import jax
import jax.numpy as jnp
from jax.experimental import sparse as jsparse

import jaxport
from jaxport.errors import DynamicShapeError, ShapeMismatchError
from oracle import assert_close

rs = np.random.RandomState(0)
DENSE = np.where(rs.rand(3, 4) < 0.4, rs.normal(size=(3, 4)), 0).astype(np.float32)
DENSE[1] = 0   # an empty row
SPARSE = tf.sparse.from_dense(DENSE)
B = rs.normal(size=(4, 2)).astype(np.float32)


def _arrays(st) -> jaxport.SparseArrays:
  return jaxport.SparseArrays(st.indices.numpy(), st.values.numpy(), st.dense_shape.numpy())


@tf.function
def matmul_and_sums(st, b):
  return tf.sparse.sparse_dense_matmul(st, b), tf.sparse.reduce_sum(st, axis=1)


def test_sparse_input_in_every_call_form():
  jax_fn, params = jaxport.convert(matmul_and_sums, SPARSE, B)
  expected = matmul_and_sums(SPARSE, B)
  value = tf.compat.v1.SparseTensorValue(*(t.numpy() for t in (SPARSE.indices, SPARSE.values, SPARSE.dense_shape)))
  for form in (SPARSE, _arrays(SPARSE), value, jsparse.BCOO.fromdense(DENSE)):
    assert_close(jax_fn(params, form, B)[0], expected, 1e-6, 1e-6, type(form).__name__)
  # the tuple is a pytree: plain jax.jit and jax.grad take it (the dense shape stays static)
  assert_close(jax.jit(jax_fn)(params, _arrays(SPARSE), B)[0], expected, 1e-6, 1e-6, "jit")

  def loss(values, b):
    outs, _ = jax_fn(params, _arrays(SPARSE)._replace(values=values), b)
    return jnp.sum(outs[0] ** 2) + jnp.sum(outs[1] ** 3)
  with tf.GradientTape() as tape:
    values, b = tf.Variable(SPARSE.values), tf.Variable(B)
    outs = matmul_and_sums(tf.SparseTensor(SPARSE.indices, values, SPARSE.dense_shape), b)
    tf_loss = tf.reduce_sum(outs[0] ** 2) + tf.reduce_sum(outs[1] ** 3)
  assert_close(jax.jit(jax.grad(loss, argnums=(0, 1)))(SPARSE.values.numpy(), B),
               tape.gradient(tf_loss, [values, b]), 1e-5, 1e-5, "grad")


def test_dense_shape_is_part_of_the_traced_type():
  jax_fn, params = jaxport.convert(matmul_and_sums, SPARSE, B)
  with pytest.raises(ShapeMismatchError, match=r"dense shape\) was traced as \[3, 4\], got \[5, 4\]"):
    jax_fn(params, tf.SparseTensor([[4, 0]], [1.0], [5, 4]), B)
  # a spec with a free dim: any number of rows eagerly; under jit the rows are not static
  free, params = jaxport.convert(matmul_and_sums, tf.SparseTensorSpec([None, 4], tf.float32),
                                 tf.TensorSpec([4, 2], tf.float32))
  taller = tf.SparseTensor([[0, 1], [4, 3]], [1.0, 2.0], [5, 4])
  assert_close(free(params, taller, B)[0], matmul_and_sums(taller, B), 1e-6, 1e-6)
  with pytest.raises(DynamicShapeError, match="SparseTensorDenseMatMul"):
    jax.jit(free)(params, _arrays(taller), B)


def test_ragged_input_and_composite_outputs():
  ragged = tf.ragged.constant([[1.0, 2.0], [], [3.0, -1.0, 4.0]])

  @tf.function
  def fn(rt, x):
    return (tf.reduce_sum(rt, axis=1), rt.to_tensor(shape=[3, 4]), tf.sparse.from_dense(x),
            tf.RaggedTensor.from_row_lengths(x[0], [1, 3]))
  jax_fn, params = jaxport.convert(fn, ragged, DENSE)
  got, _ = jax_fn(params, ragged, DENSE)
  expected = fn(ragged, DENSE)
  assert isinstance(got[2], jaxport.SparseArrays) and isinstance(got[3], jaxport.RaggedArrays)
  assert_close(got[:2], expected[:2], 1e-6, 1e-6)
  assert_close(tuple(got[2]), (expected[2].indices, expected[2].values, expected[2].dense_shape), 0, 0)
  assert_close(got[3].flat_values, expected[3].flat_values, 0, 0)
  assert_close(got[3].nested_row_splits, tuple(expected[3].nested_row_splits), 0, 0)
  as_arrays = jaxport.RaggedArrays(ragged.flat_values.numpy(), (ragged.row_splits.numpy(),))
  assert_close(jax_fn(params, as_arrays, DENSE)[0][:2], expected[:2], 1e-6, 1e-6)


def test_tf_keras_model_with_a_sparse_input():
  """tf_keras' Dense on a sparse input (its embedding_lookup_sparse path): values and gradients match TF
  eagerly; under jit its sizes depend on the coordinates, and the error names the op."""
  inputs = tf_keras.Input(shape=(4,), sparse=True)
  model = tf_keras.Model(inputs, tf_keras.layers.Dense(3, activation="tanh")(inputs))
  jax_fn, params = jaxport.convert(model, SPARSE)
  assert_close(jax_fn(params, SPARSE)[0], model(SPARSE), 1e-6, 1e-6)
  kernel_key = next(k for k in params if "kernel" in k)

  def loss(p):
    return jnp.sum(jax_fn(p, _arrays(SPARSE))[0] ** 2)
  with tf.GradientTape() as tape:
    tf_loss = tf.reduce_sum(model(SPARSE) ** 2)
  expected = tf.convert_to_tensor(tape.gradient(tf_loss, model.layers[1].kernel))   # IndexedSlices in TF
  assert_close(jax.grad(loss)(params)[kernel_key], expected, 1e-5, 1e-5)
  with pytest.raises(DynamicShapeError):
    jax.jit(jax_fn)(params, _arrays(SPARSE))


def test_sparse_input_through_an_artifact(tmp_path):
  jax_fn, params = jaxport.convert(matmul_and_sums, SPARSE, B)
  jaxport.export(jax_fn, params, SPARSE, B, path=tmp_path / "model")
  loaded, loaded_params = jaxport.load(tmp_path / "model")
  expected = matmul_and_sums(SPARSE, B)
  assert_close(loaded(loaded_params, _arrays(SPARSE), B)[0], expected, 1e-6, 1e-6, "SparseArrays")
  assert_close(loaded(loaded_params, SPARSE, B)[0], expected, 1e-6, 1e-6, "tf.SparseTensor")
  assert_close(jax.jit(loaded)(loaded_params, _arrays(SPARSE), B)[0], expected, 1e-6, 1e-6, "jit")
