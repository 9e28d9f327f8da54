"""TopKV2 and TopK against TF: sorted with ties in index order, and unsorted in the order TF's CPU kernel's
heap leaves the k entries (keras-hub's TopKSampler draws a position among them)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxport
from oracle import assert_close, check
from test_ops_array import legacy_graph_function

raw = tf.raw_ops
rs = np.random.RandomState(0)
X = rs.normal(size=(2, 3, 4)).astype(np.float32)
M = rs.normal(size=(2, 3, 4)).astype(np.float32)


def test_top_k_sorted_ties_by_index():
  x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [0.5, -1.0, 0.5, 0.5, 7.0]], np.float32)
  check(lambda x: tf.math.top_k(x, 3), x, grad=False)
  check(lambda x: tf.math.top_k(x, 2), X)


def test_signed_zeros_tie_in_top_k_sort_and_stable_argsort():
  """TF compares with `>`, so -0.0 and 0.0 tie (index order); XLA's sort would put -0.0 first."""
  x = np.array([[2.0, 0.0, 1.0, -0.0, 2.0, -1.0, 0.0, -0.0], [-0.0, 0.0, -0.0, 0.0, 1.0, 1.0, -2.0, 0.0]], np.float32)
  check(lambda v: (tf.argsort(v, stable=True), tf.argsort(v, direction="DESCENDING", stable=True)), x, grad=False)
  check(lambda v: (tf.math.top_k(v, 5), tf.sort(v), tf.sort(v, direction="DESCENDING")), x)


def test_top_k_v2_raw():
  check(lambda x: raw.TopKV2(input=x, k=3), X)
  fn = jaxport.convert_functional(lambda x, k: raw.TopKV2(input=x, k=k), X, np.int32(2))
  assert fn(X, np.int32(2))[0].shape == (2, 3, 2)   # eager: k is concrete
  with pytest.raises(ValueError, match="TopKV2 node .* needs its `k` as a trace-time constant"):
    jax.jit(fn)(X, np.int32(2))


def test_top_k_v1_matches_top_k_v2():
  fn = legacy_graph_function(X, lambda x: raw.TopKV2(input=x, k=2, name="legacy"), "TopK", k={"i": 2},
                             index_type=None, Tk=None)
  jax_fn, params = jaxport.convert(fn, X)
  expected = raw.TopKV2(input=X, k=2)
  assert_close(jax_fn(params, X)[0], list(expected), 0, 0)
  assert_close(jax.jit(jax_fn)(params, X)[0], list(expected), 0, 0)
  batched = jax.vmap(lambda x: jax_fn(params, x)[0])(np.stack([X, M]))
  assert_close(batched, list(raw.TopKV2(input=np.stack([X, M]), k=2)), 0, 0)


def _rows(kind: str, shape, rng):
  """Rows that exercise the heap: random, few distinct values (ties), ascending (every entry enters),
  descending (none does), and NaN, infinities and signed zeros."""
  x = rng.normal(size=shape)
  if kind == "ties":
    x = rng.randint(0, 4, shape)
  elif kind == "ascending":
    x = np.sort(x, axis=-1)
  elif kind == "descending":
    x = -np.sort(x, axis=-1)
  elif kind == "special":
    x = np.round(x, 1)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, 4, replace=False)] = [np.nan, np.inf, -0.0, 0.0]
  return x.astype(np.float32)


@pytest.mark.parametrize("n, k", [(5, 3), (6, 4), (17, 2), (17, 8), (64, 16), (700, 7)])
@pytest.mark.parametrize("kind", ["random", "ties", "ascending", "descending", "special"])
def test_top_k_unsorted_in_tf_heap_order(kind, n, k):
  """The positions and their order are TF's own, bit for bit, eagerly and under jit."""
  x = _rows(kind, (3, n), np.random.RandomState(n * k))
  check(lambda x: tf.math.top_k(x, k, sorted=False), x, atol=0, rtol=0, grad=False, vmap=False)


def test_top_k_unsorted_gradient_vmap_and_int_inputs():
  x = rs.normal(size=(2, 3, 40)).astype(np.float32)
  check(lambda x: tf.math.top_k(x, 6, sorted=False).values * tf.range(6.0), x, atol=0, rtol=0)
  ints = rs.randint(0, 50, (4, 40)).astype(np.int32)
  check(lambda x: tf.math.top_k(x, 5, sorted=False), ints, atol=0, rtol=0)


def test_top_k_unsorted_edge_k_takes_tf_kernels_other_paths():
  """k = 1 (the first maximum) and k = n (a stable sort) are sorted in TF's kernel too; k = 0 is empty."""
  x = np.array([[1.0, 3.0, 3.0, 2.0], [0.5, 7.0, 0.5, 7.0]], np.float32)
  for k in (0, 1, 4):
    check(lambda x: tf.math.top_k(x, k, sorted=False), x, atol=0, rtol=0, grad=k > 0)


def test_top_k_unsorted_long_rows_across_scan_blocks():
  """Rows longer than the replay's scan block (a vocabulary), ascending ones included: every entry enters."""
  x = rs.normal(size=(2, 3000)).astype(np.float32)
  x[1] = np.sort(x[1])
  check(lambda x: tf.math.top_k(x, 5, sorted=False), x, atol=0, rtol=0, grad=False, vmap=False)


def test_top_k_k_outside_the_last_dimension_is_a_clear_error():
  fn = jaxport.convert_functional(lambda x, k: raw.TopKV2(input=x, k=k, sorted=False), X, np.int32(2))
  with pytest.raises(ValueError, match=r"TopKV2 node .*: k must be in \[0, 4\]"):
    fn(X, np.int32(5))


_ROW = jnp.zeros((2, 24), jnp.float32)
_UNSORTED = jax.jit(jaxport.convert_functional(lambda x: tf.math.top_k(x, 6, sorted=False), _ROW))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([-2.0, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, np.inf, -np.inf, np.nan]) |
                st.floats(-10, 10, width=32), min_size=48, max_size=48))
def test_any_values_unsorted_as_tf(values):
  """Any values (duplicates, NaNs, infinities, signed zeros) of one shape: TF's positions and values."""
  x = np.array(values, np.float32).reshape(2, 24)
  expected = tf.math.top_k(x, 6, sorted=False)
  values_out, indices = _UNSORTED(x)
  np.testing.assert_array_equal(np.asarray(indices), expected.indices.numpy())
  np.testing.assert_array_equal(np.asarray(values_out), expected.values.numpy())
