"""Bounded constant folding: results of constant inputs over `max_constant_bytes` stay ops (issue 19).

A shape-only mask (Range, compare, BroadcastTo) used to fold into one NumPy constant of batch x seq^2,
captured in the jaxpr and written into exported artifacts. Over the limit, the rule runs on jax Arrays
instead and the mask is an iota/compare/broadcast that XLA fuses.
"""
import os

import jax
import jax.extend as jex
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport import config
from jaxport.errors import ConfigError

LIMIT = 1 << 20
B, S = 8, 512


def _arrays(closed) -> list:
  """Every constant a closed jaxpr captures: its consts and the literals of every (nested) equation."""
  found, stack = [np.asarray(c) for c in closed.consts], [closed.jaxpr]
  while stack:
    jaxpr = stack.pop()
    for eqn in jaxpr.eqns:
      found += [np.asarray(v.val) for v in eqn.invars if isinstance(v, jex.core.Literal)]
      for value in eqn.params.values():
        for item in value if isinstance(value, (tuple, list)) else [value]:
          if isinstance(item, jex.core.ClosedJaxpr):
            found += [np.asarray(c) for c in item.consts]
            stack.append(item.jaxpr)
          elif isinstance(item, jex.core.Jaxpr):
            stack.append(item)
  return found


def _largest_constant(jax_fn, params, *args) -> int:
  return max([a.nbytes for a in _arrays(jax.make_jaxpr(jax_fn)(params, *args))], default=0)


@tf.function
def causal_scores(x):
  """A [B, S, S] causal mask from shapes only, applied to x: the GPT-2 pattern."""
  n = tf.shape(x)[1]
  r = tf.range(n)
  mask = tf.broadcast_to((r[:, None] >= r[None, :])[None], tf.stack([tf.shape(x)[0], n, n]))
  return tf.cast(mask, tf.float32) * x[:, :, None]


X = np.random.RandomState(0).normal(size=(B, S)).astype(np.float32)


def test_default_limit_is_one_mib():
  assert config.max_constant_bytes() == LIMIT == jaxport.get_config("max_constant_bytes")
  assert "max_constant_bytes" in config.describe()


def test_shape_only_mask_is_not_a_constant():
  jax_fn, params = jaxport.convert(causal_scores, X)
  assert _largest_constant(jax_fn, params, X) <= LIMIT
  expected = causal_scores(X).numpy()
  out, _ = jax.jit(jax_fn)(params, X)
  np.testing.assert_array_equal(np.asarray(out), expected)
  out, _ = jax_fn(params, X)   # eager (no jit): the staged ops run on concrete arrays
  np.testing.assert_array_equal(np.asarray(out), expected)
  grad = jax.jit(jax.grad(lambda x: jax_fn(params, x)[0].sum()))(X)   # through the staged mask
  xt = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(xt)
    total = tf.reduce_sum(causal_scores(xt))
  np.testing.assert_array_equal(np.asarray(grad), tape.gradient(total, xt).numpy())


def test_raised_limit_folds_as_before():
  with jaxport.override_config("max_constant_bytes", 1 << 30):
    jax_fn, params = jaxport.convert(causal_scores, X)
  assert _largest_constant(jax_fn, params, X) == B * S * S * 4   # the folded [B, S, S] float32 mask
  out, _ = jax.jit(jax_fn)(params, X)
  np.testing.assert_array_equal(np.asarray(out), causal_scores(X).numpy())


def test_zero_limit_stages_every_constant_result():
  with jaxport.override_config("max_constant_bytes", 0):
    jax_fn, params = jaxport.convert(causal_scores, X)
  out, _ = jax.jit(jax_fn)(params, X)
  np.testing.assert_array_equal(np.asarray(out), causal_scores(X).numpy())


def test_fill_and_tile_over_the_limit_stay_ops():
  @tf.function
  def f(x):
    ones = tf.fill(tf.stack([tf.shape(x)[0], 512, 512]), 2.0)   # 8 MiB of float32
    tiled = tf.tile(tf.range(512)[None], [2048, 1])              # 4 MiB of int32
    return ones * x[:, :, None], tf.reduce_sum(tiled)
  jax_fn, params = jaxport.convert(f, X)
  assert _largest_constant(jax_fn, params, X) <= LIMIT
  out, _ = jax.jit(jax_fn)(params, X)
  for a, e in zip(out, f(X)):
    np.testing.assert_array_equal(np.asarray(a), e.numpy())


