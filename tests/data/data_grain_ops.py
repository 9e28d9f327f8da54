"""grain transforms of test_data_grain.py, in a module of their own: grain's worker processes
unpickle them, importing this module only (not jaxport, jax or TensorFlow)."""
import grain
import numpy as np


def example(i):
  return {"id": np.int64(i), "x": np.full(2, i, np.float32)}


class Example(grain.transforms.Map):
  def map(self, element):
    return example(element)
