"""Lowerings shaped for XLA:CPU's speed and compile time keep TF's numbers.

Covers the depthwise convolution's materialised padded input (a producer such as BatchNorm +
ReLU in front of 5x5/7x7 depthwise convs, as in NASNet and EfficientNet) and AvgPool's
valid-count divisor, which is now a (1, H, W, 1) constant instead of the output's shape.
"""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert.ops import nn
from oracle import check

RAW = tf.raw_ops


def normal(*shape, seed=0):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _separable_block(x, w5, w7, w3s2):
  """Shifted-scaled ReLU producers feeding SAME depthwise convs of 5x5, 7x7 and a strided 3x3."""
  y = tf.nn.relu(x * 1.5 - 0.25)
  y = RAW.DepthwiseConv2dNative(input=y, filter=w5, strides=[1, 1, 1, 1], padding="SAME")
  y = tf.nn.relu(y)
  y = RAW.DepthwiseConv2dNative(input=y, filter=w7, strides=[1, 1, 1, 1], padding="SAME")
  y = tf.nn.swish(y)
  return RAW.DepthwiseConv2dNative(input=y, filter=w3s2, strides=[1, 2, 2, 1], padding="SAME")


@pytest.mark.slow   # ~40 s wall on 2 busy cores (eager + jit of 83 taps)
def test_depthwise_after_producers_matches_tf():
  # Gradients through the barrier are checked by test_ops_nn's depthwise cases (tiny, cheap); here
  # they would compile the transposes of 83 taps (~60 s on 2 busy cores).
  x = normal(1, 8, 7, 3)
  w5, w7, w3 = normal(5, 5, 3, 1, seed=1), normal(7, 7, 3, 1, seed=2), normal(3, 3, 3, 2, seed=3)
  check(_separable_block, x, w5, w7, w3, atol=1e-4, rtol=1e-4, grad=False, vmap=False)


def test_depthwise_padded_input_is_materialised_once():
  # The optimisation barrier keeps XLA from fusing the pad (and its producer) into every tap.
  x, w = normal(1, 6, 6, 2), normal(5, 5, 2, 1, seed=1)
  jax_fn, params = jaxport.convert(
      lambda x, w: RAW.DepthwiseConv2dNative(input=tf.nn.relu(x), filter=w, strides=[1, 1, 1, 1],
                                             padding="SAME"), x, w)
  text = jax.jit(lambda x, w: jax_fn(params, x, w)[0]).lower(x, w).as_text()
  assert "optimization_barrier" in text


def test_avg_pool_count_constant_is_spatial_only():
  counts = nn._valid_counts((4, 7, 6, 16), (1, 3, 3, 1), (1, 2, 1, 1), [(0, 0), (1, 1), (1, 1), (0, 0)])
  assert counts.shape == (1, 4, 6, 1)
  # No padding anywhere: one scalar divisor.
  assert nn._valid_counts((4, 7, 6, 16), (1, 3, 3, 1), (1, 2, 1, 1), [(0, 0)] * 4).shape == (1, 1, 1, 1)


def test_avg_pool_same_batched_channels_matches_tf():
  x = normal(3, 7, 9, 5)
  for stride in (1, 2):
    kw = dict(ksize=[1, 3, 3, 1], strides=[1, stride, stride, 1], padding="SAME")
    check(lambda x: RAW.AvgPool(value=x, **kw), x, atol=1e-5, rtol=1e-5)
