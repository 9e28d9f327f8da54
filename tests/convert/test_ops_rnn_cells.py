"""TF's fused RNN kernels against TF: LSTMBlockCell, BlockLSTM, BlockLSTMV2 and GRUBlockCell (peepholes,
cell clip, forget bias, seq_len_max below T, traced under jit, float16), their gradients against
tf.GradientTape, the gradient ops LSTMBlockCellGrad, BlockLSTMGrad, BlockLSTMGradV2 and GRUBlockCellGrad,
and a TF1 graph with BlockLSTM over placeholders and variables (as LSTMBlockFusedCell builds it)."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

import jax
import jax.numpy as jnp
import jaxport
from oracle import assert_close, check
from tf1_oracle import check_graph, v1_graph

raw = tf.raw_ops


# TF registers gradients for BlockLSTM and BlockLSTMV2 only; tf.contrib.rnn registered these two (its
# lstm_ops.py and gru_ops.py), and a TF1 graph differentiated with contrib holds what they build.
def _lstm_block_cell_grad(op, *grads):
  x, cs_prev, h_prev, w, wci, wcf, wco, b = op.inputs
  i, cs, f, o, ci, co, _ = op.outputs
  cs_prev_grad, dicfo, wci_grad, wcf_grad, wco_grad = raw.LSTMBlockCellGrad(
      x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b, i=i, cs=cs, f=f, o=o, ci=ci,
      co=co, cs_grad=grads[1], h_grad=grads[6], use_peephole=op.get_attr("use_peephole"))
  inputs = x.shape[1]
  xh_grad = tf.matmul(dicfo, w, transpose_b=True)
  w_grad = tf.matmul(tf.concat([x, h_prev], 1), dicfo, transpose_a=True)
  return (xh_grad[:, :inputs], cs_prev_grad, xh_grad[:, inputs:], w_grad, wci_grad, wcf_grad, wco_grad,
          tf.reduce_sum(dicfo, 0))


def _gru_block_cell_grad(op, *grads):
  x, h_prev, w_ru, w_c, b_ru, b_c = op.inputs
  r, u, c, _ = op.outputs
  d_x, d_h_prev, d_c_bar, d_r_bar_u_bar = raw.GRUBlockCellGrad(
      x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c, r=r, u=u, c=c, d_h=grads[3])
  d_w_ru = tf.matmul(tf.concat([x, h_prev], 1), d_r_bar_u_bar, transpose_a=True)
  d_w_c = tf.matmul(tf.concat([x, h_prev * r], 1), d_c_bar, transpose_a=True)
  return d_x, d_h_prev, d_w_ru, d_w_c, tf.reduce_sum(d_r_bar_u_bar, 0), tf.reduce_sum(d_c_bar, 0)


for _op, _grad in (("LSTMBlockCell", _lstm_block_cell_grad), ("GRUBlockCell", _gru_block_cell_grad)):
  try:
    tf_ops.gradient_registry.lookup(_op)
  except LookupError:
    tf_ops.RegisterGradient(_op)(_grad)


def lstm_weights(rs, inputs, cell, dtype=np.float32):
  """w, wci, wcf, wco, b; the peephole weights large enough to matter."""
  w = rs.normal(scale=0.5, size=(inputs + cell, 4 * cell))
  return [a.astype(dtype) for a in (w, *rs.normal(size=(3, cell)), rs.normal(scale=0.5, size=4 * cell))]


def lstm_state(rs, batch, cell, dtype=np.float32):
  """cs_prev (beyond a cell clip of 1 in places), h_prev."""
  return rs.normal(scale=1.5, size=(batch, cell)).astype(dtype), rs.uniform(-1, 1, (batch, cell)).astype(dtype)


CELL_CASES = [dict(use_peephole=False, cell_clip=-1.0, forget_bias=1.0),
              dict(use_peephole=True, cell_clip=-1.0, forget_bias=0.0),
              dict(use_peephole=True, cell_clip=1.0, forget_bias=1.0),
              dict(use_peephole=False, cell_clip=0.5, forget_bias=2.5)]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("attrs", CELL_CASES, ids=str)
def test_lstm_block_cell(attrs, batch):
  rs = np.random.RandomState(batch)
  x = rs.normal(size=(batch, 3)).astype(np.float32)
  args = [x, *lstm_state(rs, batch, 4), *lstm_weights(rs, 3, 4)]
  fn = lambda x, cs, h, w, wci, wcf, wco, b: raw.LSTMBlockCell(  # noqa: E731
      x=x, cs_prev=cs, h_prev=h, w=w, wci=wci, wcf=wcf, wco=wco, b=b, **attrs)
  check(fn, *args, vmap=batch > 1)


def test_lstm_block_cell_float16():
  rs = np.random.RandomState(7)
  args = [rs.normal(size=(2, 3)).astype(np.float16), *lstm_state(rs, 2, 4, np.float16),
          *lstm_weights(rs, 3, 4, np.float16)]
  fn = lambda x, cs, h, w, wci, wcf, wco, b: raw.LSTMBlockCell(  # noqa: E731
      x=x, cs_prev=cs, h_prev=h, w=w, wci=wci, wcf=wcf, wco=wco, b=b, use_peephole=True, cell_clip=1.0)
  check(fn, *args, atol=5e-3, rtol=5e-3, grad_atol=3e-2, vmap=False)


def block_lstm_args(rs, steps, batch, inputs=3, cell=4, dtype=np.float32):
  x = rs.normal(size=(steps, batch, inputs)).astype(dtype)
  return [x, *lstm_state(rs, batch, cell, dtype), *lstm_weights(rs, inputs, cell, dtype)]


INPUT_NAMES = ["x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b"]
OUTPUT_NAMES = ["i", "cs", "f", "o", "ci", "co", "h"]


def block_lstm(op, seq_len_max, steps, attrs):
  """A function of (seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b): cs and h, and the gate outputs
  of the first seq_len_max steps (TF leaves them uninitialized after it)."""
  if op == "BlockLSTMV2":
    attrs = {k: v for k, v in attrs.items() if k != "forget_bias"}

  def fn(n, x, cs, h, w, wci, wcf, wco, b):
    i, cs, f, o, ci, co, h = getattr(raw, op)(seq_len_max=n, x=x, cs_prev=cs, h_prev=h, w=w, wci=wci, wcf=wcf,
                                              wco=wco, b=b, **attrs)
    return [cs, h] + [g[:seq_len_max] for g in (i, f, o, ci, co)]
  return fn


# TF's gradient of BlockLSTMV2 runs BlockLSTMGrad, whose gate layout is BlockLSTM's: tf.GradientTape's
# gradient is wrong there, and the converted one is compared with BlockLSTMGradV2 instead (below).

@pytest.mark.parametrize("op, attrs", [("BlockLSTM", case) for case in CELL_CASES[1:]] + [("BlockLSTMV2", CELL_CASES[2])],
                         ids=str)
def test_block_lstm(op, attrs):
  """All T steps; seq_len_max is traced under jit (and under vmap)."""
  args = block_lstm_args(np.random.RandomState(0), 5, 2)
  check(block_lstm(op, 5, 5, attrs), np.int64(5), *args, grad=op == "BlockLSTM")


@pytest.mark.parametrize("op", ["BlockLSTM", "BlockLSTMV2"])
@pytest.mark.parametrize("seq_len_max", [0, 3])
def test_block_lstm_stops_at_seq_len_max(op, seq_len_max):
  """Zeros from seq_len_max on; no gradient flows from them. Batch 1, no peepholes, the default clip."""
  args = block_lstm_args(np.random.RandomState(seq_len_max), 6, 1)
  fn = block_lstm(op, seq_len_max, 6, dict(forget_bias=0.5))
  check(fn, np.int64(seq_len_max), *args, grad=op == "BlockLSTM")
  if seq_len_max:   # a constant
    check(lambda *a: fn(np.int64(seq_len_max), *a), *args, grad=op == "BlockLSTM", vmap=False)


@pytest.mark.parametrize("seq_len_max", [5, 3])
def test_block_lstm_v2_gradient_is_its_grad_kernels(seq_len_max):
  """jax.grad of the converted BlockLSTMV2 (seq_len_max traced) against TF's BlockLSTMGradV2 kernel."""
  rs = np.random.RandomState(9)
  args = block_lstm_args(rs, 5, 2)
  cs_grad, h_grad = rs.normal(size=(2, 5, 2, 4)).astype(np.float32)
  attrs = dict(use_peephole=True, cell_clip=1.0)

  def fn(n, x, cs_prev, h_prev, w, wci, wcf, wco, b):
    return raw.BlockLSTMV2(seq_len_max=n, x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco,
                           b=b, **attrs)
  n = np.int64(seq_len_max)
  outputs = fn(n, *args)
  expected = raw.BlockLSTMGradV2(seq_len_max=n, **dict(zip(INPUT_NAMES, args)), **dict(zip(OUTPUT_NAMES, outputs)),
                                 cs_grad=cs_grad, h_grad=h_grad, use_peephole=True)
  jax_fn, params = jaxport.convert(fn, n, *args)

  def loss(n, *floats):
    outs = jax_fn(params, n, *floats)[0]
    return jnp.sum(outs[1] * cs_grad) + jnp.sum(outs[6] * h_grad)
  got = jax.jit(jax.grad(loss, argnums=tuple(range(1, 9))))(n, *args)
  assert_close(got, tuple(expected), 1e-5, 1e-5, "gradient")


