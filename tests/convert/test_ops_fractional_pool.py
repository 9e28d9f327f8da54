"""Fractional pooling against TF: FractionalMaxPool and FractionalAvgPool draw their pooling sequences from
the `rng` key (TF's output shapes, sequence structure and distribution, not TF's values); given the same
sequences, pooling and the gradient ops FractionalMaxPoolGrad and FractionalAvgPoolGrad match TF exactly."""
import collections
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert.host_callback import HostCallbackWarning
from jaxport.convert.ops.fractional_pool import pool_by_sequences, pseudo_random_sequence, random_sequence
from jaxport.errors import InvalidNodeError
from oracle import run_rule

RAW = tf.raw_ops
KEY = jax.random.key(0)
FORWARD = {"FractionalMaxPool": RAW.FractionalMaxPool, "FractionalAvgPool": RAW.FractionalAvgPool}
GRAD = {"FractionalMaxPool": "FractionalMaxPoolGrad", "FractionalAvgPool": "FractionalAvgPoolGrad"}


def values(shape, dtype, seed=0):
  rs = np.random.RandomState(seed)
  if np.dtype(dtype).kind == "i":
    return rs.randint(-50, 50, size=shape).astype(dtype)
  return rs.normal(size=shape).astype(dtype)


def reference_pool(x, rows, cols, overlapping, average):
  """TF's kernel loops in NumPy: a maximum from the dtype's lowest value (NaN never wins), or one sum in
  scan order (rows, then columns) divided by the element count (truncated for integers)."""
  x, floating = np.asarray(x), np.asarray(x).dtype.kind == "f"
  lowest = (np.finfo if floating else np.iinfo)(x.dtype).min
  out = np.zeros((x.shape[0], len(rows) - 1, len(cols) - 1, x.shape[3]), x.dtype)
  for i in range(len(rows) - 1):
    row_end = min(rows[i + 1] - (not overlapping), x.shape[1] - 1)
    for j in range(len(cols) - 1):
      col_end = min(cols[j + 1] - (not overlapping), x.shape[2] - 1)
      acc = np.full(out[:, i, j].shape, 0 if average else lowest, x.dtype)
      for r in range(rows[i], row_end + 1):
        for c in range(cols[j], col_end + 1):
          acc = acc + x[:, r, c] if average else np.where(acc < x[:, r, c], x[:, r, c], acc)
      count = (row_end - rows[i] + 1) * (col_end - cols[j] + 1)
      if average:
        acc = acc / x.dtype.type(count) if floating else np.trunc(acc / count).astype(x.dtype)
      out[:, i, j] = acc
  return out


def assert_tf_structure(seq, size, out):
  """TF's GeneratePoolingSequence: out + 1 entries from 0 to size, steps of size // out or one more."""
  seq, k = np.asarray(seq), size // out
  assert seq.shape == (out + 1,) and seq[0] == 0 and seq[-1] == size, seq
  assert set(np.diff(seq).tolist()) <= {k, k + 1}, seq


def tf_pool(op, x, ratio, pseudo_random, overlapping, seed=1):
  return [t.numpy() for t in FORWARD[op](value=x, pooling_ratio=ratio, pseudo_random=pseudo_random,
                                         overlapping=overlapping, deterministic=True, seed=seed, seed2=seed + 1)]


# --------------------------------------------------------------------------- the converted ops

# op, input shape, ratio (rows, cols), pseudo_random, overlapping, dtype
CASES = {
    "max_pseudo_overlap": ("FractionalMaxPool", (2, 10, 7, 3), (1.44, 1.73), True, True, np.float32),
    "max_random_odd": ("FractionalMaxPool", (1, 11, 9, 2), (1.44, 1.73), False, False, np.float32),
    "max_ratio2_int32": ("FractionalMaxPool", (2, 9, 8, 2), (2.0, 2.0), True, False, np.int32),
    "max_large_ratio_overlap": ("FractionalMaxPool", (1, 13, 17, 2), (3.3, 2.6), False, True, np.float32),
    "avg_pseudo_overlap": ("FractionalAvgPool", (2, 10, 7, 3), (1.44, 1.73), True, True, np.float32),
    "avg_random": ("FractionalAvgPool", (1, 11, 9, 2), (1.5, 1.73), False, False, np.float32),
    "avg_int32_overlap": ("FractionalAvgPool", (2, 9, 7, 2), (1.73, 1.44), True, True, np.int32),
    "avg_ratio2_random_overlap": ("FractionalAvgPool", (1, 8, 11, 3), (2.0, 1.44), False, True, np.float32),
}


