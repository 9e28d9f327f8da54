"""Op rules: candidate sampling (`tf.nn.sampled_softmax_loss`, `tf.nn.nce_loss`, `tf.random.*_candidate_sampler`).

The samplers are stateful random ops: like `ops/random.py` they draw from the converted function's
`rng` (their `seed` attrs ignored), following TF's process: `unique=True` draws until `num_sampled`
distinct classes are found, and the expected counts use the number of draws that took, as TF's
`RangeSampler` does: `p * num_sampled` without `unique`, else `1 - (1 - p) ** num_tries`.
LearnedUnigram samplers keep hidden state across Session runs; they stay with the host callback.

`ComputeAccidentalHits` is exact. Its output size is the number of true classes that were also
sampled: with traced inputs (under jit) its outputs are padded to `batch * num_true` (rows past
the count: an out-of-range row index, id 0, weight 0), which `SparseToDense` drops, as
`sampled_softmax_loss` uses them (`convert/padded_rows.py`).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert import padded_rows
from jaxport.convert.ops._util import known_value, text, xp
from jaxport.convert.ops.core import runtime_check
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_BLOCK = 1 << 16   # most draws the unique sampler checks at once


def _log_uniform(range_max: int):
  log_range = math.log1p(range_max)

  def sample(key, shape):
    # TF: int64(exp(u * log(range + 1))) - 1, mod range (rounding can reach range)
    u = jax.random.uniform(key, shape, jnp.float32)
    return (jnp.floor(jnp.exp(u * np.float32(log_range))).astype(jnp.int32) - 1) % range_max

  def probability(values):
    # (log(v + 2) - log(v + 1)) / log(range + 1), as log1p(1 / (v + 1)) to keep float32's precision
    v = values.astype(jnp.float32)
    return jnp.log1p(1.0 / (v + 1.0)) / np.float32(log_range)
  return sample, probability


def _uniform(range_max: int):
  def sample(key, shape):
    return jax.random.randint(key, shape, 0, range_max, jnp.int32)

  def probability(values):
    return jnp.full(jnp.shape(values), 1.0 / range_max, jnp.float32)
  return sample, probability


def _fixed_unigram(ctx, range_max: int):
  """TF's FixedUnigramSampler: ids are the reserved ones (weight 0), then one per count of `unigrams`
  or of the last column of `vocab_file`; a shard keeps the ids with `id % num_shards == shard`, and
  its classes are their positions in that list (so range_max is the shard's size), each weighted
  `count ** distortion`."""
  counts = list(ctx.attr("unigrams", []) or [])
  vocab_file = text(ctx.attr("vocab_file", b""))
  if vocab_file:
    with open(vocab_file) as f:
      counts = [float(line.rstrip("\n").split(",")[-1]) for line in f if line.strip()]
  reserved, shards, shard = ctx.attr("num_reserved_ids", 0), ctx.attr("num_shards", 1), ctx.attr("shard", 0)
  every = np.concatenate([np.zeros(reserved), np.asarray(counts, np.float64) ** ctx.attr("distortion", 1.0)])
  weights = every[np.arange(len(every)) % shards == shard]
  if len(weights) != range_max:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: range is {range_max} must be equal to weights size "
                           f"{len(weights)} (TF's check: the shard's reserved ids and unigrams)")
  p = (weights / weights.sum()).astype(np.float32)
  log_p = np.log(np.where(p > 0, p, 1.0)).astype(np.float32)
  log_p[p == 0] = -np.inf

  def sample(key, shape):
    return jax.random.categorical(key, jnp.asarray(log_p), shape=shape).astype(jnp.int32)

  def probability(values):
    return jnp.asarray(p)[jnp.clip(values, 0, range_max - 1)]
  return sample, probability


def _draw_unique(key, sample, num_sampled: int):
  """TF's unique sampling: draws one at a time, keeps the values not drawn before, until
  `num_sampled` are kept; returns them and the number of draws. Draws go in blocks: a draw is new
  when no kept value equals it (a binary search in the sorted kept values) and it is its value's
  first draw in the block (a stable sort of the block)."""
  block = min(num_sampled, _BLOCK)
  unfilled = jnp.iinfo(jnp.int32).max   # above every class

  def step(state):
    t, kept, count, tries = state
    draws = sample(jax.random.fold_in(key, t), (block,))
    known = jnp.sort(jnp.where(jnp.arange(num_sampled) < count, kept, unfilled))
    seen = known[jnp.minimum(jnp.searchsorted(known, draws), num_sampled - 1)] == draws
    order = jnp.argsort(draws, stable=True)
    in_order = draws[order]
    first = jnp.zeros(block, bool).at[order].set(jnp.concatenate([jnp.ones(1, bool), in_order[1:] != in_order[:-1]]))
    new = ~seen & first
    at = count + jnp.cumsum(new) - 1
    taken = new & (at < num_sampled)
    kept = kept.at[jnp.where(taken, at, num_sampled)].set(draws, mode="drop")
    # draws up to the one that filled the batch count as tries; a block that does not fill it, all of it
    fills = taken & (at == num_sampled - 1)
    used = jnp.where(jnp.any(fills), jnp.argmax(fills) + 1, block)
    return t + 1, kept, jnp.minimum(count + jnp.sum(new), num_sampled), tries + used

  state = (jnp.int32(0), jnp.zeros(num_sampled, jnp.int32), jnp.int32(0), jnp.int32(0))
  _, kept, _, tries = jax.lax.while_loop(lambda s: s[2] < num_sampled, step, state)
  return kept, tries


def _expected_count(p, num_sampled: int, tries, unique: bool):
  """TF's ExpectedCountHelper: p * num_sampled where every draw was kept, else 1 - (1 - p) ** tries."""
  if not unique:
    return p * np.float32(num_sampled)
  by_tries = -jnp.expm1(tries.astype(jnp.float32) * jnp.log1p(-p))
  return jnp.where(tries == num_sampled, p * np.float32(num_sampled), by_tries)


def _check_true_classes(ctx, true_classes, range_max: int) -> None:
  m = xp(true_classes)
  bad = m.reshape(true_classes, (-1,))
  runtime_check(ctx, (true_classes >= 0) & (true_classes < range_max),
                f"`true_candidate` out of range [0, {range_max}), received {{}}",
                bad[m.argmax((bad < 0) | (bad >= range_max))] if np.size(true_classes) else 0)


def _sampler(make):
  def rule(ctx, true_classes):
    num_sampled, range_max, unique = ctx.attr("num_sampled"), ctx.attr("range_max"), ctx.attr("unique")
    _check_true_classes(ctx, true_classes, range_max)
    if unique and num_sampled > range_max:
      raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: cannot draw {num_sampled} distinct classes from "
                             f"range_max {range_max}")
    sample, probability = make(ctx, range_max)
    key = ctx.runtime.rng_for(ctx.name)
    if num_sampled == 0:
      sampled, tries = jnp.zeros(0, jnp.int32), jnp.int32(0)
    elif unique:
      sampled, tries = _draw_unique(key, sample, num_sampled)
    else:
      sampled, tries = sample(key, (num_sampled,)), jnp.int32(num_sampled)
    true = jnp.asarray(true_classes)
    out_dtype = jax.dtypes.canonicalize_dtype(np.int64)
    return (sampled.astype(out_dtype), _expected_count(probability(true), num_sampled, tries, unique),
            _expected_count(probability(sampled), num_sampled, tries, unique))
  return rule


