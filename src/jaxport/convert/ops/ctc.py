"""Op rules: connectionist temporal classification (`CTCLoss`, `CTCGreedyDecoder`), behind
`tf.compat.v1.nn.ctc_loss`, tf_keras' `ctc_batch_cost` and `keras.ops.ctc_decode`.

`CTCLoss` takes time-major logits, the labels as a sparse tensor's (indices, values), and the sequence
lengths; blank is the last class. The labels are laid out as a [batch, n] table (n: the number of label
values, a bound on any row's length), so no size depends on them and the loss runs under jit; the
forward (alpha) recursion runs in log space over time. Its second output, the loss's gradient with
respect to the logits, is JAX's derivative of that loss (TF's gradient function reads it).
`CTCGreedyDecoder`'s output has as many entries as the decoded labels: it needs known logits.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import known_value, static_value
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


# log(0) in the recursion: finite, so the gradient of a logsumexp over impossible paths is 0, not NaN
_IMPOSSIBLE = -1e30


def _label_table(indices, values, batch: int):
  """The sparse labels as a [batch, n] table and each row's length (entries ordered by position)."""
  n = np.shape(values)[0]
  rows, columns = jnp.asarray(indices[:, 0], jnp.int32), jnp.asarray(indices[:, 1], jnp.int32)
  table = jnp.zeros((batch, max(n, 1)), jnp.int32).at[rows, columns].set(jnp.asarray(values, jnp.int32), mode="drop")
  lengths = jnp.zeros(batch, jnp.int32).at[rows].add(1, mode="drop")
  return table, lengths


def _collapse_repeats(table, lengths):
  """Each row with consecutive repeated labels merged into one (preprocess_collapse_repeated)."""
  width = table.shape[1]
  valid = jnp.arange(width)[None] < lengths[:, None]
  keep = valid & jnp.concatenate([jnp.ones_like(table[:, :1], bool), table[:, 1:] != table[:, :-1]], 1)
  position = jnp.cumsum(keep, 1) - 1
  rows = jnp.broadcast_to(jnp.arange(table.shape[0])[:, None], table.shape)
  collapsed = jnp.zeros_like(table).at[rows, jnp.where(keep, position, width)].set(table, mode="drop")
  return collapsed, keep.sum(1).astype(jnp.int32)