def test_block_lstm_float16():
  args = block_lstm_args(np.random.RandomState(3), 4, 2, dtype=np.float16)
  fn = block_lstm("BlockLSTM", 3, 4, dict(use_peephole=True, cell_clip=1.0))
  check(fn, np.int64(3), *args, atol=1e-2, rtol=1e-2, grad_atol=5e-2, vmap=False)


def test_block_lstm_refuses_a_constant_seq_len_max_beyond_its_steps():
  args = block_lstm_args(np.random.RandomState(0), 3, 2)
  fn = lambda *a: block_lstm("BlockLSTM", 3, 3, {})(np.int64(4), *a)  # noqa: E731
  with pytest.raises(jaxport.errors.InvalidNodeError, match="seq_len_max must be between 0 and 3 but is 4"):
    jax_fn, params = jaxport.convert(fn, *args)
    jax_fn(params, *args)


@pytest.mark.parametrize("batch", [1, 3])
def test_gru_block_cell(batch):
  rs = np.random.RandomState(batch)
  inputs, cell = 3, 4
  args = [rs.normal(size=(batch, inputs)), rs.uniform(-1, 1, (batch, cell)),
          rs.normal(scale=0.7, size=(inputs + cell, 2 * cell)), rs.normal(scale=0.7, size=(inputs + cell, cell)),
          rs.normal(scale=0.5, size=2 * cell), rs.normal(scale=0.5, size=cell)]
  fn = lambda x, h, w_ru, w_c, b_ru, b_c: raw.GRUBlockCell(  # noqa: E731
      x=x, h_prev=h, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c)
  check(fn, *[a.astype(np.float32) for a in args], vmap=batch > 1)


