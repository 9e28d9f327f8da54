"""A softmax consumed by a product over its axis (attention's `softmax(q k^T) v`), normalised after
the product: `(exp(s - max) @ v) / sum(exp(s - max))`, the same maths as flash attention's.

Why: XLA:CPU (jaxlib 0.10) puts the scores' dot, the softmax and the values' dot into one YNNPACK
fusion that runs ~4x slower than the same ops with the division after the second dot (32 x 4 heads
x 128 tokens: 43 ms vs 11 ms; benchmarks/README.md). The division also touches the product (d
values per row) instead of the probabilities (n per row). On GPUs the plain form is faster (an H200:
BERT, GPT-2 and ViT 6-9% slower deferred), so the deferred form is the CPU branch of a
`lax.platform_dependent` and other backends run the product as written.

The Softmax rule records which logits each result came from (`remember`), SelectV2 which entries a
masked softmax zeroes (`remember_masked`: Keras's masked softmax); MatMul, BatchMatMul and Einsum
ask for them (`factors_of`). The probabilities stay as they were for every other consumer,
and XLA drops them when nothing else reads them. Set the config key `defer_softmax_normalization`
to False for the plain form.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert import export_marks
from jaxport.convert.ops._util import is_concrete


def remember(ctx, probabilities, logits):
  """`probabilities` (the Softmax of `logits` over the last axis), noted for the products after it."""
  table = _table(ctx)
  if table is not None and ctx.config["defer_softmax_normalization"]:
    table[id(probabilities)] = (probabilities, logits, None)
  return probabilities


def remember_masked(ctx, result, condition, kept, dropped):
  """`result` = where(condition, kept, dropped): where `kept` is a Softmax and `dropped` zero, the
  result is one too, with the entries outside `condition` zeroed after the normalisation."""
  factors = factors_of(ctx, kept)
  if (factors is not None and is_concrete(dropped) and not np.any(dropped)
      and tuple(result.shape) == tuple(kept.shape)):
    logits, keep = factors
    keep = condition if keep is None else jnp.logical_and(keep, condition)
    _table(ctx)[id(result)] = (result, logits, keep)
  return result


def factors_of(ctx, operand):
  """(logits, keep) where `operand` is the Softmax of `logits` over the last axis with the entries
  outside `keep` (None: none) zeroed, else None."""
  table = _table(ctx)
  if not table or is_concrete(operand):
    return None
  entry = table.get(id(operand))
  return entry[1:] if entry is not None and entry[0] is operand else None


def _table(ctx) -> dict | None:
  """The runtime's record (None for a rule called outside a graph, as some tests do)."""
  return getattr(ctx.runtime, "softmax_logits", None)


def unnormalized(factors, dtype):
  """exp(logits - max) (zeroed outside `keep`) and the row sums of exp(logits - max) (kept axis),
  in `dtype`, as jax.nn.softmax computes them."""
  logits, keep = factors
  shifted = logits - export_marks.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  exps = jnp.exp(shifted)
  sums = jnp.sum(exps, axis=-1, keepdims=True)
  if keep is not None:
    exps = jnp.where(keep, exps, 0)
  return exps.astype(dtype), sums.astype(dtype)


def _on_cpu(deferred, plain):
  """`deferred()` where the computation runs on a CPU, `plain()` elsewhere."""
  return lax.platform_dependent(cpu=deferred, default=plain)


def matmul(ctx, a, b, product):
  """`product(a, b)` (a matrix product over a's last axis) normalised after the product where `a`
  is a Softmax, else None."""
  factors = factors_of(ctx, a)
  if factors is None:
    return None

  def deferred():
    exps, sums = unnormalized(factors, a.dtype)
    return product(exps, b) / sums
  return _on_cpu(deferred, lambda: product(a, b))


def matmul_transposed_b(ctx, a, b_untransposed, product):
  """`product(a, b^T)` where `b_untransposed` is a Softmax: its rows are the product's columns."""
  factors = factors_of(ctx, b_untransposed)
  if factors is None:
    return None

  def deferred():
    exps, sums = unnormalized(factors, b_untransposed.dtype)
    return product(a, jnp.swapaxes(exps, -1, -2)) / jnp.swapaxes(sums, -1, -2)
  return _on_cpu(deferred, lambda: product(a, jnp.swapaxes(b_untransposed, -1, -2)))


def einsum(ctx, equation: str, operands):
  """`jnp.einsum(equation, *operands)` with a Softmax operand normalised after it, or None where
  no operand is a Softmax whose last axis the einsum sums over (and whose other axes it keeps)."""
  if "->" not in equation or "." in equation:
    return None
  inputs, output = equation.replace(" ", "").split("->")
  terms = inputs.split(",")
  if len(terms) != len(operands):
    return None
  for position, (term, operand) in enumerate(zip(terms, operands)):
    factors = factors_of(ctx, operand)
    if factors is None or len(set(term)) != len(term) or not term:
      continue
    axis, kept = term[-1], term[:-1]
    if axis in output or any(letter not in output for letter in kept):
      continue
    return _on_cpu(lambda: _einsum_deferred(equation, operands, position, factors, kept, output),
                   lambda: jnp.einsum(equation, *operands))
  return None


def _einsum_deferred(equation, operands, position, factors, kept, output):
  exps, sums = unnormalized(factors, operands[position].dtype)
  swapped = list(operands)
  swapped[position] = exps
  product = jnp.einsum(equation, *swapped)
  # The row sums (axes `kept`) laid out on the product's axes, size 1 where they have none.
  ordered = "".join(letter for letter in output if letter in kept)
  sums = jnp.einsum(f"{kept}->{ordered}", jnp.squeeze(sums, -1))
  shape = [product.shape[i] if letter in kept else 1 for i, letter in enumerate(output)]
  return product / sums.reshape(shape)