def _ctc_loss(logits, table, lengths, sequence_length, blank: int, merge_repeated: bool):
  """-log p(labels | logits) per batch row; logits [time, batch, classes]."""
  steps, batch, _ = logits.shape
  width = 2 * table.shape[1] + 1   # blank, l1, blank, l2, ..., blank
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  position = jnp.arange(width)
  extended = jnp.where(position % 2 == 0, blank, table[:, jnp.minimum(position // 2, table.shape[1] - 1)])
  real = position[None] <= 2 * lengths[:, None]   # [batch, width]: inside this row's lattice
  previous_two = jnp.concatenate([jnp.full((batch, 2), -1), extended[:, :-2]], 1)
  skip = (extended != blank) & (position[None] > 1)
  if merge_repeated:
    skip = skip & (extended != previous_two)
  stay = jnp.ones_like(skip) if merge_repeated else extended == blank
  impossible = jnp.float32(_IMPOSSIBLE)

  def emit(t):
    return jnp.take_along_axis(log_probs[t], extended, axis=1)

  start = jnp.where(position[None] < 2, emit(0), impossible)
  start = jnp.where(real & (sequence_length[:, None] > 0), start, impossible)

  def step(alpha, t):
    shifted = lambda a, k: jnp.concatenate([jnp.full((batch, k), impossible), a[:, :-k]], 1)  # noqa: E731
    paths = jnp.stack([jnp.where(stay, alpha, impossible), shifted(alpha, 1),
                       jnp.where(skip, shifted(alpha, 2), impossible)])
    new = jax.nn.logsumexp(paths, axis=0) + emit(t)
    new = jnp.where(real, new, impossible)
    return jnp.where((t < sequence_length)[:, None], new, alpha), None

  alpha, _ = jax.lax.scan(step, start, jnp.arange(1, steps)) if steps > 1 else (start, None)
  last = 2 * lengths
  ends = jnp.stack([jnp.take_along_axis(alpha, last[:, None], 1)[:, 0],
                    jnp.where(last > 0, jnp.take_along_axis(alpha, jnp.maximum(last - 1, 0)[:, None], 1)[:, 0],
                              impossible)])
  loss = -jax.nn.logsumexp(ends, axis=0)
  # too few steps for the labels (each repeat needs a blank between, when merged): TF's loss is inf
  repeats = jnp.sum((table[:, 1:] == table[:, :-1]) & (jnp.arange(1, table.shape[1])[None] < lengths[:, None]), 1)
  required = lengths + (repeats if merge_repeated else 0)
  return jnp.where(sequence_length < required, jnp.inf, loss)


@register("CTCLoss")
def ctc_loss(ctx, inputs, labels_indices, labels_values, sequence_length):
  _, batch, classes = np.shape(inputs)
  known = known_value(labels_indices)
  if known is not None and batch and np.any(np.bincount(known[:, 0].astype(np.int64), minlength=batch) == 0):
    empty = int(np.flatnonzero(np.bincount(known[:, 0].astype(np.int64), minlength=batch) == 0)[0])
    raise InvalidNodeError(f"CTCLoss node {ctx.name!r}: labels length is zero in batch {empty} (TF refuses it)")
  table, lengths = _label_table(labels_indices, labels_values, batch)
  if ctx.attr("preprocess_collapse_repeated", False):
    table, lengths = _collapse_repeats(table, lengths)
  merge = bool(ctx.attr("ctc_merge_repeated", True))
  ignore_longer = bool(ctx.attr("ignore_longer_outputs_than_inputs", False))
  loss, gradient = _loss_and_gradient(jnp.asarray(inputs), table, lengths, jnp.asarray(sequence_length, jnp.int32),
                                      blank=classes - 1, merge_repeated=merge, ignore_longer=ignore_longer)
  return loss.astype(inputs.dtype), gradient.astype(inputs.dtype)


# One compiled function per shape and attributes: an eager (op by op) call reuses it instead of tracing
# the scan again; under an outer jit it is inlined.
@functools.partial(jax.jit, static_argnames=("blank", "merge_repeated", "ignore_longer"))
def _loss_and_gradient(logits, table, lengths, sequence_length, *, blank: int, merge_repeated: bool,
                       ignore_longer: bool):
  def losses(x):
    loss = _ctc_loss(x, table, lengths, sequence_length, blank, merge_repeated)
    return jnp.where(jnp.isfinite(loss), loss, 0) if ignore_longer else loss   # rows that cannot fit: 0

  loss, pullback = jax.vjp(losses, logits.astype(jnp.float32))
  gradient, = pullback(jnp.ones_like(loss))
  return loss, gradient


@register("CTCGreedyDecoder")
def ctc_greedy_decoder(ctx, inputs, sequence_length):
  """Per row: the best class at each step up to its length, repeats merged (merge_repeated), blanks
  dropped; log_probability is minus the sum of those steps' best logits."""
  logits = static_value(inputs, "inputs (the decoded length depends on their values)", ctx)
  lengths = static_value(sequence_length, "sequence_length", ctx).astype(np.int64)
  steps, batch, classes = logits.shape
  blank = ctx.attr("blank_index", -1)
  blank = classes - 1 if blank < 0 else blank
  best, scores = logits.argmax(-1), logits.max(-1)
  decoded, log_probability = [], np.zeros((batch, 1), logits.dtype)
  for b in range(batch):
    row, previous = [], -1
    for t in range(int(lengths[b])):
      label = int(best[t, b])
      log_probability[b, 0] -= scores[t, b]
      if label != blank and not (ctx.attr("merge_repeated", False) and label == previous):
        row.append(label)
      previous = label
    decoded.append(row)
  indices = np.array([[b, k] for b, row in enumerate(decoded) for k in range(len(row))], np.int64).reshape(-1, 2)
  values = np.array([v for row in decoded for v in row], np.int64)
  shape = np.array([batch, max((len(r) for r in decoded), default=0)], np.int64)
  return indices, values, shape, log_probability