def test_big_range_is_an_iota():
  @tf.function
  def f(x):
    return tf.cast(tf.range(tf.size(x) * 64), tf.float32)   # 4097 * 64 int32s: just over 1 MiB
  x = np.zeros((4097,), np.float32)
  jax_fn, params = jaxport.convert(f, x)
  closed = jax.make_jaxpr(jax_fn)(params, x)
  assert max(a.nbytes for a in _arrays(closed)) <= LIMIT
  assert "iota" in str(closed.jaxpr)
  out, _ = jax.jit(jax_fn)(params, x)
  np.testing.assert_array_equal(np.asarray(out), f(x).numpy())


def test_shape_from_a_big_mask_still_folds():
  """A shape that depends on the big mask's values (Where) folds it after all, as without the limit."""
  @tf.function
  def f(x):
    n = tf.shape(x)[1]
    r = tf.range(n)
    mask = tf.broadcast_to((r[:, None] >= r[None, :])[None], tf.stack([tf.shape(x)[0], n, n]))
    return tf.cast(tf.shape(tf.where(mask))[0], tf.float32) + tf.reduce_sum(x)
  jax_fn, params = jaxport.convert(f, X)
  out, _ = jax.jit(jax_fn)(params, X)
  np.testing.assert_allclose(np.asarray(out), f(X).numpy(), rtol=1e-6)


def test_small_shape_arithmetic_stays_numpy():
  """Below the limit nothing changes: shapes, and a 256 KiB mask, are folded constants."""
  @tf.function
  def f(x):
    r = tf.range(tf.shape(x)[1])
    return tf.reshape(x, tf.stack([-1, tf.shape(x)[1] // 2])), tf.cast(r[:, None] >= r[None, :], tf.float32)
  jax_fn, params = jaxport.convert(f, X)
  closed = jax.make_jaxpr(jax_fn)(params, X)
  assert "iota" not in str(closed.jaxpr)
  assert max(a.nbytes for a in _arrays(closed)) == S * S * 4
  out, _ = jax.jit(jax_fn)(params, X)
  for a, e in zip(out, f(X)):
    np.testing.assert_array_equal(np.asarray(a), e.numpy())


# --------------------------------------------------------------------------- the config key


@pytest.mark.parametrize("value", [True, False, "1024", 1.5, -1, None, np.bool_(True)])
def test_limit_refuses_non_sizes(value):
  with pytest.raises(ConfigError, match="max_constant_bytes.*non-negative int"):
    jaxport.update_config("max_constant_bytes", value)
  assert config.max_constant_bytes() == LIMIT


@pytest.mark.parametrize("value", [0, 4096, np.int64(1 << 24)])
def test_limit_takes_ints(value):
  with jaxport.override_config("max_constant_bytes", value):
    assert config.max_constant_bytes() == int(value)
    assert type(config.max_constant_bytes()) is int
  assert config.max_constant_bytes() == LIMIT


# --------------------------------------------------------------------------- GPT-2 (the model)


def test_gpt2_export_is_small(tmp_path):
  keras_hub = pytest.importorskip("keras_hub")
  import keras
  if keras.backend.backend() != "tensorflow":
    pytest.skip("needs KERAS_BACKEND=tensorflow")
  from jaxport.artifact._manifest import FUNCTION_FILE
  keras.utils.set_random_seed(0)
  model = keras_hub.models.GPT2Backbone(vocabulary_size=100, num_layers=2, hidden_dim=32, num_heads=2,
                                        intermediate_dim=64, max_sequence_length=S)
  mask = np.ones((B, S), "int32")
  mask[1, S - 3:] = 0
  inputs = {"token_ids": np.random.RandomState(0).randint(1, 100, (B, S)).astype("int32"),
            "padding_mask": mask}
  jax_fn, params = jaxport.convert(model, inputs)
  jaxport.export(jax_fn, params, path=tmp_path)
  size = os.path.getsize(tmp_path / FUNCTION_FILE)
  assert size < 1_000_000, f"{FUNCTION_FILE} is {size} bytes"   # 16.8 MB when the mask was folded
  expected = model(inputs, training=False).numpy()
  out, _ = jax.jit(jax_fn)(params, inputs)
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4 * np.abs(expected).max())