@pytest.mark.parametrize("case", CASES)
def test_converted_op_draws_tf_sequences_and_pools_by_them(case):
  """Eager and under jit, with no host callback: TF's output shapes and dtypes, sequences of TF's
  structure (the same for the same key), and the input pooled by those sequences as TF's kernel pools."""
  op, shape, (row_ratio, col_ratio), pseudo_random, overlapping, dtype = CASES[case]
  tf_fn = tf.nn.fractional_max_pool if op == "FractionalMaxPool" else tf.nn.fractional_avg_pool
  x = values(shape, dtype)
  fn = lambda x: tf_fn(x, [1.0, row_ratio, col_ratio, 1.0], pseudo_random=pseudo_random, overlapping=overlapping)
  expected = tf_pool(op, x, [1, row_ratio, col_ratio, 1], pseudo_random, overlapping)
  with warnings.catch_warnings():
    warnings.simplefilter("error", HostCallbackWarning)
    jax_fn, params = jaxport.convert(fn, x)
    call = lambda x: jax_fn(params, x, rng=KEY)[0]
    results = [call(x), jax.jit(call)(x)]
  for got in results:
    assert [np.shape(g) for g in got] == [e.shape for e in expected]
    assert [np.asarray(g).dtype for g in got] == [jax.dtypes.canonicalize_dtype(e.dtype) for e in expected]
    output, rows, cols = (np.asarray(g) for g in got)
    assert_tf_structure(rows, shape[1], output.shape[1])
    assert_tf_structure(cols, shape[2], output.shape[2])
    np.testing.assert_array_equal(output, reference_pool(x, rows, cols, overlapping, op == "FractionalAvgPool"))
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)


def test_converted_op_under_vmap_and_per_key():
  """vmap over images shares one draw (TF draws once per batch); another key draws other sequences."""
  x = values((4, 2, 12, 10, 3), np.float32)
  fn = lambda x: tf.nn.fractional_avg_pool(x, [1.0, 1.44, 1.44, 1.0], pseudo_random=True)
  jax_fn, params = jaxport.convert(fn, x[0])
  call = lambda x, key: jax_fn(params, x, rng=key)[0]
  batched = jax.jit(jax.vmap(call, in_axes=(0, None)))(x, KEY)
  for k in range(len(x)):
    for got, expected in zip(batched, call(x[k], KEY)):
      np.testing.assert_array_equal(got[k], expected)
  draws = {tuple(np.asarray(call(x[0], jax.random.key(seed))[1])) for seed in range(8)}
  assert len(draws) > 1


@pytest.mark.parametrize("pseudo_random", [True, False])
def test_sequences_follow_tfs_distribution(pseudo_random):
  """Our draws against TF's over many seeds: the frequency of each sequence (5 rows into 3) and the mean of
  each entry (17 rows into 10)."""
  draw = pseudo_random_sequence if pseudo_random else random_sequence
  for size, ratio, n_tf in ((5, 1.6, 500), (17, 1.6, 200)):
    x = np.zeros((1, size, 2, 1), np.float32)
    tf_draws = np.array([tf_pool("FractionalMaxPool", x, [1, ratio, 1, 1], pseudo_random, False, seed)[1]
                         for seed in range(1, n_tf + 1)])
    out = tf_draws.shape[1] - 1
    ours = np.asarray(jax.vmap(lambda key: draw(key, size, out))(jax.random.split(KEY, 2000)))
    for seq in ours[:50]:
      assert_tf_structure(seq, size, out)
    if out == 3:
      tf_freq, our_freq = (collections.Counter(map(tuple, d.tolist())) for d in (tf_draws, ours))
      assert set(our_freq) == set(tf_freq), (our_freq, tf_freq)
      for seq, n in tf_freq.items():
        assert abs(our_freq[seq] / len(ours) - n / n_tf) < 0.07, (seq, our_freq, tf_freq)
    else:
      np.testing.assert_allclose(ours.mean(axis=0), tf_draws.mean(axis=0), atol=0.3)


# --------------------------------------------------------------------------- pooling given TF's sequences


