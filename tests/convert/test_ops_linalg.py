"""Matrix products against TF."""
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import jaxport

from jaxport.convert.graph import Node
from jaxport.convert.interpreter import OpContext
from jaxport.convert.registry import get_rule
from oracle import check

RAW = tf.raw_ops


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_transposes(transpose_a, transpose_b):
  a = normal(*((4, 3) if transpose_a else (3, 4)))
  b = normal(*((5, 4) if transpose_b else (4, 5)), seed=1)
  check(lambda a, b: RAW.MatMul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b), a, b)


@pytest.mark.parametrize("dtype", [np.int32, ml_dtypes.bfloat16])
def test_matmul_dtypes(dtype):
  a = (np.arange(12).reshape(3, 4) % 5 - 2).astype(dtype)
  b = (np.arange(8).reshape(4, 2) % 3 - 1).astype(dtype)
  check(lambda a, b: RAW.MatMul(a=a, b=b), a, b, grad=False)


def test_matmul_of_constants_stays_numpy():
  node = Node("mm", "MatMul", [], [], {"transpose_a": True, "transpose_b": False})
  a, b = np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(4, dtype=np.int64).reshape(2, 2)
  out = get_rule("MatMul")(OpContext(node, runtime=None), a, b)
  assert isinstance(out, np.ndarray) and out.dtype == np.int64
  np.testing.assert_array_equal(out, a.T @ b)


@pytest.mark.parametrize("adj_x", [False, True])
@pytest.mark.parametrize("adj_y", [False, True])
def test_batch_matmul_v1_adjoints(adj_x, adj_y):
  x = normal(*((2, 4, 3) if adj_x else (2, 3, 4)))
  y = normal(*((2, 5, 4) if adj_y else (2, 4, 5)), seed=1)
  check(lambda x, y: RAW.BatchMatMul(x=x, y=y, adj_x=adj_x, adj_y=adj_y), x, y)


def test_batch_matmul_v2_broadcasts_batch_dims():
  x, y = normal(2, 1, 3, 4), normal(5, 4, 2, seed=1)
  check(lambda x, y: RAW.BatchMatMulV2(x=x, y=y), x, y)
  check(lambda x, y: RAW.BatchMatMulV2(x=x, y=y, adj_y=True), normal(3, 4), normal(2, 5, 4, seed=1))


def test_batch_matmul_complex_adjoint_conjugates():
  x = (normal(2, 3, 3) + 1j * normal(2, 3, 3, seed=1)).astype(np.complex64)
  y = (normal(2, 3, 2, seed=2) + 1j * normal(2, 3, 2, seed=3)).astype(np.complex64)
  fn = lambda x, y: RAW.BatchMatMulV2(x=x, y=y, adj_x=True)  # noqa: E731
  jax_fn, params = jaxport.convert(fn, x, y)
  # Compared here directly: oracle.assert_close casts complex values to float.
  np.testing.assert_allclose(jax_fn(params, x, y)[0], fn(x, y).numpy(), atol=1e-5, rtol=1e-5)


def test_batch_matmul_v3_mixed_input_dtypes():
  x = (np.arange(24).reshape(2, 3, 4) % 7 - 3).astype(np.int8)
  y = (np.arange(8).reshape(4, 2) % 5 - 2).astype(np.int8)
  check(lambda x, y: RAW.BatchMatMulV3(x=x, y=y, Tout=tf.int32), x, y)
  check(lambda x, y: RAW.BatchMatMulV3(x=x, y=y, Tout=tf.float32, adj_x=True),
        normal(2, 4, 3), normal(2, 4, 2, seed=1))


@pytest.mark.parametrize("equation,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (3, 4, 2)]),
    ("abcd,cde->abe", [(2, 3, 4, 2), (4, 2, 3)]),   # what Keras' MultiHeadAttention emits
    ("ii->i", [(4, 4)]),
    ("ijk->kj", [(2, 3, 4)]),
])
def test_einsum(equation, shapes):
  operands = [normal(*s, seed=i) for i, s in enumerate(shapes)]
  check(lambda *xs: RAW.Einsum(inputs=list(xs), equation=equation), *operands, atol=1e-4, rtol=1e-4)


def test_einsum_integer():
  a, b = np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(12, dtype=np.int32).reshape(3, 4)
  check(lambda a, b: RAW.Einsum(inputs=[a, b], equation="ij,jk->ik"), a, b)
