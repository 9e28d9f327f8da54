"""Shared helpers of the jaxport.data tests."""
import jax
import numpy as np


def host(tree):
  """A batch as nested NumPy arrays, for comparisons."""
  return jax.tree.map(np.asarray, tree)


def assert_batches_equal(actual, expected):
  assert len(actual) == len(expected), (len(actual), len(expected))
  for number, (a, e) in enumerate(zip(actual, expected)):
    a, e = host(a), host(e)
    assert jax.tree.structure(a) == jax.tree.structure(e), (number, a, e)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(e)):
      np.testing.assert_array_equal(x, y, err_msg=f"batch {number}")


def spy_on_to_jax(monkeypatch) -> list:
  """Records the type of every leaf the loader converts to a jax.Array (without a sharding), and
  checks that the array shares the leaf's memory."""
  from jaxport.data import _transfer
  from jaxport.interop import shares_memory
  seen = []
  make = _transfer.jax_leaf_converter

  def spying_converter(*args, **kwargs):
    convert = make(*args, **kwargs)

    def spy(x):
      y = convert(x)
      assert shares_memory(x, y), f"the {type(x).__name__} leaf was copied"
      seen.append(type(x))
      return y
    return spy

  monkeypatch.setattr(_transfer, "jax_leaf_converter", spying_converter)
  return seen
