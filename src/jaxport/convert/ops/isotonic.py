"""Op rule: IsotonicRegression, the non-increasing least-squares fit of each last-axis vector (TF's
`tf.nn.isotonic_regression` negates its input for an increasing fit).

TF's kernel pools adjacent violators (PAVA): each entry starts a pool, and while the last pool's mean
exceeds the one before, the two merge (sum and count added, the mean recomputed as sum / count in the
output dtype). Each entry then takes its pool's mean, and its pool's index as its segment. This rule runs
the same steps in the same order, so means and segments are TF's, ties included. Its derivative is TF's
gradient: each output's tangent is the mean of its segment's input tangents (marked for export, so a
loaded artifact differentiates the same way rather than through the loops).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.registry import register


@register("IsotonicRegression")
def isotonic_regression(ctx, x):
  out_dtype = jax.dtypes.canonicalize_dtype(ctx.attr("output_dtype", jnp.float32))
  x = jnp.asarray(x)
  if x.ndim == 0 or x.size == 0:
    return x.astype(out_dtype), jnp.zeros(x.shape, jnp.int32)
  rows = x.reshape(-1, x.shape[-1]).astype(out_dtype)
  fitted, segments = _fit_marked(rows)
  return fitted.reshape(x.shape), segments.reshape(x.shape)


@jax.custom_jvp
def _fit(rows):
  return jax.vmap(_pools)(rows)


@_fit.defjvp
def _fit_jvp(primals, tangents):
  (rows,), (d_rows,) = primals, tangents
  fitted, segments = _fit(rows)
  return (fitted, segments), (_segment_means(d_rows, segments), jnp.zeros(segments.shape, jax.dtypes.float0))


_fit_marked = export_marks.marked("isotonic_regression")(_fit)   # an artifact keeps the derivative


def _segment_means(rows, segments):
  """Each entry's mean over its segment (linear in `rows`: the tangent TF's gradient transposes)."""
  sum_per = jax.vmap(functools.partial(jax.ops.segment_sum, num_segments=rows.shape[-1]))
  sums, counts = sum_per(rows, segments), sum_per(jnp.ones_like(rows), segments)
  return jnp.take_along_axis(sums / jnp.maximum(counts, 1), segments, axis=-1)


def _pools(row):
  """The fit of `row` and each entry's segment after PAVA's merges, in TF's order."""
  n = row.shape[0]

  def push(i, stack):
    starts, sums, counts, means, top = stack
    top = top + 1
    starts, sums = starts.at[top].set(i), sums.at[top].set(row[i])
    counts, means = counts.at[top].set(1), means.at[top].set(row[i])

    def violated(stack):
      _, _, _, means, top = stack
      return (top > 0) & (means[top] > means[jnp.maximum(top - 1, 0)])

    def merge(stack):
      starts, sums, counts, means, top = stack
      total, count = sums[top - 1] + sums[top], counts[top - 1] + counts[top]
      sums, counts = sums.at[top - 1].set(total), counts.at[top - 1].set(count)
      return starts, sums, counts, means.at[top - 1].set(total / count.astype(row.dtype)), top - 1

    return lax.while_loop(violated, merge, (starts, sums, counts, means, top))

  empty = (jnp.zeros(n, jnp.int32), jnp.zeros(n, row.dtype), jnp.zeros(n, jnp.int32), jnp.zeros(n, row.dtype),
           jnp.int32(-1))
  starts, _, _, means, top = lax.fori_loop(0, n, push, empty)
  first = jnp.zeros(n, jnp.int32).at[starts].max((jnp.arange(n) <= top).astype(jnp.int32))
  segments = jnp.cumsum(first) - 1
  return means[segments], segments