def special_values(x):
  """Ties, NaN (never the maximum: an all-NaN window gives the dtype's lowest value) and infinities."""
  x = np.round(x)   # few distinct values: ties
  x[0, 0, 0, :] = np.nan
  x[0, 3, 4, 0] = x[-1, 5, 2, 1] = np.nan
  x[-1, 1:4, 1:3, 0] = -np.inf
  x[0, 6, 5, 1] = np.inf
  return x


# dtype, x64, special values (max pooling only)
POOL_DTYPES = {"float32": (np.float32, False, False), "float32_special": (np.float32, False, True),
               "float64": (np.float64, True, False), "int32": (np.int32, False, False),
               "int64": (np.int64, True, False)}
POOL_CASES = [(op, case) for op in FORWARD for case in POOL_DTYPES
              if op == "FractionalMaxPool" or not POOL_DTYPES[case][2]]


@pytest.mark.parametrize("op, dtype_case", POOL_CASES)
def test_pooling_given_tfs_sequences_is_tfs_output(op, dtype_case):
  """pool_by_sequences, eager (known sequences) and under jit (traced sequences), bit-exact with TF."""
  dtype, x64, special = POOL_DTYPES[dtype_case]
  x = values((2, 11, 9, 2), dtype)
  x = special_values(x) if special else x
  average = op == "FractionalAvgPool"
  with jax.enable_x64(x64):
    pool = jax.jit(pool_by_sequences, static_argnums=(3, 4))
    for pseudo_random, overlapping, ratio in ((True, True, 1.44), (False, False, 1.73), (False, True, 2.6)):
      expected, rows, cols = tf_pool(op, x, [1, ratio, 1.5, 1], pseudo_random, overlapping)
      for got in (pool_by_sequences(x, rows, cols, overlapping, average), pool(x, rows, cols, overlapping, average)):
        assert np.asarray(got).dtype == x.dtype
        np.testing.assert_array_equal(got, expected)


# --------------------------------------------------------------------------- gradient ops


def tf_grad(op, x, out, backprop, rows, cols, overlapping):
  if op == "FractionalMaxPool":
    return RAW.FractionalMaxPoolGrad(orig_input=x, orig_output=out, out_backprop=backprop, row_pooling_sequence=rows,
                                     col_pooling_sequence=cols, overlapping=overlapping).numpy()
  return RAW.FractionalAvgPoolGrad(orig_input_tensor_shape=np.array(x.shape, np.int64), out_backprop=backprop,
                                   row_pooling_sequence=rows, col_pooling_sequence=cols,
                                   overlapping=overlapping).numpy()


def rule_grad(op, x, out, backprop, rows, cols, overlapping):
  if op == "FractionalMaxPool":
    return run_rule("FractionalMaxPoolGrad", x, out, backprop, rows, cols, overlapping=overlapping)
  return run_rule("FractionalAvgPoolGrad", np.array(x.shape, np.int64), backprop, rows, cols, overlapping=overlapping)


# dtype, x64, ties (in the maximum); x64 changes the float32 arithmetic of average pooling's gradient only
GRAD_DTYPES = {"float32": (np.float32, False, False), "float32_ties": (np.float32, False, True),
               "float32_x64": (np.float32, True, False), "float64": (np.float64, True, False),
               "int32": (np.int32, True, True)}
GRAD_CASES = [(op, case) for op in FORWARD for case in GRAD_DTYPES
              if case != ("float32_x64" if op == "FractionalMaxPool" else "float32_ties")]


