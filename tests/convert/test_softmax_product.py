"""A Softmax consumed by a product over its axis (attention) is normalised after the product
(ops/softmax_product.py): TF vs converted, jit, gradients, vmap; where it applies and where not."""
import jax
import jax.extend
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from oracle import check

RAW = tf.raw_ops


def normal(*shape, seed=0):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


Q, K, V = normal(2, 3, 5, 4), normal(2, 3, 6, 4, seed=1), normal(2, 3, 6, 4, seed=2)
MASK = np.random.RandomState(3).uniform(size=(2, 1, 5, 6)) > 0.3


def scores(q, k):
  return tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.5)


ATTENTION = {
    "matmul": lambda q, k, v: tf.matmul(scores(q, k), v),
    "adj_y": lambda q, k, v: tf.linalg.matrix_transpose(
        RAW.BatchMatMulV2(x=tf.linalg.matrix_transpose(v), y=scores(q, k), adj_y=True)),
    "einsum": lambda q, k, v: tf.einsum("bhqk,bhkd->bhqd", scores(q, k), v),
    # Keras MultiHeadAttention's layout: scores "acbe" (batch, head, query, key), values "aecd".
    "einsum_keras": lambda q, k, v: tf.einsum("acbe,aecd->abcd", scores(q, k),
                                              tf.transpose(v, [0, 2, 1, 3])),
    "masked": lambda q, k, v: tf.matmul(tf.where(MASK, scores(q, k), 0.0), v),
    "matmul_2d": lambda q, k, v: tf.matmul(tf.nn.softmax(tf.matmul(q[0, 0], k[0, 0], transpose_b=True)),
                                           v[0, 0]),
    "matmul_2d_transpose_b": lambda q, k, v: RAW.MatMul(
        a=tf.transpose(v[0, 0]), b=tf.nn.softmax(tf.matmul(q[0, 0], k[0, 0], transpose_b=True)),
        transpose_b=True),
    # Not deferrable: the product sums over queries, not the softmax's axis (keys).
    "over_queries": lambda q, k, v: tf.einsum("bhqk,bhqd->bhkd", scores(q, k), q),
    # The probabilities also leave the function.
    "probabilities_too": lambda q, k, v: (tf.matmul(scores(q, k), v), scores(q, k)),
}
DEFERRED = {"matmul", "adj_y", "einsum", "einsum_keras", "masked", "matmul_2d", "matmul_2d_transpose_b",
            "probabilities_too"}


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_attention_matches_tf(case):
  check(ATTENTION[case], Q, K, V, atol=2e-5, rtol=2e-5)


def _divisions(case: str, deferred: bool, platform: str = "cpu") -> set[tuple[int, ...]]:
  """Shapes of the divisions in the converted function's jaxpr, as compiled for `platform`."""
  with jaxport.override_config("defer_softmax_normalization", deferred):
    fn, params = jaxport.convert(ATTENTION[case], Q, K, V)
  jaxpr = jax.make_jaxpr(lambda *a: fn(params, *a)[0])(Q, K, V)
  shapes = set()

  def walk(jaxpr) -> list[bool]:
    """Records the live divisions (XLA drops the rest); which of `jaxpr`'s inputs are live."""
    needed = {v for v in jaxpr.outvars if isinstance(v, jax.extend.core.Var)}
    for eqn in reversed(jaxpr.eqns):
      if not any(v in needed for v in eqn.outvars):
        continue
      if eqn.primitive.name == "div":
        shapes.add(tuple(eqn.outvars[0].aval.shape))
      chosen = eqn.params.get("branches_platforms")
      if chosen is not None:   # a per-platform cond: XLA compiles only `platform`'s branch
        index = next((i for i, names in enumerate(chosen) if names is not None and platform in names),
                     next(i for i, names in enumerate(chosen) if names is None))
        live = walk(eqn.params["branches"][index].jaxpr)
        needed.update(v for v, used in zip(eqn.invars[1:], live) if used and isinstance(v, jax.extend.core.Var))
        continue
      needed.update(v for v in eqn.invars if isinstance(v, jax.extend.core.Var))
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
    return [v in needed for v in jaxpr.invars]
  walk(jaxpr.jaxpr)
  return shapes


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_the_division_moves_after_the_product_only_where_it_sums_over_the_softmax_axis(case):
  probabilities = {(2, 3, 5, 6), (5, 6)}
  plain, deferred = _divisions(case, False), _divisions(case, True)
  assert plain & probabilities   # jax.nn.softmax divides the probabilities
  if case == "probabilities_too":
    assert (2, 3, 5, 4) in deferred and deferred & probabilities
  elif case in DEFERRED:
    assert not deferred & probabilities, deferred
  else:
    assert deferred == plain
  # GPUs run the product as written (the deferred form is slower there).
  assert _divisions(case, True, platform="cuda") == _divisions(case, False, platform="cuda") == plain


def test_exported_for_cpu_and_cuda_each_platform_gets_its_form():
  fn, params = jaxport.convert(ATTENTION["matmul"], Q, K, V)
  f = lambda *a: fn(params, *a)[0]
  exported = jax.export.export(jax.jit(f), platforms=("cpu", "cuda"))(Q, K, V)
  np.testing.assert_allclose(exported.call(Q, K, V), f(Q, K, V), rtol=1e-6, atol=1e-7)
  text = exported.mlir_module()
  assert "stablehlo.case" in text   # one branch per platform, chosen by the platform index at run time


def test_fully_masked_rows_stay_zero_and_keep_their_gradient():
  mask = np.ones((2, 1, 5, 6), bool)
  mask[:, :, 0] = False   # query 0 sees no key

  def fn(q, k, v):
    logits = tf.where(mask, tf.matmul(q, k, transpose_b=True), -1e9)
    return tf.matmul(tf.where(mask, tf.nn.softmax(logits), 0.0), v)
  check(fn, Q, K, V, atol=2e-5, rtol=2e-5)
