"""Hashed feature crosses of integer features: `SparseCross` with `hashed_output` (`tf.sparse.cross_hashed`,
Keras' `HashedCrossing`, `tf.feature_column.crossed_column`).

Each batch row crosses every feature of every input column (sparse inputs first, then dense, the last
column varying fastest, as TF's ProductIterator) and hashes the cross as TF's HashCrosser does: starting
from `hash_key`, `FingerprintCat64(hash, value)` for each column's int64 value, then modulo
`num_buckets` (or int64's max). Where the crosses are is decided by the inputs' structure: for dense
inputs by their shapes alone (so jit works); sparse inputs need their indices known (eager calls, or
constants). The hashes are elementwise uint64 jnp ops on the traced values. String features and
string output (`hashed_output=False`) are left to the host callback tier.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert import host_callback
from jaxport.convert.ops import philox as ph
from jaxport.convert.ops._util import jax_dtype, static_value
from jaxport.convert.ops.string_hash import check_bucket_range, shift_mix
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError

_CAT_MUL = np.uint64(0xC6A4A7935BD1E995)
_INT64_MAX = np.uint64(2**63 - 1)


def fingerprint_cat64(first, second):
  """TF's FingerprintCat64 of two uint64 fingerprints (inside `ph.wide()`)."""
  result = first ^ _CAT_MUL
  result = result ^ (shift_mix(second * _CAT_MUL) * _CAT_MUL)
  result = result * _CAT_MUL
  return shift_mix(shift_mix(result) * _CAT_MUL)


def _crosses_natively(node) -> bool:
  attrs = node.attrs
  types = list(attrs.get("sparse_types", [])) + list(attrs.get("dense_types", []))
  return bool(attrs.get("hashed_output")) and all(np.dtype(t) == np.int64 for t in types)


@register("SparseCross", host_nodes=lambda node: not _crosses_natively(node))
def sparse_cross(ctx, *inputs):
  if not _crosses_natively(ctx.node):
    return host_callback.hand_to_host(ctx, *inputs)
  n_sparse = int(ctx.attr("N"))
  sparse_indices = inputs[:n_sparse]
  sparse_values = inputs[n_sparse:2 * n_sparse]
  sparse_shapes = inputs[2 * n_sparse:3 * n_sparse]
  dense = inputs[3 * n_sparse:]
  columns = []   # per column: (feature counts [batch], start offsets [batch]) in its flat values
  batches = set()
  for k, (indices, shape) in enumerate(zip(sparse_indices, sparse_shapes)):
    rows = static_value(indices, f"indices[{k}]", ctx).astype(np.int64)[:, 0]
    batch = int(static_value(shape, f"shapes[{k}]", ctx)[0])
    counts = np.bincount(rows, minlength=batch)[:batch]   # TF reads a row's values from its first one on
    columns.append((counts, np.cumsum(counts) - counts))
    batches.add(batch)
  for k, x in enumerate(dense):
    if np.ndim(x) != 2:
      raise InvalidNodeError(f"SparseCross node {ctx.name!r}: dense input {k} must be a matrix, got shape "
                             f"{np.shape(x)}")
    batch, width = np.shape(x)
    columns.append((np.full(batch, width), np.arange(batch) * width))
    batches.add(batch)
  if len(batches) > 1:
    raise InvalidNodeError(f"SparseCross node {ctx.name!r}: the inputs' batch sizes differ: {sorted(batches)}")
  if not columns:
    raise InvalidNodeError(f"SparseCross node {ctx.name!r}: nothing to cross")
  batch = batches.pop()
  rows, picks = _cross_positions(columns, batch) if batch else (np.zeros(0, np.int64), [np.zeros(0, np.int64)] * len(columns))
  values = [jnp.ravel(jnp.asarray(v)) for v in [*sparse_values, *dense]]
  picked = [jnp.take(v, p, axis=0) for v, p in zip(values, picks)]
  counts = np.bincount(rows, minlength=batch) if len(rows) else np.zeros(batch, np.int64)
  within = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
  indices = np.stack([rows, within], 1).astype(np.int64).reshape(-1, 2)
  shape = np.array([batch, counts.max(initial=0)], np.int64)
  num_buckets = int(ctx.attr("num_buckets"))
  check_bucket_range(ctx, num_buckets if num_buckets > 0 else int(_INT64_MAX))
  hashed = _hash_crosses(int(ctx.attr("hash_key")), num_buckets, jax_dtype(np.int64), *picked)
  return indices, hashed, shape


def _cross_positions(columns, batch: int):
  """The batch row of every cross and, per column, the flat position of its feature in it."""
  counts = np.stack([c for c, _ in columns], 1)   # [batch, columns]
  if (counts == counts[:1]).all():   # every row alike (dense inputs): one product, offset per row
    product = np.indices(counts[0]).reshape(len(columns), -1)   # the last column fastest
    rows = np.repeat(np.arange(batch), product.shape[1])
    picks = [starts[rows] + np.tile(product[i], batch) for i, (_, starts) in enumerate(columns)]
    return rows, picks
  rows, picks = [], [[] for _ in columns]
  for b in range(batch):
    product = np.indices(counts[b]).reshape(len(columns), -1)
    rows.append(np.full(product.shape[1], b))
    for i, (_, starts) in enumerate(columns):
      picks[i].append(starts[b] + product[i])
  return np.concatenate(rows), [np.concatenate(p) for p in picks]


def _hash_crosses(hash_key: int, num_buckets: int, out_dtype, *features):
  with ph.wide():
    return _hash_jit(hash_key, num_buckets, out_dtype, *features)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _hash_jit(hash_key, num_buckets, out_dtype, *features):
  hashed = jnp.full(features[0].shape, np.uint64(hash_key % 2**64))
  for feature in features:
    hashed = fingerprint_cat64(hashed, ph.u64(jnp, feature))
  modulus = np.uint64(num_buckets) if num_buckets > 0 else _INT64_MAX
  return (hashed % modulus).astype(out_dtype)