@pytest.mark.parametrize("op, dtype_case", GRAD_CASES)
def test_grad_ops_and_jax_grad_match_tf(op, dtype_case):
  """The gradient op rules against TF's, and jax.grad of pool_by_sequences (under jit, traced sequences)
  against the rules: exact. Ties send the gradient to the first maximum in scan order. FractionalAvgPoolGrad
  accumulates in float64: without x64, an input in two overlapping windows may differ from TF in its last bit."""
  dtype, x64, ties = GRAD_DTYPES[dtype_case]
  x = values((2, 11, 9, 2), dtype)
  x = np.round(x / 40).astype(dtype) if ties else x
  floating = np.dtype(dtype).kind == "f"
  with jax.enable_x64(x64):
    @functools.partial(jax.jit, static_argnums=4)
    def jax_grad(x, rows, cols, backprop, overlapping):
      pool = lambda x: jnp.sum(pool_by_sequences(x, rows, cols, overlapping, op == "FractionalAvgPool") * backprop)
      return jax.grad(pool)(x)

    for pseudo_random, overlapping, ratio in ((True, True, (1.44, 1.73)), (False, False, (1.73, 1.44)),
                                              (False, True, (2.0, 2.6))):
      out, rows, cols = tf_pool(op, x, [1, *ratio, 1], pseudo_random, overlapping)
      backprop = values(out.shape, dtype, seed=1)
      expected = tf_grad(op, x, out, backprop, rows, cols, overlapping)
      got = rule_grad(op, x, out, backprop, rows, cols, overlapping)
      assert np.asarray(got).dtype == jax.dtypes.canonicalize_dtype(x.dtype)
      if op == "FractionalAvgPool" and overlapping and not x64:
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
      else:
        np.testing.assert_array_equal(got, expected)
      if floating:
        np.testing.assert_array_equal(jax_grad(x, rows, cols, backprop, overlapping), got)


def test_grad_ops_converted_with_traced_sequences():
  """Both gradient ops in a converted function whose sequences are arguments, eager and under jit."""
  x = values((2, 10, 9, 3), np.float32)
  out, rows, cols = tf_pool("FractionalMaxPool", x, [1, 1.44, 1.73, 1], True, True)
  backprop = values(out.shape, np.float32, seed=1)

  def fn(x, out, backprop, rows, cols):
    return (RAW.FractionalMaxPoolGrad(orig_input=x, orig_output=out, out_backprop=backprop, row_pooling_sequence=rows,
                                      col_pooling_sequence=cols, overlapping=True),
            RAW.FractionalAvgPoolGrad(orig_input_tensor_shape=tf.shape(x, out_type=tf.int64), out_backprop=backprop,
                                      row_pooling_sequence=rows, col_pooling_sequence=cols, overlapping=False))
  args = (x, out, backprop, rows, cols)
  expected = [t.numpy() for t in tf.function(fn)(*args)]
  jax_fn, params = jaxport.convert(fn, *args)
  call = lambda *a: jax_fn(params, *a)[0]
  for got in (call(*args), jax.jit(call)(*args)):
    for g, e in zip(got, expected):
      np.testing.assert_array_equal(g, e)


# --------------------------------------------------------------------------- in a model


