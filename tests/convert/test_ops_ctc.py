"""CTC against TF: CTCLoss (sparse labels, every attribute, its gradient output, under jit and grad) and
CTCGreedyDecoder; tf_keras' ctc_batch_cost and Keras 3's ctc_decode as their users call them."""
import numpy as np
import pytest
import tensorflow as tf

import jax
import jaxport
from oracle import assert_close, check

raw = tf.raw_ops
rs = np.random.RandomState(0)
LOGITS = rs.normal(size=(12, 3, 6)).astype(np.float32)   # time-major; class 5 is the blank
LABEL_INDICES = np.array([[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [2, 0], [2, 1]], np.int64)
LABEL_VALUES = np.array([1, 2, 2, 4, 0, 3, 3], np.int32)    # rows: 1 2 2 4 | 0 | 3 3
LENGTHS = np.array([12, 9, 5], np.int32)


@pytest.mark.parametrize("collapse", [False, True])
@pytest.mark.parametrize("merge", [True, False])
def test_ctc_loss(collapse, merge):
  def both(logits):
    return raw.CTCLoss(inputs=logits, labels_indices=LABEL_INDICES, labels_values=LABEL_VALUES,
                       sequence_length=LENGTHS, preprocess_collapse_repeated=collapse, ctc_merge_repeated=merge)
  check(both, LOGITS, grad=False, vmap=False, atol=2e-5)
  check(lambda logits: both(logits)[0], LOGITS, vmap=False, atol=2e-5)   # TF differentiates the loss only


def test_ctc_loss_with_traced_labels_under_jit():
  def fn(logits, indices, values, lengths):
    return raw.CTCLoss(inputs=logits, labels_indices=indices, labels_values=values, sequence_length=lengths)[0]
  check(fn, LOGITS, LABEL_INDICES, LABEL_VALUES, LENGTHS, vmap=False, atol=2e-5)


def test_ctc_greedy_decoder():
  for merge in (True, False):
    check(lambda logits: raw.CTCGreedyDecoder(inputs=logits, sequence_length=LENGTHS, merge_repeated=merge),
          LOGITS, jit=False, grad=False, vmap=False)


def test_keras_ctc_as_users_call_it():
  """tf_keras' ctc_batch_cost (softmax outputs, dense labels: CTCLoss behind a Where) and Keras 3's greedy
  ctc_decode, converted: values match TF eagerly, and the cost's gradient matches GradientTape's."""
  import keras
  import tf_keras
  labels = np.array([[1, 2, 2, 4], [3, 3, 0, 0]], np.int32)
  label_length, input_length = np.array([[4], [2]], np.int32), np.array([[12], [7]], np.int32)
  logits = np.swapaxes(LOGITS[:, :2], 0, 1).copy()   # batch-major

  def cost(x):
    return tf_keras.backend.ctc_batch_cost(labels, tf.nn.softmax(x), input_length, label_length)
  jax_fn, params = jaxport.convert(cost, logits)
  assert_close(jax_fn(params, logits)[0], tf.function(cost)(logits), 2e-5, 1e-5, "cost")
  with tf.GradientTape() as tape:
    x = tf.constant(logits)
    tape.watch(x)
    total = tf.reduce_sum(cost(x))
  grad = jax.grad(lambda v: jax.numpy.sum(jax_fn(params, v)[0]))(logits)
  assert_close(grad, tape.gradient(total, x), 2e-5, 1e-5, "cost gradient")

  def decode(x):
    return keras.ops.ctc_decode(x, np.array([12, 7], np.int32), strategy="greedy")
  jax_fn, params = jaxport.convert(decode, logits)
  assert_close(jax_fn(params, logits)[0], tf.function(decode)(logits), 1e-6, 1e-6, "decode")


def test_keras3_ctc_loss_whose_functions_call_functions_as_ops():
  """Keras 3's CTC loss: its graph's `_Wrapper` functions call other library functions as op types,
  which decoding a FunctionDef must know the signatures of."""
  import keras
  rs = np.random.RandomState(3)
  labels = rs.randint(1, 4, (2, 3)).astype(np.int32)
  probs = tf.nn.softmax(rs.normal(size=(2, 6, 5)).astype(np.float32)).numpy()
  fn = tf.function(lambda y, p: keras.losses.CTC()(y, p))
  calls = {op for f in fn.get_concrete_function(labels, probs).graph.as_graph_def().library.function
           for op in (n.op for n in f.node_def) if op.startswith("cond_")}
  assert calls   # the pattern this covers is still there
  check(fn, labels, probs, vmap=False)