# The gradient ops on arbitrary forward values: their formulas, not a derivative of them.

@pytest.mark.parametrize("use_peephole", [False, True])
def test_lstm_block_cell_grad(use_peephole):
  rs = np.random.RandomState(4)
  batch, inputs, cell = 3, 2, 4
  forward = [rs.uniform(0.05, 0.95, (batch, cell)) for _ in range(7)]   # i, cs, f, o, ci, co, and cs_grad
  args = [rs.normal(size=(batch, inputs)), *lstm_state(rs, batch, cell), *lstm_weights(rs, inputs, cell),
          *forward, rs.normal(size=(batch, cell))]

  def fn(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, cs_grad, h_grad):
    return raw.LSTMBlockCellGrad(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco, b=b, i=i,
                                 cs=cs, f=f, o=o, ci=ci, co=co, cs_grad=cs_grad, h_grad=h_grad,
                                 use_peephole=use_peephole)
  check(fn, *[np.asarray(a, np.float32) for a in args], grad=False)


@pytest.mark.parametrize("op", ["BlockLSTMGrad", "BlockLSTMGradV2"])
@pytest.mark.parametrize("seq_len_max", [4, 2])
def test_block_lstm_grad(op, seq_len_max):
  rs = np.random.RandomState(seq_len_max)
  steps, batch, inputs, cell = 4, 2, 3, 4
  forward = [rs.uniform(-0.95, 0.95, (steps, batch, cell)) for _ in range(9)]   # i..h, then cs_grad, h_grad
  args = [np.int64(seq_len_max), *block_lstm_args(rs, steps, batch, inputs, cell), *forward]

  def fn(n, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad):
    return getattr(raw, op)(seq_len_max=n, x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco,
                            b=b, i=i, cs=cs, f=f, o=o, ci=ci, co=co, h=h, cs_grad=cs_grad, h_grad=h_grad,
                            use_peephole=seq_len_max == 4)
  check(fn, *[a.astype(np.float32) if a.dtype == np.float64 else a for a in args], grad=False)


