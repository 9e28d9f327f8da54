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
  """Records the type of every leaf the loader hands to jaxport.interop.to_jax."""
  import jaxport.interop
  seen = []
  to_jax = jaxport.interop.to_jax

  def spy(x, **kwargs):
    seen.append(type(x))
    return to_jax(x, **kwargs)

  monkeypatch.setattr(jaxport.interop, "to_jax", spy)
  return seen