def test_model_conv_fractional_max_pool_dense_gradients():
  """conv -> fractional max pool -> dense, converted and differentiated with jax.grad (and TF's own tape
  gradient, converted): TF's gradients for the same pooling sequences, pooled in TF window by window."""
  rs = np.random.RandomState(0)
  x = rs.normal(size=(2, 12, 11, 3)).astype(np.float32)
  conv_w = tf.Variable(rs.normal(size=(3, 3, 3, 4)).astype(np.float32) * 0.3)
  dense_w = tf.Variable(rs.normal(size=(5, 6, 4, 2)).astype(np.float32) * 0.3)   # pooled (5, 6, 4) -> 2

  def conv(x):
    return tf.nn.relu(tf.nn.conv2d(x, conv_w, 1, "SAME"))

  def head(pooled):
    return tf.reduce_sum(tf.tensordot(pooled, dense_w, 3) ** 2)

  @tf.function
  def forward(x):
    pooled, rows, cols = tf.nn.fractional_max_pool(conv(x), [1.0, 2.2, 1.8, 1.0], pseudo_random=True,
                                                   overlapping=True)
    return head(pooled), rows, cols

  @tf.function
  def tape_grads(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss, rows, cols = forward(x)
    return tape.gradient(loss, [x, conv_w, dense_w]), rows, cols

  def reference(rows, cols):
    """TF's loss gradients with the pooling spelled out for the given sequences (windows include their
    right boundary: overlapping)."""
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
      tape.watch(xt)
      y = conv(xt)
      pooled = tf.stack([tf.stack([tf.reduce_max(y[:, rows[i]:rows[i + 1] + 1, cols[j]:cols[j + 1] + 1], axis=(1, 2))
                                   for j in range(len(cols) - 1)], axis=1) for i in range(len(rows) - 1)], axis=1)
      loss = head(pooled)
    return [g.numpy() for g in tape.gradient(loss, [xt, conv_w, dense_w])]

  jax_fn, params = jaxport.convert(forward, x)
  names = {v.ref(): k for k, v in jax_fn.tf_variables.items()}

  @jax.jit
  def grads(params, x):
    loss_fn = lambda params, x: jax_fn(params, x, rng=KEY)[0][0]
    return jax.grad(loss_fn, argnums=(0, 1))(params, x), jax_fn(params, x, rng=KEY)[0][1:]

  (param_grads, x_grad), (rows, cols) = grads(params, x)
  expected = reference(np.asarray(rows), np.asarray(cols))
  got = [x_grad, param_grads[names[conv_w.ref()]], param_grads[names[dense_w.ref()]]]
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)

  tape_fn, tape_params = jaxport.convert(tape_grads, x)
  tape_got, rows, cols = jax.jit(lambda p, x: tape_fn(p, x, rng=KEY)[0])(tape_params, x)
  expected = reference(np.asarray(rows), np.asarray(cols))
  for g, e in zip(tape_got, expected):
    np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("ratio, shape, match", [
    ([1, 0.5, 1.5, 1], (1, 6, 6, 1), "pooling_ratio cannot be smaller than 1"),
    ([2, 1.5, 1.5, 1], (2, 6, 6, 1), "not yet supported on the batch nor channel dimension"),
    ([1, 1.5, 1.5, 1.5], (1, 6, 6, 3), "not yet supported on the batch nor channel dimension"),
    ([1, 11, 1.5, 1], (1, 10, 6, 1), "Pooling ratio is higher than input dimension size for dimension 1"),
    ([1, 1.5, 1.5, 1], (0, 6, 6, 1), "Pooling ratio is higher than input dimension size for dimension 0"),
    ([1, 1.5, 1.5, 1], (6, 6, 1), "tensor_in must be 4-dimensional"),
])
@pytest.mark.parametrize("op", FORWARD)
def test_forward_refuses_what_tf_refuses(op, ratio, shape, match):
  with pytest.raises(tf.errors.OpError, match=match):   # TF's refusal, for the record
    FORWARD[op](value=np.zeros(shape, np.float32), pooling_ratio=ratio)
  with pytest.raises(InvalidNodeError, match=match):
    run_rule(op, np.zeros(shape, np.float32), pooling_ratio=ratio, pseudo_random=False, overlapping=False,
             deterministic=False, seed=0, seed2=0)


def test_forward_refuses_a_seed_without_deterministic():
  with pytest.raises(InvalidNodeError, match="Both seed and seed2 should be 0 if deterministic is false"):
    run_rule("FractionalMaxPool", np.zeros((1, 6, 6, 1), np.float32), pooling_ratio=[1, 1.5, 1.5, 1],
             pseudo_random=False, overlapping=False, deterministic=False, seed=3, seed2=0)


def test_grad_ops_refuse_what_tf_refuses():
  x = values((2, 9, 8, 3), np.float32)
  out, rows, cols = tf_pool("FractionalMaxPool", x, [1, 1.5, 1.5, 1], True, True)
  g = np.ones(out.shape, np.float32)
  shape = np.array(x.shape, np.int64)
  with pytest.raises(InvalidNodeError, match="row_seq_tensor must have at least 7 elements, but got 6"):
    run_rule("FractionalAvgPoolGrad", shape, g, rows[:-1], cols, overlapping=True)
  with pytest.raises(InvalidNodeError, match="Row sequence tensor values must not be negative"):
    run_rule("FractionalAvgPoolGrad", shape, g, rows - 1, cols, overlapping=True)
  with pytest.raises(InvalidNodeError, match="Rows dimension of input must not be 0"):
    run_rule("FractionalAvgPoolGrad", np.array([2, 0, 8, 3]), g, rows, cols, overlapping=True)
  with pytest.raises(InvalidNodeError, match="col_seq_tensor must have at least 6 elements, but got 5"):
    run_rule("FractionalMaxPoolGrad", x, out, g, rows, cols[:-1], overlapping=True)
  with pytest.raises(InvalidNodeError, match="out_backprop shape"):
    run_rule("FractionalMaxPoolGrad", x, out, g[:, :-1], rows, cols, overlapping=True)
  with pytest.raises(InvalidNodeError, match="orig_input should be a non-empty tensor of rank 4"):
    run_rule("FractionalMaxPoolGrad", x[:0], out, g, rows, cols, overlapping=True)