def test_gru_block_cell_grad():
  rs = np.random.RandomState(5)
  batch, inputs, cell = 3, 2, 4
  args = [rs.normal(size=(batch, inputs)), rs.normal(size=(batch, cell)), rs.normal(size=(inputs + cell, 2 * cell)),
          rs.normal(size=(inputs + cell, cell)), rs.normal(size=2 * cell), rs.normal(size=cell),
          *[rs.uniform(0.05, 0.95, (batch, cell)) for _ in range(3)], rs.normal(size=(batch, cell))]

  def fn(x, h_prev, w_ru, w_c, b_ru, b_c, r, u, c, d_h):
    return raw.GRUBlockCellGrad(x=x, h_prev=h_prev, w_ru=w_ru, w_c=w_c, b_ru=b_ru, b_c=b_c, r=r, u=u, c=c, d_h=d_h)
  check(fn, *[a.astype(np.float32) for a in args], grad=False)


def test_tf1_graph_with_block_lstm():
  """LSTMBlockFusedCell's graph: BlockLSTM from zero states over a time-major placeholder, its weights in
  variables, seq_len_max the longest of the fed lengths (traced under jit); gradients from tf.gradients."""
  rs = np.random.RandomState(11)
  steps, batch, inputs, cell = 5, 2, 3, 4
  w, wci, wcf, wco, b = lstm_weights(rs, inputs, cell)
  with v1_graph() as graph:
    x = tf.compat.v1.placeholder(tf.float32, [steps, batch, inputs], name="x")
    lengths = tf.compat.v1.placeholder(tf.int32, [batch], name="lengths")
    variable = lambda name, value: tf.compat.v1.get_variable(name, initializer=value)  # noqa: E731
    zeros = tf.zeros([batch, cell])
    _, cs, _, _, _, _, h = raw.BlockLSTM(
        seq_len_max=tf.cast(tf.reduce_max(lengths), tf.int64), x=x, cs_prev=zeros, h_prev=zeros,
        w=variable("kernel", w), wci=variable("w_i_diag", wci), wcf=variable("w_f_diag", wcf),
        wco=variable("w_o_diag", wco), b=variable("bias", b), forget_bias=1.0, cell_clip=-1.0, use_peephole=True)
  feeds = {x: rs.normal(size=(steps, batch, inputs)).astype(np.float32), lengths: np.array([3, 4], np.int32)}
  check_graph(graph, feeds, [h, cs], grad=True)