register("LogUniformCandidateSampler", needs_rng=True)(_sampler(lambda ctx, n: _log_uniform(n)))
register("UniformCandidateSampler", needs_rng=True)(_sampler(lambda ctx, n: _uniform(n)))
register("FixedUnigramCandidateSampler", needs_rng=True)(_sampler(_fixed_unigram))


@register("AllCandidateSampler")
def all_candidate_sampler(ctx, true_classes):
  """Every class 0..num_sampled-1, each expected once (TF's AllSampler)."""
  n = ctx.attr("num_sampled")
  _check_true_classes(ctx, true_classes, n)   # its range is num_sampled
  return (np.arange(n, dtype=jax.dtypes.canonicalize_dtype(np.int64)),
          np.ones(np.shape(true_classes), np.float32), np.ones(n, np.float32))


@register("ComputeAccidentalHits")
def compute_accidental_hits(ctx, true_classes, sampled_candidates):
  """For each true class in row-major order that is also sampled: its row, the last position it
  has among the samples, and -FLT_MAX."""
  known = [known_value(true_classes), known_value(sampled_candidates)]
  m = np if all(k is not None for k in known) else jnp
  true, sampled = (known if m is np else (jnp.asarray(true_classes), jnp.asarray(sampled_candidates)))
  batch, num_true = np.shape(true)
  n, s = batch * num_true, np.shape(sampled)[0]
  match = m.reshape(true, (n, 1)) == m.reshape(sampled, (1, s))
  hit = m.any(match, axis=1)
  last = (s - 1 - m.argmax(match[:, ::-1], axis=1)).astype(np.int32) if s else m.zeros(n, np.int32)
  rows = (m.arange(n) // max(num_true, 1)).astype(np.int32)
  lowest = np.float32(np.finfo(np.float32).min)
  id_dtype = jax.dtypes.canonicalize_dtype(np.int64) if m is jnp else np.int64
  if m is np:
    return rows[hit], last[hit].astype(id_dtype), np.full(int(hit.sum()), lowest, np.float32)
  at = jnp.where(hit, jnp.cumsum(hit) - 1, n)   # hits first, in order; the rest dropped
  indices = jnp.full(n, jnp.iinfo(jnp.int32).max, jnp.int32).at[at].set(rows, mode="drop")
  ids = jnp.zeros(n, id_dtype).at[at].set(last.astype(id_dtype), mode="drop")
  weights = jnp.zeros(n, jnp.float32).at[at].set(lowest, mode="drop")
  padded_rows.mark(ctx.runtime, indices, padded_rows.INDEX, ctx.name, n, maker="ComputeAccidentalHits")
  for value in (ids, weights):
    padded_rows.mark(ctx.runtime, value, padded_rows.ROWS, ctx.name, n, maker="ComputeAccidentalHits")
  return indices, ids, weights
